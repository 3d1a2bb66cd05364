"""The rollup's tables: what ``increase()`` and ``avg_over_time()`` need of a long window, kept
as lookups, and the marks that say how far they hold.

Prometheus's ``extrapolatedRate`` (promql/functions.go; ``rate``/``increase``) reads exactly
four things from the samples a range selects (staleness markers excluded):

1. the first sample ``(ts, value)``,
2. the last sample ``(ts, value)``,
3. how many samples there are,
4. the value just before each drop (a counter reset), added to ``last - first`` in sample order.

Reading every sample of a 30-day window to get these is what makes long windows slow. For
counter-like series (``series.counter = 1``) the store keeps, besides the samples:

* ``rollup(series_id, blk, n)``: the number of non-stale samples in each whole block of
  ``BLOCK_MS`` (one hour, aligned to the Unix epoch); an empty block has no row;
* ``rollup_day(series_id, day, n)``: the same per UTC day (``BLOCKS_PER_DAY`` blocks), the sum
  of its hours' rows, so that a 30-day window sums 30 rows rather than 720;
* ``rollup_resets(series_id, ts, before)``: every drop between two adjacent non-stale samples,
  keyed by the timestamp of the sample *after* the drop, with the value *before* it. Drops are
  rare (restarts), so this table is tiny. A drop whose earlier sample lies in an earlier block
  is stored too (with that block's last value as ``before``).

Gauges (series that are not counter-like) get the same per-hour and per-day rows in
``rollup_gauge`` / ``rollup_gauge_day`` for ``avg_over_time``: ``n`` (non-stale samples),
``nint`` (of which integer-valued REALs with ``|v| <= 2**31``), ``total`` (their sum) and the
``vmin``/``vmax`` of the REAL samples. A mean over those rows is exact only when PromQL's own
mean is provably the same float: every sample an integer (then every partial sum is an exact
integer below 2**53, Neumaier's compensation stays 0 and Prometheus 3's ``sum / count`` is
``total / n``), or, for Prometheus 2's running mean, every sample equal (the mean is that
value). ``up`` (availability) is always the first case. Otherwise readers fall back to the raw
samples (``GaugeWindow.mean`` returns ``None``).

The rest of the rollup, one job per module:

* ``collector.store.rollup_maintenance``: keeping the rows up to date, in SQL over
  ``samples`` (``rebuild``, ``expire``);
* ``collector.store.rollup_reads``: reading a window from the rows, the samples of its partial
  hours and the chunks at its edges (``plan``, ``region_windows``, ``gauge_region``);
* ``collector.store.windows``: what a window of samples comes to (``CounterWindow``,
  ``GaugeWindow``), from the rows, from raw points or from arrays, and how two adjacent ones
  join.

Exactness. The result is the same float64 as computing from all samples: the count and the
first/last samples are facts, and the resets are returned individually, in sample order, so
the caller adds them one at a time exactly as ``slo.promql.rate._raw_change`` does (no reliance on
the sum being exact). Drops are detected with IEEE comparisons: values are compared only when
both are REALs (a NaN sample is stored as the TEXT ``'NaN'`` and never starts or ends a drop,
as ``NaN < x`` is false in Go); ±Inf are REALs and compare as in Go.

Coverage (``meta``), all Unix ms:

* ``rollup_watermark_ms`` (W): the head's last move cut, so not block-aligned. Below W every
  drop is in ``rollup_resets``, every whole block has its row, and the write head holds no
  sample. The block holding W has a row for its samples below W; readers never use it as a
  whole block, and compaction rebuilds it when W moves on;
* ``rollup_dirty_ms`` (D, block-aligned): a ``write()`` landed below W (a backfill, ``vigil
  ingest`` of old data), or a series became counter-like (a trigger sets D to 0): the blocks
  from D up are stale;
* ``rollup_rebuild_ms`` (R, block-aligned): compaction is rebuilding the blocks from R to W
  (R advances as it goes, so an interrupted compaction resumes).

Readers use the rollup below ``min(W, D, R)`` only (``fast_limit``) and read everything above
it raw, all in one snapshot. Compaction (``Store.compact``) moves W to its cut (rebuilding from
the hour that held the old W), turns D into R and rebuilds from there, and — in the same
transaction as the change — rebuilds the blocks that downsampling or expiry changed.

Units: timestamps and block bounds are Unix **milliseconds** (int).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

__all__ = [
    "BLOCKS_PER_DAY",
    "BLOCK_MS",
    "GAUGE_AGGREGATES",
    "GAUGE_SCHEMA",
    "K_DIRTY",
    "K_REBUILD",
    "K_WATERMARK",
    "SCHEMA",
    "block_ceil",
    "block_floor",
    "fast_limit",
    "note_dirty",
]

#: Rollup block length (ms): one hour. Windows of the SLO engine are whole hours or days, and
#: an hour of 15 s scrapes (240 samples) is cheap to count at each edge of a window.
BLOCK_MS = 3_600_000
#: Blocks per ``rollup_day`` row (UTC days).
BLOCKS_PER_DAY = 24

# meta keys (see the module docstring)
K_WATERMARK = "rollup_watermark_ms"
K_DIRTY = "rollup_dirty_ms"
K_REBUILD = "rollup_rebuild_ms"

#: DDL of the rollup: created with a new store and by the schema-1 -> 2 migration.
SCHEMA = (
    """CREATE TABLE rollup (
        series_id INTEGER NOT NULL,
        blk INTEGER NOT NULL,          -- block index: ts // BLOCK_MS
        n INTEGER NOT NULL,            -- non-stale samples in the block
        PRIMARY KEY (series_id, blk)
    ) WITHOUT ROWID""",
    """CREATE TABLE rollup_day (
        series_id INTEGER NOT NULL,
        day INTEGER NOT NULL,          -- blk // BLOCKS_PER_DAY
        n INTEGER NOT NULL,            -- the sum of its blocks' n
        PRIMARY KEY (series_id, day)
    ) WITHOUT ROWID""",
    """CREATE TABLE rollup_resets (
        series_id INTEGER NOT NULL,
        ts INTEGER NOT NULL,           -- Unix ms of the sample after the drop
        before REAL NOT NULL,          -- the value of the sample before it
        PRIMARY KEY (series_id, ts)
    ) WITHOUT ROWID""",
    # A series that becomes counter-like has no rollup for its past: rebuild from the start.
    # (Rare: an exporter changed a family's type.) Becoming a gauge needs nothing: readers
    # only use the rollup of series that are counter-like now.
    f"""CREATE TRIGGER rollup_counter_on AFTER UPDATE OF counter ON series
        WHEN NEW.counter AND NOT OLD.counter
        BEGIN
            INSERT INTO meta (key, value) VALUES ('{K_DIRTY}', '0')
            ON CONFLICT (key) DO UPDATE SET value = '0';
        END""",
)

#: DDL of the gauge rollup (schema 3): created with a new store and by the 2 -> 3 migration.
GAUGE_SCHEMA = (
    """CREATE TABLE rollup_gauge (
        series_id INTEGER NOT NULL,
        blk INTEGER NOT NULL,          -- block index: ts // BLOCK_MS
        n INTEGER NOT NULL,            -- non-stale samples in the block
        nint INTEGER NOT NULL,         -- of which integer-valued REALs, |v| <= 2**31
        total REAL NOT NULL,           -- the sum of those (exact: integers below 2**53)
        vmin REAL,                     -- min and max of the REAL samples (NULL: none)
        vmax REAL,
        PRIMARY KEY (series_id, blk)
    ) WITHOUT ROWID""",
    """CREATE TABLE rollup_gauge_day (
        series_id INTEGER NOT NULL,
        day INTEGER NOT NULL,          -- blk // BLOCKS_PER_DAY
        n INTEGER NOT NULL,
        nint INTEGER NOT NULL,
        total REAL NOT NULL,
        vmin REAL,
        vmax REAL,
        PRIMARY KEY (series_id, day)
    ) WITHOUT ROWID""",
    # A counter that becomes a gauge has no gauge rows for its past: rebuild from the start.
    f"""CREATE TRIGGER rollup_counter_off AFTER UPDATE OF counter ON series
        WHEN OLD.counter AND NOT NEW.counter
        BEGIN
            INSERT INTO meta (key, value) VALUES ('{K_DIRTY}', '0')
            ON CONFLICT (key) DO UPDATE SET value = '0';
        END""",
)

_INT_SAMPLE = (
    "typeof(value) = 'real' AND value = CAST(value AS INTEGER) AND abs(value) <= 2147483648"
)
#: A ``rollup_gauge`` row's ``n, nint, total, vmin, vmax`` as aggregates over ``samples`` rows
#: (non-stale ones: the caller's WHERE keeps ``value IS NOT NULL``).
GAUGE_AGGREGATES = f"""COUNT(*), COALESCE(SUM({_INT_SAMPLE}), 0),
    TOTAL(CASE WHEN {_INT_SAMPLE} THEN value END),
    MIN(CASE WHEN typeof(value) = 'real' THEN value END),
    MAX(CASE WHEN typeof(value) = 'real' THEN value END)"""


def block_floor(ms: int) -> int:
    """The start (ms) of the block holding ``ms``."""
    return ms // BLOCK_MS * BLOCK_MS


def block_ceil(ms: int) -> int:
    """The start (ms) of the first block that starts at or after ``ms``."""
    return -(-ms // BLOCK_MS) * BLOCK_MS


def note_dirty(conn: sqlite3.Connection, oldest_ms: int) -> None:
    """A write landed below the rollup watermark at ``oldest_ms``: mark its block stale (D)."""
    conn.execute(
        """INSERT INTO meta (key, value) VALUES (?, ?)
           ON CONFLICT (key) DO UPDATE
           SET value = MIN(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))""",
        (K_DIRTY, str(max(0, block_floor(oldest_ms)))),
    )


def fast_limit(meta: Mapping[str, str]) -> int | None:
    """Blocks below this (ms) may be read from the rollup; ``None`` before the first build."""
    if K_WATERMARK not in meta:
        return None
    marks = [int(meta[k]) for k in (K_WATERMARK, K_DIRTY, K_REBUILD) if k in meta]
    return min(marks)
