"""The dashboard's plain modules: formatting, controls, tiles, alerts, gateway sums, what-if,
access rules. Each case is small and named for the edge it covers."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support.dashboard_seed import AT, seed_dashboard
from support.fleet import MODEL

from collector.store import Store
from dashboard import alerts_view, gateway_data, whatif
from dashboard import format as fmt
from dashboard.auth import (
    access_problem,
    is_loopback,
    oidc_configured,
    password_from_env,
    password_matches,
)
from dashboard.controls import (
    View,
    fit_range,
    parse_at,
    refresh_options,
    refresh_seconds,
)
from dashboard.status_view import (
    filter_slos,
    scaling_view,
    slo_goal,
    slo_state,
    target_states,
)
from slo.sources.embedded import EmbeddedSource
from slo.status import evaluate
from vigil.config import load_config, parse_config
from vigil.model import RequestRecord

CONFIG = parse_config({"pools": [{"name": "chat", "model": MODEL}]})


# --- format ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [fmt.percent, fmt.ratio, fmt.seconds, fmt.usd, fmt.count,
                                fmt.tokens, fmt.duration, fmt.timestamp])
@pytest.mark.parametrize("missing", [None, math.nan, math.inf])
def test_no_data_is_a_dash_never_zero(fn: Any, missing: float | None) -> None:
    assert fn(missing) == fmt.NULL


@pytest.mark.parametrize(("fn", "value", "text"), [
    (fmt.percent, 0.995, "99.5%"), (fmt.ratio, 14.4, "14.40x"), (fmt.seconds, 0.64, "640 ms"),
    (fmt.seconds, 8.0, "8.00 s"), (fmt.usd, 1.4333, "$1.433"), (fmt.usd, 1234.5, "$1,234.50"),
    (fmt.usd, 0.0031, "$0.0031"), (fmt.usd, 0.0, "$0.000"), (fmt.count, 9600.0, "9,600"),
    (fmt.count, 2.5, "2.5"), (fmt.tokens, 187.4, "187"), (fmt.duration, 170.0, "2m50s"),
    (fmt.timestamp, 1_795_000_000.0, "2026-11-18 11:06:40Z"),
])
def test_format(fn: Any, value: float, text: str) -> None:
    assert fn(value) == text


# --- controls -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "seconds"), [
    ("1795000000", 1_795_000_000.0), ("1795000000.5", 1_795_000_000.5),
    ("2026-11-18T11:06:40Z", 1_795_000_000.0), ("2026-11-18T11:06:40", 1_795_000_000.0),
    ("2026-11-18T12:06:40+01:00", 1_795_000_000.0)])
def test_parse_at(text: str, seconds: float) -> None:
    assert parse_at(text) == seconds


@pytest.mark.parametrize("text", ["yesterday", "", "-5", "nan", "inf"])
def test_parse_at_names_the_bad_value(text: str) -> None:
    with pytest.raises(ValueError, match="at="):
        parse_at(text)


def test_refresh_options_include_the_configured_default_in_order() -> None:
    assert refresh_options(30.0) == ["off", "10s", "30s", "1m", "5m"]
    assert refresh_options(45.0) == ["off", "10s", "30s", "45s", "1m", "5m"]
    assert refresh_options(0.0)[0] == "off"
    assert refresh_seconds("off") == 0.0 and refresh_seconds("1m") == 60.0


def test_view_window_live_and_pinned() -> None:
    live = View("1h", 3600.0, None)
    assert live.live and live.window(10_000.0) == (6400.0, 10_000.0)
    pinned = View("1h", 3600.0, 5000.0)
    assert not pinned.live and pinned.window(10_000.0) == (1400.0, 5000.0)


# --- the range fitted to a young store -------------------------------------------------------
@pytest.mark.parametrize(("age", "scrape", "key"), [
    (None, 15.0, "6h"), (360.0, 15.0, "15m"), (360.0, 30.0, "15m"), (30.0, 15.0, "15m"),
    (900.0, 15.0, "15m"), (901.0, 15.0, "1h"), (2000.0, 15.0, "1h"), (5 * 3600.0, 15.0, "6h"),
    (6 * 3600.0, 15.0, "6h"), (7 * 3600.0, 15.0, "6h"), (60.0, 300.0, "1h"),
    (60.0, 3600.0, "6h")])
def test_fit_range_is_the_shortest_preset_holding_the_data(age: float | None, scrape: float,
                                                           key: str) -> None:
    assert fit_range(age, scrape_interval_s=scrape) == key


def test_fit_range_never_beyond_the_default() -> None:
    assert fit_range(2000.0, scrape_interval_s=15.0, default="15m") == "15m"
    assert fit_range(float("nan"), scrape_interval_s=15.0) == "6h"


def test_fitted_window_starts_at_the_first_sample() -> None:
    now = 10_000.0
    fitted = View("15m", 900.0, None, data_start_s=now - 360.0, min_span_s=240.0)
    assert fitted.fitted and fitted.window(now) == (now - 360.0, now)
    # Minutes later the store has grown; the window with it, up to the range.
    assert fitted.window(now + 300.0) == (now - 360.0, now + 300.0)
    assert fitted.window(now + 3600.0) == (now + 3600.0 - 900.0, now + 3600.0)
    # Younger than a few scrapes: a few scrapes all the same.
    assert View("15m", 900.0, None, data_start_s=now - 30.0, min_span_s=240.0).window(now) == (
        now - 240.0, now)
    assert not View("15m", 900.0, None).fitted


@pytest.mark.parametrize(("seconds", "text"), [
    (40.0, "40 s"), (360.0, "6 min"), (3600.0, "1 h"), (4500.0, "1 h 15 min"),
    (86400.0, "1 d"), (90000.0, "1 d 1 h"), (None, fmt.NULL)])
def test_span_in_words(seconds: float | None, text: str) -> None:
    assert fmt.span(seconds) == text


# --- rule labels --------------------------------------------------------------------------------
@pytest.mark.parametrize(("values", "domain", "height"), [
    ([0.8, 0.64], (0.0, 2.76), 135.0),            # an SLO threshold and the scale-out line
    ([14.4, 6.0, 3.0, 1.0], (0.0, 31.7), 120.0),  # the burn-rate factors, bottom crowded
    ([0.005, 0.005], (0.0, 0.17), 150.0),         # two SLOs with the same objective
    ([0.9, 0.8], (0.0, 1.1), 240.0),              # far apart: nothing moves
    ([2.0], (0.0, 2.3), 100.0)])                  # near the top: inside the frame
def test_rule_labels_do_not_overlap(values: list[float], domain: tuple[float, float],
                                    height: float) -> None:
    from dashboard.charts import LABEL_GAP, label_centres, label_expressions

    centres = label_centres(values, domain, height)
    ordered = sorted(centres)
    assert all(b - a >= LABEL_GAP - 1e-9 for a, b in itertools.pairwise(ordered))
    assert ordered[0] > 0 and ordered[-1] < height
    # The higher rule's label stays the higher one, and none sits below its own rule.
    rank = sorted(range(len(values)), key=lambda i: -values[i])
    assert [centres[i] for i in rank] == ordered
    for v, c in zip(values, centres, strict=True):
        assert c < height * (domain[1] - v) / (domain[1] - domain[0])
    # The Vega expressions compute the same, whatever height the chart is drawn at.
    exprs = label_expressions(values, domain)
    for h in (height, 2 * height):
        got = [eval(e, {"__builtins__": {}, "max": max, "min": min, "height": h})
               for e in exprs]
        assert got == pytest.approx(label_centres(values, domain, h), abs=1e-3)


def test_far_apart_labels_sit_just_above_their_rules() -> None:
    from dashboard.charts import label_centres

    assert label_centres([0.9, 0.4], (0.0, 1.0), 200.0) == pytest.approx([12.0, 112.0])


def test_lines_place_each_rule_label_by_expression_over_an_exact_domain() -> None:
    from dashboard.charts import Rule, lines, long_frame

    df = long_frame([(AT - 60, "p95", 2.4), (AT, "p95", 2.5)])
    spec = lines(df, y_title="seconds", rules=[Rule(0.8, "SLO ≤ 800 ms"),
                                                Rule(0.64, "scale out above 640 ms")]).to_dict()
    layers = spec["layer"]
    assert layers[0]["encoding"]["y"]["scale"] == {"domain": [0.0, pytest.approx(2.875)],
                                                   "nice": False, "zero": False}
    texts = [ly for ly in layers if (ly.get("mark") or {}).get("type") == "text"]
    # A white halo under each label, then the label in its rule's colour.
    assert len(texts) == 4 and texts[0]["mark"]["stroke"] == "white"
    assert all("height" in ly["encoding"]["y"]["value"]["expr"] for ly in texts)


def test_the_builders_charts_meet_the_vega_lite_schema() -> None:
    # Drawing skips the schema check (charts.Layers); this is where it is made.
    from dashboard.charts import Layers, Rule, bars, lines, long_frame

    df = long_frame([(AT - 60, "p95", 2.4), (AT, "p95", 2.5), (AT, "p99", None)])
    rules = [Rule(0.8, "SLO ≤ 800 ms"), Rule(0.64, "scale out", "#ffa421")]
    frame = df.assign(window=df["series"])
    for chart in (lines(df, y_title="seconds", rules=rules), lines(df, y_title="s"),
                  bars(frame, x="window", y="value", x_title="w", y_title="v", rules=rules,
                       sort=["p95"]),
                  bars(frame.assign(c="#ff4b4b"), x="window", y="value", x_title="w",
                       y_title="v", color="c")):
        assert isinstance(chart, Layers)
        assert chart.to_dict(validate=True) == chart.to_dict()


def test_y_domain_has_headroom_and_zero() -> None:
    from dashboard.charts import y_domain

    assert y_domain([1.0, 2.0]) == (0.0, pytest.approx(2.3))
    assert y_domain([]) == (0.0, 1.0)
    low, high = y_domain([10.0, 20.0], zero=False)
    assert low == pytest.approx(9.5) and high == pytest.approx(21.5)
    assert y_domain([0.0, 0.0]) == (0.0, 0.15)


# --- status tiles -------------------------------------------------------------------------------
def _slo(**kw: Any) -> dict[str, Any]:
    base = {"name": "chat-ttft", "pool": "chat", "model": MODEL, "endpoint": "all",
            "indicator": "ttft", "objective": 0.95, "threshold_seconds": 0.8, "sli": 0.9,
            "alerts": [], "windows": {"5m": {"error_ratio": 0.1, "burn_rate": 2.0}}}
    return {**base, **kw}


def test_slo_state_page_beats_ticket_and_no_data_is_not_ok() -> None:
    assert slo_state(_slo(alerts=["ticket", "page"])) == "page"
    assert slo_state(_slo(alerts=["ticket"])) == "ticket"
    assert slo_state(_slo()) == "ok"
    assert slo_state(_slo(sli=None, windows={"5m": {"error_ratio": None}})) == "no data"


def test_filter_slos_by_pool_model_endpoint() -> None:
    slos = [_slo(), _slo(name="b", pool="batch"), _slo(name="c", endpoint="chat"),
            _slo(name="d", model="other")]
    assert [s["name"] for s in filter_slos(slos)] == ["chat-ttft", "b", "c", "d"]
    assert [s["name"] for s in filter_slos(slos, pools=["batch"])] == ["b"]
    assert [s["name"] for s in filter_slos(slos, models=["other"])] == ["d"]
    assert [s["name"] for s in filter_slos(slos, endpoint="chat")] == ["c"]
    assert len(filter_slos(slos, endpoint="all")) == 4


def test_slo_goal_in_words() -> None:
    assert slo_goal(_slo()) == "TTFT ≤ 800 ms for 95.00% of requests"
    assert slo_goal(_slo(indicator="error_rate", objective=0.995)) == (
        "errors ≤ 0.50% of requests")
    assert slo_goal(_slo(indicator="availability", objective=0.995)) == (
        "no server error for 99.50% of requests")
    assert slo_goal(_slo(indicator="replica_up", objective=0.995)) == (
        "replicas up 99.50% of the time")
    assert slo_goal(_slo(indicator="e2e", threshold_seconds=8.0, endpoint="chat")) == (
        "end-to-end ≤ 8.00 s for 95.00% of requests (chat)")


def test_scaling_view_says_when_the_next_decision_comes() -> None:
    rec = {"action": "hold", "current": 4, "desired": 4, "reasons": ["cooldown: ..."],
           "next_decision_at": AT + 170.0}
    view = scaling_view(rec, AT)
    assert view is not None and view.next_decision == "in 2m50s" and view.change == 0
    now = scaling_view({**rec, "action": "scale_out", "desired": 5, "next_decision_at": AT}, AT)
    assert now is not None and now.next_decision == "now" and now.change == 1
    assert scaling_view(None, AT) is None


# --- targets, alerts ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_dashboard(tmp_path_factory.mktemp("units"))


def test_target_states_from_up(seeded: Path) -> None:
    config = load_config(seeded)
    with Store(seeded.parent / "vigil.db", readonly=True) as store:
        source = EmbeddedSource(store)
        now = {t.name: t.state for t in target_states(config, source, AT)}
        # batch-0 was down 2h20m-2h ago; after the lookback nothing is left of chat-0's up.
        during = {t.name: t.state for t in target_states(config, source, AT - 8000)}
        later = {t.name: t.state for t in target_states(config, source, AT + 3600)}
    assert set(now.values()) == {"up"}
    assert during["batch-0"] == "down" and during["chat-0"] == "up"
    assert set(later.values()) == {"no data"}


def test_evaluated_alerts_are_the_conditions_of_vigil_serve(seeded: Path) -> None:
    config = load_config(seeded)
    with Store(seeded.parent / "vigil.db", readonly=True) as store:
        source = EmbeddedSource(store)
        status = evaluate(config, source, AT)
        rows = alerts_view.evaluated_alerts(config, status, source, AT)
    names = {(r["alert"], r["severity"], r["subject"]) for r in rows}
    assert ("ErrorBudgetBurn", "page", "chat-error-rate") in names
    assert ("ScalingRecommendationChanged", "ticket", MODEL) in {
        (r["alert"], r["severity"], r["subject"]) for r in rows if r["pool"] == "chat"}
    assert rows[0]["severity"] == "page"  # pages first
    assert all(r["origin"] == alerts_view.FROM_CONDITIONS and r["since"] is None for r in rows)


def test_served_alerts_need_an_outbox(tmp_path: Path) -> None:
    assert alerts_view.served_alerts(tmp_path / "none.db", AT) is None
    assert not (tmp_path / "none.db").exists()  # reading created nothing


def test_served_alerts_read_what_vigil_serve_saved(tmp_path: Path) -> None:
    from alerts.model import Alert
    from alerts.notifier import Notifier

    config = parse_config({"pools": [{"name": "chat", "model": MODEL}]})
    notifier = Notifier(config, tmp_path / "outbox.db", clock=lambda: AT)
    alert = Alert({"alertname": "ErrorBudgetBurn", "severity": "page", "pool": "chat",
                   "slo": "chat-ttft"}, {"summary": "burning"}, starts_at=AT - 60)
    notifier.process(AT, [alert])
    notifier.outbox.close()
    rows = alerts_view.served_alerts(tmp_path / "outbox.db", AT)
    assert rows == [{"severity": "page", "alert": "ErrorBudgetBurn", "pool": "chat",
                     "subject": "chat-ttft", "summary": "burning", "since": AT - 60,
                     "routes": "", "origin": alerts_view.FROM_SERVE}]


# --- gateway sums -----------------------------------------------------------------------------
class _Log:
    """A RequestLog over a list (the protocol is one method; the gateway's real one is tested
    in support.dashboard_seed and test_dashboard_app)."""

    def __init__(self, records: list[RequestRecord]):
        self._records = records

    def records(self, pool: str, at_s: float, window_s: float) -> Iterable[RequestRecord]:
        return [r for r in self._records if r.pool == pool and at_s - window_s < r.ts_s <= at_s]


def _rec(i: int, **kw: Any) -> RequestRecord:
    base: dict[str, Any] = {"id": f"r{i}", "ts_s": AT - i, "pool": "chat", "model": MODEL,
                            "endpoint": "chat", "prompt_tokens": 100, "generated_tokens": 100,
                            "tier": "standard", "cost_usd": 0.001}
    return RequestRecord(**{**base, **kw})


def test_savings_and_error_classes() -> None:
    log = _Log([_rec(1, cache_hit="l1", saved_usd=0.01), _rec(2, cache_hit="l2",
                saved_usd=0.02), _rec(3, error_class="timeout", error=True), _rec(4)])
    assert gateway_data.savings_point(log, "chat", AT, 60.0) == {
        "saved_usd": pytest.approx(0.03), "hits": 2.0, "l1_hits": 1.0, "l2_hits": 1.0,
        "requests": 4.0}
    assert gateway_data.error_class_point(log, "chat", AT, 60.0) == {"ok": 3.0, "timeout": 1.0}
    assert gateway_data.error_class_point(log, "chat", AT, 60.0, model="other") == {}


def test_anomaly_rows_join_records_and_list_a_request_once() -> None:
    records = [_rec(1, tier="premium", cost_usd=0.5)]
    anomaly = {"kind": "request", "pool": "chat", "model": MODEL, "id": "r1",
               "endpoint": "chat", "request_tokens": 60000, "threshold_tokens": 9000.0,
               "mean_tokens_per_request": 900.0}
    rows = gateway_data.anomaly_rows([anomaly, anomaly, {"kind": "histogram_lower_bound"}],
                                     records)
    assert rows == [{"time": AT - 1, "pool": "chat", "model": MODEL, "tier": "premium",
                     "endpoint": "chat", "tokens": 60000, "threshold_tokens": 9000.0,
                     "mean_tokens": 900.0, "cost_usd": 0.5, "id": "r1"}]


def test_open_request_log_only_when_the_records_exist(tmp_path: Path) -> None:
    config = load_config(seed_dashboard(tmp_path, store=False))
    assert gateway_data.open_request_log(config) is None
    assert not config.gateway_records_path().exists()


# --- what-if ----------------------------------------------------------------------------------
def test_what_if_at_the_observed_replicas_and_price_is_the_engines_figure(seeded: Path) -> None:
    config = load_config(seeded)
    with Store(seeded.parent / "vigil.db", readonly=True) as store:
        cost = evaluate(config, EmbeddedSource(store), AT)["pools"]["chat"]["cost"]
    pool = config.pool("chat")
    replicas = whatif.observed_replicas(cost, config.engine.cost_window, pool.gpus_per_replica)
    assert replicas == pytest.approx(2.0)
    got = whatif.per_1000_requests(requests=cost["requests"], window_s=config.engine.cost_window,
                                   replicas=replicas, gpus_per_replica=pool.gpus_per_replica,
                                   usd_per_gpu_hour=cost["usd_per_gpu_hour"])
    assert got == pytest.approx(cost["per_1000_requests"], rel=1e-12)
    half = whatif.per_1000_requests(requests=cost["requests"],
                                    window_s=config.engine.cost_window, replicas=1,
                                    gpus_per_replica=1, usd_per_gpu_hour=cost["usd_per_gpu_hour"])
    assert half == pytest.approx(got / 2)


def test_what_if_without_requests_or_with_negative_input() -> None:
    args = {"window_s": 3600.0, "gpus_per_replica": 1, "usd_per_gpu_hour": 2.0}
    assert whatif.per_1000_requests(requests=None, replicas=1, **args) is None
    assert whatif.per_1000_requests(requests=0.0, replicas=1, **args) is None
    with pytest.raises(ValueError, match="negative"):
        whatif.per_1000_requests(requests=10.0, replicas=-1, **args)
    assert whatif.observed_replicas({"gpu_hours": None}, 3600.0, 1) is None


# --- access -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("10.0.0.5", False), ("::", False), ("", False)])
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_password_from_env_needs_a_named_non_empty_variable() -> None:
    named = parse_config({"dashboard": {"password_env": "DASH_PW"}})
    assert password_from_env(named, {"DASH_PW": "s3cret"}) == "s3cret"
    assert password_from_env(named, {"DASH_PW": ""}) is None
    assert password_from_env(named, {}) is None
    assert password_from_env(CONFIG, {"DASH_PW": "s3cret"}) is None


def test_password_matches_exactly() -> None:
    assert password_matches("s3cret", "s3cret")
    assert not password_matches("s3cre", "s3cret")
    assert not password_matches("", "s3cret")
    assert password_matches("pässwörd", "pässwörd")


def test_oidc_needs_an_auth_section_with_its_keys(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[auth]\nredirect_uri = "http://x/oauth2callback"\ncookie_secret = "k"\n'
                    'client_id = "a"\nclient_secret = "b"\n'
                    'server_metadata_url = "https://x/.well-known/openid-configuration"\n')
    partial = tmp_path / "partial.toml"
    partial.write_text('[auth]\nredirect_uri = "http://x/oauth2callback"\n')
    broken = tmp_path / "broken.toml"
    broken.write_text("[auth\n")
    assert oidc_configured([tmp_path / "missing.toml", broken, good])
    assert not oidc_configured([partial, broken, tmp_path / "missing.toml"])


def test_access_problem_says_how_to_configure_it() -> None:
    assert access_problem("127.0.0.1", CONFIG, {}, []) is None
    problem = access_problem("0.0.0.0", CONFIG, {}, [])
    assert problem is not None
    assert "password_env" in problem and "st.login" in problem and "127.0.0.1" in problem
    named = parse_config({"dashboard": {"password_env": "DASH_PW"}})
    unset = access_problem("0.0.0.0", named, {}, [])
    assert unset is not None and "export DASH_PW=" in unset
    assert access_problem("0.0.0.0", named, {"DASH_PW": "x"}, []) is None


# --- data: "now", and cached series equal to the engine's points ---------------------------------
def test_live_now_is_rounded_down_to_the_scrape_interval(seeded: Path) -> None:
    from dashboard import data

    config, key = data.load(str(seeded))
    live = data.Context(config, key, View("1h", 3600.0, None), None)
    got = data.now(live, clock=lambda: AT + 47.9)
    assert got % 30 == 0 and AT + 47.9 - 30 < got <= AT + 47.9  # scrape_interval 30 s
    assert data.now(live, clock=lambda: AT + 20.0) == got  # the same within one interval
    pinned = data.Context(config, key, View("1h", 3600.0, AT - 5.0), AT - 5.0)
    assert data.now(pinned, clock=lambda: AT + 47.9) == AT - 5.0


def test_cached_series_are_the_engine_points_settled_or_recent(seeded: Path) -> None:
    from dashboard import data
    from dashboard import timeseries as ts

    config, key = data.load(str(seeded))
    ctx = data.Context(config, key, View("1h", 3600.0, None), None)
    times = ts.chart_times(AT, 600.0, 60.0)
    # The clock just after AT: the last two points are "recent" (may still change).
    clock = lambda: AT + 30.0  # noqa: E731
    got = data.series(ctx, "queue", times, "chat", clock=clock)
    with Store(seeded.parent / "vigil.db", readonly=True) as store:
        source = EmbeddedSource(store)
        want = [(t, ts.queue_point(source, config.pool("chat"), t)) for t in times]
    assert got == want
    assert data.series(ctx, "queue", times, "chat", clock=clock) == want  # from the cache
    assert data.series(ctx, "queue", [], "chat") == []


# --- the public surface -------------------------------------------------------------------------
@pytest.mark.parametrize("module", [
    "dashboard.alerts_view", "dashboard.auth", "dashboard.charts", "vigil_shell.dashboard_cli",
    "dashboard.controls", "dashboard.data", "dashboard.format", "dashboard.gateway_data",
    "dashboard.status_view", "dashboard.timeseries", "dashboard.whatif"])
def test_every_exported_name_exists(module: str) -> None:
    import importlib

    mod = importlib.import_module(module)
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert not missing
    assert len(set(mod.__all__)) == len(mod.__all__)


@pytest.mark.parametrize(("span", "fmt_", "step"), [
    (900, "%H:%M", 300), (3600, "%H:%M", 600), (6 * 3600, "%H:%M", 3600),
    (7 * 86400, "%b %d", 86400), (30 * 86400, "%b %d", 604800)])
def test_time_axis_ticks_on_whole_units(span: float, fmt_: str, step: float) -> None:
    from dashboard.charts import time_axis

    got_fmt, values = time_axis(AT - span, AT)
    assert got_fmt == fmt_
    ticks = [round(datetime(v["year"], v["month"], v["date"], v["hours"], v["minutes"],
                            v["seconds"], tzinfo=UTC).timestamp() * 1000) for v in values]
    assert all(t % (step * 1000) == 0 for t in ticks)
    assert {b - a for a, b in itertools.pairwise(ticks)} == {step * 1000}
    assert (AT - span) * 1000 <= ticks[0] and ticks[-1] <= AT * 1000
    assert 2 <= len(ticks) <= 8
