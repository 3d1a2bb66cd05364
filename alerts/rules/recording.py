"""Pipeline steps 2-4 of ``alerts.rules.pipeline``: the recording rules.

* ``sli_recording_rules``: per SLO, ``slo:sli_error:ratio_rate<w>`` for every window of the
  burn-rate table plus ``[engine] window`` (group ``vigil-slo-sli-<slo>``);
* ``meta_recording_rules``: per SLO, the objective, the error budget, the period in days,
  the current burn rate and ``slo:spec_info`` (``vector(1)`` labelled with the SLO's
  ``spec_version``, which readers check before they trust the recorded ratios; group
  ``vigil-slo-meta-<slo>``), and the period's error ratio, burn
  rate and remaining budget (group ``vigil-slo-period-<slo>``, its own interval);
* ``pool_recording_rules``: per pool, TTFT and e2e p50/p95/p99 per model, KV-cache usage mean
  and max, queue length, GPU cost and GPU cost per 1000 requests (group ``vigil-pool-<pool>``).

Constants (the budget ``1 - objective``) are written into the expressions instead of read from
``slo:error_budget:ratio``: the same float, no vector matching, and no dependency between
groups that Prometheus evaluates independently.

**The period's remaining budget** is ``1 - sli_error(period) / (1 - objective)`` with the
period's error ratio computed straight from the raw counters over the whole period (``increase
(...[30d])``), exactly as the engine computes ``budget_remaining``. Sloth instead averages the
5-minute ratio over 30 days (``avg_over_time(slo:sli_error:ratio_rate5m[30d])``), which weighs
every 5 minutes the same whatever their traffic and so differs from the ratio of the counts.
The price is a month of raw samples read per evaluation, hence the period group's longer
interval (``RulesOptions.period_interval_s``, 5 minutes by default).

**A pool with a selector** (``[[pools]] selector``) is read through it
(``alerts.rules.promql.pool_series``); its series carry no ``pool``, so each rule's ``labels:``
are what give the recorded series their ``pool`` (and ``slo``, ``model_name``), as they
already do for every SLO series.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from alerts.rules.model import Origin, Rule, RuleGroup, RulesOptions, prom_duration
from alerts.rules.promql import (
    gpu_cost_expr,
    kv_usage_expr,
    number,
    per_requests_expr,
    promql_string,
    quantile_expr,
    queue_length_expr,
    sli_error_expr,
)
from slo.cost.pool import coverage_interval
from slo.objectives.quantiles import LATENCY_HISTOGRAMS, QUANTILES, quantile_key
from slo.objectives.recorded import sli_record_name
from slo.objectives.spec import SloSpec, spec_version
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    GROUP_POOL,
    GROUP_SLO_META,
    GROUP_SLO_PERIOD,
    GROUP_SLO_SLI,
    LABEL_MODEL_NAME,
    LABEL_POOL,
    LABEL_SLO,
    LABEL_SPEC_VERSION,
    RULE_CURRENT_BURN_RATE,
    RULE_ERROR_BUDGET,
    RULE_GPU_COST,
    RULE_GPU_COST_PER_1000,
    RULE_KV_USAGE_AVG,
    RULE_KV_USAGE_MAX,
    RULE_OBJECTIVE,
    RULE_PERIOD_BUDGET_REMAINING,
    RULE_PERIOD_BURN_RATE,
    RULE_QUANTILE,
    RULE_QUEUE_LENGTH,
    RULE_SPEC_INFO,
    RULE_TIME_PERIOD_DAYS,
)

__all__ = [
    "QUANTILE_SIGNALS",
    "budget_expr",
    "meta_recording_rules",
    "period_burn_standalone",
    "period_remaining_standalone",
    "pool_of",
    "pool_recording_rules",
    "sli_record_name",
    "sli_recording_rules",
    "slo_labels",
    "slo_selector",
]

#: The latency histograms whose quantiles are recorded per model (keys of
#: ``slo.objectives.quantiles.LATENCY_HISTOGRAMS``).
QUANTILE_SIGNALS = ("ttft_seconds", "e2e_seconds")
_SECONDS_PER_DAY = 86400.0


def slo_labels(spec: SloSpec) -> dict[str, str]:
    """The labels of every ``slo:*`` series of one SLO."""
    return {LABEL_SLO: spec.name, LABEL_POOL: spec.pool, LABEL_MODEL_NAME: spec.model}


def slo_selector(record: str, spec: SloSpec) -> str:
    """``record{slo="<name>"}``: SLO names are unique, so this is one series."""
    return f"{record}{{{LABEL_SLO}={promql_string(spec.name)}}}"


def budget_expr(spec: SloSpec) -> str:
    """``(1 - objective)``: the same float as ``SloSpec.error_budget``."""
    return f"(1 - {number(spec.objective)})"


def _parenthesised(expr: str) -> str:
    inner = "\n".join("  " + line if line else line for line in expr.split("\n"))
    return f"(\n{inner}\n)"


def period_burn_standalone(spec: SloSpec, pool: PoolConfig | None = None) -> str:
    """``slo:period_burn_rate:ratio`` of ``spec`` computed from raw series (``pool``: the
    SLO's pool, whose selector chooses them)."""
    ratio = sli_error_expr(spec, spec.period_s, pool=pool)
    return f"{_parenthesised(ratio)} / {budget_expr(spec)}"


def period_remaining_standalone(spec: SloSpec, pool: PoolConfig | None = None) -> str:
    """``slo:period_error_budget_remaining:ratio`` of ``spec`` computed from raw series."""
    return f"1 - {_parenthesised(period_burn_standalone(spec, pool))}"


def pool_of(spec: SloSpec, pools: Iterable[PoolConfig] | None) -> PoolConfig | None:
    """The config of ``spec``'s pool among ``pools`` (``None`` without: Vigil's labels)."""
    return next((p for p in pools or () if p.name == spec.pool), None)


def sli_recording_rules(
    specs: Sequence[SloSpec], windows_s: Sequence[float], options: RulesOptions,
    pools: Iterable[PoolConfig] | None = None,
) -> list[RuleGroup]:
    """One group per SLO: its error ratio over every window (ascending). ``pools``: the
    config's, so that an SLO of a pool with a selector reads the pool's series through it."""
    groups = []
    pools = tuple(pools or ())
    for spec in specs:
        pool = pool_of(spec, pools)
        rules = tuple(
            Rule(
                record=sli_record_name(w),
                expr=sli_error_expr(spec, w, pool=pool),
                labels=slo_labels(spec),
                origin=Origin("sli_error", slo=spec.name, pool=spec.pool, window_s=w),
            )
            for w in windows_s
        )
        groups.append(RuleGroup(f"{GROUP_SLO_SLI}-{spec.name}", options.interval_s, rules))
    return groups


def meta_recording_rules(
    specs: Sequence[SloSpec],
    windows_s: Sequence[float],
    current_window_s: float,
    options: RulesOptions,
    pools: Iterable[PoolConfig] | None = None,
) -> list[RuleGroup]:
    """Per SLO: the metadata group and the period group (see the module docs); ``pools`` as
    for ``sli_recording_rules``."""
    groups = []
    pools = tuple(pools or ())
    for spec in specs:
        labels = slo_labels(spec)
        pool = pool_of(spec, pools)

        def origin(kind: str, window_s: float | None = None, s: SloSpec = spec) -> Origin:
            return Origin(kind, slo=s.name, pool=s.pool, window_s=window_s)

        budget = budget_expr(spec)
        current = sli_record_name(current_window_s)
        meta = (
            Rule(record=RULE_OBJECTIVE, expr=f"vector({number(spec.objective)})",
                 labels=labels, origin=origin("objective")),
            Rule(record=RULE_ERROR_BUDGET, expr=f"vector{budget}", labels=labels,
                 origin=origin("error_budget")),
            Rule(record=RULE_TIME_PERIOD_DAYS,
                 expr=f"vector({number(spec.period_s / _SECONDS_PER_DAY)})", labels=labels,
                 origin=origin("time_period_days", spec.period_s)),
            # slo.objectives.burn_rate.burn_rate: error ratio / (1 - objective), over [engine]
            # window.
            Rule(record=RULE_CURRENT_BURN_RATE,
                 expr=f"{slo_selector(current, spec)} / {budget}",
                 standalone=f"{_parenthesised(sli_error_expr(spec, current_window_s, pool=pool))}"
                            f" / {budget}",
                 labels=labels, origin=origin("current_burn_rate", current_window_s)),
            # What the recorded ratios mean (slo.objectives.recorded checks it before reading).
            Rule(record=RULE_SPEC_INFO, expr="vector(1)",
                 labels={**labels, LABEL_SPEC_VERSION: spec_version(spec)},
                 origin=origin("spec_info")),
        )
        groups.append(RuleGroup(f"{GROUP_SLO_META}-{spec.name}", options.interval_s, meta))

        period_name = sli_record_name(spec.period_s)
        period_rules: list[Rule] = []
        if spec.period_s not in windows_s:  # else the SLI group records it already
            period_rules.append(Rule(record=period_name,
                                     expr=sli_error_expr(spec, spec.period_s, pool=pool),
                                     labels=labels, origin=origin("sli_error", spec.period_s)))
        period_rules += [
            Rule(record=RULE_PERIOD_BURN_RATE, expr=f"{slo_selector(period_name, spec)} / {budget}",
                 standalone=period_burn_standalone(spec, pool), labels=labels,
                 origin=origin("period_burn_rate", spec.period_s)),
            # slo.objectives.burn_rate.budget_remaining: 1 - period error ratio / (1 - objective).
            Rule(record=RULE_PERIOD_BUDGET_REMAINING,
                 expr=f"1 - {slo_selector(RULE_PERIOD_BURN_RATE, spec)}",
                 standalone=period_remaining_standalone(spec, pool), labels=labels,
                 origin=origin("period_budget_remaining", spec.period_s)),
        ]
        groups.append(RuleGroup(f"{GROUP_SLO_PERIOD}-{spec.name}", options.period_interval_s,
                                tuple(period_rules)))
    return groups


def _pool_rules(config: Config, pool: PoolConfig) -> tuple[Rule, ...]:
    window = config.engine.window
    # The expressions keep `pool` already (a selector's series have none: the static label is
    # all they get); it makes each rule's (name, labels) unique across pools, which `promtool
    # check rules` insists on.
    labels = {LABEL_POOL: pool.name}
    rules: list[Rule] = []
    for signal in QUANTILE_SIGNALS:
        metric = LATENCY_HISTOGRAMS[signal]
        for q in QUANTILES:
            rules.append(Rule(
                record=RULE_QUANTILE.format(signal=signal, quantile=quantile_key(q),
                                            window=prom_duration(window)),
                expr=quantile_expr(q, metric, pool, window),
                labels=labels,
                origin=Origin("quantile", pool=pool.name, window_s=window, signal=signal,
                              quantile=q),
            ))
    rules += [
        Rule(record=RULE_KV_USAGE_AVG, expr=kv_usage_expr(pool, "avg"), labels=labels,
             origin=Origin("kv_avg", pool=pool.name)),
        Rule(record=RULE_KV_USAGE_MAX, expr=kv_usage_expr(pool, "max"), labels=labels,
             origin=Origin("kv_max", pool=pool.name)),
        Rule(record=RULE_QUEUE_LENGTH, expr=queue_length_expr(pool), labels=labels,
             origin=Origin("queue", pool=pool.name)),
    ]
    cost_window = config.engine.cost_window
    cost_name = RULE_GPU_COST.format(window=prom_duration(cost_window))
    cost = gpu_cost_expr(pool, cost_window, pool.gpus_per_replica, config.prices[pool.gpu],
                         **_cost_intervals(config, pool), bill_down_time=pool.bill_down_time)
    cost_selector = f"{cost_name}{{{LABEL_POOL}={promql_string(pool.name)}}}"
    rules += [
        Rule(record=cost_name, expr=cost, labels=labels,
             origin=Origin("gpu_cost", pool=pool.name, window_s=cost_window)),
        Rule(record=RULE_GPU_COST_PER_1000.format(window=prom_duration(cost_window)),
             expr=per_requests_expr(cost_selector, pool, cost_window),
             standalone=per_requests_expr(cost, pool, cost_window), labels=labels,
             origin=Origin("gpu_cost_per_1000", pool=pool.name, window_s=cost_window)),
    ]
    return tuple(rules)


def _cost_intervals(config: Config, pool: PoolConfig) -> dict[str, Any]:
    """``gpu_cost_expr``'s intervals, from ``slo.cost.pool.coverage_interval`` as the engine takes
    them: the default for every series, and the pool's targets that differ from it. A pool
    chosen by a selector has no per-target intervals: its replicas are not Vigil's targets
    (their ``replica_label`` values are not target names), so all take the default."""
    lookback = config.engine.lookback
    default = coverage_interval(config.unlisted_scrape_interval(pool), (),
                                config.collector.scrape_interval, lookback)
    targets = () if pool.has_selector else config.targets
    own = {t.name: coverage_interval(config.scrape_interval(t), (), default, lookback)
           for t in targets if t.pool == pool.name}
    return {"default_interval_s": default,
            "intervals": {name: s for name, s in own.items() if s != default}}


def pool_recording_rules(config: Config, options: RulesOptions) -> list[RuleGroup]:
    """One group per pool (in config order): quantiles, KV-cache usage, queue, cost."""
    return [
        RuleGroup(f"{GROUP_POOL}-{pool.name}", options.interval_s, _pool_rules(config, pool))
        for pool in config.pools
    ]
