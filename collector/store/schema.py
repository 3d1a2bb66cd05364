"""The store's tables, its schema versions, and opening its file (creating or migrating it).

Schema (version 3)::

    meta(key TEXT PRIMARY KEY, value TEXT)                       -- schema_version, watermarks
    series(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, labels TEXT /* canonical JSON */,
           type TEXT /* family type */, counter INTEGER /* counter_like() */, UNIQUE(name, labels))
    samples(series_id INTEGER, ts INTEGER /* Unix ms */, value REAL,
            PRIMARY KEY(series_id, ts)) WITHOUT ROWID
    samples_head(...)                                            -- same columns as samples
    target_health(target TEXT PRIMARY KEY, pool, kind, url, up, last_scrape, duration,
                  samples, error)
    rollup(series_id, blk, n), rollup_day(series_id, day, n),
    rollup_resets(series_id, ts, before),                        -- collector.store.rollup
    rollup_gauge(series_id, blk, n, nint, total, vmin, vmax), rollup_gauge_day(...)

Version 2 added the rollup (``collector.store.rollup``): per counter-like series and hour (and
day), the sample count, plus every counter reset, so that ``increase()`` over a long window is a
few lookups (``Store.counter_windows``). A version-1 store is migrated when opened for writing
(the tables are created; the next ``compact()`` fills them, in bounded transactions); opened
read-only it is used as is, without the rollup.

Version 3 added the gauge rollup: per non-counter series and hour (and day), the sample count,
the count and sum of its integer samples, min and max, so that ``avg_over_time(up[30d])``
(availability) is exact from a few lookups (``Store.gauge_windows``). A version-2 store is
migrated when opened for writing and its rollup rebuilt by the next ``compact()``.

Version 4 added ``chunks`` (``collector.store.sealed``): the samples of each series and span
of time (``meta.chunk_span_ms``) past the rollup limit, compressed in one blob. A version-3
store is migrated when opened for writing: the table is created at once, and compaction then
seals the rows, a few hundred series per transaction (so the collector keeps writing and an
interrupted conversion resumes where it stopped), and gives the freed pages back to the file
system once (``K_VACUUM``). Opened read-only, a version-3 store is read as it is, from rows.

A file that is not a Vigil store (not SQLite, another program's database, a newer schema) is
refused before anything changes it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from collector.store import rollup, sealed
from vigil.errors import StoreError
from vigil.storage.sqlite import Database

__all__ = [
    "APPLICATION_ID",
    "K_BACKFILL",
    "K_SERIES_GEN",
    "K_VACUUM",
    "K_VERSION",
    "K_WATERMARK",
    "SCHEMA_VERSION",
    "check_version",
    "open_database",
    "read_meta",
    "set_meta",
]

#: Bumped whenever the schema changes incompatibly; a store with a higher number is refused.
#: 2: the rollup tables; 3: the gauge rollup; 4: chunks. Older stores are migrated on open.
SCHEMA_VERSION = 4
#: ``PRAGMA application_id`` of a Vigil store ("Vigl"), so ``file(1)`` and we can tell.
APPLICATION_ID = 0x5669_676C

# meta keys
K_VERSION = "schema_version"
K_WATERMARK = "downsample_watermark_ms"  # raw samples below this are downsampled
K_BACKFILL = "downsample_backfill_ms"  # a write landed below the watermark, from this bucket
K_SERIES_GEN = "series_generation"  # bumped when series rows are deleted (invalidates caches)
K_VACUUM = "vacuum_pending"  # a migrated store: VACUUM once its rows are sealed

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    # UNIQUE(name, labels) builds an index led by name, which also serves lookups by name.
    """CREATE TABLE series (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        labels TEXT NOT NULL,
        type TEXT NOT NULL,
        counter INTEGER NOT NULL,
        UNIQUE (name, labels)
    )""",
    """CREATE TABLE samples (
        series_id INTEGER NOT NULL,
        ts INTEGER NOT NULL,
        value REAL,
        PRIMARY KEY (series_id, ts)
    ) WITHOUT ROWID""",
    """CREATE TABLE samples_head (
        series_id INTEGER NOT NULL,
        ts INTEGER NOT NULL,
        value REAL,
        PRIMARY KEY (series_id, ts)
    ) WITHOUT ROWID""",
    """CREATE TABLE target_health (
        target TEXT PRIMARY KEY,
        pool TEXT NOT NULL,
        kind TEXT NOT NULL,
        url TEXT NOT NULL,
        up INTEGER NOT NULL,
        last_scrape REAL NOT NULL,
        duration REAL NOT NULL,
        samples INTEGER NOT NULL,
        error TEXT NOT NULL
    )""",
    *rollup.SCHEMA,
    *rollup.GAUGE_SCHEMA,
    *sealed.SCHEMA,
)

# Hot b-tree pages of recent series stay cached (KiB), for the writer and every reader.
_CACHE = "cache_size = -65536"
# The writer keeps the WAL file from growing without bound between checkpoints (bytes).
_WAL_LIMIT = "journal_size_limit = 67108864"


def open_database(path: Path, *, readonly: bool,
                  span_ms: int = sealed.DEFAULT_SPAN_MS) -> tuple[Database, int]:
    """The store's file, opened; and the schema version it has.

    For writing, a new (empty) file gets the current schema and an older store is migrated
    (so the version returned is ``SCHEMA_VERSION``); read-only, an existing store is used as
    it is (StoreError if the file does not exist). WAL with ``synchronous = NORMAL``: a
    commit survives an application crash; a power loss may lose the last transactions but
    never corrupts the file (an fsync per scrape would cap the write rate far below what the
    fleet needs). ``span_ms``: the chunk span of a store created or migrated now.
    """
    if readonly and not path.exists():
        raise StoreError(f"{path}: no such store")
    db = Database(
        path, what="the store", readonly=readonly, synchronous="NORMAL",
        pragmas=(_CACHE,) if readonly else (_WAL_LIMIT, _CACHE),
        check=lambda conn: _refuse_foreign(conn, path, readonly),
    )
    try:
        with db.lock, db.errors_as("open the store"):
            if not readonly and _is_empty(db.conn):
                # Pages freed by sealing rows go back to the file system (``compaction``).
                # Only settable before the first table exists, and then only by a VACUUM
                # once the file is in WAL mode (instant on an empty file).
                db.conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                db.conn.execute("VACUUM")
                _create(db, span_ms)
            version = check_version(db.conn, path)
            if not readonly and version < SCHEMA_VERSION:
                if version < 2:
                    _migrate_to_2(db)
                if version < 3:
                    _migrate_to_3(db)
                _migrate_to_4(db, span_ms)
                version = SCHEMA_VERSION
    except BaseException:
        db.close()
        raise
    return db, version


def _is_empty(conn: sqlite3.Connection) -> bool:
    count: int = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
    return count == 0


def _refuse_foreign(conn: sqlite3.Connection, path: Path, readonly: bool) -> None:
    """Before anything is changed: refuse a file that is not (or not yet) a Vigil store."""
    try:
        # The first statement that reads the file: a non-SQLite file fails here.
        tables = conn.execute("SELECT name FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: not a Vigil store (not an SQLite database: {exc})") from None
    if not tables:
        if readonly:
            raise StoreError(f"{path}: not a Vigil store (empty database)")
        return  # a new store: created once the file is in WAL mode
    try:
        check_version(conn, path)
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot open the store: {exc}") from None


def _create(db: Database, span_ms: int) -> None:
    with db.transaction() as conn, db.errors_as("open the store"):
        # Another process may have created the schema while we waited for the lock.
        if _is_empty(conn):
            for ddl in _SCHEMA:
                conn.execute(ddl)
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [(K_VERSION, str(SCHEMA_VERSION)), (K_SERIES_GEN, "0"),
                 (sealed.K_SPAN, str(span_ms))],
            )
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")


def check_version(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version of the Vigil store on ``conn`` (StoreError if it is none, or newer
    than this Vigil supports)."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    has_meta = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
    ).fetchone()
    row = None
    if has_meta and app_id in (0, APPLICATION_ID):
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (K_VERSION,)).fetchone()
    if row is None:
        raise StoreError(f"{path}: not a Vigil store (no schema version)")
    try:
        version = int(row[0])
    except (TypeError, ValueError):
        raise StoreError(f"{path}: unknown Vigil store schema version {row[0]!r}") from None
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: store schema version {version} is newer than this Vigil "
            f"supports ({SCHEMA_VERSION}); upgrade Vigil"
        )
    if version < 1:
        raise StoreError(f"{path}: unknown Vigil store schema version {version}")
    return version


def _migrate_to_2(db: Database) -> None:
    """Schema 1 -> 2: add the rollup tables (``collector.store.rollup``). Quick: they start
    empty, and until ``compact()`` has built them readers simply read raw samples."""
    _migrate(db, 2, rollup.SCHEMA)


def _migrate_to_3(db: Database) -> None:
    """Schema 2 -> 3: add the gauge rollup (``rollup.GAUGE_SCHEMA``). Its tables start empty,
    so the whole rollup is marked stale (D = 0): the next ``compact()`` rebuilds it, and until
    then readers use it only below that mark (nowhere)."""
    _migrate(db, 3, rollup.GAUGE_SCHEMA, lambda conn: rollup.note_dirty(conn, 0))


def _migrate_to_4(db: Database, span_ms: int) -> None:
    """Schema 3 -> 4: add ``chunks`` (``sealed.SCHEMA``) and fix the store's chunk span. The
    rows stay where they are; compaction seals them (bounded, resumable) and then vacuums the
    file once (``K_VACUUM``)."""
    _migrate(db, 4, sealed.SCHEMA, lambda conn: conn.executemany(
        "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
        [(sealed.K_SPAN, str(span_ms)), (K_VACUUM, "1")],
    ))


def _migrate(db: Database, version: int, ddl: Sequence[str],
             then: Callable[[sqlite3.Connection], object] | None = None) -> None:
    """Run ``ddl`` (and ``then``) and set the schema version to ``version``, in one
    immediate transaction, unless another process got there while we waited."""
    doing = f"migrate the store from schema version {version - 1} to {version}"
    with db.transaction() as conn, db.errors_as(doing):
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (K_VERSION,)).fetchone()
        if int(row[0]) < version:
            for statement in ddl:
                conn.execute(statement)
            if then is not None:
                then(conn)
            conn.execute("UPDATE meta SET value = ? WHERE key = ?", (str(version), K_VERSION))


def read_meta(conn: sqlite3.Connection) -> dict[str, str]:
    """Every ``meta`` row (watermarks in Unix ms, as text)."""
    return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    """Set one ``meta`` row (inside the caller's transaction)."""
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
