"""The embedded sample store: SQLite in WAL mode, one file, shared by every Vigil process.

One ``Store`` object owns one connection. The collector keeps a single writer ``Store``; every
reader (the dashboard, ``vigil targets``, a thread) opens its own ``Store`` (or
``Store.open_readonly``) on the same path. WAL lets readers work from a snapshot while the writer
appends, so a reader never waits for a scrape to commit and never makes it wait.

Time units: sample timestamps (``ts``, ``*_ms``) are Unix **milliseconds** (int); retention,
resolution and ``now`` are Unix **seconds** (float), like the ``Clock``.

Schema (version 2)::

    meta(key TEXT PRIMARY KEY, value TEXT)                       -- schema_version, watermarks
    series(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, labels TEXT /* canonical JSON */,
           type TEXT /* family type */, counter INTEGER /* counter_like() */, UNIQUE(name, labels))
    samples(series_id INTEGER, ts INTEGER /* Unix ms */, value REAL,
            PRIMARY KEY(series_id, ts)) WITHOUT ROWID
    samples_head(...)                                            -- same columns as samples
    target_health(target TEXT PRIMARY KEY, pool, kind, url, up, last_scrape, duration,
                  samples, error)
    rollup(series_id, blk, n), rollup_day(series_id, day, n),
    rollup_resets(series_id, ts, before),                        -- collector.rollup
    rollup_gauge(series_id, blk, n, nint, total, vmin, vmax), rollup_gauge_day(...)

Version 2 added the rollup (``collector.rollup``): per counter-like series and hour (and
day), the sample count, plus every counter reset, so that ``increase()`` over a long window
is a few lookups (``counter_windows``). A version-1 store is migrated when opened for writing (the
tables are created; the next ``compact()`` fills them, in bounded transactions); opened
read-only it is used as is, without the rollup.

Version 3 added the gauge rollup: per non-counter series and hour (and day), the sample count,
the count and sum of its integer samples, min and max, so that ``avg_over_time(up[30d])``
(availability) is exact from a few lookups (``gauge_windows``). A version-2 store is migrated
when opened for writing and its rollup rebuilt by the next ``compact()``.

Why a head table: ``samples`` is clustered by series, which makes reads and downsampling one
seek per series, but a scrape then dirties one b-tree page *per series* (700 page writes per
scrape once each series has a page of history; that capped writes at ~30k samples/s). So
``write()`` puts samples in the small ``samples_head`` (same key, but only minutes of data: a
scrape dirties a few dozen pages) and ``compact()`` moves them to ``samples`` in bulk, a chunk
of series per transaction, one page write per series per move. Readers read both tables in
one statement (one snapshot). A (series, ts) is in both only when it was re-written after its
move; the head's copy is then the newer one and wins, in reads and in the next move.

Values: a float; SQL NULL is a staleness marker (``STALE``); a NaN sample is the TEXT ``'NaN'``
(SQLite would turn a bound NaN into NULL, indistinguishable from a marker); ±Inf are REALs.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from collector import rollup
from collector.rollup import CounterWindow, GaugeWindow
from vigil.clock import Clock, system_clock
from vigil.conventions import EXPORTED_PREFIX
from vigil.errors import StoreError
from vigil.model import Labels, Point, SeriesKey, TargetHealth

if TYPE_CHECKING:
    import pandas

__all__ = [
    "SCHEMA_VERSION",
    "CompactionReport",
    "Store",
    "counter_like",
]

#: Bumped whenever the schema changes incompatibly; a store with a higher number is refused.
#: 2: the rollup tables (``collector.rollup``); version-1 stores are migrated on open.
SCHEMA_VERSION = 3
#: ``PRAGMA application_id`` of a Vigil store ("Vigl"), so ``file(1)`` and we can tell.
APPLICATION_ID = 0x5669_676C
#: How long a connection waits for another process's write lock before giving up (ms).
BUSY_TIMEOUT_MS = 10_000

#: A NaN sample value as stored (see module docstring).
_NAN_TEXT = "NaN"
_TS_MIN = -(2**63)
_TS_MAX = 2**63 - 1

# meta keys
_K_VERSION = "schema_version"
_K_WATERMARK = "downsample_watermark_ms"  # raw samples below this are downsampled
_K_BACKFILL = "downsample_backfill_ms"  # a write landed below the watermark, from this bucket
_K_SERIES_GEN = "series_generation"  # bumped when series rows are deleted (invalidates caches)

#: ``compact()`` moves head samples older than this (ms) to ``samples``; the newest stay, so
#: that a re-write of a just-scraped sample (a late or repeated scrape) stays in the head.
_HEAD_KEEP_MS = 60_000
#: Once a ``Store`` has written this many samples without a move, it moves the head itself
#: after the commit: a safety valve for when nobody compacts.
_HEAD_MAX_ROWS = 2_000_000

# Compaction works in bounded pieces so that no transaction holds the write lock for long
# (the collector must keep writing) and no step needs memory proportional to the database.
_COMPACT_SERIES_CHUNK = 2_000  # series ids per transaction
_COMPACT_SLICE_MS = 3_600_000  # span of time per transaction (a multiple of any sane resolution)
#: Rollup (re)building: blocks per transaction (with a chunk of series): 6 h of 15 s scrapes
#: for 2,000 series is ~3M samples to scan.
_ROLLUP_SLICE_MS = 6 * rollup.BLOCK_MS

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
)

_INSERT_HEAD = "INSERT OR REPLACE INTO samples_head (series_id, ts, value) VALUES (?, ?, ?)"

# The series of one chunk, as a subquery: ``series_id IN (...)`` lets SQLite seek each series'
# (series_id, ts) range in the primary key instead of scanning every series' whole history.
_CHUNK_IDS = "SELECT id FROM series WHERE id >= :a AND id < :b"

# Moving one chunk of series from the head, in key order so that each series' page of
# ``samples`` is written once; REPLACE because the head's copy of a sample is the newer.
_MOVE_HEAD = """
INSERT OR REPLACE INTO samples (series_id, ts, value)
SELECT series_id, ts, value FROM samples_head
WHERE series_id >= :a AND series_id < :b AND ts < :cut
ORDER BY series_id, ts
"""
_MOVE_HEAD_DELETE = (
    "DELETE FROM samples_head WHERE series_id >= :a AND series_id < :b AND ts < :cut"
)

# Downsampling, for the series of one chunk and the raw span [lo, hi) (bucket-aligned):
# a non-marker row is deleted unless it is the last non-marker row of its bucket, or (for a
# counter-like series) it sits next to a reset: the row before a drop and the row after it.
# Keeping both makes the downsampled data give exactly the raw data's sum of deltas (with a
# drop counting the new value, as Prometheus does): every kept-to-kept stretch is monotonic.
# LAG/LEAD skip staleness markers (not in the window) and markers are never deleted. The row
# before the first one in the span comes from already-downsampled data, which always keeps the
# last value of each bucket, so it is the true predecessor.
_DOWNSAMPLE = f"""
DELETE FROM samples WHERE (series_id, ts) IN (
    SELECT sid, ts FROM (
        SELECT s.series_id AS sid, s.ts AS ts, s.value AS v, ser.counter AS c,
               LAG(s.value) OVER w AS prev, LEAD(s.value) OVER w AS nxt,
               LEAD(s.ts) OVER w AS nts
        FROM samples AS s JOIN series AS ser ON ser.id = s.series_id
        WHERE s.series_id IN ({_CHUNK_IDS}) AND s.ts >= :lo AND s.ts < :hi
          AND s.value IS NOT NULL
        WINDOW w AS (PARTITION BY s.series_id ORDER BY s.ts)
    )
    WHERE nts IS NOT NULL AND nts / :res = ts / :res
      AND NOT (c AND (
            nxt < v
            OR COALESCE(
                prev,
                (SELECT p.value FROM samples AS p
                 WHERE p.series_id = sid AND p.ts < :lo AND p.value IS NOT NULL
                 ORDER BY p.ts DESC LIMIT 1),
                v) > v))
)
"""
_COUNT_SPAN = (
    f"SELECT COUNT(*) FROM samples WHERE series_id IN ({_CHUNK_IDS}) AND ts >= :lo AND ts < :hi"
)
_EXPIRE = f"DELETE FROM samples WHERE series_id IN ({_CHUNK_IDS}) AND ts < :cut"
_DROP_EMPTY_SERIES = """
DELETE FROM series WHERE id >= :a AND id < :b
  AND NOT EXISTS (SELECT 1 FROM samples WHERE series_id = series.id)
  AND NOT EXISTS (SELECT 1 FROM samples_head WHERE series_id = series.id)
"""
# The oldest sample, by one primary-key seek per series (a bare MIN(ts) would scan the table).
_MIN_TS = "SELECT MIN((SELECT MIN(ts) FROM samples WHERE series_id = series.id)) FROM series"

# Both tables in one statement: one snapshot, and the two sorted streams merge in order.
# The last column tells a head copy (1) from the main one (0): where both hold a (series, ts),
# the head's is the newer and wins. (Not in the ORDER BY: sorting on it too costs a temporary
# b-tree and doubles the time per row; the readers resolve the tie themselves.)
_POINTS = """
SELECT series_id, ts, value, 0 FROM samples
WHERE series_id IN (SELECT value FROM json_each(:ids)) AND ts >= :lo AND ts <= :hi
UNION ALL
SELECT series_id, ts, value, 1 FROM samples_head
WHERE series_id IN (SELECT value FROM json_each(:ids)) AND ts >= :lo AND ts <= :hi
ORDER BY 1, 2
"""
# One statement for every series: a primary-key seek per series and table for its latest
# ts <= :at; the caller picks the newer of the two (the head's on a tie).
_LAST_POINTS = """
SELECT j.value, h.ts, h.value, m.ts, m.value
FROM json_each(:ids) AS j
LEFT JOIN samples_head AS h ON h.series_id = j.value AND h.ts = (
    SELECT ts FROM samples_head WHERE series_id = j.value AND ts <= :at AND ts >= :lo
    ORDER BY ts DESC LIMIT 1)
LEFT JOIN samples AS m ON m.series_id = j.value AND m.ts = (
    SELECT ts FROM samples WHERE series_id = j.value AND ts <= :at AND ts >= :lo
    ORDER BY ts DESC LIMIT 1)
WHERE h.ts IS NOT NULL OR m.ts IS NOT NULL
"""


def counter_like(family_type: str, sample_name: str) -> bool:
    """True when a sample only goes up between resets, so downsampling must keep its resets.

    ``family_type`` is the metric family's type as prometheus_client names it (``counter``,
    ``gauge``, ``histogram``, ``gaugehistogram``, ``summary``, ``info``, ``stateset``,
    ``unknown``/``untyped``); ``sample_name`` the full sample name (``x_bucket``, ``x_total``).
    Counters are counter-like, and the ``_bucket``/``_count``/``_sum`` samples of histograms
    and summaries; ``_created`` timestamps, summary quantiles, gauge histograms and everything
    else are not.
    """
    t = family_type.lower()
    if t == "counter":
        return not sample_name.endswith("_created")
    if t in ("histogram", "summary"):
        return sample_name.endswith(("_bucket", "_count", "_sum"))
    return False


class CompactionReport(NamedTuple):
    """What one ``Store.compact`` did (row counts; ``watermark_ms`` Unix ms).

    ``rows_before``: raw rows in the span downsampled this time; ``rows_deleted``: of those,
    removed by downsampling; ``rows_kept_downsampled``: of those, kept; ``rows_expired``: rows
    older than the downsampled retention, removed; ``watermark_ms``: samples older than this
    are downsampled; ``series_deleted``: series rows removed because no sample was left;
    ``rows_moved``: recent samples moved from the write-optimised head to the main table;
    ``rollup_blocks``: (series, hour) rollup rows written (``collector.rollup``).
    """

    rows_before: int
    rows_deleted: int
    rows_kept_downsampled: int
    rows_expired: int
    watermark_ms: int
    series_deleted: int = 0
    rows_moved: int = 0
    rollup_blocks: int = 0


#: Compact, UTF-8-preserving JSON (one encoder object: ``json.dumps`` with options builds one
#: per call).
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
#: The string escaper that encoder uses; called directly it is ~5x faster for label pairs.
_json_str = json.encoder.encode_basestring


def _encode_labels(labels: Labels) -> str:
    """Canonical JSON of sorted ``[name, value]`` pairs (the ``series.labels`` column).

    Byte-identical to ``_JSON.encode(sorted(labels))``, which a test checks.
    """
    return "[" + ",".join(f"[{_json_str(k)},{_json_str(v)}]" for k, v in sorted(labels)) + "]"


def _decode_value(v: Any) -> float | None:
    # REAL comes back as float, a marker as None; the only TEXT we ever store is NaN.
    if v is None or type(v) is float:
        return v
    if isinstance(v, str):
        return math.nan
    return float(v)


def _floor_to(ms: int, step: int) -> int:
    return ms // step * step


def _matches(key: SeriesKey, matchers: Mapping[str, str] | None) -> bool:
    """PromQL equality matchers: a missing label equals ""; ``__name__`` is the metric name."""
    if not matchers:
        return True
    labels = dict(key.labels)
    for k, want in matchers.items():
        have = key.name if k == "__name__" else labels.get(k, "")
        if have != want:
            return False
    return True


class Store:
    """The sample store in one SQLite file (see the module docstring for schema and units).

    ``raw_retention_s``: raw samples younger than this (seconds) are kept as scraped;
    older ones are downsampled to ``resolution_s`` buckets by ``compact()``;
    ``downsampled_retention_s``: samples older than this are deleted.
    A ``Store`` may be shared by threads (calls are serialised by a lock), but a reader
    that must not wait for writes should open its own ``Store``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = system_clock,
        raw_retention_s: float = 48 * 3600,
        downsampled_retention_s: float = 35 * 86400,
        resolution_s: float = 60.0,
        readonly: bool = False,
    ):
        self.path = Path(path)
        self.readonly = readonly
        self._clock = clock
        if resolution_s <= 0 or raw_retention_s < 0:
            raise StoreError(f"{self.path}: resolution and retention must be positive")
        if downsampled_retention_s < raw_retention_s:
            raise StoreError(
                f"{self.path}: downsampled retention ({downsampled_retention_s} s) is shorter "
                f"than raw retention ({raw_retention_s} s)"
            )
        self.raw_retention_s = float(raw_retention_s)
        self.downsampled_retention_s = float(downsampled_retention_s)
        self.resolution_s = float(resolution_s)
        self._res_ms = max(1, round(resolution_s * 1000))

        self._lock = threading.RLock()
        #: SeriesKey -> (series id, family type): the hot path's only lookup.
        self._ids: dict[SeriesKey, tuple[int, str]] = {}
        #: (name, labels JSON) -> SeriesKey; immutable facts, so never invalidated.
        self._keys: dict[tuple[str, str], SeriesKey] = {}
        #: Cache changes made inside the open transaction: (key, previous entry) to undo.
        self._undo: list[tuple[SeriesKey, tuple[int, str] | None]] = []
        self._depth = 0
        self._gen: str | None = None
        self._tx_watermark: int | None = None
        self._tx_rollup_watermark: int | None = None
        #: False for a version-1 store opened read-only: no rollup tables to read.
        self._rollups = True
        #: False for a version-2 store opened read-only: no gauge rollup (schema 3) to read.
        self._gauge_rollups = True
        #: Samples this Store wrote to the head since it last moved it (the safety valve).
        self._head_rows = 0
        self._conn: sqlite3.Connection | None = None
        self._conn = self._connect()

    # --- opening ---------------------------------------------------------------------------
    @classmethod
    def open_readonly(cls, path: str | os.PathLike[str], **kwargs: Any) -> Store:
        """A reader: never writes, never creates the file (StoreError if it does not exist)."""
        return cls(path, readonly=True, **kwargs)

    def _connect(self) -> sqlite3.Connection:
        if self.readonly:
            if not self.path.exists():
                raise StoreError(f"{self.path}: no such store")
            target = self.path.resolve().as_uri() + "?mode=ro"
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"{self.path}: cannot create the directory: {exc}") from None
            target = str(self.path)
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves (BEGIN IMMEDIATE, savepoints).
            conn = sqlite3.connect(
                target, uri=self.readonly, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the store: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._check_or_create(conn)
        except StoreError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"{self.path}: cannot open the store: {exc}") from None
        return conn

    def _check_or_create(self, conn: sqlite3.Connection) -> None:
        try:
            # The first statement that reads the file: a non-SQLite file fails here.
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.path}: not a Vigil store (not an SQLite database: {exc})"
            ) from None
        if not tables:
            if self.readonly:
                raise StoreError(f"{self.path}: not a Vigil store (empty database)")
            # journal_mode is persistent in the file; it cannot change inside a transaction.
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch to WAL mode (got {mode!r})")
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Another process may have created the schema while we waited for the lock.
                if conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0:
                    for ddl in _SCHEMA:
                        conn.execute(ddl)
                    conn.executemany(
                        "INSERT INTO meta (key, value) VALUES (?, ?)",
                        [(_K_VERSION, str(SCHEMA_VERSION)), (_K_SERIES_GEN, "0")],
                    )
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        version = self._check_version(conn)
        if version < 3:
            if self.readonly:  # readable as is; the writer migrates it
                self._rollups = version >= 2
                self._gauge_rollups = False
            else:
                if version < 2:
                    self._migrate_to_2(conn)
                self._migrate_to_3(conn)
        if not self.readonly:
            conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL in WAL: a commit is durable across application crashes; a power loss may
            # lose the last transactions but never corrupts the file. Fsync per scrape would
            # cap the write rate far below what the fleet needs.
            conn.execute("PRAGMA synchronous = NORMAL")
            # Keep the WAL file from growing without bound between checkpoints (bytes).
            conn.execute("PRAGMA journal_size_limit = 67108864")
        conn.execute("PRAGMA cache_size = -65536")  # KiB: hot b-tree pages of recent series

    def _check_version(self, conn: sqlite3.Connection) -> int:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        row = None
        if has_meta and app_id in (0, APPLICATION_ID):
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (_K_VERSION,)).fetchone()
        if row is None:
            raise StoreError(f"{self.path}: not a Vigil store (no schema version)")
        try:
            version = int(row[0])
        except (TypeError, ValueError):
            raise StoreError(
                f"{self.path}: unknown Vigil store schema version {row[0]!r}"
            ) from None
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: store schema version {version} is newer than this Vigil "
                f"supports ({SCHEMA_VERSION}); upgrade Vigil"
            )
        if version < 1:
            raise StoreError(f"{self.path}: unknown Vigil store schema version {version}")
        return version

    def _migrate_to_2(self, conn: sqlite3.Connection) -> None:
        """Schema 1 -> 2: add the rollup tables (``collector.rollup``). Quick: they start
        empty, and until ``compact()`` has built them readers simply read raw samples."""
        self._migrate(conn, 2, rollup.SCHEMA)

    def _migrate_to_3(self, conn: sqlite3.Connection) -> None:
        """Schema 2 -> 3: add the gauge rollup (``collector.rollup.GAUGE_SCHEMA``). Its tables
        start empty, so the whole rollup is marked stale (D = 0): the next ``compact()``
        rebuilds it, and until then readers use it only below that mark (nowhere)."""
        self._migrate(conn, 3, rollup.GAUGE_SCHEMA, lambda: rollup.note_dirty(conn, 0))

    def _migrate(self, conn: sqlite3.Connection, version: int, ddl: Sequence[str],
                 then: Callable[[], object] | None = None) -> None:
        """Run ``ddl`` (and ``then``) and set the schema version to ``version``, in one
        immediate transaction, unless another process got there while we waited."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (_K_VERSION,)).fetchone()
            if int(row[0]) < version:
                for statement in ddl:
                    conn.execute(statement)
                if then is not None:
                    then()
                conn.execute("UPDATE meta SET value = ? WHERE key = ?",
                             (str(version), _K_VERSION))
            conn.execute("COMMIT")
        except BaseException as exc:
            conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise StoreError(
                    f"{self.path}: cannot migrate the store from schema version "
                    f"{version - 1} to {version}: {exc}"
                ) from None
            raise

    def close(self) -> None:
        """Close the connection (idempotent). An open transaction is rolled back."""
        with self._lock:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "readonly" if self.readonly else "readwrite"
        return f"Store({str(self.path)!r}, {mode})"

    # --- plumbing --------------------------------------------------------------------------
    @property
    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self.path}: the store is closed")
        return self._conn

    def _writable(self, what: str) -> None:
        if self.readonly:
            raise StoreError(f"{self.path}: cannot {what}: the store is open read-only")

    def _fail(self, what: str, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"{self.path}: cannot {what}: {exc}")

    def _query(self, what: str, sql: str, params: Any = ()) -> list[Any]:
        with self._lock:
            try:
                return self._c.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise self._fail(what, exc) from None

    def _exec(self, what: str, sql: str, params: Any = ()) -> int:
        """Run a statement inside the current transaction; returns the changed row count."""
        try:
            return self._c.execute(sql, params).rowcount
        except sqlite3.Error as exc:
            raise self._fail(what, exc) from None

    def _meta(self) -> dict[str, str]:
        return dict(self._c.execute("SELECT key, value FROM meta").fetchall())

    # --- transactions ----------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """All-or-nothing: every ``write()``/``set_target_health()`` inside commits together.

        Nested use joins the outer transaction through a savepoint: an exception caught
        inside undoes only the inner block. The outermost level takes the write lock at once
        (BEGIN IMMEDIATE), so it never fails half-way with 'database is locked'.
        """
        self._writable("write")
        with self._lock:
            conn = self._c
            depth = self._depth
            mark = len(self._undo)
            try:
                if depth == 0:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        self._after_begin()
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                else:
                    conn.execute(f"SAVEPOINT vigil_{depth}")
            except sqlite3.Error as exc:
                raise self._fail("begin a transaction", exc) from None
            self._depth = depth + 1
            try:
                yield
            except BaseException:
                self._depth = depth
                self._rollback(depth, mark)
                raise
            self._depth = depth
            try:
                if depth == 0:
                    conn.execute("COMMIT")
                    self._undo.clear()
                else:
                    conn.execute(f"RELEASE vigil_{depth}")
            except sqlite3.Error as exc:
                self._rollback(depth, mark)
                raise self._fail("commit", exc) from None
            if depth == 0 and self._head_rows >= _HEAD_MAX_ROWS:
                # Nobody compacts: move the head now, in its own bounded transactions.
                try:
                    self._move_head(math.floor(self._clock() * 1000) - _HEAD_KEEP_MS)
                except sqlite3.Error as exc:
                    raise self._fail("move recent samples (they are written)", exc) from None

    def _rollback(self, depth: int, mark: int) -> None:
        conn = self._c
        try:
            if depth == 0:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            else:
                conn.execute(f"ROLLBACK TO vigil_{depth}")
                conn.execute(f"RELEASE vigil_{depth}")
        except sqlite3.Error:
            pass  # the original error is the one worth reporting
        # Series ids handed out inside the rolled-back part no longer exist (and may be
        # reused): forget them.
        while len(self._undo) > mark:
            key, prev = self._undo.pop()
            if prev is None:
                self._ids.pop(key, None)
            else:
                self._ids[key] = prev

    def _after_begin(self) -> None:
        """With the write lock held: see what other processes changed since our last write."""
        meta = self._meta()
        gen = meta.get(_K_SERIES_GEN)
        if gen != self._gen:
            # Series rows were deleted (compaction, maybe in another process): cached ids
            # may point at nothing.
            self._ids.clear()
            self._gen = gen
        wm = meta.get(_K_WATERMARK)
        self._tx_watermark = int(wm) if wm is not None else None
        rwm = meta.get(rollup.K_WATERMARK)
        self._tx_rollup_watermark = int(rwm) if rwm is not None else None

    # --- writing ---------------------------------------------------------------------------
    def _resolve(self, new: dict[SeriesKey, str]) -> None:
        """Cache the ids of ``new`` keys (creating rows, updating changed types), in bulk.

        Runs in the open transaction. Two statements for any number of series, because a
        first scrape of a target brings hundreds of new series at once.
        """
        conn = self._c
        recs = [
            (key.name, _encode_labels(key.labels), t, int(counter_like(t, key.name)))
            for key, t in new.items()
        ]
        # A changed type (the exporter changed the family) is followed: downsampling must
        # treat later data by its new type.
        conn.executemany(
            """INSERT INTO series (name, labels, type, counter) VALUES (?, ?, ?, ?)
               ON CONFLICT (name, labels) DO UPDATE
               SET type = excluded.type, counter = excluded.counter
               WHERE type != excluded.type""",
            recs,
        )
        found = conn.execute(
            """SELECT j.key, s.id FROM json_each(:keys) AS j
               JOIN series AS s ON s.name = j.value ->> 0 AND s.labels = j.value ->> 1""",
            {"keys": _JSON.encode([[r[0], r[1]] for r in recs])},
        ).fetchall()
        if len(found) != len(recs):
            raise StoreError(f"{self.path}: series rows vanished while writing")
        keys = list(new)
        for i, sid in found:
            key = keys[i]
            self._undo.append((key, self._ids.get(key)))
            self._ids[key] = (sid, new[key])

    def write(self, points: Iterable[tuple[SeriesKey, str, int, float | None]]) -> int:
        """Store ``(series key, family type, ts Unix ms, value)`` rows; returns how many.

        One transaction (or part of the caller's ``transaction()``): all rows or none. A row
        with the same series and ts as a stored one replaces it, so re-ingesting is harmless.
        ``value`` None is a staleness marker; NaN and ±Inf are kept as such. ``ts`` must be an
        int (Unix ms).
        """
        self._writable("write samples")
        rows: list[Any] = []
        append = rows.append
        ids = self._ids
        new: dict[SeriesKey, str] = {}
        with self.transaction():
            try:
                for key, family_type, ts, value in points:
                    # NaN is the only value unequal to itself (None == None): store it as text.
                    if value != value:
                        value = _NAN_TEXT
                    entry = ids.get(key)
                    if entry is not None and entry[1] == family_type:
                        append((entry[0], ts, value))
                    else:
                        # Unknown series: resolved in bulk below, the key stands in for its id.
                        new[key] = family_type
                        append((key, ts, value))
                if not rows:
                    return 0
                if new:
                    self._resolve(new)
                    rows = [
                        r if type(r[0]) is int else (ids[r[0]][0], r[1], r[2])
                        for r in rows
                    ]
                self._c.executemany(_INSERT_HEAD, rows)
                wm, rwm = self._tx_watermark, self._tx_rollup_watermark
                if wm is not None or rwm is not None:
                    oldest = min(map(itemgetter(1), rows))
                    if wm is not None and oldest < wm:
                        self._note_backfill(oldest)
                    if rwm is not None and oldest < rwm:
                        # The rollup of that hour (and later ones) no longer matches.
                        rollup.note_dirty(self._c, oldest)
            except sqlite3.Error as exc:
                raise self._fail(f"write {len(rows)} samples", exc) from None
            self._head_rows += len(rows)
        return len(rows)

    def _move_head(self, cut_ms: int) -> int:
        """Move head samples with ts < ``cut_ms`` to ``samples``, a chunk of series per
        transaction (so that other writers wait briefly). Returns how many moved."""
        conn = self._c
        self._head_rows = 0
        max_id = conn.execute("SELECT MAX(series_id) FROM samples_head").fetchone()[0]
        moved = 0
        for a in range(0, (max_id or -1) + 1, _COMPACT_SERIES_CHUNK):
            params = {"a": a, "b": a + _COMPACT_SERIES_CHUNK, "cut": cut_ms}
            with self.transaction():
                moved += conn.execute(_MOVE_HEAD, params).rowcount
                conn.execute(_MOVE_HEAD_DELETE, params)
        return moved

    def _note_backfill(self, oldest_ms: int) -> None:
        """Samples landed in the already-downsampled past: have compaction revisit from there."""
        mark = _floor_to(oldest_ms, self._res_ms)
        self._c.execute(
            """INSERT INTO meta (key, value) VALUES (?, ?)
               ON CONFLICT (key) DO UPDATE
               SET value = MIN(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))""",
            (_K_BACKFILL, str(mark)),
        )

    def set_target_health(self, h: TargetHealth) -> None:
        """Record a target's latest scrape (replacing the previous record)."""
        self._writable("record target health")
        with self.transaction():
            self._exec(
                f"record the health of target {h.target!r}",
                "INSERT OR REPLACE INTO target_health VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (h.target, h.pool, h.kind, h.url, int(h.up), float(h.last_scrape),
                 float(h.duration), int(h.samples), h.error),
            )

    # --- reading ---------------------------------------------------------------------------
    def target_health(self) -> list[TargetHealth]:
        """Every target's latest scrape, sorted by target name."""
        rows = self._query(
            "read target health",
            "SELECT target, pool, kind, url, up, last_scrape, duration, samples, error "
            "FROM target_health ORDER BY target",
        )
        return [
            TargetHealth(t, p, k, u, bool(up), float(ls), float(d), int(n), e)
            for t, p, k, u, up, ls, d, n, e in rows
        ]

    def metric_names(self) -> list[str]:
        """Every metric name with a series in the store, sorted."""
        rows = self._query("list metric names", "SELECT DISTINCT name FROM series ORDER BY name")
        return [r[0] for r in rows]

    def _key(self, name: str, labels_json: str) -> SeriesKey:
        k = (name, labels_json)
        key = self._keys.get(k)
        if key is None:
            key = SeriesKey(name, tuple((a, b) for a, b in json.loads(labels_json)))
            self._keys[k] = key
        return key

    def _select_series(
        self, name: str | None, matchers: Mapping[str, str] | None
    ) -> list[tuple[int, SeriesKey, str]]:
        """(id, key, type) of the matching series, sorted by key."""
        if name is None and matchers and "__name__" in matchers:
            name = matchers["__name__"]
        if name is None:
            rows = self._query("list series", "SELECT id, name, labels, type FROM series")
        else:
            rows = self._query(
                f"list the series of {name!r}",
                "SELECT id, name, labels, type FROM series WHERE name = ?",
                (name,),
            )
        out = []
        for sid, n, labels, t in rows:
            key = self._key(n, labels)
            if _matches(key, matchers):
                out.append((sid, key, t))
        out.sort(key=itemgetter(1))
        return out

    def series(
        self, name: str | None = None, matchers: Mapping[str, str] | None = None
    ) -> list[tuple[SeriesKey, str]]:
        """``(key, family type)`` of every series of ``name`` (all names if None) matching the
        equality ``matchers`` (a ``""`` value matches series without that label), sorted."""
        return [(key, t) for _, key, t in self._select_series(name, matchers)]

    def points(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> dict[SeriesKey, list[Point]]:
        """Points of the matching series with ``start_ms <= ts <= end_ms`` (Unix ms, either
        bound optional), sorted by ts. Series without points in the range are left out."""
        selected = self._select_series(name, matchers)
        by_id = {sid: key for sid, key, _ in selected}
        return self._points_of(name, by_id, start_ms, end_ms)

    def _points_of(
        self, name: str, by_id: Mapping[int, SeriesKey], start_ms: int | None,
        end_ms: int | None,
    ) -> dict[SeriesKey, list[Point]]:
        """``points()`` for already selected series (id -> key), in ``by_id`` order."""
        if not by_id:
            return {}
        rows = self._query(
            f"read points of {name!r}",
            _POINTS,
            {
                "ids": json.dumps(list(by_id)),
                "lo": _TS_MIN if start_ms is None else int(start_ms),
                "hi": _TS_MAX if end_ms is None else int(end_ms),
            },
        )
        out: dict[SeriesKey, list[Point]] = {}
        cur_id = None
        cur: list[Point] = []
        last_ts = None
        for sid, ts, v, src in rows:
            if sid != cur_id:
                cur_id = sid
                cur = out[by_id[sid]] = []
            elif ts == last_ts:  # re-written since it moved: the head's copy wins
                if not src:
                    continue
                cur.pop()
            cur.append(Point(ts, _decode_value(v)))
            last_ts = ts
        return out

    def counter_windows(
        self,
        name: str,
        matchers: Mapping[str, str] | None,
        start_ms: int,
        end_ms: int,
    ) -> dict[SeriesKey, CounterWindow] | None:
        """What ``increase()`` needs from each matching series' samples with
        ``start_ms <= ts <= end_ms`` (Unix ms, inclusive): count, first and last sample, and the
        value before each counter reset, in order (``collector.rollup.CounterWindow``; stale
        markers excluded). Series without samples in the range are left out.

        For counter-like series, the part of the range below the rollup limit is summarised in
        SQL (whole hours and days from the rollup, partial hours by counting their samples)
        and only the part above it (what the write head still holds) is read sample by
        sample; other series are read sample by sample. All in one snapshot, so the result
        is exactly what the samples give. ``None`` when the store has no rollup yet (read
        ``points()`` then).
        """
        if not self._rollups:
            return None
        with self._lock, self._snapshot():
            try:
                limit = rollup.fast_limit(self._meta())
                if limit is None:
                    return None
                p = rollup.plan(int(start_ms), int(end_ms), limit)
                selected = self._select_series(name, matchers)
                counters = [sid for sid, key, t in selected if counter_like(t, key.name)]
                region = rollup.region_windows(self._c, counters, p)
                # Above the rollup limit, and every non-counter: raw rows, summarised as read.
                others = [sid for sid, key, t in selected if not counter_like(t, key.name)]
                raw = self._row_windows(counters, p.hi, p.end) if p.hi <= p.end else {}
                raw.update(self._row_windows(others, p.start, p.end))
            except sqlite3.Error as exc:
                raise self._fail(f"read the rollup of {name!r}", exc) from None
        out: dict[SeriesKey, CounterWindow] = {}
        for sid, key, _ in selected:  # in key order, like every other read
            window = rollup.concat(region.get(sid), raw.get(sid))
            if window is not None:
                out[key] = window
        return out

    def gauge_windows(
        self,
        name: str,
        matchers: Mapping[str, str] | None,
        start_ms: int,
        end_ms: int,
    ) -> dict[SeriesKey, GaugeWindow] | None:
        """What an exact ``avg_over_time`` may use of each matching gauge series' samples with
        ``start_ms <= ts <= end_ms`` (Unix ms, inclusive): count, integer count and sum, min
        and max (``collector.rollup.GaugeWindow``), from the gauge rollup below its limit and
        raw samples above it, in one snapshot. Counter-like series and series without samples
        in the range are left out. ``None`` when the store has no gauge rollup yet."""
        if not self._gauge_rollups:
            return None
        with self._lock, self._snapshot():
            try:
                limit = rollup.fast_limit(self._meta())
                if limit is None:
                    return None
                p = rollup.plan(int(start_ms), int(end_ms), limit)
                selected = [
                    (sid, key) for sid, key, t in self._select_series(name, matchers)
                    if not counter_like(t, key.name)
                ]
                ids = [sid for sid, _ in selected]
                region = rollup.gauge_region(self._c, ids, p)
                tail: dict[int, list[tuple[int, object]]] = {}
                if p.hi <= p.end and ids:
                    rows = self._c.execute(
                        _POINTS, {"ids": json.dumps(ids), "lo": p.hi, "hi": p.end}
                    )
                    # Of two rows with the same series and ts, the head's (src 1) wins.
                    last: tuple[int, int] | None = None
                    for sid, ts, v, src in rows:
                        pts = tail.setdefault(sid, [])
                        if last == (sid, ts):
                            if not src:
                                continue
                            pts.pop()
                        pts.append((ts, v))
                        last = (sid, ts)
            except sqlite3.Error as exc:
                raise self._fail(f"read the gauge rollup of {name!r}", exc) from None
        out: dict[SeriesKey, GaugeWindow] = {}
        for sid, key in selected:
            raw = rollup.gauge_of_points(tail.get(sid, ()))
            window = rollup.gauge_concat(region.get(sid), raw)
            if window is not None:
                out[key] = window
        return out

    def _row_windows(self, ids: list[int], lo: int, hi: int) -> dict[int, CounterWindow]:
        """``CounterWindow`` of the samples with ``lo <= ts <= hi`` of ``ids`` (both tables)."""
        if not ids or hi < lo:
            return {}
        cur = self._c.execute(_POINTS, {"ids": json.dumps(ids), "lo": lo, "hi": hi})
        return rollup.windows_of_rows(cur)

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """Run several reads on one snapshot (a read transaction), unless one is open."""
        with self._lock:
            conn = self._c
            if conn.in_transaction:
                yield
                return
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as exc:
                raise self._fail("begin a read transaction", exc) from None
            try:
                yield
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")  # nothing written: just ends the snapshot

    def last_points(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        at_ms: int | None = None,
        *,
        lookback_ms: int | None = None,
    ) -> dict[SeriesKey, Point]:
        """The latest point of each matching series at or before ``at_ms`` (Unix ms; None =
        the latest of all), and if ``lookback_ms`` is given no older than that before
        ``at_ms`` (or before the clock's now). A staleness marker is returned as such (value
        None). One query for all series."""
        selected = self._select_series(name, matchers)
        if not selected:
            return {}
        by_id = {sid: key for sid, key, _ in selected}
        at = _TS_MAX if at_ms is None else int(at_ms)
        lo = _TS_MIN
        if lookback_ms is not None:
            ref = math.floor(self._clock() * 1000) if at_ms is None else at
            lo = ref - int(lookback_ms)
        rows = self._query(
            f"read the last points of {name!r}",
            _LAST_POINTS,
            {"ids": json.dumps(list(by_id)), "at": at, "lo": lo},
        )
        found = {
            sid: Point(hts, _decode_value(hv)) if hts is not None and (mts is None or hts >= mts)
            else Point(mts, _decode_value(mv))
            for sid, hts, hv, mts, mv in rows
        }
        # In key order, like every other read.
        return {key: found[sid] for sid, key, _ in selected if sid in found}

    def frame(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> pandas.DataFrame:
        """``points()`` as a long DataFrame, one row per point.

        Columns: ``ts_ms`` (int64, Unix ms), ``value`` (float64; NaN for a staleness marker
        and for a NaN sample), ``stale`` (bool), ``__name__``, then one string column per
        label name present in any series (missing -> ""), sorted. A label whose name clashes
        with a fixed column is renamed with the ``exported_`` prefix.
        """
        import numpy as np
        import pandas as pd

        data = self.points(name, matchers, start_ms, end_ms)
        label_names = sorted({k for key in data for k, _ in key.labels})
        ts: list[int] = []
        vals: list[float] = []
        stale: list[bool] = []
        counts: list[int] = []
        for pts in data.values():
            counts.append(len(pts))
            for p in pts:
                ts.append(p.ts_ms)
                if p.value is None:
                    vals.append(math.nan)
                    stale.append(True)
                else:
                    vals.append(p.value)
                    stale.append(False)
        columns: dict[str, Any] = {
            "ts_ms": np.array(ts, dtype=np.int64),
            "value": np.array(vals, dtype=np.float64),
            "stale": np.array(stale, dtype=bool),
            "__name__": pd.Series([name] * len(ts), dtype=str),
        }
        reps = np.array(counts, dtype=np.int64)
        keys = list(data)
        for ln in label_names:
            col = ln
            while col in columns:
                col = EXPORTED_PREFIX + col
            per_series = np.array([key.label(ln) for key in keys], dtype=object)
            columns[col] = pd.Series(np.repeat(per_series, reps), dtype=str)
        return pd.DataFrame(columns)

    # --- retention -------------------------------------------------------------------------
    def compact(self, now: float | None = None) -> CompactionReport:
        """Downsample raw samples older than ``now - raw_retention_s`` and expire samples
        older than ``now - downsampled_retention_s`` (``now`` Unix seconds; the clock if None).

        First, samples older than a minute move from the head to the main table (see the
        module docstring); call this every few minutes. Raw samples are downsampled once,
        from the stored watermark up to the raw cutoff (aligned down to a ``resolution_s``
        bucket): per series and bucket the last sample is kept, for counter-like series also
        the samples either side of each reset, and every staleness marker. The work is done
        in SQL in bounded transactions (a slice of time for a chunk of series at a time), so
        concurrent writers only wait briefly.
        """
        self._writable("compact")
        now_s = self._clock() if now is None else float(now)
        res = self._res_ms
        raw_cut = _floor_to(math.floor((now_s - self.raw_retention_s) * 1000), res)
        exp_cut = math.floor((now_s - self.downsampled_retention_s) * 1000)
        with self._lock:
            try:
                return self._compact(math.floor(now_s * 1000), raw_cut, exp_cut)
            except sqlite3.Error as exc:
                raise self._fail("compact", exc) from None

    def _compact(self, now_ms: int, raw_cut: int, exp_cut: int) -> CompactionReport:
        conn = self._c
        res = self._res_ms
        # Downsampling and expiry work on ``samples``: everything below the raw cutoff must be
        # there. (A sample written to the head meanwhile is moved next time; if it is below the
        # watermark, write() noted a backfill, so its bucket is downsampled again then.)
        cut = max(raw_cut, now_ms - _HEAD_KEEP_MS)
        moved = self._move_head(cut)
        meta = self._meta()
        wm = int(meta[_K_WATERMARK]) if _K_WATERMARK in meta else None
        # Blocks below the rollup watermark are maintained here, in the same transaction as
        # the change to their samples (expiry, downsampling); the watermark itself only
        # moves in _roll_up, after both.
        rwm = int(meta[rollup.K_WATERMARK]) if rollup.K_WATERMARK in meta else None
        rolled = 0
        backfill = meta.get(_K_BACKFILL)
        max_id = conn.execute("SELECT MAX(id) FROM series").fetchone()[0] or 0
        chunks = [(a, a + _COMPACT_SERIES_CHUNK)
                  for a in range(0, max_id + 1, _COMPACT_SERIES_CHUNK)]

        # 1. Expiry first: nothing below exp_cut needs downsampling.
        expired = 0
        series_deleted = 0
        for a, b in chunks:
            with self.transaction():
                gone = conn.execute(_EXPIRE, {"a": a, "b": b, "cut": exp_cut}).rowcount
                expired += gone
                if gone and rwm is not None:
                    rolled += rollup.expire(conn, a, b, exp_cut, rwm)
                n = conn.execute(_DROP_EMPTY_SERIES, {"a": a, "b": b}).rowcount
                if n:
                    series_deleted += n
                    conn.execute(
                        "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = ?",
                        (_K_SERIES_GEN,),
                    )
                    self._ids.clear()

        # 2. Downsample [lo, raw_cut).
        if wm is None:
            oldest = conn.execute(_MIN_TS).fetchone()[0]
            lo = raw_cut if oldest is None else _floor_to(oldest, res)
        else:
            lo = wm
        if backfill is not None:
            lo = min(lo, int(backfill))
        lo = max(lo, _floor_to(exp_cut, res))
        rows_before = deleted = 0
        old_wm = wm
        # Slice bounds stay bucket-aligned (lo is) so that no bucket is split between slices.
        step = max(res, _floor_to(_COMPACT_SLICE_MS, res))
        slice_lo = lo
        while slice_lo < raw_cut:
            slice_hi = min(raw_cut, slice_lo + step)
            for a, b in chunks:
                params = {"a": a, "b": b, "lo": slice_lo, "hi": slice_hi, "res": res}
                with self.transaction():
                    rows_before += conn.execute(_COUNT_SPAN, params).fetchone()[0]
                    n = conn.execute(_DOWNSAMPLE, params).rowcount
                    deleted += n
                    if n and rwm is not None:
                        # The hours whose samples changed, as far as they are rolled up.
                        rolled += rollup.rebuild(
                            conn, a, b, max(0, rollup.block_floor(slice_lo)),
                            min(rollup.block_ceil(slice_hi), rwm), rwm,
                        )
            slice_lo = slice_hi
            if wm is None or slice_lo > wm:
                # Progress is durable per slice: an interrupted compaction resumes here.
                # (Re-running a slice would be harmless: the rule keeps what it kept.)
                with self.transaction():
                    self._set_meta(_K_WATERMARK, str(slice_lo))
                wm = slice_lo
        new_wm = raw_cut if wm is None else max(wm, raw_cut)
        with self.transaction():
            self._set_meta(_K_WATERMARK, str(new_wm))
            if backfill is not None and (old_wm is None or raw_cut >= old_wm):
                # Done with the backfill, unless a writer lowered the mark again meanwhile.
                conn.execute(
                    "DELETE FROM meta WHERE key = ? AND value = ?", (_K_BACKFILL, backfill)
                )
        rolled += self._roll_up(cut)
        return CompactionReport(
            rows_before=rows_before,
            rows_deleted=deleted,
            rows_kept_downsampled=rows_before - deleted,
            rows_expired=expired,
            watermark_ms=new_wm,
            series_deleted=series_deleted,
            rows_moved=moved,
            rollup_blocks=rolled,
        )

    def _roll_up(self, cut_ms: int) -> int:
        """Advance the rollup watermark to ``cut_ms`` (the head holds nothing older) and
        (re)build what needs it: from the hour holding the old watermark on, and the hours a
        write marked stale (``collector.rollup``). Returns the block rows written."""
        conn = self._c
        with self.transaction():
            meta = self._meta()
            new_w = max(0, cut_ms)
            marks = [int(meta[k]) for k in (rollup.K_DIRTY, rollup.K_REBUILD) if k in meta]
            oldest = conn.execute(_MIN_TS).fetchone()[0]
            if rollup.K_WATERMARK in meta:
                w = int(meta[rollup.K_WATERMARK])
            else:  # first build (new or migrated store): from the oldest sample on
                w = new_w if oldest is None else min(new_w, max(0, rollup.block_floor(oldest)))
                self._set_meta(rollup.K_WATERMARK, str(w))
            if new_w > w:
                # Normally a no-op (_move_head ran with cut_ms), but a writer may have added to
                # the head since: in this transaction, so that from now on every write below
                # the new watermark marks its hour stale (write() reads it at BEGIN).
                params = {"a": 0, "b": _TS_MAX, "cut": new_w}
                conn.execute(_MOVE_HEAD, params)
                conn.execute(_MOVE_HEAD_DELETE, params)
                marks.append(w)
                w = new_w
                self._set_meta(rollup.K_WATERMARK, str(w))
            if not marks:
                return 0
            # Nothing to build below the oldest sample; rows there could only be stale.
            start = max(0, rollup.block_floor(min(marks)))
            floor = w if oldest is None else max(0, rollup.block_floor(oldest))
            if start < floor:
                start = min(floor, w)
                blk = start // rollup.BLOCK_MS
                conn.execute("DELETE FROM rollup WHERE blk < ?", (blk,))
                conn.execute("DELETE FROM rollup_day WHERE day < ?",
                             (-(-blk // rollup.BLOCKS_PER_DAY),))
                conn.execute("DELETE FROM rollup_resets WHERE ts < ?", (start,))
                conn.execute("DELETE FROM rollup_gauge WHERE blk < ?", (blk,))
                conn.execute("DELETE FROM rollup_gauge_day WHERE day < ?",
                             (-(-blk // rollup.BLOCKS_PER_DAY),))
            self._set_meta(rollup.K_REBUILD, str(start))
            conn.execute("DELETE FROM meta WHERE key = ?", (rollup.K_DIRTY,))
            # Series created after this transaction write below `w` only as a backfill (D).
            max_id = conn.execute("SELECT MAX(id) FROM series").fetchone()[0] or 0
        written = 0
        lo = start
        while lo < w:
            hi = min(w, lo + _ROLLUP_SLICE_MS)
            for a in range(0, max_id + 1, _COMPACT_SERIES_CHUNK):
                with self.transaction():
                    written += rollup.rebuild(conn, a, a + _COMPACT_SERIES_CHUNK, lo, hi, w)
            with self.transaction():  # progress is durable: an interruption resumes here
                self._set_meta(rollup.K_REBUILD, str(hi))
            lo = hi
        with self.transaction():
            conn.execute("DELETE FROM meta WHERE key = ?", (rollup.K_REBUILD,))
        return written

    def _set_meta(self, key: str, value: str) -> None:
        self._c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
