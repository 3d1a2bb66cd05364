"""Per-request records in SQLite: written off the response path, read by the SLO engine.

``RecordWriter`` takes finished requests on a bounded in-memory queue (``put`` never blocks or
touches the disk) and a writer thread inserts them in batches, so a slow disk delays records,
never responses; when the queue is full the record is dropped and counted. ``GatewayRecords``
implements ``slo.sli.RequestLog`` over the same file, opened read-only: the file is in WAL mode,
so readers never block the writer (and the batch queue, which shares the file).

One row per request that reached the gateway, including refusals (401, 400, 404, 413, 429) and
cancellations; see docs/gateway.md for the columns.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from slo.sli import RequestRecord
from vigil.conventions import ERROR_SERVER_CLASSES, GATEWAY_RECORDS_TABLE
from vigil.errors import StoreError

__all__ = ["GatewayRecord", "GatewayRecords", "RecordWriter"]

log = logging.getLogger("vigil.gateway.records")

_T = GATEWAY_RECORDS_TABLE
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {_T} (
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
);
CREATE INDEX IF NOT EXISTS {_T}_pool_ts ON {_T} (pool, ts_s);
"""


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
_INSERT = (f"INSERT OR REPLACE INTO {_T} ({', '.join(_COLUMNS)}) "
           f"VALUES ({', '.join('?' for _ in _COLUMNS)})")
_STOP = object()


def _connect(path: Path) -> sqlite3.Connection:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        # The batch queue writes to the same file: wait for its transactions, do not fail.
        conn.execute("PRAGMA busy_timeout=10000")
        conn.executescript(_SCHEMA)
    except (sqlite3.Error, OSError) as exc:
        raise StoreError(f"cannot open the gateway records database {path}: {exc}") from None
    return conn


class RecordWriter:
    """A bounded queue of records and the thread that writes them in batches."""

    def __init__(self, path: Path, *, max_queue: int = 100_000,
                 flush_interval: float = 0.2) -> None:
        self.path = path
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._flush_interval = flush_interval
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        #: Records lost because the queue was full (the disk could not keep up).
        self.dropped = 0
        #: Records written so far.
        self.written = 0
        self._flushed = threading.Condition()

    def start(self) -> None:
        """Open (and create) the database in the caller's thread, then start writing."""
        self._conn = _connect(self.path)
        self._thread = threading.Thread(target=self._run, name="gateway-records", daemon=True)
        self._thread.start()

    def put(self, record: GatewayRecord) -> None:
        """Queue ``record`` for writing; never blocks (a full queue drops it and counts)."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the thread and close the database."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until everything queued so far is written (tests, shutdown); True if it was."""
        with self._flushed:
            return self._flushed.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout)

    def _run(self) -> None:
        conn = self._conn
        assert conn is not None  # set by start() before the thread exists
        stop = False
        while not stop:
            batch: list[GatewayRecord] = []
            try:
                item = self._queue.get(timeout=self._flush_interval)
            except queue.Empty:
                continue
            taken = 1
            if item is _STOP:
                stop = True
            else:
                batch.append(item)
            while len(batch) < 1000:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                taken += 1
                if item is _STOP:
                    stop = True
                else:
                    batch.append(item)
            if batch:
                self._write(conn, batch)
            for _ in range(taken):
                self._queue.task_done()
            with self._flushed:
                self._flushed.notify_all()

    def _write(self, conn: sqlite3.Connection, batch: list[GatewayRecord]) -> None:
        try:
            with conn:
                conn.execute("BEGIN")
                conn.executemany(_INSERT, batch)
            self.written += len(batch)
        except sqlite3.Error:
            # A record is worth less than the gateway: log and keep serving.
            log.exception("could not write %d gateway records", len(batch))
            self.dropped += len(batch)


class GatewayRecords:
    """The records file, read-only: ``slo.sli.RequestLog`` and a few queries."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def _open(self) -> sqlite3.Connection | None:
        if not self.path.exists():
            return None  # the gateway never ran: no records yet, not an error
        try:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            conn.execute("PRAGMA busy_timeout=5000")
            conn.row_factory = sqlite3.Row
            conn.execute(f"SELECT 1 FROM {_T} LIMIT 0")
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise StoreError(f"cannot read gateway records {self.path}: {exc}") from None
        return conn

    def rows(self, pool: str | None, at_s: float, window_s: float) -> list[GatewayRecord]:
        """Every stored column of the requests (of ``pool``, or all pools when None) that
        finished in ``(at_s - window_s, at_s]``, oldest first."""
        conn = self._open()
        if conn is None:
            return []
        sql = f"SELECT {', '.join(_COLUMNS)} FROM {_T} WHERE ts_s > ? AND ts_s <= ?"
        args: list[Any] = [at_s - window_s, at_s]
        if pool is not None:
            sql += " AND pool = ?"
            args.append(pool)
        try:
            with conn:
                cur = conn.execute(sql + " ORDER BY ts_s", args)
                return [_record(row) for row in cur]
        finally:
            conn.close()

    def get(self, request_id: str) -> GatewayRecord | None:
        """The record of one request (by the ``X-Vigil-Request-Id`` the client got)."""
        conn = self._open()
        if conn is None:
            return None
        try:
            row = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM {_T} WHERE id = ?",
                               (request_id,)).fetchone()
        finally:
            conn.close()
        return None if row is None else _record(row)

    def records(self, pool: str, at_s: float, window_s: float) -> Iterable[RequestRecord]:
        """``slo.sli.RequestLog``: the pool's requests that finished in
        ``(at_s - window_s, at_s]``."""
        return [RequestRecord(
            id=r.id, ts_s=r.ts_s, pool=r.pool, model=r.model, endpoint=r.endpoint,
            prompt_tokens=r.prompt_tokens, generated_tokens=r.completion_tokens,
            ttft_s=r.ttft_s, e2e_s=r.e2e_s, error=r.error_class in ERROR_SERVER_CLASSES,
            tenant=r.tenant, tier=r.tier, error_class=r.error_class, cache_hit=r.cache_hit,
            cost_usd=r.cost_usd, saved_usd=r.saved_usd) for r in self.rows(pool, at_s, window_s)]


def _record(row: sqlite3.Row) -> GatewayRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    values["stream"] = bool(values["stream"])
    values["error"] = bool(values["error"])
    return GatewayRecord(**values)
