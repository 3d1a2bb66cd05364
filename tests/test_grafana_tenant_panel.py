"""The cost dashboard's chargeback panels (``vigil rules grafana``): "Cost by tenant this month"
over ``vigil_tenant_cost_usd_total`` and "Budgets spent this month" over
``vigil_budget_spent_ratio``, both bar gauges of instant queries on the ``datasource`` variable.

Checked: the queries and units (the ``[cost] currency`` names the unit), that the dashboard
still validates against Grafana's schema, that the queries read the names and labels `vigil
serve`'s exporter writes (``alerts.exporter`` over the chargeback of ``support.chargeback``'s
known history), and on a real Prometheus that the panels show that history's hand-computed
figures, each tenant once although two copies of `vigil serve` export it, narrowed by
``$pool``.
"""

from __future__ import annotations

import json
import re
import time
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support import chargeback as cb
from support.grafana_queries import panel_queries, substitute
from support.prometheus import PromSeries, run_prometheus

from alerts.exporter import Exporter, Snapshot
from alerts.rules.grafana import generate_grafana
from alerts.rules.grafana.dashboards import UID_COST, currency_unit
from alerts.rules.pipeline import generate
from serving.sim.testing import sample_values
from slo.cost.budgets import BudgetTracker
from slo.cost.ledger import ledger, top_tenants
from slo.cost.months import month_bounds
from slo.sources.open import open_source, request_log
from vigil.config import Config, load_config, parse_config
from vigil.conventions import TENANT_OTHER

TESTS = Path(__file__).resolve().parent
RULES_GOLDEN = TESTS / "golden" / "rules"
SCHEMA = json.loads((TESTS / "fixtures" / "grafana_dashboard.jsonschema.json").read_text())
TENANTS = "Cost by tenant this month"
BUDGETS = "Budgets spent this month"
TENANT_EXPR = ('sort_desc(sum by (tenant) (max by (tenant, pool, currency) '
               '(vigil_tenant_cost_usd_total{pool=~"$pool"})))')
BUDGET_EXPR = "sort_desc(max by (budget, tenant) (vigil_budget_spent_ratio))"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _cost_board(config: Config) -> dict[str, Any]:
    return dict(generate_grafana(generate(config)).dashboards)[UID_COST]


def _panel(board: dict[str, Any], title: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [p for p in board["panels"] if p.get("title") == title]
    assert len(found) == 1, title
    return found[0]


def _valid(model: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(model)]


def _config_with_cost(currency: str) -> Config:
    """The golden ``defaults`` rules config with ``[cost] currency`` set."""
    text = (RULES_GOLDEN / "defaults" / "vigil.toml").read_text()
    assert "[cost]" not in text
    return parse_config(tomllib.loads(text + f'\n[cost]\ncurrency = "{currency}"\n'))


@pytest.mark.parametrize("case", ["defaults", "kubernetes"])
def test_the_cost_dashboard_has_the_tenant_and_budget_panels(case: str) -> None:
    board = _cost_board(load_config(RULES_GOLDEN / case / "vigil.toml"))
    assert _valid(board) == []
    tenants, budgets = _panel(board, TENANTS), _panel(board, BUDGETS)
    for panel, expr, legend in ((tenants, TENANT_EXPR, "{{tenant}}"),
                                (budgets, BUDGET_EXPR, "{{budget}}")):
        assert panel["type"] == "bargauge"
        assert panel["datasource"] == DATASOURCE
        (target,) = panel["targets"]
        assert target["datasource"] == DATASOURCE
        assert target["expr"] == expr
        assert target["instant"] is True and target["range"] is False
        assert target["legendFormat"] == legend
        assert panel["options"]["orientation"] == "horizontal"
        assert panel["options"]["reduceOptions"]["calcs"] == ["lastNotNull"]
    assert tenants["fieldConfig"]["defaults"]["unit"] == "currencyUSD"
    budget = budgets["fieldConfig"]["defaults"]
    assert budget["unit"] == "percentunit" and (budget["min"], budget["max"]) == (0, 1)
    assert [s["value"] for s in budget["thresholds"]["steps"]] == [None, 0.8, 1.0]
    # The panels come last, side by side, below every other panel of the dashboard.
    others = [p for p in board["panels"] if p["title"] not in (TENANTS, BUDGETS)]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in others)
    assert [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in (tenants, budgets)] == [
        (0, bottom), (12, bottom)]
    # panel_queries (promtool's and Prometheus's checks) sees both.
    queries = dict(panel_queries(board))
    assert queries[TENANTS] == TENANT_EXPR and queries[BUDGETS] == BUDGET_EXPR


@pytest.mark.parametrize(("currency", "unit"), [("EUR", "currencyEUR"), ("JPY", "currencyJPY"),
                                                ("AUD", "suffix: AUD")])
def test_the_currency_names_the_unit(currency: str, unit: str) -> None:
    assert currency_unit(currency) == unit
    board = _cost_board(_config_with_cost(currency))
    assert _valid(board) == []
    panel = _panel(board, TENANTS)
    assert panel["fieldConfig"]["defaults"]["unit"] == unit
    assert f"({currency}, months in UTC)" in panel["description"]


# --- what vigil serve exports ------------------------------------------------------------------
@pytest.fixture(scope="module")
def exposition(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`vigil serve`'s ``/metrics`` for the known history at ``T0 + SPAN_S``: this month's
    chargeback (nothing before ``T0``, so the window's figures) and two budgets."""
    tmp = tmp_path_factory.mktemp("chargeback")
    path = cb.write_config(tmp, [{"tenant": "acme", "monthly": 1.0},
                                 {"tenant": "globex", "pool": "chat", "monthly": 50.0}])
    cb.write_store(tmp / "store.sqlite")
    cb.write_records(tmp / "records.sqlite")
    config = load_config(path)
    at = cb.T0 + cb.SPAN_S
    start, _ = month_bounds("2026-11", config.cost.timezone)
    with open_source(config, str(path)) as source:
        log = request_log(config)
        lines = ledger(source, config, log, start, at).lines
        statuses = BudgetTracker(config).evaluate(source, log, at)
    exporter = Exporter()
    exporter.update(Snapshot(tenant_costs=top_tenants(lines, config.cost.metrics_tenants,
                                                      TENANT_OTHER),
                             budgets=tuple(statuses), currency=config.cost.currency))
    return exporter.exposition().decode()


def _reads(expr: str) -> tuple[set[str], set[str]]:
    """The series names an expression reads (Vigil's), and the labels it matches or groups
    by."""
    names = set(re.findall(r"\b(vigil_\w+)", expr))
    grouped = {label.strip() for group in re.findall(r"by \(([^)]*)\)", expr)
               for label in group.split(",")}
    return names, grouped | set(re.findall(r"(\w+)=~", expr))


def test_the_panels_read_what_vigil_serve_exports(exposition: str) -> None:
    samples = sample_values(exposition)
    for expr in (TENANT_EXPR, BUDGET_EXPR):
        names, labels = _reads(expr)
        assert len(names) == 1 and labels, expr
        (name,) = names
        exported = [dict(ls) for n, ls in samples if n == name]
        assert exported, (name, sorted({n for n, _ in samples}))
        assert all(labels <= set(ls) for ls in exported), (name, labels, exported[0])


# --- on a real Prometheus ------------------------------------------------------------------------
COPIES = ("serve-0", "serve-1")


def _series(exposition: str, now_s: int) -> list[PromSeries]:
    """The chargeback's series as two copies of `vigil serve` on a shared database export
    them (the same values, each with its own ``instance``), over the last ten minutes."""
    times = [(now_s - 600 + 15 * i) * 1000 for i in range(41)]
    out = []
    for (name, labels), value in sample_values(exposition).items():
        if not name.startswith(("vigil_tenant_cost", "vigil_budget")):
            continue
        for copy in COPIES:
            out.append(PromSeries(name, {**dict(labels), "job": "vigil", "instance": copy},
                                  [(t, value) for t in times]))
    return out


def _values(prom: Any, expr: str, at: float, label: str) -> list[tuple[str, float]]:
    """The instant query's result in Prometheus's order (what the bar gauge draws)."""
    data = prom.query_raw(expr, at)
    return [(r["metric"][label], float(r["value"][1])) for r in data["result"]]


@pytest.mark.slow
def test_the_panels_show_the_known_history_on_prometheus(exposition: str) -> None:
    now = int(time.time())
    with run_prometheus(_series(exposition, now)) as prom:
        every = _values(prom, substitute(TENANT_EXPR), now, "tenant")
        # Largest first (sort_desc), each tenant once though both copies export it.
        assert [t for t, _ in every] == ["(idle)", "globex", "initech", "(unattributed)", "acme"]
        assert dict(every) == pytest.approx({**cb.EXPECTED_TENANTS, "(idle)": 42.40,
                                             "(unattributed)": 0.60})
        # $pool = chat: acme's requests all ran on chat; globex's r11 and initech's r12 on code.
        chat = dict(_values(prom, substitute(TENANT_EXPR, {"pool": "chat"}), now, "tenant"))
        assert chat == pytest.approx({"acme": 0.45, "globex": 0.75, "initech": 1.10,
                                      "(idle)": 36.70, "(unattributed)": 0.60})
        budgets = _values(prom, substitute(BUDGET_EXPR), now, "budget")
        assert [b for b, _ in budgets] == ["acme", "globex/chat"]
        assert dict(budgets) == pytest.approx({"acme": 0.45, "globex/chat": 0.75 / 50})
