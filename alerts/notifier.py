"""The notifier: grouping, the durable outbox and delivery behind one object.

``vigil serve`` calls ``process(now, active_alerts)`` after every evaluation (it groups the
alerts and writes the resulting notifications to the outbox, committed before anything is
sent) and ``await deliver_due()`` often (it sends what is due: concurrently across groups,
one at a time and in order within a group). ``counters()`` feeds the exporter,
``status()`` (or ``read_status(path)`` from another process) feeds ``vigil alerts --json``.

Timers only advance when ``process`` is called; call it at least every
``API_RESEND_INTERVAL`` (60 s) when a route forwards to Alertmanager's API, and ideally at
``next_wakeup()`` so that group_wait/group_interval are kept to the second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from alerts.delivery import DeliveryResult, MissingSecret, post, resolve_secret
from alerts.formats import render
from alerts.grouping import Grouper
from alerts.model import Alert, Notification
from alerts.outbox import Fence, Outbox, OutboxItem, OutboxStats
from vigil.clock import Clock, system_clock
from vigil.config import AlertRouteConfig, Config
from vigil.conventions import OUTBOX_GIVEN_UP, OUTBOX_PENDING, OUTBOX_SUPERSEDED
from vigil.errors import LeaseLost
from vigil.storage.database import is_postgres_url

__all__ = ["DeliveryRound", "Notifier", "NotifierCounters", "read_status", "redact_url"]

log = logging.getLogger("vigil.alerts")

#: Sends in flight at once across all groups (each group sends one at a time anyway).
MAX_CONCURRENCY = 16
#: Finished outbox rows older than max_age are pruned at most this often (seconds).
PRUNE_EVERY = 3600.0
#: ``status()`` lists at most this many rows of each kind.
STATUS_LIMIT = 100


def redact_url(url: str) -> str:
    """``scheme://host[:port]/…``: webhook URLs often hold a token (Slack's do), so listings
    show where a notification goes without leaking it."""
    try:
        u = httpx.URL(url)
    except Exception:
        return "<invalid URL>"
    port = f":{u.port}" if u.port else ""
    path = "/…" if u.path not in ("", "/") or u.query else ""
    return f"{u.scheme}://{u.host}{port}{path}"


@dataclass
class NotifierCounters:
    """Counters since this notifier started (per route name) and the outbox gauges.

    ``queue_depth``: pending notifications; ``oldest_undelivered_age``: seconds since the
    oldest pending one was created (0 when none).
    """

    enqueued: Counter[str] = field(default_factory=Counter)
    delivered: Counter[str] = field(default_factory=Counter)
    failed_attempts: Counter[str] = field(default_factory=Counter)
    given_up: Counter[str] = field(default_factory=Counter)
    superseded: Counter[str] = field(default_factory=Counter)
    queue_depth: int = 0
    in_flight: int = 0
    oldest_undelivered_age: float = 0.0
    unrouted_alerts: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("enqueued", "delivered", "failed_attempts", "given_up", "superseded"):
            per_route = dict(getattr(self, name))
            out[name] = {"total": sum(per_route.values()), "by_route": per_route}
        out.update(queue_depth=self.queue_depth, in_flight=self.in_flight,
                   oldest_undelivered_age_seconds=self.oldest_undelivered_age,
                   unrouted_alerts=self.unrouted_alerts)
        return out


@dataclass
class DeliveryRound:
    """What one ``deliver_due`` did: counts, and the failures' reasons by outbox id."""

    delivered: int = 0
    failed: int = 0
    given_up: int = 0
    failures: dict[int, str] = field(default_factory=dict)


class Notifier:
    """Groups alerts, stores notifications durably and delivers them (see module docstring).

    ``outbox_path``: the SQLite file of the outbox (its own file is best: the sample store
    checks its own schema), or the PostgreSQL URL copies of `vigil serve` share; ``fence``:
    the leader's lease check for a shared one (``Outbox``); ``max_timeout``: no request
    waits longer than this (seconds; half the lease, with a shared outbox). ``clock``: Unix
    seconds.
    ``rng``: retry jitter. ``transport``: an httpx transport for tests. ``env``: where
    ``secret_env`` names are looked up (default ``os.environ``, read at each attempt so a
    rotated secret takes effect).
    """

    def __init__(self, config: Config, outbox_path: str | Path, *, clock: Clock = system_clock,
                 rng: random.Random | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 env: Mapping[str, str] | None = None,
                 max_concurrency: int = MAX_CONCURRENCY, fence: Fence | None = None,
                 max_timeout: float | None = None):
        self.config = config
        self._alerts_cfg = config.alerts
        self._routes: dict[str, AlertRouteConfig] = {r.name: r for r in config.alerts.routes}
        self._clock = clock
        self._transport = transport
        self._env = os.environ if env is None else env
        self._max_concurrency = max_concurrency
        self._max_timeout = max_timeout
        self.grouper = Grouper(config.alerts.routes)
        self.outbox = Outbox(outbox_path, retry_initial=self._alerts_cfg.retry_initial,
                             retry_max=self._alerts_cfg.retry_max,
                             max_age=self._alerts_cfg.max_age, rng=rng, fence=fence)
        self._counters = NotifierCounters()
        self._busy: set[tuple[str, str]] = set()
        self._active: list[tuple[Alert, list[str]]] = []
        self._last_prune = 0.0
        self._ssl: ssl.SSLContext | None = None
        self._process_lock = threading.Lock()
        # A new process: the groups the previous one had notified continue where they were
        # (Alertmanager's nflog), so a still-firing alert is not paged again as a new group.
        stale = self.grouper.restore(self.outbox.notification_log())
        if stale:
            log.info("dropping %d notification-log entries of routes or groups that no longer "
                     "exist", len(stale))
            self.outbox.forget_log((e.route, e.group_key) for e in stale)
        # A new process: any attempt marked in flight was cut short by the previous one.
        for item in self.outbox.recover(self._clock()):
            log.warning("alert notification %s (route %s) was being sent when the previous "
                        "process stopped; it will be sent again (attempt %d)",
                        item.key, item.route, item.attempts + 1)

    def close(self) -> None:
        self.outbox.close()

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- grouping -> outbox -----------------------------------------------------------------
    def process(self, now: float, active_alerts: Iterable[Alert]) -> list[OutboxItem]:
        """Group the alerts active at ``now`` (Unix seconds) and store the notifications
        that are due; returns the stored rows. Raises ``OutboxError`` if the outbox cannot
        be written, leaving the grouping state unchanged (the next call retries)."""
        alerts = list(active_alerts)
        # One process() at a time: the plan must be committed on the state it was made from.
        with self._process_lock:
            plan = self.grouper.plan(now, alerts)
            entries = []
            for n in plan.notifications:
                route = self._routes[n.route]
                body = render(n, route.format, external_url=self._alerts_cfg.dashboard_url)
                entries.append((n, body, route))
            # Durable first (with the notification log, in the same transaction); only then
            # does the grouper consider them notified.
            upserts, deletes = plan.log_changes()
            items = (self.outbox.enqueue(entries, now, log=upserts, forget=deletes)
                     if entries or upserts or deletes else [])
            self.grouper.commit(plan)
            active = [(a, [r.name for r in self.grouper.router.match(a.labels)])
                      for a in alerts if a.firing or (a.ends_at or 0) > now]
            self._active = active
            self.outbox.save_active(active)
        for item in items:
            self._counters.enqueued[item.route] += 1
            log.info("alert notification %s queued: route %s, group %s, %s (%d firing, "
                     "%d resolved)", item.key, item.route, item.group_key, item.reason,
                     item.firing, item.resolved)
        self._counters.unrouted_alerts = self.grouper.unrouted
        return items

    def notifications_for(self, now: float, active_alerts: Iterable[Alert]) -> list[Notification]:
        """What ``process`` would enqueue now, without changing anything (for dry runs)."""
        return list(self.grouper.plan(now, active_alerts).notifications)

    # --- delivery ---------------------------------------------------------------------------
    async def deliver_due(self, now: float | None = None) -> DeliveryRound:
        """Send every due notification: groups concurrently, each group in order, moving on
        to a group's next notification as soon as the previous one is acknowledged."""
        now = self._clock() if now is None else now
        rnd = DeliveryRound()
        for item in self.outbox.expire(now):
            self._counters.given_up[item.route] += 1
            rnd.given_up += 1
            log.error("alert notification %s (route %s, group %s) given up: %s",
                      item.key, item.route, item.group_key, item.last_error)
        if now - self._last_prune >= PRUNE_EVERY:
            self._last_prune = now
            self.outbox.prune(now)
        heads = [h for h in self.outbox.next_due(now) if (h.route, h.group_key) not in self._busy]
        if not heads:
            return rnd
        sem = asyncio.Semaphore(self._max_concurrency)
        if self._ssl is None:
            # Loading the CA bundle costs tens of milliseconds: once per notifier, not per round.
            self._ssl = httpx.create_ssl_context()
        async with httpx.AsyncClient(transport=self._transport, verify=self._ssl,
                                     follow_redirects=False) as client:
            await asyncio.gather(*(self._drain(client, sem, h, now, rnd) for h in heads))
        return rnd

    async def _drain(self, client: httpx.AsyncClient, sem: asyncio.Semaphore, item: OutboxItem,
                     now: float, rnd: DeliveryRound) -> None:
        gid = (item.route, item.group_key)
        self._busy.add(gid)
        try:
            current: OutboxItem | None = item
            while current is not None:
                async with sem:
                    if not await self._attempt(client, current, now, rnd):
                        return
                nxt = self.outbox.head(*gid)
                if nxt is None or nxt.next_attempt_at > now or nxt.inflight_since is not None:
                    return
                current = nxt
        finally:
            self._busy.discard(gid)

    def _target(self, item: OutboxItem) -> tuple[str, float, str | None]:
        # The route as configured now wins (a fixed URL or rotated secret applies to what is
        # still queued), unless it changed format or vanished: the stored body is in the old
        # format, so it goes where it was meant to.
        route = self._routes.get(item.route)
        if route is not None and route.format == item.format:
            url, timeout, secret_env = route.url, route.timeout, route.secret_env
        else:
            url, timeout, secret_env = item.url, item.timeout, item.secret_env
        if self._max_timeout is not None:
            # A row stored under an older, longer timeout still fits the leader's lease.
            timeout = min(timeout, self._max_timeout)
        return url, timeout, secret_env

    async def _attempt(self, client: httpx.AsyncClient, item: OutboxItem, now: float,
                       rnd: DeliveryRound) -> bool:
        url, timeout, secret_env = self._target(item)
        try:
            attempt = self.outbox.begin_attempt(item.id, self._stamp(now), hold=timeout)
        except LeaseLost as exc:
            # Another copy leads now, or the lease is too short for this attempt to end
            # before it runs out: the row stays pending for whoever holds the lease.
            log.warning("alert notification %s not sent: %s", item.key, exc)
            return False
        if attempt is None:
            return False  # finished or taken meanwhile
        try:
            secret = resolve_secret(secret_env, self._env)
        except MissingSecret as exc:
            result = DeliveryResult(False, None, str(exc), 0.0)
        else:
            try:
                result = await post(client, url, item.body, key=item.key, attempt=attempt,
                                    timeout=timeout, secret=secret)
            except asyncio.CancelledError:
                # Shutting down mid-request: not in flight any more, retried later (the
                # receiver may have it: the same key lets it drop the repeat).
                self.outbox.fail(item.id, self._stamp(now), "cancelled during the request",
                                 attempt=attempt)
                raise
        stamp = self._stamp(now)
        if result.ok:
            self.outbox.ack(item.id, stamp)
            self._counters.delivered[item.route] += 1
            rnd.delivered += 1
            log.info("alert notification %s delivered to route %s (attempt %d, HTTP %s, "
                     "%.3f s)", item.key, item.route, attempt, result.status_code,
                     result.duration)
            return True
        after = self.outbox.fail(item.id, stamp, result.reason, attempt=attempt)
        self._counters.failed_attempts[item.route] += 1
        rnd.failed += 1
        rnd.failures[item.id] = result.reason
        if after.status == OUTBOX_GIVEN_UP:
            self._counters.given_up[item.route] += 1
            rnd.given_up += 1
            log.error("alert notification %s to route %s given up after %d attempts: %s",
                      item.key, item.route, attempt, result.reason)
        elif after.status == OUTBOX_SUPERSEDED:
            self._counters.superseded[item.route] += 1
            log.warning("alert notification %s to route %s failed (%s); a newer snapshot "
                        "replaces it", item.key, item.route, result.reason)
        else:
            log.warning("alert notification %s to route %s failed (attempt %d): %s; next "
                        "attempt in %.1f s", item.key, item.route, attempt, result.reason,
                        after.next_attempt_at - stamp)
        return False

    def _stamp(self, now: float) -> float:
        # Completion times come from the clock, but never before the round's "now".
        return max(now, self._clock())

    # --- observability ----------------------------------------------------------------------
    def next_wakeup(self) -> float | None:
        """When (Unix seconds) the next group flush, stream re-post or retry is due."""
        times = [t for t in (self.grouper.next_wakeup(), self.outbox.next_attempt_at())
                 if t is not None]
        return min(times) if times else None

    def counters(self, now: float | None = None) -> NotifierCounters:
        """A snapshot of the counters, with the outbox gauges as of ``now``."""
        now = self._clock() if now is None else now
        stats = self.outbox.stats(now)
        c = self._counters
        return NotifierCounters(
            enqueued=Counter(c.enqueued), delivered=Counter(c.delivered),
            failed_attempts=Counter(c.failed_attempts), given_up=Counter(c.given_up),
            superseded=Counter(c.superseded), queue_depth=stats.pending,
            in_flight=stats.in_flight, oldest_undelivered_age=stats.oldest_pending_age,
            unrouted_alerts=c.unrouted_alerts,
        )

    def status(self, now: float | None = None) -> dict[str, Any]:
        """Everything ``vigil alerts --json`` shows: firing alerts, groups, outbox, counters."""
        now = self._clock() if now is None else now
        out = _status(self.outbox, now, self._active)
        out["routes"] = [
            {"name": r.name, "format": r.format, "url": redact_url(r.url), "match": dict(r.match),
             "group_by": list(r.group_by), "signed": bool(r.secret_env)}
            for r in self._routes.values()
        ]
        out["groups"] = [
            {"route": g.route, "group_key": g.key, "labels": g.labels,
             "alerts": len(g.alerts), "created_at": g.created_at, "next_flush": g.next_flush,
             "last_notified_at": g.sent_at if g.sent_firing is not None else None,
             "notifications": g.notifications}
            for g in self.grouper.groups()
        ]
        out["counters"] = self.counters(now).as_dict()
        return out


def _status(outbox: Outbox, now: float, active: list[tuple[Alert, list[str]]]) -> dict[str, Any]:
    stats: OutboxStats = outbox.stats(now)

    def row(item: OutboxItem) -> dict[str, Any]:
        d = item.as_dict()
        d["url"] = redact_url(item.url)
        d["age_seconds"] = item.age(now)
        return d

    return {
        "now": now,
        "firing": [{**a.as_dict(), "routes": routes} for a, routes in active],
        "outbox": {
            "path": str(outbox.path),
            "pending": stats.pending,
            "in_flight": stats.in_flight,
            "done": stats.done,
            "given_up": stats.given_up,
            "superseded": stats.superseded,
            "oldest_pending_age_seconds": stats.oldest_pending_age,
            "pending_items": [row(i) for i in outbox.items(OUTBOX_PENDING, limit=STATUS_LIMIT)],
            "given_up_items": [row(i) for i in outbox.items(OUTBOX_GIVEN_UP, limit=STATUS_LIMIT,
                                                            newest_first=True)],
        },
    }


def read_status(outbox_path: str | Path, now: float | None = None) -> dict[str, Any]:
    """``vigil alerts --json`` from another process: the active alerts saved by the last
    ``process`` and the outbox. A missing outbox file reads as empty (nothing was ever
    queued) and is not created."""
    now = time.time() if now is None else now
    if is_postgres_url(outbox_path):
        shared = Outbox(outbox_path)
        try:
            return _status(shared, now, shared.active())
        finally:
            shared.close()
    path = Path(outbox_path)
    if not path.exists():
        return {"now": now, "firing": [], "outbox": {
            "path": str(path), "pending": 0, "in_flight": 0, "done": 0, "given_up": 0,
            "superseded": 0, "oldest_pending_age_seconds": 0.0, "pending_items": [],
            "given_up_items": []}}
    outbox = Outbox(path)
    try:
        return _status(outbox, now, outbox.active())
    finally:
        outbox.close()
