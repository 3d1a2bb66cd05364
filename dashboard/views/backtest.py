"""Backtest: how the SLO's generated burn-rate alerts would have behaved over the range — the
burn rate over the alert table's windows with every alert and missed burn shaded, the alerts
and the missed burns as tables, the attainment per day of a latency SLO and, for the
objectives and thresholds typed in, the what-if table (`vigil slo backtest` of one SLO).

The figures come from ``dashboard.backtest_data`` (``slo.backtest.run.backtest``,
``slo.backtest.attainment``, ``slo.backtest.whatif``); this page lays them out."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import backtest_data, charts, data, layout
from dashboard import format as fmt
from dashboard.backtest_data import (
    SloPage,
    alert_rows,
    attainment_rows,
    backtest_range,
    chart_rules,
    evaluation_interval,
    filter_specs,
    instants,
    missed_rows,
    parse_objectives,
    parse_thresholds,
    scale_in_rows,
    scale_out_rows,
    scaling_card,
    slo_page,
    span_rows,
    spans_frame,
    timeline,
    trigger_rows,
    what_if_rows,
    what_if_table,
)
from slo.backtest.run import DEFAULT_MISSED_SHARE, DEFAULT_QUIET_SHARE
from slo.objectives.spec import SloSpec, effective_slos
from slo.sources.protocol import RangeSource
from vigil.conventions import SEVERITY_PAGE, SEVERITY_TICKET
from vigil.durations import format_duration

ctx = data.context()

#: A backtest is cached this long (seconds) at most: a pinned range cannot change, a live one
#: moves in steps (``backtest_data.backtest_range``) and asks for a new entry at each.
BACKTEST_TTL_S = 300.0
#: The timeline spans the page: taller than the half-width charts, so that its factors'
#: labels (four with the default table) stay apart.
TIMELINE_HEIGHT = 320



def _range_source(key: tuple[str, int]) -> RangeSource:
    source = data.env(key).source
    # body() has checked it: only a RangeSource reaches the cached functions.
    assert isinstance(source, RangeSource)
    return source


@st.cache_data(ttl=BACKTEST_TTL_S, max_entries=32, show_spinner=False)
def _page(key: tuple[str, int], slo: str, start_s: float, end_s: float, interval_s: float
          ) -> SloPage:
    e = data.env(key)
    return slo_page(e.config, _range_source(key), e.spec(slo), start_s, end_s, interval_s,
                    request_log=e.log)


@st.cache_data(ttl=BACKTEST_TTL_S, max_entries=32, show_spinner=False)
def _what_if(key: tuple[str, int], profiles_mtime_ns: int, slo: str, start_s: float,
             end_s: float, interval_s: float, objectives: tuple[float, ...],
             thresholds: tuple[float, ...]) -> list[dict[str, object]]:
    e = data.env(key)
    return what_if_table(e.config, _range_source(key), e.spec(slo), start_s, end_s,
                         interval_s, objectives=objectives, thresholds=thresholds,
                         request_log=e.log)


@st.cache_data(ttl=BACKTEST_TTL_S, max_entries=16, show_spinner=False)
def _scaling(key: tuple[str, int], pool: str, start_s: float, end_s: float,
             interval_s: float) -> dict[str, Any]:
    e = data.env(key)
    return scaling_card(e.config, _range_source(key), pool, start_s, end_s, interval_s,
                        request_log=e.log)


def _describe(spec: SloSpec) -> str:
    threshold = (f" ≤ {fmt.seconds(spec.threshold_seconds)}"
                 if spec.threshold_seconds is not None else "")
    endpoint = "" if spec.endpoint == "all" else f", endpoint {spec.endpoint}"
    return (f"pool `{spec.pool}` · {spec.indicator}{threshold} for "
            f"{spec.objective * 100:g}% over {format_duration(spec.period_s)}{endpoint}")


def _summary(page: SloPage) -> None:
    cols = st.columns(5)
    per = page.per_30_days
    for col, severity, label in ((cols[0], SEVERITY_PAGE, "Pages"),
                                 (cols[1], SEVERITY_TICKET, "Tickets")):
        rate = per.get(severity)
        col.metric(label, fmt.count(page.count(severity)),
                   help=None if rate is None else f"{rate:.1f} per 30 days at this rate.")
    cols[2].metric("Missed burns", fmt.count(len(page.missed)),
                   help="Stretches in which the shortest window burned faster than 1 while no "
                        f"alert fired, that consumed at least {DEFAULT_MISSED_SHARE:.0%} of "
                        "the budget.")
    seen_s = min(page.spec.period_s, page.end_s - page.start_s)
    short = seen_s < page.spec.period_s
    cols[3].metric("Budget left at the end", fmt.percent(page.budget_remaining),
                   delta=(f"over {format_duration(seen_s)} of its "
                          f"{format_duration(page.spec.period_s)} period" if short else None),
                   delta_color="off",
                   help="1 − error ratio over the period ending at the end of the range ÷ "
                        "(1 − objective), as `vigil slo status` reports it. With less history "
                        "than the period, the ratio is that of the history alone: a few bad "
                        "minutes weigh as if they were the whole period.")
    cols[4].metric("Median detection delay", fmt.duration(page.median_delay_s),
                   help="From the onset of the burn (its shortest window above the factor of "
                        "the row that fired) to the alert's first firing evaluation.")


def _timeline(page: SloPage) -> None:
    df = charts.long_frame(list(page.lines))
    spans = spans_frame(span_rows(page.alerts, page.missed, page.end_s))
    windows = ", ".join(format_duration(w) for w in page.windows)
    st.markdown(f"**Burn rate over {windows}** (× the rate that spends exactly the "
                f"{format_duration(page.spec.period_s)} budget), alerts and missed burns "
                "shaded, the alert table's factors dashed")
    layout.chart(timeline(df, spans, chart_rules(page.rows), height=TIMELINE_HEIGHT), df,
                 f"No request of {page.name} in this range: no burn rate, so nothing fired.")
    if page.instants > backtest_data.MAX_CHART_POINTS:
        st.caption(f":material/info: {page.instants:,} evaluations drawn as at most "
                   f"{backtest_data.MAX_CHART_POINTS:,} points per line: each point is the "
                   "highest burn rate of its stretch, so a short burn is not averaged away.")


def _tables(page: SloPage) -> None:
    # One above the other: the alerts table has eight columns.
    st.markdown("**Alerts** (`ErrorBudgetBurn` as the generated rules would have fired)")
    if page.alerts:
        with st.container(key="backtest-alerts"):
            st.dataframe(pd.DataFrame(alert_rows(page.alerts)), hide_index=True)
        st.caption("End: the first evaluation after the alert, when Prometheus resolves it "
                   "(firing: still at the end of the range). Peak burn over the severity's "
                   "shortest window; budget consumed as a share of the period's budget; "
                   f"quiet: less than {DEFAULT_QUIET_SHARE:.1%} of it burned.")
    else:
        st.caption(":material/info: No alert fired over the range.")
    st.markdown("**Missed burns** (the shortest window burned faster than 1, no alert fired)")
    if page.missed:
        with st.container(key="backtest-missed"):
            st.dataframe(pd.DataFrame(missed_rows(page.missed)), hide_index=True)
    else:
        st.caption(":material/info: No burn that consumed at least "
                   f"{DEFAULT_MISSED_SHARE:.0%} of the budget went unalerted.")


def _attainment(page: SloPage) -> None:
    if not page.spec.is_latency:
        return
    st.subheader("Attainment", anchor=False)
    rows = attainment_rows(page.attainment, page.spec)
    if not rows:
        st.caption(":material/info: No threshold to rate.")
        return
    st.markdown(f"**Share of requests within each threshold** (objective "
                f"{page.spec.objective * 100:g}%; vLLM's bucket bounds from a quarter to four "
                "times the configured threshold)")
    with st.container(key="backtest-attainment"):
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    if not any(r["per_day"] for r in page.attainment):
        st.caption(":material/info: The range holds no whole UTC day: pick a range of a day "
                   "or more for the attainment per day.")


def _what_if_section(page: SloPage) -> None:
    st.subheader("What if", anchor=False)
    spec = page.spec
    left, right = st.columns(2)
    objectives_text = left.text_input(
        "Other objectives", key="backtest-objectives", placeholder="0.95, 99.9%",
        help="Ratios or percentages, separated by commas: the same range backtested at each.")
    thresholds_text = right.text_input(
        "Other thresholds", key="backtest-thresholds", placeholder="0.5, 2.5s",
        help="Seconds or durations (500ms), separated by commas; latency SLOs only.")
    errors = []
    try:
        objectives = parse_objectives(objectives_text)
    except ValueError as exc:
        errors.append(f"Objectives: {exc}")
    try:
        thresholds = parse_thresholds(thresholds_text)
    except ValueError as exc:
        errors.append(f"Thresholds: {exc}")
    for message in errors:
        st.error(message, icon=":material/error:")
    if errors:
        return
    if thresholds and not spec.is_latency:
        st.caption(f":material/info: {spec.name} is not a latency SLO: the thresholds are "
                   "left out.")
    if not objectives and not (thresholds and spec.is_latency):
        st.caption("Type other objectives or thresholds to compare them with the configured "
                   "SLO over the same range.")
        return
    with st.spinner("Backtesting each variant and pricing it…"):
        rows = _what_if(ctx.key, data.file_mtime_ns(str(ctx.config.capacity_profiles_path())),
                        spec.name, page.start_s, page.end_s, page.interval_s,
                        tuple(objectives), tuple(thresholds))
    with st.container(key="backtest-whatif"):
        st.dataframe(pd.DataFrame(what_if_rows(rows)), hide_index=True)
    st.caption("Each row is the same backtest under its objective and threshold. Cost: the "
               "cheapest configuration the planner finds for the pool's traffic (forecast "
               "from the range) that meets the variant and the pool's other latency SLOs, as "
               "`vigil plan` sizes it.")


def _scaling_section(page: SloPage) -> None:
    pool = page.spec.pool
    st.subheader(f"Scaling advice: pool {pool}", anchor=False)
    if not st.toggle("Score the scaling advice", key="backtest-scaling",
                     help="Every scale-out and scale-in the policy advised over the range (vigil "
                          "serve's kept decisions, else the policy replayed every scrape "
                          "interval), judged by what the pool's SLOs then did."):
        st.caption("Off: switch on to replay the scaling policy over the range and score "
                   "its triggers.")
        return
    with st.spinner(f"Replaying the scaling policy of pool {pool} over the range…"):
        card = _scaling(ctx.key, pool, page.start_s, page.end_s, page.interval_s)
    how = {"replay": "the policy replayed", "kept": "vigil serve's kept decisions",
           "kept+replay": "vigil serve's kept decisions, the rest replayed"}[
        card["decisions"]]
    st.caption(f"{how}, every {fmt.duration(card['interval_seconds'])} "
               f"({card['evaluations']:,} decisions) · burns judged by the pool's SLOs: "
               f"{', '.join(card['slos']) or 'none'}")
    outs = card["scale_outs"]
    ins = card["scale_ins"]
    judged = [s for s in ins if s["too_late"] is not None]
    with st.container(key="backtest-scaling-metrics"):
        cols = st.columns(4)
        cols[0].metric("Scale-outs", fmt.count(len(outs)))
        cols[1].metric("Stopped a burn", fmt.count(
            sum(1 for o in outs if o["outcome"] == "burn stopped")),
            help="Burning at the decision, calm within spin-up + cooldown.")
        cols[2].metric("Scale-ins too late",
                       fmt.count(sum(1 for s in judged if s["too_late"])) if judged else "–",
                       help="Later than the capacity lower bound allowed plus the scale-in "
                            "hold (needs a capacity profile).")
        cols[3].metric("Burns", fmt.count(len(card["burns"])))
    st.markdown("**Triggers**: which warned ahead of a burn (within spin-up + cooldown), "
                "which fired once the pool was burning, which were noise")
    with st.container(key="backtest-triggers"):
        st.dataframe(pd.DataFrame(trigger_rows(card)), hide_index=True)
    if outs:
        with st.container(key="backtest-scale-outs"):
            st.dataframe(pd.DataFrame(scale_out_rows(card)), hide_index=True)
    if ins:
        with st.container(key="backtest-scale-ins"):
            st.dataframe(pd.DataFrame(scale_in_rows(card)), hide_index=True)
    for note in card["notes"]:
        st.caption(f":material/info: {note}")


def body() -> None:
    at_s = data.now(ctx)
    st.title("Backtest")
    with data.empty_states(ctx):
        pools = layout.pools(ctx)
        if not ctx.config.pools:
            st.info(f"**No pools are configured.** Add a `[[pools]]` entry to `{ctx.path}`.",
                    icon=":material/settings:")
            return
        specs = filter_specs(effective_slos(ctx.config), pools=[p.name for p in pools],
                             models=ctx.view.models, endpoint=ctx.view.endpoint)
        if not specs:
            st.info("No SLO matches the filters.")
            return
        names = [s.name for s in specs]
        name = st.selectbox("SLO", names, key="backtest-slo",
                            help="The SLO whose alerts are replayed over the range.")
        spec = specs[names.index(name)]
        rules_interval = float(ctx.config.rules.interval)
        start, end = ctx.view.window(at_s)
        interval = evaluation_interval(rules_interval, end - start)
        start, end = backtest_range(start, end, interval, live=ctx.view.live)
        n = instants(start, end, interval)
        layout.header(ctx, None, at_s, f"{_describe(spec)} · alerts evaluated every "
                                       f"{fmt.duration(interval)}")
        if interval != rules_interval:
            st.caption(f":material/info: Evaluated every {fmt.duration(interval)}, not the "
                       f"rules' {fmt.duration(rules_interval)}: the range would hold more "
                       f"than {backtest_data.MAX_INSTANTS:,} evaluations. An alert's start "
                       "may then be up to one interval late.")
        if n == 0:
            st.info("The range holds no evaluation instant: pick a longer range.")
            return
        if not isinstance(data.env(ctx.key).source, RangeSource):
            st.error("The source cannot answer range queries: the backtest needs the embedded "
                     "store or a Prometheus API.", icon=":material/error:")
            return
        if n > backtest_data.AUTO_MAX_INSTANTS and not st.toggle(
                "Backtest this range", key="backtest-run",
                help="Replays the alerts at every evaluation of the range: seconds for a "
                     "month."):
            st.caption(f"Off: the range holds {n:,} evaluations (more than "
                       f"{backtest_data.AUTO_MAX_INSTANTS:,}); switch on to replay them.")
            return
        with st.spinner(f"Replaying {spec.name}'s alerts over {n:,} evaluations…"):
            page = _page(ctx.key, spec.name, start, end, interval)
        st.caption(f"{fmt.timestamp(page.start_s)} → {fmt.timestamp(page.end_s)}: "
                   f"{page.instants:,} evaluations from the {page.source} source.")
        _summary(page)
        _timeline(page)
        _tables(page)
        _attainment(page)
        _what_if_section(page)
        _scaling_section(page)


layout.live_fragment(ctx, body)
