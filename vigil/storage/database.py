"""Which database a store lives in: an SQLite file, or a PostgreSQL server several processes share.

The gateway's records, batch queue and cache entries are written through one small interface
that ``vigil.storage.sqlite.Database`` (the embedded default) and
``vigil.storage.postgres.PostgresDatabase`` both implement: ``query``, ``execute``,
``transaction`` (yielding a connection-like object with ``execute`` and ``executemany``),
``after_commit``, ``on_rollback``, ``snapshot`` and ``close``.
A store writes its SQL once, in the subset both accept:

- ``?`` placeholders (the PostgreSQL side turns them into psycopg's ``%s``);
- ``INSERT ... ON CONFLICT (...) DO UPDATE SET c = excluded.c`` / ``DO NOTHING``, never
  SQLite's ``INSERT OR REPLACE``;
- ``RETURNING`` instead of ``cursor.lastrowid``;
- the schema in SQLite's spelling (``INTEGER``, ``REAL``, ``BLOB``, ``INTEGER PRIMARY KEY
  AUTOINCREMENT``): ``Dialect.ddl`` gives PostgreSQL ``BIGINT``, ``DOUBLE PRECISION``,
  ``BYTEA`` and ``BIGSERIAL PRIMARY KEY``, so existing SQLite files keep their exact schema;
- row locks that only PostgreSQL needs (``Dialect.skip_locked``): SQLite's ``BEGIN IMMEDIATE``
  already lets one writer at a time in.

Schema changes are numbered steps (``migrate``), recorded per component in ``vigil_schema`` and
applied on open, under PostgreSQL's advisory lock so that two instances starting together do
not both apply them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager

__all__ = [
    "POSTGRESQL",
    "POSTGRES_SCHEMES",
    "SQLITE",
    "Dialect",
    "SqlDatabase",
    "is_postgres_url",
    "lock_key",
    "migrate",
    "open_database",
    "redact_url",
    "url_password",
]

#: URL schemes that name a PostgreSQL server (libpq accepts both).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

#: The oldest SQLite whose SQL the common subset fits (``RETURNING`` came in 3.35).
MIN_SQLITE = (3, 35, 0)

#: The table that records which schema steps each component has applied.
SCHEMA_TABLE = "vigil_schema"


def is_postgres_url(target: str | Path) -> bool:
    """Whether ``target`` is a PostgreSQL URL (else it is an SQLite file path)."""
    return isinstance(target, str) and target.startswith(POSTGRES_SCHEMES)


def _split_url(url: str) -> tuple[str, str, str, str]:
    """``scheme://``, userinfo, the rest of the authority and path, and the query of a libpq URL.

    ``urllib.parse`` is not used: a libpq URL may list several hosts (``h1:5432,h2:5433``),
    which ``urlsplit().port`` refuses.
    """
    scheme, sep, rest = url.partition("://")
    rest, qsep, query = rest.partition("?")
    authority, slash, path = rest.partition("/")
    userinfo, at, hosts = authority.rpartition("@")
    return scheme + sep, userinfo + at, hosts + slash + path, qsep + query


def url_password(url: str) -> str:
    """The password a libpq URL carries (in its user part or as ``?password=``), or ""."""
    from urllib.parse import parse_qs, unquote

    _, userinfo, _, query = _split_url(url)
    _, colon, password = userinfo.rstrip("@").partition(":")
    if colon:
        return unquote(password)
    return parse_qs(query.lstrip("?")).get("password", [""])[-1]


def redact_url(url: str) -> str:
    """``url`` without its password (in the user part or a ``password=`` parameter), for
    messages and logs."""
    scheme, userinfo, rest, query = _split_url(url)
    if userinfo:
        user, colon, _ = userinfo.rstrip("@").partition(":")
        userinfo = f"{user}:***@" if colon else userinfo
    if query:
        query = "?" + "&".join(
            f"{k}=***" if k == "password" else part
            for part in query[1:].split("&") for k in [part.partition("=")[0]])
    return scheme + userinfo + rest + query


_PG_TYPES = (
    (re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b", re.I), "BIGSERIAL PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b", re.I), "BIGINT"),
    (re.compile(r"\bREAL\b", re.I), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b", re.I), "BYTEA"),
)


@dataclass(frozen=True)
class Dialect:
    """What differs between the two databases, as far as Vigil's stores go."""

    name: Literal["sqlite", "postgresql"]

    @property
    def postgres(self) -> bool:
        return self.name == "postgresql"

    def ddl(self, statement: str) -> str:
        """A ``CREATE``/``ALTER`` statement written in SQLite's types, for this database."""
        if not self.postgres:
            return statement
        for pattern, replacement in _PG_TYPES:
            statement = pattern.sub(replacement, statement)
        return statement

    def skip_locked(self, *tables: str) -> str:
        """The clause that locks the selected rows and skips rows another transaction holds
        (``FOR UPDATE [OF t, ...] SKIP LOCKED``); "" on SQLite, where the write transaction
        already excludes other writers."""
        if not self.postgres:
            return ""
        return f" FOR UPDATE{' OF ' + ', '.join(tables) if tables else ''} SKIP LOCKED"


SQLITE = Dialect("sqlite")
POSTGRESQL = Dialect("postgresql")


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchall(self) -> list[Any]: ...

    def fetchone(self) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What ``transaction()`` and ``snapshot()`` yield on either database."""

    # Positional-only, as sqlite3 declares them (psycopg also takes them by name).
    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor: ...

    def executemany(self, sql: str, seq: Sequence[Sequence[Any]], /) -> Any: ...


class SqlDatabase(Protocol):
    """The interface both ``vigil.storage.sqlite.Database`` and
    ``vigil.storage.postgres.PostgresDatabase`` offer (see the module docstring)."""

    what: str
    dialect: Dialect
    readonly: bool

    @property
    def closed(self) -> bool: ...

    @property
    def display(self) -> str:
        """The file path, or the URL without its password, as errors name it."""
        ...

    def query(self, sql: str, params: Sequence[Any] = (), *, doing: str = "read"
              ) -> list[Any]: ...

    def execute(self, sql: str, params: Sequence[Any] = (), *, doing: str = "write") -> int: ...

    def transaction(self, *, doing: str = "write") -> AbstractContextManager[Connection]: ...

    def snapshot(self) -> AbstractContextManager[Connection]: ...

    def after_commit(self, callback: Callable[[], object]) -> None: ...

    def on_rollback(self, undo: Callable[[], object]) -> None: ...

    def close(self) -> None: ...


def open_database(target: str | Path, *, what: str, schema: Sequence[str] = (),
                  component: str | None = None, migrations: Sequence[Sequence[str]] = (),
                  readonly: bool = False, pool_size: int = 4, **sqlite_options: Any
                  ) -> SqlDatabase:
    """Open ``target`` (an SQLite path or a PostgreSQL URL) for a store.

    ``schema`` (SQLite spelling, ``CREATE ... IF NOT EXISTS``) is applied on open unless
    ``readonly``; then ``migrations`` of ``component`` (see ``migrate``). ``pool_size``: the
    PostgreSQL connection pool's maximum (SQLite keeps one connection). ``sqlite_options`` go
    to ``vigil.storage.sqlite.Database`` (``synchronous``, ``check``, ``error``...).
    Errors are ``StoreError`` naming the file or the URL (password removed).
    """
    db: SqlDatabase
    if is_postgres_url(target):
        from vigil.storage.postgres import PostgresDatabase

        db = PostgresDatabase(str(target), what=what, schema=schema, readonly=readonly,
                              max_size=pool_size)
    else:
        import sqlite3

        from vigil.storage.sqlite import Database

        if sqlite3.sqlite_version_info < MIN_SQLITE:
            from vigil.errors import StoreError

            # RETURNING (3.35), upserts (3.24) and row values (3.15) are in the common subset.
            raise StoreError(
                f"{target}: cannot open {what}: Python's sqlite3 is linked against SQLite "
                f"{sqlite3.sqlite_version}, older than {'.'.join(map(str, MIN_SQLITE))}; use a "
                "Python built with a newer SQLite, or [gateway] database = \"postgresql://...\"")
        db = Database(target, what=what, schema=schema, readonly=readonly, **sqlite_options)
    if migrations and not readonly:
        if component is None:
            raise ValueError("migrations need a component name")
        try:
            migrate(db, component, migrations)
        except BaseException:
            db.close()
            raise
    return db


def migrate(db: SqlDatabase, component: str, steps: Sequence[Sequence[str]]) -> int:
    """Apply the schema steps of ``component`` that ``db`` has not applied yet; how many ran.

    Step ``i`` (from 1) is a list of statements in SQLite's spelling (``Dialect.ddl`` adapts
    them), applied in one transaction together with the new version number, so a step is
    applied entirely or not at all. Steps are append-only: a released step is never edited.
    A database whose version is newer than the steps known here (a newer Vigil wrote it) is
    refused rather than written with an old layout.
    """
    from vigil.errors import StoreError

    d = db.dialect
    applied = 0
    with db.transaction(doing=f"migrate the schema of {db.what}") as conn:
        if d.postgres:
            # One instance migrates at a time; the others wait here, then find nothing to do.
            # A bounded wait: an instance stuck mid-migration must not hang the others' start.
            conn.execute("SET LOCAL lock_timeout = '60s'")
            conn.execute("SELECT pg_advisory_xact_lock(?)", (lock_key(SCHEMA_TABLE),))
        conn.execute(d.ddl(f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} ("
                           "component TEXT PRIMARY KEY, version INTEGER NOT NULL)"))
        row = conn.execute(f"SELECT version FROM {SCHEMA_TABLE} WHERE component = ?",
                           (component,)).fetchone()
        version = int(row[0]) if row else 0
        if version > len(steps):
            raise StoreError(f"{db.display}: {db.what} has schema version {version} of "
                             f"{component!r}, newer than this Vigil knows ({len(steps)}): "
                             "upgrade Vigil or use another database")
        for number, statements in enumerate(steps[version:], start=version + 1):
            for statement in statements:
                conn.execute(d.ddl(statement))
            applied += 1
            conn.execute(f"INSERT INTO {SCHEMA_TABLE} (component, version) VALUES (?, ?) "
                         "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                         (component, number))
    return applied


def lock_key(name: str) -> int:
    """A stable signed 64-bit PostgreSQL advisory-lock key for ``name``: the same in every
    process and every release, so instances agree on which lock a name means."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big",
                          signed=True)
