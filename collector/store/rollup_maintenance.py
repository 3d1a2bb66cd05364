"""Keeping the rollup (``collector.store.rollup``) up to date: SQL over ``samples``.

All statements work on the series ids ``[a, b)`` (a compaction chunk) and the span ``[lo, hi)``
(``lo`` block-aligned; ``hi`` may cut a block). Only counter-like series get counter rows (and
only the others gauge rows), but the rows of every series in the chunk are deleted first, so a
series that changed kind loses its stale rows.

A range is rebuilt only once its chunks were turned back into rows (``collector.store.sealed``);
the sample just before the range and just after it may still be in a chunk, whose summary
columns give it (``LATEST_BEFORE``, ``_FIRST_AFTER``).

A block's rows depend only on its own samples and on the last sample before it (for the drop
into its first sample), so a rebuild of ``[lo, hi)`` also re-checks the drop into the first
sample at or after ``hi`` (``rebuild``). Compaction (``collector.store.compaction``) calls
``rebuild`` as the watermarks move and after downsampling, ``expire`` after expiry, each in the
same transaction as the change.

Units: timestamps and block bounds are Unix **milliseconds** (int).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from collector.store.rollup import BLOCK_MS, BLOCKS_PER_DAY, GAUGE_AGGREGATES, block_floor

__all__ = ["LATEST_BEFORE", "expire", "rebuild"]

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
_DELETE_GAUGE_BLOCKS = """
DELETE FROM rollup_gauge WHERE series_id >= :a AND series_id < :b AND blk >= :blo AND blk < :bhi
"""
_DELETE_GAUGE_DAYS = """
DELETE FROM rollup_gauge_day
WHERE series_id >= :a AND series_id < :b AND day >= :dlo AND day < :dhi
"""
_INSERT_GAUGE_BLOCKS = f"""
INSERT INTO rollup_gauge (series_id, blk, n, nint, total, vmin, vmax)
SELECT series_id, ts / {BLOCK_MS}, {GAUGE_AGGREGATES} FROM samples
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
