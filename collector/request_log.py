"""The gateway's per-request records: written by the gateway, read by the engine.

They live in the gateway's database (``[gateway] database``: a PostgreSQL URL that several
gateway instances share, else the SQLite file ``records_path``), through
``vigil.database.open_database``; the SQL is written once for both.

``RecordWriter`` takes finished requests into a bounded buffer in memory (``put`` never blocks
or does I/O: it is on the request path) and a writer thread inserts them in batches, so a slow
or unreachable database delays records, never responses. On PostgreSQL a batch is copied
(``COPY``) into a temporary table of the connection, then inserted from it in one statement;
on SQLite it is one ``executemany``. A batch that cannot be written because the database cannot
be written now (``StoreUnavailable``: the server is down or restarting; an SQLite file locked
or full) is kept and retried with backoff until it is; the insert skips ids already stored
(``ON CONFLICT (id) DO NOTHING``), so a retry of a batch that did reach the database before the
connection broke stores each record once. A batch the database refuses for what it holds is
split until the rows it refuses are alone: those are dropped, logged with their ids and the
reason, and counted in ``rejected``; the others are written. Otherwise records are lost only
when the buffer is full, the oldest first, counted in ``dropped``.

``GatewayRecords`` implements ``slo.sources.protocol.RequestLog`` over the same database: SQLite
opened read-only per read (the file is in WAL mode, so readers never block the writer, nor the batch
queue that shares the file), PostgreSQL through one small pool.

The gateway decides what a record says (``serving.gateway.pipeline``); this module only keeps
them, beside the other stores the engine reads, so that the engine and the dashboard read them
without depending on the gateway.

One row per request that reached the gateway, including refusals (401, 400, 404, 413, 429) and
cancellations; see docs/gateway.md for the columns.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from vigil.conventions import ERROR_SERVER_CLASSES, GATEWAY_RECORDS_TABLE
from vigil.database import SqlDatabase, is_postgres_url, open_database, redact_url
from vigil.errors import StoreError, StoreUnavailable
from vigil.model import RequestRecord

if TYPE_CHECKING:
    from vigil.postgres import PgConn

__all__ = ["GatewayRecord", "GatewayRecords", "RecordWriter"]

log = logging.getLogger("vigil.gateway.records")

#: How the records database names itself in errors.
WHAT = "the gateway records"
#: The records' name in ``vigil_schema`` (``vigil.database.migrate``).
COMPONENT = "gateway_records"
#: Seconds between the starts of two writes at the least (records wait that much longer).
BATCH_SPACING = 0.1
#: Records written in one transaction at the most.
MAX_BATCH = 1000
#: PostgreSQL connections of a writer or a reader: one is in use at a time; the second lets a
#: broken connection be replaced without waiting.
POOL_SIZE = 2

_T = GATEWAY_RECORDS_TABLE
_SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {_T} (
    id TEXT PRIMARY KEY,
    start_s REAL NOT NULL,
    ts_s REAL NOT NULL,
    pool TEXT NOT NULL,
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    tenant TEXT NOT NULL,
    tier TEXT NOT NULL,
    key_id TEXT NOT NULL,
    replica TEXT NOT NULL,
    status INTEGER NOT NULL,
    stream INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    tokens_source TEXT NOT NULL,
    ttft_s REAL,
    e2e_s REAL,
    queue_s REAL NOT NULL,
    error INTEGER NOT NULL,
    error_class TEXT NOT NULL,
    cache_hit TEXT NOT NULL,
    requested_max_tokens INTEGER,
    max_tokens INTEGER,
    max_tokens_decision TEXT NOT NULL,
    cost_usd REAL,
    saved_usd REAL,
    upstream_id TEXT NOT NULL,
    batch_id TEXT NOT NULL,
    message TEXT NOT NULL
)""",
    f"CREATE INDEX IF NOT EXISTS {_T}_pool_ts ON {_T} (pool, ts_s)",
)


class GatewayRecord(NamedTuple):
    """One finished request, as stored. Times are Unix seconds, durations seconds, money USD.

    ``ttft_s`` is None without a first token (and for non-streaming requests, whose first token
    the gateway cannot see); ``e2e_s`` is None for requests that were never served (refused
    before reaching a replica or the cache). ``error`` is a server-side failure (timeout,
    upstream 5xx, OOM) — a client cancel and 4xx refusals are not errors.
    """

    id: str
    start_s: float
    ts_s: float
    pool: str
    model: str
    endpoint: str
    tenant: str
    tier: str
    key_id: str
    replica: str
    status: int
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    #: "usage" | "chunks" (streamed content chunks counted, a lower bound) | "unknown"
    tokens_source: str
    ttft_s: float | None
    e2e_s: float | None
    #: Seconds waited at the gateway's admission (tiers) before going upstream.
    queue_s: float
    error: bool
    error_class: str
    #: "l1" | "l2" | ""
    cache_hit: str
    #: What the client asked (None: nothing), what went upstream and why.
    requested_max_tokens: int | None
    max_tokens: int | None
    max_tokens_decision: str
    cost_usd: float | None
    saved_usd: float | None
    #: The upstream's response id (``chatcmpl-...``), "" when none.
    upstream_id: str
    #: The batch this request belongs to ("" for synchronous requests).
    batch_id: str
    #: The error message for refusals and failures ("" otherwise), at most 500 characters.
    message: str


_COLUMNS = GatewayRecord._fields
_COLUMN_LIST = ", ".join(_COLUMNS)
_SELECT = f"SELECT {_COLUMN_LIST} FROM {_T}"
# A batch retried after a connection broke mid-commit (it may have been written) carries the
# same records under the same ids: the stored one is kept, so each record is stored once.
# DO NOTHING, not an upsert: nothing to rewrite, and INSERT ... SELECT with DO UPDATE fails
# ("cannot affect row a second time") on an id twice in one batch.
_INSERT = (f"INSERT INTO {_T} ({_COLUMN_LIST}) VALUES ({', '.join('?' for _ in _COLUMNS)}) "
           "ON CONFLICT (id) DO NOTHING")
#: PostgreSQL: the connection's own staging table. COPY costs one round trip and no parse or
#: plan per row (a 1,000-row ``executemany`` plans the insert 1,000 times); created once per
#: connection, emptied by every commit (and a rollback).
_STAGE = f"{_T}_in"
_CREATE_STAGE = f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} (LIKE {_T}) ON COMMIT DELETE ROWS"
# Binary: the values are not formatted as text and parsed again (twice as fast as text).
_COPY = f"COPY {_STAGE} ({_COLUMN_LIST}) FROM STDIN (FORMAT BINARY)"


def _pg_type(column: str) -> str:
    """The PostgreSQL type of ``column`` as the schema declares it (``Dialect.ddl``'s)."""
    found = re.search(rf"^    {column} (TEXT|REAL|INTEGER)\b", _SCHEMA[0], re.MULTILINE)
    if found is None:
        raise RuntimeError(f"column {column!r} is not in the records schema")
    return {"TEXT": "text", "REAL": "double precision", "INTEGER": "bigint"}[found[1]]


#: The COPY's binary format needs each column's type.
_PG_TYPES = [_pg_type(c) for c in _COLUMNS]
_FROM_STAGE = (f"INSERT INTO {_T} ({_COLUMN_LIST}) SELECT {_COLUMN_LIST} FROM {_STAGE} "
               "ON CONFLICT (id) DO NOTHING")
#: SQLite's primary result codes that mean "the file cannot be written now" (busy, locked,
#: out of memory, read-only, I/O error, disk full, cannot open): retried, as PostgreSQL's
#: ``StoreUnavailable`` is. Any other error is about the rows.
_SQLITE_LATER = frozenset({5, 6, 7, 8, 10, 13, 14})
#: PostgreSQL SQLSTATEs (or their classes) of refusals that do not depend on the rows: out
#: of resources (53: disk full, out of memory), a read-only transaction (25006: a standby
#: after a fail-over), a serialization failure or deadlock (40), a lock or statement timeout
#: (55P03, 57014). Retried.
_POSTGRES_LATER = ("53", "25006", "40", "55P03", "57014")
#: What the driver raises for a value it cannot send (a float in an integer column, an
#: integer beyond 64 bits): a refusal of that row, as the database's own.
_CONVERSION_ERRORS = (TypeError, ValueError, OverflowError)
#: Rejected records named in one log line at the most (the count is always given).
_LOGGED_IDS = 20
#: The records' schema steps (append-only). Step 1 is the table as the SQLite-only versions
#: created it, so their files are adopted unchanged.
MIGRATIONS: tuple[tuple[str, ...], ...] = (_SCHEMA,)


class RecordWriter:
    """A bounded buffer of records and the thread that writes them in batches.

    ``target`` is the SQLite file or the PostgreSQL URL. ``max_queue`` bounds the records held
    in memory (queued, plus the batch being written or retried); ``flush_interval`` is how often
    (seconds) an idle writer wakes up on its own (``put`` wakes it at once); a failed batch is
    retried after ``retry_interval`` seconds, doubling up to ``max_retry_interval``.
    """

    def __init__(self, target: str | Path, *, max_queue: int = 100_000,
                 flush_interval: float = 0.2, retry_interval: float = 0.5,
                 max_retry_interval: float = 5.0) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        if not 0 < retry_interval <= max_retry_interval:
            raise ValueError("retry intervals must be 0 < retry_interval <= max_retry_interval, "
                             f"got {retry_interval}, {max_retry_interval}")
        self.target: str | Path = target if is_postgres_url(target) else Path(target)
        self.max_queue = max_queue
        self._flush_interval = flush_interval
        self._retry_interval = retry_interval
        self._max_retry_interval = max_retry_interval
        self._lock = threading.Lock()
        #: The writer waits on it for records (or for the end of a backoff); flush() on progress.
        self._wake = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)
        self._queue: deque[GatewayRecord] = deque()
        #: The batch being written, or waiting to be retried; oldest records first.
        self._pending: list[GatewayRecord] = []
        self._in_flight = False
        self._idle = False
        self._stopping = False
        self._abandon = False
        self._running = False
        #: Set by close() when it gives up on a thread still in a write attempt: the thread
        #: closes the database when that attempt ends.
        self._orphaned = False
        self._offered = 0
        self._unlogged_drops = 0
        self._thread: threading.Thread | None = None
        self._db: SqlDatabase | None = None
        #: Records written so far.
        self.written = 0
        #: Records lost because the buffer was full (the database unreachable or too slow).
        self.dropped = 0
        #: Write attempts that failed because the database could not be written (each is
        #: retried).
        self.write_failures = 0
        #: Records dropped because the database refused them (logged with their ids).
        self.rejected = 0
        #: PostgreSQL connections whose staging table exists (gone with the connection).
        self._staged: weakref.WeakSet[Any] = weakref.WeakSet()

    @property
    def display(self) -> str:
        """The file, or the URL without its password."""
        return redact_url(self.target) if isinstance(self.target, str) else str(self.target)

    @property
    def buffered(self) -> int:
        """Records held in memory, not written yet (queued, or in a batch being retried)."""
        with self._lock:
            return len(self._queue) + len(self._pending)

    def start(self) -> None:
        """Open (create, migrate) the database in the caller's thread, then start writing.

        Raises ``StoreError`` (naming the file or URL) when it cannot be opened: better at
        start-up than a gateway that silently keeps no records. Later outages are retried.
        """
        if self._thread is not None:
            raise RuntimeError("the record writer is already running")
        self._db = open_database(self.target, what=WHAT, component=COMPONENT,
                                 migrations=MIGRATIONS, pool_size=POOL_SIZE)
        self._stopping = self._abandon = self._orphaned = False
        self._running = True
        self._thread = threading.Thread(target=self._run_then_close, args=(self._db,),
                                        name="gateway-records", daemon=True)
        self._thread.start()

    def put(self, record: GatewayRecord) -> None:
        """Hold ``record`` for writing; never blocks nor does I/O. When the buffer holds
        ``max_queue`` records, the oldest one not being written right now is dropped (and
        counted in ``dropped``; the writer thread logs it)."""
        with self._lock:
            self._offered += 1
            self._queue.append(record)
            excess = len(self._queue) + len(self._pending) - self.max_queue
            if excess > 0:
                self._drop_oldest(excess)
            if self._idle:
                self._wake.notify()

    def _drop_oldest(self, n: int) -> None:
        """Drop ``n`` held records, oldest first (lock held). The batch in flight may be
        committing: it is not touched, and the queue's oldest go instead."""
        dropped = 0
        if not self._in_flight and self._pending:
            k = min(n, len(self._pending))
            del self._pending[:k]
            dropped = k
        while dropped < n and self._queue:
            self._queue.popleft()
            dropped += 1
        self.dropped += dropped
        self._unlogged_drops += dropped
        self._progress.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until every record put so far is written (or dropped, or rejected), at most
        ``timeout`` seconds; True if it was."""
        with self._lock:
            goal = self._offered
            return self._progress.wait_for(
                lambda: self.written + self.dropped + self.rejected >= goal, timeout)

    def close(self, timeout: float = 10.0) -> int:
        """Write what is held (retrying for up to ``timeout`` seconds), stop the thread, close
        the database; returns how many records could not be written (logged as an error).

        Returns within ``timeout``: a write attempt still under way then is left to end on
        its own (the thread closes the database after it)."""
        thread, db = self._thread, self._db
        if thread is None or db is None:
            return 0
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
        thread.join(timeout)
        with self._lock:
            self._abandon = True
            self._wake.notify_all()
            lost = len(self._queue) + len(self._pending)
            self._orphaned = self._running
        self._thread = self._db = None
        if lost:
            log.error("%s: could not write %d gateway records within %.1f s of closing; they "
                      "are lost", self.display, lost, timeout)
        if not self._orphaned:
            db.close()
        return lost

    # --- the writer thread -----------------------------------------------------------------
    def _run_then_close(self, db: SqlDatabase) -> None:
        try:
            self._run(db)
        finally:
            with self._lock:
                self._running = False
                orphaned = self._orphaned
            if orphaned:
                db.close()

    def _run(self, db: SqlDatabase) -> None:
        delay = self._retry_interval
        failing_since: float | None = None
        last = 0.0
        while True:
            with self._lock:
                if not self._pending:
                    # At most one transaction per BATCH_SPACING while the batches are small:
                    # woken by every put(), the writer would otherwise commit a handful of
                    # records at a time (1,300-4,500 transactions per 10 s at 3,000 req/s),
                    # holding the file's write lock and the GIL far more often than the
                    # records need. A backlog of full batches is written without pause.
                    rest = last + BATCH_SPACING - time.monotonic()
                    if rest > 0 and not self._stopping and len(self._queue) < MAX_BATCH:
                        self._wake.wait(rest)
                    while not self._queue and not self._stopping:
                        self._idle = True
                        self._wake.wait(self._flush_interval)
                        self._idle = False
                    if self._abandon or not self._queue:
                        return  # stopping, and everything is written
                    n = min(MAX_BATCH, len(self._queue))
                    self._pending = [self._queue.popleft() for _ in range(n)]
                batch = list(self._pending)
                self._in_flight = True
                drops, self._unlogged_drops = self._unlogged_drops, 0
            if drops:
                log.error("dropped %d gateway records, oldest first: %d are held in memory "
                          "(the bound, [gateway] records_buffer) because %s is not taking "
                          "them (unreachable or too slow)", drops, self.max_queue,
                          self.display)
            started = last = time.monotonic()
            done, written, refused, error = self._write(db, batch)
            with self._lock:
                self._in_flight = False
                # Nothing changed _pending while in flight: it is still ``batch``.
                self._pending = [r for r, d in zip(batch, done, strict=True) if not d]
                self.written += written
                self.rejected += len(refused)
                if written or refused:
                    self._progress.notify_all()
                if error is not None:
                    self.write_failures += 1
            if refused:
                _log_rejected(refused)
            # Logging is I/O: never under the lock that put() takes.
            if error is None:
                if failing_since is not None:
                    log.warning("%s: gateway records written again after %.1f s of failures",
                                self.display, time.monotonic() - failing_since)
                delay, failing_since = self._retry_interval, None
                continue
            if failing_since is None:
                failing_since = started
                log.warning("could not write %d gateway records (retrying every %g-%g s, "
                            "holding up to %d in memory): %s", len(batch), self._retry_interval,
                            self._max_retry_interval, self.max_queue, error)
            with self._lock:
                if self._abandon:
                    return
                # close() wakes this wait: one more attempt right away, then the backoff.
                self._wake.wait(delay)
                delay = min(delay * 2, self._max_retry_interval)
                if self._abandon:
                    return

    def _write(self, db: SqlDatabase, batch: list[GatewayRecord]
               ) -> tuple[list[bool], int, list[tuple[str, str]], Exception | None]:
        """Write ``batch``; nothing is raised. Returns which records are done with (written,
        or rejected), how many were written, the (id, reason) of those rejected, and the
        error that stopped the writing when it is worth retrying (the rest are kept).

        The batch is one transaction. When the database refuses it for what it holds, it is
        halved, and each half written in a transaction of its own, down to single records:
        only those the database refuses alone are rejected.
        """
        done = [False] * len(batch)
        refused: list[tuple[str, str]] = []
        rows: list[tuple[int, tuple[Any, ...]]] = []
        for i, record in enumerate(batch):
            try:
                rows.append((i, _row(record)))
            except Exception as exc:
                # Not a record the gateway makes: it can never be written.
                done[i] = True
                refused.append((_id_of(record), f"cannot be converted: {_reason(exc)}"))
        written = 0
        parts = [rows] if rows else []
        while parts:
            part = parts.pop()
            try:
                self._insert(db, [row for _, row in part])
            except Exception as exc:
                if _retry_later(exc):
                    return done, written, refused, exc
                if (not isinstance(exc, (StoreError, *_CONVERSION_ERRORS))
                        and len(part) == len(rows)):
                    # Neither the database's refusal nor a value the driver cannot send: a
                    # defect, worth its traceback (once per batch).
                    log.exception("unexpected error writing %d gateway records", len(part))
                if len(part) == 1:
                    done[part[0][0]] = True
                    refused.append((_id_of(batch[part[0][0]]), _reason(exc)))
                    continue
                middle = len(part) // 2
                parts += (part[middle:], part[:middle])  # the older half first
                continue
            for i, _ in part:
                done[i] = True
            written += len(part)
        return done, written, refused, None

    def _insert(self, db: SqlDatabase, rows: list[tuple[Any, ...]]) -> None:
        """Insert ``rows`` in one transaction (ids already stored are skipped)."""
        with db.transaction(doing=f"write {len(rows)} records to") as c:
            if not db.dialect.postgres or len(rows) == 1:
                # A record alone goes by the plain insert: were the staging table unusable
                # (a pooler that does not keep a connection's temporary tables), splitting
                # would still write every record, one by one.
                c.executemany(_INSERT, rows)
                return
            raw = cast("PgConn", c).raw
            if raw not in self._staged:
                raw.execute(_CREATE_STAGE)
                self._staged.add(raw)
                # Created in this transaction: a rollback takes it away again.
                db.on_rollback(lambda: self._staged.discard(raw))
            with raw.cursor() as cur:
                with cur.copy(_COPY) as copy:
                    copy.set_types(_PG_TYPES)
                    for row in rows:
                        copy.write_row(row)
                cur.execute(_FROM_STAGE)


class GatewayRecords:
    """The records, read-only: ``slo.sources.protocol.RequestLog`` and a few queries.

    ``target`` is the SQLite file or the PostgreSQL URL. On SQLite each read opens the file and
    closes it again (a missing file or table means no records yet), so one instance may serve
    any thread. On PostgreSQL the instance keeps one small pool, opened at the first read and
    shared by the threads that use it (a missing table means no records yet); ``close`` it.
    """

    def __init__(self, target: str | Path) -> None:
        self.target: str | Path = target if is_postgres_url(target) else Path(target)
        self._lock = threading.Lock()
        self._pg: SqlDatabase | None = None
        self._pg_table = False

    def _query(self, sql: str, args: Sequence[Any]) -> list[Any]:
        if isinstance(self.target, str):
            db = self._postgres(self.target)
            return db.query(sql, args) if db is not None else []
        sqlite = self._open_sqlite(self.target)
        if sqlite is None:
            return []
        try:
            return sqlite.query(sql, args)
        finally:
            sqlite.close()

    def _postgres(self, url: str) -> SqlDatabase | None:
        """The pool, opened at the first read; None while the table does not exist."""
        with self._lock:
            if self._pg is None:
                self._pg = open_database(url, what=WHAT, readonly=True,
                                         pool_size=POOL_SIZE)
            db = self._pg
            if not self._pg_table:
                # Tables are not dropped: once there, it is not looked for again.
                (found,) = db.query("SELECT to_regclass(?) IS NOT NULL", (_T,))
                self._pg_table = bool(found[0])
            return db if self._pg_table else None

    @staticmethod
    def _open_sqlite(path: Path) -> SqlDatabase | None:
        if not path.exists():
            return None  # the gateway never ran: no records yet, not an error
        db = open_database(path, what=WHAT, readonly=True)
        try:
            found = db.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                             (_T,))
        except BaseException:
            db.close()
            raise
        if not found:
            db.close()
            return None  # created by the batch queue alone: no request recorded yet
        return db

    def close(self) -> None:
        """Close the PostgreSQL pool, if one was opened (a later read opens it again)."""
        with self._lock:
            if self._pg is not None:
                self._pg.close()
                self._pg = None

    def __enter__(self) -> GatewayRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows(self, pool: str | None, at_s: float, window_s: float) -> list[GatewayRecord]:
        """Every stored column of the requests (of ``pool``, or all pools when None) that
        finished in ``(at_s - window_s, at_s]`` (Unix seconds), oldest first."""
        sql = f"{_SELECT} WHERE ts_s > ? AND ts_s <= ?"
        args: list[Any] = [at_s - window_s, at_s]
        if pool is not None:
            sql += " AND pool = ?"
            args.append(pool)
        # The id breaks ties, so that both databases return the same order.
        return [_record(row) for row in self._query(sql + " ORDER BY ts_s, id", args)]

    def get(self, request_id: str) -> GatewayRecord | None:
        """The record of one request (by the ``X-Vigil-Request-Id`` the client got)."""
        found = self._query(f"{_SELECT} WHERE id = ?", (request_id,))
        return _record(found[0]) if found else None

    def records(self, pool: str, at_s: float, window_s: float) -> Iterable[RequestRecord]:
        """``slo.sources.protocol.RequestLog``: the pool's requests that finished in
        ``(at_s - window_s, at_s]`` (Unix seconds)."""
        return [RequestRecord(
            id=r.id, ts_s=r.ts_s, pool=r.pool, model=r.model, endpoint=r.endpoint,
            prompt_tokens=r.prompt_tokens, generated_tokens=r.completion_tokens,
            ttft_s=r.ttft_s, e2e_s=r.e2e_s, error=r.error_class in ERROR_SERVER_CLASSES,
            tenant=r.tenant, tier=r.tier, error_class=r.error_class, cache_hit=r.cache_hit,
            cost_usd=r.cost_usd, saved_usd=r.saved_usd, tokens_source=r.tokens_source,
            status=r.status)
            for r in self.rows(pool, at_s, window_s)]


_STREAM, _ERROR = _COLUMNS.index("stream"), _COLUMNS.index("error")


def _row(record: GatewayRecord) -> tuple[Any, ...]:
    """``record`` as inserted: the flags as 0/1 (PostgreSQL's BIGINT column refuses a bool),
    NUL characters in text as U+FFFD.

    PostgreSQL's text cannot hold NUL (psycopg refuses it before sending, in a statement or
    a COPY); SQLite can. Replacing it on both keeps a record that quotes a client's NUL (a
    model name, an error message) instead of refusing it, and reads it back the same from
    either database.
    """
    values: list[Any] = list(record)
    if len(values) != len(_COLUMNS):
        raise TypeError(f"a record has {len(_COLUMNS)} fields, got {len(values)}")
    for i, value in enumerate(values):
        if isinstance(value, str) and "\x00" in value:
            values[i] = value.replace("\x00", "\ufffd")
    values[_STREAM] = int(record.stream)
    values[_ERROR] = int(record.error)
    return tuple(values)


def _retry_later(exc: BaseException) -> bool:
    """Whether ``exc`` (from writing a batch) says the database cannot be written now, so
    the same batch is worth retrying, rather than that it refuses these rows."""
    if isinstance(exc, StoreUnavailable):
        return True
    if not isinstance(exc, StoreError):
        return False
    # The stores raise their StoreError from the driver's exception: its code tells.
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, sqlite3.Error):
        code = getattr(cause, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in _SQLITE_LATER
        return "locked" in str(cause) or "busy" in str(cause)
    state = getattr(cause, "sqlstate", None)
    return isinstance(state, str) and state.startswith(_POSTGRES_LATER)


def _id_of(record: object) -> str:
    try:
        return repr(cast(GatewayRecord, record).id)
    except Exception:
        return f"<not a record: {type(record).__name__}>"


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"


def _log_rejected(refused: list[tuple[str, str]]) -> None:
    """One error line per reason (a database's names it), naming up to ``_LOGGED_IDS`` of
    its records."""
    by_reason: dict[str, list[str]] = {}
    for record_id, reason in refused:
        by_reason.setdefault(reason, []).append(record_id)
    for reason, ids in by_reason.items():
        more = f" and {len(ids) - _LOGGED_IDS} more" if len(ids) > _LOGGED_IDS else ""
        log.error("dropped %d gateway records that cannot be stored (ids %s%s): %s", len(ids),
                  ", ".join(ids[:_LOGGED_IDS]), more, reason)


def _record(row: Sequence[Any]) -> GatewayRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    values["stream"] = bool(values["stream"])
    values["error"] = bool(values["error"])
    return GatewayRecord(**values)
