"""The gateway's per-request records in SQLite: written by the gateway, read by the engine.

``RecordWriter`` takes finished requests on a bounded in-memory queue (``put`` never blocks or
touches the disk) and a writer thread inserts them in batches, so a slow disk delays records,
never responses; when the queue is full the record is dropped and counted. ``GatewayRecords``
implements ``slo.sli.RequestLog`` over the same file, opened read-only: the file is in WAL mode,
so readers never block the writer (and the batch queue, which shares the file).

The gateway decides what a record says (``serving.gateway.pipeline``); this module only keeps
them, beside the other stores the engine reads, so that the engine and the dashboard read them
without depending on the gateway.

One row per request that reached the gateway, including refusals (401, 400, 404, 413, 429) and
cancellations; see docs/gateway.md for the columns.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from vigil.conventions import ERROR_SERVER_CLASSES, GATEWAY_RECORDS_TABLE
from vigil.errors import StoreError
from vigil.model import RequestRecord
from vigil.sqlite import Database

__all__ = ["GatewayRecord", "GatewayRecords", "RecordWriter"]

log = logging.getLogger("vigil.gateway.records")

#: How the records file names itself in errors.
WHAT = "the gateway records"
#: Records written in one transaction at the most.
MAX_BATCH = 1000

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
_INSERT = (f"INSERT OR REPLACE INTO {_T} ({', '.join(_COLUMNS)}) "
           f"VALUES ({', '.join('?' for _ in _COLUMNS)})")
_STOP = object()


class RecordWriter:
    """A bounded queue of records and the thread that writes them in batches."""

    def __init__(self, path: Path, *, max_queue: int = 100_000,
                 flush_interval: float = 0.2) -> None:
        self.path = path
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._flush_interval = flush_interval
        self._thread: threading.Thread | None = None
        self._db: Database | None = None
        #: Records lost because the queue was full (the disk could not keep up).
        self.dropped = 0
        #: Records written so far.
        self.written = 0
        self._flushed = threading.Condition()

    def start(self) -> None:
        """Open (and create) the database in the caller's thread, then start writing.

        Raises ``StoreError`` (naming the file) when it cannot be opened: better at start-up
        than a gateway that silently keeps no records.
        """
        self._db = Database(self.path, what=WHAT, schema=_SCHEMA)
        self._thread = threading.Thread(target=self._run, name="gateway-records", daemon=True)
        self._thread.start()

    def put(self, record: GatewayRecord) -> None:
        """Queue ``record`` for writing; never blocks (a full queue drops it and counts)."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (waiting up to ``timeout`` seconds), then stop the thread and
        close the database."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None
        if self._db is not None:
            self._db.close()
            self._db = None

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until everything queued so far is written (tests, shutdown), at most
        ``timeout`` seconds; True if it was."""
        with self._flushed:
            return self._flushed.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout)

    def _run(self) -> None:
        db = self._db
        if db is None:
            return  # start() sets it before the thread exists
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
            while len(batch) < MAX_BATCH:
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
                self._write(db, batch)
            for _ in range(taken):
                self._queue.task_done()
            with self._flushed:
                self._flushed.notify_all()

    def _write(self, db: Database, batch: list[GatewayRecord]) -> None:
        try:
            with db.transaction() as c:
                c.executemany(_INSERT, batch)
            self.written += len(batch)
        except StoreError:
            # A record is worth less than the gateway: log and keep serving.
            log.exception("could not write %d gateway records", len(batch))
            self.dropped += len(batch)


class GatewayRecords:
    """The records file, read-only: ``slo.sli.RequestLog`` and a few queries.

    Each read opens the file and closes it again, so one instance may serve any thread.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def _open(self) -> Database | None:
        if not self.path.exists():
            return None  # the gateway never ran: no records yet, not an error
        db = Database(self.path, what=WHAT, readonly=True)
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

    def rows(self, pool: str | None, at_s: float, window_s: float) -> list[GatewayRecord]:
        """Every stored column of the requests (of ``pool``, or all pools when None) that
        finished in ``(at_s - window_s, at_s]`` (Unix seconds), oldest first."""
        sql = f"{_SELECT} WHERE ts_s > ? AND ts_s <= ?"
        args: list[Any] = [at_s - window_s, at_s]
        if pool is not None:
            sql += " AND pool = ?"
            args.append(pool)
        db = self._open()
        if db is None:
            return []
        with db:
            return [_record(row) for row in db.query(sql + " ORDER BY ts_s", args)]

    def get(self, request_id: str) -> GatewayRecord | None:
        """The record of one request (by the ``X-Vigil-Request-Id`` the client got)."""
        db = self._open()
        if db is None:
            return None
        with db:
            found = db.query(f"{_SELECT} WHERE id = ?", (request_id,))
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


def _record(row: Sequence[Any]) -> GatewayRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    values["stream"] = bool(values["stream"])
    values["error"] = bool(values["error"])
    return GatewayRecord(**values)
