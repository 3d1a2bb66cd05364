"""The batch queue's durable state: uploaded files, batches and their requests.

The tables live in the gateway's database (``[gateway] records_path``, an SQLite file in WAL
mode shared with the request records, or the PostgreSQL server of ``[gateway] database``) and
are all prefixed ``batch_``. Several gateway instances may share one PostgreSQL database: the
SQL is written once, in the subset both databases accept (``vigil.storage.database``).

A request moves ``queued -> in_flight -> ok | error``; ``queued`` may also end ``expired`` or
``cancelled``. ``claim`` marks a request in flight under a **lease**: the claiming instance
(``owner``) and ``lease_until``, a clock time the owner pushes forward (``renew``) while it
works on the request. A request whose lease ran out belongs to an instance that died or lost
the database: the next ``claim`` of any instance takes it back (at-least-once delivery
upstream), counting one more attempt: a request that takes down every instance sending it
ends with an error line after ``max_attempts`` of them rather than being sent forever. An
instance that stops cleanly hands its requests back (``hand_back``: lease 0), and they are
claimed again at once, no attempt counted. Only requests of running batches (``in_progress``,
not past their window) are claimed; queued requests of a batch being cancelled or already
expired end ``cancelled``/``expired`` in the claim's transaction (a retry can put one back in
the queue while the batch is cancelled by another instance). A result is written only by the
request's current owner while it is still in flight (``finish``, ``retry_later``), so a late
answer from an instance whose lease was taken over writes nothing, and every
``(batch_id, custom_id)`` (the primary key) has exactly one line in the output. Claims lock
the rows they take and skip rows another transaction holds (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL; SQLite lets one writer in at a time), so two instances claiming at once get
disjoint requests; ``expire_due``, ``finalize_ready`` and
``purge`` lock the batch rows the same way and check the status again in their ``UPDATE``, so
a batch gets one final status and one output file; ``finalize_ready`` ends each batch in a
transaction of its own, so one large batch does not hold the locks of the others.

Every method is one short transaction (``finalize_ready``: one per batch) and blocks for a
database round trip (on PostgreSQL, during an outage, up to the pool's timeout, then
``StoreUnavailable``): the queue calls them from worker threads, never from its event loop.
Times are Unix seconds of the caller's clock; instances sharing a database need clocks that
agree to well within the lease.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vigil.conventions import (
    BATCH_ERROR_CANCELLED,
    BATCH_ERROR_EXPIRED,
    BATCH_ERROR_UPSTREAM,
    BATCH_FILE_ID_PREFIX,
    BATCH_ID_PREFIX,
    BATCH_PURPOSE_OUTPUT,
    BATCH_REQUEST_ID_PREFIX,
)
from vigil.storage.database import Connection, SqlDatabase, open_database

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_MAX_ATTEMPTS",
    "MIGRATIONS",
    "BatchStore",
    "ClaimedRequest",
    "NewRequest",
    "RequestCounts",
    "StoredBatch",
    "StoredFile",
    "new_id",
    "new_owner",
]

#: Seconds a claim holds a request before another instance may take it back.
DEFAULT_LEASE = 30.0
#: Tries in all of one request (a send that failed, or a lease that ran out) before its
#: error line is written; the queue passes its ``retry_attempts``.
DEFAULT_MAX_ATTEMPTS = 4
#: The name of the batch tables' schema steps in ``vigil_schema``.
COMPONENT = "gateway_batch"
#: Requests renewed per statement: keeps the statement's parameter count small.
_RENEW_CHUNK = 200

# Request states. "ok" and "error" hold a result line; the others get theirs at finalization.
QUEUED, IN_FLIGHT, OK, ERROR, EXPIRED, CANCELLED = (
    "queued", "in_flight", "ok", "error", "expired", "cancelled")
_PENDING = (QUEUED, IN_FLIGHT)
#: The state of a request going back to the queue (a retry, or a lease that ran out): its
#: batch may have been cancelled or may have expired while it was in flight, and then it ends
#: as the batch's queued requests did rather than being sent again.
_BACK_TO_QUEUE = (
    "CASE WHEN batch_id IN (SELECT id FROM batch_batches WHERE status = 'cancelling') "
    f"THEN '{CANCELLED}' WHEN batch_id IN (SELECT id FROM batch_batches "
    f"WHERE expired_at IS NOT NULL) THEN '{EXPIRED}' ELSE '{QUEUED}' END")
#: The state of a request whose lease ran out once too often: an error line, unless its batch
#: ended meanwhile (as in ``_BACK_TO_QUEUE``).
_GIVE_UP = _BACK_TO_QUEUE.replace(f"ELSE '{QUEUED}'", f"ELSE '{ERROR}'")
#: ``lease_until`` of a request handed back by an instance that stopped cleanly: claimed again
#: at once, with no attempt counted.
_HANDED_BACK = 0.0
#: A request in flight whose lease has run out by ``?`` (no lease: left by a release
#: without leases).
_LAPSED = f"(lease_until IS NULL OR lease_until = {_HANDED_BACK} OR lease_until < ?)"
#: Batches whose queued requests are no longer sent: being cancelled, or past their window
#: (an expired batch stays ``in_progress`` until it is finalized).
_STOPPED_BATCHES = ("SELECT id FROM batch_batches WHERE status = 'cancelling' "
                    "OR (status = 'in_progress' AND expired_at IS NOT NULL)")

#: Schema step 1: the tables as the first release created them (unchanged, so that files it
#: wrote are upgraded in place).
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS batch_files (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    content BLOB NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS batch_batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    in_progress_at INTEGER,
    finalizing_at INTEGER,
    completed_at INTEGER,
    failed_at INTEGER,
    expired_at INTEGER,
    cancelling_at INTEGER,
    cancelled_at INTEGER,
    -- when the batch reached its final status: retention counts from here
    ended_at INTEGER,
    output_file_id TEXT,
    error_file_id TEXT,
    errors TEXT,
    metadata TEXT,
    model TEXT
)""",
    "CREATE INDEX IF NOT EXISTS batch_batches_tenant ON batch_batches (tenant, seq)",
    "CREATE INDEX IF NOT EXISTS batch_batches_status ON batch_batches (status)",
    """CREATE TABLE IF NOT EXISTS batch_requests (
    batch_id TEXT NOT NULL,
    custom_id TEXT NOT NULL,
    -- the batch's seq, copied so that the release order needs no join
    batch_seq INTEGER NOT NULL,
    line INTEGER NOT NULL,
    pool TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    not_before REAL NOT NULL DEFAULT 0,
    result TEXT,
    finished_at REAL,
    PRIMARY KEY (batch_id, custom_id)
)""",
    """CREATE INDEX IF NOT EXISTS batch_requests_release
    ON batch_requests (pool, state, batch_seq, line)""",
    "CREATE INDEX IF NOT EXISTS batch_requests_state ON batch_requests (batch_id, state)",
)


#: Schema steps (append-only): 1 the tables, 2 the leases of requests in flight. A request
#: left in flight by a release without leases has no ``lease_until``: it counts as expired.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    _SCHEMA,
    ("ALTER TABLE batch_requests ADD COLUMN owner TEXT",
     "ALTER TABLE batch_requests ADD COLUMN lease_until REAL",
     "CREATE INDEX IF NOT EXISTS batch_requests_owner ON batch_requests (state, owner)"),
)


def new_id(prefix: str) -> str:
    """A fresh object id in OpenAI's spelling (``file-`` + 24 hex digits, ``batch_...``)."""
    return f"{prefix}{secrets.token_hex(12)}"


def new_owner() -> str:
    """A fresh id for one gateway instance: host, process and a random part (a restarted
    process on the same host and pid is another owner)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True)
class StoredFile:
    """A file's metadata (``created_at`` in Unix seconds, ``bytes`` its size)."""

    id: str
    tenant: str
    purpose: str
    filename: str
    bytes: int
    created_at: int


@dataclass(frozen=True)
class StoredBatch:
    """A batch row; every ``*_at`` is Unix seconds or None."""

    id: str
    tenant: str
    key_id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    output_file_id: str | None
    error_file_id: str | None
    #: Validation errors of a failed batch: ``[{"code", "line", "message", "param"}]``.
    errors: list[dict[str, Any]] | None
    metadata: dict[str, str] | None
    model: str | None


@dataclass(frozen=True)
class RequestCounts:
    """OpenAI's ``request_counts``: ``failed`` includes expired and cancelled requests."""

    total: int
    completed: int
    failed: int


@dataclass(frozen=True)
class NewRequest:
    """One validated input line, ready to queue (``body`` as canonical JSON text)."""

    line: int
    custom_id: str
    pool: str
    endpoint: str
    body: str


@dataclass(frozen=True)
class ClaimedRequest:
    """A request taken off the queue to be sent (``attempts``: earlier tries that failed,
    lapsed leases included; ``leased_at``: the clock time its lease counts from, seconds)."""

    batch_id: str
    custom_id: str
    pool: str
    endpoint: str
    body: dict[str, Any]
    attempts: int
    tenant: str
    key_id: str
    leased_at: float

    @property
    def key(self) -> tuple[str, str]:
        """``(batch_id, custom_id)``, the request's primary key."""
        return self.batch_id, self.custom_id


_BATCH_COLUMNS = ("id, tenant, key_id, input_file_id, endpoint, completion_window, status, "
                  "created_at, expires_at, in_progress_at, finalizing_at, completed_at, "
                  "failed_at, expired_at, cancelling_at, cancelled_at, output_file_id, "
                  "error_file_id, errors, metadata, model")


def _batch(row: Sequence[Any]) -> StoredBatch:
    values = list(row)
    values[18] = json.loads(values[18]) if values[18] else None
    values[19] = json.loads(values[19]) if values[19] else None
    return StoredBatch(*values)


def _jsonl(lines: Sequence[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode() if lines else b""


class BatchStore:
    """The batch tables in ``target``: an SQLite path (created if missing) or a
    ``postgresql://`` URL.

    ``owner`` names this instance in the leases it takes (default: ``new_owner()``); ``lease``
    is how many seconds a claim holds a request unless renewed; ``max_attempts`` is how many
    lapsed leases (with the failed sends counted by the queue) a request gets before
    ``claim`` writes its error line instead of sending it again.
    """

    def __init__(self, target: str | Path, *, owner: str | None = None,
                 lease: float = DEFAULT_LEASE,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        if not lease > 0:
            raise ValueError(f"lease must be more than 0 seconds, got {lease}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.target = target
        self.owner = owner or new_owner()
        self.lease = float(lease)
        self.max_attempts = max_attempts
        self._db: SqlDatabase = open_database(target, what="the batch queue",
                                              component=COMPONENT, migrations=MIGRATIONS)
        self._d = self._db.dialect

    @property
    def display(self) -> str:
        """The file path, or the URL without its password."""
        return self._db.display

    def close(self) -> None:
        """Close the database (the state is already stored)."""
        self._db.close()

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        return self._db.query(sql, args)

    # --- files ------------------------------------------------------------------------------
    def add_file(self, *, tenant: str, purpose: str, filename: str, content: bytes,
                 now: int) -> StoredFile:
        """Store ``content`` as a new file of ``tenant``."""
        f = StoredFile(new_id(BATCH_FILE_ID_PREFIX), tenant, purpose, filename, len(content), now)
        with self._db.transaction(doing="store a file in") as db:
            self._insert_file(db, f, content)
        return f

    @staticmethod
    def _insert_file(db: Connection, f: StoredFile, content: bytes) -> None:
        db.execute("INSERT INTO batch_files (id, tenant, purpose, filename, bytes, created_at, "
                   "content) VALUES (?, ?, ?, ?, ?, ?, ?)",
                   (f.id, f.tenant, f.purpose, f.filename, f.bytes, f.created_at, content))

    def file(self, file_id: str, tenant: str) -> StoredFile | None:
        """The file ``file_id`` if it belongs to ``tenant``."""
        rows = self._read("SELECT id, tenant, purpose, filename, bytes, created_at "
                          "FROM batch_files WHERE id = ? AND tenant = ?", (file_id, tenant))
        return StoredFile(*rows[0]) if rows else None

    def file_content(self, file_id: str, tenant: str) -> bytes | None:
        """The bytes of ``file_id`` if it belongs to ``tenant``."""
        rows = self._read("SELECT content FROM batch_files WHERE id = ? AND tenant = ?",
                          (file_id, tenant))
        return bytes(rows[0][0]) if rows else None

    # --- batches ----------------------------------------------------------------------------
    def add_batch(self, *, tenant: str, key_id: str, input_file_id: str, endpoint: str,
                  completion_window: str, window_s: float, metadata: dict[str, str] | None,
                  model: str | None, requests: Sequence[NewRequest], now: int) -> str:
        """A new ``in_progress`` batch with ``requests`` queued; returns its id."""
        batch_id = new_id(BATCH_ID_PREFIX)
        with self._db.transaction(doing="queue a batch in") as db:
            seq = db.execute(
                "INSERT INTO batch_batches (id, tenant, key_id, input_file_id, endpoint, "
                "completion_window, status, created_at, expires_at, in_progress_at, metadata, "
                "model) VALUES (?, ?, ?, ?, ?, ?, 'in_progress', ?, ?, ?, ?, ?) RETURNING seq",
                (batch_id, tenant, key_id, input_file_id, endpoint, completion_window, now,
                 int(now + window_s), now, json.dumps(metadata) if metadata else None,
                 model)).fetchone()[0]
            db.executemany(
                "INSERT INTO batch_requests (batch_id, custom_id, batch_seq, line, pool, "
                "endpoint, body, state) VALUES (?, ?, ?, ?, ?, ?, ?, 'queued')",
                [(batch_id, r.custom_id, seq, r.line, r.pool, r.endpoint, r.body)
                 for r in requests])
        return batch_id

    def add_failed_batch(self, *, tenant: str, key_id: str, input_file_id: str, endpoint: str,
                         completion_window: str, window_s: float,
                         metadata: dict[str, str] | None, errors: list[dict[str, Any]],
                         now: int) -> str:
        """A batch that failed validation (status ``failed``, ``errors`` set); returns its id."""
        batch_id = new_id(BATCH_ID_PREFIX)
        with self._db.transaction(doing="store a batch in") as db:
            db.execute(
                "INSERT INTO batch_batches (id, tenant, key_id, input_file_id, endpoint, "
                "completion_window, status, created_at, expires_at, failed_at, ended_at, "
                "errors, metadata) VALUES (?, ?, ?, ?, ?, ?, 'failed', ?, ?, ?, ?, ?, ?)",
                (batch_id, tenant, key_id, input_file_id, endpoint, completion_window, now,
                 int(now + window_s), now, now, json.dumps(errors),
                 json.dumps(metadata) if metadata else None))
        return batch_id

    def batch(self, batch_id: str, tenant: str) -> StoredBatch | None:
        """The batch ``batch_id`` if it belongs to ``tenant``."""
        rows = self._read(f"SELECT {_BATCH_COLUMNS} FROM batch_batches "
                          "WHERE id = ? AND tenant = ?", (batch_id, tenant))
        return _batch(rows[0]) if rows else None

    def list_batches(self, tenant: str, *, after: str | None, limit: int
                     ) -> tuple[list[StoredBatch], bool]:
        """``tenant``'s batches, newest first, after the batch ``after``; and whether more
        follow."""
        sql = f"SELECT {_BATCH_COLUMNS} FROM batch_batches WHERE tenant = ?"
        args: list[Any] = [tenant]
        if after is not None:
            sql += (" AND seq < COALESCE((SELECT seq FROM batch_batches WHERE id = ? "
                    "AND tenant = ?), -1)")
            args += [after, tenant]
        sql += " ORDER BY seq DESC LIMIT ?"
        args.append(limit + 1)
        rows = self._read(sql, args)
        return [_batch(r) for r in rows[:limit]], len(rows) > limit

    def counts(self, batch_id: str) -> RequestCounts:
        """How many of the batch's requests there are, succeeded and failed so far."""
        by_state = {state: int(n) for state, n in self._read(
            "SELECT state, COUNT(*) FROM batch_requests WHERE batch_id = ? GROUP BY state",
            (batch_id,))}
        return RequestCounts(
            total=sum(by_state.values()), completed=by_state.get(OK, 0),
            failed=sum(by_state.get(s, 0) for s in (ERROR, EXPIRED, CANCELLED)))

    def cancel(self, batch_id: str, now: int) -> None:
        """Start cancelling an ``in_progress`` batch: queued requests are dropped at once,
        requests in flight finish (the next ``finalize_ready`` ends the batch)."""
        with self._db.transaction(doing="cancel a batch in") as db:
            cur = db.execute("UPDATE batch_batches SET status = 'cancelling', cancelling_at = ? "
                             "WHERE id = ? AND status IN ('validating', 'in_progress')",
                             (now, batch_id))
            if cur.rowcount:
                db.execute("UPDATE batch_requests SET state = ?, finished_at = ? "
                           "WHERE batch_id = ? AND state = ?", (CANCELLED, now, batch_id, QUEUED))

    # --- the queue --------------------------------------------------------------------------
    def has_queued(self, pool: str, now: float) -> bool:
        """Whether ``pool`` has a request ready to send at ``now``: queued, or in flight
        under a lease that ran out."""
        return bool(self._read(
            "SELECT 1 FROM batch_requests WHERE pool = ? AND ((state = ? AND not_before <= ?) "
            f"OR (state = ? AND {_LAPSED})) LIMIT 1",
            (pool, QUEUED, now, IN_FLIGHT, now)))

    def claim(self, pool: str, n: int, now: float | Callable[[], float]
              ) -> list[ClaimedRequest]:
        """Take up to ``n`` of ``pool``'s ready requests, oldest batch first, in file order,
        and mark them in flight under this owner's lease (until ``now + lease``).

        ``now`` is clock seconds, or the clock itself, read once the transaction has begun
        (a claim that waited for a lock still gets a full lease); ``leased_at`` of each
        request says which time was used. Only requests of running batches are taken.
        Requests whose lease ran out by ``now`` go back to the queue first with one more
        attempt counted (or end cancelled or expired with their batch, or with an error line
        after ``max_attempts``), whoever held them; queued requests of a batch being
        cancelled or past its window end ``cancelled``/``expired``.
        """
        skip = self._d.skip_locked()
        with self._db.transaction(doing="claim requests from") as db:
            t = float(now()) if callable(now) else float(now)
            self._take_back_lapsed(db, pool, t, skip)
            self._end_stopped(db, pool, t)
            rows = db.execute(
                "SELECT r.batch_id, r.custom_id, r.pool, r.endpoint, r.body, r.attempts, "
                "b.tenant, b.key_id FROM batch_requests r JOIN batch_batches b "
                "ON b.id = r.batch_id WHERE r.pool = ? AND r.state = ? AND r.not_before <= ? "
                "AND b.status = 'in_progress' AND b.expired_at IS NULL AND b.expires_at > ? "
                f"ORDER BY r.batch_seq, r.line LIMIT ?{self._d.skip_locked('r')}",
                (pool, QUEUED, t, t, n)).fetchall()
            if rows:
                db.executemany(
                    "UPDATE batch_requests SET state = ?, owner = ?, lease_until = ? "
                    "WHERE batch_id = ? AND custom_id = ? AND state = ?",
                    [(IN_FLIGHT, self.owner, t + self.lease, r[0], r[1], QUEUED)
                     for r in rows])
        return [ClaimedRequest(r[0], r[1], r[2], r[3], json.loads(r[4]), int(r[5]), r[6], r[7],
                               t) for r in rows]

    def _take_back_lapsed(self, db: Connection, pool: str, now: float, skip: str) -> None:
        lapsed = db.execute(
            "SELECT batch_id, custom_id, attempts, lease_until FROM batch_requests "
            f"WHERE pool = ? AND state = ? AND {_LAPSED}{skip}",
            (pool, IN_FLIGHT, now)).fetchall()
        back: list[tuple[Any, ...]] = []
        gave_up: list[tuple[Any, ...]] = []
        for batch_id, custom_id, attempts, lease_until in lapsed:
            # A lease that ran out is a try that failed (the instance died sending it, maybe
            # because of it); a request handed back on shutdown was not tried to the end.
            tries = int(attempts) + (0 if lease_until == _HANDED_BACK else 1)
            if tries < self.max_attempts:
                back.append((tries, batch_id, custom_id, IN_FLIGHT))
                continue
            line = {"id": new_id(BATCH_REQUEST_ID_PREFIX), "custom_id": custom_id,
                    "response": None,
                    "error": {"code": BATCH_ERROR_UPSTREAM,
                              "message": f"the request was tried {tries} times and never "
                                         "answered: each time, the gateway instance sending it "
                                         "stopped or lost the database first"}}
            gave_up.append((tries, json.dumps(line), now, batch_id, custom_id, IN_FLIGHT))
        if back:
            db.executemany(
                f"UPDATE batch_requests SET state = {_BACK_TO_QUEUE}, attempts = ?, "
                "owner = NULL, lease_until = NULL WHERE batch_id = ? AND custom_id = ? "
                "AND state = ?", back)
        if gave_up:
            db.executemany(
                f"UPDATE batch_requests SET state = {_GIVE_UP}, attempts = ?, result = ?, "
                "finished_at = ?, owner = NULL, lease_until = NULL WHERE batch_id = ? "
                "AND custom_id = ? AND state = ?", gave_up)

    @staticmethod
    def _end_stopped(db: Connection, pool: str | None, now: float) -> None:
        """Queued requests of batches being cancelled or past their window end as their
        batch's queued requests did: on PostgreSQL a retry (``_BACK_TO_QUEUE``) may have read
        the batch as running while another instance cancelled it, and without this the
        batch would never finalize."""
        sql = (f"UPDATE batch_requests SET state = CASE WHEN batch_id IN (SELECT id FROM "
               f"batch_batches WHERE status = 'cancelling') THEN '{CANCELLED}' "
               f"ELSE '{EXPIRED}' END, finished_at = ? WHERE state = ? "
               f"AND batch_id IN ({_STOPPED_BATCHES})")
        args: list[Any] = [now, QUEUED]
        if pool is not None:
            sql += " AND pool = ?"
            args.append(pool)
        db.execute(sql, args)

    def _update_held(self, set_sql: str, value: float, keys: Iterable[tuple[str, str]], *,
                     doing: str) -> int:
        todo = list(keys)
        changed = 0
        for i in range(0, len(todo), _RENEW_CHUNK):
            chunk = todo[i:i + _RENEW_CHUNK]
            values = ", ".join(["(?, ?)"] * len(chunk))
            changed += self._db.execute(
                f"UPDATE batch_requests SET {set_sql} WHERE owner = ? AND state = ? "
                f"AND (batch_id, custom_id) IN (VALUES {values})",
                [value, self.owner, IN_FLIGHT, *(x for k in chunk for x in k)], doing=doing)
        return changed

    def renew(self, keys: Iterable[tuple[str, str]], now: float) -> int:
        """Extend to ``now + lease`` the leases this owner still holds on ``keys``
        (``(batch_id, custom_id)``); how many it still held. A request another instance
        took over is left alone."""
        return self._update_held("lease_until = ?", now + self.lease, keys,
                                 doing="renew the leases of")

    def hand_back(self, keys: Iterable[tuple[str, str]]) -> int:
        """Give up this owner's leases on ``keys`` (a clean shutdown): the next claim of any
        instance takes them at once and counts no attempt. How many it still held."""
        return self._update_held("lease_until = ?", _HANDED_BACK, keys,
                                 doing="hand requests back to")

    def finish(self, batch_id: str, custom_id: str, *, ok: bool, line: dict[str, Any],
               now: float) -> bool:
        """Store a sent request's result line (output file if ``ok``, else error file);
        whether it was stored: only while this owner holds the request in flight."""
        return bool(self._db.execute(
            "UPDATE batch_requests SET state = ?, result = ?, finished_at = ?, "
            "lease_until = NULL WHERE batch_id = ? AND custom_id = ? AND state = ? "
            "AND owner = ?",
            (OK if ok else ERROR, json.dumps(line), now, batch_id, custom_id, IN_FLIGHT,
             self.owner), doing="store a result in"))

    def retry_later(self, batch_id: str, custom_id: str, *, attempts: int,
                    not_before: float) -> bool:
        """Put a request whose send failed back in the queue, not to be sent before
        ``not_before`` (clock seconds); whether it was (only while this owner holds it)."""
        return bool(self._db.execute(
            f"UPDATE batch_requests SET state = {_BACK_TO_QUEUE}, attempts = ?, "
            "not_before = ?, owner = NULL, lease_until = NULL WHERE batch_id = ? "
            "AND custom_id = ? AND state = ? AND owner = ?",
            (attempts, not_before, batch_id, custom_id, IN_FLIGHT, self.owner),
            doing="queue a retry in"))

    def depth(self, pool: str) -> int:
        """Requests of ``pool`` queued or in flight (on any instance)."""
        return self.depths().get(pool, 0)

    def depths(self) -> dict[str, int]:
        """Requests queued or in flight (on any instance), per pool that has any."""
        return {pool: int(n) for pool, n in self._read(
            "SELECT pool, COUNT(*) FROM batch_requests WHERE state IN (?, ?) GROUP BY pool",
            _PENDING)}

    def expire_due(self, now: int) -> list[str]:
        """Batches past their completion window: their queued requests expire (requests in
        flight finish), and queued requests left in a stopped batch end (see ``claim``).
        Returns the ids of the batches that expired now (by this call: an instance running it
        at the same time gets the others)."""
        expired: list[str] = []
        with self._db.transaction(doing="expire batches in") as db:
            ids = [r[0] for r in db.execute(
                "SELECT id FROM batch_batches WHERE status = 'in_progress' AND expired_at IS NULL "
                f"AND expires_at <= ? ORDER BY seq{self._d.skip_locked()}", (now,)).fetchall()]
            for batch_id in ids:
                if not db.execute("UPDATE batch_batches SET expired_at = ? WHERE id = ? "
                                  "AND status = 'in_progress' AND expired_at IS NULL",
                                  (now, batch_id)).rowcount:
                    continue
                db.execute("UPDATE batch_requests SET state = ?, finished_at = ? "
                           "WHERE batch_id = ? AND state = ?", (EXPIRED, now, batch_id, QUEUED))
                expired.append(batch_id)
            # Also for pools no claim visits now (no headroom): their batches still end.
            self._end_stopped(db, None, now)
        return expired

    def finalize_ready(self, now: int, *, batch_id: str | None = None) -> list[str]:
        """End every running batch (or only ``batch_id``) with nothing left queued or in
        flight: write its output and error files and set its final status, one batch per
        transaction. Returns the ids of the batches this call ended (an instance running it
        at the same time ends the others)."""
        ready_sql = ("SELECT id FROM batch_batches b WHERE status IN ('in_progress', "
                     "'cancelling') AND NOT EXISTS (SELECT 1 FROM batch_requests r "
                     "WHERE r.batch_id = b.id AND r.state IN (?, ?))")
        args: list[Any] = list(_PENDING)
        if batch_id is not None:
            ready_sql += " AND id = ?"
            args.append(batch_id)
        ended: list[str] = []
        for (ready_id,) in self._read(ready_sql + " ORDER BY seq", args):
            with self._db.transaction(doing="finalize a batch in") as db:
                # Read again under the row's lock: another instance may be ending it, or a
                # retry may have put a request back meanwhile.
                row = db.execute(
                    "SELECT id, tenant, status, expired_at FROM batch_batches b WHERE id = ? "
                    "AND status IN ('in_progress', 'cancelling') AND NOT EXISTS (SELECT 1 FROM "
                    "batch_requests r WHERE r.batch_id = b.id AND r.state IN (?, ?))"
                    f"{self._d.skip_locked()}", (ready_id, *_PENDING)).fetchone()
                if row is not None and self._finalize(db, *row, now):
                    ended.append(ready_id)
        return ended

    def _finalize(self, db: Connection, batch_id: str, tenant: str, status: str,
                  expired_at: int | None, now: int) -> bool:
        out: list[str] = []
        err: list[str] = []
        for custom_id, state, result in db.execute(
                "SELECT custom_id, state, result FROM batch_requests WHERE batch_id = ? "
                "ORDER BY line", (batch_id,)).fetchall():
            if state == OK:
                out.append(result)
            elif state == ERROR:
                err.append(result)
            else:  # expired or cancelled before it was sent
                code, message = ((BATCH_ERROR_EXPIRED, "This request could not be executed "
                                  "before the completion window expired.")
                                 if state == EXPIRED else
                                 (BATCH_ERROR_CANCELLED, "The batch was cancelled before this "
                                  "request was sent."))
                err.append(json.dumps({"id": new_id(BATCH_REQUEST_ID_PREFIX),
                                       "custom_id": custom_id, "response": None,
                                       "error": {"code": code, "message": message}}))
        files = [(kind, StoredFile(new_id(BATCH_FILE_ID_PREFIX), tenant, BATCH_PURPOSE_OUTPUT,
                                   f"{batch_id}_{kind}.jsonl", len(content), now), content)
                 for kind, lines in (("output", out), ("error", err)) if lines
                 for content in (_jsonl(lines),)]
        file_ids = {kind: f.id for kind, f, _ in files}
        final = ("cancelled" if status == "cancelling"
                 else "expired" if expired_at is not None else "completed")
        # The status is checked again here: the batch's row may have ended since it was read.
        if not db.execute(
                "UPDATE batch_batches SET status = ?, finalizing_at = ?, ended_at = ?, "
                "completed_at = ?, cancelled_at = ?, output_file_id = ?, error_file_id = ? "
                "WHERE id = ? AND status IN ('in_progress', 'cancelling')",
                (final, now, now, now if final == "completed" else None,
                 now if final == "cancelled" else None, file_ids.get("output"),
                 file_ids.get("error"), batch_id)).rowcount:
            return False
        for _, f, content in files:
            self._insert_file(db, f, content)
        return True

    def purge(self, now: float, retention: float) -> int:
        """Forget batches that ended more than ``retention`` seconds ago, with their requests
        and output files, and input files that old which no remaining batch uses. Returns how
        many batches this call removed."""
        cutoff = now - retention
        skip = self._d.skip_locked()
        with self._db.transaction(doing="purge old batches from") as db:
            old = db.execute("SELECT id, output_file_id, error_file_id FROM batch_batches "
                             f"WHERE ended_at IS NOT NULL AND ended_at <= ? ORDER BY seq{skip}",
                             (cutoff,)).fetchall()
            for batch_id, output_id, error_id in old:
                db.execute("DELETE FROM batch_requests WHERE batch_id = ?", (batch_id,))
                db.execute("DELETE FROM batch_files WHERE id IN (?, ?)", (output_id, error_id))
                db.execute("DELETE FROM batch_batches WHERE id = ?", (batch_id,))
            unused = db.execute(
                "SELECT id FROM batch_files WHERE created_at <= ? AND purpose != ? AND id "
                f"NOT IN (SELECT input_file_id FROM batch_batches) ORDER BY id{skip}",
                (cutoff, BATCH_PURPOSE_OUTPUT)).fetchall()
            if unused:
                db.executemany("DELETE FROM batch_files WHERE id = ?", [(r[0],) for r in unused])
        return len(old)
