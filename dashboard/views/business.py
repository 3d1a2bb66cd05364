"""Business: GPU cost per 1000 requests and per 1M output tokens over time by pool (and tier
with gateway data), generated tokens per request, idle GPU cost, semantic-cache savings, the
cost by tenant over the range (the chargeback, with each pool's reconciliation and this
month's budgets), and a what-if panel (price per GPU-hour and replicas in, cost per 1000
requests out)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, cost_data, data, layout, whatif
from dashboard import empty_states as empty
from dashboard import format as fmt
from dashboard.timeseries import chart_step, chart_times
from slo.cost.budgets import BudgetStatus, BudgetTracker
from slo.cost.months import month_of
from vigil.clock import system_clock
from vigil.config import PoolConfig
from vigil.conventions import VLLM_GENERATION_TOKENS_HIST
from vigil.durations import format_duration

ctx = data.context()


def _label(pool: PoolConfig) -> str:
    return f"{pool.name} ({pool.model.rsplit('/', 1)[-1]})"


def _cost_over_time(pools: list[PoolConfig], times: list[float], window_s: float) -> None:
    per_1000, per_m, idle = [], [], []
    costs = []
    for pool in pools:
        for t, cost in data.series(ctx, "cost", times, pool.name, window_s):
            costs.append(cost)
            per_1000.append((t, _label(pool), cost["per_1000_requests"]))
            per_m.append((t, _label(pool), cost["per_million_output_tokens"]))
            idle.append((t, _label(pool), cost["idle_cost_usd"]))
    left, right = st.columns(2, gap="medium")
    with left:
        df = charts.long_frame(per_1000)
        st.markdown(f"**GPU cost per 1000 requests** (over {format_duration(window_s)})")
        layout.chart(charts.lines(df, y_title="USD", y_format="$.2f"), df,
                     empty.cost_gap(costs, "per_1000_requests"))
    with right:
        df = charts.long_frame(per_m)
        st.markdown(f"**GPU cost per 1M output tokens** (over {format_duration(window_s)})")
        layout.chart(charts.lines(df, y_title="USD", y_format="$.2f"), df,
                     empty.cost_gap(costs, "per_million_output_tokens"))
    left, right = st.columns(2, gap="medium")
    with left:
        df = charts.long_frame(idle)
        st.markdown(f"**Idle GPU cost** (up replicas running nothing, per "
                    f"{format_duration(window_s)})")
        layout.chart(charts.lines(df, y_title="USD", y_format="$.2f"), df,
                     empty.cost_gap(costs, "idle_cost_usd"))
    with right:
        rows = []
        for pool in pools:
            means = data.series(ctx, "mean", times, pool.name, window_s,
                                VLLM_GENERATION_TOKENS_HIST)
            p95s = data.series(ctx, "quantile", times, pool.name, window_s,
                               VLLM_GENERATION_TOKENS_HIST)
            for (t, mean), (_, q) in zip(means, p95s, strict=True):
                for model, v in mean.items():
                    rows.append((t, f"{pool.name} mean", v))
                    rows.append((t, f"{pool.name} p95", (q.get(model) or {}).get("p95")))
        df = charts.long_frame(rows)
        st.markdown(f"**Generated tokens per request** (mean and p95 over "
                    f"{format_duration(window_s)})")
        layout.chart(charts.lines(df, y_title="tokens", y_format=",.0f"), df,
                     empty.tokens_gap(costs))


def _tokens_now(status: Mapping[str, Any], pool: PoolConfig) -> dict[str, str]:
    """The pool's model's generated tokens per request now: the mean, and the p95 as exact as
    its source allows (a histogram p95 in a wide 1-2-5 bucket is shown as that bucket)."""
    model = (status["pools"][pool.name].get("models") or {}).get(pool.model) or {}
    gen = (model.get("tokens_per_request") or {}).get("generated")
    return {"generated tokens / request": fmt.tokens((gen or {}).get("mean")),
            "generated p95": fmt.quantile(gen, "p95", "tokens"),
            "tokens from": fmt.quantile_origin([gen])}


def _now_table(status: Mapping[str, Any], pools: list[PoolConfig]) -> None:
    rows = []
    for pool in pools:
        cost = status["pools"][pool.name]["cost"]
        rows.append({
            "pool": _label(pool), "GPU": f"{pool.gpus_per_replica} × {pool.gpu}",
            "USD per GPU-hour": cost["usd_per_gpu_hour"], "GPU-hours": cost["gpu_hours"],
            "cost": cost["cost_usd"], "requests": cost["requests"],
            "per 1000 requests": cost["per_1000_requests"],
            "per 1M output tokens": cost["per_million_output_tokens"],
            "idle share": cost["idle_share"], "idle cost": cost["idle_cost_usd"],
            **_tokens_now(status, pool),
        })
    window = status["pools"][pools[0].name]["cost"]["window"] if pools else ""
    st.markdown(f"**Now** (the last {window}, as `vigil slo status` reports it)")
    money = st.column_config.NumberColumn(format="$%.3f")
    missing = [f"`{pool.name}`: {why}" for pool in pools
               if (why := empty.missing_cost(status["pools"][pool.name]["cost"]))]
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="cost-now", column_config={
        "USD per GPU-hour": st.column_config.NumberColumn(format="$%.2f"),
        "GPU-hours": st.column_config.NumberColumn(format="%.2f"),
        "cost": money, "per 1000 requests": money, "per 1M output tokens": money,
        "idle cost": money, "requests": st.column_config.NumberColumn(format="%.0f"),
        "idle share": st.column_config.NumberColumn(format="percent"),
    })
    for line in missing:
        st.caption(f":material/info: No cost for {line}.")


def _gateway(pools: list[PoolConfig], times: list[float], window_s: float, at_s: float
             ) -> None:
    st.subheader("By tier, and the semantic cache", anchor=False)
    start, end = ctx.view.window(at_s)
    totals: dict[str, dict[str, float]] = {}
    savings = {"saved_usd": 0.0, "hits": 0.0, "requests": 0.0}
    any_log = False
    blocks = []
    for pool in pools:
        tiers = data.point(ctx, "tier", end, pool.name, end - start)
        saved = data.point(ctx, "savings", end, pool.name, end - start)
        if tiers is None:
            continue
        any_log = True
        blocks.append(tiers)
        for tier, v in tiers.items():
            if v["cost_usd"] is None:
                continue  # no GPU time known (no `up`): no cost, rather than $0
            acc = totals.setdefault(tier, {"requests": 0.0, "cost_usd": 0.0})
            acc["requests"] += v["requests"] or 0.0
            acc["cost_usd"] += v["cost_usd"]
        for k in savings:
            savings[k] += saved[k]
    if not any_log:
        st.info("**No gateway data.** Cost per tier (premium / standard / batch) and cache "
                "savings come from the gateway's per-request records: run `vigil gateway "
                f"--config {ctx.path}` in front of the pools (records go to "
                f"`{ctx.config.gateway_records_path()}`).", icon=":material/alt_route:")
        return
    left, right = st.columns([3, 2], gap="medium")
    with left:
        df = pd.DataFrame([{"tier": t, "per 1000 requests": v["cost_usd"] / v["requests"] * 1000}
                           for t, v in totals.items() if v["requests"]])
        st.markdown("**GPU cost per 1000 requests by tier** (each pool's cost, idle time "
                    "included, split by the GPU time of each tier's requests; per request a "
                    "replica finished: cancelled requests and cache hits are not counted)")
        layout.chart(charts.bars(df, x="tier", y="per 1000 requests", x_title="tier",
                                 y_title="USD", y_format="$.3f") if not df.empty else None, df,
                     empty.tier_gap(blocks))
    with right:
        st.metric("Saved by the semantic cache", fmt.usd(savings["saved_usd"]),
                  help="What the cache hits would have cost on a replica, over the range.")
        share = savings["hits"] / savings["requests"] if savings["requests"] else None
        st.caption(f"{fmt.count(savings['hits'])} hits of {fmt.count(savings['requests'])} "
                   f"requests ({fmt.percent(share)})")
    rows = []
    blocks = []
    for pool in pools:
        for t, tiers in data.series(ctx, "tier", times, pool.name, window_s):
            blocks.append(tiers)
            for tier, v in (tiers or {}).items():
                rows.append((t, f"{pool.name} {tier}", v["per_1000_requests"]))
    df = charts.long_frame(rows)
    st.markdown(f"**Per tier over time** (cost per 1000 requests over "
                f"{format_duration(window_s)})")
    layout.chart(charts.lines(df, y_title="USD", y_format="$.3f"), df,
                 empty.tier_gap(blocks))


# --- cost by tenant -----------------------------------------------------------------------------
def _settled(end_s: float) -> bool:
    """True when no sample can still arrive for ``end_s`` (as ``data.point`` decides)."""
    return end_s <= system_clock() - data.SETTLED_SCRAPES * ctx.config.collector.scrape_interval


def _tenant_cost(key: tuple[str, int], start_s: float, end_s: float, pools: tuple[str, ...],
                 by: tuple[str, ...]) -> cost_data.TenantCost:
    e = data.env(key)
    return cost_data.tenant_cost(e.source, e.config, e.log, start_s, end_s, pools, by)


# A settled range cannot change; a live one is read again after a few seconds, like a point.
_tenant_cost_settled = st.cache_data(ttl=data.SETTLED_TTL_S, max_entries=64,
                                     show_spinner=False)(_tenant_cost)
_tenant_cost_recent = st.cache_data(ttl=data.RECENT_TTL_S, max_entries=16,
                                    show_spinner=False)(_tenant_cost)


class _Tracker:
    """A ``BudgetTracker`` shared by the sessions of one config (it keeps the month's closed
    days, so a refresh recomputes only today), and the lock that serialises its use."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.tracker = BudgetTracker(data.env(key).config)
        self.lock = threading.Lock()


@st.cache_resource(show_spinner=False, max_entries=4)
def _tracker(path: str, mtime_ns: int) -> _Tracker:
    return _Tracker((path, mtime_ns))


def _budgets(key: tuple[str, int], at_s: float) -> tuple[list[BudgetStatus], bool]:
    """Every budget at ``at_s``, and whether its spend is measured: the month so far holds
    data (billed time or a request) and there are records to name the tenants. Without, the
    spend is absent, not 0."""
    e = data.env(key)
    t = _tracker(*key)
    with t.lock:
        statuses = t.tracker.evaluate(e.source, e.log, at_s)
        return statuses, e.log is not None and bool(t.tracker.month_lines)


_budgets_settled = st.cache_data(ttl=data.SETTLED_TTL_S, max_entries=64,
                                 show_spinner=False)(_budgets)
_budgets_recent = st.cache_data(ttl=data.RECENT_TTL_S, max_entries=16,
                                show_spinner=False)(_budgets)


def _tenant_table(tc: cost_data.TenantCost) -> None:
    cur = tc.currency
    st.markdown(f"**Chargeback of the range** ({fmt.timestamp(tc.start_s)} to "
                f"{fmt.timestamp(tc.end_s)}: {tc.total:,.2f} {cur} in all; each pool's GPU "
                "cost split over its tenants by the GPU time of their requests, idle time as "
                f"`[cost] idle = \"{tc.idle_policy}\"` says)")
    per = st.column_config.NumberColumn(format="%.3f")
    st.dataframe(pd.DataFrame(cost_data.table_rows(tc)), hide_index=True, key="tenant-cost",
                 column_config={
                     cost_data.money("cost", cur): st.column_config.NumberColumn(format="%.2f"),
                     "GPU-hours": st.column_config.NumberColumn(format="%.3f"),
                     "requests": st.column_config.NumberColumn(format="%d"),
                     cost_data.money("per 1000 requests", cur): per,
                     cost_data.money("per 1M output tokens", cur): per,
                     "SLO met": st.column_config.NumberColumn(format="percent"),
                     cost_data.money("per SLO-met request", cur): per,
                 })
    st.caption("`(idle)` is GPU time billed with nothing running (and unused reservations), "
               "`(unattributed)` traffic vLLM counted that no record knows. Requests are those "
               "a replica finished; SLO met: the share of served requests that met every SLO "
               "of their pool.")


def _tenant_bars(tc: cost_data.TenantCost) -> None:
    bars = cost_data.bar_rows(tc)
    df = pd.DataFrame(bars)
    st.markdown(f"**Cost per tenant** ({tc.currency}; idle grey, unattributed orange)")
    layout.chart(charts.bars(df, x="tenant", y="cost", x_title="tenant", y_title=tc.currency,
                             y_format=",.2f", color="color",
                             sort=[b["tenant"] for b in bars]), df,
                 "No cost in this range.")


def _reconciliation(tc: cost_data.TenantCost) -> None:
    st.markdown("**Reconciliation** (per pool, to the cent)")
    st.markdown("\n".join(f"- `{line}`" for line in tc.reconciliation))
    for pool in tc.unbalanced:
        st.warning(f"The lines of pool `{pool}` do not add up to its cost.",
                   icon=":material/warning:")


def _budget_section(at_s: float) -> None:
    config = ctx.config
    if not config.budgets:
        st.caption(":material/info: No `[[budgets]]` in the config: a tenant's monthly budget "
                   "(spent, share, forecast and the date it would run out) shows here once "
                   "one is set.")
        return
    fn = _budgets_settled if _settled(at_s) else _budgets_recent
    statuses, has_data = fn(ctx.key, at_s)
    month = statuses[0].month if statuses else month_of(at_s, config.cost.timezone)
    rows = cost_data.budget_rows(statuses, has_data=has_data, pools=ctx.view.pools)
    st.markdown(f"**Budgets this month** ({month} in `{config.cost.timezone}`, up to "
                f"{fmt.timestamp(at_s)}; a budget counts every pool unless it names one)")
    if not rows:
        st.caption(":material/info: No budget covers the pools shown.")
        return
    cur = config.cost.currency
    amount = st.column_config.NumberColumn(format="%.2f")
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="tenant-budgets", column_config={
        cost_data.money("amount", cur): amount, cost_data.money("spent", cur): amount,
        cost_data.money("forecast", cur): amount,
        "spent share": st.column_config.NumberColumn(format="percent"),
    })
    st.caption("Forecast: the spend at the month's end at the trailing rate (`[cost] "
               "forecast_window`); runs out: when that rate would spend the budget, if "
               "before the month ends.")
    if not has_data:
        st.caption(f":material/info: No billed GPU time and no recorded request in {month} "
                   "so far (or no gateway records to name the tenants): nothing measured to "
                   "spend.")
    for name in cost_data.over_budget(rows):
        st.warning(f"Budget `{name}` is spent.", icon=":material/warning:")


def _by_tenant(pools: list[PoolConfig], at_s: float) -> None:
    st.subheader("Cost by tenant", anchor=False)
    start, end = ctx.view.window(at_s)
    choice = st.selectbox("Group by", list(cost_data.GROUP_CHOICES), key="tenant-cost-by")
    by = cost_data.GROUP_CHOICES[choice or "tenant"]
    fn = _tenant_cost_settled if _settled(end) else _tenant_cost_recent
    tc = fn(ctx.key, start, end, tuple(p.name for p in pools), by)
    if not tc.rows:
        st.caption(f":material/info: No cost in this range: {empty.NO_UP}, and no request "
                   "was recorded.")
    else:
        _tenant_table(tc)
        left, right = st.columns([3, 2], gap="medium")
        with left:
            _tenant_bars(tc)
        with right:
            _reconciliation(tc)
    if not tc.records:
        st.caption(":material/info: No gateway data: tenants are known from the records of "
                   f"`vigil gateway` (`{ctx.config.gateway_records_path()}`) or `[otlp]`; "
                   "without them every GPU-hour is idle or unattributed.")
    for warning in tc.warnings:
        st.caption(f":material/warning: {warning}")
    _budget_section(at_s)


def _what_if(status: Mapping[str, Any], pools: list[PoolConfig]) -> None:
    st.subheader("What if", anchor=False)
    if not pools:
        return
    names = [p.name for p in pools]
    name = st.selectbox("Pool", names, key="whatif-pool") if len(names) > 1 else names[0]
    pool = next(p for p in pools if p.name == name)
    cost = status["pools"][name]["cost"]
    window_s = ctx.config.engine.cost_window
    observed = whatif.observed_replicas(cost, window_s, pool.gpus_per_replica)
    left, mid, right = st.columns(3, gap="medium")
    price = left.number_input("USD per GPU-hour", min_value=0.0, step=0.1,
                              value=float(cost["usd_per_gpu_hour"]), key=f"whatif-price-{name}")
    replicas = mid.number_input("Replicas", min_value=0, step=1,
                                value=max(0, round(observed or 0)), key=f"whatif-replicas-{name}")
    result = whatif.per_1000_requests(requests=cost["requests"], window_s=window_s,
                                      replicas=replicas, gpus_per_replica=pool.gpus_per_replica,
                                      usd_per_gpu_hour=price)
    now = cost["per_1000_requests"]
    # Half a tenth of a cent either way is "the same": no red or green arrow for rounding.
    delta = (None if result is None or now is None or abs(result - now) < 0.0005
             else f"{result - now:+.3f} USD vs now")
    right.metric("Cost per 1000 requests", fmt.usd(result), delta=delta, delta_color="inverse")
    st.caption(f"At the observed traffic: {fmt.count(cost['requests'])} requests in the last "
               f"{cost['window']}, served by {fmt.count(observed)} replica(s) on average "
               f"({pool.gpus_per_replica} × {pool.gpu} each). Fewer replicas only hold if they "
               "keep the SLOs: see the scaling recommendation on the Overview.")
    if observed is None:
        st.caption(":material/info: No observed replica count: "
                   f"{empty.no_up(one_pool=True, where='the cost window')}.")


def body() -> None:
    at_s = data.now(ctx)
    with data.empty_states(ctx):
        layout.header(ctx, "Business", at_s)
        status = data.status(ctx, at_s)
        pools = layout.pools(ctx)
        start, end = ctx.view.window(at_s)
        step = chart_step(end - start, min_step_s=ctx.config.collector.scrape_interval)
        times = chart_times(end, end - start, step)
        window = max(step, ctx.config.engine.cost_window)
        _now_table(status, pools)
        _cost_over_time(pools, times, window)
        _gateway(pools, times, window, at_s)
        _by_tenant(pools, at_s)
        _what_if(status, pools)


layout.live_fragment(ctx, body)
