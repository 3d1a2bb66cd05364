"""``vigil ingest``: store expositions from files as if scraped from a target.

A file without sample timestamps is one scrape taken at ``at``. A file whose samples carry
timestamps (Prometheus text format in ms, or OpenMetrics in seconds ending in ``# EOF``) is a
backfill, like ``promtool tsdb create-blocks-from openmetrics``, in any layout promtool accepts
(``collector.backfill``). A backfill without ``up`` gets ``up = 1`` for the target at each of
its timestamps, as the scrapes it records would have written; cost, replica counts and scaling
read ``up``. All files are parsed before anything is written, and everything is written in one
transaction: a bad file leaves the store untouched.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from prometheus_client.metrics_core import Metric

from collector.backfill import parse_backfill
from collector.exposition import parse
from collector.exposition.body import decode
from collector.scrape import (
    ScrapeResult,
    StorePoint,
    TargetInfo,
    points_from_families,
    scrape_points,
)
from collector.store import Store
from vigil.conventions import SERIES_UP
from vigil.errors import IngestError, ParseError
from vigil.model import SeriesKey, TargetHealth

__all__ = [
    "IngestReport",
    "PreparedIngest",
    "check_at",
    "ingest_files",
    "prepare_ingest",
    "write_ingest",
]


class IngestReport(NamedTuple):
    """What one ``vigil ingest`` stored: per file, its mode and sample count."""

    files: list[tuple[str, str, int]]  # (file, "scrape" | "backfill", samples)
    points: int
    up_added: int = 0  # `up = 1` points written for a backfill's timestamps


def _read(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(name).read_bytes()
    except OSError as exc:
        raise IngestError(f"{name}: cannot read: {exc.strerror}") from None


class PreparedIngest(NamedTuple):
    """Parsed files, ready to write: points, the per-file report, the scrape (if any)."""

    target: TargetInfo
    at: float
    points: list[StorePoint]
    files: list[tuple[str, str, int]]
    scrape: ScrapeResult | None
    up_added: int = 0


def check_at(at: float) -> float:
    """``at`` if it is a usable Unix time in seconds, else ``IngestError``."""
    if not math.isfinite(at) or not 0 <= at < 1e11:
        raise IngestError(f"--at must be a Unix time in seconds (0 to 1e11), got {at!r}")
    return at


def _parse_file(body: bytes, label: str) -> list[Metric]:
    """A file's families: as one scrape, or as a backfill in any layout promtool accepts."""
    try:
        text = decode(body, label)
        try:
            return parse(text, source=label)
        except ParseError as exc:
            # Not in a scrape's layout. A backfill may still be, once regrouped; anything
            # else keeps the first error.
            families = parse_backfill(text, source=label)
            if families is None:
                raise exc from None
            return families
    except ParseError as exc:
        where = f"{label}:{exc.line}" if exc.line else label
        raise IngestError(f"{where}: {exc.reason}; nothing was written") from None


def _backfill_up(times_ms: set[int], points: Sequence[StorePoint],
                 target: TargetInfo) -> list[StorePoint]:
    """``up = 1`` for ``target`` at each of ``times_ms`` where ``points`` have no ``up``."""
    key = SeriesKey(SERIES_UP, tuple(sorted(target.labels().items())))
    taken = {p[2] for p in points if p[0] == key}
    return [(key, "gauge", ts, 1.0) for ts in sorted(times_ms - taken)]


def prepare_ingest(target: TargetInfo, files: Sequence[str], *, at: float,
                   backfill_up: bool = True) -> PreparedIngest:
    """Read and parse every file before anything touches the store.

    ``at`` is Unix seconds for a file without timestamps. ``backfill_up``: a backfill without
    ``up`` samples gets ``up = 1`` for ``target`` at each of its timestamps (``--no-up``
    turns this off).

    Raises ``IngestError`` naming the file (and line): a malformed exposition, a file that
    mixes samples with and without timestamps, or several files without timestamps (they
    would all land on the same ``at`` and overwrite each other).
    """
    if not files:
        raise IngestError("no files given")
    check_at(at)
    points: list[StorePoint] = []
    report: list[tuple[str, str, int]] = []
    scrape: ScrapeResult | None = None
    up_times: set[int] = set()  # a backfill's timestamps (ms), for `up`
    for name in files:
        label = "<stdin>" if name == "-" else name
        families = _parse_file(_read(name), label)
        samples = [s for f in families for s in f.samples]
        timed = [s for s in samples if s.timestamp is not None]
        if timed and len(timed) != len(samples):
            first = next(s for s in samples if s.timestamp is None)
            raise IngestError(
                f"{label}: mixes samples with and without timestamps (first without: "
                f"{first.name}); a backfill needs a timestamp on every sample; "
                "nothing was written"
            )
        if timed:
            filled = points_from_families(families, target, round(at * 1000))
            if backfill_up and not any(p[0].name == SERIES_UP for p in filled):
                up_times.update(p[2] for p in filled)
            points.extend(filled)
            report.append((label, "backfill", len(samples)))
            continue
        if scrape is not None:
            raise IngestError(
                f"{label}: a second file without timestamps would be stored at the same --at "
                f"as {report[-1][0]} and overwrite it; ingest such files one at a time, each "
                "with its own --at; nothing was written"
            )
        scrape = ScrapeResult(target, at, 0.0, families, "")
        points.extend(scrape_points(scrape))
        report.append((label, "scrape", len(samples)))
    up = _backfill_up(up_times, points, target)
    points.extend(up)
    return PreparedIngest(target, at, points, report, scrape, len(up))


def write_ingest(store: Store, prepared: PreparedIngest) -> IngestReport:
    """Write a prepared ingest in one transaction (all or nothing).

    The target's health is updated only when this scrape is newer than the last one
    recorded, so an ingest of old data never hides what the live collector sees.
    """
    target = prepared.target
    with store.transaction():
        store.write(prepared.points)
        if prepared.scrape is not None:
            known = {h.target: h for h in store.target_health()}.get(target.name)
            if known is None or prepared.at >= known.last_scrape:
                store.set_target_health(
                    TargetHealth(
                        target=target.name, pool=target.pool, kind=target.kind, url=target.url,
                        up=True, last_scrape=prepared.at, duration=0.0,
                        samples=prepared.scrape.samples, error="",
                    )
                )
    return IngestReport(prepared.files, len(prepared.points), prepared.up_added)


def ingest_files(
    store: Store, target: TargetInfo, files: Sequence[str], *, at: float,
    backfill_up: bool = True,
) -> IngestReport:
    """Parse ``files`` (``-`` = stdin) and store them for ``target``; ``at`` is Unix seconds.

    Raises ``IngestError`` naming the file and line; nothing is written then.
    """
    return write_ingest(store, prepare_ingest(target, files, at=at, backfill_up=backfill_up))
