"""Counter rollups: what ``increase()`` needs from a long window, kept as lookups.

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

Then, for a window ``[start, end]`` (ms, inclusive): items 1 and 2 are primary-key seeks in
``samples`` and, below the sealed mark, the chunks holding the window's edges (or the
summaries of the chunks after and before them); item 3 is ``SUM(n)`` over the whole days and
hours inside the window plus a count of the samples in the partial hours at its two edges
(rows counted in SQL, the edge chunks decoded); item 4 is a range scan of ``rollup_resets``
over the window (the partial hours at the edges are rolled up too: only their count needs a
scan). Only the not-yet-rolled-up recent part (what is still in the write head) is read
sample by sample.

Maintenance is SQL over ``samples``: a range is rebuilt only once its chunks were turned
back into rows (``collector.store.sealed``); the sample just before the range and just after
it may still be in a chunk, whose summary columns give it (``LATEST_BEFORE``,
``_FIRST_AFTER``).

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
transaction as the change — rebuilds the blocks that downsampling or expiry changed. A
block's rows depend only on its own samples and on the last sample before it (for the drop
into its first sample), so a rebuild of ``[lo, hi)`` also re-checks the drop into the first
sample at or after ``hi`` (``rebuild``).

Units: timestamps and block bounds are Unix **milliseconds** (int).
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from collector.store.chunks import decode_chunk
from vigil.errors import StoreError

#: One series' samples: ts (int64 Unix ms), values (float64, NaN at a marker), staleness mask
#: (``collector.store.sealed.Arrays``).
Arrays = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]

__all__ = [
    "BLOCKS_PER_DAY",
    "BLOCK_MS",
    "GAUGE_SCHEMA",
    "K_DIRTY",
    "K_REBUILD",
    "K_WATERMARK",
    "LATEST_BEFORE",
    "SCHEMA",
    "CounterWindow",
    "GaugeWindow",
    "Loader",
    "Plan",
    "Sealed",
    "block_ceil",
    "block_floor",
    "concat",
    "fast_limit",
    "gauge_concat",
    "gauge_of_arrays",
    "gauge_of_points",
    "gauge_region",
    "note_dirty",
    "plan",
    "rebuild",
    "region_windows",
    "summarize",
    "window_of_arrays",
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


# --- maintenance -------------------------------------------------------------------------------
# All statements work on the series ids [a, b) (a compaction chunk) and the span [lo, hi)
# (lo block-aligned; hi may cut a block). Only counter-like series get rows, but the rows of
# every series in the chunk are deleted first, so a series that stopped being counter-like
# loses its stale rows.

_DELETE_BLOCKS = """
DELETE FROM rollup WHERE series_id >= :a AND series_id < :b AND blk >= :blo AND blk < :bhi
"""
_DELETE_DAYS = """
DELETE FROM rollup_day WHERE series_id >= :a AND series_id < :b AND day >= :dlo AND day < :dhi
"""
_INSERT_DAYS = f"""
INSERT INTO rollup_day (series_id, day, n)
SELECT series_id, blk / {BLOCKS_PER_DAY}, SUM(n) FROM rollup
WHERE series_id >= :a AND series_id < :b
  AND blk >= :dlo * {BLOCKS_PER_DAY} AND blk < :dhi * {BLOCKS_PER_DAY}
GROUP BY 1, 2
"""
_DELETE_RESETS = """
DELETE FROM rollup_resets WHERE series_id >= :a AND series_id < :b AND ts >= :lo AND ts < :hi
"""
_COUNTER_IDS = "SELECT id FROM series WHERE id >= :a AND id < :b AND counter"
_INSERT_BLOCKS = f"""
INSERT INTO rollup (series_id, blk, n)
SELECT series_id, ts / {BLOCK_MS}, COUNT(*) FROM samples
WHERE series_id IN ({_COUNTER_IDS}) AND ts >= :lo AND ts < :hi AND value IS NOT NULL
GROUP BY 1, 2
"""
# The drops with their later sample in [lo, hi): LAG over the span's non-stale samples plus,
# per series, the last non-stale sample before lo (the true predecessor of the first one),
# from the rows or from the summary of the last chunk before lo, whichever is later (the
# range itself is all rows: ``collector.store.sealed``). CROSS JOIN keeps ``series`` the outer
# loop (a seek per series): left to itself the planner scans every sample of the chunk.
# `typeof(...) = 'real'` keeps NaN (stored as TEXT) out of every comparison, as IEEE does.
_INSERT_RESETS = f"""
INSERT INTO rollup_resets (series_id, ts, before)
SELECT sid, ts, prev FROM (
    SELECT sid, ts, v, LAG(v) OVER (PARTITION BY sid ORDER BY ts) AS prev FROM (
        SELECT series_id AS sid, ts, value AS v FROM samples
        WHERE series_id IN ({_COUNTER_IDS}) AND ts >= :lo AND ts < :hi AND value IS NOT NULL
        UNION ALL
        SELECT c.id, p.ts, p.value FROM series AS c
        CROSS JOIN samples AS p ON p.series_id = c.id AND p.ts = (
            SELECT ts FROM samples
            WHERE series_id = c.id AND ts < :lo AND value IS NOT NULL
            ORDER BY ts DESC LIMIT 1)
        WHERE c.id >= :a AND c.id < :b AND c.counter
        UNION ALL
        SELECT c.id, k.last_ts, k.last_v FROM series AS c
        CROSS JOIN chunks AS k ON k.rowid = (
            SELECT rowid FROM chunks
            WHERE series_id = c.id AND start_ts < :lo AND last_ts IS NOT NULL AND last_ts < :lo
            ORDER BY start_ts DESC LIMIT 1)
        WHERE c.id >= :a AND c.id < :b AND c.counter
    )
)
WHERE ts >= :lo AND typeof(v) = 'real' AND typeof(prev) = 'real' AND v < prev
"""
#: The value of the last non-stale sample of series ``{sid}`` before ``{bound}``: from the rows
#: or from the summary of the last chunk that ends below it, whichever is later.
LATEST_BEFORE = """(SELECT v2 FROM (
    SELECT * FROM (SELECT p.ts AS t2, p.value AS v2 FROM samples AS p
                   WHERE p.series_id = {sid} AND p.ts < {bound} AND p.value IS NOT NULL
                   ORDER BY p.ts DESC LIMIT 1)
    UNION ALL
    SELECT * FROM (SELECT k.last_ts, k.last_v FROM chunks AS k
                   WHERE k.series_id = {sid} AND k.start_ts < {bound}
                     AND k.last_ts IS NOT NULL AND k.last_ts < {bound}
                   ORDER BY k.start_ts DESC LIMIT 1))
    ORDER BY t2 DESC LIMIT 1)"""
# The first non-stale sample at or after hi keeps its drop row only if it is still a drop from
# the (possibly changed) last sample before hi. Only within the rolled-up part (< :w); above
# it, the block is built later with the right predecessor.
# From the rows, or from the summary of the first chunk that starts at or after hi (no chunk
# straddles hi: the rebuilt range is unsealed), whichever is earlier.
_FIRST_AFTER = """(SELECT {col} FROM (
    SELECT * FROM (SELECT s.ts AS t2, s.value AS v2 FROM samples AS s
                   WHERE s.series_id = {sid} AND s.ts >= :hi AND s.value IS NOT NULL
                   ORDER BY s.ts LIMIT 1)
    UNION ALL
    SELECT * FROM (SELECT k.first_ts, k.first_v FROM chunks AS k
                   WHERE k.series_id = {sid} AND k.start_ts > :hi - (
                       SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'chunk_span_ms')
                     AND k.first_ts IS NOT NULL AND k.first_ts >= :hi
                   ORDER BY k.start_ts LIMIT 1))
    ORDER BY t2 LIMIT 1)"""
_FIX_DELETE = f"""
DELETE FROM rollup_resets WHERE (series_id, ts) IN (
    SELECT c.id, {_FIRST_AFTER.format(sid="c.id", col="t2")} FROM series AS c
    WHERE c.id >= :a AND c.id < :b)
  AND ts >= :hi AND ts < :w
"""
_FIX_INSERT = f"""
INSERT OR REPLACE INTO rollup_resets (series_id, ts, before)
SELECT sid, nts, pv FROM (
    SELECT c.id AS sid, {_FIRST_AFTER.format(sid="c.id", col="t2")} AS nts,
           {_FIRST_AFTER.format(sid="c.id", col="v2")} AS nv,
           {LATEST_BEFORE.format(sid="c.id", bound=":hi")} AS pv
    FROM series AS c
    WHERE c.id >= :a AND c.id < :b AND c.counter)
WHERE nts < :w AND typeof(nv) = 'real' AND typeof(pv) = 'real' AND nv < pv
"""


# Gauge rows: the same blocks, for the series that are not counter-like.
_INT_SAMPLE = (
    "typeof(value) = 'real' AND value = CAST(value AS INTEGER) AND abs(value) <= 2147483648"
)
_GAUGE_AGG = f"""COUNT(*), COALESCE(SUM({_INT_SAMPLE}), 0),
    TOTAL(CASE WHEN {_INT_SAMPLE} THEN value END),
    MIN(CASE WHEN typeof(value) = 'real' THEN value END),
    MAX(CASE WHEN typeof(value) = 'real' THEN value END)"""
_DELETE_GAUGE_BLOCKS = """
DELETE FROM rollup_gauge WHERE series_id >= :a AND series_id < :b AND blk >= :blo AND blk < :bhi
"""
_DELETE_GAUGE_DAYS = """
DELETE FROM rollup_gauge_day
WHERE series_id >= :a AND series_id < :b AND day >= :dlo AND day < :dhi
"""
_INSERT_GAUGE_BLOCKS = f"""
INSERT INTO rollup_gauge (series_id, blk, n, nint, total, vmin, vmax)
SELECT series_id, ts / {BLOCK_MS}, {_GAUGE_AGG} FROM samples
WHERE series_id IN (SELECT id FROM series WHERE id >= :a AND id < :b AND NOT counter)
  AND ts >= :lo AND ts < :hi AND value IS NOT NULL
GROUP BY 1, 2
"""
_INSERT_GAUGE_DAYS = f"""
INSERT INTO rollup_gauge_day (series_id, day, n, nint, total, vmin, vmax)
SELECT series_id, blk / {BLOCKS_PER_DAY}, SUM(n), SUM(nint), TOTAL(total), MIN(vmin), MAX(vmax)
FROM rollup_gauge
WHERE series_id >= :a AND series_id < :b
  AND blk >= :dlo * {BLOCKS_PER_DAY} AND blk < :dhi * {BLOCKS_PER_DAY}
GROUP BY 1, 2
"""


def _rebuild_gauges(conn: sqlite3.Connection, params: Mapping[str, int], gauges: bool) -> int:
    if not gauges:
        return 0
    conn.execute(_DELETE_GAUGE_BLOCKS, params)
    written = conn.execute(_INSERT_GAUGE_BLOCKS, params).rowcount
    conn.execute(_DELETE_GAUGE_DAYS, params)
    conn.execute(_INSERT_GAUGE_DAYS, params)
    return written


def rebuild(
    conn: sqlite3.Connection, a: int, b: int, lo: int, hi: int, w: int, *, gauges: bool = True
) -> int:
    """Recompute the rollup of series ids ``[a, b)`` for ``[lo, hi)`` (ms; ``lo`` block-aligned
    and ``>= 0``; ``hi`` may cut a block, whose row then counts its samples below ``hi``) from
    ``samples``, then re-check the drop into each series' first sample at or after ``hi`` if
    that sample is below ``w`` (the rollup watermark).

    ``gauges``: also the gauge rows (``rollup_gauge``; stores of schema 3 and later).
    Runs inside the caller's transaction. Idempotent. Returns the number of block rows written.
    """
    if hi <= lo:
        return 0
    blo, bhi = lo // BLOCK_MS, -(-hi // BLOCK_MS)
    params = {"a": a, "b": b, "lo": lo, "hi": hi, "blo": blo, "bhi": bhi, "w": w,
              "dlo": blo // BLOCKS_PER_DAY, "dhi": -(-bhi // BLOCKS_PER_DAY)}
    conn.execute(_DELETE_BLOCKS, params)
    conn.execute(_DELETE_RESETS, params)
    written = conn.execute(_INSERT_BLOCKS, params).rowcount
    # The days these hours belong to, from all their hours' rows (rebuilt or not).
    conn.execute(_DELETE_DAYS, params)
    conn.execute(_INSERT_DAYS, params)
    conn.execute(_INSERT_RESETS, params)
    if hi < w:
        conn.execute(_FIX_DELETE, params)
        conn.execute(_FIX_INSERT, params)
    return written + _rebuild_gauges(conn, params, gauges)


def expire(
    conn: sqlite3.Connection, a: int, b: int, cut_ms: int, w: int, *, gauges: bool = True
) -> int:
    """After samples below ``cut_ms`` were deleted: drop the rollup below it and rebuild the
    block holding ``cut_ms`` (partly expired, and its first sample lost its predecessor)."""
    first = max(0, block_floor(cut_ms))
    if gauges:
        conn.execute(
            "DELETE FROM rollup_gauge WHERE series_id >= :a AND series_id < :b AND blk < :blo",
            {"a": a, "b": b, "blo": first // BLOCK_MS},
        )
        conn.execute(
            "DELETE FROM rollup_gauge_day WHERE series_id >= :a AND series_id < :b "
            "AND day < :dlo",
            {"a": a, "b": b, "dlo": first // BLOCK_MS // BLOCKS_PER_DAY},
        )
    conn.execute(
        "DELETE FROM rollup WHERE series_id >= :a AND series_id < :b AND blk < :blo",
        {"a": a, "b": b, "blo": first // BLOCK_MS},
    )
    conn.execute(  # the day holding `first` is recomputed by the rebuild below
        "DELETE FROM rollup_day WHERE series_id >= :a AND series_id < :b AND day < :dlo",
        {"a": a, "b": b, "dlo": first // BLOCK_MS // BLOCKS_PER_DAY},
    )
    conn.execute(
        "DELETE FROM rollup_resets WHERE series_id >= :a AND series_id < :b AND ts < :lo",
        {"a": a, "b": b, "lo": first},
    )
    if first >= w or first == cut_ms:
        # Nothing rolled up there, or no block partly expired (compaction expires whole
        # hours): only the day's row may have counted expired hours. (The drop into the
        # first sample kept, from an expired one, may stay: a window's drops count only
        # after its first sample.)
        dlo = first // BLOCK_MS // BLOCKS_PER_DAY
        params = {"a": a, "b": b, "dlo": dlo, "dhi": dlo + 1}
        conn.execute(_DELETE_DAYS, params)
        conn.execute(_INSERT_DAYS, params)
        if gauges:
            conn.execute(_DELETE_GAUGE_DAYS, params)
            conn.execute(_INSERT_GAUGE_DAYS, params)
        return 0
    return rebuild(conn, a, b, first, min(first + BLOCK_MS, w), w, gauges=gauges)


# --- reading -----------------------------------------------------------------------------------
class CounterWindow(NamedTuple):
    """One series' window as ``extrapolatedRate`` sees it (staleness markers excluded).

    ``n``: number of samples; ``first_ts``/``last_ts``: Unix ms; ``first_value``/
    ``last_value``: the samples' values (NaN possible); ``resets``: the value before each drop
    (``current < previous``), in sample order.
    """

    n: int
    first_ts: int
    first_value: float
    last_ts: int
    last_value: float
    resets: tuple[float, ...] = ()


class Plan(NamedTuple):
    """How a window ``[start, end]`` splits (ms): samples in ``[start, hi)`` (below the rollup
    limit) are summarised in SQL — ``[m0, m1)`` from the whole hours' and days' rows, the
    edges ``[start, m0)`` and ``[m1, hi)`` by counting their samples (``m0 == m1 == hi`` when
    no whole hour fits); samples in ``[hi, end]`` (above the limit: what the write head still
    holds, or hours a backfill made stale) are read raw."""

    start: int
    m0: int
    m1: int
    hi: int
    end: int


def plan(start_ms: int, end_ms: int, limit_ms: int) -> Plan:
    """Split ``[start_ms, end_ms]`` (inclusive) at ``limit_ms`` (``fast_limit``) and around
    the whole blocks below it (see ``Plan``)."""
    hi = max(start_ms, min(end_ms + 1, limit_ms))
    b0 = max(0, -(-start_ms // BLOCK_MS))
    b1 = hi // BLOCK_MS
    if b1 <= b0:
        return Plan(start_ms, hi, hi, hi, end_ms)
    return Plan(start_ms, b0 * BLOCK_MS, b1 * BLOCK_MS, hi, end_ms)


_IDS = "SELECT value FROM json_each(:ids)"
_SEEK = """(
    SELECT ts FROM samples WHERE series_id = j.value AND ts >= :lo AND ts < :hi
      AND value IS NOT NULL ORDER BY ts {order} LIMIT 1)"""
_COUNT = """(
    SELECT COUNT(*) FROM samples WHERE series_id = j.value AND ts >= {lo} AND ts < {hi}
      AND value IS NOT NULL)"""
_HOURS = """COALESCE((
    SELECT SUM(n) FROM rollup WHERE series_id = j.value AND blk >= {lo} AND blk < {hi}), 0)"""
# Per series: the sample count of [lo, hi) — the edges' rows counted, whole hours and days
# from the rollup (which counts chunked samples too) — and its first and last non-stale rows.
_REGION = f"""
SELECT j.value,
       {_COUNT.format(lo=":lo", hi=":m0")} + {_COUNT.format(lo=":m1", hi=":hi")}
       + {_HOURS.format(lo=":b0", hi=":h0")} + {_HOURS.format(lo=":h1", hi=":b1")}
       + COALESCE((SELECT SUM(n) FROM rollup_day
                   WHERE series_id = j.value AND day >= :d0 AND day < :d1), 0),
       f.ts, f.value, l.ts, l.value
FROM json_each(:ids) AS j
LEFT JOIN samples AS f ON f.series_id = j.value AND f.ts = {_SEEK.format(order="ASC")}
LEFT JOIN samples AS l ON l.series_id = j.value AND l.ts = {_SEEK.format(order="DESC")}
"""
# The drops of [lo, hi). Every block below the rollup limit is rolled up — also the two
# partial blocks at the edges — so every drop whose later sample lies in [lo, hi) is stored.
_REGION_RESETS = f"""
SELECT series_id, ts, before FROM rollup_resets
WHERE series_id IN ({_IDS}) AND ts >= :lo AND ts < :hi
ORDER BY 1, 2
"""
# The chunk of one span, per series.
_SPAN_CHUNKS = f"""
SELECT series_id, data FROM chunks WHERE series_id IN ({_IDS}) AND start_ts = :start
"""
# From the chunks' summaries: the first non-stale sample in a chunk starting after :after,
# before :hi; the last one in a chunk starting before :before, at or after :lo.
_NEXT_FIRST = """SELECT first_ts, first_v FROM chunks WHERE series_id = ? AND start_ts > ?
    AND first_ts IS NOT NULL AND first_ts < ? ORDER BY start_ts LIMIT 1"""
_PREV_LAST = """SELECT last_ts, last_v FROM chunks WHERE series_id = ? AND start_ts < ?
    AND last_ts IS NOT NULL AND last_ts >= ? ORDER BY start_ts DESC LIMIT 1"""


#: Reads samples: ``load(ids, lo, hi)`` gives, per series id, its samples with
#: ``lo <= ts <= hi`` (ms) as ``(ts, values, stale)`` arrays, from every table that holds
#: them (``collector.store.reads``).
Loader = Callable[[Sequence[int], int, int], Mapping[int, Arrays]]


class Sealed(NamedTuple):
    """Where a store's chunks are (``collector.store.sealed``): ``span`` (ms) of one chunk;
    every chunk ends at or below ``mark`` (Unix ms)."""

    span: int
    mark: int


def _value(v: object) -> float:
    """A stored value as a float: REAL as is, the TEXT ``'NaN'`` as NaN (markers, SQL NULL,
    are excluded before this)."""
    if type(v) is float:
        return v
    return math.nan if isinstance(v, str) else float(v)  # type: ignore[arg-type]


def _grid(p: Plan) -> dict[str, int]:
    """The whole blocks ``[b0, b1)`` of a plan, split into hours ``[b0, h0)``, whole days
    ``[d0, d1)`` and hours ``[h1, b1)``."""
    b0, b1 = p.m0 // BLOCK_MS, p.m1 // BLOCK_MS
    d0, d1 = -(-b0 // BLOCKS_PER_DAY), b1 // BLOCKS_PER_DAY
    if d1 <= d0:  # no whole day: all hours
        d0 = d1 = 0
        h0 = h1 = b1
    else:
        h0, h1 = d0 * BLOCKS_PER_DAY, d1 * BLOCKS_PER_DAY
    return {"b0": b0, "b1": b1, "h0": h0, "h1": h1, "d0": d0, "d1": d1}


def _slice(a: Arrays, lo: int, hi: int) -> Arrays:
    """The samples of ``a`` with ``lo <= ts < hi``."""
    i, j = np.searchsorted(a[0], (lo, hi), side="left").tolist()
    return a[0][i:j], a[1][i:j], a[2][i:j]


#: Decodes a chunk's blob (``collector.store.chunks``; a reader passes its cache's).
Decode = Callable[[bytes], Arrays]


def _span_chunks(conn: sqlite3.Connection, ids_json: str, t: int, span: int,
                 decode: Decode) -> dict[int, Arrays]:
    """Per series, its chunk of the span holding ``t`` (ms), decoded."""
    rows = conn.execute(_SPAN_CHUNKS, {"ids": ids_json, "start": t // span * span})
    return {sid: decode(data) for sid, data in rows}


def _edge_chunks(conn: sqlite3.Connection, ids_json: str, p: Plan, sealed: Sealed | None,
                 decode: Decode) -> tuple[dict[int, Arrays], dict[int, Arrays]]:
    """The chunks holding the region's two edges, ``[p.start, p.m0)`` and ``[p.m1, p.hi)``,
    per series (each edge lies within one block, so within one chunk)."""
    if sealed is None or p.start >= sealed.mark:
        return {}, {}
    first = _span_chunks(conn, ids_json, p.start, sealed.span, decode)
    if (p.hi - 1) // sealed.span == p.start // sealed.span:
        return first, first
    return first, _span_chunks(conn, ids_json, p.hi - 1, sealed.span, decode)


def region_windows(
    conn: sqlite3.Connection, ids: Sequence[int], p: Plan, sealed: Sealed | None = None,
    decode: Decode = decode_chunk,
) -> dict[int, CounterWindow]:
    """Per series id: the ``CounterWindow`` of its samples in ``[p.start, p.hi)``, from the
    rollup and the samples of the partial hours at the edges (see ``Plan``), in rows and in
    the chunks ``sealed`` describes (rows and chunks hold different samples there: a row
    over a chunk's sample is a backfill, which keeps the rollup limit below it). The span
    must lie below ``fast_limit``, where the write head holds no sample. Series without
    samples there are absent. Run it in the same read transaction as the ``fast_limit`` it
    was planned with."""
    if not ids or p.hi <= p.start:
        return {}
    ids_json = json.dumps(list(ids))
    params = {"ids": ids_json, "lo": p.start, "m0": p.m0, "m1": p.m1, "hi": p.hi, **_grid(p)}
    resets: dict[int, list[tuple[int, float]]] = {}
    for sid, ts, before in conn.execute(_REGION_RESETS, params):
        resets.setdefault(sid, []).append((ts, float(before)))
    head, tail = _edge_chunks(conn, ids_json, p, sealed, decode)
    edges = ((p.start, p.m0), (p.m1, p.hi))
    in_head = _edge_stats(head, edges, (p.start, p.hi))
    in_tail = in_head if tail is head else _edge_stats(tail, edges, (p.start, p.hi))
    out: dict[int, CounterWindow] = {}
    for sid, n, fts, fv, lts, lv in conn.execute(_REGION, params).fetchall():
        first = None if fts is None else (fts, _value(fv))
        last = None if lts is None else (lts, _value(lv))
        if sealed is not None and p.start < sealed.mark:
            n += in_head[0].get(sid, 0) + (in_tail[0].get(sid, 0) if tail is not head else 0)
            first, last = _with_chunks(conn, sid, first, last, p, sealed,
                                       in_head[1].get(sid), in_tail[2].get(sid))
        if not n:
            continue
        if first is None or last is None:  # the rollup and the samples disagree
            raise StoreError(f"series {sid}: the rollup counts {n} samples in "
                             f"[{p.start}, {p.hi}) ms, but none is stored")
        # A drop into the region's first sample comes from a sample before the window; any
        # later one from a sample at or after the first (the sample just before it).
        drops = tuple(b for ts, b in resets.get(sid, ()) if ts > first[0])
        out[sid] = CounterWindow(n, first[0], first[1], last[0], last[1], drops)
    return out


Sample = tuple[int, float]


def _edge_stats(
    chunks: Mapping[int, Arrays], edges: Sequence[tuple[int, int]], whole: tuple[int, int],
) -> tuple[dict[int, int], dict[int, Sample], dict[int, Sample]]:
    """Per series, of its chunk in ``chunks``: how many non-stale samples lie in the ``edges``
    ranges ``[lo, hi)`` (ms), and the first and the last non-stale sample in ``whole``.

    All series at once: the chunks are laid end to end, each series' timestamps shifted into
    its own 2**42 ms slot of one sorted key, so that every bound is one ``searchsorted`` over
    all series and the counts come from one running sum (a loop over series, a few numpy
    calls each, cost more than the decoding)."""
    if not chunks:
        return {}, {}, {}
    sids = list(chunks)
    parts = [chunks[sid] for sid in sids]
    ts = np.concatenate([a[0] for a in parts])
    vals = np.concatenate([a[1] for a in parts])
    live = ~np.concatenate([a[2] for a in parts])
    sizes = np.fromiter((a[0].size for a in parts), dtype=np.int64, count=len(parts))
    slot = 1 << 42  # ~139 years of ms: every chunk's samples fit in one slot
    base = int(ts.min())
    rows = np.arange(len(sids), dtype=np.int64) * slot
    key = ts - base + np.repeat(rows, sizes)

    def bound(t: int) -> npt.NDArray[np.int64]:
        return np.searchsorted(key, rows + min(max(t - base, 0), slot - 1))

    cum = np.concatenate(([0], np.cumsum(live, dtype=np.int64)))
    counts = np.zeros(len(sids), dtype=np.int64)
    for lo, hi in edges:
        if lo < hi:
            counts += cum[bound(hi)] - cum[bound(lo)]
    i, j = bound(whole[0]), bound(whole[1])
    pos = np.arange(ts.size, dtype=np.int64)
    nxt = np.minimum.accumulate(np.where(live, pos, ts.size)[::-1])[::-1]
    nxt = np.concatenate((nxt, [ts.size]))[i]
    prv = np.maximum.accumulate(np.where(live, pos, -1))[np.maximum(j - 1, 0)]
    has_first = nxt < j
    has_last = (j > i) & (prv >= i)
    firsts, lasts = {}, {}
    for k in np.flatnonzero(has_first).tolist():
        firsts[sids[k]] = (int(ts[nxt[k]]), float(vals[nxt[k]]))
    for k in np.flatnonzero(has_last).tolist():
        lasts[sids[k]] = (int(ts[prv[k]]), float(vals[prv[k]]))
    return dict(zip(sids, counts.tolist(), strict=True)), firsts, lasts


def _with_chunks(
    conn: sqlite3.Connection, sid: int, first: Sample | None, last: Sample | None, p: Plan,
    sealed: Sealed, c_first: Sample | None, c_last: Sample | None,
) -> tuple[Sample | None, Sample | None]:
    """A region's first and last sample from its rows (``first``, ``last``) and from its edge
    chunks (``c_first``, ``c_last``), or else from the summaries of the chunks between."""
    span = sealed.span
    head_end = p.start // span * span + span
    if c_first is None and (first is None or first[0] >= head_end):
        row = conn.execute(_NEXT_FIRST, (sid, p.start // span * span, p.hi)).fetchone()
        c_first = None if row is None else (row[0], _value(row[1]))
    tail_start = (p.hi - 1) // span * span
    if c_last is None and (last is None or last[0] < tail_start):
        row = conn.execute(_PREV_LAST, (sid, tail_start, p.start)).fetchone()
        c_last = None if row is None else (row[0], _value(row[1]))
    if c_first is not None and (first is None or c_first[0] < first[0]):
        first = c_first
    if c_last is not None and (last is None or c_last[0] > last[0]):
        last = c_last
    return first, last


def window_of_arrays(a: Arrays) -> CounterWindow | None:
    """The ``CounterWindow`` of one series' samples as arrays (``Loader``); ``None`` when none
    is a sample. (``summarize`` over arrays: IEEE comparisons, so NaN starts or ends no drop.)"""
    ts, vals, stale = a
    live = ~stale
    if not live.all():
        ts, vals = ts[live], vals[live]
    if not ts.size:
        return None
    drop = np.flatnonzero(vals[1:] < vals[:-1])
    return CounterWindow(int(ts.size), int(ts[0]), float(vals[0]), int(ts[-1]),
                         float(vals[-1]), tuple(vals[drop].tolist()))


def summarize(points: Iterable[tuple[int, object]]) -> CounterWindow | None:
    """The ``CounterWindow`` of raw points ``(ts_ms, value)`` in time order (``None`` is a
    staleness marker, the TEXT ``'NaN'`` a NaN as stored); ``None`` when none is a sample."""
    pts = [(t, _value(v)) for t, v in points if v is not None]
    if not pts:
        return None
    # `if currPoint.V < prevValue { resultValue += prevValue }` (extrapolatedRate)
    drops = tuple(a for (_, a), (_, b) in pairwise(pts) if b < a)
    return CounterWindow(len(pts), pts[0][0], pts[0][1], pts[-1][0], pts[-1][1], drops)


def concat(head: CounterWindow | None, tail: CounterWindow | None) -> CounterWindow | None:
    """The window of ``head``'s samples followed by ``tail``'s (all of ``tail`` later): counts
    add, the drop between ``head``'s last and ``tail``'s first sample is inserted in order."""
    if head is None or tail is None:
        return head if tail is None else tail
    joint = (head.last_value,) if tail.first_value < head.last_value else ()
    return CounterWindow(
        head.n + tail.n, head.first_ts, head.first_value, tail.last_ts, tail.last_value,
        head.resets + joint + tail.resets,
    )


# --- gauges: avg_over_time ---------------------------------------------------------------------
class GaugeWindow(NamedTuple):
    """What an exact ``avg_over_time`` may use of one series' window without its samples.

    ``n``: non-stale samples; ``nint``: of which integer-valued REALs with ``|v| <= 2**31``;
    ``total``: their sum (an exact integer); ``vmin``/``vmax``: over the REAL samples
    (``None`` when there is none).
    """

    n: int
    nint: int
    total: float
    vmin: float | None
    vmax: float | None

    def mean(self, running_mean: bool) -> float | None:
        """``avg_over_time`` of the window when it is provably PromQL's float, else ``None``
        (read the samples). ``running_mean``: Prometheus 2's incremental mean (exact here
        only when every sample is the same integer); else Prometheus 3's ``sum / count``
        (exact when every sample is an integer). Signed zeros are not distinguished."""
        if self.n == 0 or self.nint != self.n:
            return None
        if self.vmin is not None and self.vmin == self.vmax:
            return float(self.vmin)
        if running_mean:
            return None
        return self.total / self.n


def gauge_concat(a: GaugeWindow | None, b: GaugeWindow | None) -> GaugeWindow | None:
    """The window of ``a``'s samples and ``b``'s together (order does not matter here)."""
    if a is None or b is None:
        return a if b is None else b
    lows = [v for v in (a.vmin, b.vmin) if v is not None]
    highs = [v for v in (a.vmax, b.vmax) if v is not None]
    return GaugeWindow(
        a.n + b.n, a.nint + b.nint, math.fsum((a.total, b.total)),
        min(lows) if lows else None, max(highs) if highs else None,
    )


_GAUGE_EDGE = f"""SELECT series_id, {_GAUGE_AGG} FROM samples
WHERE series_id IN ({_IDS}) AND ts >= {{lo}} AND ts < {{hi}} AND value IS NOT NULL
GROUP BY 1"""
_GAUGE_REGION = f"""
{_GAUGE_EDGE.format(lo=":lo", hi=":m0")}
UNION ALL
{_GAUGE_EDGE.format(lo=":m1", hi=":hi")}
UNION ALL
SELECT series_id, n, nint, total, vmin, vmax FROM rollup_gauge
WHERE series_id IN ({_IDS}) AND ((blk >= :b0 AND blk < :h0) OR (blk >= :h1 AND blk < :b1))
UNION ALL
SELECT series_id, n, nint, total, vmin, vmax FROM rollup_gauge_day
WHERE series_id IN ({_IDS}) AND day >= :d0 AND day < :d1
"""


def gauge_region(
    conn: sqlite3.Connection, ids: Sequence[int], p: Plan, sealed: Sealed | None = None,
    decode: Decode = decode_chunk,
) -> dict[int, GaugeWindow]:
    """Per gauge series id: the ``GaugeWindow`` of its samples in ``[p.start, p.hi)``, from the
    gauge rollup and the edge samples in rows and chunks (as ``region_windows`` for
    counters). Series without samples there are absent."""
    if not ids or p.hi <= p.start:
        return {}
    ids_json = json.dumps(list(ids))
    params = {"ids": ids_json, "lo": p.start, "m0": p.m0, "m1": p.m1, "hi": p.hi, **_grid(p)}
    out: dict[int, GaugeWindow] = {}
    parts: list[tuple[int, GaugeWindow | None]] = [
        (sid, GaugeWindow(int(n), int(nint), float(total), vmin, vmax) if n else None)
        for sid, n, nint, total, vmin, vmax in conn.execute(_GAUGE_REGION, params)
    ]
    head, tail = _edge_chunks(conn, ids_json, p, sealed, decode)
    for edges in (head, tail) if tail is not head else (head,):
        for sid, a in edges.items():
            parts.append((sid, gauge_of_arrays(_slice(a, p.start, p.m0))))
            parts.append((sid, gauge_of_arrays(_slice(a, p.m1, p.hi))))
    for sid, part in parts:
        joined = gauge_concat(out.get(sid), part)
        if joined is not None:
            out[sid] = joined
    return out


def gauge_of_arrays(a: Arrays) -> GaugeWindow | None:
    """The ``GaugeWindow`` of one series' samples as arrays; ``None`` when none is a sample.
    (As the gauge rollup's SQL counts them: NaN is no REAL, ±Inf no integer.)"""
    _, vals, stale = a
    v = vals[~stale] if stale.any() else vals
    if not v.size:
        return None
    real = v[~np.isnan(v)]
    ints = real[(np.abs(real) <= 2.0**31) & (real == np.trunc(real))] if real.size else real
    return GaugeWindow(int(v.size), int(ints.size), float(ints.sum()) if ints.size else 0.0,
                       float(real.min()) if real.size else None,
                       float(real.max()) if real.size else None)


def gauge_of_points(points: Iterable[tuple[int, object]]) -> GaugeWindow | None:
    """The ``GaugeWindow`` of raw points ``(ts_ms, value)`` (``None`` is a staleness marker,
    the TEXT ``'NaN'`` a NaN as stored); ``None`` when none is a sample."""
    n = nint = 0
    ints: list[float] = []
    reals: list[float] = []
    for _, v in points:
        if v is None:
            continue
        n += 1
        if type(v) is float or type(v) is int:
            f = float(v)
            if math.isfinite(f):
                reals.append(f)
                if f == int(f) and abs(f) <= 2**31:
                    nint += 1
                    ints.append(f)
            elif not math.isnan(f):
                reals.append(f)
    if not n:
        return None
    return GaugeWindow(n, nint, math.fsum(ints), min(reals, default=None),
                       max(reals, default=None))
