"""The read path: series lookups, points and last points, rollup windows, target health.

Every read of samples reads both tables (``samples`` and the write head ``samples_head``) in
one statement, so one snapshot, and the two sorted streams merge in order; where both hold a
(series, ts) the head's copy is the newer and wins. Reads that take several statements (the
rollup windows) run them in one read transaction.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Any, TypeAlias

from collector.store import rollup
from collector.store.codec import TS_MAX, TS_MIN, counter_like, decode_value
from collector.store.rollup import CounterWindow, GaugeWindow
from collector.store.schema import read_meta
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


def _plan(conn: sqlite3.Connection, start_ms: int, end_ms: int) -> rollup.Plan | None:
    """How the rollup serves ``[start_ms, end_ms]`` (Unix ms) now; None before its first build."""
    limit = rollup.fast_limit(read_meta(conn))
    return None if limit is None else rollup.plan(int(start_ms), int(end_ms), limit)


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
        #: (name, labels JSON) -> SeriesKey; immutable facts, so never invalidated.
        self._keys: dict[tuple[str, str], SeriesKey] = {}

    def _query(self, what: str, sql: str, params: Any = ()) -> list[Any]:
        db = self._db
        with db.lock:
            try:
                return db.conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise db.fail(what, exc) from None

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
        by_id = {sid: key for sid, key, _ in self.select_series(name, matchers)}
        if not by_id:
            return {}
        rows = self._query(
            f"read points of {name!r}",
            _POINTS,
            {
                "ids": json.dumps(list(by_id)),
                "lo": TS_MIN if start_ms is None else int(start_ms),
                "hi": TS_MAX if end_ms is None else int(end_ms),
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
            cur.append(Point(ts, decode_value(v)))
            last_ts = ts
        return out

    def series_arrays(
        self, name: str, matchers: StoreMatchers, start_ms: int, end_ms: int,
        keep: Callable[[SeriesKey], bool] | None = None,
    ) -> Iterator[tuple[SeriesKey, str, Any, Any, Any]]:
        """``Store.series_arrays``."""
        import numpy as np

        for sid, key, family_type in self.select_series(name, matchers):
            if keep is not None and not keep(key):
                continue
            rows = self._query(f"read points of {name!r}", _POINTS,
                               {"ids": json.dumps([sid]), "lo": int(start_ms),
                                "hi": int(end_ms)})
            if not rows:
                continue
            ts: list[int] = []
            vals: list[float | None] = []
            last_ts = None
            for _, t, v, src in rows:
                if t == last_ts:  # re-written since it moved: the head's copy wins
                    if not src:
                        continue
                    ts.pop()
                    vals.pop()
                ts.append(t)
                vals.append(decode_value(v))
                last_ts = t
            stale = np.fromiter((v is None for v in vals), dtype=np.bool_, count=len(vals))
            values = np.fromiter((math.nan if v is None else v for v in vals),
                                 dtype=np.float64, count=len(vals))
            yield key, family_type, np.asarray(ts, dtype=np.int64), values, stale

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
        rows = self._query(
            f"read the last points of {name!r}",
            _LAST_POINTS,
            {"ids": json.dumps(list(by_id)), "at": at, "lo": lo},
        )
        found = {
            sid: Point(hts, decode_value(hv)) if hts is not None and (mts is None or hts >= mts)
            else Point(mts, decode_value(mv))
            for sid, hts, hv, mts, mv in rows
        }
        # In key order, like every other read.
        return {key: found[sid] for sid, key, _ in selected if sid in found}

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
            region = rollup.region_windows(conn, counters, p)
            # Above the rollup limit, and every non-counter: raw rows, summarised as read.
            others = [sid for sid, key, t in selected if not counter_like(t, key.name)]
            raw = self._row_windows(counters, p.hi, p.end) if p.hi <= p.end else {}
            raw.update(self._row_windows(others, p.start, p.end))
        out: dict[SeriesKey, CounterWindow] = {}
        for sid, key, _ in selected:  # in key order, like every other read
            window = rollup.concat(region.get(sid), raw.get(sid))
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
            region = rollup.gauge_region(conn, ids, p)
            tail: dict[int, list[tuple[int, object]]] = {}
            if p.hi <= p.end and ids:
                rows = conn.execute(_POINTS, {"ids": json.dumps(ids), "lo": p.hi, "hi": p.end})
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
        cur = self._db.conn.execute(_POINTS, {"ids": json.dumps(ids), "lo": lo, "hi": hi})
        return rollup.windows_of_rows(cur)
