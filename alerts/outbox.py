"""The durable outbox: every notification is in SQLite before any attempt to send it.

Guarantees (docs/alerts.md states them for users):

* **Written before sent**: ``enqueue`` commits (``synchronous = FULL``) before it returns;
  nothing is sent that is not already in the file.
* **Done only when acknowledged**: a row becomes ``done`` only through ``ack``, which the
  notifier calls after a 2xx answer. A process killed at any point leaves every
  unacknowledged row ``pending``; the next process sends it again (same idempotency key), and
  never sends a ``done`` row again.
* **Order per group**: ``next_due`` offers only the oldest pending row (lowest ``seq``) of each
  (route, group key); a later notification of a group is never offered before the earlier one
  is acknowledged, given up or superseded.
* **Retries**: after the n-th failed attempt the next one is due
  ``min(retry_max, retry_initial × 2^(n-1)) × U(0.5, 1.5)`` seconds later (jitter from the
  injected RNG, so that receivers coming back are not hit by every sender at once). No limit
  on the count; a row older than ``max_age`` is marked ``given_up`` instead (kept for
  inspection, counted).
* **Idempotency key**: a UUID derived from this outbox's random instance id, the route, the
  group key and the row's sequence number in its group; it is stored with the row, so it is
  the same on every retry and after restarts, and never reused by another notification.

* **Notification log**: per (route, group key) the last notified firing/resolved fingerprints,
  the time, the firing alerts and the last sequence number (Alertmanager's nflog). ``enqueue``
  writes it in the same transaction as the notifications, so a crash cannot log a
  notification that was not queued or queue one that was not logged; a new process restores
  its aggregation groups from it (``notification_log``), so a restart does not page again.

No transaction is ever open while a request is in flight: ``begin_attempt`` commits that an
attempt started, the caller sends, then ``ack`` or ``fail`` commits the result.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from alerts.grouping import LogEntry
from alerts.model import Alert, Notification
from vigil.conventions import OUTBOX_DONE, OUTBOX_GIVEN_UP, OUTBOX_PENDING, OUTBOX_SUPERSEDED
from vigil.errors import NotFound, StoreError
from vigil.storage.database import Connection, is_postgres_url, open_database
from vigil.storage.lease import LEASE_SCHEMA

__all__ = ["Outbox", "OutboxError", "OutboxItem", "OutboxStats", "backoff_delay"]

#: Rows of each finished state kept for inspection by ``prune`` (the newest ones).
KEEP_FINISHED = 1000

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS alert_outbox_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    # One row per notification. Times are Unix seconds (REAL).
    """CREATE TABLE IF NOT EXISTS alert_outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        idempotency_key TEXT NOT NULL UNIQUE,
        route TEXT NOT NULL,
        group_key TEXT NOT NULL,
        seq INTEGER NOT NULL,
        status TEXT NOT NULL,
        snapshot INTEGER NOT NULL DEFAULT 0,
        reason TEXT NOT NULL,
        alert_status TEXT NOT NULL,
        firing INTEGER NOT NULL,
        resolved INTEGER NOT NULL,
        url TEXT NOT NULL,
        format TEXT NOT NULL,
        timeout REAL NOT NULL,
        secret_env TEXT,
        body BLOB NOT NULL,
        created_at REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL NOT NULL,
        inflight_since REAL,
        last_attempt_at REAL,
        last_error TEXT,
        finished_at REAL,
        UNIQUE (route, group_key, seq)
    )""",
    """CREATE INDEX IF NOT EXISTS alert_outbox_queue
        ON alert_outbox (status, route, group_key, seq)""",
    # The next sequence number of each group survives pruning, so keys are never reused.
    """CREATE TABLE IF NOT EXISTS alert_outbox_groups (
        route TEXT NOT NULL,
        group_key TEXT NOT NULL,
        next_seq INTEGER NOT NULL,
        PRIMARY KEY (route, group_key)
    )""",
    # The notification log (Alertmanager's nflog): what each group last notified, and when.
    # Fingerprint sets and alerts are JSON; seq is the group's last enqueued sequence number.
    """CREATE TABLE IF NOT EXISTS alert_outbox_nflog (
        route TEXT NOT NULL,
        group_key TEXT NOT NULL,
        labels TEXT NOT NULL,
        created_at REAL NOT NULL,
        firing TEXT NOT NULL,
        resolved TEXT NOT NULL,
        alerts TEXT NOT NULL,
        sent_at REAL NOT NULL,
        notifications INTEGER NOT NULL DEFAULT 0,
        seq INTEGER,
        PRIMARY KEY (route, group_key)
    )""",
    # The alerts active at the last evaluation, for `vigil alerts --json` in another process.
    """CREATE TABLE IF NOT EXISTS alert_active (
        fingerprint TEXT PRIMARY KEY,
        alert TEXT NOT NULL,
        routes TEXT NOT NULL
    )""",
)

_COLUMNS = (
    "id, idempotency_key, route, group_key, seq, status, snapshot, reason, alert_status, "
    "firing, resolved, url, format, timeout, secret_env, body, created_at, attempts, "
    "next_attempt_at, inflight_since, last_attempt_at, last_error, finished_at"
)


class OutboxError(StoreError):
    """The outbox file could not be opened or written."""


#: A check run first inside the outbox's write transactions that decide what is sent
#: (``enqueue``, ``begin_attempt``): it raises ``LeaseLost`` to refuse the write unless this
#: process holds the leader's lease with at least the given seconds left
#: (``vigil.storage.lease.Lease.fence``).
Fence = Callable[[Connection, float], None]


def backoff_delay(attempts: int, *, initial: float, cap: float, rng: random.Random) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones (``attempts`` ≥ 1):
    ``min(cap, initial × 2^(attempts-1)) × U(0.5, 1.5)``."""
    exponent = max(0, attempts - 1)
    # 2**exponent overflows a float after ~1000 attempts; the cap is reached long before.
    base = cap if exponent > 60 else min(cap, initial * (2.0**exponent))
    return base * rng.uniform(0.5, 1.5)


@dataclass(frozen=True)
class OutboxItem:
    """One stored notification (times in Unix seconds)."""

    id: int
    key: str
    route: str
    group_key: str
    seq: int
    status: str
    snapshot: bool
    reason: str
    alert_status: str
    firing: int
    resolved: int
    url: str
    format: str
    timeout: float
    secret_env: str | None
    body: bytes
    created_at: float
    attempts: int
    next_attempt_at: float
    inflight_since: float | None
    last_attempt_at: float | None
    last_error: str | None
    finished_at: float | None

    @classmethod
    def _from_row(cls, row: Sequence[Any]) -> OutboxItem:
        values = list(row)
        values[6] = bool(values[6])
        values[15] = bytes(values[15])
        return cls(*values)

    def age(self, now: float) -> float:
        """Seconds since the notification was created."""
        return max(0.0, now - self.created_at)

    def as_dict(self, *, body: bool = False) -> dict[str, Any]:
        """JSON-ready; the body (bytes) only when asked, as text."""
        d = asdict(self)
        d.pop("body")
        if body:
            d["body"] = self.body.decode("utf-8", "replace")
        return d


@dataclass(frozen=True)
class OutboxStats:
    """Counts by state, and the age (seconds) of the oldest pending notification."""

    pending: int
    in_flight: int
    done: int
    given_up: int
    superseded: int
    oldest_pending_age: float


class Outbox:
    """The outbox at ``target``: an SQLite file (its own, or tables in a shared SQLite file),
    or a PostgreSQL URL that several copies of `vigil serve` share.

    ``retry_initial``/``retry_max``/``max_age`` are seconds; ``rng`` supplies the jitter.
    Thread-safe. Several processes may open the same outbox, but only one may deliver from
    it at a time: the holder of the leader's lease, when ``fence`` is given (every
    ``enqueue`` and ``begin_attempt`` then checks the lease in its own transaction).
    """

    def __init__(self, target: str | Path, *, retry_initial: float = 1.0,
                 retry_max: float = 300.0, max_age: float = 86400.0,
                 rng: random.Random | None = None, fence: Fence | None = None):
        postgres = is_postgres_url(target)
        #: The file, or the URL without its password (what messages name).
        self.path: Path | str = str(target) if postgres else Path(target)
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.max_age = max_age
        self._rng = rng or random.Random()
        self._fence = fence
        # FULL: a committed notification survives a power loss too, not only a crash;
        # notifications are few, the fsync per commit costs nothing that matters. The
        # lease's table is created with the outbox's, since fenced writes read it.
        self._db = open_database(target, what="the alert outbox", schema=_SCHEMA + LEASE_SCHEMA,
                                 error=OutboxError, synchronous="FULL")
        if postgres:
            self.path = self._db.display
        self.instance = self._instance_id()

    def _instance_id(self) -> uuid.UUID:
        # Random on purpose (not from the injected RNG): a recreated outbox must never produce
        # the keys of a deleted one, which receivers may still remember. Copies opening a
        # shared outbox together agree on the first one written.
        with self._db.transaction() as c:
            c.execute("INSERT INTO alert_outbox_meta (key, value) VALUES ('instance', ?) "
                      "ON CONFLICT (key) DO NOTHING", (str(uuid.uuid4()),))
            found = c.execute(
                "SELECT value FROM alert_outbox_meta WHERE key = 'instance'").fetchone()
            return uuid.UUID(found[0])

    def close(self) -> None:
        """Close the file (idempotent); everything written is already committed."""
        self._db.close()

    def _select(self, where: str, params: Sequence[Any] = ()) -> list[OutboxItem]:
        rows = self._db.query(f"SELECT {_COLUMNS} FROM alert_outbox {where}", params)
        return [OutboxItem._from_row(r) for r in rows]

    # --- writing ------------------------------------------------------------------------
    def enqueue(self, entries: Iterable[tuple[Notification, bytes, Any]],
                now: float, *, log: Iterable[LogEntry] = (),
                forget: Iterable[tuple[str, str]] = ()) -> list[OutboxItem]:
        """Store notifications durably, in one transaction; returns the stored rows.

        Each entry is ``(notification, body, route)`` where ``route`` is the
        ``AlertRouteConfig`` (its url, format, timeout and secret_env are stored with the
        row). A ``snapshot`` notification supersedes the older pending rows of its stream
        that are not being sent right now.

        ``log`` entries replace the notification-log entries of their groups (their ``seq``
        becomes that of the group's notification enqueued here, if any, else stays);
        ``forget`` removes the entries of those (route, group key). Both in the same
        transaction as the notifications.
        """
        ids = []
        seqs: dict[tuple[str, str], int] = {}
        with self._db.transaction() as c:
            if self._fence is not None:
                self._fence(c, 0.0)
            for n, body, route in entries:
                c.execute(
                    "INSERT INTO alert_outbox_groups (route, group_key, next_seq) "
                    "VALUES (?, ?, 1) ON CONFLICT (route, group_key) "
                    "DO UPDATE SET next_seq = alert_outbox_groups.next_seq + 1",
                    (n.route, n.group_key),
                )
                seq = c.execute(
                    "SELECT next_seq FROM alert_outbox_groups WHERE route = ? AND group_key = ?",
                    (n.route, n.group_key),
                ).fetchone()[0]
                seqs[(n.route, n.group_key)] = seq
                key = str(uuid.uuid5(self.instance, f"{n.route}\x00{n.group_key}\x00{seq}"))
                if n.snapshot:
                    c.execute(
                        "UPDATE alert_outbox SET status = ?, finished_at = ? "
                        "WHERE route = ? AND group_key = ? AND status = ? "
                        "AND inflight_since IS NULL",
                        (OUTBOX_SUPERSEDED, now, n.route, n.group_key, OUTBOX_PENDING),
                    )
                cur = c.execute(
                    "INSERT INTO alert_outbox (idempotency_key, route, group_key, seq, status, "
                    "snapshot, reason, alert_status, firing, resolved, url, format, timeout, "
                    "secret_env, body, created_at, next_attempt_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    (key, n.route, n.group_key, seq, OUTBOX_PENDING, int(n.snapshot), n.reason,
                     n.status, len(n.firing), len(n.resolved), route.url, route.format,
                     route.timeout, route.secret_env, body, n.created_at, n.created_at),
                )
                ids.append(int(cur.fetchone()[0]))
            self._write_log(c, log, forget, seqs)
        return [self.get(i) for i in ids]

    @staticmethod
    def _write_log(c: Connection, log: Iterable[LogEntry],
                   forget: Iterable[tuple[str, str]],
                   seqs: dict[tuple[str, str], int]) -> None:
        for e in log:
            c.execute(
                "INSERT INTO alert_outbox_nflog (route, group_key, labels, created_at, firing, "
                "resolved, alerts, sent_at, notifications, seq) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (route, group_key) "
                "DO UPDATE SET labels = excluded.labels, created_at = excluded.created_at, "
                "firing = excluded.firing, resolved = excluded.resolved, "
                "alerts = excluded.alerts, sent_at = excluded.sent_at, "
                "notifications = excluded.notifications, "
                "seq = COALESCE(excluded.seq, alert_outbox_nflog.seq)",
                (e.route, e.group_key, json.dumps(dict(e.labels), sort_keys=True),
                 e.created_at, json.dumps(sorted(e.firing)), json.dumps(sorted(e.resolved)),
                 json.dumps([a.as_dict() for a in e.alerts], sort_keys=True), e.sent_at,
                 e.notifications, seqs.get((e.route, e.group_key), e.seq)),
            )
        c.executemany("DELETE FROM alert_outbox_nflog WHERE route = ? AND group_key = ?",
                      list(forget))

    def forget_log(self, groups: Iterable[tuple[str, str]]) -> None:
        """Remove the notification-log entries of these (route, group key)."""
        with self._db.transaction() as c:
            self._write_log(c, (), groups, {})

    def recover(self, now: float) -> list[OutboxItem]:
        """Rows whose attempt was cut short by the death of a process: due again now.

        Call once when a process starts delivering from this outbox (the notifier does):
        nothing can be in flight then, so every ``inflight_since`` is a leftover.
        """
        stuck = self._select("WHERE status = ? AND inflight_since IS NOT NULL",
                             (OUTBOX_PENDING,))
        with self._db.transaction() as c:
            for item in stuck:
                c.execute(
                    "UPDATE alert_outbox SET inflight_since = NULL, next_attempt_at = ?, "
                    "last_error = ? WHERE id = ?",
                    (min(item.next_attempt_at, now),
                     f"interrupted: the process stopped during attempt {item.attempts}",
                     item.id),
                )
        return stuck

    def begin_attempt(self, item_id: int, now: float, *, hold: float = 0.0) -> int | None:
        """Record that an attempt starts now; returns its number (1, 2, ...), or None when
        the row is no longer pending or already being sent.

        ``hold``: seconds the attempt may take (the route's timeout). With a fence, the
        attempt begins only if the lease has that long left, so it ends before another copy
        can take the lease and send the row again; else ``LeaseLost``.
        """
        with self._db.transaction() as c:
            if self._fence is not None:
                self._fence(c, hold)
            cur = c.execute(
                "UPDATE alert_outbox SET attempts = attempts + 1, inflight_since = ?, "
                "last_attempt_at = ? WHERE id = ? AND status = ? AND inflight_since IS NULL",
                (now, now, item_id, OUTBOX_PENDING),
            )
            if cur.rowcount != 1:
                return None
            return int(c.execute("SELECT attempts FROM alert_outbox WHERE id = ?",
                                 (item_id,)).fetchone()[0])

    def ack(self, item_id: int, now: float) -> None:
        """The receiver answered 2xx: done, whatever the row's state was (it was received)."""
        with self._db.transaction() as c:
            c.execute(
                "UPDATE alert_outbox SET status = ?, finished_at = ?, inflight_since = NULL, "
                "last_error = NULL WHERE id = ?",
                (OUTBOX_DONE, now, item_id),
            )

    def fail(self, item_id: int, now: float, error: str, *,
             attempt: int | None = None) -> OutboxItem:
        """The attempt failed with ``error``: schedule a retry with backoff, or give up when
        the notification is older than ``max_age``, or supersede it when it is a snapshot
        and a newer snapshot of its stream is waiting.

        ``attempt``: the number ``begin_attempt`` gave the failed attempt. When the row has
        had a later attempt since (a new leader took it over while this one hung), the late
        result changes nothing: the later attempt owns the row."""
        with self._db.transaction() as c:
            row = c.execute(f"SELECT {_COLUMNS} FROM alert_outbox WHERE id = ?",
                            (item_id,)).fetchone()
            if row is None:
                raise NotFound(f"no notification {item_id} in the outbox")
            item = OutboxItem._from_row(row)
            if attempt is not None and item.attempts != attempt:
                return item
            newer = item.snapshot and c.execute(
                "SELECT 1 FROM alert_outbox WHERE route = ? AND group_key = ? AND seq > ? "
                "AND status = ?", (item.route, item.group_key, item.seq, OUTBOX_PENDING),
            ).fetchone() is not None
            if item.status != OUTBOX_PENDING:
                c.execute("UPDATE alert_outbox SET inflight_since = NULL, last_error = ? "
                          "WHERE id = ?", (error, item_id))
            elif newer:
                c.execute(
                    "UPDATE alert_outbox SET status = ?, finished_at = ?, inflight_since = NULL,"
                    " last_error = ? WHERE id = ?",
                    (OUTBOX_SUPERSEDED, now, error, item_id),
                )
            elif now - item.created_at >= self.max_age:
                c.execute(
                    "UPDATE alert_outbox SET status = ?, finished_at = ?, inflight_since = NULL,"
                    " last_error = ? WHERE id = ?",
                    (OUTBOX_GIVEN_UP, now, error, item_id),
                )
            else:
                delay = backoff_delay(max(1, item.attempts), initial=self.retry_initial,
                                      cap=self.retry_max, rng=self._rng)
                c.execute(
                    "UPDATE alert_outbox SET inflight_since = NULL, last_error = ?, "
                    "next_attempt_at = ? WHERE id = ?",
                    (error, now + delay, item_id),
                )
        return self.get(item_id)

    def expire(self, now: float) -> list[OutboxItem]:
        """Give up every pending row older than ``max_age`` that is not being sent; returns
        them (as they are now: ``given_up``)."""
        cutoff = now - self.max_age
        old = self._select("WHERE status = ? AND inflight_since IS NULL AND created_at <= ?",
                           (OUTBOX_PENDING, cutoff))
        if not old:
            return []
        with self._db.transaction() as c:
            for item in old:
                error = item.last_error or "never attempted"
                c.execute(
                    "UPDATE alert_outbox SET status = ?, finished_at = ?, last_error = ? "
                    "WHERE id = ? AND status = ? AND inflight_since IS NULL",
                    (OUTBOX_GIVEN_UP, now,
                     f"given up after {self.max_age:g} s and {item.attempts} attempts "
                     f"(last: {error})", item.id, OUTBOX_PENDING),
                )
        return [self.get(i.id) for i in old]

    def prune(self, now: float, *, keep_seconds: float | None = None) -> int:
        """Delete finished rows (done, superseded, given up) finished more than
        ``keep_seconds`` ago (default ``max_age``), keeping the newest ``KEEP_FINISHED`` of
        each state; returns how many were deleted."""
        keep = self.max_age if keep_seconds is None else keep_seconds
        deleted = 0
        with self._db.transaction() as c:
            for status in (OUTBOX_DONE, OUTBOX_SUPERSEDED, OUTBOX_GIVEN_UP):
                cur = c.execute(
                    "DELETE FROM alert_outbox WHERE status = ? AND finished_at < ? AND id NOT IN "
                    "(SELECT id FROM alert_outbox WHERE status = ? ORDER BY id DESC LIMIT ?)",
                    (status, now - keep, status, KEEP_FINISHED),
                )
                deleted += cur.rowcount
        return deleted

    def save_active(self, alerts: Iterable[tuple[Alert, Sequence[str]]]) -> None:
        """Replace the list of active alerts (each with the names of its routes)."""
        with self._db.transaction() as c:
            c.execute("DELETE FROM alert_active")
            c.executemany(
                "INSERT INTO alert_active (fingerprint, alert, routes) VALUES (?, ?, ?) "
                "ON CONFLICT (fingerprint) DO UPDATE SET alert = excluded.alert, "
                "routes = excluded.routes",
                [(a.fingerprint, json.dumps(a.as_dict(), sort_keys=True), json.dumps(list(r)))
                 for a, r in alerts],
            )

    # --- reading ------------------------------------------------------------------------
    def get(self, item_id: int) -> OutboxItem:
        found = self._select("WHERE id = ?", (item_id,))
        if not found:
            raise NotFound(f"no notification {item_id} in the outbox")
        return found[0]

    def next_due(self, now: float) -> list[OutboxItem]:
        """The head (oldest pending row) of every group whose head is due at ``now`` and
        not being sent; oldest due first."""
        return self._select(
            "WHERE id IN (SELECT o.id FROM alert_outbox o JOIN "
            "(SELECT route, group_key, MIN(seq) AS seq FROM alert_outbox WHERE status = ? "
            "GROUP BY route, group_key) h ON o.route = h.route AND o.group_key = h.group_key "
            "AND o.seq = h.seq WHERE o.next_attempt_at <= ? AND o.inflight_since IS NULL) "
            "ORDER BY next_attempt_at, id",
            (OUTBOX_PENDING, now),
        )

    def head(self, route: str, group_key: str) -> OutboxItem | None:
        """The oldest pending row of one group (due or not), or None."""
        found = self._select(
            "WHERE route = ? AND group_key = ? AND status = ? ORDER BY seq LIMIT 1",
            (route, group_key, OUTBOX_PENDING),
        )
        return found[0] if found else None

    def items(self, status: str | None = None, *, limit: int | None = None,
              newest_first: bool = False) -> list[OutboxItem]:
        """Rows, optionally of one state, in id order (or newest first)."""
        where, params = ("WHERE status = ?", [status]) if status else ("", [])
        order = "DESC" if newest_first else "ASC"
        sql = f"{where} ORDER BY id {order}"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return self._select(sql, params)

    def next_attempt_at(self) -> float | None:
        """When the earliest pending row is due (Unix seconds), or None when none is."""
        row = self._db.query(
            "SELECT MIN(next_attempt_at) FROM alert_outbox WHERE status = ?", (OUTBOX_PENDING,),
        )[0]
        return None if row[0] is None else float(row[0])

    def stats(self, now: float) -> OutboxStats:
        with self._db.snapshot() as c:
            counts = dict(c.execute(
                "SELECT status, COUNT(*) FROM alert_outbox GROUP BY status").fetchall())
            in_flight, oldest = c.execute(
                "SELECT COUNT(inflight_since), MIN(created_at) FROM alert_outbox "
                "WHERE status = ?", (OUTBOX_PENDING,),
            ).fetchone()
        return OutboxStats(
            pending=counts.get(OUTBOX_PENDING, 0),
            in_flight=in_flight or 0,
            done=counts.get(OUTBOX_DONE, 0),
            given_up=counts.get(OUTBOX_GIVEN_UP, 0),
            superseded=counts.get(OUTBOX_SUPERSEDED, 0),
            oldest_pending_age=0.0 if oldest is None else max(0.0, now - float(oldest)),
        )

    def notification_log(self) -> list[LogEntry]:
        """Every notification-log entry, by route then group key."""
        rows = self._db.query(
            "SELECT route, group_key, labels, created_at, firing, resolved, alerts, sent_at, "
            "notifications, seq FROM alert_outbox_nflog ORDER BY route, group_key",
        )
        return [
            LogEntry(route=r, group_key=k, labels=json.loads(labels), created_at=float(created),
                     firing=frozenset(json.loads(firing)),
                     resolved=frozenset(json.loads(resolved)),
                     sent_at=float(sent_at),
                     alerts=tuple(Alert.from_dict(a) for a in json.loads(alerts)),
                     notifications=int(count), seq=None if seq is None else int(seq))
            for r, k, labels, created, firing, resolved, alerts, sent_at, count, seq in rows
        ]

    def active(self) -> list[tuple[Alert, list[str]]]:
        """The alerts saved by the last ``save_active``, with their route names."""
        rows = self._db.query("SELECT alert, routes FROM alert_active ORDER BY fingerprint")
        return [(Alert.from_dict(json.loads(a)), json.loads(r)) for a, r in rows]
