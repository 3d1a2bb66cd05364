"""``vigil slo backtest``: the history from the flags (``--since`` up to the injected clock's
now, ``--from``/``--to`` as Unix seconds or ISO 8601), the JSON keys the docs promise, the
terminal report, and clear errors."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.backtest_history import History, Replica, between, write_store

from collector.store import Store
from vigil.errors import ConfigError, UsageError
from vigil_shell.slo_backtest_cli import add_arguments, format_table, parse_time, run

HOUR = 3600.0
START = 1_790_000_000.0 - 1_790_000_000.0 % 86400.0
END = START + 8 * HOUR
CONFIG = """
[store]
path = "vigil.db"

[[pools]]
name = "chat"
model = "meta-llama/Llama-3.1-8B-Instruct"

[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
objective = 0.99
"""


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("backtest-cli")
    (folder / "vigil.toml").write_text(CONFIG)
    series = History(start=START, end=END, replicas=[Replica("chat-0"), Replica("chat-1")],
                     ttft_bad=between(START + 4 * HOUR, START + 5 * HOUR, 0.5)).build()
    with Store(folder / "vigil.db") as store:
        write_store(store, series)
    return folder / "vigil.toml"


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vigil slo backtest")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _run(*argv: str, now: float = END) -> str:
    out = io.StringIO()
    assert run(_parse(*argv), clock=lambda: now, out=out) == 0
    return out.getvalue()


def test_json_keys(config_file: Path) -> None:
    doc = json.loads(_run("--config", str(config_file), "--since", "8h", "--json"))
    assert doc["from"] == START and doc["to"] == END
    assert doc["interval_seconds"] == 30.0 and doc["evaluations"] == 8 * 120 + 1
    s = doc["slos"]["chat-ttft"]
    page = next(a for a in s["alerts"] if a["severity"] == "page")
    assert set(page) >= {"severity", "start", "end", "peak_burn_rate", "budget_consumed",
                         "detection_delay_seconds"}
    assert START + 4 * HOUR < page["start"] < START + 4.5 * HOUR
    assert isinstance(s["missed_burns"], list)
    # Half of one hour's requests slow out of eight hours': overspent 5.25 times over.
    assert s["budget_remaining"] == pytest.approx(1 - (0.5 / 8) / 0.01, rel=0.01)
    assert s["per_30_days"]["page"] == pytest.approx(30 * 24 / 8 * 1, rel=0.01)


def test_from_and_to_take_iso_times(config_file: Path) -> None:
    iso = _run("--config", str(config_file), "--from", "2026-09-21T04:00:00Z", "--to",
               "2026-09-21T08:00", "--json")
    unix = _run("--config", str(config_file), "--from", str(START + 4 * HOUR), "--to",
                str(START + 8 * HOUR), "--json")
    assert parse_time("2026-09-21") == START
    assert json.loads(iso) == json.loads(unix)


def test_the_table_names_each_alert(config_file: Path) -> None:
    text = _run("--config", str(config_file), "--since", "8h")
    assert "chat-ttft: ttft ≤ 0.8s for 99% over 30d" in text
    assert "page    2026-09-21 04:" in text
    assert "detected after" in text


def test_a_history_that_ends_before_it_starts_is_refused(config_file: Path) -> None:
    with pytest.raises(UsageError, match="must start before it ends"):
        _run("--config", str(config_file), "--from", str(END), "--to", str(START))


def test_bad_flags_say_what_is_wrong(config_file: Path) -> None:
    vigil = [sys.executable, "-m", "vigil_shell", "slo", "backtest", "--config",
             str(config_file)]
    done = subprocess.run([*vigil, "--from", "yesterday"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 2 and "not a time: 'yesterday'" in done.stderr
    done = subprocess.run([*vigil, "--missed-share", "5"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 2 and "a share of the budget is 0-1" in done.stderr
    done = subprocess.run([*vigil, "--since", "1d", "--from", "0"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


def test_what_if_rows_and_their_table(config_file: Path) -> None:
    argv = ("--config", str(config_file), "--since", "8h", "--objective", "0.95",
            "--threshold", "2.5")
    doc = json.loads(_run(*argv, "--json"))
    rows = doc["what_if"]["chat-ttft"]
    assert [(r["objective"], r["threshold_seconds"]) for r in rows] == [(0.99, 0.8),
                                                                         (0.95, 2.5)]
    assert rows[0]["per_30_days"] == doc["slos"]["chat-ttft"]["per_30_days"]
    assert rows[1]["per_30_days"] == {"page": 0.0, "ticket": 0.0}
    for r in rows:
        assert (r["cost"] is None) != (r["cost_note"] is None), r
    assert [a["threshold_seconds"] for a in doc["slos"]["chat-ttft"]["attainment"]] == [2.5]
    text = format_table(doc)
    assert "What if — chat-ttft:" in text
    assert "95%     2.5 s       0.0         0.0      0       –  100.0%" in text


def test_the_scaling_scorecard_in_the_json_and_the_table(config_file: Path) -> None:
    doc = json.loads(_run("--config", str(config_file), "--since", "8h", "--json",
                          "--scaling-interval", "1m"))
    card = doc["scaling"]["chat"]
    assert card["decisions"] == "replay" and card["interval_seconds"] == 60.0
    assert card["evaluations"] == 8 * 60 + 1 and card["slos"] == ["chat-ttft"]
    assert set(card["triggers"]) == {"kv_cache_usage", "queue_length", "ttft_p95_seconds"}
    # The slow hour is one burn, and TTFT p95 (over 0.64 s) was the trigger that saw it.
    (burn,) = card["burns"]
    assert burn["first_trigger"] == "ttft_p95_seconds"
    text = format_table(doc)
    assert "Scaling advice — pool chat (replayed, every 1m; 481 evaluations; judged by " \
           "chat-ttft):" in text
    assert "TTFT" in text and "median lead" in text
    assert "scaling" not in json.loads(_run("--config", str(config_file), "--since", "8h",
                                            "--json", "--no-scaling"))


def test_a_scaling_interval_off_the_scrape_grid_is_refused(config_file: Path) -> None:
    with pytest.raises(UsageError, match="multiple of the scrape interval"):
        _run("--config", str(config_file), "--since", "1h", "--scaling-interval", "20s")


def test_what_if_under_another_alert_table(config_file: Path, tmp_path: Path) -> None:
    # "strict": only the 1-hour page row, at twice the budget share (factor 28.8 for a 30-day
    # SLO); "loose": a fixed factor of 2 over 30 minutes.
    strict = tmp_path / "strict.toml"
    strict.write_text('[[alerts]]\nseverity = "page"\nbudget_share = 0.04\n'
                      'long_window = "1h"\nshort_window = "5m"\n')
    loose = tmp_path / "loose.toml"
    loose.write_text('[[engine.burn_rate_alerts]]\nseverity = "page"\nfactor = 2\n'
                     'long_window = "30m"\nshort_window = "5m"\n')
    doc = json.loads(_run("--config", str(config_file), "--since", "8h", "--json",
                          "--alert-table", str(strict), "--alert-table", str(loose),
                          "--no-scaling", "--no-attainment"))
    rows = doc["what_if"]["chat-ttft"]
    assert [r["alert_table"] for r in rows] == ["configured", "strict", "loose"]
    assert rows[0]["per_30_days"] == doc["slos"]["chat-ttft"]["per_30_days"]
    # Half the requests slow for an hour (50x): each table pages once. The 1-hour window
    # crosses 28.8 at 28.8 / 50 of the hour, its 5-minute one 28.8 / 50 of 5 minutes in:
    # detected 31.7 minutes after that onset (one-minute scrapes). The 30-minute window
    # crosses 2 at 1.2 minutes.
    once = rows[0]["per_30_days"]["page"]
    assert rows[1]["per_30_days"] == {"page": once} and rows[2]["per_30_days"] == {"page": once}
    strict_delay = rows[1]["median_detection_delay_seconds"]
    assert strict_delay == pytest.approx(28.8 / 50 * (60 - 5) * 60, abs=60)
    assert rows[2]["median_detection_delay_seconds"] <= 120
    text = format_table(doc)
    assert "  alerts     objective threshold" in text
    assert "  loose            99%    800 ms      89.9           –" in text


def test_a_wrong_alert_table_names_the_file_and_row(config_file: Path,
                                                    tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[alerts]]\nseverity = "page"\nbudget_share = 0.02\nlong_window = "1h"\n'
                   'short_window = "5m"\n[[alerts]]\nseverity = "pager"\nfactor = 3\n'
                   'long_window = "1h"\nshort_window = "5m"\n')
    with pytest.raises(ConfigError, match=r"bad.toml: alerts\[1\].severity: Input should be"):
        _run("--config", str(config_file), "--since", "1h", "--alert-table", str(bad))
