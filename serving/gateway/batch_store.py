"""The batch queue's durable state: uploaded files, batches and their requests, in SQLite.

The tables live in the gateway's records database (WAL: the gateway's request records are
written to the same file by another connection) and are all prefixed ``batch_``.

A request moves ``queued -> in_flight -> ok | error``; ``queued`` may also end ``expired`` or
``cancelled``. It is marked ``ok``/``error`` only in the transaction that stores its result, so
a request that was ``in_flight`` when the process died is simply queued again at the next start
(``requeue_in_flight``): at-least-once delivery upstream, and exactly one result per
``(batch_id, custom_id)`` (the primary key) in the output.

Every method takes the lock and runs one short transaction; the queue calls them from its event
loop, and ``depth`` may be called from any thread (a metrics collector).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vigil.conventions import (
    BATCH_ERROR_CANCELLED,
    BATCH_ERROR_EXPIRED,
    BATCH_FILE_ID_PREFIX,
    BATCH_ID_PREFIX,
    BATCH_PURPOSE_OUTPUT,
    BATCH_REQUEST_ID_PREFIX,
)
from vigil.sqlite import Database

__all__ = [
    "BatchStore",
    "ClaimedRequest",
    "NewRequest",
    "RequestCounts",
    "StoredBatch",
    "StoredFile",
    "new_id",
]

# Request states. "ok" and "error" hold a result line; the others get theirs at finalization.
QUEUED, IN_FLIGHT, OK, ERROR, EXPIRED, CANCELLED = (
    "queued", "in_flight", "ok", "error", "expired", "cancelled")
_PENDING = (QUEUED, IN_FLIGHT)
#: The state of a request going back to the queue (a retry, or in flight at a restart): its
#: batch may have been cancelled or may have expired while it was in flight, and then it ends
#: as the batch's queued requests did rather than being sent again.
_BACK_TO_QUEUE = (
    "CASE WHEN batch_id IN (SELECT id FROM batch_batches WHERE status = 'cancelling') "
    f"THEN '{CANCELLED}' WHEN batch_id IN (SELECT id FROM batch_batches "
    f"WHERE expired_at IS NOT NULL) THEN '{EXPIRED}' ELSE '{QUEUED}' END")

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


def new_id(prefix: str) -> str:
    """A fresh object id in OpenAI's spelling (``file-`` + 24 hex digits, ``batch_...``)."""
    return f"{prefix}{secrets.token_hex(12)}"


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
    """A request taken off the queue to be sent (``attempts``: earlier tries that failed)."""

    batch_id: str
    custom_id: str
    pool: str
    endpoint: str
    body: dict[str, Any]
    attempts: int
    tenant: str
    key_id: str


_BATCH_COLUMNS = ("id, tenant, key_id, input_file_id, endpoint, completion_window, status, "
                  "created_at, expires_at, in_progress_at, finalizing_at, completed_at, "
                  "failed_at, expired_at, cancelling_at, cancelled_at, output_file_id, "
                  "error_file_id, errors, metadata, model")


def _batch(row: sqlite3.Row | tuple[Any, ...]) -> StoredBatch:
    values = list(row)
    values[18] = json.loads(values[18]) if values[18] else None
    values[19] = json.loads(values[19]) if values[19] else None
    return StoredBatch(*values)


def _jsonl(lines: Sequence[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode() if lines else b""


class BatchStore:
    """The batch tables in the SQLite database at ``path`` (created if missing)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # Every write is one BEGIN IMMEDIATE ... COMMIT, so no transaction is ever left open
        # between calls; the lock serialises the rare call from another thread (``depth`` from
        # a metrics scrape).
        self._db = Database(self.path, what="the batch queue", schema=_SCHEMA)

    def close(self) -> None:
        """Close the connection (the state is already on disk)."""
        self._db.close()

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._db.query(sql, args)

    # --- files ------------------------------------------------------------------------------
    def add_file(self, *, tenant: str, purpose: str, filename: str, content: bytes,
                 now: int) -> StoredFile:
        """Store ``content`` as a new file of ``tenant``."""
        f = StoredFile(new_id(BATCH_FILE_ID_PREFIX), tenant, purpose, filename, len(content), now)
        with self._db.transaction() as db:
            self._insert_file(db, f, content)
        return f

    @staticmethod
    def _insert_file(db: sqlite3.Connection, f: StoredFile, content: bytes) -> None:
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
        with self._db.transaction() as db:
            cur = db.execute(
                "INSERT INTO batch_batches (id, tenant, key_id, input_file_id, endpoint, "
                "completion_window, status, created_at, expires_at, in_progress_at, metadata, "
                "model) VALUES (?, ?, ?, ?, ?, ?, 'in_progress', ?, ?, ?, ?, ?)",
                (batch_id, tenant, key_id, input_file_id, endpoint, completion_window, now,
                 int(now + window_s), now, json.dumps(metadata) if metadata else None, model))
            seq = cur.lastrowid
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
        with self._db.transaction() as db:
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
        by_state = dict(self._read("SELECT state, COUNT(*) FROM batch_requests "
                                   "WHERE batch_id = ? GROUP BY state", (batch_id,)))
        return RequestCounts(
            total=sum(by_state.values()), completed=by_state.get(OK, 0),
            failed=sum(by_state.get(s, 0) for s in (ERROR, EXPIRED, CANCELLED)))

    def cancel(self, batch_id: str, now: int) -> None:
        """Start cancelling an ``in_progress`` batch: queued requests are dropped at once,
        requests in flight finish (the next ``finalize_ready`` ends the batch)."""
        with self._db.transaction() as db:
            cur = db.execute("UPDATE batch_batches SET status = 'cancelling', cancelling_at = ? "
                             "WHERE id = ? AND status IN ('validating', 'in_progress')",
                             (now, batch_id))
            if cur.rowcount:
                db.execute("UPDATE batch_requests SET state = ?, finished_at = ? "
                           "WHERE batch_id = ? AND state = ?", (CANCELLED, now, batch_id, QUEUED))

    # --- the queue --------------------------------------------------------------------------
    def requeue_in_flight(self) -> int:
        """Queue again what a stopped process left in flight (at-least-once), except in
        batches cancelled or expired meanwhile (those requests end so); how many."""
        with self._db.transaction() as db:
            return db.execute(f"UPDATE batch_requests SET state = {_BACK_TO_QUEUE} "
                              "WHERE state = ?", (IN_FLIGHT,)).rowcount

    def has_queued(self, pool: str, now: float) -> bool:
        """Whether ``pool`` has a request ready to send at ``now``."""
        return bool(self._read("SELECT 1 FROM batch_requests WHERE pool = ? AND state = ? "
                               "AND not_before <= ? LIMIT 1", (pool, QUEUED, now)))

    def claim(self, pool: str, n: int, now: float) -> list[ClaimedRequest]:
        """Take up to ``n`` of ``pool``'s ready requests, oldest batch first, in file order,
        and mark them in flight."""
        with self._db.transaction() as db:
            rows = db.execute(
                "SELECT r.batch_id, r.custom_id, r.pool, r.endpoint, r.body, r.attempts, "
                "b.tenant, b.key_id FROM batch_requests r JOIN batch_batches b "
                "ON b.id = r.batch_id WHERE r.pool = ? AND r.state = ? AND r.not_before <= ? "
                "ORDER BY r.batch_seq, r.line LIMIT ?", (pool, QUEUED, now, n)).fetchall()
            db.executemany("UPDATE batch_requests SET state = ? WHERE batch_id = ? "
                           "AND custom_id = ?", [(IN_FLIGHT, r[0], r[1]) for r in rows])
        return [ClaimedRequest(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7])
                for r in rows]

    def finish(self, batch_id: str, custom_id: str, *, ok: bool, line: dict[str, Any],
               now: float) -> None:
        """Store a sent request's result line (output file if ``ok``, else error file)."""
        with self._db.transaction() as db:
            db.execute("UPDATE batch_requests SET state = ?, result = ?, finished_at = ? "
                       "WHERE batch_id = ? AND custom_id = ? AND state = ?",
                       (OK if ok else ERROR, json.dumps(line), now, batch_id, custom_id,
                        IN_FLIGHT))

    def retry_later(self, batch_id: str, custom_id: str, *, attempts: int,
                    not_before: float) -> None:
        """Put a request whose send failed back in the queue, not to be sent before
        ``not_before`` (clock seconds)."""
        with self._db.transaction() as db:
            db.execute(f"UPDATE batch_requests SET state = {_BACK_TO_QUEUE}, attempts = ?, "
                       "not_before = ? WHERE batch_id = ? AND custom_id = ? AND state = ?",
                       (attempts, not_before, batch_id, custom_id, IN_FLIGHT))

    def depth(self, pool: str) -> int:
        """Requests of ``pool`` queued or in flight."""
        return int(self._read("SELECT COUNT(*) FROM batch_requests WHERE pool = ? "
                              "AND state IN (?, ?)", (pool, *_PENDING))[0][0])

    def expire_due(self, now: int) -> list[str]:
        """Batches past their completion window: their queued requests expire (requests in
        flight finish). Returns the ids of the batches that expired now."""
        with self._db.transaction() as db:
            ids = [r[0] for r in db.execute(
                "SELECT id FROM batch_batches WHERE status = 'in_progress' AND expired_at IS NULL "
                "AND expires_at <= ?", (now,))]
            for batch_id in ids:
                db.execute("UPDATE batch_batches SET expired_at = ? WHERE id = ?", (now, batch_id))
                db.execute("UPDATE batch_requests SET state = ?, finished_at = ? "
                           "WHERE batch_id = ? AND state = ?", (EXPIRED, now, batch_id, QUEUED))
        return ids

    def finalize_ready(self, now: int) -> list[str]:
        """End every running batch with nothing left queued or in flight: write its output and
        error files and set its final status. Returns the ids of the batches ended."""
        with self._db.transaction() as db:
            ready = db.execute(
                "SELECT id, tenant, status, expired_at FROM batch_batches b "
                "WHERE status IN ('in_progress', 'cancelling') AND NOT EXISTS ("
                "SELECT 1 FROM batch_requests r WHERE r.batch_id = b.id AND r.state IN (?, ?))",
                _PENDING).fetchall()
            for batch_id, tenant, status, expired_at in ready:
                self._finalize(db, batch_id, tenant, status, expired_at, now)
        return [r[0] for r in ready]

    def _finalize(self, db: sqlite3.Connection, batch_id: str, tenant: str, status: str,
                  expired_at: int | None, now: int) -> None:
        out: list[str] = []
        err: list[str] = []
        for custom_id, state, result in db.execute(
                "SELECT custom_id, state, result FROM batch_requests WHERE batch_id = ? "
                "ORDER BY line", (batch_id,)):
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
        file_ids: dict[str, str | None] = {"output": None, "error": None}
        for kind, lines in (("output", out), ("error", err)):
            if lines:
                content = _jsonl(lines)
                f = StoredFile(new_id(BATCH_FILE_ID_PREFIX), tenant, BATCH_PURPOSE_OUTPUT,
                               f"{batch_id}_{kind}.jsonl", len(content), now)
                self._insert_file(db, f, content)
                file_ids[kind] = f.id
        final = ("cancelled" if status == "cancelling"
                 else "expired" if expired_at is not None else "completed")
        db.execute(
            "UPDATE batch_batches SET status = ?, finalizing_at = ?, ended_at = ?, "
            "completed_at = CASE WHEN ? = 'completed' THEN ? END, "
            "cancelled_at = CASE WHEN ? = 'cancelled' THEN ? END, "
            "output_file_id = ?, error_file_id = ? WHERE id = ?",
            (final, now, now, final, now, final, now, file_ids["output"], file_ids["error"],
             batch_id))

    def purge(self, now: float, retention: float) -> int:
        """Forget batches that ended more than ``retention`` seconds ago, with their requests
        and output files, and input files that old which no remaining batch uses. Returns how
        many batches were removed."""
        cutoff = now - retention
        with self._db.transaction() as db:
            old = db.execute("SELECT id, output_file_id, error_file_id FROM batch_batches "
                             "WHERE ended_at IS NOT NULL AND ended_at <= ?", (cutoff,)).fetchall()
            for batch_id, output_id, error_id in old:
                db.execute("DELETE FROM batch_requests WHERE batch_id = ?", (batch_id,))
                db.execute("DELETE FROM batch_files WHERE id IN (?, ?)", (output_id, error_id))
                db.execute("DELETE FROM batch_batches WHERE id = ?", (batch_id,))
            db.execute("DELETE FROM batch_files WHERE created_at <= ? AND purpose != ? AND id "
                       "NOT IN (SELECT input_file_id FROM batch_batches)",
                       (cutoff, BATCH_PURPOSE_OUTPUT))
        return len(old)
