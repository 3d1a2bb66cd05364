"""The Backtest page through Streamlit's ``AppTest`` over a history with known burns: its
tables and the timeline's shaded spans are the alerts and missed burns ``slo.backtest``
finds for the same range, the what-if table has one row per variant (each the engine's
``what_if`` row), a bad what-if value is an error that names it, and a long range waits for
the toggle. ``dashboard.backtest_data``'s small functions are tested alone.

Nine hours of two replicas at 2 requests/s, one scrape a minute, 1-day SLOs and an alert table
with fixed factors (page: 10x over 1h & 5m; ticket: 5x over 3h & 30m):

* TTFT (objective 99 %) 3 % slow for two hours from 3.5 h — a 3x burn, under both factors: a
  missed burn of 3 × 2 h / 24 h = 25 % of the budget;
* then half the requests slow from 7 h to 8 h — 50x: a page (the 1-hour window passes 10x
  after 12 minutes) and a ticket;
* errors: none (its SLO stays quiet).

The page is pinned at the end with a 6-hour range: 3 h to 9 h, both burns inside.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest
from support.backtest_history import History, Replica, write_store

from collector.store import Store
from dashboard import backtest_data
from dashboard import format as fmt
from dashboard.backtest_data import (
    MISSED_COLOR,
    MISSED_KIND,
    alert_rows,
    attainment_rows,
    backtest_range,
    chart_rules,
    chart_windows,
    evaluation_interval,
    filter_specs,
    instants,
    missed_rows,
    parse_objectives,
    parse_thresholds,
    peaks,
    scale_out_rows,
    scaling_card,
    series_name,
    slo_page,
    span_rows,
    spans_frame,
    timeline,
    trigger_rows,
    what_if_rows,
)
from dashboard.charts import PAGE_COLOR, TICKET_COLOR, long_frame
from slo.backtest.run import Backtest, backtest
from slo.backtest.whatif import what_if
from slo.objectives.burn_rate import SloBurnAlert
from slo.objectives.spec import SloSpec, effective_slos
from slo.sources.embedded import EmbeddedSource
from vigil.config import Config, load_config
from vigil.conventions import DASHBOARD_ENV_AT, DASHBOARD_ENV_CONFIG
from vigil.durations import format_duration

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "dashboard" / "app.py")
HOUR = 3600.0
START = 1_790_000_000.0 - 1_790_000_000.0 % 86400.0  # midnight UTC
END = START + 9 * HOUR
RANGE_S = 6 * HOUR
UNDER = (START + 3.5 * HOUR, START + 5.5 * HOUR)
SHARP = (START + 7 * HOUR, START + 8 * HOUR)
INTERVAL_S = 60.0

CONFIG = """
[store]
path = "{store}"

[rules]
interval = "1m"

[[engine.burn_rate_alerts]]
severity = "page"
factor = 10
long_window = "1h"
short_window = "5m"

[[engine.burn_rate_alerts]]
severity = "ticket"
factor = 5
long_window = "3h"
short_window = "30m"

[[pools]]
name = "chat"
model = "meta-llama/Llama-3.1-8B-Instruct"

[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
objective = 0.99
period = "1d"

[[slos]]
name = "chat-errors"
pool = "chat"
indicator = "error_rate"
objective = 0.99
period = "1d"
"""


def _ttft_bad(t: float) -> float:
    if SHARP[0] <= t < SHARP[1]:
        return 0.5
    return 0.03 if UNDER[0] <= t < UNDER[1] else 0.0


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dashboard-backtest")
    (folder / "vigil.toml").write_text(CONFIG.format(store=folder / "vigil.db"))
    series = History(start=START, end=END, scrape_s=60.0,
                     replicas=[Replica("chat-0"), Replica("chat-1")],
                     ttft_bad=_ttft_bad).build()
    with Store(folder / "vigil.db") as store:
        write_store(store, series)
    return folder / "vigil.toml"


def spec_of(config: Config, name: str) -> SloSpec:
    return next(s for s in effective_slos(config) if s.name == name)


@pytest.fixture(scope="module")
def expected(written: Path) -> Backtest:
    """The CLI's backtest of chat-ttft over the page's range, straight from the engine."""
    config = load_config(written)
    with Store(config.store_path(), readonly=True) as store:
        return backtest(config, EmbeddedSource(store), END - RANGE_S, END,
                        interval_s=INTERVAL_S, slos=[spec_of(config, "chat-ttft")])


def run_page(config: Path, monkeypatch: pytest.MonkeyPatch, **params: str) -> AppTest:
    monkeypatch.setenv(DASHBOARD_ENV_CONFIG, str(config))
    monkeypatch.delenv(DASHBOARD_ENV_AT, raising=False)
    app = AppTest.from_file(APP, default_timeout=120)
    app.query_params["at"] = repr(END)
    app.query_params["range"] = "6h"
    for k, v in params.items():
        app.query_params[k] = v
    app.run()
    app.switch_page("views/backtest.py").run()
    check(app)
    return app


def check(app: AppTest) -> None:
    assert not app.exception, [e.value for e in app.exception]


def table(app: AppTest, key: str) -> list[dict[str, Any]]:
    frame: pd.DataFrame = app.get_by_key(key).dataframe[0].value
    return frame.to_dict("records")  # type: ignore[return-value]


def datasets(app: AppTest) -> list[pd.DataFrame]:
    return [pa.ipc.open_stream(d.data.data).read_all().to_pandas()
            for el in app.get("vega_lite_chart") for d in el.proto.datasets]


def seconds(values: pd.Series) -> list[float]:
    return [pd.Timestamp(v).timestamp() for v in values]


def has_key(app: AppTest, key: str) -> bool:
    try:
        app.get_by_key(key)
    except KeyError:
        return False
    return True


def texts(app: AppTest) -> str:
    return "\n".join([m.value for m in app.markdown] + [c.value for c in app.caption]
                     + [i.value for i in app.info] + [e.value for e in app.error])


# --- the page ---------------------------------------------------------------------------------


def test_the_tables_are_the_backtests_alerts_and_missed_burns(
        written: Path, expected: Backtest, monkeypatch: pytest.MonkeyPatch) -> None:
    s = expected.slos[0]
    # The story: the 3x burn slept through, the 50x one paged (within 20 minutes) and ticketed.
    assert [a.severity for a in s.alerts] == ["page", "ticket"], s.alerts
    page = s.alerts[0]
    assert SHARP[0] + 10 * 60 <= page.start <= SHARP[0] + 20 * 60, page
    assert page.detection_delay_s is not None and page.detection_delay_s <= 20 * 60
    under = [m for m in s.missed_burns if m.start <= UNDER[0] + 600 and m.end >= UNDER[1]]
    assert len(under) == 1, s.missed_burns
    assert under[0].budget_consumed == pytest.approx(3 * 2 / 24, rel=0.1)

    app = run_page(written, monkeypatch)
    assert app.title[0].value == "Backtest"
    assert table(app, "backtest-alerts") == alert_rows(s.alerts)
    assert table(app, "backtest-missed") == missed_rows(s.missed_burns)
    shown = table(app, "backtest-alerts")
    assert [r["start"] for r in shown] == [
        pd.Timestamp(a.start, unit="s", tz="UTC").strftime("%Y-%m-%d %H:%M:%SZ")
        for a in s.alerts]
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["Pages"] == "1" and metrics["Tickets"] == "1"
    assert metrics["Missed burns"] == str(len(s.missed_burns))
    assert metrics["Budget left at the end"] == fmt.percent(s.budget_remaining)
    # The range is shorter than the SLO's period: the card says how much of it it saw.
    (budget,) = [m for m in app.metric if m.label == "Budget left at the end"]
    seen = format_duration(min(s.spec.period_s, expected.end - expected.start))
    assert budget.delta == f"over {seen} of its {format_duration(s.spec.period_s)} period"
    # The range and the evaluations are the backtest's.
    assert f"{expected.grid.n:,} evaluations" in texts(app)


def test_the_timeline_shades_every_alert_and_missed_burn(
        written: Path, expected: Backtest, monkeypatch: pytest.MonkeyPatch) -> None:
    s = expected.slos[0]
    app = run_page(written, monkeypatch)
    assert len(app.get("vega_lite_chart")) == 1
    frames = datasets(app)
    spans = next(f for f in frames if "kind" in f)
    want = span_rows(s.alerts, s.missed_burns, expected.end)
    assert list(spans["kind"]) == [r["kind"] for r in want]
    assert list(spans["kind"]).count(MISSED_KIND) == len(s.missed_burns) >= 1
    assert seconds(spans["start"]) == [r["start"] for r in want]
    assert seconds(spans["end"]) == [r["end"] for r in want]
    lines = next(f for f in frames if "series" in f)
    # The table's shortest window and the page row's long one.
    assert set(lines["series"]) == {series_name(300.0), series_name(HOUR)}
    # 361 evaluations: every one drawn, each the engine's error ratio ÷ the 1 % budget.
    short = lines[lines["series"] == series_name(300.0)]
    burn = s.ratios[300.0].values / 0.01
    kept = np.isfinite(burn)
    assert short["value"].tolist() == pytest.approx(burn[kept].tolist())
    assert seconds(short["time"]) == (expected.grid.instants_ms()[kept] / 1000).tolist()
    assert max(short["value"]) > 40  # the 50x burn is on the chart


def test_what_if_has_one_row_per_variant(written: Path, expected: Backtest,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_page(written, monkeypatch)
    assert "Type other objectives or thresholds" in texts(app)
    app.text_input(key="backtest-objectives").input("0.95, 99.9%")
    app.text_input(key="backtest-thresholds").input("2.5s")
    app.run()
    check(app)
    shown = table(app, "backtest-whatif")
    config = load_config(written)
    with Store(config.store_path(), readonly=True) as store:
        rows = what_if(config, EmbeddedSource(store), expected.grid, objectives=[0.95, 0.999],
                       thresholds=[2.5], slos=[spec_of(config, "chat-ttft")])["chat-ttft"]
    span = expected.end - expected.start + expected.interval_s
    assert len(shown) == len(rows) == 3  # the configured SLO, then 95 % and 99.9 % at 2.5 s
    assert [(r["variant"], r["objective"], r["threshold"]) for r in shown] == [
        ("configured", "99%", "800 ms"), ("what if", "95%", "2.50 s"),
        ("what if", "99.9%", "2.50 s")]
    for got, row in zip(shown, rows, strict=True):
        doc = row.to_dict(span)
        assert got["pages / 30 d"] == f"{doc['per_30_days']['page']:.1f}"
        assert got["tickets / 30 d"] == f"{doc['per_30_days']['ticket']:.1f}"
        assert got["missed burns"] == doc["missed_burns"]
        assert got["cost"]  # a price, or the note that says why there is none
    # The configured row is the page's own backtest: one page over 6 h, 120 per 30 days.
    assert shown[0]["pages / 30 d"] == f"{30 * 86400 / span:.1f}"
    # At 2.5 s no request was slow (they took 2 s): nothing burns.
    assert shown[1]["pages / 30 d"] == shown[2]["pages / 30 d"] == "0.0"


def test_a_bad_what_if_value_is_an_error(written: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_page(written, monkeypatch)
    app.text_input(key="backtest-objectives").input("0.95, abc")
    app.text_input(key="backtest-thresholds").input("-1")
    app.run()
    check(app)
    errors = [e.value for e in app.error]
    assert len(errors) == 2, errors
    assert errors[0].startswith("Objectives: 'abc' is not an objective")
    assert errors[1].startswith("Thresholds: '-1' is not a threshold")
    assert not has_key(app, "backtest-whatif")
    # The backtest itself still shows.
    assert len(app.get("vega_lite_chart")) == 1


def test_another_slo_and_its_empty_states(written: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_page(written, monkeypatch)
    app.selectbox(key="backtest-slo").select("chat-errors").run()
    check(app)
    metrics = {m.label: m.value for m in app.metric}
    assert (metrics["Pages"], metrics["Tickets"], metrics["Missed burns"]) == ("0", "0", "0")
    assert metrics["Budget left at the end"] == "100.0%"
    assert "No alert fired over the range." in texts(app)
    # Not a latency SLO: no attainment.
    assert not has_key(app, "backtest-attainment")


def test_the_attainment_of_a_latency_slo(written: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    app = run_page(written, monkeypatch)
    shown = table(app, "backtest-attainment")
    config = load_config(written)
    spec = spec_of(config, "chat-ttft")
    with Store(config.store_path(), readonly=True) as store:
        page = slo_page(config, EmbeddedSource(store), spec, END - RANGE_S, END, INTERVAL_S)
    assert shown == attainment_rows(page.attainment, spec)
    by = {r["threshold"]: r for r in shown}
    # The slow requests took 2 s: 2.5 s held every request; 800 ms missed the burns' share.
    assert by["2.50 s"]["over the range"] == "100.00%"
    assert by["800 ms (configured)"]["over the range"] != "100.00%"
    assert "no whole UTC day" in texts(app)


def test_a_long_range_waits_for_the_toggle(written: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backtest_data, "AUTO_MAX_INSTANTS", 100)
    app = run_page(written, monkeypatch)
    assert "Off: the range holds 361 evaluations" in texts(app)
    assert not app.get("vega_lite_chart")
    app.toggle(key="backtest-run").set_value(True).run()
    check(app)
    assert len(app.get("vega_lite_chart")) == 1
    assert has_key(app, "backtest-alerts")


def test_no_store_yet_says_to_start_vigil_serve(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "vigil.toml"
    config.write_text(CONFIG.format(store=tmp_path / "vigil.db"))
    app = run_page(config, monkeypatch)
    assert "No data yet." in texts(app)
    assert not app.get("vega_lite_chart")


# --- the functions ----------------------------------------------------------------------------


def test_the_scaling_scorecard_on_demand(written: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_page(written, monkeypatch)
    assert not has_key(app, "backtest-triggers")  # off until asked for
    app.toggle(key="backtest-scaling").set_value(True).run()
    check(app)
    config = load_config(written)
    with Store(config.store_path(), readonly=True) as store:
        card = scaling_card(config, EmbeddedSource(store), "chat", END - RANGE_S, END,
                            INTERVAL_S)
    # The 50x hour: TTFT p95 over 0.64 s fires once the pool burns, the policy scales out
    # (nobody followed: no replica joined); no KV-cache or queue gauge in this history.
    assert card["triggers"]["ttft_p95_seconds"]["late"] >= 1
    assert card["triggers"]["kv_cache_usage"]["firings"] == 0
    assert [o["first_trigger"] for o in card["scale_outs"]][-1] == "ttft_p95_seconds"
    shown = table(app, "backtest-triggers")
    assert shown == [{k: (None if isinstance(v, float) and math.isnan(v) else v)
                      for k, v in r.items()} for r in pd.DataFrame(trigger_rows(card))
                     .to_dict("records")]
    outs = table(app, "backtest-scale-outs")
    assert [r["at"] for r in outs] == [r["at"] for r in scale_out_rows(card)]
    assert "still burning" in {r["outcome"] for r in outs}


def test_parse_objectives_and_thresholds() -> None:
    assert parse_objectives(" 0.95, 99.9% ;0.5 ") == [0.95, pytest.approx(0.999), 0.5]
    assert parse_objectives("") == []
    assert parse_thresholds("0.5, 2.5s 800ms") == [0.5, 2.5, 0.8]
    for bad in ("1", "0", "100%", "nan", "x"):
        with pytest.raises(ValueError, match=repr(bad)):
            parse_objectives(bad)
    for bad in ("0", "-1", "fast", "inf"):
        with pytest.raises(ValueError, match=repr(bad)):
            parse_thresholds(bad)
    with pytest.raises(ValueError, match="at most 6 objectives"):
        parse_objectives("0.1 0.2 0.3 0.4 0.5 0.6 0.7")


def test_peaks_keep_the_highest_of_each_stretch() -> None:
    times = np.arange(10, dtype=float) * 30
    values = np.array([1.0, 5.0, np.nan, np.nan, 2.0, 3.0, 0.5, 9.0, 1.0, np.nan])
    assert peaks(times, values, max_points=20) == [
        (t, None if math.isnan(v) else v) for t, v in zip(times, values, strict=True)]
    # Two per stretch: each point is the stretch's highest, where it happened.
    assert peaks(times, values, max_points=5) == [(30.0, 5.0), (60.0, None), (150.0, 3.0),
                                                  (210.0, 9.0), (240.0, 1.0)]
    assert len(peaks(np.arange(10_001.0), np.ones(10_001), max_points=1000)) <= 1000


def test_the_range_and_its_interval() -> None:
    # A pinned range is backtested as it is; a live one moves in steps of 1/288 of its span.
    assert backtest_range(1000.5, 22600.5, 30.0, live=False) == (1000.5, 22600.5)
    day = 86400.0
    start, end = backtest_range(10 * day + 100, 11 * day + 100, 30.0, live=True)
    assert (start, end) == (10 * day, 11 * day)  # 5-minute steps for a day
    assert backtest_range(10 * day + 299, 11 * day + 299, 30.0, live=True) == (start, end)
    assert evaluation_interval(30.0, 30 * day) == 30.0  # 86,401 evaluations
    assert evaluation_interval(30.0, 60 * day) == 60.0
    assert instants(END - RANGE_S, END, 60.0) == 361
    assert instants(100.0, 110.0, 60.0) == 0


def test_chart_windows_rules_and_filters() -> None:
    rows = (SloBurnAlert("page", 14.4, 3600.0, 300.0), SloBurnAlert("page", 6.0, 21600.0, 1800.0),
            SloBurnAlert("ticket", 3.0, 86400.0, 7200.0))
    assert chart_windows(rows) == [300.0, 3600.0, 21600.0]
    assert [(r.value, r.color) for r in chart_rules(rows)] == [
        (14.4, PAGE_COLOR), (6.0, PAGE_COLOR), (3.0, TICKET_COLOR)]
    assert chart_rules(rows)[0].label == "14.4x page (1h & 5m)"
    specs = [SloSpec("a", "chat", "m1", "all", "ttft", 0.99, 0.8, 86400.0),
             SloSpec("b", "chat", "m2", "chat", "e2e", 0.99, 8.0, 86400.0),
             SloSpec("c", "batch", "m1", "all", "error_rate", 0.999, None, 86400.0)]
    assert [s.name for s in filter_specs(specs)] == ["a", "b", "c"]
    assert [s.name for s in filter_specs(specs, pools=["chat"])] == ["a", "b"]
    assert [s.name for s in filter_specs(specs, models=["m1"])] == ["a", "c"]
    assert [s.name for s in filter_specs(specs, endpoint="chat")] == ["b"]


def test_the_timeline_layers_spans_under_the_lines(expected: Backtest) -> None:
    s = expected.slos[0]
    spans = spans_frame(span_rows(s.alerts, s.missed_burns, expected.end))
    chart = timeline(long_frame([(END - 60, series_name(300.0), 1.0),
                                 (END, series_name(300.0), 2.0)]), spans, chart_rules(s.rows))
    spec = chart.to_dict()
    first = spec["layer"][0]
    assert first["mark"]["type"] == "rect"
    scale = first["encoding"]["color"]["scale"]
    # Alerts first (by start), then the missed burns: each kind once, in its colour.
    assert scale["domain"] == ["page alert", "ticket alert", MISSED_KIND]
    assert dict(zip(scale["domain"], scale["range"], strict=True)) == {
        "page alert": PAGE_COLOR, "ticket alert": TICKET_COLOR, MISSED_KIND: MISSED_COLOR}
    # Without a span, the plain lines chart.
    assert "rect" not in str(timeline(long_frame([]), spans.iloc[0:0]).to_dict())


def test_what_if_rows_format_the_engines_rows() -> None:
    rows = [
        {"alert_table": "configured", "objective": 0.99, "threshold_seconds": 0.8,
         "per_30_days": {"page": 120.0, "ticket": None}, "missed_burns": 2,
         "median_detection_delay_seconds": 720.0, "budget_remaining": -0.5,
         "cost": {"configuration": "Llama on 1x H100", "basis": "estimated",
                  "peak_replicas": 2, "gpu_cost_per_month_usd": 10044.8,
                  "cost_per_1000_requests_usd": 0.75}, "cost_note": None},
        {"alert_table": "configured", "objective": 0.999, "threshold_seconds": None,
         "per_30_days": {"page": 0.0, "ticket": 30.0}, "missed_burns": 0,
         "median_detection_delay_seconds": None, "budget_remaining": None,
         "cost": None, "cost_note": "the planner sizes for latency SLOs only"},
    ]
    assert what_if_rows(rows) == [
        {"variant": "configured", "objective": "99%", "threshold": "800 ms",
         "pages / 30 d": "120.0", "tickets / 30 d": "–", "missed burns": 2,
         "median detection delay": "12m", "budget left": "-50.0%",
         "cost": "$10,044.80/month, 2 × Llama on 1x H100"},
        {"variant": "what if", "objective": "99.9%", "threshold": "–",
         "pages / 30 d": "0.0", "tickets / 30 d": "30.0", "missed burns": 0,
         "median detection delay": "–", "budget left": "–",
         "cost": "the planner sizes for latency SLOs only"},
    ]
