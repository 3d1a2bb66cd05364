"""The read path: series lookups, points and last points, rollup windows, target health.

Samples are in three tables: ``chunks`` (sealed spans, ``collector.store.sealed``),
``samples`` and the write head ``samples_head``. A read takes all three in one read
transaction (one snapshot) and merges them in ts order; where two hold a (series, ts) the
newer copy wins: the head's over the row's, the row's over the chunk's. Chunks are decoded
only where a window overlaps them.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from collector.store import rollup, rollup_reads, sealed
from collector.store.chunks import DecodedChunks
from collector.store.codec import TS_MAX, TS_MIN, counter_like, decode_value
from collector.store.schema import read_meta
from collector.store.windows import (
    CounterWindow,
    GaugeWindow,
    concat,
    gauge_concat,
    gauge_of_arrays,
    window_of_arrays,
)
from vigil.clock import Clock
from vigil.conventions import EXPORTED_PREFIX
from vigil.model import Point, SeriesKey, TargetHealth
from vigil.selectors import Selector
from vigil.storage.sqlite import Database

if TYPE_CHECKING:
    import pandas

__all__ = ["Reader", "StoreMatchers"]

_NAME = "__name__"

# The last column tells a head copy (1) from the main one (0). (Not in the ORDER BY: sorting
# on it too costs a temporary b-tree and doubles the time per row; the readers resolve the tie
# themselves.)
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
# Per series: its chunk that may hold the latest sample at or before :at (no older than :lo).
_LAST_CHUNKS = """
SELECT j.value, k.data FROM json_each(:ids) AS j
JOIN chunks AS k ON k.rowid = (
    SELECT rowid FROM chunks WHERE series_id = j.value AND start_ts <= :at AND max_ts >= :lo
      AND min_ts <= :at
    ORDER BY start_ts DESC LIMIT 1)
"""


#: Label matchers a read takes: equality as a mapping, or a ``Selector`` with any operator.
StoreMatchers: TypeAlias = Mapping[str, str] | Selector | None


def _matches(key: SeriesKey, matchers: StoreMatchers) -> bool:
    """PromQL matchers: a missing label equals ""; ``__name__`` is the metric name."""
    if not matchers:
        return True
    labels = dict(key.labels)
    if isinstance(matchers, Selector):
        for m in matchers:
            have = key.name if m.name == "__name__" else labels.get(m.name, "")
            if not m.matches(have):
                return False
        return True
    for k, want in matchers.items():
        have = key.name if k == "__name__" else labels.get(k, "")
        if have != want:
            return False
    return True


def _equality(matchers: StoreMatchers) -> StoreMatchers:
    """A selector of equality matchers on distinct labels as a mapping: the plain loop of
    ``_matches`` is the fast one, and most pools are chosen by equality."""
    if isinstance(matchers, Selector) and all(m.op == "=" for m in matchers) \
            and len(matchers.names()) == len(matchers):
        return {m.name: m.value for m in matchers}
    return matchers


def _metric_name(matchers: StoreMatchers) -> str | None:
    """The metric name an equality ``__name__`` matcher fixes, if any."""
    if not matchers:
        return None
    if isinstance(matchers, Selector):
        return matchers.equal(_NAME)
    return matchers.get(_NAME)


#: Reads samples: ``load(ids, lo, hi)`` gives, per series id, its samples with
#: ``lo <= ts <= hi`` (ms) as ``(ts, values, stale)`` arrays, from every table that holds
#: them (``Reader._load``).
Loader = Callable[[Sequence[int], int, int], Mapping[int, sealed.Arrays]]


def _plan(conn: sqlite3.Connection, start_ms: int, end_ms: int) -> rollup_reads.Plan | None:
    """How the rollup serves ``[start_ms, end_ms]`` (Unix ms) now; None before its first build."""
    limit = rollup.fast_limit(read_meta(conn))
    return None if limit is None else rollup_reads.plan(int(start_ms), int(end_ms), limit)


class Reader:
    """A ``Store``'s reads (documented on ``Store``), over its ``Database``.

    ``version``: the schema version of the file; a reader of an older store (not migrated yet)
    has no rollup (below 2) or no gauge rollup (below 3) to read.
    """

    def __init__(self, db: Database, clock: Clock, version: int) -> None:
        self._db = db
        self._clock = clock
        self._rollups = version >= 2
        self._gauge_rollups = version >= 3
        #: Chunks decoded lately (readers ask for the same spans again and again).
        self._decoded = DecodedChunks()
        #: The store's chunk span (ms), read once it is needed (fixed for a store's life).
        self._span: int | None = None
        #: (name, labels JSON) -> SeriesKey; immutable facts, so never invalidated.
        self._keys: dict[tuple[str, str], SeriesKey] = {}

    def _query(self, what: str, sql: str, params: Any = ()) -> list[Any]:
        db = self._db
        with db.lock:
            try:
                return db.conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise db.fail(what, exc) from None

    def _span_ms(self, conn: sqlite3.Connection) -> int | None:
        """The chunk span (ms), or None while the store has no chunks: a schema-3 store
        opened read-only, which a writer may migrate while this reader is open (so the
        question is asked again until the answer is yes; it never changes after that)."""
        if self._span is None:
            row = conn.execute("SELECT value FROM meta WHERE key = ?",
                               (sealed.K_SPAN,)).fetchone()
            if row is not None:
                self._span = int(row[0])
        return self._span

    def _sealed(self, conn: sqlite3.Connection) -> rollup_reads.Sealed | None:
        """The store's chunk span and sealed mark, None while nothing is sealed."""
        span = self._span_ms(conn)
        if span is None:
            return None
        row = conn.execute("SELECT value FROM meta WHERE key = ?",
                           (sealed.K_SEALED,)).fetchone()
        return None if row is None else rollup_reads.Sealed(span, int(row[0]))

    def _load(self, conn: sqlite3.Connection, ids: Sequence[int], lo: int,
              hi: int) -> dict[int, sealed.Arrays]:
        """Per series id, its samples with ``lo <= ts <= hi`` (ms) from all three tables, in
        the caller's read transaction (``Loader``). Series without any are absent."""
        if not ids or hi < lo:
            return {}
        ids_json = json.dumps(list(ids))
        out: dict[int, sealed.Arrays] = {}
        rows = conn.execute(_POINTS, {"ids": ids_json, "lo": lo, "hi": hi}).fetchall()
        start = 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or rows[i][0] != rows[start][0]:
                out[rows[start][0]] = _rows_arrays(rows[start:i])
                start = i
        span = self._span_ms(conn)
        if span is not None:
            for sid, chunked in sealed.read_chunks(conn, ids_json, lo, hi, span,
                                                   self._decoded.decode):
                rows_of = out.get(sid)
                out[sid] = chunked if rows_of is None else sealed.merge(chunked, rows_of)
        return out

    # --- series ----------------------------------------------------------------------------
    def target_health(self) -> list[TargetHealth]:
        """``Store.target_health``."""
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
        """``Store.metric_names``."""
        rows = self._query("list metric names", "SELECT DISTINCT name FROM series ORDER BY name")
        return [r[0] for r in rows]

    def _key(self, name: str, labels_json: str) -> SeriesKey:
        k = (name, labels_json)
        key = self._keys.get(k)
        if key is None:
            key = SeriesKey(name, tuple((a, b) for a, b in json.loads(labels_json)))
            self._keys[k] = key
        return key

    def select_series(
        self, name: str | None, matchers: StoreMatchers
    ) -> list[tuple[int, SeriesKey, str]]:
        """(id, key, type) of the matching series, sorted by key."""
        if name is None:
            name = _metric_name(matchers)
        if name is None:
            rows = self._query("list series", "SELECT id, name, labels, type FROM series")
        else:
            rows = self._query(
                f"list the series of {name!r}",
                "SELECT id, name, labels, type FROM series WHERE name = ?",
                (name,),
            )
        out = []
        matchers = _equality(matchers)
        for sid, n, labels, t in rows:
            key = self._key(n, labels)
            if _matches(key, matchers):
                out.append((sid, key, t))
        out.sort(key=itemgetter(1))
        return out

    # --- points ----------------------------------------------------------------------------
    def points(
        self, name: str, matchers: StoreMatchers, start_ms: int | None,
        end_ms: int | None,
    ) -> dict[SeriesKey, list[Point]]:
        """``Store.points``."""
        selected = self.select_series(name, matchers)
        if not selected:
            return {}
        lo = TS_MIN if start_ms is None else int(start_ms)
        hi = TS_MAX if end_ms is None else int(end_ms)
        db = self._db
        with db.snapshot() as conn, db.errors_as(f"read points of {name!r}"):
            found = self._load(conn, [sid for sid, _, _ in selected], lo, hi)
        out: dict[SeriesKey, list[Point]] = {}
        for sid, key, _ in selected:  # in key order
            if sid in found:
                ts, vals, stale = found[sid]
                out[key] = [Point(t, None if s else v) for t, v, s in
                            zip(ts.tolist(), vals.tolist(), stale.tolist(), strict=True)]
        return out

    def series_arrays(
        self, name: str, matchers: StoreMatchers, start_ms: int, end_ms: int,
        keep: Callable[[SeriesKey], bool] | None = None,
    ) -> Iterator[tuple[SeriesKey, str, Any, Any, Any]]:
        """``Store.series_arrays``."""
        db = self._db
        for sid, key, family_type in self.select_series(name, matchers):
            if keep is not None and not keep(key):
                continue
            with db.snapshot() as conn, db.errors_as(f"read points of {name!r}"):
                found = self._load(conn, [sid], int(start_ms), int(end_ms)).get(sid)
            if found is not None:
                # The caller's own arrays: these may be views of the reader's decoded chunks.
                ts, vals, stale = (a if a.flags.writeable else a.copy() for a in found)
                yield key, family_type, ts, vals, stale

    def last_points(
        self, name: str, matchers: StoreMatchers, at_ms: int | None,
        lookback_ms: int | None,
    ) -> dict[SeriesKey, Point]:
        """``Store.last_points``."""
        selected = self.select_series(name, matchers)
        if not selected:
            return {}
        by_id = {sid: key for sid, key, _ in selected}
        at = TS_MAX if at_ms is None else int(at_ms)
        lo = TS_MIN
        if lookback_ms is not None:
            ref = math.floor(self._clock() * 1000) if at_ms is None else at
            lo = ref - int(lookback_ms)
        db = self._db
        with db.snapshot() as conn, db.errors_as(f"read the last points of {name!r}"):
            params = {"ids": json.dumps(list(by_id)), "at": at, "lo": lo}
            found = {
                sid: Point(hts, decode_value(hv))
                if hts is not None and (mts is None or hts >= mts)
                else Point(mts, decode_value(mv))
                for sid, hts, hv, mts, mv in conn.execute(_LAST_POINTS, params)
            }
            where = self._sealed(conn)
            if where is not None:
                self._last_chunked(conn, by_id, found, at, lo, where.mark)
        # In key order, like every other read.
        return {key: found[sid] for sid, key, _ in selected if sid in found}

    def _last_chunked(self, conn: sqlite3.Connection, by_id: Mapping[int, SeriesKey],
                      found: dict[int, Point], at: int, lo: int, mark: int) -> None:
        """Where a chunk holds a later sample at or before ``at`` than the rows (``found``),
        take it. Rows at or above the sealed ``mark`` are later than every chunk."""
        ids = [sid for sid in by_id if sid not in found or found[sid].ts_ms < mark]
        if not ids:
            return
        for sid, data in conn.execute(
                _LAST_CHUNKS, {"ids": json.dumps(ids), "at": at, "lo": lo}).fetchall():
            ts, vals, stale = self._decoded.decode(data)
            i = int(np.searchsorted(ts, at, side="right")) - 1
            if i < 0 or ts[i] < lo:  # min_ts <= at and max_ts >= lo make this rare
                continue
            point = Point(int(ts[i]), None if stale[i] else float(vals[i]))
            if sid not in found or point.ts_ms > found[sid].ts_ms:
                found[sid] = point

    def frame(
        self, name: str, matchers: StoreMatchers, start_ms: int | None,
        end_ms: int | None,
    ) -> pandas.DataFrame:
        """``Store.frame``."""
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

    # --- rollup windows --------------------------------------------------------------------
    def counter_windows(
        self, name: str, matchers: StoreMatchers, start_ms: int, end_ms: int,
    ) -> dict[SeriesKey, CounterWindow] | None:
        """``Store.counter_windows``."""
        if not self._rollups:
            return None
        db = self._db
        with db.snapshot() as conn, db.errors_as(f"read the rollup of {name!r}"):
            p = _plan(conn, start_ms, end_ms)
            if p is None:
                return None
            selected = self.select_series(name, matchers)
            counters = [sid for sid, key, t in selected if counter_like(t, key.name)]
            load = self._loader(conn)
            region = rollup_reads.region_windows(conn, counters, p, self._sealed(conn),
                                                 self._decoded.decode)
            # Above the rollup limit, and every non-counter: raw samples, summarised as read.
            others = [sid for sid, key, t in selected if not counter_like(t, key.name)]
            raw = self._windows(load, counters, p.hi, p.end) if p.hi <= p.end else {}
            raw.update(self._windows(load, others, p.start, p.end))
        out: dict[SeriesKey, CounterWindow] = {}
        for sid, key, _ in selected:  # in key order, like every other read
            window = concat(region.get(sid), raw.get(sid))
            if window is not None:
                out[key] = window
        return out

    def gauge_windows(
        self, name: str, matchers: StoreMatchers, start_ms: int, end_ms: int,
    ) -> dict[SeriesKey, GaugeWindow] | None:
        """``Store.gauge_windows``."""
        if not self._gauge_rollups:
            return None
        db = self._db
        with db.snapshot() as conn, db.errors_as(f"read the gauge rollup of {name!r}"):
            p = _plan(conn, start_ms, end_ms)
            if p is None:
                return None
            selected = [
                (sid, key) for sid, key, t in self.select_series(name, matchers)
                if not counter_like(t, key.name)
            ]
            ids = [sid for sid, _ in selected]
            load = self._loader(conn)
            region = rollup_reads.gauge_region(conn, ids, p, self._sealed(conn),
                                               self._decoded.decode)
            tail = load(ids, p.hi, p.end) if p.hi <= p.end else {}
        out: dict[SeriesKey, GaugeWindow] = {}
        for sid, key in selected:
            raw = gauge_of_arrays(tail[sid]) if sid in tail else None
            window = gauge_concat(region.get(sid), raw)
            if window is not None:
                out[key] = window
        return out

    def _loader(self, conn: sqlite3.Connection) -> Loader:
        """``_load`` on ``conn`` (the open read transaction), as a ``Loader``."""
        return lambda ids, lo, hi: self._load(conn, ids, lo, hi)

    @staticmethod
    def _windows(load: Loader, ids: list[int], lo: int,
                 hi: int) -> dict[int, CounterWindow]:
        """``CounterWindow`` of the samples with ``lo <= ts <= hi`` of ``ids``."""
        out: dict[int, CounterWindow] = {}
        for sid, arrays in load(ids, lo, hi).items():
            window = window_of_arrays(arrays)
            if window is not None:
                out[sid] = window
        return out


def _rows_arrays(rows: Sequence[tuple[int, int, Any, int]]) -> sealed.Arrays:
    """One series' stored rows ``(series id, ts, value, table)`` sorted by ts as arrays; of
    two rows with the same ts the head's (table 1) wins."""
    ts: list[int] = []
    vals: list[Any] = []
    last = None
    for _, t, v, src in rows:
        if t == last:  # re-written since it moved: the head's copy wins
            if not src:
                continue
            ts.pop()
            vals.pop()
        ts.append(t)
        vals.append(v)
        last = t
    return sealed.rows_to_arrays(ts, vals)
