"""Server: GPU SM utilisation (DCGM), KV-cache usage with the scale-out and KV-alert lines,
queue length and queue time, batch-size distribution, preemptions, prefix-cache hit rate and
speculative-decoding acceptance where it is on."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, layout
from dashboard import format as fmt
from dashboard.charts import PAGE_COLOR, TICKET_COLOR, Rule
from dashboard.empty_states import has_dcgm
from dashboard.timeseries import chart_step, chart_times
from vigil.config import PoolConfig
from vigil.conventions import (
    VLLM_ITERATION_TOKENS,
    VLLM_PREEMPTIONS,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
    VLLM_QUEUE_TIME,
    VLLM_SPEC_ACCEPTED_TOKENS,
    VLLM_SPEC_DRAFT_TOKENS,
)
from vigil.durations import format_duration

ctx = data.context()


def _gpu(pool: PoolConfig, times: list[float]) -> None:
    st.markdown("**GPU SM utilisation** (DCGM, per GPU)")
    # The dashboard reads a Prometheus exactly when [engine] prometheus_url is set.
    if not has_dcgm(ctx.config, pool, external=bool(ctx.config.engine.prometheus_url)):
        st.caption(":material/info: No DCGM exporter target in this pool: add a "
                   '`[[targets]]` with `kind = "dcgm"` (dcgm-exporter\'s `/metrics`, port 9400) '
                   f"to `{ctx.path}`, or a `dcgm_selector` to the pool when reading a "
                   "Prometheus, to see GPU utilisation.")
        return
    rows = [(t, gpu, v) for t, per_gpu in data.series(ctx, "sm", times, pool.name)
            for gpu, v in per_gpu.items()]
    df = charts.long_frame(rows)
    layout.chart(charts.lines(df, y_title="SM active", y_format=".0%"), df,
                 "No DCGM sample in this range.")


def _kv(pool: PoolConfig, times: list[float]) -> None:
    rows: list[tuple[float, str, float | None]] = []
    for t, kv in data.series(ctx, "kv", times, pool.name):
        rows.append((t, "pool mean", kv["mean"]))
        rows += [(t, replica, v) for replica, v in kv["replicas"].items()]
    df = charts.long_frame(rows)
    s, high = ctx.config.scaling, ctx.config.alerts.kv_usage_high
    rules = [Rule(s.scale_out_kv_usage, f"scale out > {fmt.percent(s.scale_out_kv_usage, 0)}",
                  TICKET_COLOR),
             Rule(high, f"KV alert > {fmt.percent(high, 0)}", PAGE_COLOR)]
    st.markdown("**KV-cache usage** (per replica and the pool mean scaling reads)")
    layout.chart(charts.lines(df, y_title="KV cache used", y_format=".0%", rules=rules), df,
                 "No KV-cache sample in this range.")


def _queue(pool: PoolConfig, times: list[float], window_s: float) -> None:
    left, right = st.columns(2, gap="medium")
    with left:
        df = charts.long_frame([(t, "waiting requests", v)
                                for t, v in data.series(ctx, "queue", times, pool.name)])
        limit = ctx.config.scaling.scale_out_queue_length
        st.markdown("**Queue length** (requests waiting, sum over replicas)")
        layout.chart(charts.lines(df, y_title="requests", y_format=".0f",
                                  rules=[Rule(limit, f"scale out > {limit:g}", TICKET_COLOR)]),
                     df, "No queue sample in this range.")
    with right:
        rows = [(t, f"{q} ({model})" if len(per_model) > 1 else q, v)
                for t, per_model in data.series(ctx, "quantile", times, pool.name, window_s,
                                                VLLM_QUEUE_TIME)
                for model, qs in per_model.items() for q, v in qs.items()]
        df = charts.long_frame(rows)
        st.markdown(f"**Queue time** (p50 / p95 / p99 over {format_duration(window_s)})")
        layout.chart(charts.lines(df, y_title="seconds", y_format=".2f"), df,
                     f"No `{VLLM_QUEUE_TIME}` observation (a request leaving the queue) in "
                     "this range.")


def _engine(pool: PoolConfig, times: list[float], window_s: float, at_s: float) -> None:
    left, right = st.columns(2, gap="medium")
    start, end = ctx.view.window(at_s)
    with left:
        dist = data.point(ctx, "distribution", end, pool.name, end - start,
                          VLLM_ITERATION_TOKENS)
        df = pd.DataFrame([{"tokens per step": _bucket(r["lower"], r["upper"]),
                            "share of steps": r["share"]} for r in dist if r["share"]])
        st.markdown("**Batch size** (tokens per engine step over the range, "
                    "`vllm:iteration_tokens_total`)")
        layout.chart(charts.bars(df, x="tokens per step", y="share of steps",
                                 x_title="tokens per step", y_title="share of steps",
                                 y_format=".0%", sort=list(df["tokens per step"])
                                 if not df.empty else None) if not df.empty else None, df,
                     f"No `{VLLM_ITERATION_TOKENS}` observation (engine step) in this range.")
    with right:
        df = charts.long_frame([(t, "preemptions", None if v is None else v * 60)
                                for t, v in data.series(ctx, "rate", times, pool.name,
                                                        window_s, VLLM_PREEMPTIONS)])
        st.markdown("**Preemptions** per minute (KV-cache pressure: requests recomputed)")
        layout.chart(charts.lines(df, y_title="per minute", y_format=".1f"), df,
                     "No preemption counter in this range.")
    left, right = st.columns(2, gap="medium")
    with left:
        df = charts.long_frame([(t, "prefix-cache hit rate", v) for t, v in data.series(
            ctx, "ratio", times, pool.name, window_s, VLLM_PREFIX_CACHE_HITS,
            VLLM_PREFIX_CACHE_QUERIES)])
        st.markdown("**Prefix-cache hit rate** (prompt tokens found in the cache)")
        layout.chart(charts.lines(df, y_title="hit rate", y_format=".0%"), df,
                     "No prefix-cache lookup in this range (prefix caching off?).")
    with right:
        df = charts.long_frame([(t, "acceptance rate", v) for t, v in data.series(
            ctx, "ratio", times, pool.name, window_s, VLLM_SPEC_ACCEPTED_TOKENS,
            VLLM_SPEC_DRAFT_TOKENS)])
        st.markdown("**Speculative decoding** (accepted / proposed draft tokens)")
        layout.chart(charts.lines(df, y_title="acceptance", y_format=".0%"), df,
                     "Speculative decoding is not enabled in this pool (no "
                     "`vllm:spec_decode_*` series).")


def _bucket(lower: float, upper: float) -> str:
    if upper == float("inf"):
        return f"> {lower:g}"
    return f"{lower:g}–{upper:g}"


def body() -> None:
    at_s = data.now(ctx)
    with data.empty_states(ctx):
        layout.header(ctx, "Server", at_s)
        start, end = ctx.view.window(at_s)
        step = chart_step(end - start, min_step_s=ctx.config.collector.scrape_interval)
        times = chart_times(end, end - start, step)
        window = max(step, ctx.config.engine.window)
        for pool in layout.pools(ctx):
            with st.container(border=True, key=f"server-{pool.name}"):
                st.subheader(f"Pool {pool.name}", anchor=False)
                left, right = st.columns(2, gap="medium")
                with left:
                    _gpu(pool, times)
                with right:
                    _kv(pool, times)
                _queue(pool, times, window)
                _engine(pool, times, window, at_s)


layout.live_fragment(ctx, body)
