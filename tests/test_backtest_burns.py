"""Histories with known burns give exactly the expected alerts and missed burns (the default
30-day alert table of the SRE workbook), and a quiet SLO never yields NaN or an alert.

Five days of two replicas at 2 requests/s each, one scrape every two minutes:

* TTFT (objective 99 %): half the requests slow for two hours on day 4 — a sharp burn (50×).
  The 1-hour page row needs 14.4× over the hour: 14.4 / 50 of an hour, 17 minutes after the
  start; the 6-hour row follows; the ticket rows (3× over a day, 1× over three days) fire
  within 1.5 hours. The page resolves once the 30-minute window has cooled (≈ 26 minutes
  after the fix).
* Error rate (objective 99.9 %): 0.4 % errors from the first day on — a slow burn (4×), under
  both page factors (14.4, 6); the three-day ticket row (1×) fires once its 3-day window,
  which holds the clean first day too, burns above 1: eight hours in.
* e2e (objective 99.9 %): 0.4 % slow for twelve hours from day 3.5 — 4×, under every factor
  (the 1-day window holds 2×, the 3-day one 0.67×): no alert, one missed burn of
  4 × 12 h / 30 d = 6.7 % of the budget.
* Pool ``idle``: replicas up, no request for the whole history.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from support.backtest_history import History, Replica, between, write_store

from collector.store import Store
from slo.backtest.attainment import attainment, candidate_thresholds
from slo.backtest.run import Backtest, backtest
from slo.backtest.whatif import what_if
from slo.objectives.spec import effective_slos
from slo.sources.embedded import EmbeddedSource
from vigil.config import Config, load_config

pytestmark = pytest.mark.slow

HOUR = 3600.0
DAY = 86400.0
START = 1_790_000_000.0 - 1_790_000_000.0 % DAY  # midnight UTC
END = START + 5 * DAY
SHARP = (START + 3 * DAY + 10 * HOUR, START + 3 * DAY + 12 * HOUR)
UNDER = (START + 3.5 * DAY, START + 3.5 * DAY + 12 * HOUR)

CONFIG = """
[store]
path = "{store}"

[[pools]]
name = "chat"
model = "meta-llama/Llama-3.1-8B-Instruct"

[[pools]]
name = "idle"
model = "meta-llama/Llama-3.1-8B-Instruct"

[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
objective = 0.99

[[slos]]
name = "chat-errors"
pool = "chat"
indicator = "error_rate"
objective = 0.999

[[slos]]
name = "chat-e2e"
pool = "chat"
indicator = "e2e"
objective = 0.999

[[slos]]
name = "idle-ttft"
pool = "idle"
indicator = "ttft"

[[slos]]
name = "idle-errors"
pool = "idle"
indicator = "error_rate"
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path]:
    folder = tmp_path_factory.mktemp("backtest-burns")
    (folder / "vigil.toml").write_text(CONFIG.format(store=folder / "vigil.db"))
    chat = History(start=START, end=END, scrape_s=120.0,
                   replicas=[Replica("chat-0"), Replica("chat-1")],
                   ttft_bad=between(*SHARP, 0.5), errors=between(START + DAY, END, 0.004),
                   e2e_bad=between(*UNDER, 0.004)).build()
    idle = History(start=START, end=END, scrape_s=120.0, pool="idle",
                   replicas=[Replica("idle-0")],
                   rate=lambda _t: 0.0).build()
    with Store(folder / "vigil.db") as store:
        write_store(store, chat + idle)
    return load_config(folder / "vigil.toml"), folder / "vigil.db"


@pytest.fixture(scope="module")
def result(written: tuple[Config, Path]) -> Backtest:
    config, path = written
    with Store(path, readonly=True) as store:
        return backtest(config, EmbeddedSource(store), START, END)


def _slo(result: Backtest, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = result.to_dict()["slos"][name]
    return doc


def test_a_sharp_burn_pages_within_minutes_and_tickets(result: Backtest) -> None:
    s = _slo(result, "chat-ttft")
    pages = [a for a in s["alerts"] if a["severity"] == "page"]
    tickets = [a for a in s["alerts"] if a["severity"] == "ticket"]
    assert len(pages) == 1 and len(tickets) == 1, s["alerts"]
    page, ticket = pages[0], tickets[0]
    t0, t1 = SHARP
    assert t0 + 15 * 60 <= page["start"] <= t0 + 20 * 60, page
    assert t1 + 20 * 60 <= page["end"] <= t1 + 30 * 60, page
    assert 15 * 60 <= page["detection_delay_seconds"] <= 20 * 60, page
    assert page["row"] == {"factor": 14.4, "long_window": "1h", "short_window": "5m"}
    assert 45 <= page["peak_burn_rate"] <= 50.5, page
    # 50x over the 1 h 43 min it fired, then the tail: about 12 % of a 30-day budget.
    assert 0.11 <= page["budget_consumed"] <= 0.13, page
    assert t0 + 80 * 60 <= ticket["start"] <= t0 + 95 * 60, ticket
    assert not s["missed_burns"]
    # Left at the end: the period's error ratio is over the requests the store holds (five
    # days, half of two hours' bad), as `vigil slo status` reports it.
    assert s["budget_remaining"] == pytest.approx(1 - (0.5 * 2 / 120) / 0.01, abs=0.005)


def test_a_slow_burn_files_a_ticket_and_never_pages(result: Backtest) -> None:
    s = _slo(result, "chat-errors")
    assert [a["severity"] for a in s["alerts"]] == ["ticket"], s["alerts"]
    ticket = s["alerts"][0]
    assert ticket["row"]["long_window"] == "3d"
    # The 3-day window holds the clean first day too: 0.4 % × x / (1 d + x) passes 0.1 %
    # (1× the budget) eight hours in; the 6-hour window burns 4× by then.
    assert START + DAY + 7.5 * HOUR <= ticket["start"] <= START + DAY + 8.5 * HOUR, ticket
    assert ticket["end"] is None  # still burning at the end of the history
    assert not s["missed_burns"]


def test_a_burn_under_every_threshold_is_a_missed_burn(result: Backtest) -> None:
    s = _slo(result, "chat-e2e")
    assert s["alerts"] == []
    assert len(s["missed_burns"]) == 1, s["missed_burns"]
    missed = s["missed_burns"][0]
    assert abs(missed["start"] - UNDER[0]) <= 10 * 60, missed
    assert abs(missed["end"] - UNDER[1]) <= 10 * 60, missed
    assert missed["budget_consumed"] == pytest.approx(4 * 12 / 720, rel=0.05)


def test_a_quiet_slo_has_no_nan_and_no_alert(result: Backtest) -> None:
    doc = result.to_dict()
    json.dumps(doc, allow_nan=False)  # raises on NaN or ±Inf anywhere
    for name in ("idle-ttft", "idle-errors"):
        s = doc["slos"][name]
        assert s["alerts"] == [] and s["missed_burns"] == [], name
        assert s["budget_remaining"] is None, name  # no request: no budget figure, not NaN
    idle = next(r for r in result.slos if r.spec.name == "idle-ttft")
    assert all(math.isnan(b) for b in idle.burn.tolist())


def test_attainment_per_day_says_which_thresholds_the_fleet_met(written: tuple[Config,
                                                                            Path]) -> None:
    config, path = written
    spec = next(s for s in effective_slos(config) if s.name == "chat-ttft")
    # vLLM's bounds from a quarter to four times 0.8 s, and 0.8 s itself.
    assert candidate_thresholds(spec) == [0.25, 0.5, 0.75, 0.8, 1.0, 2.5]
    with Store(path, readonly=True) as store:
        rows = {r["threshold_seconds"]: r for r in attainment(
            spec, EmbeddedSource(store), START, END, thresholds=[0.8, 2.5])}
    # 0.8 s (the SLO's): four clean days; day 4 had half its requests slow for two hours.
    day4 = 1 - 0.5 * 2 / 24
    at = rows[0.8]
    assert (at["days_met"], at["days"], at["weeks"]) == (4, 5, 0)
    assert [d["date"] for d in at["per_day"]] == ["2026-09-21", "2026-09-22", "2026-09-23",
                                                 "2026-09-24", "2026-09-25"]
    assert at["per_day"][3]["good_ratio"] == pytest.approx(day4, rel=1e-4)  # extrapolated
    assert at["good_ratio"] == pytest.approx(1 - 0.5 * 2 / 120, rel=1e-4)
    # The slow requests took 2 s: a 2.5 s threshold met the objective every day.
    assert (rows[2.5]["days_met"], rows[2.5]["good_ratio"]) == (5, 1.0)


def test_what_if_a_stricter_objective_pages_more(written: tuple[Config, Path],
                                                 result: Backtest) -> None:
    config, path = written
    spec = next(s for s in effective_slos(config) if s.name == "chat-ttft")
    with Store(path, readonly=True) as store:
        table = what_if(config, EmbeddedSource(store), result.grid, objectives=[0.95, 0.999],
                        thresholds=[2.5], slos=[spec])["chat-ttft"]
    span = result.end - result.start + result.interval_s
    rows = {(r.spec.objective, r.spec.threshold_seconds): r.to_dict(span) for r in table}
    assert list(rows) == [(0.99, 0.8), (0.95, 2.5), (0.999, 2.5)]
    # The configured SLO's row is the backtest's own.
    assert rows[0.99, 0.8]["per_30_days"] == result.to_dict()["slos"]["chat-ttft"]["per_30_days"]
    # At 2.5 s no request was slow: nothing burns at any objective.
    assert rows[0.95, 2.5]["per_30_days"] == {"page": 0.0, "ticket": 0.0}
    assert rows[0.999, 2.5]["budget_remaining"] == 1.0
    assert rows[0.99, 0.8]["cost"] is None
    assert rows[0.99, 0.8]["cost_note"] == "no capacity profile for this pool"
    with Store(path, readonly=True) as store:
        more = what_if(config, EmbeddedSource(store), result.grid, objectives=[0.95, 0.999],
                       slos=[spec])["chat-ttft"]
    pages = {r.spec.objective: r.result.count("page") for r in more}
    assert pages[0.999] >= pages[0.99] >= pages[0.95] == 0, pages
