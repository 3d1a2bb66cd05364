"""The Business page's "Cost by tenant" section through Streamlit's ``AppTest``, over the known
history of ``support.chargeback`` (every figure computed by hand in its docstring): the tenant
table shows acme 0.45, globex 1.95 and initech 1.40 USD for ``T0`` .. ``T0 + SPAN_S``, each
pool's reconciliation line, the idle and unattributed lines apart in the bar chart, the
grouping by tier, the pool filter, this month's budgets when ``[[budgets]]`` exist, and no
figure at all for a range without data."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest
from support import chargeback as cb
from support.apptest import run_page, texts

from dashboard import cost_data

#: The budgets of the history's config: acme's over every pool, globex's on chat only.
BUDGETS = [{"tenant": "acme", "monthly": 1.0},
           {"tenant": "globex", "pool": "chat", "monthly": 50.0}]
COST = "cost (USD)"
#: Each pool's reconciliation, as `vigil cost report` prints it (see the history's docstring).
RECONCILIATION = (
    "chat: tenants 2.30 + idle 36.70 + unattributed 0.60 = 39.60 USD; pool cost 39.60 USD",
    "code: tenants 1.50 + idle 5.70 + unattributed 0.00 = 7.20 USD; pool cost 7.20 USD",
)
#: The history's window (T0 .. T0 + 4 h) as the custom range of the URL.
WINDOW = {"range": "custom", "start": "2026-11-10T00:00", "end": "2026-11-10T04:00"}
#: A range of the same month with nothing in it: the day before T0.
EMPTY = {"range": "custom", "start": "2026-11-09T00:00", "end": "2026-11-09T04:00"}


def _history(folder: Path, budgets: list[dict[str, Any]] | None) -> Path:
    folder.mkdir()
    config = cb.write_config(folder, budgets)
    cb.write_store(folder / "store.sqlite")
    cb.write_records(folder / "records.sqlite")
    return config


@pytest.fixture(scope="module")
def with_budgets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _history(tmp_path_factory.mktemp("tenant-cost") / "budgets", BUDGETS)


@pytest.fixture(scope="module")
def without_budgets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _history(tmp_path_factory.mktemp("tenant-cost") / "plain", None)


def _tenant_table(at: AppTest) -> pd.DataFrame | None:
    """The tenant table (the frame with a tenant and a cost column), or None."""
    found = [d.value for d in at.dataframe if {"tenant", COST} <= set(d.value.columns)]
    assert len(found) <= 1
    return found[0] if found else None


def _budget_table(at: AppTest) -> pd.DataFrame | None:
    found = [d.value for d in at.dataframe if "budget" in d.value.columns]
    return found[0] if found else None


def _bars(at: AppTest) -> pd.DataFrame | None:
    """The data of the cost-per-tenant bar chart, or None when it is not drawn."""
    for el in at.get("vega_lite_chart"):
        for d in el.proto.datasets:
            frame: pd.DataFrame = pa.ipc.open_stream(d.data.data).read_all().to_pandas()
            if {"tenant", "kind"} <= set(frame.columns):
                return frame
    return None


def _absent(value: Any) -> bool:
    """A cell without a figure (Arrow's null comes back as None or NaN, never 0)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def test_the_tenant_table_shows_the_hand_computed_costs(with_budgets: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(with_budgets, monkeypatch, "business", **WINDOW)
    shown = texts(at)
    assert "Cost by tenant" in [s.value for s in at.subheader]
    table = _tenant_table(at)
    assert table is not None
    # The currency is named in every money column's header.
    assert {COST, "per 1000 requests (USD)", "per 1M output tokens (USD)",
            "per SLO-met request (USD)", "GPU-hours", "requests", "SLO met"} <= set(table)
    costs = dict(zip(table["tenant"], table[COST], strict=True))
    for tenant, usd in cb.EXPECTED_TENANTS.items():
        assert costs[tenant] == pytest.approx(usd, abs=1e-9), tenant
    assert costs["(idle)"] == pytest.approx(36.70 + 5.70)
    assert costs["(unattributed)"] == pytest.approx(0.60)
    # The customers first (costliest first), then the unattributed and the idle lines.
    assert list(table["tenant"]) == ["globex", "initech", "acme", "(unattributed)", "(idle)"]
    rows = table.set_index("tenant")
    # acme: r1 and r8 finished on a replica (r4 was cancelled, r5 a cache hit).
    assert rows.loc["acme", "requests"] == 2
    assert rows.loc["acme", "per 1000 requests (USD)"] == pytest.approx(0.45 / 2 * 1000)
    assert rows.loc["initech", "SLO met"] == pytest.approx(1.0)
    # The idle line has no request: its ratios are absent, not 0.
    for column in ("per 1000 requests (USD)", "per 1M output tokens (USD)", "SLO met",
                   "per SLO-met request (USD)"):
        assert _absent(rows.loc["(idle)", column]), column
    assert "46.80 USD in all" in shown
    for line in RECONCILIATION:
        assert line in shown


def test_the_bars_show_idle_and_unattributed_apart(with_budgets: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(with_budgets, monkeypatch, "business", **WINDOW)
    bars = _bars(at)
    assert bars is not None
    assert list(bars["tenant"]) == ["globex", "initech", "acme", "(unattributed)", "(idle)"]
    by = bars.set_index("tenant")
    assert dict(by["cost"]) == pytest.approx({**cb.EXPECTED_TENANTS, "(unattributed)": 0.60,
                                              "(idle)": 42.40})
    assert by.loc["(idle)", "kind"] == cost_data.KIND_IDLE
    assert by.loc["(unattributed)", "kind"] == cost_data.KIND_UNATTRIBUTED
    colours = {by.loc[t, "color"] for t in ("acme", "(idle)", "(unattributed)")}
    assert len(colours) == 3  # three kinds, three colours
    assert set(by["color"]) == set(cost_data.BAR_COLORS.values())


def test_grouping_by_tier_splits_each_tenant(with_budgets: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(with_budgets, monkeypatch, "business", **WINDOW)
    at.selectbox(key="tenant-cost-by").set_value("tenant and tier").run()
    assert not at.exception
    table = _tenant_table(at)
    assert table is not None and "tier" in table
    got = {(r["tenant"], r["tier"]): r[COST] for _, r in table.iterrows()
           if not r["tenant"].startswith("(")}
    # By hand (the history's table): acme premium r1 + r8, acme standard r4; globex standard
    # r2, premium r9, batch r11; initech batch r3, standard r7 + r12.
    assert got == pytest.approx({
        ("acme", "premium"): 0.35, ("acme", "standard"): 0.10,
        ("globex", "standard"): 0.15, ("globex", "premium"): 0.60, ("globex", "batch"): 1.20,
        ("initech", "batch"): 0.60, ("initech", "standard"): 0.80})
    # The idle and unattributed lines have no tier: absent, not "".
    idle = table[table["tenant"] == "(idle)"]
    assert len(idle) == 1 and _absent(idle["tier"].iloc[0])
    # The bars stay per tenant whatever the table's grouping.
    bars = _bars(at)
    assert bars is not None
    assert dict(bars.set_index("tenant")["cost"])["globex"] == pytest.approx(1.95)


def test_the_pool_filter_narrows_the_chargeback_and_the_budgets(
        with_budgets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(with_budgets, monkeypatch, "business", pool=["code"], **WINDOW)
    table = _tenant_table(at)
    assert table is not None
    assert dict(zip(table["tenant"], table[COST], strict=True)) == pytest.approx(
        {"globex": 1.20, "initech": 0.30, "(idle)": 5.70, "(unattributed)": 0.0})
    shown = texts(at)
    assert RECONCILIATION[1] in shown and "chat: tenants" not in shown
    budgets = _budget_table(at)
    assert budgets is not None
    assert list(budgets["budget"]) == ["acme"]  # globex's budget is chat's


def test_budgets_this_month(with_budgets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(with_budgets, monkeypatch, "business", **WINDOW)
    budgets = _budget_table(at)
    assert budgets is not None
    rows = budgets.set_index("budget")
    assert set(rows.index) == {"acme", "globex/chat"}
    assert rows.loc["acme", "amount (USD)"] == 1.0
    assert rows.loc["acme", "spent (USD)"] == pytest.approx(0.45)
    assert rows.loc["acme", "spent share"] == pytest.approx(0.45)
    # All of the month's spend is inside the trailing week: the rate is 0.45 USD per 7 days;
    # from T0 + 4 h to 1 December is 20 days 20 hours (500 h).
    assert rows.loc["acme", "forecast (USD)"] == pytest.approx(0.45 * (1 + 500 / 168))
    runs_out = cb.T0 + cb.SPAN_S + (1.0 - 0.45) / (0.45 / (7 * 86400))
    assert rows.loc["acme", "runs out (UTC)"] == datetime.fromtimestamp(
        runs_out, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    # globex on chat: r2 and r9.
    assert rows.loc["globex/chat", "spent (USD)"] == pytest.approx(0.15 + 0.60)
    assert rows.loc["globex/chat", "pool"] == "chat"
    assert _absent(rows.loc["globex/chat", "runs out (UTC)"])  # its forecast stays under 50
    assert "Budgets this month" in texts(at) and "2026-11" in texts(at)


def test_without_budgets_the_page_says_how_to_set_one(without_budgets: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(without_budgets, monkeypatch, "business", **WINDOW)
    assert _budget_table(at) is None
    assert "No `[[budgets]]` in the config" in texts(at)
    table = _tenant_table(at)
    assert table is not None  # the chargeback itself does not need budgets
    assert dict(zip(table["tenant"], table[COST], strict=True))["acme"] == pytest.approx(0.45)


def test_an_empty_range_shows_no_figures(with_budgets: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page(with_budgets, monkeypatch, "business", **EMPTY)
    shown = texts(at)
    assert _tenant_table(at) is None
    assert _bars(at) is None
    assert "No cost in this range" in shown
    assert "pool cost" not in shown and "in all" not in shown
    # The month so far (1 to 9 November) holds nothing either: amounts, but no spend.
    budgets = _budget_table(at)
    assert budgets is not None
    assert list(budgets["amount (USD)"]) == [1.0, 50.0]
    for column in ("spent (USD)", "spent share", "forecast (USD)", "runs out (UTC)"):
        assert all(_absent(v) for v in budgets[column]), column
    assert "nothing measured to spend" in shown


# --- the section's figures, without Streamlit ---------------------------------------------------
def _row(tenant: str, cost: float, **more: Any) -> dict[str, Any]:
    return {"pool": "", "model": "", "tenant": tenant, "tier": "", "cost": cost,
            "gpu_hours": 1.0, "requests": 0, "per_1000_requests": None,
            "per_million_output_tokens": None, "slo_met_share": None,
            "per_slo_met_request": None, **more}


def test_the_currency_names_every_money_column() -> None:
    tc = cost_data.TenantCost(currency="EUR", by=("tenant",), start_s=0.0, end_s=1.0,
                              idle_policy="platform", records=True,
                              rows=[_row("acme", 2.0, requests=4, per_1000_requests=500.0)])
    (row,) = cost_data.table_rows(tc)
    assert {"cost (EUR)", "per 1000 requests (EUR)", "per 1M output tokens (EUR)",
            "per SLO-met request (EUR)"} <= set(row)
    assert row["per 1000 requests (EUR)"] == 500.0
    assert row["per 1M output tokens (EUR)"] is None  # no output token: absent, not 0


def test_the_bars_keep_the_costliest_tenants_and_sum_the_rest() -> None:
    rows = [_row(f"t{i:02d}", float(i)) for i in range(1, 21)]
    rows += [_row("(idle)", 100.0), _row("(unattributed)", 0.5)]
    tc = cost_data.TenantCost(currency="USD", by=("tenant",), start_s=0.0, end_s=1.0,
                              idle_policy="platform", records=True, rows=rows)
    bars = cost_data.bar_rows(tc, limit=3)
    assert [b["tenant"] for b in bars] == ["t20", "t19", "t18", cost_data.OTHER_TENANTS,
                                           "(unattributed)", "(idle)"]
    assert bars[3]["cost"] == sum(range(1, 18))
    assert [b["kind"] for b in bars[-2:]] == [cost_data.KIND_UNATTRIBUTED, cost_data.KIND_IDLE]
