"""Routes and aggregation groups with Alertmanager's semantics, on an injected clock.

``Grouper.step(now, active_alerts)`` is deterministic: the same calls with the same times give
the same notifications. It mirrors Alertmanager 0.25 (``dispatch/dispatch.go`` and the dedup
stage of ``notify/notify.go``):

* **Routes** are tried in order; a route matches when every ``match`` label equals the
  alert's (a missing label is ""), and matching stops at the first match unless the route
  has ``continue_matching`` (Alertmanager's ``continue``). An alert no route matches is
  counted as unrouted and goes nowhere.
* **Groups**: per route, alerts with the same values of the ``group_by`` labels form one
  aggregation group (``"..."`` in ``group_by`` groups by every label). Its key is
  Alertmanager's: ``{}/{<route matchers>}:{<group labels>}``.
* **group_wait**: a new group is first flushed ``group_wait`` seconds after it was created,
  or at once if one of its alerts started more than ``group_wait`` ago (Alertmanager does
  this so that alerts re-sent after a restart are not held back again).
* **group_interval**: after each flush the group is flushed again ``group_interval`` seconds
  later. A flush notifies when the group has firing alerts not in the last notification;
  when every alert resolved (and the last notification had firing ones); when some
  resolved and ``send_resolved``; or when nothing changed but the last notification is more
  than ``repeat_interval`` old. So ``repeat_interval`` takes effect at the first flush after
  it elapsed, exactly as in Alertmanager.
* **Resolution**: an alert that was active and is no longer passed to ``step`` (or is
  passed with ``ends_at`` set) is resolved at that time. Resolved alerts leave the group at
  its next flush; a group with no alerts left disappears.
* With ``send_resolved = false`` resolved alerts are left out of the payloads, and an
  "all resolved" flush updates the state without sending anything.

Routes of format ``alertmanager_api`` forward to a real Alertmanager, which groups by itself:
they get no aggregation groups but one *stream* per route. A stream posts a snapshot of every
matching firing alert (plus alerts resolved in the last ``API_RESOLVED_RETENTION``) whenever
that set changes, and at least every ``API_RESEND_INTERVAL`` while it is not empty.

Grouping happens only when ``step`` is called: timers fire at the first ``step`` at or after
their time. ``next_wakeup()`` says when the next one is due.

**Notification log across restarts** (Alertmanager's nflog): ``Plan.log_changes()`` gives the
log entries a plan writes (per route and group key: the firing and resolved fingerprints
last notified, when, and the firing alerts themselves) and the entries it removes (groups
that disappeared); the notifier stores them with the notifications, in one transaction.
``Grouper.restore(entries)`` rebuilds the groups from them in a new process: a restored
group counts as flushed (no new group_wait; next flush ``group_interval`` after the logged
notification), notifies again only when its set differs from the logged one or
``repeat_interval`` passed since the logged time, and its alerts that are no longer active
at the first ``step`` resolve then.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from alerts.formats import API_RESEND_INTERVAL, API_RESOLVED_RETENTION
from alerts.model import Alert, Notification, labelset_string
from vigil.config import AlertRouteConfig
from vigil.conventions import FORMAT_ALERTMANAGER_API

__all__ = [
    "GroupState",
    "Grouper",
    "LogEntry",
    "Plan",
    "Router",
    "group_key",
    "group_labels",
    "route_key",
]

#: ``group_by = ["..."]`` groups by every label, as in Alertmanager.
GROUP_BY_ALL = "..."


def _matcher_value(value: str) -> str:
    # Alertmanager 0.25 prints matcher values with backslash, quote and newline escaped.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def route_key(route: AlertRouteConfig) -> str:
    """Alertmanager's key of a route that is a direct child of the root route.

    ``{}`` is the root (no matchers); the child adds ``/{name="value",...}``, its equality
    matchers sorted by name and joined without spaces.
    """
    matchers = ",".join(f"{k}={_matcher_value(v)}" for k, v in sorted(route.match.items()))
    return "{}/{" + matchers + "}"


def group_labels(route: AlertRouteConfig, labels: Mapping[str, str]) -> dict[str, str]:
    """The ``group_by`` labels of an alert (only those it has)."""
    if GROUP_BY_ALL in route.group_by:
        return dict(labels)
    return {k: labels[k] for k in route.group_by if k in labels}


def group_key(route: AlertRouteConfig, labels: Mapping[str, str]) -> str:
    """Alertmanager's aggregation-group key: ``<route key>:<group labels>``."""
    return f"{route_key(route)}:{labelset_string(group_labels(route, labels))}"


class Router:
    """Which routes an alert goes to: in order, stopping at the first match unless
    ``continue_matching``."""

    def __init__(self, routes: Sequence[AlertRouteConfig]):
        self.routes = tuple(routes)

    def match(self, labels: Mapping[str, str]) -> list[AlertRouteConfig]:
        out = []
        for route in self.routes:
            if all(labels.get(k, "") == v for k, v in route.match.items()):
                out.append(route)
                if not route.continue_matching:
                    break
        return out


@dataclass
class GroupState:
    """One aggregation group and its notification-log entry (times in Unix seconds)."""

    route: str
    key: str
    labels: dict[str, str]
    created_at: float
    next_flush: float
    #: fingerprint -> latest version of the alert (firing or resolved).
    alerts: dict[str, Alert] = field(default_factory=dict)
    has_flushed: bool = False
    #: What the last notification contained; None = never notified (Alertmanager's nflog).
    sent_firing: frozenset[str] | None = None
    sent_resolved: frozenset[str] = frozenset()
    sent_at: float = 0.0
    notifications: int = 0


@dataclass(frozen=True)
class LogEntry:
    """The notification-log entry of one aggregation group, as stored across restarts.

    ``firing``/``resolved``: the fingerprints of the last notification (or log update);
    ``sent_at``: its time; ``alerts``: the firing alerts it contained (so that a group whose
    alerts resolved while no process ran can still announce the resolution); ``seq``: the
    outbox sequence number of the group's last enqueued notification (None when unknown).
    """

    route: str
    group_key: str
    labels: Mapping[str, str]
    created_at: float
    firing: frozenset[str]
    resolved: frozenset[str]
    sent_at: float
    alerts: tuple[Alert, ...]
    notifications: int = 0
    seq: int | None = None


@dataclass
class _Stream:
    """The state of one ``alertmanager_api`` route."""

    route: str
    key: str
    firing: dict[str, Alert] = field(default_factory=dict)
    resolved: dict[str, Alert] = field(default_factory=dict)
    last_sent: float | None = None
    sent_firing: frozenset[str] = frozenset()
    sent_resolved: frozenset[str] = frozenset()


@dataclass
class _State:
    groups: dict[tuple[str, str], GroupState] = field(default_factory=dict)
    streams: dict[str, _Stream] = field(default_factory=dict)
    unrouted: int = 0


@dataclass(frozen=True)
class Plan:
    """What one ``step`` would do: its notifications and the state after them.

    ``Grouper.commit(plan)`` makes the state current; a caller that must first store the
    notifications durably (the notifier) commits only after it did, so a failed write
    leaves the grouper as it was and the next step produces them again.
    """

    notifications: tuple[Notification, ...]
    state: _State
    base: _State

    def log_changes(self) -> tuple[list[LogEntry], list[tuple[str, str]]]:
        """The notification-log entries this plan writes (groups whose log changed) and the
        (route, group key) entries it removes (notified groups that disappeared)."""
        upserts = []
        for gid, group in self.state.groups.items():
            if group.sent_firing is None:
                continue
            old = self.base.groups.get(gid)
            if old is not None and (old.sent_firing, old.sent_resolved, old.sent_at) == (
                    group.sent_firing, group.sent_resolved, group.sent_at):
                continue
            upserts.append(LogEntry(
                route=group.route, group_key=group.key, labels=dict(group.labels),
                created_at=group.created_at, firing=group.sent_firing,
                resolved=group.sent_resolved, sent_at=group.sent_at,
                alerts=tuple(a for fp, a in sorted(group.alerts.items())
                             if fp in group.sent_firing),
                notifications=group.notifications,
            ))
        deletes = [gid for gid, group in self.base.groups.items()
                   if gid not in self.state.groups and group.sent_firing is not None]
        return upserts, deletes


class Grouper:
    """Alertmanager's dispatcher for a fixed list of routes (see the module docstring)."""

    def __init__(self, routes: Sequence[AlertRouteConfig]):
        self.router = Router(routes)
        self._routes = {r.name: r for r in routes}
        self._state = _State()

    # --- the public step ----------------------------------------------------------------
    def step(self, now: float, active_alerts: Iterable[Alert]) -> list[Notification]:
        """Feed the currently active alerts at ``now`` (Unix seconds); get what to send."""
        plan = self.plan(now, active_alerts)
        self.commit(plan)
        return list(plan.notifications)

    def plan(self, now: float, active_alerts: Iterable[Alert]) -> Plan:
        """``step`` without changing the grouper; ``commit`` the plan to apply it."""
        base = self._state
        state = copy.deepcopy(base)
        notifications: list[Notification] = []
        seen: dict[tuple[str, str], set[str]] = {}
        stream_seen: dict[str, dict[str, Alert]] = {r: {} for r in self._stream_routes()}
        explicit_ends: dict[str, float] = {}
        state.unrouted = 0

        for alert in active_alerts:
            if not alert.firing and alert.ends_at is not None and alert.ends_at <= now:
                # Passed in already resolved: resolve it wherever it is known, at its time.
                explicit_ends[alert.fingerprint] = alert.ends_at
                continue
            if not alert.firing:
                alert = Alert(alert.labels, alert.annotations, alert.starts_at, None,
                              alert.generator_url)  # ends in the future: still firing now
            routes = self.router.match(alert.labels)
            if not routes:
                state.unrouted += 1
            for route in routes:
                if route.format == FORMAT_ALERTMANAGER_API:
                    stream_seen[route.name][alert.fingerprint] = alert
                    continue
                self._insert(state, route, alert, now, seen)

        for gid, group in state.groups.items():
            current = seen.get(gid, set())
            for fp, alert in list(group.alerts.items()):
                if alert.firing and fp not in current:
                    group.alerts[fp] = alert.resolved_at(explicit_ends.get(fp, now))

        for gid in sorted(state.groups, key=self._group_order):
            group = state.groups[gid]
            if now >= group.next_flush:
                n = self._flush(group, now)
                if n is not None:
                    notifications.append(n)
                if not group.alerts:
                    del state.groups[gid]

        for route_name in self._stream_routes():
            n = self._stream_step(state, route_name, stream_seen[route_name], explicit_ends,
                                  now)
            if n is not None:
                notifications.append(n)
        return Plan(tuple(notifications), state, base)

    def commit(self, plan: Plan) -> None:
        """Make ``plan``'s state current (refused when another plan was committed since)."""
        if plan.base is not self._state:
            raise RuntimeError("stale plan: the grouper changed since it was made")
        self._state = plan.state

    def restore(self, entries: Iterable[LogEntry]) -> list[LogEntry]:
        """Rebuild aggregation groups from a stored notification log (at start, before the
        first ``step``). Returns the entries not restored: their route is gone or forwards
        to Alertmanager's API, or its matchers or ``group_by`` changed so that their alerts
        would no longer form that group (the caller may delete them)."""
        rejected = []
        for e in entries:
            route = self._routes.get(e.route)
            if (route is None or route.format == FORMAT_ALERTMANAGER_API or not e.alerts
                    or any(group_key(route, a.labels) != e.group_key for a in e.alerts)):
                rejected.append(e)
                continue
            self._state.groups[(e.route, e.group_key)] = GroupState(
                route=e.route, key=e.group_key, labels=dict(e.labels),
                created_at=e.created_at, next_flush=e.sent_at + route.group_interval,
                alerts={a.fingerprint: a for a in e.alerts}, has_flushed=True,
                sent_firing=frozenset(e.firing), sent_resolved=frozenset(e.resolved),
                sent_at=e.sent_at, notifications=e.notifications,
            )
        return rejected

    # --- inspection -------------------------------------------------------------------------
    def groups(self) -> list[GroupState]:
        """The aggregation groups now (copies), in route order then key order."""
        return [copy.deepcopy(self._state.groups[g])
                for g in sorted(self._state.groups, key=self._group_order)]

    @property
    def unrouted(self) -> int:
        """How many active alerts of the last step matched no route."""
        return self._state.unrouted

    def next_wakeup(self) -> float | None:
        """The earliest time (Unix seconds) a ``step`` could produce a notification by
        itself: the next group flush or stream re-post; None when nothing is pending."""
        times = [g.next_flush for g in self._state.groups.values()]
        times += [s.last_sent + API_RESEND_INTERVAL for s in self._state.streams.values()
                  if s.last_sent is not None and (s.firing or s.resolved)]
        return min(times) if times else None

    # --- aggregation groups -----------------------------------------------------------------
    def _group_order(self, gid: tuple[str, str]) -> tuple[int, str]:
        names = list(self._routes)
        return (names.index(gid[0]) if gid[0] in self._routes else len(names), gid[1])

    def _stream_routes(self) -> list[str]:
        return [r.name for r in self.router.routes if r.format == FORMAT_ALERTMANAGER_API]

    @staticmethod
    def _insert(state: _State, route: AlertRouteConfig, alert: Alert, now: float,
                seen: dict[tuple[str, str], set[str]]) -> None:
        key = group_key(route, alert.labels)
        gid = (route.name, key)
        group = state.groups.get(gid)
        if group is None:
            group = GroupState(route=route.name, key=key,
                               labels=group_labels(route, alert.labels),
                               created_at=now, next_flush=now + route.group_wait)
            state.groups[gid] = group
        group.alerts[alert.fingerprint] = alert
        seen.setdefault(gid, set()).add(alert.fingerprint)
        # Alertmanager: "Immediately trigger a flush if the wait duration for this alert is
        # already over" (strictly before now), until the group's first flush.
        if not group.has_flushed and alert.starts_at + route.group_wait < now:
            group.next_flush = min(group.next_flush, now)

    def _flush(self, group: GroupState, now: float) -> Notification | None:
        route = self._routes[group.route]
        firing = frozenset(fp for fp, a in group.alerts.items() if a.firing)
        resolved = frozenset(fp for fp, a in group.alerts.items() if not a.firing)
        reason = self._needs_update(group, route, firing, resolved, now)
        notification = None
        if reason:
            alerts = [a for a in group.alerts.values() if a.firing or route.send_resolved]
            if alerts:
                notification = Notification(
                    route=route.name, group_key=group.key, group_labels=group.labels,
                    alerts=tuple(alerts), created_at=now, reason=reason,
                )
                group.notifications += 1
            # The log is updated even when nothing is sent (all resolved, send_resolved
            # off), so that a later flush does not announce the same resolution again.
            group.sent_firing, group.sent_resolved, group.sent_at = firing, resolved, now
        # Resolved alerts have been dealt with (notified, or not to be): they leave.
        for fp in resolved:
            del group.alerts[fp]
        group.has_flushed = True
        group.next_flush = now + route.group_interval
        return notification

    @staticmethod
    def _needs_update(group: GroupState, route: AlertRouteConfig, firing: frozenset[str],
                      resolved: frozenset[str], now: float) -> str:
        """Alertmanager's ``DedupStage.needsUpdate``: why to notify, or "" not to."""
        if group.sent_firing is None:
            return "first" if firing else ""
        if not firing <= group.sent_firing:
            return "first" if not group.sent_firing else "new_alerts"
        if not firing:
            # Alerts fired and resolved within one interval, unseen by the receiver: silence.
            return "all_resolved" if group.sent_firing else ""
        if route.send_resolved and not resolved <= group.sent_resolved:
            return "resolved"
        if group.sent_at < now - route.repeat_interval:
            return "repeat"
        return ""

    # --- alertmanager_api streams -----------------------------------------------------------
    def _stream_step(self, state: _State, route_name: str, current: dict[str, Alert],
                     explicit_ends: Mapping[str, float], now: float) -> Notification | None:
        route = self._routes[route_name]
        stream = state.streams.get(route_name)
        if stream is None:
            stream = _Stream(route=route_name, key=route_key(route))
            state.streams[route_name] = stream
        for fp, alert in stream.firing.items():
            if fp not in current:
                stream.resolved[fp] = alert.resolved_at(explicit_ends.get(fp, now))
        for fp in current:
            stream.resolved.pop(fp, None)  # fired again
        stream.firing = dict(current)
        for fp, alert in list(stream.resolved.items()):
            if alert.ends_at is not None and alert.ends_at < now - API_RESOLVED_RETENTION:
                del stream.resolved[fp]
        resolved = stream.resolved if route.send_resolved else {}
        firing_set, resolved_set = frozenset(stream.firing), frozenset(resolved)
        if not firing_set and not resolved_set:
            stream.sent_firing, stream.sent_resolved = firing_set, resolved_set
            if not stream.firing and not stream.resolved:
                del state.streams[route_name]
            return None
        changed = (firing_set != stream.sent_firing
                   or not resolved_set <= stream.sent_resolved)
        due = stream.last_sent is None or now >= stream.last_sent + API_RESEND_INTERVAL
        if not (changed or due):
            return None
        stream.last_sent = now
        stream.sent_firing, stream.sent_resolved = firing_set, resolved_set
        return Notification(
            route=route_name, group_key=stream.key, group_labels={},
            alerts=tuple(stream.firing.values()) + tuple(resolved.values()),
            created_at=now, reason="snapshot", snapshot=True,
        )
