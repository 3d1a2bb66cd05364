"""Compaction: moving the head, expiry, downsampling, and keeping the rollup up to date.

``Store.compact`` runs every few minutes. It moves the head (``collector.store.head``), deletes
samples older than the downsampled retention, downsamples raw samples older than the raw
retention to one per ``resolution_s`` bucket (keeping what counters need: the samples either
side of every reset, and every staleness marker), and rolls up what is no longer in the head
(``collector.store.rollup``). All of it is SQL over bounded pieces, a slice of time for a chunk
of series per transaction, so that no transaction holds the write lock for long (the collector
must keep writing) and no step needs memory proportional to the database. Progress is durable
per piece: an interrupted compaction resumes where it stopped.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import NamedTuple

from collector.store import rollup, rollup_maintenance, sealed
from collector.store.chunks import decode_chunk
from collector.store.codec import TS_MAX, TS_MIN, floor_to
from collector.store.head import HEAD_KEEP_MS, SERIES_CHUNK, WriteHead, move_rows
from collector.store.rollup_maintenance import LATEST_BEFORE
from collector.store.schema import (
    K_BACKFILL,
    K_SERIES_GEN,
    K_VACUUM,
    K_WATERMARK,
    read_meta,
    set_meta,
)
from vigil.clock import Clock
from vigil.storage.sqlite import Database

__all__ = ["CompactionReport", "Compactor"]

#: Span of time per downsampling transaction (ms; a multiple of any sane resolution).
_COMPACT_SLICE_MS = 3_600_000
#: Rollup (re)building: blocks per transaction (with a chunk of series): 6 h of 15 s scrapes
#: for 2,000 series is ~3M samples to scan.
_ROLLUP_SLICE_MS = 6 * rollup.BLOCK_MS

#: Series ids per transaction when rows are sealed into chunks or chunks turned back into
#: rows: a span of 15 s scrapes is 1,440 samples a series, so 250 series are ~360k rows,
#: well under a second of write lock.
SEAL_SERIES = 250
#: Free pages are given back to the file system when they are more than this part of the
#: file (and at least ``_VACUUM_MIN_PAGES``), ``_VACUUM_STEP`` pages per transaction. In the
#: steady state the rows sealed each span free about a tenth of a month's file (which new
#: rows would reuse: giving them back moves that many pages once per span, and keeps the
#: file at its data's size); a first sealing of a large store frees nine tenths.
_VACUUM_SHARE = 0.05
_VACUUM_MIN_PAGES = 256
_VACUUM_STEP = 16_384

# The series of one batch, as a subquery: ``series_id IN (...)`` lets SQLite seek each series'
# (series_id, ts) range in the primary key instead of scanning every series' whole history.
_CHUNK_IDS = "SELECT id FROM series WHERE id >= :a AND id < :b"

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
            OR COALESCE(prev, {LATEST_BEFORE.format(sid="sid", bound=":lo")}, v) > v))
)
"""
_COUNT_SPAN = (
    f"SELECT COUNT(*) FROM samples WHERE series_id IN ({_CHUNK_IDS}) AND ts >= :lo AND ts < :hi"
)
_EXPIRE = f"DELETE FROM samples WHERE series_id IN ({_CHUNK_IDS}) AND ts < :cut"
_EXPIRE_CHUNKS = f"""
DELETE FROM chunks WHERE series_id IN ({_CHUNK_IDS}) AND start_ts <= :cut - :span
RETURNING n"""
_TRIM_CHUNKS = f"""
SELECT rowid, series_id, start_ts, data FROM chunks
WHERE series_id IN ({_CHUNK_IDS}) AND start_ts > :cut - :span AND start_ts < :cut
  AND min_ts < :cut"""
# After expiry: the drop into each series' first sample left came from an expired sample.
_FORGET_FIRST_DROP = """
DELETE FROM rollup_resets WHERE (series_id, ts) IN (
    SELECT c.id, MIN(
        COALESCE((SELECT ts FROM samples WHERE series_id = c.id AND ts >= :cut
                    AND value IS NOT NULL ORDER BY ts LIMIT 1), 9e18),
        COALESCE((SELECT first_ts FROM chunks WHERE series_id = c.id AND start_ts > :cut - :span
                    AND first_ts IS NOT NULL ORDER BY start_ts LIMIT 1), 9e18))
    FROM series AS c WHERE c.id >= :a AND c.id < :b)
"""
_DROP_EMPTY_SERIES = """
DELETE FROM series WHERE id >= :a AND id < :b
  AND NOT EXISTS (SELECT 1 FROM samples WHERE series_id = series.id)
  AND NOT EXISTS (SELECT 1 FROM samples_head WHERE series_id = series.id)
  AND NOT EXISTS (SELECT 1 FROM chunks WHERE series_id = series.id)
"""
# The oldest sample, by one index seek per series and table (a bare MIN(ts) would scan them).
_MIN_TS = """SELECT MIN(t) FROM (
    SELECT (SELECT MIN(ts) FROM samples WHERE series_id = series.id) AS t FROM series
    UNION ALL
    SELECT (SELECT min_ts FROM chunks WHERE series_id = series.id ORDER BY start_ts LIMIT 1)
    FROM series)"""
_MAX_ID = "SELECT MAX(id) FROM series"


class CompactionReport(NamedTuple):
    """What one ``Store.compact`` did (row counts; ``watermark_ms`` Unix ms).

    ``rows_before``: raw rows in the span downsampled this time; ``rows_deleted``: of those,
    removed by downsampling; ``rows_kept_downsampled``: of those, kept; ``rows_expired``: rows
    older than the downsampled retention, removed; ``watermark_ms``: samples older than this
    are downsampled; ``series_deleted``: series rows removed because no sample was left;
    ``rows_moved``: recent samples moved from the write-optimised head to the main table;
    ``rollup_blocks``: (series, hour) rollup rows written (``collector.store.rollup``).
    """

    rows_before: int
    rows_deleted: int
    rows_kept_downsampled: int
    rows_expired: int
    watermark_ms: int
    series_deleted: int = 0
    rows_moved: int = 0
    rollup_blocks: int = 0


class Compactor:
    """A ``Store``'s compaction: retention (seconds) and resolution (ms) as the store's."""

    def __init__(self, db: Database, head: WriteHead, clock: Clock, *, raw_retention_s: float,
                 downsampled_retention_s: float, resolution_ms: int) -> None:
        self._db = db
        self._head = head
        self._clock = clock
        self._raw_retention_s = raw_retention_s
        self._downsampled_retention_s = downsampled_retention_s
        self._res_ms = resolution_ms

    def compact(self, now: float | None = None) -> CompactionReport:
        """``Store.compact`` (``now`` Unix seconds; the clock if None)."""
        db = self._db
        db.require_writable("compact")
        now_s = self._clock() if now is None else float(now)
        raw_cut = floor_to(math.floor((now_s - self._raw_retention_s) * 1000), self._res_ms)
        exp_cut = math.floor((now_s - self._downsampled_retention_s) * 1000)
        with db.lock, db.errors_as("compact"):
            return self._compact(math.floor(now_s * 1000), raw_cut, exp_cut)

    @contextmanager
    def _step(self) -> Iterator[sqlite3.Connection]:
        """One bounded transaction of compaction."""
        with self._head.transaction() as conn, self._db.errors_as("compact"):
            yield conn

    def _chunks(self, conn: sqlite3.Connection,
                size: int = SERIES_CHUNK) -> list[tuple[int, int]]:
        max_id = conn.execute(_MAX_ID).fetchone()[0] or 0
        return [(a, a + size) for a in range(0, max_id + 1, size)]

    def _compact(self, now_ms: int, raw_cut: int, exp_cut: int) -> CompactionReport:
        conn = self._db.conn
        res = self._res_ms
        # Downsampling and expiry work on ``samples``: everything below the raw cutoff must be
        # there. (A sample written to the head meanwhile is moved next time; if it is below the
        # watermark, write() noted a backfill, so its bucket is downsampled again then.)
        cut = max(raw_cut, now_ms - HEAD_KEEP_MS)
        moved = self._head.move(cut, "compact")
        meta = read_meta(conn)
        span = int(meta[sealed.K_SPAN])
        sealed_below = int(meta[sealed.K_SEALED]) if sealed.K_SEALED in meta else None
        wm = int(meta[K_WATERMARK]) if K_WATERMARK in meta else None
        # Blocks below the rollup watermark are maintained here, in the same transaction as
        # the change to their samples (expiry, downsampling); the watermark itself only
        # moves in _roll_up, after both.
        rwm = int(meta[rollup.K_WATERMARK]) if rollup.K_WATERMARK in meta else None
        rolled = 0
        backfill = meta.get(K_BACKFILL)
        chunks = self._chunks(conn)

        # 1. Expiry first: nothing below exp_cut needs downsampling. Whole hours at a time
        # (the rollup's blocks), so that no block is left partly expired: a chunk is trimmed
        # once an hour, not at every compaction.
        exp_cut = rollup.block_floor(exp_cut)
        expired = 0
        series_deleted = 0
        for a, b in chunks:
            with self._step():
                gone = conn.execute(_EXPIRE, {"a": a, "b": b, "cut": exp_cut}).rowcount
                gone += self._expire_chunks(conn, a, b, exp_cut, span)
                expired += gone
                if gone and rwm is not None:
                    rolled += rollup_maintenance.expire(conn, a, b, exp_cut, rwm)
                    conn.execute(_FORGET_FIRST_DROP,
                                 {"a": a, "b": b, "cut": exp_cut, "span": span})
                n = conn.execute(_DROP_EMPTY_SERIES, {"a": a, "b": b}).rowcount
                if n:
                    series_deleted += n
                    conn.execute(
                        "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = ?",
                        (K_SERIES_GEN,),
                    )
                    self._head.forget_ids()

        # 2. Downsample [lo, raw_cut). Sealed spans are downsampled whole, once each: they
        # are turned back into rows here and sealed again by step 4.
        if sealed_below is not None and raw_cut < sealed_below:
            raw_cut = floor_to(raw_cut, span)
        if wm is None:
            oldest = conn.execute(_MIN_TS).fetchone()[0]
            lo = raw_cut if oldest is None else floor_to(oldest, res)
        else:
            lo = wm
        if backfill is not None:
            lo = min(lo, int(backfill))
        lo = max(lo, floor_to(exp_cut, res))
        rows_before = deleted = 0
        old_wm = wm
        # Slice bounds stay bucket-aligned (lo is) so that no bucket is split between slices.
        step = max(res, floor_to(_COMPACT_SLICE_MS, res))
        slice_lo = lo
        small = self._chunks(conn, SEAL_SERIES)
        while slice_lo < raw_cut:
            slice_hi = min(raw_cut, slice_lo + step)
            in_chunks = sealed_below is not None and slice_lo < sealed_below
            for a, b in small if in_chunks else chunks:
                params = {"a": a, "b": b, "lo": slice_lo, "hi": slice_hi, "res": res}
                with self._step():
                    if in_chunks:
                        sealed.unseal(conn, a, b, slice_lo, slice_hi, span)
                    rows_before += conn.execute(_COUNT_SPAN, params).fetchone()[0]
                    n = conn.execute(_DOWNSAMPLE, params).rowcount
                    deleted += n
                    if n and rwm is not None:
                        # The hours whose samples changed, as far as they are rolled up.
                        rolled += rollup_maintenance.rebuild(
                            conn, a, b, max(0, rollup.block_floor(slice_lo)),
                            min(rollup.block_ceil(slice_hi), rwm), rwm,
                        )
            slice_lo = slice_hi
            if wm is None or slice_lo > wm:
                # Progress is durable per slice: an interrupted compaction resumes here.
                # (Re-running a slice would be harmless: the rule keeps what it kept.)
                with self._step():
                    set_meta(conn, K_WATERMARK, str(slice_lo))
                wm = slice_lo
        new_wm = raw_cut if wm is None else max(wm, raw_cut)
        with self._step():
            set_meta(conn, K_WATERMARK, str(new_wm))
            if backfill is not None and (old_wm is None or raw_cut >= old_wm):
                # Done with the backfill, unless a writer lowered the mark again meanwhile.
                conn.execute(
                    "DELETE FROM meta WHERE key = ? AND value = ?", (K_BACKFILL, backfill)
                )
        # 3. The rollup, then 4. sealing what it covers.
        rolled += self._roll_up(cut, span)
        self._seal(span)
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

    @staticmethod
    def _expire_chunks(conn: sqlite3.Connection, a: int, b: int, cut: int, span: int) -> int:
        """Delete the chunked samples of series ids ``[a, b)`` below ``cut`` (ms): whole
        chunks, and the older part of the chunk holding ``cut``. Returns how many."""
        params = {"a": a, "b": b, "cut": cut, "span": span}
        gone: int = sum(int(n) for (n,) in conn.execute(_EXPIRE_CHUNKS, params).fetchall())
        for rowid, sid, start, data in conn.execute(_TRIM_CHUNKS, params).fetchall():
            ts, vals, stale = decode_chunk(data)
            keep = ts >= cut
            gone += int(ts.size - keep.sum())
            if keep.any():
                sealed.write_chunk(conn, sid, start, (ts[keep], vals[keep], stale[keep]))
            else:
                conn.execute("DELETE FROM chunks WHERE rowid = ?", (rowid,))
        return gone

    def _seal(self, span: int) -> None:
        """Seal every row of a span wholly below the rollup limit (``collector.store.sealed``),
        ``SEAL_SERIES`` series and one span per transaction (a first sealing of a large store
        is many of them; the steady state one per batch), then give free pages back if many."""
        conn = self._db.conn
        with self._step():
            meta = read_meta(conn)
            limit = rollup.fast_limit(meta)
            if limit is None:
                return
            top = floor_to(limit, span)
            if sealed.K_SEALED not in meta or int(meta[sealed.K_SEALED]) < top:
                # First: a reader that finds a row at or above the mark needs no chunk.
                set_meta(conn, sealed.K_SEALED, str(top))
            batches = self._chunks(conn, SEAL_SERIES)
        for a, b in batches:
            self._by_span(sealed.FIRST_ROW, a, b, TS_MIN, top, span,
                          partial(sealed.seal, a=a, b=b, span_ms=span))
        self._vacuum()

    def _by_span(self, first: str, a: int, b: int, lo: int, hi: int, span: int,
                 work: Callable[..., object]) -> None:
        """Run ``work(conn, lo=span_lo, hi=span_hi)`` for each span of ``[lo, hi)`` (ms) that holds
        something of the series ids ``[a, b)``, one transaction each, jumping over empty
        spans with the query ``first`` (its oldest ts at or after ``:lo``)."""
        conn = self._db.conn
        while lo < hi:
            with self._step():
                found = conn.execute(first, {"a": a, "b": b, "lo": lo,
                                             "span": span}).fetchone()[0]
                if found is None or found >= hi:
                    return
                lo = max(lo, floor_to(found, span))
                work(conn, lo=lo, hi=lo + span)
            lo += span

    def _vacuum(self) -> None:
        """Give the file's free pages back: once, fully, for a store migrated from rows
        (``K_VACUUM``), which also turns on incremental vacuuming; else incrementally, when
        they are a large part of the file."""
        conn = self._db.conn
        with self._db.errors_as("vacuum the store"):
            if K_VACUUM in read_meta(conn):
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("VACUUM")
                with self._step():
                    conn.execute("DELETE FROM meta WHERE key = ?", (K_VACUUM,))
                self._checkpoint()
                return
            if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
                return
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            if free < max(_VACUUM_MIN_PAGES, pages * _VACUUM_SHARE):
                return
            while free > 0:
                with self._step():
                    conn.execute(f"PRAGMA incremental_vacuum({_VACUUM_STEP})").fetchall()
                free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Copy the WAL into the file and truncate both, so that the pages a vacuum gave back
        leave the disk now, not when the last connection closes. (A reader in the middle of
        a read makes this a partial checkpoint; the next one finishes it.)"""
        self._db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def _roll_up(self, cut_ms: int, span: int) -> int:
        """Advance the rollup watermark to ``cut_ms`` (the head holds nothing older) and
        (re)build what needs it: from the hour holding the old watermark on, and the hours a
        write marked stale (``collector.store.rollup``), turning the chunks there back into
        rows first (``_seal`` seals them again). Returns the block rows written."""
        with self._step() as conn:
            meta = read_meta(conn)
            new_w = max(0, cut_ms)
            marks = [int(meta[k]) for k in (rollup.K_DIRTY, rollup.K_REBUILD) if k in meta]
            oldest = conn.execute(_MIN_TS).fetchone()[0]
            if rollup.K_WATERMARK in meta:
                w = int(meta[rollup.K_WATERMARK])
            else:  # first build (new or migrated store): from the oldest sample on
                w = new_w if oldest is None else min(new_w, max(0, rollup.block_floor(oldest)))
                set_meta(conn, rollup.K_WATERMARK, str(w))
            if new_w > w:
                # Normally a no-op (the head moved with cut_ms), but a writer may have added to
                # the head since: in this transaction, so that from now on every write below
                # the new watermark marks its hour stale (write() reads it at BEGIN).
                move_rows(conn, 0, TS_MAX, new_w)
                marks.append(w)
                w = new_w
                set_meta(conn, rollup.K_WATERMARK, str(w))
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
            set_meta(conn, rollup.K_REBUILD, str(start))
            conn.execute("DELETE FROM meta WHERE key = ?", (rollup.K_DIRTY,))
            # Series created after this transaction write below `w` only as a backfill (D).
            chunks = self._chunks(conn)
            sealed_below = int(meta.get(sealed.K_SEALED, start))
        if start < sealed_below:
            # A backfill below the sealed mark: the rebuild reads rows.
            for a, b in self._chunks(conn, SEAL_SERIES):
                self._by_span(sealed.FIRST_CHUNK, a, b, start, w, span,
                              partial(sealed.unseal, a=a, b=b, span_ms=span))
        written = 0
        lo = start
        while lo < w:
            hi = min(w, lo + _ROLLUP_SLICE_MS)
            for a, b in chunks:
                with self._step():
                    written += rollup_maintenance.rebuild(conn, a, b, lo, hi, w)
            with self._step():  # progress is durable: an interruption resumes here
                set_meta(conn, rollup.K_REBUILD, str(hi))
            lo = hi
        with self._step():
            conn.execute("DELETE FROM meta WHERE key = ?", (rollup.K_REBUILD,))
        return written
