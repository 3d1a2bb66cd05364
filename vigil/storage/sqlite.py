"""One way to open and write an SQLite file, shared by every store Vigil keeps.

The sample store, the alert outbox, the batch queue and the gateway's request records are each
one SQLite file in WAL mode (one writer, many readers: the dashboard reads while the collector
writes), written by several threads of one process and sometimes by several processes. They
differ in durability (the outbox fsyncs every commit, the others trust WAL's NORMAL) and schema;
what they share is here: opening (directory, WAL, busy timeout, read-only URIs), one connection
behind a lock, explicit transactions that take the write lock up front (``BEGIN IMMEDIATE``, so
a writer never fails half-way with "database is locked"), savepoints for nested use, callbacks
that keep in-memory state in step with what committed (``on_rollback``, ``after_commit``), read
snapshots, and errors that name the file and what was being done.

The standard library's ``sqlite3`` is used as is; this module only fixes the choices that each
store would otherwise make (and once made differently).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from vigil.errors import StoreError, VigilError
from vigil.storage.database import SQLITE, Dialect

__all__ = ["BUSY_TIMEOUT_MS", "Database", "Synchronous"]

#: How long a writer waits for another connection's write lock before failing (milliseconds).
#: Compactions and batch transactions of other processes take seconds at the most.
BUSY_TIMEOUT_MS = 10_000

#: ``PRAGMA synchronous`` in WAL mode: NORMAL survives an application crash (a power loss may lose
#: the last commits, never the file); FULL survives a power loss too, at one fsync per commit.
Synchronous = Literal["NORMAL", "FULL"]

ErrorFactory = Callable[[str], VigilError]


class Database:
    """An SQLite file opened for Vigil: WAL, busy timeout, one connection behind a lock.

    ``what`` names the file in errors ("the store", "the alert outbox"); every error is raised
    as ``error(f"{path}: cannot {doing}: {cause}")`` (``StoreError`` unless another leaf of
    ``VigilError`` is given). ``schema`` statements run in one immediate transaction when the
    file is opened for writing (use ``CREATE ... IF NOT EXISTS``). ``readonly`` opens an existing
    file through a ``mode=ro`` URI and never creates or changes it. ``check`` runs first on the
    new connection, before this class reads or changes anything: the place to refuse a file that
    belongs to someone else (opened for writing, it would otherwise be switched to WAL); it
    raises a ``VigilError`` to refuse, and the connection is closed.

    The connection is in autocommit mode (``isolation_level=None``): nothing is ever left open
    between calls, and ``transaction()`` is the only way to group writes. It may be used from
    any thread; the lock (re-entrant) serialises use.
    """

    def __init__(self, path: str | Path, *, what: str = "the store",
                 error: ErrorFactory = StoreError, readonly: bool = False,
                 synchronous: Synchronous = "NORMAL", schema: Sequence[str] = (),
                 pragmas: Sequence[str] = (),
                 check: Callable[[sqlite3.Connection], object] | None = None) -> None:
        self.path = Path(path)
        self.what = what
        self.readonly = readonly
        self._error = error
        self.lock = threading.RLock()
        self._depth = 0
        #: Callbacks of the open transaction: undo on rollback, run after the outermost commit.
        self._undo: list[Callable[[], object]] = []
        self._committed: list[Callable[[], object]] = []
        self._conn: sqlite3.Connection | None = self._open(synchronous, schema, pragmas, check)

    # --- opening ---------------------------------------------------------------------------
    def _open(self, synchronous: Synchronous, schema: Sequence[str], pragmas: Sequence[str],
              check: Callable[[sqlite3.Connection], object] | None) -> sqlite3.Connection:
        if self.readonly:
            if not self.path.exists():
                raise self._error(f"{self.path}: no such file ({self.what})")
            target, uri = self.path.resolve().as_uri() + "?mode=ro", True
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self.fail("create the directory", exc) from None
            target, uri = str(self.path), False
        try:
            conn = sqlite3.connect(target, uri=uri, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise self.fail(f"open {self.what}", exc) from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if check is not None:
                check(conn)
            # The first statement that reads the file: a file that is not SQLite fails here.
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            if not self.readonly:
                # journal_mode is stored in the file and cannot change inside a transaction.
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise self._error(f"{self.path}: cannot switch {self.what} to WAL mode "
                                      f"(got {mode!r})")
                conn.execute(f"PRAGMA synchronous = {synchronous}")
            for pragma in pragmas:
                conn.execute(f"PRAGMA {pragma}")
            if schema and not self.readonly:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for ddl in schema:
                        conn.execute(ddl)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
        except VigilError:
            conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise self._error(f"{self.path}: not a usable SQLite file for {self.what}: "
                              f"{exc}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    # --- plumbing --------------------------------------------------------------------------
    #: The SQL dialect (``vigil.storage.database``): stores that also run on PostgreSQL ask it.
    dialect: Dialect = SQLITE

    @property
    def display(self) -> str:
        """The file's path, as errors name it."""
        return str(self.path)

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection (an error once closed). Hold ``lock`` while using it."""
        if self._conn is None:
            raise self._error(f"{self.path}: {self.what} is closed")
        return self._conn

    @property
    def closed(self) -> bool:
        return self._conn is None

    @property
    def in_transaction(self) -> bool:
        """True inside ``transaction()`` (of this thread or, while it holds the lock, another)."""
        return self._depth > 0

    def fail(self, doing: str, exc: BaseException) -> VigilError:
        """The error to raise when ``doing`` failed with ``exc`` (file, action and cause)."""
        return self._error(f"{self.path}: cannot {doing}: {exc}")

    @contextmanager
    def errors_as(self, doing: str) -> Iterator[None]:
        """Inside, an SQLite error becomes ``fail(doing, exc)``.

        For steps that name themselves more precisely than ``query``'s or ``transaction``'s
        ``doing`` can ("cannot compact: ...", "cannot write 700 samples: ..."). Used inside a
        transaction, the transaction then rolls back as for any other exception.
        """
        try:
            yield
        except sqlite3.Error as exc:
            raise self.fail(doing, exc) from None

    def require_writable(self, doing: str) -> None:
        """Raise this database's error for ``doing`` if it is open read-only."""
        if self.readonly:
            raise self._error(f"{self.path}: cannot {doing}: {self.what} is open read-only")

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = (), *,
              doing: str = "read") -> list[Any]:
        """Rows of one statement (outside or inside a transaction)."""
        with self.lock:
            try:
                return self.conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise self.fail(f"{doing} {self.what}", exc) from None

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = (), *,
                doing: str = "write") -> int:
        """Run one statement (its own transaction unless inside one); the changed row count."""
        with self.lock:
            try:
                return self.conn.execute(sql, params).rowcount
            except sqlite3.Error as exc:
                raise self.fail(f"{doing} {self.what}", exc) from None

    # --- transactions ----------------------------------------------------------------------
    @contextmanager
    def transaction(self, *, doing: str = "write",
                    after_begin: Callable[[sqlite3.Connection], object] | None = None
                    ) -> Iterator[sqlite3.Connection]:
        """All or nothing: the statements run inside commit together, or none does.

        The outermost level takes the write lock at once (``BEGIN IMMEDIATE``); a nested use
        joins it through a savepoint, so an exception caught inside undoes only the inner
        block. ``after_begin`` runs right after the outermost ``BEGIN`` (a store reads its
        watermarks there); if it raises, the transaction is rolled back. Errors of SQLite
        become this database's error; any other exception propagates after the rollback.
        Whatever level rolls back runs the ``on_rollback`` callbacks registered inside it; the
        ``after_commit`` ones run once the outermost level has committed.
        """
        self.require_writable(doing)
        with self.lock:
            conn = self.conn
            depth = self._depth
            marks = (len(self._undo), len(self._committed))
            try:
                if depth == 0:
                    conn.execute("BEGIN IMMEDIATE")
                    if after_begin is not None:
                        try:
                            after_begin(conn)
                        except BaseException:
                            conn.execute("ROLLBACK")
                            raise
                else:
                    conn.execute(f"SAVEPOINT vigil_{depth}")
            except sqlite3.Error as exc:
                raise self.fail(f"begin a transaction on {self.what}", exc) from None
            self._depth = depth + 1
            try:
                yield conn
            except BaseException as exc:
                self._depth = depth
                self._rollback(conn, depth, marks)
                if isinstance(exc, sqlite3.Error):
                    raise self.fail(f"{doing} {self.what}", exc) from None
                raise
            self._depth = depth
            try:
                conn.execute("COMMIT" if depth == 0 else f"RELEASE vigil_{depth}")
            except sqlite3.Error as exc:
                self._rollback(conn, depth, marks)
                raise self.fail(f"commit to {self.what}", exc) from None
            if depth == 0:
                self._undo.clear()
                if self._committed:
                    callbacks, self._committed = self._committed, []
                    for callback in callbacks:
                        callback()

    def _rollback(self, conn: sqlite3.Connection, depth: int, marks: tuple[int, int]) -> None:
        # A failed rollback is not reported: the original error is the one worth reporting.
        with contextlib.suppress(sqlite3.Error):
            if depth == 0:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            else:
                conn.execute(f"ROLLBACK TO vigil_{depth}")
                conn.execute(f"RELEASE vigil_{depth}")
        undo_mark, commit_mark = marks
        del self._committed[commit_mark:]
        while len(self._undo) > undo_mark:
            self._undo.pop()()

    def on_rollback(self, undo: Callable[[], object]) -> None:
        """Call ``undo`` if the transaction level open now rolls back (newest first).

        For in-memory state that mirrors rows written in the transaction (a cache of ids the
        rolled-back rows handed out). Dropped when the outermost level commits; outside a
        transaction nothing can roll back, and ``undo`` is dropped at once. It must not raise.
        Call it with ``lock`` held, inside ``transaction()``.
        """
        if self._depth:
            self._undo.append(undo)

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once the outermost transaction has committed (at once outside one).

        Dropped if the level open now rolls back. It runs with ``lock`` held and outside any
        transaction, so it may open its own; an exception it raises propagates from the
        ``with`` block (the transaction is committed) and the later callbacks are dropped.
        """
        if self._depth:
            self._committed.append(callback)
        else:
            callback()

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """Several reads on one snapshot: a read transaction (deferred ``BEGIN``).

        Inside an open transaction that one is the snapshot already and is left alone. Only
        for reads: ``transaction()`` cannot begin inside it.
        """
        with self.lock:
            conn = self.conn
            if conn.in_transaction:
                yield conn
                return
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as exc:
                raise self.fail(f"begin a read transaction on {self.what}", exc) from None
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")  # nothing written: this only ends the snapshot

    def close(self) -> None:
        """Close the connection (idempotent); an open transaction is rolled back."""
        with self.lock:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Database({str(self.path)!r}, {self.what!r}{', readonly' if self.readonly else ''})"
