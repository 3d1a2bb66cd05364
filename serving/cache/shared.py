"""The cache's entries shared through the gateway database, so that gateway instances behind
one load balancer answer from one cache.

Each instance keeps its own in-memory ``EntryStore`` (L1 map, L2 vector indexes): lookups never
touch the database. What is shared is the table ``cache_entries``, one row per stored answer
(its L1 hash, L2 partition, body, query and float32 embedding), appended to by every instance:

* **write**: an answer this instance stores is queued (``publish``, never blocking) and written
  by a background thread in batches. The queue is bounded; when it is full, or when the
  database cannot be written (down, restarting), entries are dropped and counted: the cache
  still holds them locally, and a cache entry is worth less than a request record. NUL in a
  text field is replaced (U+FFFD) on either database, since PostgreSQL refuses it; a row the
  database still refuses costs only that row (``rejected``), never its batch: the storage
  layer's policy for every store (``vigil.storage.split_writes``).
* **read**: every ``sync_interval`` seconds the same thread reads the rows other instances
  appended since the last read (``seq``) and hands them to the event loop (``take``), which
  puts them into its ``EntryStore``. Expired rows are never handed over; a row's
  ``expires_at`` (Unix seconds on the injected clock) is kept as it was stored.
* **start**: the live rows already in the table (the newest ``max_entries``) are loaded, so an
  instance that starts, or a single gateway that restarts on its SQLite file, begins warm.
  The read position then settles like any other read (below): a row whose transaction was
  still open during the load is read once it commits.
* **purge**: once a minute expired rows and rows beyond ``max_entries`` (oldest ``seq``
  first) are deleted; on PostgreSQL a transaction-scoped advisory lock lets one instance
  purge at a time (the others skip that round).

On PostgreSQL, ``seq`` values are handed out before commit, so a row with a smaller ``seq``
can become visible after a larger one has been read. The reader therefore re-reads the ``seq``
values of the last ``SETTLE_SECONDS`` and fetches the ones it has not seen; on SQLite writers
take the write lock before the ``seq`` is chosen, so commit order is ``seq`` order. A ``seq``
counts as seen only once its row was fetched, so a failed read loses nothing.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vigil.clock import Clock
from vigil.errors import StoreError
from vigil.storage.database import SqlDatabase, lock_key, open_database
from vigil.storage.split_writes import reason, write_batch

__all__ = ["COMPONENT", "MIGRATIONS", "WHAT", "SharedEntries", "SharedEntry"]

log = logging.getLogger("vigil.cache.shared")

WHAT = "the cache entries"
COMPONENT = "gateway_cache"
#: Schema steps of ``cache_entries`` (append-only, see ``vigil.storage.database.migrate``).
MIGRATIONS: Sequence[Sequence[str]] = (
    (
        "CREATE TABLE IF NOT EXISTS cache_entries ("
        "seq INTEGER PRIMARY KEY AUTOINCREMENT, "
        "l1 TEXT NOT NULL, "
        "l2_partition TEXT, "
        "body BLOB NOT NULL, "
        "query TEXT, "
        "vector BLOB, "
        "dim INTEGER, "
        "stored_at REAL NOT NULL, "
        "expires_at REAL NOT NULL, "
        "origin TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS cache_entries_l1 ON cache_entries (l1)",
        "CREATE INDEX IF NOT EXISTS cache_entries_expires ON cache_entries (expires_at)",
    ),
)

#: Entries waiting to be written; beyond this many, new ones are dropped and counted.
DEFAULT_QUEUE = 10_000
#: Rows per write transaction.
MAX_BATCH = 500
#: Rows fetched per ``SELECT ... WHERE seq IN (...)``.
FETCH_CHUNK = 500
#: Seconds between purges of expired and surplus rows.
PURGE_INTERVAL = 60.0
#: How long (seconds) the reader keeps re-reading recent ``seq`` values on PostgreSQL, where a
#: transaction that took its ``seq`` earlier may commit later.
SETTLE_SECONDS = 10.0
#: Seconds between two warnings that the database is out of reach.
_WARNING_INTERVAL = 60.0

_COLUMNS = "seq, l1, l2_partition, body, query, vector, dim, expires_at"
_INSERT = ("INSERT INTO cache_entries (l1, l2_partition, body, query, vector, dim, stored_at, "
           "expires_at, origin) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")


_PURGE_LOCK = lock_key("cache_entries.purge")


def _text(value: str | None) -> str | None:
    """``value`` without NUL (PostgreSQL refuses it in text; SQLite gets the same row)."""
    if value is None or "\x00" not in value:
        return value
    return value.replace("\x00", "\ufffd")


def default_origin() -> str:
    """An id for this gateway instance: host, process and a random part (a restarted process
    is another instance)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class SharedEntry:
    """A row of ``cache_entries`` as the event loop applies it."""

    seq: int
    l1: str
    l2_partition: str | None
    body: bytes
    query: str | None
    #: The unit embedding (float32), None for an L1-only entry.
    vector: np.ndarray | None
    #: Unix seconds (injected clock).
    expires_at: float


def _entry(row: Sequence[Any]) -> SharedEntry:
    seq, l1, partition, body, query, blob, dim, expires_at = row
    vector = None
    if blob is not None and partition is not None and query is not None:
        vector = np.frombuffer(bytes(blob), dtype="<f4").astype(np.float32)
        if dim is None or vector.shape[0] != int(dim) or not vector.shape[0]:
            vector = None  # a damaged row: keep its exact layer only
    return SharedEntry(seq=int(seq), l1=str(l1),
                       l2_partition=None if vector is None else str(partition),
                       body=bytes(body), query=None if vector is None else str(query),
                       vector=vector, expires_at=float(expires_at))


_STOP = object()


class SharedEntries:
    """The writer and reader of ``cache_entries`` for one gateway instance (see the module
    docstring). ``publish`` and ``take`` are for the event loop; the database is used only by
    the background thread and by the explicit ``sync``/``purge``/``flush`` calls."""

    def __init__(self, target: str | Path, *, clock: Clock, max_entries: int,
                 sync_interval: float = 1.0, max_queue: int = DEFAULT_QUEUE,
                 origin: str | None = None, purge_interval: float = PURGE_INTERVAL) -> None:
        if sync_interval <= 0:
            raise ValueError(f"sync_interval must be positive, got {sync_interval}")
        self.target = target
        self.origin = origin or default_origin()
        self.max_entries = max_entries
        self.sync_interval = sync_interval
        self.purge_interval = purge_interval
        self._clock = clock
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        #: Rows read from the database, waiting for the event loop (oldest first). Bounded:
        #: beyond max_entries the oldest would be evicted on arrival anyway.
        self._inbox: collections.deque[SharedEntry] = collections.deque(maxlen=max_entries)
        self._db: SqlDatabase | None = None
        self._db_lock = threading.RLock()  # the thread and explicit calls, one at a time
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._first_attempt = threading.Event()
        self._deliver: Callable[[], object] | None = None
        self._loaded = False
        #: The reader's position: every seq <= floor was read; ``_seen`` holds those above.
        self._floor = 0
        self._high = 0
        self._seen: set[int] = set()
        self._history: collections.deque[tuple[float, int]] = collections.deque()
        self._last_warning = -_WARNING_INTERVAL
        self._down = False
        #: Entries written to the database.
        self.written = 0
        # Two counters, each written by one thread only (``+=`` is not atomic across threads).
        self._dropped_full = 0
        self._dropped_unwritten = 0
        #: Entries the database refused for their content (not an outage): not shared.
        self.rejected = 0
        #: Unexpected errors in the background thread (logged; the thread goes on).
        self.failures = 0
        #: Rows of other instances (or of the table at start) handed to the event loop.
        self.received = 0
        #: Rows deleted by this instance's purges.
        self.purged = 0

    @property
    def dropped(self) -> int:
        """Entries not written: the queue was full, the database could not be written, or it
        refused the row (``rejected``)."""
        return self._dropped_full + self._dropped_unwritten + self.rejected

    # --- event loop side -------------------------------------------------------------------

    def start(self, deliver: Callable[[], object] | None = None) -> None:
        """Start the background thread. ``deliver`` is called (from that thread) after rows
        were added to the inbox: schedule ``take`` on the event loop there."""
        if self._thread is not None:
            return
        self._deliver = deliver
        self._thread = threading.Thread(target=self._run, name="gateway-cache-sync",
                                        daemon=True)
        self._thread.start()

    def publish(self, *, l1: str, body: bytes, l2_partition: str | None, query: str | None,
                vector: np.ndarray | None, expires_at: float) -> None:
        """Queue an entry this instance stored for writing; never blocks (a full queue drops
        it and counts)."""
        blob = dim = None
        if vector is not None and l2_partition is not None and query is not None:
            flat = np.ascontiguousarray(vector, dtype="<f4").reshape(-1)
            blob, dim = flat.tobytes(), int(flat.shape[0])
        else:
            l2_partition = query = None
        row = (_text(l1), _text(l2_partition), body, _text(query), blob, dim,
               float(self._clock()), float(expires_at), _text(self.origin))
        try:
            self._queue.put_nowait(row)
        except queue.Full:
            self._dropped_full += 1

    @property
    def pending(self) -> int:
        """Rows waiting in the inbox."""
        return len(self._inbox)

    def take(self, limit: int | None = None) -> list[SharedEntry]:
        """Up to ``limit`` rows from the inbox (all when None), oldest first."""
        taken: list[SharedEntry] = []
        while self._inbox and (limit is None or len(taken) < limit):
            try:
                taken.append(self._inbox.popleft())
            except IndexError:  # pragma: no cover - emptied meanwhile
                break
        return taken

    # --- blocking calls (the thread, tests, shutdown) ----------------------------------------

    def wait_loaded(self, timeout: float) -> bool:
        """Block until the first attempt to open the database and load its live rows has
        finished (either way), at most ``timeout`` seconds; True if the rows were loaded."""
        self._first_attempt.wait(timeout)
        return self._loaded

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until everything published so far was written (or dropped), at most
        ``timeout`` seconds; True if it was."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        return True

    def sync(self) -> int:
        """Read the database now, in the caller's thread (opening it first, and loading the
        table, when not done yet); returns how many rows went into the inbox."""
        with self._db_lock:
            return self._read()

    def purge(self) -> int:
        """Delete expired rows and rows beyond ``max_entries`` (oldest ``seq`` first) now;
        returns how many (0 when another instance is purging, or the database is down)."""
        with self._db_lock:
            db = self._open()
            if db is None:
                return 0
            try:
                deleted = self._purge(db)
            except StoreError as exc:
                self._unreachable("purge", exc)
                return 0
            self.purged += deleted
            return deleted

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (up to ``timeout`` seconds), stop the thread, close the
        database."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping.set()
            # A full queue: the thread still sees _stopping after its current batch.
            with contextlib.suppress(queue.Full):
                self._queue.put(_STOP, timeout=timeout)
            thread.join(timeout)
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # --- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        next_read = 0.0  # at once: open the database and load the table before any write
        next_purge = time.monotonic() + self.purge_interval
        while True:
            now = time.monotonic()
            if now >= next_read:
                try:
                    self._guarded("read", self.sync)
                finally:
                    self._first_attempt.set()
                next_read = now + self.sync_interval
            if now >= next_purge:
                self._guarded("purge", self.purge)
                next_purge = now + self.purge_interval
            try:
                item = self._queue.get(timeout=max(0.0, next_read - time.monotonic()))
            except queue.Empty:
                item = None
            if item is not None:
                self._guarded("write", functools.partial(self._write_from, item))
            if self._stopping.is_set():
                self._guarded("write", self._write_rest)
                return

    def _guarded(self, doing: str, step: Callable[[], object]) -> None:
        """Run one step of the thread; an unexpected error is logged and counted, and the
        thread goes on (it is the only writer and reader of this instance)."""
        try:
            step()
        except Exception:
            self.failures += 1
            log.exception("semantic cache: could not %s the shared entries", doing)

    def _write_from(self, first: Any) -> None:
        """Write ``first`` and what else is queued (up to MAX_BATCH rows)."""
        batch: list[tuple[Any, ...]] = []
        taken = 1
        if first is not _STOP:
            batch.append(first)
        while len(batch) < MAX_BATCH:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            taken += 1
            if item is not _STOP:
                batch.append(item)
        try:
            if batch:
                self._write(batch)
        finally:
            for _ in range(taken):
                self._queue.task_done()

    def _write_rest(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if self._down:  # each attempt would wait for the connect timeout: give up
                if item is not _STOP:
                    self._dropped_unwritten += 1
                self._queue.task_done()
            else:
                self._write_from(item)

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        """Write ``batch`` with the storage layer's refused-row policy (``write_batch``: a
        row the database refuses costs only that row). When the database cannot be written,
        the rows not written are dropped: this instance still holds them in memory."""
        db = self._db  # opened (and re-tried) by the reader, every sync_interval
        if db is None:
            self._dropped_unwritten += len(batch)
            return

        def insert(rows: Sequence[tuple[Any, ...]]) -> None:
            with db.transaction(doing=f"write {len(rows)} cache entries") as conn:
                conn.executemany(_INSERT, rows)

        outcome = write_batch(batch, insert)
        self.written += len(outcome.written)
        self.rejected += len(outcome.refused)
        if outcome.unexpected is not None:
            log.error("semantic cache: unexpected error writing %d shared entries", len(batch),
                      exc_info=outcome.unexpected)
        if outcome.refused:
            log.warning("semantic cache: the database refused %d of %d shared entries, kept "
                        "on this instance only (first: %s)", len(outcome.refused), len(batch),
                        reason(outcome.refused[0][1]))
        if outcome.stopped_by is not None:
            self._dropped_unwritten += len(outcome.not_written(batch))
            self._unreachable("write", outcome.stopped_by)
            return
        self._reachable()

    # --- database work (under _db_lock) -------------------------------------------------------

    def _open(self) -> SqlDatabase | None:
        if self._db is not None:
            return self._db
        try:
            self._db = open_database(self.target, what=WHAT, component=COMPONENT,
                                     migrations=MIGRATIONS)
        except StoreError as exc:
            self._unreachable("open", exc)
            return None
        return self._db

    def _read(self) -> int:
        db = self._open()
        if db is None:
            return 0
        try:
            rows = self._load(db) if not self._loaded else self._new_rows(db)
        except StoreError as exc:
            self._unreachable("read", exc)
            return 0
        self._reachable()
        if rows:
            self._inbox.extend(rows)
            self.received += len(rows)
            deliver = self._deliver
            if deliver is not None:
                # RuntimeError: the event loop is closed, nobody will take them.
                with contextlib.suppress(RuntimeError):
                    deliver()
        return len(rows)

    def _load(self, db: SqlDatabase) -> list[SharedEntry]:
        """The newest ``max_entries`` live rows of every origin, oldest first.

        Every ``seq`` in the table counts as seen, and the floor settles from there as after
        any read: on PostgreSQL a row with a smaller ``seq`` still uncommitted during the load
        is read by a later ``_new_rows`` (which, for ``SETTLE_SECONDS``, lists the table)."""
        with db.snapshot() as conn:
            seqs = [int(s) for (s,) in conn.execute("SELECT seq FROM cache_entries")]
            rows = conn.execute(f"SELECT {_COLUMNS} FROM cache_entries WHERE expires_at > ? "
                                "ORDER BY seq DESC LIMIT ?",
                                (float(self._clock()), self.max_entries)).fetchall()
        self._seen.update(s for s in seqs if s > self._floor)
        self._high = max(self._high, max(seqs, default=0))
        self._loaded = True
        self._advance(db.dialect.postgres)
        return [_entry(r) for r in reversed(rows)]

    def _new_rows(self, db: SqlDatabase) -> list[SharedEntry]:
        """Rows of other origins not read yet (see the module docstring on ``seq`` order)."""
        fresh: list[int] = []
        listed: list[int] = []
        high = self._high
        for seq, origin in db.query("SELECT seq, origin FROM cache_entries WHERE seq > ? "
                                    "ORDER BY seq", (self._floor,),
                                    doing="read new cache entries"):
            seq = int(seq)
            high = max(high, seq)
            if seq not in self._seen:
                listed.append(seq)
                if origin != self.origin:
                    fresh.append(seq)
        rows: list[SharedEntry] = []
        now = float(self._clock())
        for start in range(0, len(fresh), FETCH_CHUNK):
            chunk = fresh[start:start + FETCH_CHUNK]
            marks = ", ".join("?" * len(chunk))
            found = db.query(f"SELECT {_COLUMNS} FROM cache_entries WHERE seq IN ({marks}) "
                             "AND expires_at > ? ORDER BY seq", (*chunk, now),
                             doing="read new cache entries")
            rows += [_entry(r) for r in found]
        # Only now: a fetch that failed above leaves these to the next read.
        self._seen.update(listed)
        self._high = high
        self._advance(db.dialect.postgres)
        return rows

    def _advance(self, postgres: bool) -> None:
        """Move the floor up to what was read ``SETTLE_SECONDS`` ago (at once on SQLite)."""
        now = time.monotonic()
        settle = SETTLE_SECONDS if postgres else 0.0
        self._history.append((now, self._high))
        floor = self._floor
        while self._history and self._history[0][0] <= now - settle:
            floor = max(floor, self._history.popleft()[1])
        if floor != self._floor:
            self._floor = floor
            self._seen = {s for s in self._seen if s > floor}

    def _purge(self, db: SqlDatabase) -> int:
        with db.transaction(doing="purge cache entries") as conn:
            if db.dialect.postgres:
                row = conn.execute("SELECT pg_try_advisory_xact_lock(?)",
                                   (_PURGE_LOCK,)).fetchone()
                if not row or not row[0]:
                    return 0  # another instance is purging
            deleted = conn.execute("DELETE FROM cache_entries WHERE expires_at <= ?",
                                   (float(self._clock()),)).rowcount
            deleted += conn.execute(
                "DELETE FROM cache_entries WHERE seq < (SELECT MIN(seq) FROM (SELECT seq "
                "FROM cache_entries ORDER BY seq DESC LIMIT ?) AS newest)",
                (self.max_entries,)).rowcount
        return max(0, deleted)

    # --- reachability -------------------------------------------------------------------------

    def _unreachable(self, doing: str, exc: BaseException) -> None:
        # Counted every time (dropped), logged when it starts and at most once a minute; log
        # volume is not cache semantics, so the monotonic clock, not the injected one.
        now = time.monotonic()
        if not self._down or now - self._last_warning >= _WARNING_INTERVAL:
            self._last_warning = now
            log.warning("semantic cache: cannot %s the shared entries (%s); answers stay on "
                        "this instance (%d not shared so far)", doing, exc, self.dropped)
        self._down = True

    def _reachable(self) -> None:
        if self._down:
            self._down = False
            log.info("semantic cache: the shared entries are reachable again")
