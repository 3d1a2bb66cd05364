"""``evaluate``: the whole fleet's SLO status at one instant, as one JSON-ready dict.

It composes the small modules: per pool the per-model quantiles (``slo.objectives.quantiles``),
KV-cache usage and queue length (instant lookups), cost (``slo.cost.pool``) and the scaling
recommendation (``slo.scaling.policy``, sized by the pool's saved capacity profile when there is
one); per SLO the windows, burn rates, budget and alerts (``slo.objectives.burn_rate``); the token
anomalies (``slo.objectives.anomaly``). A value that cannot be computed is ``None`` (JSON ``null``),
never 0; NaN and ±Inf never reach the output.

The evaluation time is always passed in: nothing under ``slo/`` reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from collector.vllm_families import families_for_indicator, missing_family_warning
from slo.cost.pool import pool_cost
from slo.objectives.anomaly import pool_anomalies
from slo.objectives.burn_rate import burn_windows, evaluate_slo
from slo.objectives.quantiles import model_quantiles
from slo.objectives.recorded import QuerySource, RecordedRead, read_recorded, recordable
from slo.objectives.sli import (
    REASON_NO_DATA,
    REASON_NO_REQUEST_DATA,
    REASON_NO_REQUESTS,
    replica_label,
    vllm_matchers,
    vllm_up_matchers,
)
from slo.objectives.spec import SloSpec, effective_slos
from slo.planning.pool_profile import pool_capacity
from slo.promql.aggregate import sum_by
from slo.scaling.signals import kv_usage_at, recommend_for_pool
from slo.sources.embedded import EmbeddedSource
from slo.sources.protocol import RequestLog, Source, is_external, source_kind
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    ENDPOINT_ALL,
    SERIES_UP,
    VLLM_REQUESTS_WAITING,
)
from vigil.durations import format_duration
from vigil.errors import SourceError

__all__ = ["evaluate", "json_safe", "pool_status"]

def json_safe(value: Any) -> Any:
    """``value`` with every NaN/±Inf float replaced by ``None`` and numpy scalars made plain
    (dicts, lists and tuples are walked; tuples become lists)."""
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float) or hasattr(value, "__float__"):
        f = float(value)
        return f if math.isfinite(f) else None
    return value


def _profile_summary(profile: Any) -> dict[str, Any]:
    """What the status says of the profile the policy used: key, basis and figures."""
    return {
        "key": profile.key,
        "basis": profile.basis,
        "label": profile.identity.label(),
        "source": profile.source,
        "pool": profile.pool,
        "created_at": profile.created_at,
        "rps_per_replica": profile.max_goodput_rps,
        "max_concurrency": profile.max_concurrency,
    }


def _scaling(source: Source, config: Config, pool: PoolConfig, at_s: float) -> Any:
    """``recommend_for_pool(...).to_dict()`` plus ``profile`` (the capacity profile sizing it,
    or None) and ``profile_error`` (why no profile or a saved one was not used)."""
    profile, sizing, error = pool_capacity(config, pool)
    kwargs: dict[str, Any] = {} if sizing is None else {"capacity": sizing}
    rec = recommend_for_pool(source, config, pool, at_s, step_s=config.collector.scrape_interval,
                    **kwargs)
    out = rec.to_dict()
    out["profile"] = None if profile is None else _profile_summary(profile)
    if error is not None:
        out["profile_error"] = error
    return out


def pool_status(
    config: Config, source: Source, pool: PoolConfig, at_s: float, window_s: float,
    *, request_log: RequestLog | None = None, quantile_source: str = "auto",
) -> dict[str, Any]:
    """One pool's block: models (quantiles, tokens), KV cache, queue, cost, scaling.
    ``quantile_source``: ``slo.objectives.quantiles.model_quantiles``'s."""
    m = vllm_matchers(pool, source)
    sem = source.semantics
    models = {pool.model} | {s.model for s in effective_slos(config) if s.pool == pool.name}
    replica = replica_label(pool, source)
    kv = kv_usage_at(source, pool, at_s)
    waiting = source.instant(VLLM_REQUESTS_WAITING, m, at_s)
    up = source.instant(SERIES_UP, vllm_up_matchers(pool, source), at_s)
    return {
        "models": model_quantiles(source, pool, at_s, window_s, models=models,
                                  request_log=request_log, normalised_output_tokens=(
                                      config.slo_defaults.e2e_reference_output_tokens),
                                  quantile_source=quantile_source),
        # mean/max over the pool's replicas of their latest value (ratio 0-1), as the
        # scaling signals and the KvCacheUsageHigh alert read it
        "kv_cache_usage": {"avg": None if kv is None else kv[0],
                           "max": None if kv is None else kv[1]},
        # sum(vllm:num_requests_waiting{pool}): requests waiting, deferred ones included
        "queue_length": sum_by(waiting, (), sem).get(()),
        # Replicas, not series: a pod scraped by two jobs has two `up` series.
        "replicas_up": len({dict(k).get(replica, "") for k, v in up.items() if v == 1})
        if up else None,
        "cost": pool_cost(source, config, pool, at_s, request_log=request_log),
        "scaling": _scaling(source, config, pool, at_s),
    }


#: The reasons of a null SLI computed from vLLM's metrics (not those of a per-endpoint SLI).
_METRIC_REASONS = (REASON_NO_DATA, REASON_NO_REQUEST_DATA, REASON_NO_REQUESTS)


def _explain_missing_inputs(slos: list[dict[str, Any]], source: Source) -> None:
    """Add to the reason of each null SLI the family it needs that the pool's vLLM targets
    lack, as the collector recorded it (with the vLLM version): an SLO over a renamed or
    dropped metric says so rather than "no data", and one whose other replicas saw no
    requests says that some replicas could not have been counted. The embedded store only: a
    Prometheus keeps no such record."""
    blank = [s for s in slos
             if s.get("reason") in _METRIC_REASONS and s.get("endpoint") == ENDPOINT_ALL]
    if not blank or not isinstance(source, EmbeddedSource):
        return
    health = source.store.target_health()
    for slo in blank:
        for family in families_for_indicator(slo["indicator"]):
            found = [(h.target, w) for h in health if h.pool == slo["pool"]
                     for w in [missing_family_warning(h, family.name)] if w is not None]
            if found:
                target, warning = found[0]
                more = (f"; {len(found) - 1} more of the pool's vLLM targets lack it too"
                        if len(found) > 1 else "")
                slo["reason"] = f"{slo['reason']}: target {target}: {warning}{more}"
                break


def evaluate(
    config: Config,
    source: Source,
    at_s: float,
    *,
    window_s: float | None = None,
    request_log: RequestLog | None = None,
    quantile_source: str = "auto",
) -> dict[str, Any]:
    """The status of every pool and SLO at ``at_s`` (Unix seconds).

    ``window_s`` (seconds; default ``[engine] window``) is the window of the quantiles and of
    each SLO's ``"current"`` ratio; burn-rate windows, periods, the cost window and the anomaly
    window come from the config. ``request_log`` (the gateway's, when it exists) enables
    per-endpoint SLIs, per-request anomalies and exact quantiles where its records cover a
    model (``quantile_source="histogram"`` keeps vLLM's histogram figures). Returns a JSON-ready
    dict (see ``docs/slo-engine.md`` for every key).
    """
    w = config.engine.window if window_s is None else float(window_s)
    if not w > 0:
        raise ValueError(f"the window must be a positive number of seconds, not {window_s!r}")
    at_s = float(at_s)
    alerts = config.engine.burn_rate_alerts
    pools = {p.name: pool_status(config, source, p, at_s, w, request_log=request_log,
                                 quantile_source=quantile_source)
             for p in config.pools}
    specs = effective_slos(config)
    read = _read_recorded(config, source, specs, at_s, request_log)
    slos = [
        evaluate_slo(
            spec, source, at_s, alerts, current_window_s=w, request_log=request_log,
            recorded=None if read is None else read.slos.get(spec.name),
        ).to_dict()
        for spec in specs
    ]
    _explain_missing_inputs(slos, source)
    anomalies = [
        a for p in config.pools
        for a in pool_anomalies(source, config, p, at_s, request_log=request_log)
    ]
    status: dict[str, Any] = json_safe({
        "at": at_s,
        "source": source_kind(source),
        "promql_semantics": source.semantics.value,
        "window": format_duration(w),
        "pools": pools,
        "slos": slos,
        "anomalies": anomalies,
    })
    if read is not None:
        status["recorded_rules"] = {"mode": config.engine.recorded_rules,
                                    "read": sorted(read.slos), "fallback": read.fallback}
    # What the server said beside its answers (a Thanos store that did not answer, a result
    # cut by a limit): the figures above may come from part of the data. Absent when none.
    short = _short_retention(source, specs)  # first: what asking it warned is taken below
    take_warnings = getattr(source, "take_warnings", None)
    warnings = list(take_warnings()) if callable(take_warnings) else []
    warnings += short
    warnings += _fallback_warnings(read)
    if warnings:
        status["warnings"] = warnings
    return status


def _short_retention(source: Source, specs: list[SloSpec]) -> list[str]:
    """A warning per SLO whose budget period reaches back past what the server keeps: its
    budget and period burn rate are computed from the retained part only, and look better
    than they are once a bad stretch has fallen out."""
    retention_of = getattr(source, "retention_s", None)
    retention = retention_of() if callable(retention_of) else None
    if retention is None:
        return []
    return [f"the server keeps {format_duration(retention)} of samples, less than the "
            f"{format_duration(spec.period_s)} period of SLO {spec.name}: its budget is "
            "computed from the retained part only (raise the retention, or let the server "
            "evaluate Vigil's recording rules)"
            for spec in specs if retention < spec.period_s]


def _read_recorded(config: Config, source: Source, specs: list[SloSpec], at_s: float,
                   request_log: RequestLog | None) -> RecordedRead | None:
    """The store's recorded SLO figures (``slo.objectives.recorded``) for the SLOs the generated
    rules cover, or ``None``: the embedded store (Vigil's own engine is the one evaluating),
    or ``[engine] recorded_rules = "off"``. Left out, and computed from raw series as
    before: per-endpoint SLOs (no rule can express them) and, when the gateway's records
    exist, availability (exact from the records, where a rule sees 5xx answers only)."""
    if config.engine.recorded_rules == "off" or not is_external(source) \
            or not isinstance(source, QuerySource):
        return None
    covered = [s for s in specs if recordable(s, request_log=request_log is not None)]
    windows = {*burn_windows(config.engine.burn_rate_alerts), config.engine.window}
    try:
        return read_recorded(source, covered, at_s, windows_s=windows,
                             interval_s=config.rules.interval,
                             period_interval_s=config.rules.period_interval)
    except SourceError as exc:
        # A store that refuses this one query (a regex on __name__, say) still answers the
        # raw ones: the figures come from those, and the status says why.
        why = f"reading the recorded series failed: {exc.reason}"
        return RecordedRead({}, {s.name: why for s in covered})


def _fallback_warnings(read: RecordedRead | None) -> list[str]:
    """One warning per reason some SLOs were computed from raw series although the store
    could have recorded them: their figures may differ from the store's alerts and cost a
    window of raw samples per evaluation."""
    if read is None or not read.fallback:
        return []
    by_reason: dict[str, list[str]] = {}
    for name, why in read.fallback.items():
        by_reason.setdefault(why, []).append(name)
    return [f"SLO{'s' if len(names) > 1 else ''} {', '.join(sorted(names))} computed from "
            f"raw series, not the store's recorded ones: {why}"
            for why, names in by_reason.items()]
