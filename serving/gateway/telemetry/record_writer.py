"""The gateway's request log, written: ``RecordWriter`` keeps every finished request's record
(``vigil.storage.gateway_records``) in the gateway's database, beside the batch queue
(``serving.gateway.batch.store``) and the shared cache entries (``serving.cache.shared``); the
engine reads them back through ``slo.sources.request_log``.

``RecordWriter`` takes finished requests into a bounded buffer in memory (``put`` never blocks
or does I/O: it is on the request path) and a writer thread inserts them in batches, so a slow
or unreachable database delays records, never responses. On PostgreSQL a batch is copied
(``COPY``) into a temporary table of the connection, then inserted from it in one statement;
on SQLite it is one ``executemany``. A batch that cannot be written because the database cannot
be written now (``StoreUnavailable``: the server is down or restarting; an SQLite file locked
or full) is kept and retried with backoff until it is; the insert skips ids already stored
(``ON CONFLICT (id) DO NOTHING``), so a retry of a batch that did reach the database before the
connection broke stores each record once. A batch the database refuses for what it holds is
split until the rows it refuses are alone (``vigil.storage.split_writes``, the policy of every
store): those are dropped, logged with their ids and the reason, and counted in ``rejected``;
the others are written. Otherwise records are lost only when the buffer is full, the oldest
first, counted in ``dropped``.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from vigil.storage.database import SqlDatabase, is_postgres_url, open_database, redact_url
from vigil.storage.gateway_records import (
    COLUMNS,
    COMPONENT,
    MIGRATIONS,
    TABLE,
    WHAT,
    GatewayRecord,
    pg_type,
    to_row,
)
from vigil.storage.split_writes import reason, write_batch

if TYPE_CHECKING:
    from vigil.storage.postgres import PgConn

__all__ = ["BATCH_SPACING", "MAX_BATCH", "GatewayRecord", "RecordWriter"]

log = logging.getLogger("vigil.gateway.records")

#: Seconds between the starts of two writes at the least (records wait that much longer).
BATCH_SPACING = 0.1
#: Records written in one transaction at the most.
MAX_BATCH = 1000
#: PostgreSQL connections of a writer: one is in use at a time; the second lets a broken
#: connection be replaced without waiting.
POOL_SIZE = 2

_T = TABLE
_COLUMN_LIST = ", ".join(COLUMNS)
# A batch retried after a connection broke mid-commit (it may have been written) carries the
# same records under the same ids: the stored one is kept, so each record is stored once.
# DO NOTHING, not an upsert: nothing to rewrite, and INSERT ... SELECT with DO UPDATE fails
# ("cannot affect row a second time") on an id twice in one batch.
_INSERT = (f"INSERT INTO {_T} ({_COLUMN_LIST}) VALUES ({', '.join('?' for _ in COLUMNS)}) "
           "ON CONFLICT (id) DO NOTHING")
#: PostgreSQL: the connection's own staging table. COPY costs one round trip and no parse or
#: plan per row (a 1,000-row ``executemany`` plans the insert 1,000 times); created once per
#: connection, emptied by every commit (and a rollback).
_STAGE = f"{_T}_in"
_CREATE_STAGE = f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} (LIKE {_T}) ON COMMIT DELETE ROWS"
# Binary: the values are not formatted as text and parsed again (twice as fast as text).
_COPY = f"COPY {_STAGE} ({_COLUMN_LIST}) FROM STDIN (FORMAT BINARY)"
#: The COPY's binary format needs each column's type.
_PG_TYPES = [pg_type(c) for c in COLUMNS]
_FROM_STAGE = (f"INSERT INTO {_T} ({_COLUMN_LIST}) SELECT {_COLUMN_LIST} FROM {_STAGE} "
               "ON CONFLICT (id) DO NOTHING")
#: Rejected records named in one log line at the most (the count is always given).
_LOGGED_IDS = 20


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

        The refused-row policy is the storage layer's (``vigil.storage.split_writes``): a batch
        the database refuses is halved down to the records it refuses alone.
        """
        done = [False] * len(batch)
        refused: list[tuple[str, str]] = []
        rows: list[tuple[int, tuple[Any, ...]]] = []
        for i, record in enumerate(batch):
            try:
                rows.append((i, to_row(record)))
            except Exception as exc:
                # Not a record the gateway makes: it can never be written.
                done[i] = True
                refused.append((_id_of(record), f"cannot be converted: {reason(exc)}"))
        outcome = write_batch([row for _, row in rows], lambda part: self._insert(db, part))
        if outcome.unexpected is not None:
            # Neither the database's refusal nor a value the driver cannot send: a defect,
            # worth its traceback (once per batch).
            log.error("unexpected error writing %d gateway records", len(rows),
                      exc_info=outcome.unexpected)
        for k in outcome.written:
            done[rows[k][0]] = True
        for k, exc in outcome.refused:
            done[rows[k][0]] = True
            refused.append((_id_of(batch[rows[k][0]]), reason(exc)))
        error = outcome.stopped_by
        return done, len(outcome.written), refused, error if isinstance(error, Exception) else None

    def _insert(self, db: SqlDatabase, rows: Sequence[tuple[Any, ...]]) -> None:
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


def _id_of(record: object) -> str:
    try:
        return repr(cast(GatewayRecord, record).id)
    except Exception:
        return f"<not a record: {type(record).__name__}>"


def _log_rejected(refused: list[tuple[str, str]]) -> None:
    """One error line per reason (a database's names it), naming up to ``_LOGGED_IDS`` of
    its records."""
    by_reason: dict[str, list[str]] = {}
    for record_id, why in refused:
        by_reason.setdefault(why, []).append(record_id)
    for why, ids in by_reason.items():
        more = f" and {len(ids) - _LOGGED_IDS} more" if len(ids) > _LOGGED_IDS else ""
        log.error("dropped %d gateway records that cannot be stored (ids %s%s): %s", len(ids),
                  ", ".join(ids[:_LOGGED_IDS]), more, why)
