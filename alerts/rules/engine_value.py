"""The embedded engine's number that a recording rule records: one function, rule → value.

A ``Rule`` keeps its ``Origin``: which number of ``vigil slo status`` it stands for. This module
turns that back into the engine's own answer, computed by the same ``slo`` functions the status
uses, over any ``Source``. The promtool tests take their expected samples from it, and the tests
that run the rules in a real Prometheus compare what it recorded with it, so "the rules record
what the engine reports" is stated once.
"""

from __future__ import annotations

from collections.abc import Sequence

from alerts.rules.model import Origin
from slo.cost.pool import pool_cost
from slo.objectives.burn_rate import budget_remaining, burn_rate
from slo.objectives.quantiles import model_quantiles, quantile_key
from slo.objectives.sli import error_ratio
from slo.objectives.spec import SloSpec
from slo.scaling.signals import kv_usage_at, queue_length_at
from slo.sources.protocol import Source
from vigil.config import Config

#: The per-SLO kinds whose value is the error ratio over the origin's window, transformed.
_RATIO_KINDS = frozenset({"sli_error", "current_burn_rate", "period_burn_rate",
                          "period_budget_remaining"})

#: One value, or one per model (``quantile``): the model name, ``""`` for the single series.
Values = dict[str, float | None]


def engine_value(origin: Origin, config: Config, specs: Sequence[SloSpec], source: Source,
                 at_s: float) -> Values:
    """What the engine computes, at ``at_s`` (Unix seconds) over ``source``, for the number a
    recording rule of ``origin`` records: per model for a quantile (``{model_name: value}``),
    else ``{"": value}``. ``None`` where the engine has no number (no traffic, no data).

    ``specs`` are the SLOs the rules were generated from (an SLO rule names one of them);
    ``config`` gives the pools and their prices. Raises ``ValueError`` for an alerting
    rule's origin, which stands for a condition, not a number."""
    o = origin
    if o.slo:
        spec = next((s for s in specs if s.name == o.slo), None)
        if spec is None:
            raise ValueError(f"origin names SLO {o.slo!r}, which is not among the specs")
        if o.kind == "objective":
            return {"": spec.objective}
        if o.kind == "error_budget":
            return {"": spec.error_budget}
        if o.kind == "spec_info":
            return {"": 1.0}
        if o.kind == "time_period_days":
            return {"": spec.period_s / 86400.0}
        if o.kind in _RATIO_KINDS:
            if o.window_s is None:
                raise ValueError(f"origin {o.kind!r} of SLO {o.slo!r} has no window")
            ratio = error_ratio(spec, source, at_s, o.window_s).error_ratio
            if o.kind == "sli_error":
                return {"": ratio}
            if o.kind == "period_budget_remaining":
                return {"": budget_remaining(ratio, spec.objective)}
            return {"": burn_rate(ratio, spec.objective)}
        raise ValueError(f"no engine value for origin kind {o.kind!r}")
    pool = config.pool(o.pool)
    if o.kind == "quantile":
        if o.window_s is None or o.quantile is None:
            raise ValueError(f"quantile origin of pool {o.pool!r} lacks a window or quantile")
        per_model = model_quantiles(source, pool, at_s, o.window_s)
        return {model: blocks["quantiles"][o.signal][quantile_key(o.quantile)]
                for model, blocks in per_model.items()}
    if o.kind in ("kv_avg", "kv_max"):
        kv = kv_usage_at(source, pool, at_s)
        return {"": None if kv is None else kv[0 if o.kind == "kv_avg" else 1]}
    if o.kind == "queue":
        return {"": queue_length_at(source, pool, at_s)}
    if o.kind in ("gpu_cost", "gpu_cost_per_1000"):
        cost = pool_cost(source, config, pool, at_s, o.window_s)
        return {"": cost["cost_usd" if o.kind == "gpu_cost" else "per_1000_requests"]}
    raise ValueError(f"no engine value for origin kind {o.kind!r}")
