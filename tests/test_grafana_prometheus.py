"""The dashboards' queries on a real Prometheus 2.42 that runs Vigil's generated rules over a
fleet's series (``support.dashboard_fleet``: a pool with Vigil's labels, one chosen by a
Kubernetes selector, the gateway's series).

Checked: every panel's query, and every variable's ``label_values`` selector, with the variables
set to "All", returns series; choosing one pool narrows a panel to it, a pool chosen by its
selector included; and the SLO panels' values equal ``vigil slo status --prometheus-url`` at the
instant of the recorded sample they show (a rule's value is the engine's at its evaluation
time), within 1e-9.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.dashboard_fleet import CONFIG, fleet_series
from support.grafana_queries import panel_queries, substitute, variable_queries
from support.loopback import wait_for
from support.prometheus import PrometheusServer, PromSeries, run_prometheus
from support.prometheus_mode.systems import slo_status

from alerts.rules.grafana import generate_grafana
from alerts.rules.model import RulesOptions, prom_duration
from alerts.rules.pipeline import generate
from serving.sim.testing import sample_values
from vigil.config import load_config
from vigil.conventions import (
    FILE_ALERT_RULES,
    FILE_SLO_RULES,
    LABEL_BUDGET,
    LABEL_CURRENCY,
    LABEL_POOL,
    LABEL_TENANT,
    METRIC_BUDGET_SPENT_RATIO,
    METRIC_TENANT_COST,
)

pytestmark = pytest.mark.slow

REL_TOL = 1e-9


#: This month's cost per (tenant, pool) as `vigil serve` exports it (USD), and a budget's share.
TENANT_COSTS = (("acme", "chat", 1.5), ("(idle)", "chat", 3.0), ("globex", "batch", 0.5))
BUDGET_SHARE = ("acme", 0.3)


def _serve_series(now_s: int, history_s: int = 30 * 60) -> list[PromSeries]:
    """The chargeback's series on `vigil serve`'s ``/metrics`` (the fleet's series have no
    `vigil serve`): ``TENANT_COSTS`` and ``BUDGET_SHARE``, constant over the history."""
    times = range((now_s - history_s) * 1000, now_s * 1000 + 1, 5000)
    serve = {"job": "vigil", "instance": "serve-0", LABEL_CURRENCY: "USD"}
    out = [PromSeries(f"{METRIC_TENANT_COST}_total", {**serve, LABEL_TENANT: t, LABEL_POOL: p},
                      [(ts, usd) for ts in times]) for t, p, usd in TENANT_COSTS]
    budget, share = BUDGET_SHARE
    out.append(PromSeries(METRIC_BUDGET_SPENT_RATIO,
                          {**serve, LABEL_BUDGET: budget, LABEL_TENANT: budget},
                          [(ts, share) for ts in times]))
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ...]]:
    folder = tmp_path_factory.mktemp("grafana")
    config_path = folder / "vigil.toml"
    config_path.write_text(CONFIG)
    config = load_config(config_path)
    result = generate(config, RulesOptions(interval_s=1.0, period_interval_s=1.0))
    dashboards = generate_grafana(result).dashboards
    now = int(time.time())
    rules = {FILE_SLO_RULES: result.slo_rules_text(), FILE_ALERT_RULES: result.alert_rules_text()}
    with run_prometheus([*fleet_series(now), *_serve_series(now)], rules=rules) as prom:
        wait_for("every rule group evaluated 3 times", lambda: _fewest_evaluations(prom) >= 3,
                 60, interval_s=0.5)
        yield prom, config_path, result, dashboards


def _fewest_evaluations(prom: PrometheusServer) -> float:
    samples = sample_values(httpx.get(prom.base_url + "/metrics", timeout=5).text)
    counts = [v for (name, _), v in samples.items()
              if name == "prometheus_rule_group_iterations_total"]
    return min(counts) if counts else 0.0


def _query(prom: PrometheusServer, expr: str, at: float) -> dict[Any, float]:
    return prom.query(expr, at)


def test_every_panel_and_variable_returns_series(world: tuple[Any, ...]) -> None:
    prom, _, _, dashboards = world
    at = time.time()
    empty = []
    checked = 0
    for uid, model in dashboards.items():
        for title, expr in panel_queries(model):
            got = _query(prom, substitute(expr, rate_interval="5m", range_="30m"), at)
            checked += 1
            if not got:
                empty.append(f"{uid} / {title}: {substitute(expr)}")
        for name, query in variable_queries(model):
            selector = query.removeprefix("label_values(").rsplit(",", 1)[0]
            assert _query(prom, f"count({substitute(selector)})", at), (uid, name)
    assert not empty, "panels without series:\n" + "\n".join(empty)
    assert checked >= 40, checked


def test_the_slo_table_has_one_row_per_slo(world: tuple[Any, ...]) -> None:
    """The overview table's queries carry the same labels, one set per SLO, so that Grafana's
    merge joins them into one row per SLO (a metric name left in would split the rows)."""
    prom, _, result, dashboards = world
    (table,) = [p for p in dashboards["vigil-slo-overview"]["panels"] if p["type"] == "table"]
    at = time.time()
    rows = [set(_query(prom, substitute(t["expr"]), at)) for t in table["targets"]]
    slos = {s.name for s in result.validated.specs}
    objective = rows[0]
    assert {dict(labels)["slo"] for labels in objective} == slos
    assert all(not any(k == "__name__" for k, _ in labels) for labels in objective)
    for got in rows[1:]:
        assert got and got <= objective, (got, objective)
    renamed = table["transformations"][1]["options"]["renameByName"]
    assert renamed["Value #A"] == "objective"


def test_choosing_a_pool_narrows_every_pool_panel_to_it(world: tuple[Any, ...]) -> None:
    prom, _, _, dashboards = world
    at = time.time()
    fleet = dict(panel_queries(dashboards["vigil-fleet"]))
    for title in ("Requests running", "Preemptions", "Output tokens per second",
                  "Prefix-cache hit rate"):
        for pool in ("chat", "batch"):
            got = _query(prom, substitute(fleet[title], {"pool": pool}, rate_interval="5m"), at)
            assert got, (title, pool)
            assert {dict(labels)["pool"] for labels in got} == {pool}, (title, pool, got)
    # Chat's replicas: one runs 4 requests, the other none; batch's run 3 and 1.
    running = _query(prom, substitute(fleet["Requests running"]), at)
    assert {dict(k)["pool"]: v for k, v in running.items()} == {"chat": 4.0, "batch": 4.0}
    idle = dict(panel_queries(dashboards["vigil-cost"]))["Replicas idle"]
    shares = {dict(k)["pool"]: v for k, v in _query(prom, substitute(idle), at).items()}
    assert shares == {"chat": 0.5, "batch": 0.0}
    tenants = dict(panel_queries(dashboards["vigil-cost"]))["Cost by tenant this month"]
    for pool in ("chat", "batch"):
        got = _query(prom, substitute(tenants, {"pool": pool}), at)
        want = {t: usd for t, p, usd in TENANT_COSTS if p == pool}
        assert {dict(k)["tenant"]: v for k, v in got.items()} == want, pool


def _value(prom: PrometheusServer, expr: str, at: float) -> tuple[float, float]:
    """The single value of ``expr`` at ``at`` and the timestamp (seconds) of the recorded
    sample it comes from."""
    got = _query(prom, expr, at)
    assert len(got) == 1, (expr, got)
    ((_, value),) = got.items()
    stamps = _query(prom, f"timestamp({expr})", at)
    ((_, stamp),) = stamps.items()
    return value, stamp


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


@functools.cache
def _status(config_path: Path, base_url: str, at: float) -> dict[str, Any]:
    """``vigil slo status --json --at at`` (the rules' samples share a few instants: each is
    asked once)."""
    return slo_status(config_path, at, base_url)


def _status_slo(config_path: Path, prom: PrometheusServer, at: float, name: str
                ) -> dict[str, Any]:
    status = _status(config_path, prom.base_url, at)
    return next(s for s in status["slos"] if s["name"] == name)


def test_slo_panels_equal_vigil_slo_status_at_the_same_instant(world: tuple[Any, ...]) -> None:
    prom, config_path, result, _ = world
    at = time.time()
    compared = 0
    for spec in result.validated.specs:
        sel = f'{{slo="{spec.name}"}}'
        # Budget left over the period (a sample of the period group, evaluated together with
        # the period's SLI in one group).
        value, stamp = _value(prom, f"slo:period_error_budget_remaining:ratio{sel}", at)
        entry = _status_slo(config_path, prom, stamp, spec.name)
        assert _close(value, entry["budget_remaining"]), (spec.name, value, entry)
        # Attainment over the period: 1 - the period's error ratio.
        period = prom_duration(spec.period_s)
        value, stamp = _value(prom, f"1 - slo:sli_error:ratio_rate{period}{sel}", at)
        entry = _status_slo(config_path, prom, stamp, spec.name)
        assert _close(value, 1.0 - entry["period_error_ratio"]), (spec.name, value, entry)
        # The burn rate over each window of the alert table.
        for window, want in ((w, None) for w in entry["windows"]):
            expr = (f"slo:sli_error:ratio_rate{window}{sel} / on (slo) "
                    f"slo:error_budget:ratio{sel}")
            value, _ = _value(prom, expr, at)
            _, stamp = _value(prom, f"slo:sli_error:ratio_rate{window}{sel}", at)
            want = _status_slo(config_path, prom, stamp, spec.name)["windows"][window]
            assert _close(value, want["burn_rate"]), (spec.name, window, value, want)
            compared += 1
        # The burn rate now: the current window's SLI (recorded by the SLI group) over the
        # budget, as the meta group read it.
        value, meta_stamp = _value(prom, f"slo:current_burn_rate:ratio{sel}", at)
        current = prom_duration(result.validated.current_window_s)
        _, stamp = _value(prom, f"slo:sli_error:ratio_rate{current}{sel}", meta_stamp)
        entry = _status_slo(config_path, prom, stamp, spec.name)
        want = entry["current"]["error_ratio"] / (1.0 - spec.objective)
        assert _close(value, want), (spec.name, value, want)
        compared += 3
    assert compared >= 3 * len(result.validated.specs)


def test_the_alert_panel_shows_what_the_engine_fires(world: tuple[Any, ...]) -> None:
    """Chat's TTFT SLO (9 requests of 10 too slow) pages; every budget-burn alert the panel
    shows firing is one the engine fires at that instant, and no other."""
    prom, config_path, _, dashboards = world
    alerts = dict(panel_queries(dashboards["vigil-slo-overview"]))["Budget alerts firing"]
    at = time.time()
    got = _query(prom, substitute(alerts), at)
    firing = {(dict(k)["slo"], dict(k)["severity"]) for k in got
              if dict(k)["alertname"] == "ErrorBudgetBurn"}
    assert ("chat-ttft", "page") in firing
    status = slo_status(config_path, at, prom.base_url)
    assert firing == {(s["name"], severity) for s in status["slos"]
                      for severity in s["alerts"]}
