"""The collector: scrape every target on its own schedule and write the samples to the store.

Network I/O runs on one asyncio loop (httpx), so a dead or slow target only costs its own
timeout. Parsing and SQLite writes run on one dedicated writer thread: SQLite wants a single
writer, and the loop stays free to start the next scrapes on time.

The targets come from a ``TargetSet`` (``collector.discovery``): the static ``[[targets]]``
and what ``[[discovery]]`` finds. A target that appears is scraped at once and then every
interval; one that disappears stops being scraped, and once its scrape under way (if any) has
been stored, every series of its last scrape gets a staleness marker, ``up`` included, as
Prometheus ends a vanished target's series: queries stop returning it and cost stops billing
it. No restart is needed.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import ssl
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import httpx
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from collector.discovery import TargetChanges, TargetSet
from collector.layout import Layout
from collector.scrape import (
    VERSION_TIMEOUT_S,
    Fetched,
    ScrapeResult,
    StorePoint,
    TargetInfo,
    fetch_once,
    fetch_version,
    parse_fetched,
    points_from_families,
    scrape_series_points,
    stale_points,
    target_end_points,
)
from collector.store import Store
from collector.vllm_families import (
    COMPLETE,
    FamilyCheck,
    VersionAnswer,
    check_families,
    declared_names,
    join_warnings,
)
from vigil.clock import Clock, system_clock
from vigil.config import Config, TargetConfig
from vigil.conventions import KIND_VLLM
from vigil.errors import StoreError
from vigil.model import SeriesKey, TargetHealth

__all__ = ["Collector", "ScrapeWriter", "target_info"]

log = logging.getLogger("vigil.collector")


def target_info(t: TargetConfig) -> TargetInfo:
    """The scrape's view of a configured or discovered target (its labels included)."""
    return TargetInfo(t.name, t.url, t.pool, t.kind, tuple(sorted(t.labels.items())))


def _text_format_body(fetched: Fetched) -> str | None:
    """The body as text when it is in the classic text format (the fast path's only format)."""
    if fetched.body is None or "openmetrics" in (fetched.content_type or ""):
        return None
    try:
        text = fetched.body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if text.rstrip().endswith("# EOF") else text


class ScrapeWriter:
    """Turns fetched bodies into stored points for many targets, on one thread.

    It remembers per target the last scrape's series (for staleness markers) and the layout of
    its exposition (for the repeat-scrape fast path), so it must see every scrape of a target.

    A vLLM target's exposition is checked against the families Vigil reads
    (``collector.vllm_families``) on each full parse; the fast path reads the same series, so
    it reuses the result. An up target's health carries a warning per missing family.
    """

    def __init__(self, store: Store):
        self.store = store
        #: Series written by each target's last scrape, for staleness markers.
        self._last_series: dict[str, list[tuple[SeriesKey, str]]] = {}
        #: The last fully parsed exposition's shape per target, for the repeat-scrape fast path.
        self._layouts: dict[str, Layout] = {}
        #: The timestamp (Unix ms) of each target's last stored scrape.
        self._last_ts: dict[str, int] = {}
        #: Per vLLM target: a hash of the sample names of its last full parse, and what that
        #: exposition lacks. Only a changed set of names is checked again.
        self._families: dict[str, tuple[int, FamilyCheck]] = {}
        #: Per vLLM target that lacks a family: its ``GET /version`` answer, forgotten when
        #: the names change (a new set of names may be another release).
        self._versions: dict[str, VersionAnswer] = {}

    def process(self, target: TargetInfo, fetched: Fetched, now: float) -> TargetHealth:
        """Parse (the fast path when the shape is unchanged) and store one fetch."""
        ts_ms = round(now * 1000)
        layout = self._layouts.get(target.name)
        if fetched.body is not None and layout is not None:
            t0 = time.perf_counter()
            text = _text_format_body(fetched)
            points = layout.read(text, ts_ms) if text is not None else None
            if points is not None:
                duration = fetched.duration + time.perf_counter() - t0
                result = ScrapeResult(target, now, duration, None, "", points)
                return self._write_result(result, points)
        result = parse_fetched(target, fetched, now)
        if result.families is None:
            self._layouts.pop(target.name, None)
            return self._write_result(result, [])
        points = points_from_families(result.families, target, ts_ms)
        if target.kind == KIND_VLLM:
            self._check_families(target.name, points, declared_names(result.families))
        text = _text_format_body(fetched)
        learned = Layout.build(text, points, ts_ms) if text is not None else None
        if learned is None:
            self._layouts.pop(target.name, None)
        else:
            self._layouts[target.name] = learned
        return self._write_result(result, points)

    def _check_families(self, name: str, points: list[StorePoint],
                        declared: frozenset[str] = frozenset()) -> None:
        names = frozenset(key.name for key, _, _, _ in points) | declared
        digest = hash(names)
        known = self._families.get(name)
        if known is None or known[0] != digest:
            self._families[name] = (digest, check_families(names))
            self._versions.pop(name, None)

    def family_check(self, name: str) -> FamilyCheck:
        """What the last full parse of vLLM target ``name`` lacked (nothing when unknown)."""
        known = self._families.get(name)
        return COMPLETE if known is None else known[1]

    def version(self, name: str) -> VersionAnswer | None:
        """What ``GET /version`` answered for target ``name`` since its names last changed."""
        return self._versions.get(name)

    def _warnings(self, name: str) -> str:
        check = self.family_check(name)
        return join_warnings(check.warnings(self._versions.get(name))) if check.missing else ""

    def record_version(self, target: TargetInfo, answer: VersionAnswer,
                       health: TargetHealth) -> TargetHealth:
        """Keep ``answer`` for ``target`` and record ``health`` again with it in the
        warnings (the scrape was stored before the version was asked)."""
        self._versions[target.name] = answer
        if not health.up:
            return health
        health = health._replace(error=self._warnings(target.name))
        self.store.set_target_health(health)
        return health

    def _write_result(self, result: ScrapeResult, points: list[Any]) -> TargetHealth:
        """Points, scrape series, staleness markers and target health in one transaction."""
        name = result.target.name
        ts_ms = round(result.started * 1000)
        current = [(key, ftype) for key, ftype, _, _ in points]
        rows = points + scrape_series_points(result)
        previous = self._last_series.get(name, [])
        if previous and (len(previous) != len(current) or previous != current):
            rows.extend(stale_points(previous, {k for k, _ in current}, ts_ms))
        health = TargetHealth(
            target=name,
            pool=result.target.pool,
            kind=result.target.kind,
            url=result.target.url,
            up=result.up,
            last_scrape=result.started,
            duration=result.duration,
            samples=result.samples,
            # Up, the text is the warnings of the exposition (collector.vllm_families).
            error=result.error if not result.up else self._warnings(name),
        )
        with self.store.transaction():
            self.store.write(rows)
            self.store.set_target_health(health)
        self._last_series[name] = current
        self._last_ts[name] = ts_ms
        return health

    def end_target(self, target: TargetInfo, now: float) -> int:
        """Staleness markers for every series of ``target``'s last scrape (``up`` and
        ``scrape_*`` too), then forget it; the number of markers written (0 when it was never
        scraped here: there is nothing to end, as in Prometheus).

        The markers are stamped ``now`` (Unix seconds), but always after the last sample: a
        marker at the last scrape's own timestamp would replace that sample.
        """
        name = target.name
        previous = self._last_series.pop(name, [])
        self._layouts.pop(name, None)
        self._families.pop(name, None)
        self._versions.pop(name, None)
        last_ms = self._last_ts.pop(name, None)
        if last_ms is None:
            return 0
        rows = target_end_points(previous, target, max(round(now * 1000), last_ms + 1))
        with self.store.transaction():
            self.store.write(rows)
        return len(rows)



class Collector:
    """Scrapes the targets of ``target_set`` (default: one built from ``config``) into the store.

    Use ``await collector.scrape_all()`` for one round (``vigil collect --once``) or
    ``await collector.run(stop)`` to scrape on the schedule until ``stop`` is set.
    ``clock`` gives the sample timestamps (Unix seconds); ``transport`` lets tests plug in
    an httpx transport.
    """

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock = system_clock,
        transport: httpx.AsyncBaseTransport | None = None,
        store_factory: Callable[[], Store] | None = None,
        target_set: TargetSet | None = None,
    ):
        self.config = config
        self.clock = clock
        self.target_set = target_set if target_set is not None else TargetSet(
            config, clock=clock)
        #: The targets being scraped, by name (the target set's, as of its last change).
        self._targets: dict[str, TargetConfig] = {
            n: dt.target for n, dt in self.target_set.current().items()
        }
        self.target_set.subscribe(self._on_changes)
        self._scheduler: AsyncIOScheduler | None = None
        self._discovery_stop: asyncio.Event | None = None
        self._discovery_task: asyncio.Task[None] | None = None
        self._transport = transport
        self._store_factory = store_factory or self._default_store
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vigil-store")
        self._store: Store | None = None
        self._scrape_writer: ScrapeWriter | None = None
        #: One HTTP client per target: httpcore's pool scans every pooled connection on each
        #: request event, so one shared pool makes a scrape round quadratic in the number of
        #: targets (3M scans for 200 targets, measured); a pool per target keeps it linear.
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._tls: ssl.SSLContext | None = None
        self._last_up: dict[str, bool] = {}
        #: The missing families already logged per target: each is logged once, not on every
        #: scrape, and again only after it came back.
        self._logged_missing: dict[str, set[str]] = {}
        self.scrapes = 0
        self._open_lock = asyncio.Lock()
        self._lock_file: IO[bytes] | None = None
        #: Scrapes under way, so that shutdown lets them finish writing instead of cancelling.
        self._inflight: dict[str, asyncio.Task[TargetHealth]] = {}
        #: Compaction gets its own thread and connection: it works in bounded transactions, so
        #: scrape writes interleave with it instead of waiting for the whole compaction.
        self._compactor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vigil-compact")
        self._compact_store: Store | None = None

    def _default_store(self) -> Store:
        s = self.config.store
        return Store(
            self.config.store_path(),
            clock=self.clock,
            raw_retention_s=s.raw_retention,
            downsampled_retention_s=s.downsampled_retention,
            resolution_s=s.resolution,
        )

    async def _in_writer(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)

    async def open(self) -> None:
        """Open the store (on the writer thread: sqlite3 connections belong to a thread).

        Takes an exclusive lock next to the store so that two collectors never write the same
        store (each keeps its own staleness state: both writing would interleave markers).
        """
        async with self._open_lock:
            if self._store is not None:
                return
            self._lock_file = _lock_store(self.config.store_path())
            self._store = await self._in_writer(self._store_factory)
            self._scrape_writer = ScrapeWriter(self._store)
            for h in await self._in_writer(self._store.target_health):
                self._last_up[h.target] = h.up
            self._targets = {n: dt.target for n, dt in self.target_set.current().items()}
            if not self.target_set.refreshed:
                # Read the sources before the first round, so that `collect --once` and the
                # first schedule see the discovered targets too.
                await self.target_set.refresh(force=True)

    @property
    def targets(self) -> list[TargetConfig]:
        """The targets being scraped now: static first, then discovered."""
        return list(self._targets.values())

    def _client(self, target: str) -> httpx.AsyncClient:
        client = self._clients.get(target)
        if client is None:
            if self._tls is None:
                # One TLS context for every target's client: httpx builds one per client
                # otherwise, loading the CA bundle each time (~20 ms: 20 s of a 1,000-target
                # first round, spent on the event loop while other scrapes time out).
                self._tls = httpx.create_ssl_context(trust_env=False)
            client = self._clients[target] = httpx.AsyncClient(
                transport=self._transport, follow_redirects=True, trust_env=False,
                verify=self._tls,
                limits=httpx.Limits(max_connections=2, max_keepalive_connections=1),
            )
        return client

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
        if self._compact_store is not None:
            await asyncio.get_running_loop().run_in_executor(
                self._compactor, self._compact_store.close
            )
            self._compact_store = None
        self._compactor.shutdown(wait=True)
        if self._store is not None:
            await self._in_writer(self._store.close)
            self._store = None
        self._writer.shutdown(wait=True)
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None

    async def __aenter__(self) -> Collector:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- one scrape ------------------------------------------------------------------------
    async def scrape_target(self, t: TargetConfig) -> TargetHealth:
        """Scrape one target now and store the result; never raises for target problems."""
        await self.open()
        now = self.clock()
        fetched = await fetch_once(
            self._client(t.name),
            target_info(t),
            timeout=self.config.scrape_timeout(t),
            max_body_bytes=self.config.collector.max_body_bytes,
        )
        # Parsing is CPU work: it runs on the writer thread, so the loop keeps fetching.
        assert self._scrape_writer is not None  # open() made it
        health = await self._in_writer(self._scrape_writer.process, target_info(t), fetched, now)
        if health.up and t.kind == KIND_VLLM:
            health = await self._missing_families(t, health)
        self.scrapes += 1
        was_up = self._last_up.get(t.name)
        if was_up is not health.up:
            if health.up:
                log.info("target %s is up (%d samples)", t.name, health.samples)
            else:
                log.warning("target %s is down: %s", t.name, health.error)
        self._last_up[t.name] = health.up
        return health

    async def _missing_families(self, t: TargetConfig, health: TargetHealth) -> TargetHealth:
        """Ask the server its version the first time its exposition lacks a family (a healthy
        target costs nothing here), and log each missing family once."""
        writer = self._scrape_writer
        assert writer is not None  # open() made it
        check = writer.family_check(t.name)
        if check.missing and writer.version(t.name) is None:
            answer = await fetch_version(
                self._client(t.name), target_info(t),
                timeout=min(VERSION_TIMEOUT_S, self.config.scrape_timeout(t)))
            health = await self._in_writer(writer.record_version, target_info(t), answer,
                                           health)
        logged = self._logged_missing.get(t.name, set())
        missing = {f.name for f in check.missing}
        for family, text in zip(check.missing, check.warnings(writer.version(t.name)),
                                strict=True):
            if family.name not in logged:
                log.warning("target %s (%s): %s", t.name, t.url, text)
        for name in sorted(logged - missing):
            log.info("target %s (%s): %s is exposed again", t.name, t.url, name)
        if missing:
            self._logged_missing[t.name] = missing
        else:
            self._logged_missing.pop(t.name, None)
        return health

    async def scrape_all(self) -> list[TargetHealth]:
        """Scrape every target once, concurrently; results in config order (static targets,
        then discovered ones)."""
        await self.open()
        return list(await asyncio.gather(*(self.scrape_target(t) for t in self.targets)))

    async def compact(self) -> Any:
        """Downsample and expire old samples, on the compaction thread's own connection."""
        await self.open()
        loop = asyncio.get_running_loop()
        if self._compact_store is None:
            self._compact_store = await loop.run_in_executor(self._compactor, self._store_factory)
        report = await loop.run_in_executor(self._compactor, self._compact_store.compact)
        log.info("compaction: %s", report)
        return report

    # --- the schedule ----------------------------------------------------------------------
    def _offset(self, t: TargetConfig) -> float:
        """A stable offset within the interval, like Prometheus spreads its targets (seconds)."""
        interval = self.config.scrape_interval(t)
        return (zlib.crc32(t.name.encode()) % 10_000) / 10_000 * interval

    async def _start_scrape(self, t: TargetConfig) -> None:
        """Scheduler job: start a scrape task unless the previous one is still running.

        A coroutine so that apscheduler runs it on the loop. It returns at once: the scrape is
        our own task, so shutdown can wait for it to finish writing (apscheduler would cancel
        a coroutine job mid-write).
        """
        running = self._inflight.get(t.name)
        if running is not None and not running.done():
            log.warning("target %s: previous scrape still running; skipping this one", t.name)
            return
        task = asyncio.get_running_loop().create_task(self.scrape_target(t))
        self._inflight[t.name] = task
        task.add_done_callback(_log_unexpected)

    def schedule(self, scheduler: AsyncIOScheduler, now: datetime | None = None) -> None:
        """Add the scrape jobs (one per target) and the compaction job to ``scheduler``.

        `vigil serve` shares one scheduler between the collector and its other jobs; call
        ``await open()`` first and ``await finish()`` after shutting the scheduler down.
        """
        now = datetime.now(UTC) if now is None else now
        self._scheduler = scheduler
        for t in self._targets.values():
            self._add_job(t, now + timedelta(seconds=self._offset(t)))
        # First compaction soon after start: a collector restarted more often than the
        # compaction interval would otherwise never compact.
        scheduler.add_job(
            self.compact,
            "interval",
            seconds=self.config.collector.compact_interval,
            next_run_time=now + timedelta(seconds=60),
            id="compact",
            max_instances=1,
            coalesce=True,
        )
        if self.target_set.has_discovery:
            self._discovery_stop = asyncio.Event()
            self._discovery_task = asyncio.get_running_loop().create_task(
                self.target_set.run(self._discovery_stop))

    def _add_job(self, t: TargetConfig, first: datetime) -> None:
        assert self._scheduler is not None  # schedule() set it
        interval = self.config.scrape_interval(t)
        self._scheduler.add_job(
            self._start_scrape,
            "interval",
            args=[t],
            seconds=interval,
            next_run_time=first,
            id=f"scrape:{t.name}",
            coalesce=True,
            misfire_grace_time=max(1, int(interval)),
        )

    # --- targets that come and go ----------------------------------------------------------
    async def _on_changes(self, changes: TargetChanges) -> None:
        """Apply a change of the target set: end the vanished (and forget their health), start
        the new at once."""
        for dt in changes.removed:
            await self._stop_target(dt.name, end_series=True)
            await self._forget_target(dt.name)
        for dt in changes.changed:
            old = self._targets.get(dt.name)
            same = old is not None and target_info(old).labels() == target_info(
                dt.target).labels()
            first = self._next_run(dt.name) if same else None
            # New labels are new series: the old ones end now, as for a vanished target.
            await self._stop_target(dt.name, end_series=not same)
            self._start_target(dt.target, first)
        for dt in changes.added:
            self._start_target(dt.target)

    def _next_run(self, name: str) -> datetime | None:
        job = self._scheduler.get_job(f"scrape:{name}") if self._scheduler else None
        return None if job is None else job.next_run_time

    def _start_target(self, t: TargetConfig, first: datetime | None = None) -> None:
        self._targets[t.name] = t
        if self._scheduler is not None:
            # At once rather than at its offset: a new replica is billed and watched from
            # its first scrape; later scrapes follow every interval from this one.
            self._add_job(t, first or datetime.now(UTC))
            log.info("target %s (%s, pool %s) added", t.name, t.url, t.pool)

    async def _stop_target(self, name: str, *, end_series: bool) -> None:
        """Stop scraping ``name``; after its scrape under way is stored, end its series."""
        old = self._targets.pop(name, None)
        if self._scheduler is not None:
            with suppress(JobLookupError):
                self._scheduler.remove_job(f"scrape:{name}")
        task = self._inflight.pop(name, None)
        if task is not None and not task.done():
            await asyncio.wait([task], timeout=self.config.collector.scrape_timeout + 5)
        markers = 0
        if end_series and old is not None and self._scrape_writer is not None:
            markers = await self._in_writer(self._scrape_writer.end_target, target_info(old),
                                            self.clock())
        client = self._clients.pop(name, None)
        if client is not None:
            await client.aclose()
        self._last_up.pop(name, None)
        self._logged_missing.pop(name, None)
        if end_series and old is not None:
            log.info("target %s (%s) removed: %d series ended", name, old.url, markers)

    async def _forget_target(self, name: str) -> None:
        """Drop a vanished target's health record (after its staleness markers), so that the
        dashboard and ``vigil targets`` stop listing it; its samples stay."""
        if self._store is None:
            return
        try:
            await self._in_writer(self._store.forget_target, name)
        except StoreError as exc:  # the next removals must still be applied
            log.warning("target %s removed, but its health record stays: %s", name, exc)

    async def finish(self) -> None:
        """Stop following the target set, then wait for the scrapes under way to finish
        writing (after the scheduler stopped)."""
        if self._discovery_task is not None:
            assert self._discovery_stop is not None
            self._discovery_stop.set()
            await asyncio.wait([self._discovery_task],
                               timeout=self.config.collector.scrape_timeout + 10)
            self._discovery_task = None
        self._scheduler = None
        pending = [t for t in self._inflight.values() if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.config.collector.scrape_timeout + 5)

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape on schedule (apscheduler) until ``stop`` is set, then shut down cleanly."""
        await self.open()
        scheduler = AsyncIOScheduler(timezone=UTC)
        self.schedule(scheduler)
        scheduler.start()
        try:
            await stop.wait()
        finally:
            scheduler.shutdown(wait=False)
            # Let scrapes already under way finish writing: nothing half-stored.
            await self.finish()


def _log_unexpected(task: asyncio.Task[TargetHealth]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("scrape failed unexpectedly", exc_info=task.exception())


def _lock_store(path: Path) -> IO[bytes]:
    """An exclusive, non-blocking flock on ``<store>.lock``; ``StoreError`` if already held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    f = open(lock_path, "a+b")  # noqa: SIM115 - held for the collector's lifetime
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise StoreError(
            f"{path}: another `vigil collect` is already writing to this store "
            f"(lock {lock_path} is held); stop it first, or give this one another [store] path"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n".encode())
    f.flush()
    return f
