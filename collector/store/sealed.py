"""Sealed samples: a series' samples of one span of time as one compressed chunk.

Samples live in three places: the write head (``samples_head``, minutes), the row table
(``samples``, the recent spans) and ``chunks``: once a span of ``span_ms`` (aligned to the
Unix epoch) lies wholly below the rollup limit (``rollup.fast_limit``), compaction seals it,
one row per series and span holding every sample as a ``collector.store.chunks`` blob, and
deletes its rows. A month of one-minute vLLM samples takes 1.6 bytes per sample in chunks,
on disk, where a row takes about 21 (docs/benchmarks.md).

Invariants, all Unix ms:

* A chunk holds the samples of one series with ``start_ts <= ts < start_ts + span_ms``;
  ``start_ts`` is a multiple of ``span_ms``, itself a multiple of the rollup block (an hour),
  so a block never straddles two chunks.
* A (series, ts) may be both in a chunk and in the row table or head only while a backfill
  waits to be sealed: the row is the newer copy and wins, in reads and when sealed.
* Every chunk of the store ends at or below ``meta.sealed_below_ms`` (``K_SEALED``): a read
  that found a row at or above it needs no chunk to know the latest sample.

Maintenance that rewrites samples (downsampling, rebuilding the rollup after a backfill)
works in SQL on rows, so it first ``unseal``s the spans it covers (the chunks become rows
again) and compaction seals them again. The samples just before and after such a range are
read from each chunk's summary columns (first and last non-stale sample;
``rollup_maintenance``'s ``LATEST_BEFORE`` and ``_FIRST_AFTER``), so a neighbouring chunk is
never unsealed just to be looked at.

Values in the summary columns are spelled as in ``samples`` (``collector.store.codec``):
a NaN sample is the TEXT ``'NaN'``; the columns hold no staleness marker (NULL means the
chunk has no sample that is not a marker).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from collector.store.chunks import decode_chunk, encode_chunk
from collector.store.codec import NAN_TEXT

__all__ = [
    "DEFAULT_SPAN_MS",
    "FIRST_CHUNK",
    "FIRST_ROW",
    "K_SEALED",
    "K_SPAN",
    "SCHEMA",
    "Arrays",
    "merge",
    "read_chunks",
    "rows_to_arrays",
    "seal",
    "unseal",
    "write_chunk",
]

#: The span of one chunk (ms) in a new store: six hours, 360 samples of a one-minute series
#: and 1,440 of a 15 s one. Long enough for the codec (docs/benchmarks.md: 1.37 bytes per
#: sample at 1,440 samples, 1.8-1.9 at 120), short enough that the rows not yet sealed are a
#: small part of a month and that a read of a short window decodes little it does not need.
DEFAULT_SPAN_MS = 6 * 3_600_000

# meta keys
K_SPAN = "chunk_span_ms"  # the store's span; fixed when the store is created or migrated
K_SEALED = "sealed_below_ms"  # every chunk ends at or below this

#: DDL of the chunk table (schema 4). A rowid table with a separate unique index, not a
#: WITHOUT ROWID table: an index b-tree spills every 1-2 KB blob into its own mostly empty
#: overflow page (2.71 against 1.37 bytes per sample, bench/chunk_codec_bench.py --on-disk).
#: The blob is the last column, so that reading the summary columns never touches it.
SCHEMA = (
    """CREATE TABLE chunks (
        series_id INTEGER NOT NULL,
        start_ts INTEGER NOT NULL,     -- the span's start (Unix ms), a multiple of the span
        n INTEGER NOT NULL,            -- samples, staleness markers included
        min_ts INTEGER NOT NULL,       -- the first and last sample's ts (any kind)
        max_ts INTEGER NOT NULL,
        first_ts INTEGER,              -- the first non-stale sample (NULL: none)
        first_v,
        last_ts INTEGER,               -- the last non-stale sample (NULL: none)
        last_v,
        data BLOB NOT NULL             -- collector.store.chunks
    )""",
    "CREATE UNIQUE INDEX chunks_by_series ON chunks (series_id, start_ts)",
)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
#: One series' samples: ts (int64 Unix ms, ascending), values (float64, NaN at a marker),
#: staleness mask.
Arrays = tuple[IntArray, FloatArray, BoolArray]

_CHUNK_IDS = "SELECT id FROM series WHERE id >= :a AND id < :b"
# The rows of a span in two parts: numbers (all of them, almost always), read straight into
# a float64 array, and the rest (markers, NaN), which need a look at each value.
_ROWS_IN = f"""
SELECT series_id, ts, value FROM samples
WHERE series_id IN ({_CHUNK_IDS}) AND ts >= :lo AND ts < :hi AND {{kind}}
"""
_NUMBERS = "typeof(value) IN ('real', 'integer')"
_DELETE_ROWS_IN = (
    f"DELETE FROM samples WHERE series_id IN ({_CHUNK_IDS}) AND ts >= :lo AND ts < :hi"
)
#: The oldest row at or after :lo of the series ids [a, b): one index seek per series.
FIRST_ROW = """SELECT MIN((SELECT MIN(ts) FROM samples WHERE series_id = series.id
                         AND ts >= :lo)) FROM series WHERE id >= :a AND id < :b"""
#: The oldest chunk that ends after :lo, of the series ids [a, b).
FIRST_CHUNK = """SELECT MIN((SELECT MIN(start_ts) FROM chunks WHERE series_id = series.id
                         AND start_ts > :lo - :span)) FROM series WHERE id >= :a AND id < :b"""
_CHUNKS_IN = f"""
SELECT series_id, start_ts, data FROM chunks
WHERE series_id IN ({_CHUNK_IDS}) AND start_ts >= :lo AND start_ts < :hi
"""
_UPSERT = """INSERT INTO chunks (series_id, start_ts, n, min_ts, max_ts, first_ts, first_v,
    last_ts, last_v, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (series_id, start_ts) DO UPDATE SET n = excluded.n, min_ts = excluded.min_ts,
    max_ts = excluded.max_ts, first_ts = excluded.first_ts, first_v = excluded.first_v,
    last_ts = excluded.last_ts, last_v = excluded.last_v, data = excluded.data"""
_OVERLAPPING = f"""
SELECT rowid, series_id, data FROM chunks
WHERE series_id IN ({_CHUNK_IDS}) AND start_ts > :lo - :span AND start_ts < :hi
"""
_INSERT_ROW = "INSERT OR IGNORE INTO samples (series_id, ts, value) VALUES (?, ?, ?)"
_READ = """
SELECT series_id, data FROM chunks
WHERE series_id IN (SELECT value FROM json_each(:ids))
  AND start_ts > :lo - :span AND start_ts <= :hi
ORDER BY series_id, start_ts
"""


def rows_to_arrays(ts: Sequence[int], values: Sequence[Any]) -> Arrays:
    """Stored rows' ``ts`` and ``value`` columns as arrays (``Arrays``): the TEXT ``'NaN'`` is
    a NaN sample, NULL a staleness marker."""
    n = len(ts)
    stale = np.fromiter((v is None for v in values), dtype=np.bool_, count=n)
    vals = np.fromiter(
        (v if type(v) is float else math.nan if v is None or isinstance(v, str) else float(v)
         for v in values),
        dtype=np.float64, count=n,
    )
    return np.fromiter(ts, dtype=np.int64, count=n), vals, stale


def _stored(value: float, stale: bool) -> float | str | None:
    """A sample value as the row table spells it."""
    if stale:
        return None
    return NAN_TEXT if value != value else value


def merge(older: Arrays, newer: Arrays) -> Arrays:
    """The samples of both, in ts order; where both hold a ts, ``newer``'s wins."""
    if not older[0].size:
        return newer
    if not newer[0].size:
        return older
    if newer[0][0] > older[0][-1]:
        return (np.concatenate((older[0], newer[0])), np.concatenate((older[1], newer[1])),
                np.concatenate((older[2], newer[2])))
    ts = np.concatenate((older[0], newer[0]))
    order = np.argsort(ts, kind="stable")  # older first within a ts: the last copy is newer
    ts = ts[order]
    last = np.ones(ts.size, dtype=np.bool_)
    last[:-1] = ts[1:] != ts[:-1]
    pick = order[last]
    vals = np.concatenate((older[1], newer[1]))[pick]
    stale = np.concatenate((older[2], newer[2]))[pick]
    return ts[last], vals, stale


def _summary(ts: IntArray, vals: FloatArray, stale: BoolArray) -> tuple[Any, ...]:
    """``n, min_ts, max_ts, first_ts, first_v, last_ts, last_v`` of a chunk's samples."""
    live = np.flatnonzero(~stale)
    first: tuple[Any, Any] = (None, None)
    last: tuple[Any, Any] = (None, None)
    if live.size:
        i, j = int(live[0]), int(live[-1])
        first = (int(ts[i]), _stored(float(vals[i]), False))
        last = (int(ts[j]), _stored(float(vals[j]), False))
    return (int(ts.size), int(ts[0]), int(ts[-1]), *first, *last)


def write_chunk(conn: sqlite3.Connection, sid: int, start: int, data: Arrays) -> None:
    """Store ``data`` (one series' samples of the span starting at ``start``, ms) as that
    span's chunk, replacing the one there."""
    ts, vals, stale = data
    conn.execute(_UPSERT, (sid, start, *_summary(ts, vals, stale),
                           encode_chunk(ts, vals, stale)))


def seal(conn: sqlite3.Connection, a: int, b: int, lo: int, hi: int,
         span_ms: int) -> tuple[int, int]:
    """Seal the rows of series ids ``[a, b)`` with ``lo <= ts < hi`` (ms, multiples of
    ``span_ms``): one chunk per series and span, merged into the span's chunk when one exists
    (the rows win), and the rows deleted. In the caller's transaction. Returns (chunks
    written, rows sealed)."""
    params = {"a": a, "b": b, "lo": lo, "hi": hi}
    numbers = conn.execute(_ROWS_IN.format(kind=_NUMBERS), params).fetchall()
    others = conn.execute(_ROWS_IN.format(kind=f"NOT {_NUMBERS}"), params).fetchall()
    if not numbers and not others:
        return 0, 0
    # Series ids and Unix ms are exact in float64 (below 2**53).
    flat = np.fromiter(chain.from_iterable(numbers), dtype=np.float64, count=3 * len(numbers))
    flat = flat.reshape(len(numbers), 3)
    sid = flat[:, 0].astype(np.int64)
    ts = flat[:, 1].astype(np.int64)
    vals = flat[:, 2].copy()
    stale = np.zeros(len(numbers), dtype=np.bool_)
    if others:
        o_sid, o_ts, o_val = zip(*others, strict=True)
        t2, v2, s2 = rows_to_arrays(o_ts, o_val)
        sid = np.concatenate((sid, np.fromiter(o_sid, dtype=np.int64, count=len(others))))
        ts, vals, stale = np.concatenate((ts, t2)), np.concatenate((vals, v2)), \
            np.concatenate((stale, s2))
    order = np.lexsort((ts, sid))
    sid, ts, vals, stale = sid[order], ts[order], vals[order], stale[order]
    start = ts // span_ms * span_ms
    cuts = np.flatnonzero((sid[1:] != sid[:-1]) | (start[1:] != start[:-1])) + 1
    bounds = np.concatenate(([0], cuts, [sid.size]))
    # Chunks already there (rows written into sealed spans): one query for the batch.
    existing = {(s, st): data for s, st, data in conn.execute(_CHUNKS_IN, params)}
    written = 0
    for i, j in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        s, st = int(sid[i]), int(start[i])
        part: Arrays = (ts[i:j], vals[i:j], stale[i:j])
        old = existing.get((s, st))
        if old is not None:
            part = merge(decode_chunk(old), part)
        write_chunk(conn, s, st, part)
        written += 1
    conn.execute(_DELETE_ROWS_IN, params)
    return written, int(sid.size)


def unseal(conn: sqlite3.Connection, a: int, b: int, lo: int, hi: int, span_ms: int) -> int:
    """Turn the chunks of series ids ``[a, b)`` whose span overlaps ``[lo, hi)`` (ms) back into
    rows (a row already there is newer and stays), in the caller's transaction. Returns how
    many rows the chunks held."""
    found = conn.execute(_OVERLAPPING, {"a": a, "b": b, "lo": lo, "hi": hi,
                                        "span": span_ms}).fetchall()
    n = 0
    for rowid, sid, data in found:
        ts, vals, stale = decode_chunk(data)
        conn.executemany(_INSERT_ROW, zip(
            [sid] * ts.size, ts.tolist(),
            [_stored(v, s) for v, s in zip(vals.tolist(), stale.tolist(), strict=True)],
            strict=True,
        ))
        conn.execute("DELETE FROM chunks WHERE rowid = ?", (rowid,))
        n += int(ts.size)
    return n


def read_chunks(
    conn: sqlite3.Connection, ids_json: str, lo: int, hi: int, span_ms: int,
    decode: Callable[[bytes], Arrays] = decode_chunk,
) -> Iterator[tuple[int, Arrays]]:
    """Per series id (ascending, as in ``ids_json``'s set), its chunked samples with
    ``lo <= ts <= hi`` (ms), decoding (with ``decode``) only the chunks that overlap. Series
    without any are left out."""
    cur_sid: int | None = None
    parts: list[Arrays] = []
    for sid, data in conn.execute(_READ, {"ids": ids_json, "lo": lo, "hi": hi,
                                          "span": span_ms}):
        if sid != cur_sid:
            if parts and cur_sid is not None:
                got = _window(parts, lo, hi)
                if got[0].size:
                    yield cur_sid, got
            cur_sid, parts = sid, []
        parts.append(decode(data))
    if parts and cur_sid is not None:
        got = _window(parts, lo, hi)
        if got[0].size:
            yield cur_sid, got


def _window(parts: Iterable[Arrays], lo: int, hi: int) -> Arrays:
    chunks = list(parts)
    if len(chunks) == 1:
        ts, vals, stale = chunks[0]
    else:
        ts = np.concatenate([c[0] for c in chunks])
        vals = np.concatenate([c[1] for c in chunks])
        stale = np.concatenate([c[2] for c in chunks])
    if ts.size and (ts[0] < lo or ts[-1] > hi):
        i = int(np.searchsorted(ts, lo, side="left"))
        j = int(np.searchsorted(ts, hi, side="right"))
        ts, vals, stale = ts[i:j], vals[i:j], stale[i:j]
    return ts, vals, stale
