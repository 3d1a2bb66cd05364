"""``Store``: the sample store's one object, composed of its write head, reads and compaction.

The three share one ``vigil.storage.sqlite.Database`` (one connection, one lock); ``Store``
checks its settings, opens the file (``schema.open_database``) and hands each call to the part
that does it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.store import rollup, sealed
from collector.store.compaction import CompactionReport, Compactor
from collector.store.head import WriteHead
from collector.store.reads import Reader, StoreMatchers
from collector.store.schema import K_BACKFILL, K_WATERMARK, open_database, read_meta
from collector.store.windows import CounterWindow, GaugeWindow
from vigil.clock import Clock, system_clock
from vigil.errors import StoreError
from vigil.model import Point, SeriesKey, TargetHealth

if TYPE_CHECKING:
    import pandas

__all__ = ["Store"]


class Store:
    """The sample store in one SQLite file (``collector.store`` describes schema and units).

    ``raw_retention_s``: raw samples younger than this (seconds) are kept as scraped;
    older ones are downsampled to ``resolution_s`` buckets by ``compact()``;
    ``downsampled_retention_s``: samples older than this are deleted (whole hours at a time);
    ``chunk_span_s``: the span of one compressed chunk (``collector.store.sealed``) in a store
    created or migrated now, a whole number of hours; an existing store keeps its own.
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
        chunk_span_s: float = sealed.DEFAULT_SPAN_MS / 1000,
    ):
        self.path = Path(path)
        self.readonly = readonly
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
        res_ms = max(1, round(resolution_s * 1000))
        span_ms = round(chunk_span_s * 1000)
        if span_ms <= 0 or span_ms % rollup.BLOCK_MS:
            raise StoreError(f"{self.path}: the chunk span must be a whole number of hours, "
                             f"not {chunk_span_s} s")
        self._db, version = open_database(self.path, readonly=readonly, span_ms=span_ms)
        self._head = WriteHead(self._db, clock, res_ms)
        self._reader = Reader(self._db, clock, version)
        self._compactor = Compactor(
            self._db, self._head, clock, raw_retention_s=self.raw_retention_s,
            downsampled_retention_s=self.downsampled_retention_s, resolution_ms=res_ms,
        )

    @classmethod
    def open_readonly(cls, path: str | os.PathLike[str], **kwargs: Any) -> Store:
        """A reader: never writes, never creates the file (StoreError if it does not exist)."""
        return cls(path, readonly=True, **kwargs)

    def close(self) -> None:
        """Close the connection (idempotent). An open transaction is rolled back."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "readonly" if self.readonly else "readwrite"
        return f"Store({str(self.path)!r}, {mode})"

    @property
    def _c(self) -> sqlite3.Connection:
        """The connection, for tests and tools that look inside (hold no transaction open)."""
        return self._db.conn

    def _meta(self) -> dict[str, str]:
        """The ``meta`` rows (schema version, watermarks), for tests and tools."""
        return read_meta(self._db.conn)

    def downsampled_before_ms(self) -> int | None:
        """Unix ms below which ``compact()`` has thinned every series to its last sample per
        ``resolution_s`` bucket (a backfill below the watermark lowers it until the next
        compaction); ``None`` while nothing is downsampled."""
        with self._db.lock, self._db.errors_as("read the downsampling watermark"):
            meta = read_meta(self._db.conn)
        if K_WATERMARK not in meta:
            return None
        before = int(meta[K_WATERMARK])
        backfill = meta.get(K_BACKFILL)
        return before if backfill is None else min(before, int(backfill))

    # --- writing ---------------------------------------------------------------------------
    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """All-or-nothing: every ``write()``/``set_target_health()`` inside commits together.

        Nested use joins the outer transaction through a savepoint: an exception caught
        inside undoes only the inner block. The outermost level takes the write lock at once
        (BEGIN IMMEDIATE), so it never fails half-way with 'database is locked'.
        """
        return self._head.transaction()

    def write(self, points: Iterable[tuple[SeriesKey, str, int, float | None]]) -> int:
        """Store ``(series key, family type, ts Unix ms, value)`` rows; returns how many.

        One transaction (or part of the caller's ``transaction()``): all rows or none. A row
        with the same series and ts as a stored one replaces it, so re-ingesting is harmless.
        ``value`` None is a staleness marker; NaN and ±Inf are kept as such. ``ts`` must be an
        int (Unix ms).
        """
        return self._head.write(points)

    def set_target_health(self, h: TargetHealth) -> None:
        """Record a target's latest scrape (replacing the previous record)."""
        self._head.set_target_health(h)

    def forget_target(self, name: str) -> bool:
        """Drop the health record of the target ``name`` (one that is no longer scraped), so
        that ``target_health()`` stops listing it; its samples stay. Returns whether there
        was a record. Part of the caller's ``transaction()`` when inside one."""
        return self._head.forget_target(name)

    # --- reading ---------------------------------------------------------------------------
    def target_health(self) -> list[TargetHealth]:
        """Every target's latest scrape, sorted by target name."""
        return self._reader.target_health()

    def metric_names(self) -> list[str]:
        """Every metric name with a series in the store, sorted."""
        return self._reader.metric_names()

    def series(
        self, name: str | None = None, matchers: StoreMatchers = None
    ) -> list[tuple[SeriesKey, str]]:
        """``(key, family type)`` of every series of ``name`` (all names if None) matching the
        equality ``matchers`` (a ``""`` value matches series without that label), sorted."""
        return [(key, t) for _, key, t in self._reader.select_series(name, matchers)]

    def points(
        self,
        name: str,
        matchers: StoreMatchers = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> dict[SeriesKey, list[Point]]:
        """Points of the matching series with ``start_ms <= ts <= end_ms`` (Unix ms, either
        bound optional), sorted by ts. Series without points in the range are left out."""
        return self._reader.points(name, matchers, start_ms, end_ms)

    def series_arrays(
        self, name: str, matchers: StoreMatchers, start_ms: int, end_ms: int,
        keep: Callable[[SeriesKey], bool] | None = None,
    ) -> Iterator[tuple[SeriesKey, str, Any, Any, Any]]:
        """One matching series at a time, in key order: ``(key, family type, ts, values,
        stale)`` with ``start_ms <= ts <= end_ms`` as numpy arrays (int64 ms, float64 with NaN
        at a staleness marker, the markers' bool mask). Series without points are skipped.
        For reads of many samples (a month of a histogram) that should not all be held as
        ``Point`` objects at once. ``keep``: read only the series it accepts."""
        return self._reader.series_arrays(name, matchers, start_ms, end_ms, keep)

    def last_points(
        self,
        name: str,
        matchers: StoreMatchers = None,
        at_ms: int | None = None,
        *,
        lookback_ms: int | None = None,
    ) -> dict[SeriesKey, Point]:
        """The latest point of each matching series at or before ``at_ms`` (Unix ms; None =
        the latest of all), and if ``lookback_ms`` is given no older than that before
        ``at_ms`` (or before the clock's now). A staleness marker is returned as such (value
        None). One query for all series."""
        return self._reader.last_points(name, matchers, at_ms, lookback_ms)

    def frame(
        self,
        name: str,
        matchers: StoreMatchers = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> pandas.DataFrame:
        """``points()`` as a long DataFrame, one row per point.

        Columns: ``ts_ms`` (int64, Unix ms), ``value`` (float64; NaN for a staleness marker
        and for a NaN sample), ``stale`` (bool), ``__name__``, then one string column per
        label name present in any series (missing -> ""), sorted. A label whose name clashes
        with a fixed column is renamed with the ``exported_`` prefix.
        """
        return self._reader.frame(name, matchers, start_ms, end_ms)

    def counter_windows(
        self,
        name: str,
        matchers: StoreMatchers,
        start_ms: int,
        end_ms: int,
    ) -> dict[SeriesKey, CounterWindow] | None:
        """What ``increase()`` needs from each matching series' samples with
        ``start_ms <= ts <= end_ms`` (Unix ms, inclusive): count, first and last sample, and the
        value before each counter reset, in order (``CounterWindow``; stale markers excluded).
        Series without samples in the range are left out.

        For counter-like series, the part of the range below the rollup limit is summarised in
        SQL (whole hours and days from the rollup, partial hours by counting their samples)
        and only the part above it (what the write head still holds) is read sample by
        sample; other series are read sample by sample. All in one snapshot, so the result
        is exactly what the samples give. ``None`` when the store has no rollup yet (read
        ``points()`` then).
        """
        return self._reader.counter_windows(name, matchers, start_ms, end_ms)

    def gauge_windows(
        self,
        name: str,
        matchers: StoreMatchers,
        start_ms: int,
        end_ms: int,
    ) -> dict[SeriesKey, GaugeWindow] | None:
        """What an exact ``avg_over_time`` may use of each matching gauge series' samples with
        ``start_ms <= ts <= end_ms`` (Unix ms, inclusive): count, integer count and sum, min
        and max (``GaugeWindow``), from the gauge rollup below its limit and raw samples above
        it, in one snapshot. Counter-like series and series without samples in the range are
        left out. ``None`` when the store has no gauge rollup yet."""
        return self._reader.gauge_windows(name, matchers, start_ms, end_ms)

    # --- retention -------------------------------------------------------------------------
    def compact(self, now: float | None = None) -> CompactionReport:
        """Downsample raw samples older than ``now - raw_retention_s`` and expire samples
        older than ``now - downsampled_retention_s`` (``now`` Unix seconds; the clock if None).

        First, samples older than a minute move from the head to the main table
        (``collector.store.head``); call this every few minutes. Raw samples are downsampled
        once, from the stored watermark up to the raw cutoff (aligned down to a
        ``resolution_s`` bucket): per series and bucket the last sample is kept, for
        counter-like series also the samples either side of each reset, and every staleness
        marker. The work is done in SQL in bounded transactions (a slice of time for a chunk
        of series at a time), so concurrent writers only wait briefly. Last, every span of
        ``chunk_span_s`` wholly below the rollup limit is sealed into compressed chunks
        (``collector.store.sealed``), and free pages are given back to the file system.
        """
        return self._compactor.compact(now)
