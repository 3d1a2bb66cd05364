"""The PostgreSQL side of Vigil's storage layer: several processes share one database.

``PostgresDatabase`` offers what ``vigil.storage.sqlite.Database`` offers
(``vigil.storage.database``'s ``SqlDatabase``), so a store runs the same SQL on either. What
differs underneath:

- a pool of connections (``psycopg_pool``), each in autocommit mode between transactions,
  instead of one connection behind a lock: threads run their statements concurrently, and a
  transaction belongs to the thread that opened it (nested use in that thread is a savepoint);
- ``?`` placeholders are rewritten to psycopg's ``%s`` (and a literal ``%`` to ``%%``),
  outside quoted literals and identifiers, once per SQL string;
- the schema given on open is applied under an advisory lock, so instances starting together
  do not race on ``CREATE TABLE IF NOT EXISTS`` (which is not safe concurrently);
- a connection the server dropped (restart, fail-over) is noticed when it is taken from the
  pool and replaced; while the server cannot be reached, calls fail after ``connect_timeout``
  with ``StoreUnavailable`` ("retry later"), and the same object works again once it is back.

Results are what SQLite returns for the same SQL (``SUM``/``AVG`` come back as ``int`` or
``float``, not ``Decimal``), except that a comparison in a select list is a ``bool``.

Every error is a ``StoreError`` that names the URL without its password. A commit cut off
by a lost connection also raises ``StoreUnavailable``, although the server may have
committed it: writes that are retried after that error must be idempotent (``ON CONFLICT``).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from vigil.errors import ExtraMissingError, StoreError, StoreUnavailable
from vigil.storage.database import (
    POSTGRESQL,
    SCHEMA_TABLE,
    Dialect,
    lock_key,
    redact_url,
    url_password,
)

try:
    import psycopg
    import psycopg_pool
except ModuleNotFoundError as _exc:  # pragma: no cover - the gateway extra brings both
    _MISSING: ModuleNotFoundError | None = _exc
else:
    _MISSING = None

if TYPE_CHECKING:
    from psycopg import Connection as PgConnection
    from psycopg import Cursor as PgCursor

__all__ = ["PgConn", "PostgresDatabase", "is_unavailable", "translate_placeholders"]

#: SQLSTATEs that mean "the server is not there right now" rather than "this is wrong":
#: shutting down (57P01 admin, 57P02 crash), starting up (57P03), too many clients (53300).
#: Class 08 (connection exceptions) and errors without a SQLSTATE (the socket broke) too.
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})

#: The same conditions as the server words them when it refuses a new connection (its
#: English messages: a server with translated ``lc_messages`` answers these as errors).
_UNAVAILABLE_FATAL = ("the database system is starting up", "the database system is shutting down",
                      "the database system is in recovery mode",
                      "the database system is not yet accepting connections",
                      "the database system is not accepting connections",
                      "too many clients", "connection slots are reserved",
                      "terminating connection due to administrator command")


@lru_cache(maxsize=2048)
def translate_placeholders(sql: str) -> str:
    """``sql`` with ``?`` placeholders as psycopg's ``%s`` and every ``%`` doubled.

    A ``?`` inside a single-quoted literal or a double-quoted identifier is left alone; a
    ``%`` is doubled everywhere, since psycopg reads ``%`` even inside literals. Dollar
    quoting, ``E'...'`` backslash escapes and comments containing quotes are not understood:
    the stores' SQL uses none of them.
    """
    out: list[str] = []
    quote = ""
    for ch in sql:
        if ch == "%":
            out.append("%%")
            continue
        if quote:
            if ch == quote:
                quote = ""  # a doubled quote closes and reopens: same result
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "?":
            out.append("%s")
            continue
        out.append(ch)
    return "".join(out)


def _one_line(exc: BaseException) -> str:
    return "; ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (from psycopg or its pool) means the server cannot be reached now."""
    if _MISSING is not None:
        return False
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    if state is not None:
        return state.startswith("08") or state in _UNAVAILABLE_STATES
    # libpq gives no SQLSTATE for a refused connection: a FATAL message means the server
    # answered, and only these of its answers mean "later" (a missing database, role or
    # password does not get better by retrying).
    message = str(exc)
    if "FATAL:" not in message:
        return True  # refused, timed out, or the socket broke
    return any(phrase in message for phrase in _UNAVAILABLE_FATAL)


class PgConn:
    """What ``transaction()`` and ``snapshot()`` yield: ``execute`` and ``executemany`` with
    ``?`` placeholders, on the transaction's connection (``raw``, the psycopg one).

    ``execute`` returns psycopg's cursor (``fetchall``, ``fetchone``, ``rowcount``, iteration;
    ``fetchall`` of a statement that returns no rows raises). psycopg errors are raised as
    the database's ``StoreError``/``StoreUnavailable`` at once, so code inside the block catches
    the same exception on either database; after one, PostgreSQL refuses further statements
    of that transaction level: catch it around a nested ``transaction()`` to go on.
    """

    def __init__(self, db: PostgresDatabase, raw: PgConnection[Any], doing: str) -> None:
        #: What errors say was being done ("add items to the records").
        self.db = db
        self.raw = raw
        self.doing = doing

    def execute(self, sql: str, params: Sequence[Any] = ()) -> PgCursor[Any]:
        """Run one statement; the cursor with its rows and ``rowcount``."""
        try:
            return self.raw.execute(translate_placeholders(sql), tuple(params))
        except psycopg.Error as exc:
            raise self.db.fail(self.doing, exc) from None

    def executemany(self, sql: str, seq: Sequence[Sequence[Any]]) -> PgCursor[Any]:
        """Run one statement for each parameter row (pipelined); the cursor."""
        cur = self.raw.cursor()
        try:
            cur.executemany(translate_placeholders(sql), [tuple(row) for row in seq])
        except psycopg.Error as exc:
            raise self.db.fail(self.doing, exc) from None
        return cur


@dataclass
class _Held:
    """The connection a thread holds inside ``transaction()`` or ``snapshot()``."""

    conn: PgConn
    snapshot: bool
    depth: int = 0
    undo: list[Callable[[], object]] = field(default_factory=list)
    committed: list[Callable[[], object]] = field(default_factory=list)


@lru_cache(maxsize=1)
def _number_loader() -> Any:
    """The loader of ``numeric`` (what PostgreSQL's ``SUM`` and ``AVG`` of integers return):
    ``int`` when integral, else ``float``, as SQLite returns them (a ``Decimal`` would break
    arithmetic with floats). The schema has no NUMERIC columns (``Dialect.ddl``)."""
    from psycopg.adapt import Loader

    class NumberLoader(Loader):
        def load(self, data: Any) -> int | float:
            text = bytes(data).decode("ascii")
            try:
                return int(text)
            except ValueError:
                return float(text)  # also NaN and ±Infinity

    return NumberLoader


def _configure(conn: PgConnection[Any]) -> None:
    conn.adapters.register_loader("numeric", _number_loader())


def _recording_connection_class() -> Any:
    """A psycopg ``Connection`` class of one pool that keeps the reason its latest connection
    attempt failed (``last_error``, "" after a success), for the pool only says it timed out."""

    class RecordingConnection(psycopg.Connection):
        last_error = ""

        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: Any) -> Any:
            try:
                conn = super().connect(conninfo, **kwargs)
            except psycopg.Error as exc:
                cls.last_error = _one_line(exc)
                raise
            cls.last_error = ""
            return conn

    return RecordingConnection


class PostgresDatabase:
    """A PostgreSQL database opened for Vigil through a connection pool.

    ``url`` is a libpq URL (``postgresql://user:password@host:port/dbname?...``); messages
    name it without the password (``display``). ``what`` names the data in errors ("the
    gateway records"). ``schema`` statements (SQLite's spelling, ``CREATE ... IF NOT
    EXISTS``; ``Dialect.ddl`` adapts them) run in one transaction on open unless ``readonly``;
    a ``readonly`` database refuses writes here and its sessions are read-only on the server
    too. The pool keeps ``min_size`` to ``max_size`` connections. ``connect_timeout``
    (seconds) bounds how long opening, and every later call, waits for a connection before
    ``StoreUnavailable``.

    Thread-safe: each thread's transaction runs on a connection of its own.
    """

    #: The SQL dialect (``vigil.storage.database``).
    dialect: Dialect = POSTGRESQL

    def __init__(self, url: str, *, what: str, schema: Sequence[str] = (),
                 readonly: bool = False, max_size: int = 4, min_size: int = 1,
                 connect_timeout: float = 5.0) -> None:
        if _MISSING is not None:
            raise ExtraMissingError("gateway", (_MISSING.name or "psycopg").partition(".")[0])
        if not 1 <= min_size <= max_size:
            raise ValueError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")
        if connect_timeout <= 0:
            raise ValueError(f"connect_timeout must be positive, got {connect_timeout}")
        self.url = url
        self.what = what
        self.readonly = readonly
        self.connect_timeout = float(connect_timeout)
        self._display = redact_url(url)
        self._password = url_password(url)
        self._local = threading.local()
        self._closed = False
        self._connection_class = _recording_connection_class()
        kwargs: dict[str, Any] = {
            "autocommit": True,
            # libpq counts whole seconds, and treats less than 2 as 2.
            "connect_timeout": max(2, math.ceil(self.connect_timeout)),
            "application_name": "vigil",
            # No server-side prepared statements: another instance's migration may change a
            # table under them ("cached plan must not change result type"), and poolers in
            # transaction mode do not keep them.
            "prepare_threshold": None,
        }
        if readonly:
            kwargs["options"] = "-c default_transaction_read_only=on"
        # Opening connects once, outside the pool, so that a refused connection, a bad
        # password or a missing database is reported with libpq's reason.
        try:
            with psycopg.connect(url, **kwargs) as conn:
                _configure(conn)
                if schema and not readonly:
                    self._apply_schema(conn, schema)
        except psycopg.Error as exc:
            raise self.fail(f"connect to {what}", exc) from None
        self._pool = psycopg_pool.ConnectionPool(
            url, kwargs=kwargs, min_size=min_size, max_size=max_size, open=False,
            connection_class=self._connection_class,
            check=psycopg_pool.ConnectionPool.check_connection, timeout=self.connect_timeout,
            # Give up reconnecting in the background soon: a connection is then made when
            # one is asked for, so the pool is usable at once when the server is back.
            reconnect_timeout=max(self.connect_timeout, 1.0), configure=_configure,
            name=f"vigil {what}")
        self._pool.open(wait=False)

    def _apply_schema(self, conn: PgConnection[Any], schema: Sequence[str]) -> None:
        with conn.transaction():
            # CREATE ... IF NOT EXISTS is not safe against a concurrent CREATE: serialise.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(SCHEMA_TABLE),))
            for statement in schema:
                conn.execute(self.dialect.ddl(statement))  # no parameters: no % processing

    # --- plumbing --------------------------------------------------------------------------
    @property
    def display(self) -> str:
        """The URL without its password, as errors name it."""
        return self._display

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_transaction(self) -> bool:
        """True inside ``transaction()`` in this thread."""
        held = self._held()
        return held is not None and not held.snapshot

    def fail(self, doing: str, exc: BaseException) -> StoreError:
        """The error for ``doing`` having failed with ``exc``: ``StoreUnavailable`` when the
        server could not be reached, else ``StoreError``; it names the URL and the cause."""
        cause = _one_line(exc)
        if isinstance(exc, psycopg_pool.PoolTimeout):
            # The pool's own message only says it waited: add why its connections failed.
            last = self._connection_class.last_error
            cause = f"no connection within {self.connect_timeout:g} s" + (
                f" ({last})" if last else "")
        if self._password:
            cause = cause.replace(self._password, "***")
        kind = StoreUnavailable if is_unavailable(exc) else StoreError
        return kind(f"{self._display}: cannot {doing}: {cause}")

    @contextmanager
    def errors_as(self, doing: str) -> Iterator[None]:
        """Inside, a psycopg error becomes ``fail(doing, exc)``."""
        try:
            yield
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self.fail(doing, exc) from None

    def require_writable(self, doing: str) -> None:
        """Raise ``StoreError`` for ``doing`` if the database is open read-only."""
        if self.readonly:
            raise StoreError(f"{self._display}: cannot {doing}: {self.what} is open read-only")

    def _require_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self._display}: {self.what} is closed")

    def _held(self) -> _Held | None:
        return getattr(self._local, "held", None)

    @contextmanager
    def _connection(self, doing: str) -> Iterator[PgConnection[Any]]:
        """A pooled connection for one statement (the thread's own inside a transaction)."""
        held = self._held()
        if held is not None:
            yield held.conn.raw
            return
        self._require_open()
        try:
            conn = self._pool.getconn()
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self.fail(doing, exc) from None
        try:
            yield conn
        finally:
            self._pool.putconn(conn)

    def query(self, sql: str, params: Sequence[Any] = (), *,
              doing: str = "read") -> list[Any]:
        """Rows (tuples) of one statement (outside or inside a transaction)."""
        what = f"{doing} {self.what}"
        with self._connection(what) as conn:
            try:
                cur = conn.execute(translate_placeholders(sql), tuple(params))
                return cur.fetchall() if cur.description is not None else []
            except psycopg.Error as exc:
                raise self.fail(what, exc) from None

    def execute(self, sql: str, params: Sequence[Any] = (), *, doing: str = "write") -> int:
        """Run one statement (its own transaction unless inside one); the changed row count."""
        what = f"{doing} {self.what}"
        self.require_writable(what)
        with self._connection(what) as conn:
            try:
                return conn.execute(translate_placeholders(sql), tuple(params)).rowcount
            except psycopg.Error as exc:
                raise self.fail(what, exc) from None

    # --- transactions ----------------------------------------------------------------------
    @contextmanager
    def transaction(self, *, doing: str = "write",
                    after_begin: Callable[[PgConn], object] | None = None
                    ) -> Iterator[PgConn]:
        """All or nothing: the statements run inside commit together, or none does.

        The outermost level takes a connection of the pool for this thread (``BEGIN``, READ
        COMMITTED: lock the rows you will change, ``Dialect.skip_locked``); a nested use in
        the same thread is a savepoint, so an exception caught inside undoes only the inner
        block. ``after_begin`` runs right after the outermost ``BEGIN``. psycopg errors become
        this database's errors; any other exception propagates after the rollback. Whatever
        level rolls back runs the ``on_rollback`` callbacks registered inside it; the
        ``after_commit`` ones run once the outermost level has committed.
        """
        what = f"{doing} {self.what}"
        self.require_writable(what)
        held = self._held()
        if held is not None and held.snapshot:
            raise StoreError(f"{self._display}: cannot {what}: a transaction cannot begin "
                             "inside a snapshot")
        if held is None:
            with self._outermost(what, snapshot=False) as held:
                if after_begin is not None:
                    after_begin(held.conn)
                yield held.conn
            return
        depth = held.depth
        marks = (len(held.undo), len(held.committed))
        raw = held.conn.raw
        with self.errors_as(f"begin a transaction on {self.what}"):
            raw.execute(f"SAVEPOINT vigil_{depth}")
        held.depth = depth + 1
        try:
            yield PgConn(self, raw, what)
        except BaseException:
            held.depth = depth
            with contextlib.suppress(psycopg.Error):
                raw.execute(f"ROLLBACK TO SAVEPOINT vigil_{depth}")
                raw.execute(f"RELEASE SAVEPOINT vigil_{depth}")
            self._undo_to(held, marks)
            raise
        held.depth = depth
        try:
            raw.execute(f"RELEASE SAVEPOINT vigil_{depth}")
        except psycopg.Error as exc:
            self._undo_to(held, marks)
            raise self.fail(f"commit to {self.what}", exc) from None

    @contextmanager
    def _outermost(self, what: str, *, snapshot: bool) -> Iterator[_Held]:
        with self._connection(what) as raw:
            begin = ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if snapshot
                     else "BEGIN")
            with self.errors_as(f"begin a {'read ' if snapshot else ''}transaction on "
                                f"{self.what}"):
                raw.execute(begin)
            held = _Held(PgConn(self, raw, what), snapshot=snapshot, depth=1)
            self._local.held = held
            try:
                try:
                    yield held
                except BaseException as exc:
                    with contextlib.suppress(psycopg.Error):
                        raw.execute("ROLLBACK")
                    self._undo_to(held, (0, 0))
                    if isinstance(exc, (psycopg.Error, psycopg_pool.PoolTimeout)):
                        raise self.fail(what, exc) from None
                    raise
                try:
                    raw.execute("COMMIT")
                except psycopg.Error as exc:
                    with contextlib.suppress(psycopg.Error):
                        raw.execute("ROLLBACK")
                    self._undo_to(held, (0, 0))
                    raise self.fail(f"commit to {self.what}", exc) from None
            finally:
                self._local.held = None
        held.undo.clear()
        for callback in held.committed:
            callback()

    @staticmethod
    def _undo_to(held: _Held, marks: tuple[int, int]) -> None:
        undo_mark, commit_mark = marks
        del held.committed[commit_mark:]
        while len(held.undo) > undo_mark:
            held.undo.pop()()

    def on_rollback(self, undo: Callable[[], object]) -> None:
        """Call ``undo`` if the transaction level open now (in this thread) rolls back,
        newest first. Dropped when the outermost level commits, and at once outside a
        transaction. It must not raise."""
        held = self._held()
        if held is not None and not held.snapshot:
            held.undo.append(undo)

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once this thread's outermost transaction has committed (at once
        outside one). Dropped if the level open now rolls back. It runs outside the
        transaction, so it may open its own; an exception it raises propagates from the
        ``with`` block (the transaction is committed) and the later callbacks are dropped."""
        held = self._held()
        if held is not None and not held.snapshot:
            held.committed.append(callback)
        else:
            callback()

    @contextmanager
    def snapshot(self) -> Iterator[PgConn]:
        """Several reads on one snapshot (REPEATABLE READ, READ ONLY).

        Inside an open transaction of this thread that one is the snapshot already and is
        left alone. Only for reads: ``transaction()`` cannot begin inside it.
        """
        held = self._held()
        if held is not None:
            yield held.conn
            return
        with self._outermost(f"read {self.what}", snapshot=True) as held:
            yield held.conn

    def close(self) -> None:
        """Close the pool (idempotent); connections still in use are closed when returned."""
        if self._closed:
            return
        self._closed = True
        self._pool.close()

    def __enter__(self) -> PostgresDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"PostgresDatabase({self._display!r}, {self.what!r}"
                f"{', readonly' if self.readonly else ''})")
