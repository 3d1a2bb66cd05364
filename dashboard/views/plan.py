"""Plan: today's configuration beside the cheapest one that meets the SLOs for a day of the
pool's traffic (replicas, cost per 1000 requests, cost per month, headroom, each with how it
is known), both replicas-over-the-day curves, the waste over the range (GPU-hours used against
the lower bound the traffic needed) and, on demand, a replay of the scaling policy.

The figures come from ``dashboard.plan_data`` (``slo.planning.plan``, ``slo.planning.forecast``,
``slo.cost.waste``, ``slo.planning.replay``); this page lays them out."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from dashboard import charts, data, layout
from dashboard import format as fmt
from dashboard.plan_data import (
    DEFAULT_DAYS,
    PlanPage,
    ReplaySummary,
    aligned_range,
    badge,
    curve_rows,
    plan_without_waste,
    replay_summary,
    waste_rows,
    with_waste,
)
from slo.planning.plan import CandidatePlan
from vigil.config import PoolConfig

ctx = data.context()

#: Plans are sized on whole plan steps: within one the answer cannot change, so the cache
#: holds it that long at most.
PLAN_TTL_S = 300.0


@st.cache_data(ttl=PLAN_TTL_S, max_entries=16, show_spinner=False)
def _plan(key: tuple[str, int], profiles_mtime_ns: int, pool: str, at_s: float, days: int
          ) -> PlanPage:
    """The plan without the waste: a week of history read, the same at every range."""
    e = data.env(key)
    return plan_without_waste(e.config, key[0], e.source, e.config.pool(pool), at_s,
                              days=days)


@st.cache_data(ttl=PLAN_TTL_S, max_entries=64, show_spinner=False)
def _page(key: tuple[str, int], profiles_mtime_ns: int, pool: str, at_s: float, days: int,
          start_s: float, end_s: float) -> PlanPage:
    """The plan with the waste over the range: another range reads only its waste."""
    e = data.env(key)
    return with_waste(_plan(key, profiles_mtime_ns, pool, at_s, days), e.config, e.source,
                      e.config.pool(pool), (start_s, end_s))


@st.cache_data(ttl=PLAN_TTL_S, max_entries=16, show_spinner=False)
def _replay(key: tuple[str, int], pool: str, start_s: float, end_s: float
            ) -> ReplaySummary | None:
    e = data.env(key)
    return replay_summary(e.source, e.config, e.config.pool(pool), start_s, end_s)


def _metric_with_basis(label: str, value: str, basis: str, *, delta: str | None = None,
                       delta_color: str = "normal", help: str | None = None) -> None:
    st.metric(label, value, delta=delta, delta_color=delta_color, help=help)  # type: ignore[arg-type]
    st.markdown(badge(basis))


def _delta(value: float | None, ref: float | None, text: str, *, digits: int = 0
           ) -> str | None:
    if value is None or ref is None or abs(value - ref) < 0.5 * 10 ** -digits:
        return None
    return f"{value - ref:+,.{digits}f}{text}"


def _candidate(c: CandidatePlan, ref: CandidatePlan | None) -> None:
    """The four figures of one plan, each with its basis; ``ref`` (today) gives the deltas."""
    left, right = st.columns(2, gap="small")
    with left:
        _metric_with_basis(
            "Replicas (peak of the day)", fmt.count(c.peak_replicas), c.basis,
            delta=_delta(c.peak_replicas, ref and ref.peak_replicas, " vs today"),
            delta_color="inverse",
            help=f"ceil(forecast requests/s / {c.rps_per_replica:.3g} requests/s per "
                 "replica) at the busiest step, at least min_replicas.")
        _metric_with_basis(
            "Cost per month", fmt.usd(c.cost_per_month_usd), c.basis,
            delta=_delta(c.cost_per_month_usd, ref and ref.cost_per_month_usd, " USD vs today"),
            delta_color="inverse",
            help=f"{c.gpu_hours_per_day:,.1f} GPU-hours a day × "
                 f"{fmt.usd(c.usd_per_gpu_hour)} per GPU-hour × [capacity] hours_per_month / "
                 "24.")
    with right:
        _metric_with_basis(
            "Cost per 1000 requests", fmt.usd(c.cost_per_1000_requests), c.basis,
            delta=_delta(c.cost_per_1000_requests, ref and ref.cost_per_1000_requests,
                         " USD vs today", digits=3),
            delta_color="inverse",
            help=f"The day's cost over its {fmt.count(c.requests_per_day)} forecast requests.")
        _metric_with_basis(
            "Headroom", fmt.percent(c.headroom, 0), c.basis,
            help="The least spare share of the capacity over the day: 1 − requests/s / "
                 "(replicas × requests/s per replica) at the tightest step.")
    state = ":green-badge[meets the SLOs]" if c.meets_slo else ":red-badge[misses the SLOs]"
    st.markdown(f"{state} · {c.profile.basis} profile from `{c.profile.source or 'unknown'}`"
                f" · {c.rps_per_replica:.3g} requests/s per replica")
    for note in c.notes:
        st.caption(f":material/info: {note}")


def _comparison(page: PlanPage, pool: PoolConfig) -> None:
    today, best = page.today, page.best
    left, right = st.columns(2, gap="large")
    with left, st.container(border=True, key="plan-today"):
        st.markdown("**Today**")
        measure = (f"`vigil capacity --config {ctx.path} --pool {pool.name} --url <a "
                   "replica's URL> --save`")
        if today is None:
            st.info(f"No capacity profile of today's configuration ({pool.model} on "
                    f"{pool.gpus_per_replica} × {pool.gpu}): none saved, observed or "
                    f"estimated. Run {measure} against one of its replicas to compare it.",
                    icon=":material/speed:")
        else:
            st.caption(today.profile.identity.label())
            if today.profile.basis != "measured":
                st.caption(f":material/speed: Today's capacity is {today.profile.basis}, not "
                           f"measured: run {measure} against one of its replicas.")
            _candidate(today, None)
    with right, st.container(border=True, key="plan-best"):
        st.markdown("**Cheapest that meets the SLOs**")
        if best is None:
            st.warning("No candidate meets the pool's SLOs at this traffic: see each "
                       "candidate's notes below.", icon=":material/warning:")
        else:
            same = today is not None and best.profile == today.profile
            st.caption(best.profile.identity.label()
                       + (" (today's configuration)" if same else ""))
            _candidate(best, today)


def _curves(page: PlanPage) -> None:
    today, best = page.today, page.best
    named = []
    if today is not None:
        named.append((f"today: {today.profile.identity.label()}", today))
    if best is not None and (today is None or best.profile != today.profile):
        named.append((f"cheapest: {best.profile.identity.label()}", best))
    left, right = st.columns(2, gap="medium")
    with left:
        df = charts.long_frame(curve_rows(named))
        st.markdown("**Replicas over the day** (UTC, one point per `[capacity] plan_step`)")
        layout.chart(charts.lines(df, y_title="replicas", y_format=",.0f"), df,
                     "No plan to draw: no profile of today's configuration and none that "
                     "meets the SLOs.")
    with right:
        traffic = page.traffic
        rows = [] if traffic is None else [
            (t, "forecast", v) for t, v in traffic.day_curve(ctx.config.capacity.plan_step)]
        df = charts.long_frame(rows)
        basis = "" if traffic is None else f" {badge(traffic.basis)}"
        st.markdown(f"**Traffic the plan is sized for** (requests/s){basis}")
        layout.chart(charts.lines(df, y_title="requests/s", y_format=",.2f"), df,
                     page.traffic_note or "No forecast.")
        if traffic is not None:
            st.caption(" · ".join(traffic.notes))


def _candidates(page: PlanPage) -> None:
    result = page.result
    if result is None or not result.candidates:
        return
    rows = [{
        "configuration": c.profile.identity.label(), "basis": c.basis,
        "meets SLOs": c.meets_slo, "peak replicas": c.peak_replicas,
        "requests/s per replica": c.rps_per_replica, "GPU-hours / day": c.gpu_hours_per_day,
        "per 1000 requests": c.cost_per_1000_requests, "per month": c.cost_per_month_usd,
        "headroom": c.headroom, "notes": "; ".join(c.notes),
    } for c in result.candidates]
    st.markdown("**Every candidate** (those meeting the SLOs first, cheapest first)")
    money = st.column_config.NumberColumn(format="$%.3f")
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="plan-candidates", column_config={
        "per 1000 requests": money,
        "per month": st.column_config.NumberColumn(format="$%.0f"),
        "GPU-hours / day": st.column_config.NumberColumn(format="%.1f"),
        "requests/s per replica": st.column_config.NumberColumn(format="%.3g"),
        "headroom": st.column_config.NumberColumn(format="percent"),
    })
    for note in result.notes:
        st.caption(f":material/info: Left out: {note}")


def _waste(page: PlanPage) -> None:
    st.subheader("Waste over the range", anchor=False)
    result = page.waste
    if result is None:
        st.caption(f":material/info: {page.waste_note}")
        return
    df = charts.long_frame(waste_rows(result))
    step = fmt.duration(ctx.config.capacity.plan_step)
    basis = badge(page.today.profile.basis) if page.today is not None else ""
    st.markdown(f"**GPU-hours per {step}: used, and the lower bound the traffic needed** "
                f"(ceil(requests/s ÷ today's capacity) replicas) {basis}")
    layout.chart(charts.lines(df, y_title="GPU-hours", y_format=",.2f"), df,
                 "No whole step of the range has samples.")
    cols = st.columns(4)
    cols[0].metric("Used", f"{result.used_gpu_hours:,.1f} GPU-h")
    cols[1].metric("Lower bound", f"{result.lower_bound_gpu_hours:,.1f} GPU-h")
    cols[2].metric("Waste", f"{result.waste_gpu_hours:,.1f} GPU-h",
                   help="Used minus the lower bound, over the steps whose traffic was read.")
    cols[3].metric("Waste (USD)", fmt.usd(result.waste_usd),
                   help=f"At {fmt.usd(result.usd_per_gpu_hour)} per GPU-hour.")
    if result.waste_gpu_hours < 0:
        # Negative waste is not a saving: the traffic needed more than the pool ran.
        st.warning(f"The pool ran {-result.waste_gpu_hours:,.1f} GPU-hours below the lower "
                   "bound: fewer replicas than the traffic needed at today's capacity (its "
                   "SLOs suffered, or the profile is pessimistic).", icon=":material/warning:")
    if result.unmeasured_gpu_hours > 0:
        st.caption(f":material/info: {result.unmeasured_gpu_hours:,.1f} GPU-hours of steps "
                   "without a request counter are left out of the waste.")


def _replay_section(pool: PoolConfig, start_s: float, end_s: float) -> None:
    st.subheader("The scaling policy over the range", anchor=False)
    if not st.toggle("Replay it", key="plan-replay",
                     help="Evaluates the scaling recommendation at each step of the range, "
                          "as `vigil serve` does: about a hundred queries per step."):
        st.caption("Off: switch on to replay the recommendations over the range.")
        return
    summary = _replay(ctx.key, pool.name, start_s, end_s)
    if summary is None:
        st.caption(":material/info: The replay needs `slo.planning.replay`, which is not "
                   "installed.")
        return
    counts = summary.counts
    cols = st.columns(3)
    cols[0].metric("Scale-outs advised", fmt.count(counts["scale_out"]))
    cols[1].metric("Scale-ins advised", fmt.count(counts["scale_in"]))
    cols[2].metric("Holds", fmt.count(counts["hold"]))
    rows = [(t, series, float(n)) for t, cur, des, _ in summary.points
            for series, n in (("current", cur), ("desired", des))]
    df = charts.long_frame(rows)
    st.markdown(f"**Replicas: current and desired** (every {fmt.duration(summary.step_s)})")
    layout.chart(charts.lines(df, y_title="replicas", y_format=",.0f"), df,
                 "The range holds no whole step to replay.")


def body() -> None:
    at_s = data.now(ctx)
    st.title("Plan")
    with data.empty_states(ctx):
        pools = layout.pools(ctx)
        if not pools:
            st.info(f"**No pools are configured.** Add a `[[pools]]` entry to `{ctx.path}`.",
                    icon=":material/settings:")
            return
        names = [p.name for p in pools]
        left, right = st.columns([2, 1])
        name = left.selectbox("Pool", names, key="plan-pool") if len(names) > 1 else names[0]
        days = int(right.number_input("Days of history", min_value=1, max_value=90, step=1,
                                      value=DEFAULT_DAYS, key="plan-days"))
        pool = next(p for p in pools if p.name == name)
        step = float(ctx.config.capacity.plan_step)
        # The last whole plan step: the forecast and the waste move one step at a time.
        at = math.floor(at_s / step) * step
        start, end = aligned_range(*ctx.view.window(at_s), step)
        layout.header(ctx, None, at_s, f"pool {pool.name} · forecast from the {days} day(s) "
                                       f"before {fmt.timestamp(at)}")
        profiles = data.file_mtime_ns(str(ctx.config.capacity_profiles_path()))
        page = _page(ctx.key, profiles, pool.name, at, days, start, end)
        if page.profiles_note:
            st.info(page.profiles_note, icon=":material/speed:")
        if page.traffic_note:
            st.info(page.traffic_note, icon=":material/hourglass_empty:")
        if page.plan_note:
            st.warning(page.plan_note, icon=":material/warning:")
        if page.result is not None:
            _comparison(page, pool)
            _curves(page)
            _candidates(page)
        _waste(page)
        _replay_section(pool, start, end)


layout.live_fragment(ctx, body)
