"""Alert conditions of `vigil serve`: the status JSON (and target health) in, alerts out.

``evaluate_conditions`` is pure: the same inputs give the same alerts. The state it returns
carries what must survive from one evaluation to the next:

* the firing alerts by fingerprint, so an alert that keeps firing keeps its ``starts_at``;
* the pending alerts (a condition that holds but not yet for its hold time) with the time it
  began to hold, as Prometheus keeps an alerting rule's ``for`` (KvCacheUsageHigh:
  ``[alerts] kv_usage_high_for``, the same ``for`` as the generated rule);
* the last scaling recommendation per pool (ScalingRecommendationChanged);
* per target, the consecutive failed scrapes seen (used only when the caller does not pass
  ``down_streaks`` read from the stored ``up`` series).

An alert that fired in the previous evaluation and does not fire now is returned once with
``ends_at = now`` (resolved); the notifier resolves it at that time.

The conditions (every threshold from the config):

==============================  ========  ===============================================
alertname                       severity  fires when
==============================  ========  ===============================================
ErrorBudgetBurn                 page /    a row of ``[engine] burn_rate_alerts`` of that
                                ticket    severity fires (``slos[].alerts``), at the factor
                                          of the SLO's period
                                          (``slos[].burn_rate_alerts``)
ErrorBudgetLow                  ticket    ``budget_remaining < [alerts] budget_low_ratio``
KvCacheUsageHigh (per replica)  ticket    ``kv_cache_usage_perc > [alerts] kv_usage_high``
                                          for ``[alerts] kv_usage_high_for``
TokenAnomaly (per pool, model)  ticket    ``anomalies[]`` lists requests above the threshold
TargetDown (per target)         ticket    the last ``[alerts] target_down_scrapes`` failed
ScalingRecommendationChanged    ticket    a pool's recommendation is not ``hold``
BudgetSpent (per budget)        budget's  the month's spend reached one of its
                                          ``alert_at`` shares (labelled with the highest:
                                          crossing the next one replaces it, so each
                                          crossing is one notification; the month's end
                                          resolves it)
BudgetForecastExhausted         budget's  the trailing rate would spend it before the
(per budget)                              month ends (the date in the annotations); it
                                          resolves when the rate flattens
==============================  ========  ===============================================

The severities of KvCacheUsageHigh and TargetDown are those of the Prometheus rules that
`vigil rules prometheus` writes (alerts/rules/alerting.py), so both paths page alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from alerts.model import Alert
from slo.cost.budgets import BudgetStatus
from slo.objectives.burn_rate import status_burn_alerts
from vigil.config import Config
from vigil.conventions import (
    ALERT_BUDGET_FORECAST,
    ALERT_BUDGET_SPENT,
    ALERT_ERROR_BUDGET_BURN,
    ALERT_ERROR_BUDGET_LOW,
    ALERT_KV_CACHE_HIGH,
    ALERT_SCALING_CHANGED,
    ALERT_TARGET_DOWN,
    ALERT_TOKEN_ANOMALY,
    ANNOTATION_DASHBOARD_URL,
    ANNOTATION_DESCRIPTION,
    ANNOTATION_OBJECTIVE,
    ANNOTATION_OBSERVED,
    ANNOTATION_SUMMARY,
    LABEL_ALERTNAME,
    LABEL_BUDGET,
    LABEL_INSTANCE,
    LABEL_MODEL,
    LABEL_MONTH,
    LABEL_POOL,
    LABEL_SEVERITY,
    LABEL_SHARE,
    LABEL_SLO,
    LABEL_TENANT,
    LABEL_TIER,
    SEVERITY_TICKET,
)
from vigil.durations import format_duration
from vigil.model import TargetHealth

__all__ = ["ConditionState", "evaluate_conditions"]

#: The scaling action that raises nothing.
_HOLD = "hold"


@dataclass(frozen=True)
class ConditionState:
    """What one evaluation hands to the next (see the module docstring). Treat as immutable.

    ``firing``: fingerprint -> firing alert. ``scaling``: pool -> (action, desired replicas)
    of the last evaluation. ``down``: target -> (last scrape time seen, Unix seconds;
    consecutive failed scrapes).
    """

    firing: Mapping[str, Alert] = field(default_factory=dict)
    #: fingerprint -> when its condition began to hold (Unix seconds), while it waits for
    #: its hold time before firing.
    pending: Mapping[str, float] = field(default_factory=dict)
    scaling: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    down: Mapping[str, tuple[float, int]] = field(default_factory=dict)


@dataclass
class _Candidate:
    """An alert that holds now, before ``starts_at`` is settled from the previous state."""

    labels: dict[str, str]
    annotations: dict[str, str]
    #: How long the condition must hold before the alert fires (seconds; 0 = at once).
    hold_s: float = 0.0


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def _num(x: float) -> str:
    return f"{x:.4g}"


def _base_labels(name: str, severity: str, pool: str, model: str, slo: str = "") -> dict[str, str]:
    return {LABEL_ALERTNAME: name, LABEL_SEVERITY: severity, LABEL_POOL: pool,
            LABEL_MODEL: model, LABEL_SLO: slo}


def _burn_alerts(config: Config, status: Mapping[str, Any]) -> list[_Candidate]:
    """ErrorBudgetBurn (page / ticket) and ErrorBudgetLow, from ``status["slos"]``."""
    dashboard = config.alerts.dashboard_url
    low = config.alerts.budget_low_ratio
    out: list[_Candidate] = []
    for slo in status.get("slos") or []:
        windows: Mapping[str, Any] = slo.get("windows") or {}
        objective = slo.get("objective")
        obj_text = "–" if objective is None else _pct(objective)

        def burn(w: float, windows: Mapping[str, Any] = windows) -> float | None:
            return (windows.get(format_duration(w)) or {}).get("burn_rate")

        table = status_burn_alerts(slo, config.engine.burn_rate_alerts) \
            if slo.get("alerts") else []
        for severity in dict.fromkeys(slo.get("alerts") or []):
            # The rows of this severity that fire: both windows strictly above the SLO's
            # factor, as slo.objectives.burn_rate decides; they give the numbers of the description.
            rows = []
            for r in table:
                if r.severity != severity:
                    continue
                long_b, short_b = burn(r.long_window), burn(r.short_window)
                if long_b is not None and short_b is not None and \
                        long_b > r.factor and short_b > r.factor:
                    rows.append((r, long_b, short_b))
            detail = "; ".join(
                f"burn rate {_num(lb)} over {format_duration(r.long_window)} and {_num(sb)} "
                f"over {format_duration(r.short_window)} > {_num(r.factor)}"
                for r, lb, sb in rows
            ) or "the burn-rate table fires"
            observed = f"{_num(rows[0][1])}x" if rows else "–"
            out.append(_Candidate(
                _base_labels(ALERT_ERROR_BUDGET_BURN, severity, slo["pool"], slo.get("model")
                             or "", slo["name"]),
                {
                    ANNOTATION_SUMMARY: f"SLO {slo['name']} burns its error budget too fast "
                                        f"({severity})",
                    ANNOTATION_DESCRIPTION: (
                        f"The {slo.get('indicator')} SLO {slo['name']} of pool {slo['pool']} "
                        f"(objective {obj_text}) burns its error budget: {detail}. "
                        f"Budget remaining: "
                        f"{_fmt_ratio(slo.get('budget_remaining'))}."
                    ),
                    ANNOTATION_DASHBOARD_URL: dashboard,
                    ANNOTATION_OBSERVED: observed,
                    ANNOTATION_OBJECTIVE: obj_text,
                },
            ))
        remaining = slo.get("budget_remaining")
        if remaining is not None and remaining < low:
            out.append(_Candidate(
                _base_labels(ALERT_ERROR_BUDGET_LOW, SEVERITY_TICKET, slo["pool"],
                             slo.get("model") or "", slo["name"]),
                {
                    ANNOTATION_SUMMARY: f"SLO {slo['name']} has little error budget left",
                    ANNOTATION_DESCRIPTION: (
                        f"{_pct(remaining)} of the {slo.get('period')} error budget of SLO "
                        f"{slo['name']} (pool {slo['pool']}, objective {obj_text}) is left, "
                        f"below {_pct(low)}."
                    ),
                    ANNOTATION_DASHBOARD_URL: dashboard,
                    ANNOTATION_OBSERVED: _pct(remaining),
                    ANNOTATION_OBJECTIVE: f">= {_pct(low)}",
                },
            ))
    return out


def _fmt_ratio(x: float | None) -> str:
    return "–" if x is None else _pct(x)


def _pool_model(config: Config, pool: str) -> str:
    try:
        return config.pool(pool).model
    except KeyError:
        return ""


def _kv_alerts(config: Config, status: Mapping[str, Any],
               kv_usage: Mapping[tuple[str, str], float] | None) -> list[_Candidate]:
    """KvCacheUsageHigh per replica; without per-replica values, per pool from ``.max``."""
    limit = config.alerts.kv_usage_high
    if kv_usage is None:
        # The pool's busiest replica stands in (instance unknown): still fires, one per pool.
        kv_usage = {
            (pool, ""): block["kv_cache_usage"]["max"]
            for pool, block in (status.get("pools") or {}).items()
            if (block.get("kv_cache_usage") or {}).get("max") is not None
        }
    out = []
    for (pool, instance), value in sorted(kv_usage.items()):
        if value is None or not value > limit:
            continue
        labels = _base_labels(ALERT_KV_CACHE_HIGH, SEVERITY_TICKET, pool,
                              _pool_model(config, pool))
        labels[LABEL_INSTANCE] = instance
        who = f"replica {instance}" if instance else "the busiest replica"
        out.append(_Candidate(labels, {
            ANNOTATION_SUMMARY: f"KV cache of {who} (pool {pool}) is nearly full",
            ANNOTATION_DESCRIPTION: (
                f"KV-cache usage of {who} in pool {pool} is {_pct(value)}, above "
                f"{_pct(limit)}: when it is full, vLLM queues new requests and preempts "
                f"running ones (recomputed later). Add replicas (vigil slo status)."
            ),
            ANNOTATION_DASHBOARD_URL: config.alerts.dashboard_url,
            ANNOTATION_OBSERVED: _pct(value),
            ANNOTATION_OBJECTIVE: f"<= {_pct(limit)}",
        }, hold_s=config.alerts.kv_usage_high_for))
    return out


def _anomaly_alerts(config: Config, status: Mapping[str, Any]) -> list[_Candidate]:
    """TokenAnomaly: one alert per pool and model, however many requests (grouped)."""
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for a in status.get("anomalies") or []:
        grouped.setdefault((a.get("pool") or "", a.get("model") or ""), []).append(a)
    out = []
    for (pool, model), entries in sorted(grouped.items()):
        requests = sum(int(e.get("requests_above") or (1 if e.get("id") else 0))
                       for e in entries)
        if requests <= 0:
            continue
        first = entries[0]
        threshold = first.get("threshold_tokens")
        mean = first.get("mean_tokens_per_request")
        mult = first.get("token_multiplier", config.anomaly.token_multiplier)
        limit = "–" if threshold is None else f"{threshold:.0f} tokens"
        mean_text = "–" if mean is None else f"{mean:.0f}"
        out.append(_Candidate(
            _base_labels(ALERT_TOKEN_ANOMALY, SEVERITY_TICKET, pool, model),
            {
                ANNOTATION_SUMMARY: f"{requests} request(s) of {model} (pool {pool}) used "
                                    f"more than {_num(mult)}x the mean tokens",
                ANNOTATION_DESCRIPTION: (
                    f"At least {requests} request(s) to {model} in pool {pool} over the last "
                    f"{first.get('window', format_duration(config.anomaly.window))} had more "
                    f"than {limit} ({_num(mult)} x the mean of {mean_text} tokens per request)."
                ),
                ANNOTATION_DASHBOARD_URL: config.alerts.dashboard_url,
                ANNOTATION_OBSERVED: f"{requests} request(s)",
                ANNOTATION_OBJECTIVE: f"<= {limit}",
            },
        ))
    return out


def _scaling_alerts(config: Config, status: Mapping[str, Any],
                    previous: Mapping[str, tuple[str, int]]
                    ) -> tuple[list[_Candidate], dict[str, tuple[str, int]]]:
    """ScalingRecommendationChanged while a pool's recommendation is not ``hold``.

    A move away from ``hold`` (or to another action) raises it; it resolves when the
    recommendation is ``hold`` again, i.e. the fleet was resized or the load went away.
    """
    out = []
    seen: dict[str, tuple[str, int]] = {}
    for pool, block in sorted((status.get("pools") or {}).items()):
        rec = block.get("scaling")
        if not rec or rec.get("action") is None:
            continue
        action, desired, current = rec["action"], int(rec["desired"]), rec.get("current")
        seen[pool] = (action, desired)
        if action == _HOLD:
            continue
        before = previous.get(pool)
        reasons = "; ".join(rec.get("reasons") or []) or "no reason given"
        was = "" if before is None else f" (was {before[0]} to {before[1]})"
        labels = _base_labels(ALERT_SCALING_CHANGED, SEVERITY_TICKET, pool,
                              _pool_model(config, pool))
        out.append(_Candidate(labels, {
            ANNOTATION_SUMMARY: f"Pool {pool}: {action} from {current} to {desired} replicas",
            ANNOTATION_DESCRIPTION: (
                f"The scaling recommendation of pool {pool} is {action}: {current} -> "
                f"{desired} replicas{was}. Reasons: {reasons}."
            ),
            ANNOTATION_DASHBOARD_URL: config.alerts.dashboard_url,
            ANNOTATION_OBSERVED: f"{current} replicas",
            ANNOTATION_OBJECTIVE: f"{desired} replicas",
        }))
    return out, seen


def _budget_alerts(config: Config, budgets: Iterable[BudgetStatus]) -> list[_Candidate]:
    """BudgetSpent at the highest share crossed, BudgetForecastExhausted while the trailing
    rate would spend the budget this month (see the module docstring)."""
    out = []
    for b in budgets:
        cur = b.currency
        base = {**_base_labels(ALERT_BUDGET_SPENT, b.severity, b.pool, ""),
                LABEL_BUDGET: b.name, LABEL_TENANT: b.tenant, LABEL_TIER: b.tier,
                LABEL_MONTH: b.month}
        spent = f"{b.spent:.2f} {cur} of {b.monthly:.2f} {cur}"
        forecast = ("" if b.forecast is None else
                    f" At the trailing rate the month ends at {b.forecast:.2f} {cur}.")
        if b.crossed is not None:
            share = f"{b.crossed * 100:g}%"
            out.append(_Candidate({**base, LABEL_SHARE: share}, {
                ANNOTATION_SUMMARY: f"Budget {b.name}: {share} spent for {b.month}",
                ANNOTATION_DESCRIPTION: (f"Budget {b.name} (tenant {b.tenant}) has spent "
                                         f"{spent} ({b.share * 100:.1f}%) in {b.month}."
                                         + forecast),
                ANNOTATION_DASHBOARD_URL: config.alerts.dashboard_url,
                ANNOTATION_OBSERVED: f"{b.spent:.2f} {cur}",
                ANNOTATION_OBJECTIVE: f"{b.monthly:.2f} {cur}",
            }))
        if b.exhausted_at is not None and any(
                c.forecast for c in config.budgets if c.display_name() == b.name):
            when = datetime.fromtimestamp(b.exhausted_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
            out.append(_Candidate({**base, LABEL_ALERTNAME: ALERT_BUDGET_FORECAST}, {
                ANNOTATION_SUMMARY: f"Budget {b.name} would run out on {when}",
                ANNOTATION_DESCRIPTION: (f"Budget {b.name} (tenant {b.tenant}) has spent "
                                         f"{spent} in {b.month}; at the trailing rate it is "
                                         f"spent on {when}, before the month ends." + forecast),
                ANNOTATION_DASHBOARD_URL: config.alerts.dashboard_url,
                ANNOTATION_OBSERVED: f"{b.forecast or 0.0:.2f} {cur} by the month's end",
                ANNOTATION_OBJECTIVE: f"{b.monthly:.2f} {cur}",
            }))
    return out


def _target_alerts(config: Config, targets: Iterable[TargetHealth],
                   previous: Mapping[str, tuple[float, int]],
                   down_streaks: Mapping[str, int] | None
                   ) -> tuple[list[_Candidate], dict[str, tuple[float, int]]]:
    """TargetDown for each target whose last ``target_down_scrapes`` scrapes failed.

    ``down_streaks`` (target -> consecutive failed scrapes, from the stored ``up`` series)
    wins; otherwise each new ``last_scrape`` seen counts one scrape, which undercounts when
    scrapes are more frequent than evaluations (the alert then comes late, never early).
    """
    n = config.alerts.target_down_scrapes
    out = []
    state: dict[str, tuple[float, int]] = {}
    for h in sorted(targets, key=lambda h: h.target):
        last, streak = previous.get(h.target, (0.0, 0))
        if h.last_scrape != last and not h.never_scraped:
            streak = 0 if h.up else streak + 1
        state[h.target] = (h.last_scrape, streak)
        if down_streaks is not None and h.target in down_streaks:
            streak = down_streaks[h.target]
        if streak < n or h.up:
            continue
        labels = _base_labels(ALERT_TARGET_DOWN, SEVERITY_TICKET, h.pool,
                              _pool_model(config, h.pool))
        labels[LABEL_INSTANCE] = h.target
        out.append(_Candidate(labels, {
            ANNOTATION_SUMMARY: f"Target {h.target} of pool {h.pool} is down",
            ANNOTATION_DESCRIPTION: (
                f"The last {streak} scrapes of the {h.kind} target {h.target} failed "
                f"(threshold {n}): {h.error or 'no error text'}."
            ),
            ANNOTATION_DASHBOARD_URL: config.alerts.dashboard_url,
            ANNOTATION_OBSERVED: f"{streak} failed scrapes",
            ANNOTATION_OBJECTIVE: f"< {n} failed scrapes",
        }))
    return out, state


def evaluate_conditions(
    config: Config,
    status: Mapping[str, Any],
    targets: Iterable[TargetHealth],
    previous: ConditionState,
    now: float,
    *,
    kv_usage: Mapping[tuple[str, str], float] | None = None,
    down_streaks: Mapping[str, int] | None = None,
    budgets: Iterable[BudgetStatus] = (),
) -> tuple[list[Alert], ConditionState]:
    """Every alert condition at ``now`` (Unix seconds).

    ``status``: ``slo.status.evaluate``'s dict. ``targets``: the store's target health.
    ``kv_usage``: ``{(pool, instance): ratio 0-1}`` per replica
    (``slo.scaling.signals.kv_usage_of_fleet``);
    without it the pool's max stands in. ``down_streaks``: consecutive failed scrapes per
    target. ``budgets``: every budget's status now (``slo.cost.budgets``). Returns the firing
    alerts plus those resolved now (``ends_at = now``), and the state for the next call.
    """
    candidates = _burn_alerts(config, status)
    candidates += _kv_alerts(config, status, kv_usage)
    candidates += _anomaly_alerts(config, status)
    scaling_alerts, scaling_state = _scaling_alerts(config, status, previous.scaling)
    candidates += scaling_alerts
    target_alerts, down_state = _target_alerts(config, targets, previous.down, down_streaks)
    candidates += target_alerts
    candidates += _budget_alerts(config, budgets)

    firing: dict[str, Alert] = {}
    pending: dict[str, float] = {}
    for c in candidates:
        alert = Alert(c.labels, c.annotations, starts_at=now)
        before = previous.firing.get(alert.fingerprint)
        if before is not None:
            # Still the same alert (same labels): it keeps the time it started firing, with
            # today's values in its annotations.
            alert = Alert(alert.labels, alert.annotations, starts_at=before.starts_at)
        elif c.hold_s > 0:
            # Prometheus's ``for``: the alert fires once its condition has held for the hold
            # time, and its startsAt is when it began to hold (the rule's activeAt).
            since = previous.pending.get(alert.fingerprint, now)
            if now - since < c.hold_s:
                pending[alert.fingerprint] = since
                continue
            alert = Alert(alert.labels, alert.annotations, starts_at=since)
        firing.setdefault(alert.fingerprint, alert)
    resolved = [a.resolved_at(now) for fp, a in sorted(previous.firing.items())
                if fp not in firing]
    alerts = sorted(firing.values(), key=lambda a: a.fingerprint) + resolved
    return alerts, ConditionState(firing=firing, pending=pending, scaling=scaling_state,
                                  down=down_state)
