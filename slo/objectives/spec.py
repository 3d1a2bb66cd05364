"""SLO specs: the configured ``[[slos]]`` with every default filled in, or the four defaults.

One ``SloSpec`` is the single source of truth for an SLO: the embedded engine evaluates it, and
the generated Prometheus rules, the alerts and the dashboard are built from the same list
(``effective_slos``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from vigil.config import Config, PoolConfig, SloConfig
from vigil.conventions import (
    ENDPOINT_ALL,
    KIND_VLLM,
    LATENCY_INDICATORS,
    RULES_REVISION,
    SLO_INDICATORS,
    SLO_NAME_SUFFIXES,
)

__all__ = ["SloSpec", "default_slos", "effective_slos", "spec_version"]


@dataclass(frozen=True)
class SloSpec:
    """One SLO, fully specified.

    ``objective``: ratio 0-1 of good events (good time, for replica_up);
    ``threshold_seconds``: the latency bound of a ``ttft``/``e2e`` SLO, ``None`` for the others;
    ``period_s``: the error budget's period in seconds; ``pool_config``: the pool's
    configuration, which says how its series are chosen (its ``selector`` in a Prometheus);
    ``None`` for a spec built by hand, whose pool is then read by Vigil's own labels. It takes
    no part in equality or hashing: the pool's name already identifies it.
    """

    name: str
    pool: str
    model: str
    endpoint: str
    indicator: str
    objective: float
    threshold_seconds: float | None
    period_s: float
    pool_config: PoolConfig | None = field(default=None, compare=False, repr=False)

    @property
    def error_budget(self) -> float:
        """The allowed ratio (0-1) of bad events over the period: ``1 - objective``."""
        return 1.0 - self.objective

    @property
    def is_latency(self) -> bool:
        """True for the histogram-based indicators (``ttft``, ``e2e``)."""
        return self.indicator in LATENCY_INDICATORS


def _default_objective(config: Config, indicator: str) -> float:
    d = config.slo_defaults
    return {
        "ttft": d.ttft_objective,
        "e2e": d.e2e_objective,
        "error_rate": d.error_rate_objective,
        "availability": d.availability_objective,
        # The old availability figure keeps its objective, so a migrated SLO keeps its budget.
        "replica_up": d.availability_objective,
    }[indicator]


def _default_threshold(config: Config, indicator: str) -> float | None:
    d = config.slo_defaults
    return {"ttft": d.ttft_threshold_seconds, "e2e": d.e2e_threshold_seconds}.get(indicator)


def _from_config(config: Config, slo: SloConfig) -> SloSpec:
    pool = config.pool(slo.pool)  # parse_config has checked that the pool exists
    threshold = slo.threshold_seconds
    if threshold is None:
        threshold = _default_threshold(config, slo.indicator)
    return SloSpec(
        name=slo.name,
        pool=slo.pool,
        model=slo.model or pool.model,
        endpoint=slo.endpoint,
        indicator=slo.indicator,
        objective=slo.objective if slo.objective is not None
        else _default_objective(config, slo.indicator),
        threshold_seconds=threshold,
        period_s=slo.period if slo.period is not None else config.slo_defaults.period,
        pool_config=pool,
    )


def default_slos(config: Config, pool: PoolConfig) -> list[SloSpec]:
    """The four default SLOs for one pool, from ``[slo_defaults]``:
    ``<pool>-ttft``, ``<pool>-e2e``, ``<pool>-error-rate``, ``<pool>-availability``; the
    pool's model, every endpoint."""
    return [
        SloSpec(
            name=f"{pool.name}-{SLO_NAME_SUFFIXES[indicator]}",
            pool=pool.name,
            model=pool.model,
            endpoint=ENDPOINT_ALL,
            indicator=indicator,
            objective=_default_objective(config, indicator),
            threshold_seconds=_default_threshold(config, indicator),
            period_s=config.slo_defaults.period,
            pool_config=pool,
        )
        for indicator in SLO_INDICATORS
    ]


def effective_slos(config: Config) -> list[SloSpec]:
    """The SLOs to evaluate: every ``[[slos]]`` entry (in file order) with its missing fields
    taken from ``[slo_defaults]`` and the model from its pool; with no ``[[slos]]`` at all,
    the four defaults for every pool (in pool order)."""
    if config.slos:
        return [_from_config(config, slo) for slo in config.slos]
    return [spec for pool in config.pools for spec in default_slos(config, pool)]


def spec_version(spec: SloSpec) -> str:
    """Twelve hex digits naming what the recorded error ratios of ``spec`` mean: its indicator,
    model, threshold, objective and period, the series its pool is read by in a Prometheus
    (selector, ``up`` series, replica label) and the generator's ``RULES_REVISION``. The
    generated rules record it (``slo:spec_info``); a reader whose config gives another
    version knows the store's figures are not its SLO's and computes from raw series.

    The windows are left out: each window's ratio means the same whichever other windows the
    table has, and a window the store does not record is read raw on its own."""
    pool = spec.pool_config
    up = pool.up_series(KIND_VLLM, external=True) if pool is not None else None
    doc = {
        "revision": RULES_REVISION,
        "slo": [spec.name, spec.pool, spec.model, spec.endpoint, spec.indicator,
                spec.objective, spec.threshold_seconds, spec.period_s],
        "series": pool.series(KIND_VLLM, external=True).inner() if pool is not None else None,
        "up": up.inner() if up is not None else None,
        "replica": pool.replica_label_for(external=True) if pool is not None else None,
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]
