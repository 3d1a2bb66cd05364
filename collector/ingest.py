"""``vigil ingest``: store expositions from files as if scraped from a target.

A file without sample timestamps is one scrape taken at ``at``. A file whose samples carry
timestamps (Prometheus text format in ms, or OpenMetrics in seconds ending in ``# EOF``) is a
backfill, like ``promtool tsdb create-blocks-from openmetrics``. All files are parsed before
anything is written, and everything is written in one transaction: a bad file leaves the
store untouched.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from collector.exposition import parse
from collector.scrape import (
    ScrapeResult,
    StorePoint,
    TargetInfo,
    points_from_families,
    scrape_points,
)
from collector.store import Store
from vigil.errors import IngestError, ParseError
from vigil.model import TargetHealth

__all__ = ["IngestReport", "ingest_files"]


class IngestReport(NamedTuple):
    """What one ``vigil ingest`` stored: per file, its mode and sample count."""

    files: list[tuple[str, str, int]]  # (file, "scrape" | "backfill", samples)
    points: int


def _read(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(name).read_bytes()
    except OSError as exc:
        raise IngestError(f"{name}: cannot read: {exc.strerror}") from None


def ingest_files(
    store: Store, target: TargetInfo, files: Sequence[str], *, at: float
) -> IngestReport:
    """Parse ``files`` (``-`` = stdin) and store them for ``target``; ``at`` is Unix seconds.

    Raises ``IngestError`` naming the file and line; nothing is written then.
    """
    if not files:
        raise IngestError("no files given")
    batches: list[StorePoint] = []
    report: list[tuple[str, str, int]] = []
    last_scrape: ScrapeResult | None = None
    for name in files:
        label = "<stdin>" if name == "-" else name
        body = _read(name)
        try:
            families = parse(body, source=label)
        except ParseError as exc:
            where = f"{label}:{exc.line}" if exc.line else label
            raise IngestError(f"{where}: {exc.reason}; nothing was written") from None
        timed = any(s.timestamp is not None for f in families for s in f.samples)
        nsamples = sum(len(f.samples) for f in families)
        if timed:
            # A backfill: like promtool, only the file's own samples, no synthetic `up`.
            batches.extend(points_from_families(families, target, round(at * 1000)))
            report.append((label, "backfill", nsamples))
        else:
            result = ScrapeResult(target, at, 0.0, families, "")
            batches.extend(scrape_points(result))
            report.append((label, "scrape", nsamples))
            last_scrape = result
    with store.transaction():
        store.write(batches)
        if last_scrape is not None:
            store.set_target_health(
                TargetHealth(
                    target=target.name, pool=target.pool, kind=target.kind, url=target.url,
                    up=True, last_scrape=at, duration=0.0, samples=last_scrape.samples,
                    error="",
                )
            )
    return IngestReport(report, len(batches))
