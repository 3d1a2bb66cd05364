"""Pipeline step 5 of ``alerts.rules.pipeline``: the alerting rules.

Per SLO (group ``vigil-slo-alerts-<slo>``):

* ``ErrorBudgetBurn`` with ``severity`` ``page`` and ``ticket``: the multiwindow,
  multi-burn-rate rows of ``[engine] burn_rate_alerts`` of that severity, OR-ed; a row fires
  when the burn rate over its long AND its short window is strictly above its factor for the
  SLO's period (``slo.objectives.burn_rate.slo_burn_alerts``: 14.4 over 1h for a 30-day SLO, 3.36
  for a 7-day one), as ``slo.objectives.burn_rate.firing_alerts`` decides (a window without data
  never fires). The burn rate is
  compared as ``error_ratio / (1 - objective) > factor``, the engine's very division, not as
  ``error_ratio > factor × budget``, which can round differently at the edge;
* ``ErrorBudgetLow`` (``ticket``): the period's remaining budget below ``[alerts]
  budget_low_ratio``.

Per pool (group ``vigil-pool-alerts-<pool>``):

* ``KvCacheUsageHigh`` (``ticket``): a replica's KV-cache usage (its engines averaged) above
  ``[alerts] kv_usage_high`` for ``RulesOptions.kv_alert_for_s``: the cache is nearly full, and
  once it is, vLLM's scheduler stops admitting waiting requests (they queue) and preempts
  running ones (their KV is recomputed later);
* ``TargetDown`` (``ticket``): ``up == 0`` for ``[alerts] target_down_scrapes`` consecutive
  scrapes, i.e. for ``(N - 1) × scrape interval`` (the first failed scrape starts the clock).
  One rule for the pool when its targets share a scrape interval, else one per target.

A pool with a selector (``[[pools]] selector``) is watched through it: ``TargetDown`` on the
``up`` series the selector (and the ``dcgm_selector``) chooses, for ``N - 1`` scrapes at
``[collector] scrape_interval`` (the interval Vigil assumes for a Prometheus's own scrapes, as
the cost rules do); ``KvCacheUsageHigh`` per replica as its ``replica_label`` tells them apart,
and the alerts name the replica by that label.

A pool without a selector whose replicas ``[[discovery]]`` finds (an entry whose ``pool`` is
the pool's, or "" so that a group's ``pool_label`` names it) is watched the same way, on
``up{pool="<name>", kind="vllm"}`` and ``kind="dcgm"``, since its targets are unknown until
run time: for ``N - 1`` scrapes at the longest interval of those entries (``[[pools]]
scrape_interval`` when set), so that no replica is called down before N of its scrapes
failed. When the pool also has ``[[targets]]``, it keeps the one rule on the whole pool,
which covers the discovered replicas too, at the longest interval of the targets and the
entries (the same rule as without discovery when they all share one).

For Vigil itself (group ``vigil-meta-alerts``), the dead-man's switch:

* ``VigilWatchdog`` (``severity: none``): always firing (``vector(1)``). Routed in
  Alertmanager to a heartbeat receiver that pages when it *stops* arriving, it proves the
  whole path (Prometheus, its rules, Alertmanager, the route) works;
* ``VigilEvaluationStale`` (``page``): the newest ``vigil_last_evaluation_timestamp_seconds``
  of every `vigil serve` copy Prometheus scrapes is older than ``STALE_EVALUATIONS``
  evaluation intervals (at least ``MIN_STALE_S``): every copy is stuck at once, so nothing
  evaluates or delivers Vigil's own alerts. ``max`` over the copies: one stuck copy of
  several is not a page, since another still evaluates (its ``/healthz`` says so). A copy
  that is not scraped at all shows in Prometheus's ``up``, not here.

Every alert carries ``severity``, ``pool`` and the ``model`` label of Vigil's own alerts from
its ``labels:``; the other series labels (``slo``, ``model_name``, the replica's ``instance``
or ``replica_label``, a selector's series' own labels) come from the expression.
Annotations use only ``$labels`` (never ``$value``), so that the generated promtool tests can
state them exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from alerts.rules.model import Origin, Rule, RuleGroup, RulesOptions, prom_duration
from alerts.rules.promql import (
    number,
    pool_up,
    replica_kv_usage_expr,
    selector,
    sli_error_expr,
)
from alerts.rules.recording import (
    budget_expr,
    period_remaining_standalone,
    pool_of,
    sli_record_name,
    slo_selector,
)
from slo.objectives.burn_rate import SloBurnAlert, slo_burn_alerts
from slo.objectives.sli import replica_label
from slo.objectives.spec import SloSpec
from vigil.config import BurnRateAlert, Config, PoolConfig, TargetConfig
from vigil.conventions import (
    ALERT_ERROR_BUDGET_BURN,
    ALERT_ERROR_BUDGET_LOW,
    ALERT_EVALUATION_STALE,
    ALERT_KV_CACHE_HIGH,
    ALERT_TARGET_DOWN,
    ALERT_WATCHDOG,
    ANNOTATION_DASHBOARD_URL,
    ANNOTATION_DESCRIPTION,
    ANNOTATION_SUMMARY,
    GROUP_META_ALERTS,
    GROUP_POOL_ALERTS,
    GROUP_SLO_ALERTS,
    KIND_DCGM,
    KIND_VLLM,
    LABEL_INSTANCE,
    LABEL_MODEL,
    LABEL_POOL,
    LABEL_SEVERITY,
    LABEL_SLO,
    METRIC_LAST_EVALUATION,
    RULE_PERIOD_BUDGET_REMAINING,
    SERIES_UP,
    SEVERITY_NONE,
    SEVERITY_PAGE,
    SEVERITY_TICKET,
)
from vigil.selectors import Selector

__all__ = ["alert_rules", "burn_alert_expr", "severities"]


def severities(table: Sequence[BurnRateAlert | SloBurnAlert]) -> list[str]:
    """The severities of the burn-rate table, each once, in table order."""
    out: list[str] = []
    for row in table:
        if row.severity not in out:
            out.append(row.severity)
    return out


def _row(spec: SloSpec, row: SloBurnAlert, *, standalone: bool,
         pool: PoolConfig | None) -> str:
    budget = budget_expr(spec)
    factor = number(row.factor)
    parts = []
    for window in (row.long_window, row.short_window):
        if standalone:
            ratio_expr = sli_error_expr(spec, window, pool=pool)
            inner = "\n".join("  " + line for line in ratio_expr.split("\n"))
            ratio = f"(\n{inner}\n)"
        else:
            ratio = slo_selector(sli_record_name(window), spec)
        parts.append(f"{ratio} / {budget} > {factor}")
    body = f"{parts[0]}\nand\n{parts[1]}"
    return "(\n" + "\n".join("  " + line for line in body.split("\n")) + "\n)"


def burn_alert_expr(spec: SloSpec, rows: Sequence[SloBurnAlert], *,
                    standalone: bool = False, pool: PoolConfig | None = None) -> str:
    """The OR of the rows' ``long > factor and short > factor`` conditions (the rows of
    ``spec``'s period: ``slo.objectives.burn_rate.slo_burn_alerts``); ``pool`` chooses the raw
    series of the standalone form (its selector)."""
    return "\nor\n".join(_row(spec, row, standalone=standalone, pool=pool) for row in rows)


def _slo_labels(spec: SloSpec) -> dict[str, str]:
    # The static `slo` and `pool` make each rule's (name, labels) unique, which `promtool
    # check rules` requires; `model` is the label Vigil's own alerts carry.
    return {LABEL_SLO: spec.name, LABEL_POOL: spec.pool, LABEL_MODEL: spec.model}


def _rows_text(rows: Sequence[SloBurnAlert]) -> str:
    return ", or ".join(
        f"{prom_duration(r.long_window)} and {prom_duration(r.short_window)} "
        f"above {number(r.factor)}x" for r in rows
    )


def _slo_alerts(spec: SloSpec, config: Config) -> tuple[Rule, ...]:
    table = slo_burn_alerts(config.engine.burn_rate_alerts, spec.period_s)
    dashboard = config.alerts.dashboard_url
    pool = pool_of(spec, config.pools)
    rules: list[Rule] = []
    for severity in severities(table):
        rows = [r for r in table if r.severity == severity]
        rules.append(Rule(
            alert=ALERT_ERROR_BUDGET_BURN,
            expr=burn_alert_expr(spec, rows),
            standalone=burn_alert_expr(spec, rows, standalone=True, pool=pool),
            labels={LABEL_SEVERITY: severity, **_slo_labels(spec)},
            annotations={
                ANNOTATION_SUMMARY: f"SLO {{{{ $labels.slo }}}} burns its error budget too fast "
                                    f"({severity})",
                ANNOTATION_DESCRIPTION: (
                    f"The {spec.indicator} SLO {{{{ $labels.slo }}}} of pool "
                    f"{{{{ $labels.pool }}}} (objective {number(spec.objective)}) burns its "
                    f"error budget faster than allowed: burn rate over "
                    f"{_rows_text(rows)}."
                ),
                ANNOTATION_DASHBOARD_URL: dashboard,
            },
            origin=Origin("burn_alert", slo=spec.name, pool=spec.pool, severity=severity),
        ))
    low = number(config.alerts.budget_low_ratio)
    low_percent = f"{config.alerts.budget_low_ratio * 100:g} %"
    remaining = slo_selector(RULE_PERIOD_BUDGET_REMAINING, spec)
    rules.append(Rule(
        alert=ALERT_ERROR_BUDGET_LOW,
        expr=f"{remaining} < {low}",
        standalone=f"{period_remaining_standalone(spec, pool)} < {low}",
        labels={LABEL_SEVERITY: SEVERITY_TICKET, **_slo_labels(spec)},
        annotations={
            ANNOTATION_SUMMARY: "SLO {{ $labels.slo }} has little error budget left",
            ANNOTATION_DESCRIPTION: (
                f"Less than {low_percent} of the {prom_duration(spec.period_s)} error budget "
                f"of SLO "
                f"{{{{ $labels.slo }}}} (pool {{{{ $labels.pool }}}}) is left."
            ),
            ANNOTATION_DASHBOARD_URL: dashboard,
        },
        origin=Origin("budget_low", slo=spec.name, pool=spec.pool, window_s=spec.period_s,
                      severity=SEVERITY_TICKET),
    ))
    return tuple(rules)


def _selector_target_down(config: Config, pool: PoolConfig, interval: float | None = None,
                          ups: Sequence[Selector] = ()) -> list[Rule]:
    """``TargetDown`` of a pool whose series a Prometheus scrapes itself (see the module
    docs): one rule on its selectors' ``up``, naming the replica by ``replica_label``.
    ``interval`` (seconds; default ``[collector] scrape_interval``) and ``ups`` (default the
    selectors) serve a pool found by ``[[discovery]]``."""
    if interval is None:
        # The interval the cost rules bill the pool's replicas at: the team's scrape jobs'.
        interval = config.unlisted_scrape_interval(pool) or config.collector.scrape_interval
    scrapes = config.alerts.target_down_scrapes
    if not ups:
        # `up` of the targets: the selector without labels only exposed samples carry.
        ups = [up for up in (pool_up(pool), pool_up(pool, KIND_DCGM) if pool.dcgm_selector
                             else None) if up is not None]
    exprs = [up.promql(SERIES_UP) for up in ups]
    replica = replica_label(pool, external=True)
    return [Rule(
        alert=ALERT_TARGET_DOWN,
        expr="\nor\n".join(f"{up} == 0" for up in exprs),
        for_s=(scrapes - 1) * interval,
        labels={LABEL_SEVERITY: SEVERITY_TICKET, LABEL_POOL: pool.name, LABEL_MODEL: pool.model},
        annotations={
            # $labels are the expression's, and a selector's series have no `pool`.
            ANNOTATION_SUMMARY: f"Target {{{{ $labels.{replica} }}}} of pool {pool.name} is down",
            ANNOTATION_DESCRIPTION: (
                f"{scrapes} scrapes in a row of the target {{{{ $labels.{replica} }}}} "
                f"failed (every {prom_duration(interval)})."
            ),
            ANNOTATION_DASHBOARD_URL: config.alerts.dashboard_url,
        },
        origin=Origin("target_down", pool=pool.name, window_s=interval,
                      severity=SEVERITY_TICKET),
    )]


def _discovery_interval(config: Config, pool: PoolConfig) -> float | None:
    """Seconds between scrapes of the replicas ``[[discovery]]`` finds for ``pool``: its
    ``scrape_interval`` when set, else the longest of the entries that can name it; ``None``
    when no entry can."""
    found = [d.scrape_interval or config.collector.scrape_interval for d in config.discovery
             if d.pool in (pool.name, "")]
    if not found:
        return None
    return pool.scrape_interval if pool.scrape_interval is not None else max(found)


def _target_down(config: Config, pool: PoolConfig) -> list[Rule]:
    if pool.has_selector:
        return _selector_target_down(config, pool)
    targets = [t for t in config.targets if t.pool == pool.name]
    discovered = _discovery_interval(config, pool)
    if discovered is None and not targets:
        # No [[targets]] and no [[discovery]]: the pool's replicas are scraped by a
        # PodMonitor (`--format operator`) or relabelled jobs adding pool and kind.
        ups = [pool.series(KIND_VLLM, external=True), pool.series(KIND_DCGM, external=True)]
        return _selector_target_down(config, pool, None, ups)
    if discovered is None:
        return _static_target_down(config, pool, targets)
    if not targets:
        ups = [pool.series(KIND_VLLM, external=True), pool.series(KIND_DCGM, external=True)]
        return _selector_target_down(config, pool, discovered, ups)
    # One rule on the whole pool, which covers the discovered replicas too: at the longest
    # interval, so that no replica is called down before N of its own scrapes failed.
    longest = max(discovered, *(config.scrape_interval(t) for t in targets))
    return _static_target_down(config, pool, targets, longest)


def _static_target_down(config: Config, pool: PoolConfig, targets: Sequence[TargetConfig],
                        shared: float | None = None) -> list[Rule]:
    """``TargetDown`` of the pool's ``[[targets]]``: one rule on the pool when they share an
    interval (or ``shared`` gives one, seconds), else one per target."""
    if not targets:
        return []
    intervals = {config.scrape_interval(t) for t in targets} if shared is None else {shared}
    scrapes = config.alerts.target_down_scrapes
    # One selector per distinct scrape interval: the whole pool, or each target on its own.
    selections: list[tuple[str, float]]  # (instance or "" for the pool, interval)
    if len(intervals) == 1:
        selections = [("", intervals.pop())]
    else:
        selections = [(t.name, config.scrape_interval(t)) for t in targets]
    rules = []
    for instance, interval in selections:
        matchers = {LABEL_POOL: pool.name}
        if instance:
            matchers[LABEL_INSTANCE] = instance
        rules.append(Rule(
            alert=ALERT_TARGET_DOWN,
            expr=f"{selector(SERIES_UP, matchers)} == 0",
            for_s=(scrapes - 1) * interval,
            labels={LABEL_SEVERITY: SEVERITY_TICKET, **matchers, LABEL_MODEL: pool.model},
            annotations={
                ANNOTATION_SUMMARY: "Target {{ $labels.instance }} of pool {{ $labels.pool }} "
                                    "is down",
                ANNOTATION_DESCRIPTION: (
                    f"{scrapes} scrapes in a row of the {{{{ $labels.kind }}}} target "
                    f"{{{{ $labels.instance }}}} failed (every {prom_duration(interval)})."
                ),
                ANNOTATION_DASHBOARD_URL: config.alerts.dashboard_url,
            },
            origin=Origin("target_down", pool=pool.name, instance=instance, window_s=interval,
                          severity=SEVERITY_TICKET),
        ))
    return rules


def _pool_alerts(config: Config, pool: PoolConfig, options: RulesOptions) -> tuple[Rule, ...]:
    threshold = number(config.alerts.kv_usage_high)
    replica = replica_label(pool, external=True)
    # $labels are the expression's: a selector's series have no `pool` to template.
    pool_text = pool.name if pool.has_selector else "{{ $labels.pool }}"
    kv = Rule(
        alert=ALERT_KV_CACHE_HIGH,
        expr=f"{replica_kv_usage_expr(pool)} > {threshold}",
        for_s=options.kv_alert_for_s,
        labels={LABEL_SEVERITY: SEVERITY_TICKET, LABEL_POOL: pool.name, LABEL_MODEL: pool.model},
        annotations={
            ANNOTATION_SUMMARY: f"KV cache of {{{{ $labels.{replica} }}}} "
                                f"(pool {pool_text}) is nearly full",
            ANNOTATION_DESCRIPTION: (
                f"KV-cache usage of {{{{ $labels.{replica} }}}} has been above {threshold} for "
                f"{prom_duration(options.kv_alert_for_s)}: when it is full, vLLM queues new "
                f"requests and preempts running ones (recomputed later). Add replicas to pool "
                f"{pool_text} (vigil slo status)."
            ),
            ANNOTATION_DASHBOARD_URL: config.alerts.dashboard_url,
        },
        origin=Origin("kv_high", pool=pool.name, severity=SEVERITY_TICKET),
    )
    return (kv, *_target_down(config, pool))


#: ``VigilEvaluationStale``: this many evaluation intervals without a new evaluation...
STALE_EVALUATIONS = 4
#: ...and never less than this (seconds): Prometheus's scrape of serve and the rule
#: interval add their own delay to what it sees.
MIN_STALE_S = 120.0


def stale_after(config: Config) -> float:
    """Seconds without a new evaluation before ``VigilEvaluationStale`` counts it stuck."""
    return max(STALE_EVALUATIONS * config.engine.evaluation_interval, MIN_STALE_S)


def meta_alerts(config: Config, options: RulesOptions) -> tuple[Rule, ...]:
    """The dead-man's switch (see the module docstring)."""
    stale = stale_after(config)
    watchdog = Rule(
        alert=ALERT_WATCHDOG,
        expr="vector(1)",
        labels={LABEL_SEVERITY: SEVERITY_NONE},
        annotations={
            ANNOTATION_SUMMARY: "Always firing: Vigil's alerting pipeline is alive",
            ANNOTATION_DESCRIPTION: (
                "Route this alert to a dead-man's switch (a heartbeat receiver that pages "
                "when it stops arriving): its silence means Prometheus, its rules or "
                "Alertmanager stopped, and no other alert could reach anyone."
            ),
        },
        origin=Origin("watchdog"),
    )
    stuck = Rule(
        alert=ALERT_EVALUATION_STALE,
        expr=f"time() - max({METRIC_LAST_EVALUATION}) > {number(stale)}",
        for_s=2 * options.interval_s,
        labels={LABEL_SEVERITY: SEVERITY_PAGE},
        annotations={
            ANNOTATION_SUMMARY: "vigil serve has not evaluated the SLOs for over "
                                f"{prom_duration(stale)}",
            ANNOTATION_DESCRIPTION: (
                "No copy of vigil serve finished an evaluation for more than "
                f"{prom_duration(stale)} (every {prom_duration(config.engine.evaluation_interval)}"
                " expected): none of Vigil's own alerts is evaluated or delivered. Check each "
                "copy's /healthz and log."
            ),
            ANNOTATION_DASHBOARD_URL: config.alerts.dashboard_url,
        },
        origin=Origin("evaluation_stale", window_s=stale),
    )
    return (watchdog, stuck)


def alert_rules(specs: Sequence[SloSpec], config: Config,
                options: RulesOptions) -> list[RuleGroup]:
    """The alert groups: one per SLO, one per pool, then the dead-man's switch."""
    groups = [
        RuleGroup(f"{GROUP_SLO_ALERTS}-{spec.name}", options.interval_s, _slo_alerts(spec, config))
        for spec in specs
    ]
    groups += [
        RuleGroup(f"{GROUP_POOL_ALERTS}-{pool.name}", options.interval_s,
                  _pool_alerts(config, pool, options))
        for pool in config.pools
    ]
    groups.append(RuleGroup(GROUP_META_ALERTS, options.interval_s, meta_alerts(config, options)))
    return groups
