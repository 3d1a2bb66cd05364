"""The chargeback on a known history (``support.chargeback``): each request's, tenant's and
pool's cost equals the hand-computed figure; tenants + idle + unattributed = the pool, to the
cent; idle goes where ``[cost] idle`` says; ``vigil cost report`` prints it as a table, CSV
and JSON; a closed month is frozen and late records restate it visibly."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import chargeback as cb

from collector.store import Store
from slo.cost.ledger import IDLE_TENANT, UNATTRIBUTED_TENANT, Ledger, group_lines, ledger
from slo.cost.months import month_bounds, month_of
from slo.cost.report import reconciliation
from slo.sources.embedded import EmbeddedSource
from slo.sources.request_log import GatewayRecords
from vigil.config import Config
from vigil_shell.cli import main

#: A moment after the history, still in November.
AT = cb.T0 + 86400.0


@pytest.fixture
def history(tmp_path: Path) -> Path:
    cb.write_store(tmp_path / "store.sqlite")
    cb.write_records(tmp_path / "records.sqlite")
    return tmp_path


def _book(tmp: Path, config: Config, lo: float = cb.T0, hi: float = cb.T0 + cb.SPAN_S
          ) -> Ledger:
    with Store(tmp / "store.sqlite", readonly=True) as store:
        return ledger(EmbeddedSource(store), config, GatewayRecords(tmp / "records.sqlite"),
                      lo, hi)


def _by(book: Ledger, *groups: str) -> dict[tuple[str, ...], float]:
    return {tuple(getattr(ln, g) for g in groups): ln.cost
            for ln in group_lines(book.lines, groups)}


def test_every_figure_is_the_hand_computed_one(history: Path) -> None:
    book = _book(history, cb.config(history))
    tenants = _by(book, "tenant")
    for tenant, cost in cb.EXPECTED_TENANTS.items():
        assert tenants[(tenant,)] == pytest.approx(cost, abs=1e-9)
    per_line = _by(book, "pool", "tenant", "tier")
    # Lines of one request each, and the two that hold two (r1 + r8; none else).
    assert per_line[("chat", "acme", "premium")] == pytest.approx(0.25 + 0.10, abs=1e-9)
    assert per_line[("chat", "globex", "standard")] == pytest.approx(0.15, abs=1e-9)
    assert per_line[("chat", "initech", "batch")] == pytest.approx(0.60, abs=1e-9)
    assert per_line[("chat", "acme", "standard")] == pytest.approx(0.10, abs=1e-9)  # cancelled
    assert per_line[("chat", "initech", "standard")] == pytest.approx(0.50, abs=1e-9)
    assert per_line[("chat", "globex", "premium")] == pytest.approx(0.60, abs=1e-9)  # timeout
    assert per_line[("code", "globex", "batch")] == pytest.approx(1.20, abs=1e-9)
    assert per_line[("code", "initech", "standard")] == pytest.approx(0.30, abs=1e-9)  # OTLP
    for p in book.pools:
        cost, unattributed, idle = cb.EXPECTED_POOLS[p.pool]
        assert p.cost == pytest.approx(cost, abs=1e-9)
        assert p.unattributed_cost == pytest.approx(unattributed, abs=1e-9)
        assert p.idle_cost == pytest.approx(idle, abs=1e-9)
        assert p.unattributed_measured
    assert book.warnings == []


def test_counts_tokens_and_slo_conformance(history: Path) -> None:
    book = _book(history, cb.config(history))
    lines = {(ln.pool, ln.tenant, ln.tier): ln for ln in book.lines}
    acme = lines[("chat", "acme", "premium")]
    # r1 and r8 finished; r5 was a cache hit (no GPU, its saving counted).
    assert (acme.requests, acme.cache_hits, acme.saved) == (2, 1, 0.25)
    assert (acme.slo_judged, acme.slo_met) == (2, 2)
    assert lines[("chat", "acme", "standard")].cancelled == 1
    timed_out = lines[("chat", "globex", "premium")]
    assert (timed_out.timed_out, timed_out.requests, timed_out.slo_met) == (1, 0, 0)
    batch = lines[("chat", "initech", "batch")]
    assert (batch.prompt_tokens, batch.cached_tokens, batch.output_tokens) == (1000, 800, 500)
    # r11's e2e (1200 s) misses code-e2e's 1000 s: paid for, not a good answer.
    code = lines[("code", "globex", "batch")]
    assert (code.requests, code.slo_met) == (1, 0)
    # The refused r6 is nowhere.
    assert ("chat", "globex", "standard") in lines
    assert lines[("chat", "globex", "standard")].requests == 1


def test_the_pools_add_up_to_the_cent(history: Path) -> None:
    book = _book(history, cb.config(history))
    for rec in reconciliation(book):
        assert rec["adds_up"], rec["text"]
        assert abs(rec["exact"]["difference"]) < 1e-9
    texts = [r["text"] for r in reconciliation(book)]
    assert texts == [
        "chat: tenants 2.30 + idle 36.70 + unattributed 0.60 = 39.60 USD; pool cost 39.60 USD",
        "code: tenants 1.50 + idle 5.70 + unattributed 0.00 = 7.20 USD; pool cost 7.20 USD",
    ]


def test_a_window_inside_a_request_bills_only_its_part(history: Path) -> None:
    # 250-350: r1 alone until 300, then r1 and r2 half and half.
    book = _book(history, cb.config(history), cb.T0 + 250, cb.T0 + 350)
    lines = _by(book, "pool", "tenant")
    assert lines[("chat", "acme")] == pytest.approx(0.05 + 0.025, abs=1e-9)
    assert lines[("chat", "globex")] == pytest.approx(0.025, abs=1e-9)
    # Requests count where they ended: none did inside the window.
    assert all(ln.requests == 0 for ln in book.lines)


def test_idle_pro_rata_and_to_reserved_tiers(history: Path) -> None:
    busy = {"acme": 0.45, "globex": 0.75, "initech": 1.10}  # the chat pool's
    book = _book(history, cb.config(history, idle="pro_rata"))
    chat = _by(book, "pool", "tenant")
    for tenant, cost in busy.items():
        assert chat[("chat", tenant)] == pytest.approx(cost + 36.7 * cost / 2.3, abs=1e-9)
    assert chat[("chat", IDLE_TENANT)] == pytest.approx(0.0, abs=1e-12)
    assert chat[("chat", UNATTRIBUTED_TENANT)] == pytest.approx(0.6, abs=1e-9)
    # The reserved tier carries it: acme's r1 + r8 (0.35) and globex's r9 (0.60) are premium.
    book = _book(history, cb.config(history, idle="tiers", idle_tiers=["premium"]))
    lines = _by(book, "pool", "tenant", "tier")
    assert lines[("chat", "acme", "premium")] == pytest.approx(0.35 + 36.7 * 0.35 / 0.95,
                                                               abs=1e-9)
    assert lines[("chat", "globex", "standard")] == pytest.approx(0.15, abs=1e-9)
    # The code pool has no premium traffic: its idle stays the platform's.
    assert lines[("code", IDLE_TENANT, "")] == pytest.approx(5.7, abs=1e-9)
    for rec in reconciliation(book):
        assert rec["adds_up"]


def test_another_instances_traffic_is_unattributed_without_its_records(history: Path) -> None:
    """What ran on chat-1 is rebuilt from both instances' records (above, r7 and r8 share
    4300-4500). With gw-a's records alone, r7's work (gw-b's) shows only in vLLM's counters:
    it is billed as unattributed, never as idle time nor to r8's tenant."""
    alone = history / "gw-a.sqlite"
    cb.write_records(alone, tuple(r for r in cb.REQUESTS if r.writer != "gw-b"))
    config = cb.config(history)
    with Store(history / "store.sqlite", readonly=True) as store:
        book = ledger(EmbeddedSource(store), config, GatewayRecords(alone), cb.T0,
                      cb.T0 + cb.SPAN_S)
    chat = next(p for p in book.pools if p.pool == "chat")
    # r7's 600 s at $0.001 (0.50 of its own and 0.10 of r8's time it shared) now unattributed,
    # in the [cost] steps it ran in (4000-4600 lies in three 300 s steps).
    assert chat.unattributed_cost > 0.6 + 0.5
    assert _by(book, "pool", "tenant", "tier")[("chat", "acme", "premium")] < 0.35
    assert all(r["adds_up"] for r in reconciliation(book))


# --- vigil cost report ----------------------------------------------------------------------
def _report(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(["cost", "report", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.fixture
def config_file(history: Path) -> Iterator[Path]:
    yield cb.write_config(history)


def test_report_json_csv_and_table(config_file: Path, capsys: pytest.CaptureFixture[str]
                                   ) -> None:
    report = json.loads(_report(capsys, "-c", str(config_file), "--month", "2026-11",
                                "--by", "tenant", "--format", "json", "--at", str(AT)))
    assert report["currency"] == "USD" and report["month"] == "2026-11"
    rows = {r["tenant"]: r for r in report["rows"]}
    assert {t: rows[t]["cost"] for t in cb.EXPECTED_TENANTS} == cb.EXPECTED_TENANTS
    assert rows[IDLE_TENANT]["cost"] == 42.4 and rows[UNATTRIBUTED_TENANT]["cost"] == 0.6
    assert report["total"] == pytest.approx(46.8)
    acme = rows["acme"]
    assert acme["requests"] == 2 and acme["per_1000_requests"] == pytest.approx(225.0)
    assert acme["per_slo_met_request"] == pytest.approx(0.45 / 2)
    assert acme["slo_met_share"] == 1.0
    assert [p["adds_up"] for p in report["pools"]] == [True, True]

    text = _report(capsys, "-c", str(config_file), "--month", "2026-11", "--by",
                   "tenant,tier", "--at", str(AT))
    assert "cost (USD)" in text and "Reconciliation:" in text
    assert "chat: tenants 2.30 + idle 36.70 + unattributed 0.60 = 39.60 USD" in text

    out = _report(capsys, "-c", str(config_file), "--from", str(cb.T0), "--to",
                  str(cb.T0 + cb.SPAN_S), "--by", "pool,tenant", "--format", "csv")
    table = list(csv.DictReader(io.StringIO(out)))
    assert {(r["pool"], r["tenant"]): float(r["cost_usd"]) for r in table}[("code", "globex")] \
        == 1.2


def test_a_month_in_another_time_zone(tmp_path: Path) -> None:
    # Seoul closes November at 15:00 UTC on 30 November.
    lo, hi = month_bounds("2026-11", "Asia/Seoul")
    assert (lo, hi) == (month_bounds("2026-11", "UTC")[0] - 9 * 3600,
                        month_bounds("2026-12", "UTC")[0] - 9 * 3600)
    assert month_of(hi - 1, "Asia/Seoul") == "2026-11"
    assert month_of(hi, "Asia/Seoul") == "2026-12"
    with pytest.raises(ValueError, match="YYYY-MM"):
        month_bounds("2026-13", "UTC")


def test_a_month_without_data_has_no_figures(config_file: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    report = json.loads(_report(capsys, "-c", str(config_file), "--month", "2026-09",
                                "--format", "json", "--at", str(AT)))
    assert report["rows"] == [] and report["total"] is None
    assert all(p["cost"] is None for p in report["pools"])
    assert "no data" in _report(capsys, "-c", str(config_file), "--month", "2026-09",
                                "--at", str(AT))


def test_bad_arguments_name_what_is_wrong(config_file: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    for args, said in ((["--month", "2026-11", "--by", "team"], "--by: team"),
                       (["--month", "11/2026"], "YYYY-MM"),
                       (["--month", "2026-11", "--from", "0"], "not both"),
                       ([], "give --month"),
                       (["--month", "2026-11", "--pool", "nope"], "no pool 'nope'"),
                       (["--from", "yesterday"], "--from")):
        assert main(["cost", "report", "-c", str(config_file), "--at", str(AT), *args]) == 2
        assert said in capsys.readouterr().err


def test_a_closed_month_is_frozen_and_late_records_restate_it(
        history: Path, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    closed = month_bounds("2026-12", "UTC")[0] + 2 * 86400  # past [cost] close_after
    args = ["-c", str(config_file), "--month", "2026-11", "--format", "json", "--at"]
    first = json.loads(_report(capsys, *args, str(closed)))
    assert first["frozen_at"] is not None and first["restated"] == []
    # A record arrives late: globex ran 5000-5100 on chat-0, alone (0.1 at $0.001/s).
    late = cb.Req("late", "globex", "standard", "chat", "chat-0", 5000, 5100, 5010, 40, 0, 90)
    cb.write_records(history / "records.sqlite", (late,))
    again = json.loads(_report(capsys, *args, str(closed + 3600)))
    # The bill stands as frozen; the difference is stated beside it.
    assert again["frozen_at"] == first["frozen_at"]
    assert {r["tenant"]: r["cost"] for r in again["rows"]} == \
        {r["tenant"]: r["cost"] for r in first["rows"]}
    (restated_globex,) = [r for r in again["restated"] if r["tenant"] == "globex"]
    assert restated_globex["difference"] == pytest.approx(0.1)
    assert restated_globex["requests_now"] == restated_globex["frozen_requests"] + 1
    (idle,) = [r for r in again["restated"] if r["tenant"] == IDLE_TENANT]
    assert idle["difference"] == pytest.approx(-0.1)
    text = _report(capsys, "-c", str(config_file), "--month", "2026-11", "--at",
                   str(closed + 3600))
    assert "Frozen statement of" in text and "restated tenant=globex: 1.95 -> 2.05" in text


def test_metrics_name_the_top_tenants_and_sum_the_rest(history: Path) -> None:
    from slo.cost.ledger import top_tenants

    book = _book(history, cb.config(history))
    got = {(t, p): round(c, 9) for t, p, c in top_tenants(book.lines, 1, "other")}
    # globex costs most (1.95); acme and initech are "other", per pool.
    assert got[("globex", "chat")] == 0.75 and got[("globex", "code")] == 1.2
    assert got[("other", "chat")] == round(0.45 + 1.10, 9)
    assert got[("other", "code")] == 0.3
    assert got[(IDLE_TENANT, "chat")] == 36.7
    assert {t for t, _ in got} == {"globex", "other", IDLE_TENANT, UNATTRIBUTED_TENANT}
