"""The gateway's per-request records: written by the gateway, read by the engine.

They live in the gateway's database (``[gateway] database``: a PostgreSQL URL that several
gateway instances share, else the SQLite file ``records_path``), through
``vigil.database.open_database``; the SQL is written once for both.

``RecordWriter`` takes finished requests into a bounded buffer in memory (``put`` never blocks
or does I/O: it is on the request path) and a writer thread inserts them in batches, so a slow
or unreachable database delays records, never responses. A batch that cannot be written
(``StoreUnavailable``: the server is down or restarting) is kept and retried with backoff until
it is; the insert is an upsert on the record id, so a retry of a batch that did reach the
database before the connection broke stores each record once. Only when the buffer is full are
records lost, the oldest first, counted in ``dropped``.

``GatewayRecords`` implements ``slo.sli.RequestLog`` over the same database: SQLite opened
read-only per read (the file is in WAL mode, so readers never block the writer, nor the batch
queue that shares the file), PostgreSQL through one small pool.

The gateway decides what a record says (``serving.gateway.pipeline``); this module only keeps
them, beside the other stores the engine reads, so that the engine and the dashboard read them
without depending on the gateway.

One row per request that reached the gateway, including refusals (401, 400, 404, 413, 429) and
cancellations; see docs/gateway.md for the columns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from vigil.conventions import ERROR_SERVER_CLASSES, GATEWAY_RECORDS_TABLE
from vigil.database import SqlDatabase, is_postgres_url, open_database, redact_url
from vigil.errors import StoreError
from vigil.model import RequestRecord

__all__ = ["GatewayRecord", "GatewayRecords", "RecordWriter"]

log = logging.getLogger("vigil.gateway.records")

#: How the records database names itself in errors.
WHAT = "the gateway records"
#: The records' name in ``vigil_schema`` (``vigil.database.migrate``).
COMPONENT = "gateway_records"
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
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM {_T}"
# An upsert on the id: a batch retried after a connection broke mid-commit (it may have been
# written) stores each record once.
_INSERT = (f"INSERT INTO {_T} ({', '.join(_COLUMNS)}) "
           f"VALUES ({', '.join('?' for _ in _COLUMNS)}) ON CONFLICT (id) DO UPDATE SET "
           + ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS if c != "id"))
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
        #: Write attempts that failed (each is retried).
        self.write_failures = 0

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
        """Block until every record put so far is written (or dropped), at most ``timeout``
        seconds; True if it was."""
        with self._lock:
            goal = self._offered
            return self._progress.wait_for(lambda: self.written + self.dropped >= goal,
                                           timeout)

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
        while True:
            with self._lock:
                if not self._pending:
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
            started = time.monotonic()
            error = self._write(db, batch)
            with self._lock:
                self._in_flight = False
                if error is None:
                    self._pending = []
                    self.written += len(batch)
                    self._progress.notify_all()
                else:
                    self.write_failures += 1
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

    @staticmethod
    def _write(db: SqlDatabase, batch: list[GatewayRecord]) -> Exception | None:
        """Write ``batch`` in one transaction; the error if it failed (nothing is raised)."""
        rows = [_row(r) for r in batch]
        try:
            with db.transaction(doing=f"write {len(rows)} records to") as c:
                c.executemany(_INSERT, rows)
        except StoreError as exc:
            return exc
        except Exception as exc:
            # Not a database outage: say so loudly, but keep the records and the thread.
            log.exception("unexpected error writing %d gateway records", len(rows))
            return exc
        return None


class GatewayRecords:
    """The records, read-only: ``slo.sli.RequestLog`` and a few queries.

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
        """``slo.sli.RequestLog``: the pool's requests that finished in
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
    """``record`` as inserted: the flags as 0/1 (PostgreSQL's BIGINT column refuses a bool)."""
    values: list[Any] = list(record)
    values[_STREAM] = int(record.stream)
    values[_ERROR] = int(record.error)
    return tuple(values)


def _record(row: Sequence[Any]) -> GatewayRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    values["stream"] = bool(values["stream"])
    values["error"] = bool(values["error"])
    return GatewayRecord(**values)
