"""The ``/metrics`` of `vigil serve`: ``vigil_*`` series from the latest evaluation.

``Exporter`` owns a ``CollectorRegistry`` of its own (never the global one, so tests and
several exporters in one process do not collide). Its collector yields every series from the
latest ``Snapshot`` at scrape time: a value the status JSON gives as ``null`` is simply not
exported (absent, never 0), and a pool or SLO that disappears from the status disappears from
``/metrics`` at once instead of staying stale-but-present as a labelled ``Gauge`` would.

``update`` replaces the snapshot reference in one assignment, so a scrape running on the HTTP
thread sees either the old snapshot or the new one, never a mix.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from alerts.model import Alert
from alerts.notifier import NotifierCounters
from slo.cost.budgets import BudgetStatus
from vigil.conventions import (
    LABEL_ACTION,
    LABEL_ALERTNAME,
    LABEL_BUDGET,
    LABEL_COPY,
    LABEL_CURRENCY,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_MODEL_NAME,
    LABEL_POOL,
    LABEL_QUANTILE,
    LABEL_ROUTE,
    LABEL_SEVERITY,
    LABEL_SIGNAL,
    LABEL_SLO,
    LABEL_STAT,
    LABEL_TENANT,
    LABEL_WINDOW,
    METRIC_ALERTS_FIRING,
    METRIC_ANOMALOUS_REQUESTS,
    METRIC_BUDGET_AMOUNT,
    METRIC_BUDGET_FORECAST,
    METRIC_BUDGET_REMAINING,
    METRIC_BUDGET_SPENT,
    METRIC_BUDGET_SPENT_RATIO,
    METRIC_BURN_RATE,
    METRIC_COST_PER_1000,
    METRIC_COST_PER_MILLION_TOKENS,
    METRIC_CURRENT_REPLICAS,
    METRIC_DESIRED_REPLICAS,
    METRIC_EVALUATION_DURATION,
    METRIC_EVALUATION_FAILURES,
    METRIC_EVALUATION_SUCCESS,
    METRIC_KV_USAGE,
    METRIC_LAST_EVALUATION,
    METRIC_LATENCY,
    METRIC_NOTIFICATION_FAILURES,
    METRIC_NOTIFICATION_OLDEST_AGE,
    METRIC_NOTIFICATION_QUEUE_DEPTH,
    METRIC_NOTIFICATIONS_DELIVERED,
    METRIC_NOTIFICATIONS_GIVEN_UP,
    METRIC_OBJECTIVE,
    METRIC_QUEUE_LENGTH,
    METRIC_SCALING_ACTION,
    METRIC_SERVE_LEADER,
    METRIC_SERVE_LEADER_CHANGES,
    METRIC_SERVE_LEASE_TERM,
    METRIC_SLI_ERROR_RATIO,
    METRIC_SLO_RECORDED,
    METRIC_TARGET_SCRAPE_DURATION,
    METRIC_TARGET_UP,
    METRIC_TENANT_COST,
    SCALING_ACTIONS,
)
from vigil.model import TargetHealth

__all__ = ["Exporter", "LeaderRole", "Snapshot", "VigilCollector"]

_SLO_LABELS = [LABEL_SLO, LABEL_POOL, LABEL_MODEL_NAME]
#: ``"p95"`` (status JSON) -> ``"0.95"`` (Prometheus's quantile label convention).
_QUANTILE_LABEL = {"p50": "0.5", "p90": "0.9", "p95": "0.95", "p99": "0.99"}
_SECONDS = "_seconds"


@dataclass(frozen=True)
class Snapshot:
    """Everything ``/metrics`` shows, as of one evaluation (plus the notifier's counters and
    target health, which may be fresher). ``status``: ``slo.status.evaluate``'s dict or
    None before the first evaluation; ``evaluation_duration``: seconds;
    ``evaluated_at``: Unix seconds (None before the first evaluation)."""

    status: Mapping[str, Any] | None = None
    alerts: Sequence[Alert] = ()
    counters: NotifierCounters | None = None
    targets: Sequence[TargetHealth] = ()
    evaluation_duration: float | None = None
    evaluated_at: float | None = None
    #: Every route name, so that counters of a route that never sent exist at 0 (counters
    #: that appear late make ``rate()`` miss the first increase).
    routes: Sequence[str] = field(default_factory=tuple)
    #: With several copies on a shared database: this copy's role, else None.
    leadership: LeaderRole | None = None
    #: Whether the last evaluation succeeded (None before the first), and how many failed
    #: since the process started.
    evaluation_ok: bool | None = None
    evaluation_failures: int = 0
    #: This month's cost per ``(tenant, pool)``, tenants bounded (``slo.cost.ledger
    #: .top_tenants``), and every budget's status, in ``currency``.
    tenant_costs: Sequence[tuple[str, str, float]] = ()
    budgets: Sequence[BudgetStatus] = ()
    currency: str = "USD"


@dataclass(frozen=True)
class LeaderRole:
    """This copy's part in the leader's lease: its name, whether it leads, the lease's
    current term (0 before any) and how often this copy took the lead."""

    copy: str
    leader: bool
    term: int
    acquisitions: int


def _cost_families(snap: Snapshot) -> Iterator[Metric]:
    """The chargeback: each tenant's cost this month (a counter that starts again with each
    month), and every budget's amount, spend, share and forecast."""
    cur = snap.currency
    cost = CounterMetricFamily(METRIC_TENANT_COST, f"GPU cost attributed to the tenant this "
                               f"month ({cur}; idle and unattributed as their own tenants)",
                               labels=[LABEL_TENANT, LABEL_POOL, LABEL_CURRENCY])
    for tenant, pool, value in snap.tenant_costs:
        cost.add_metric([tenant, pool, cur], value)
    yield cost
    labels = [LABEL_BUDGET, LABEL_TENANT, LABEL_CURRENCY]
    amount = _gauge(METRIC_BUDGET_AMOUNT, f"The monthly budget ({cur})", labels)
    spent = _gauge(METRIC_BUDGET_SPENT, f"What the budget spent this month ({cur})", labels)
    ratio = _gauge(METRIC_BUDGET_SPENT_RATIO, "Spent over the amount (1 = spent)", labels)
    forecast = _gauge(METRIC_BUDGET_FORECAST, f"Spend at the month's end at the trailing rate "
                      f"({cur})", labels)
    for b in snap.budgets:
        key = [b.name, b.tenant, cur]
        _add(amount, key, b.monthly)
        _add(spent, key, b.spent)
        _add(ratio, key, b.share)
        _add(forecast, key, b.forecast)
    yield from (amount, spent, ratio, forecast)


def _leader_families(role: LeaderRole) -> Iterator[Metric]:
    leader = _gauge(METRIC_SERVE_LEADER, "1 on the copy of vigil serve that holds the leader's "
                    "lease (it delivers the alerts), 0 on the copies standing by", [LABEL_COPY])
    leader.add_metric([role.copy], 1.0 if role.leader else 0.0)
    term = _gauge(METRIC_SERVE_LEASE_TERM, "The leader's lease term as this copy last saw it "
                  "(it grows by one at every change of leader)", [LABEL_COPY])
    term.add_metric([role.copy], float(role.term))
    taken = CounterMetricFamily(METRIC_SERVE_LEADER_CHANGES,
                                "Times this copy took the leader's lease", labels=[LABEL_COPY])
    taken.add_metric([role.copy], float(role.acquisitions))
    yield from (leader, term, taken)


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _add(family: GaugeMetricFamily, labels: Sequence[str], value: Any) -> None:
    """Add a sample unless the value is null (null in the status means absent, not 0)."""
    if value is None or isinstance(value, bool):
        return
    family.add_metric(list(labels), float(value))


def _slo_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    sli = _gauge(METRIC_SLI_ERROR_RATIO,
                 "SLO error ratio (bad/total, 0-1) over the window", [*_SLO_LABELS, LABEL_WINDOW])
    burn = _gauge(METRIC_BURN_RATE, "SLO burn rate over the window (1 = exactly on budget)",
                  [*_SLO_LABELS, LABEL_WINDOW])
    budget = _gauge(METRIC_BUDGET_REMAINING,
                    "Error budget remaining over the SLO period (1 untouched, <0 overspent)",
                    _SLO_LABELS)
    objective = _gauge(METRIC_OBJECTIVE, "SLO objective (ratio of good events, 0-1)",
                       _SLO_LABELS)
    recorded = _gauge(METRIC_SLO_RECORDED, "1 when the SLO's ratios are the store's recorded "
                      "series, 0 when computed from raw series", _SLO_LABELS)
    reading = status.get("recorded_rules") is not None
    for slo in status.get("slos") or []:
        base = [slo.get("name") or "", slo.get("pool") or "", slo.get("model") or ""]
        if reading:
            recorded.add_metric(base, 1.0 if slo.get("read") == "recorded" else 0.0)
        windows = slo.get("windows") or {}
        for window, values in windows.items():
            _add(sli, [*base, window], values.get("error_ratio"))
            _add(burn, [*base, window], values.get("burn_rate"))
        period = slo.get("period")
        if period and period not in windows:
            _add(sli, [*base, period], slo.get("period_error_ratio"))
        _add(budget, base, slo.get("budget_remaining"))
        _add(objective, base, slo.get("objective"))
    yield from (sli, burn, budget, objective)
    if reading:
        yield recorded


def _pool_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    latency = _gauge(METRIC_LATENCY, "Latency quantile over the engine window (seconds)",
                     [LABEL_POOL, LABEL_MODEL_NAME, LABEL_SIGNAL, LABEL_QUANTILE])
    per_1000 = _gauge(METRIC_COST_PER_1000, "GPU cost per 1000 requests over the cost window "
                      "(USD)", [LABEL_POOL])
    per_million = _gauge(METRIC_COST_PER_MILLION_TOKENS, "GPU cost per million output tokens "
                         "over the cost window (USD)", [LABEL_POOL])
    desired = _gauge(METRIC_DESIRED_REPLICAS, "Recommended replicas (KEDA reads this)",
                     [LABEL_POOL])
    current = _gauge(METRIC_CURRENT_REPLICAS, "Replicas the recommendation started from",
                     [LABEL_POOL])
    action = _gauge(METRIC_SCALING_ACTION, "1 for the pool's current scaling action, else 0",
                    [LABEL_POOL, LABEL_ACTION])
    kv = _gauge(METRIC_KV_USAGE, "KV-cache usage over the pool's replicas (ratio 0-1)",
                [LABEL_POOL, LABEL_STAT])
    queue = _gauge(METRIC_QUEUE_LENGTH, "Requests waiting in the pool (sum over replicas)",
                   [LABEL_POOL])
    for pool, block in sorted((status.get("pools") or {}).items()):
        for model, m in sorted((block.get("models") or {}).items()):
            for signal, qs in sorted((m.get("quantiles") or {}).items()):
                if not isinstance(qs, Mapping):
                    continue  # the "window" entry
                name = signal[: -len(_SECONDS)] if signal.endswith(_SECONDS) else signal
                for q, value in sorted(qs.items()):
                    if not q.startswith("p"):
                        continue  # "source", "bounds", "count", "histogram" beside the figures
                    _add(latency, [pool, model, name, _QUANTILE_LABEL.get(q, q)], value)
        cost = block.get("cost") or {}
        _add(per_1000, [pool], cost.get("per_1000_requests"))
        _add(per_million, [pool], cost.get("per_million_output_tokens"))
        rec = block.get("scaling")
        if rec:
            _add(desired, [pool], rec.get("desired"))
            _add(current, [pool], rec.get("current"))
            if rec.get("action") is not None:
                # Every action present (0 or 1): KEDA and PromQL can select `== 1` reliably.
                for a in dict.fromkeys((*SCALING_ACTIONS, rec["action"])):
                    action.add_metric([pool, a], 1.0 if a == rec["action"] else 0.0)
        for stat, value in sorted((block.get("kv_cache_usage") or {}).items()):
            _add(kv, [pool, stat], value)
        _add(queue, [pool], block.get("queue_length"))
    yield from (latency, per_1000, per_million, desired, current, action, kv, queue)


def _anomaly_family(status: Mapping[str, Any]) -> Metric:
    fam = _gauge(METRIC_ANOMALOUS_REQUESTS, "Requests above the token anomaly threshold in the "
                 "anomaly window (a lower bound for histogram_lower_bound)",
                 [LABEL_POOL, LABEL_MODEL_NAME, LABEL_KIND])
    sums: dict[tuple[str, str, str], float] = {}
    for a in status.get("anomalies") or []:
        key = (a.get("pool") or "", a.get("model") or "", a.get("kind") or "")
        n = a.get("requests_above")
        sums[key] = sums.get(key, 0.0) + (float(n) if n is not None else 1.0)
    for key, n in sorted(sums.items()):
        fam.add_metric(list(key), n)
    return fam


def _alert_family(alerts: Iterable[Alert]) -> Metric:
    fam = _gauge(METRIC_ALERTS_FIRING, "Alerts firing at the last evaluation",
                 [LABEL_ALERTNAME, LABEL_SEVERITY])
    counts: dict[tuple[str, str], int] = {}
    for a in alerts:
        if a.firing:
            key = (a.name, a.labels.get(LABEL_SEVERITY, ""))
            counts[key] = counts.get(key, 0) + 1
    for key, n in sorted(counts.items()):
        fam.add_metric(list(key), float(n))
    return fam


def _notifier_families(counters: NotifierCounters, routes: Sequence[str]) -> Iterator[Metric]:
    for name, doc, per_route in (
        (METRIC_NOTIFICATIONS_DELIVERED, "Notifications acknowledged (2xx) by the route",
         counters.delivered),
        (METRIC_NOTIFICATION_FAILURES, "Failed delivery attempts (each retry counts)",
         counters.failed_attempts),
        (METRIC_NOTIFICATIONS_GIVEN_UP, "Notifications dropped after [alerts] max_age",
         counters.given_up),
    ):
        fam = CounterMetricFamily(name, doc, labels=[LABEL_ROUTE])
        for route in sorted(set(routes) | set(per_route)):
            fam.add_metric([route], float(per_route.get(route, 0)))
        yield fam
    depth = _gauge(METRIC_NOTIFICATION_QUEUE_DEPTH, "Notifications waiting in the outbox", [])
    depth.add_metric([], float(counters.queue_depth))
    age = _gauge(METRIC_NOTIFICATION_OLDEST_AGE,
                 "Age of the oldest undelivered notification (seconds; 0 when none)", [])
    age.add_metric([], float(counters.oldest_undelivered_age))
    yield from (depth, age)


def _target_families(targets: Iterable[TargetHealth]) -> Iterator[Metric]:
    labels = [LABEL_INSTANCE, LABEL_POOL, LABEL_KIND]
    up = _gauge(METRIC_TARGET_UP, "1 if the target's last scrape succeeded, else 0", labels)
    duration = _gauge(METRIC_TARGET_SCRAPE_DURATION, "Duration of the target's last scrape "
                      "(seconds)", labels)
    for h in sorted(targets, key=lambda h: h.target):
        if h.never_scraped:
            continue  # no scrape yet: unknown, not down
        up.add_metric([h.target, h.pool, h.kind], 1.0 if h.up else 0.0)
        duration.add_metric([h.target, h.pool, h.kind], float(h.duration))
    yield from (up, duration)


class VigilCollector(Collector):
    """A prometheus_client collector yielding from the exporter's current snapshot."""

    def __init__(self, exporter: Exporter):
        self._exporter = exporter

    def collect(self) -> Iterable[Metric]:
        snap = self._exporter.snapshot
        status = snap.status or {}
        yield from _slo_families(status)
        yield from _pool_families(status)
        yield _anomaly_family(status)
        yield _alert_family(snap.alerts)
        if snap.counters is not None:
            yield from _notifier_families(snap.counters, snap.routes)
        yield from _target_families(snap.targets)
        ev = _gauge(METRIC_EVALUATION_DURATION, "How long the last evaluation took (seconds)",
                    [])
        _add(ev, [], snap.evaluation_duration)
        last = _gauge(METRIC_LAST_EVALUATION, "When the last evaluation finished "
                      "(Unix seconds)", [])
        _add(last, [], snap.evaluated_at)
        ok = _gauge(METRIC_EVALUATION_SUCCESS, "1 if the last evaluation succeeded, 0 if it "
                    "failed (its reason is on /healthz and in the log)", [])
        failed = CounterMetricFamily(METRIC_EVALUATION_FAILURES, "Evaluations that failed "
                                     "(the source unreachable or refusing)", labels=[])
        if snap.evaluation_ok is not None:  # nothing to say before the first evaluation
            ok.add_metric([], 1.0 if snap.evaluation_ok else 0.0)
            failed.add_metric([], float(snap.evaluation_failures))
        yield from (ev, last, ok, failed)
        if snap.leadership is not None:
            yield from _leader_families(snap.leadership)
        if snap.tenant_costs or snap.budgets:
            yield from _cost_families(snap)


class Exporter:
    """A registry of its own whose only collector exports the latest ``Snapshot``."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(VigilCollector(self))

    def update(self, snapshot: Snapshot) -> None:
        """Publish a new snapshot (one reference assignment: scrapes never see a mix)."""
        self.snapshot = snapshot

    def exposition(self) -> bytes:
        """The text exposition (format 0.0.4) of the current snapshot."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
