"""Reading a window from the rollup (``collector.store.rollup``): which part of it the rows
answer, and the queries that answer it.

For a window ``[start, end]`` (ms, inclusive), ``plan`` splits it at the rollup limit
(``rollup.fast_limit``) and around the whole hours below it (``Plan``). Below the limit, of
what ``extrapolatedRate`` reads (``collector.store.windows.CounterWindow``): the first and the
last sample are primary-key seeks in ``samples`` and, below the sealed mark, the chunks
holding the window's edges (or the summaries of the chunks after and before them); the count
is ``SUM(n)`` over the whole days and hours inside the window plus a count of the samples in
the partial hours at its two edges (rows counted in SQL, the edge chunks decoded); the drops
are a range scan of ``rollup_resets`` over the window (the partial hours at the edges are
rolled up too: only their count needs a scan). ``gauge_region`` does the same for gauges from
``rollup_gauge``. Only the not-yet-rolled-up recent part (what is still in the write head, or
hours a backfill made stale) is read sample by sample, by the caller
(``collector.store.reads``).

Units: timestamps and block bounds are Unix **milliseconds** (int).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from collector.store.chunks import decode_chunk
from collector.store.codec import stored_float
from collector.store.rollup import BLOCK_MS, BLOCKS_PER_DAY, GAUGE_AGGREGATES
from collector.store.sealed import Arrays
from collector.store.windows import (
    CounterWindow,
    GaugeWindow,
    Sample,
    edge_stats,
    gauge_concat,
    gauge_of_arrays,
)
from vigil.errors import StoreError

__all__ = ["Decode", "Plan", "Sealed", "gauge_region", "plan", "region_windows"]


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


class Sealed(NamedTuple):
    """Where a store's chunks are (``collector.store.sealed``): ``span`` (ms) of one chunk;
    every chunk ends at or below ``mark`` (Unix ms)."""

    span: int
    mark: int


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
    in_head = edge_stats(head, edges, (p.start, p.hi))
    in_tail = in_head if tail is head else edge_stats(tail, edges, (p.start, p.hi))
    out: dict[int, CounterWindow] = {}
    for sid, n, fts, fv, lts, lv in conn.execute(_REGION, params).fetchall():
        first = None if fts is None else (fts, stored_float(fv))
        last = None if lts is None else (lts, stored_float(lv))
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
        c_first = None if row is None else (row[0], stored_float(row[1]))
    tail_start = (p.hi - 1) // span * span
    if c_last is None and (last is None or last[0] < tail_start):
        row = conn.execute(_PREV_LAST, (sid, tail_start, p.start)).fetchone()
        c_last = None if row is None else (row[0], stored_float(row[1]))
    if c_first is not None and (first is None or c_first[0] < first[0]):
        first = c_first
    if c_last is not None and (last is None or c_last[0] > last[0]):
        last = c_last
    return first, last


_GAUGE_EDGE = f"""SELECT series_id, {GAUGE_AGGREGATES} FROM samples
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
