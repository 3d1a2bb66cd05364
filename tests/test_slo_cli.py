"""``vigil slo status`` through ``vigil_shell.slo_status_cli``: flags, JSON, errors, and the
100-column table."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.fleet import AT, MODEL, busy_pool

from collector.store import Store
from slo.sources.embedded import EmbeddedSource
from slo.status import evaluate
from vigil.config import parse_config
from vigil.errors import StoreError
from vigil_shell.slo_status_cli import TABLE_WIDTH, add_arguments, format_table, run

REPO = Path(__file__).resolve().parent.parent
LONG_MODEL = "organisation-with-a-long-name/Llama-3.1-70B-Instruct-quantized.w8a8-experimental"
CONFIG_TOML = f"""
[store]
path = "vigil.db"

[[pools]]
name = "chat"
model = "{MODEL}"

[[pools]]
name = "a-pool-with-a-rather-long-name-for-batch-work"
model = "{LONG_MODEL}"
gpu = "L40S"
"""


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vigil slo status")
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    path = folder / "vigil.toml"
    path.write_text(CONFIG_TOML)
    with Store(folder / "vigil.db") as store:
        busy_pool(store, span_s=1200)
    return path


def _run(*argv: str) -> str:
    out = io.StringIO()
    assert run(_parse(*argv), out=out) == 0
    return out.getvalue()


def test_json_output_is_the_status(config_file: Path) -> None:
    result = json.loads(_run("--config", str(config_file), "--at", str(AT), "--json"))
    assert result["at"] == AT
    assert result["source"] == "embedded"
    assert result["window"] == "5m"
    assert set(result["pools"]) == {"chat", "a-pool-with-a-rather-long-name-for-batch-work"}
    assert result["pools"]["chat"]["queue_length"] == 3.0


def test_flags_override_the_engine_section(config_file: Path) -> None:
    result = json.loads(_run("--config", str(config_file), "--at", str(AT), "--json",
                             "--window", "1m", "--promql-semantics", "2"))
    assert result["window"] == "1m"
    assert result["promql_semantics"] == "2"
    assert result["pools"]["chat"]["models"][MODEL]["quantiles"]["window"] == "1m"


def test_at_defaults_to_the_injected_clock(config_file: Path) -> None:
    out = io.StringIO()
    run(_parse("--config", str(config_file), "--json"), clock=lambda: AT + 0.5, out=out)
    assert json.loads(out.getvalue())["at"] == AT + 0.5


def test_bad_window_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        _parse("--config", "x.toml", "--window", "five minutes")
    assert exc.value.code == 2


def test_missing_store_says_to_run_collect(tmp_path: Path) -> None:
    path = tmp_path / "vigil.toml"
    path.write_text(CONFIG_TOML)
    with pytest.raises(StoreError, match=r"no store at .*vigil\.db yet: run `vigil collect"):
        run(_parse("--config", str(path), "--at", str(AT)), out=io.StringIO())


def test_json_through_a_subprocess(config_file: Path) -> None:
    code = ("import argparse, sys; from vigil_shell.slo_status_cli import add_arguments, run; "
            "p = argparse.ArgumentParser(); add_arguments(p); "
            "sys.exit(run(p.parse_args(sys.argv[1:])))")
    proc = subprocess.run(
        [sys.executable, "-c", code, "--config", str(config_file), "--at", str(AT), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["slos"][0]["name"] == "chat-ttft"


def test_table_fits_100_columns_and_shows_nulls_as_dashes(config_file: Path) -> None:
    text = _run("--config", str(config_file), "--at", str(AT))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= TABLE_WIDTH
    assert "pool chat" in text
    assert any(line.startswith("SLO ") and "ALERTS" in line for line in lines)
    assert any(line.startswith("chat-ttft") for line in lines)
    idle = next(line for line in lines if line.startswith("a-pool-with-a-rather-lo…"))
    assert "–" in idle  # the idle pool's SLI, budget and burn rates are null


def test_table_of_an_extreme_status_still_fits(tmp_path: Path) -> None:
    cfg = parse_config({"pools": [{"name": "p" * 80, "model": "m" * 150}]})
    with Store(tmp_path / "vigil.db") as store:
        result = evaluate(cfg, EmbeddedSource(store), AT)
    result["pools"]["p" * 80]["scaling"] = {
        "current": 2, "desired": 3, "action": "scale_out", "next_decision_at": AT,
        "reasons": ["kv_cache_usage 0.85 > 0.80 and rising " * 10],
    }
    text = format_table(result)
    assert max(len(line) for line in text.splitlines()) <= TABLE_WIDTH
    assert "scale_out 2→3: kv_cache_usage" in text


def test_gateway_records_feed_the_status_when_the_gateway_ran(tmp_path: Path) -> None:
    from serving.gateway.telemetry.record_writer import RecordWriter
    from vigil.storage.gateway_records import GatewayRecord

    path = tmp_path / "vigil.toml"
    path.write_text(CONFIG_TOML)
    with Store(tmp_path / "vigil.db") as store:
        busy_pool(store, span_s=1200)
    no_gateway = json.loads(_run("--config", str(path), "--at", str(AT), "--json"))
    assert no_gateway["pools"]["chat"]["cost"]["by_tier"] is None

    def rec(i: int, tier: str, tokens: int, e2e: float, **kw: object) -> GatewayRecord:
        values: dict[str, object] = dict(
            id=f"vgl-{i}", start_s=AT - 60 - e2e, ts_s=AT - 60, pool="chat", model=MODEL,
            endpoint="chat", tenant="acme", tier=tier, key_id="k", replica="chat-0",
            status=200, stream=True, prompt_tokens=20, completion_tokens=tokens,
            tokens_source="usage", ttft_s=0.2, e2e_s=e2e, queue_s=0.0, error=False,
            error_class="", cache_hit="", requested_max_tokens=None, max_tokens=512,
            max_tokens_decision="default", cost_usd=0.001, saved_usd=None, upstream_id="",
            batch_id="", message="")
        values.update(kw)
        return GatewayRecord(**values)  # type: ignore[arg-type]

    writer = RecordWriter(tmp_path / "vigil-gateway.db")  # [gateway] records_path's default
    writer.start()
    for i in range(20):
        writer.put(rec(i, "premium" if i % 2 else "standard", 100, 2.2))
    writer.put(rec(99, "batch", 5000, 100.0, cost_usd=0.05))  # a 10x-token outlier
    writer.close()
    result = json.loads(_run("--config", str(path), "--at", str(AT), "--json"))
    chat = result["pools"]["chat"]
    assert set(chat["cost"]["by_tier"]) == {"premium", "standard", "batch"}
    assert chat["cost"]["by_tier"]["premium"]["requests"] == 10
    q = chat["models"][MODEL]["quantiles"]
    assert q["e2e_seconds_per_512_tokens"]["p50"] == pytest.approx(0.2 + 2.0 / 99 * 511)
    assert [a["id"] for a in result["anomalies"] if a["kind"] == "request"] == ["vgl-99"]
