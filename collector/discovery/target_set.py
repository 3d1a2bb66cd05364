"""The set of targets to scrape: the static ``[[targets]]`` plus what ``[[discovery]]`` finds.

``TargetSet.refresh`` reads each source whose ``refresh_interval`` is due, turns the groups
into targets and publishes what changed to its subscribers (the collector, the gateway).
The rules, Prometheus's where it has one:

* a target's name is its address (``host:port``, Prometheus's ``instance``) or its group's
  ``instance`` label; a clash with another target of a different URL adds the metrics path
  (``10.0.0.5:8000/dcgm/metrics``), and a further clash a ``#2``;
* the group's ``pool_label`` label names the pool (default: the entry's ``pool``), its
  ``kind`` label the kind (default: the entry's ``kind``); ``__scheme__`` and
  ``__metrics_path__`` override the entry's scheme and path, as in Prometheus;
* the group's other labels become series labels, except ``__``-prefixed ones (internal
  metadata), empty values (absent, in Prometheus) and those Vigil sets itself (instance, pool,
  kind);
* a target with no pool, an unknown pool or kind, or a malformed address is skipped, logged
  once and reported in ``errors()``;
* a static target wins over a discovered one at the same address with the same kind, and
  the same URL found twice is one target (the first found; a second one with another pool
  or kind is reported).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path

import httpx
from pydantic import ValidationError

from collector.discovery.dns import DnsSource, join_host_port
from collector.discovery.file_sd import FileSource
from collector.discovery.http_sd import HttpSource
from collector.discovery.model import (
    ORIGIN_STATIC,
    DiscoveredTarget,
    Source,
    TargetChanges,
    TargetGroup,
)
from vigil.clock import Clock, system_clock
from vigil.config import Config, DiscoveryConfig, TargetConfig
from vigil.conventions import LABEL_INSTANCE, LABEL_KIND, TARGET_KINDS, TARGET_LABELS
from vigil.errors import ConfigError

__all__ = ["TargetSet", "address_of"]

log = logging.getLogger("vigil.discovery")

#: The refresh loop looks at the clock at least this often (seconds), so that an injected
#: clock moved by a test is noticed promptly; a check with nothing due costs nothing.
MAX_WAIT_S = 1.0

_DEFAULT_PORTS = {"http": 80, "https": 443}

Callback = Callable[[TargetChanges], Awaitable[None] | None]


def address_of(url: str) -> str:
    """The ``host:port`` a URL connects to (the scheme's default port when it has none)."""
    u = httpx.URL(url)
    return join_host_port(u.host, u.port or _DEFAULT_PORTS.get(u.scheme, 80))


class TargetSet:
    """Static and discovered targets, refreshed on each source's interval.

    ``clock`` decides when a source is due (Unix seconds); ``http_client`` is used for
    http_sd when given (it stays open; otherwise each read opens its own).
    Raises ``ConfigError`` for a ``[[discovery]]`` entry that cannot work (a file_sd file
    that is neither JSON nor YAML, a malformed nameserver).
    """

    def __init__(self, config: Config, *, clock: Clock = system_clock,
                 http_client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.clock = clock
        base = Path(config.source).resolve().parent if config.source else Path.cwd()
        try:
            self._sources: list[Source] = [
                _make_source(d, i, base, http_client) for i, d in enumerate(config.discovery)
            ]
        except ConfigError as exc:
            raise ConfigError(exc.reason, file=config.source or None, key=exc.key) from None
        self._due = [-math.inf] * len(self._sources)
        self._static = {t.name: DiscoveredTarget(t, ORIGIN_STATIC) for t in config.targets}
        self._current: dict[str, DiscoveredTarget] = dict(self._static)
        self._target_problems: dict[str, list[str]] = {d.name: [] for d in config.discovery}
        self._logged: dict[str, set[str]] = {d.name: set() for d in config.discovery}
        self._subscribers: list[Callback] = []
        self._lock = asyncio.Lock()
        #: Whether every source has been read at least once.
        self.refreshed = not self._sources

    @property
    def has_discovery(self) -> bool:
        """Whether any ``[[discovery]]`` source is configured (else the set never changes)."""
        return bool(self._sources)

    def current(self) -> dict[str, DiscoveredTarget]:
        """Every target now, by name: the static ones first (config order), then the
        discovered ones (sources in config order)."""
        return dict(self._current)

    def subscribe(self, callback: Callback) -> None:
        """Call ``callback(changes)`` (awaited when it returns an awaitable) after every
        refresh that changed something, in order; an exception in it is logged."""
        self._subscribers.append(callback)

    def errors(self) -> dict[str, str]:
        """Per ``[[discovery]]`` name, the last read's problems ("" when it read fine):
        sources that could not be read and targets that were skipped."""
        return {
            s.config.name: "; ".join([*s.problems, *self._target_problems[s.config.name]])
            for s in self._sources
        }

    def next_due(self) -> float | None:
        """Unix seconds when the next source is due, None without discovery."""
        return min(self._due) if self._due else None

    async def refresh(self, *, force: bool = False) -> TargetChanges:
        """Read each source whose refresh interval is due (every one with ``force``),
        publish what changed to the subscribers, and return it."""
        async with self._lock:
            now = self.clock()
            due = [i for i in range(len(self._sources)) if force or now >= self._due[i]]
            if not due:
                return TargetChanges()
            await asyncio.gather(*(self._read(self._sources[i]) for i in due))
            for i in due:
                self._due[i] = now + self._sources[i].config.refresh_interval
            self.refreshed = True
            new, self._target_problems = self._build()
            changes = _diff(self._current, new)
            self._current = new
            self._log_problems()
            if changes:
                log.info("targets: %d added, %d removed, %d changed (%d in all)",
                         len(changes.added), len(changes.removed), len(changes.changed),
                         len(new))
                await self._publish(changes)
            return changes

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh on each source's interval until ``stop`` is set."""
        if not self._sources:
            await stop.wait()
            return
        while not stop.is_set():
            try:
                await self.refresh()
            except Exception:
                log.exception("target discovery failed unexpectedly")
            wait = min(self._due) - self.clock()
            with suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(max(wait, 0.01), MAX_WAIT_S))

    # --- internals -------------------------------------------------------------------------
    async def _read(self, source: Source) -> None:
        try:
            await source.read()
        except Exception as exc:  # a source must not stop the others
            log.exception("discovery %s: read failed", source.config.name)
            source.problems = [f"unexpected error: {type(exc).__name__}: {exc}"]

    async def _publish(self, changes: TargetChanges) -> None:
        for callback in list(self._subscribers):
            try:
                result = callback(changes)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("a subscriber of target changes failed")

    def _log_problems(self) -> None:
        for s in self._sources:
            name = s.config.name
            now = [*s.problems, *self._target_problems[name]]
            for p in now:
                if p not in self._logged[name]:
                    log.warning("discovery %s (%s): %s", name, s.config.mechanism, p)
            if self._logged[name] and not now:
                log.info("discovery %s (%s): read fine again", name, s.config.mechanism)
            self._logged[name] = set(now)

    def _build(self) -> tuple[dict[str, DiscoveredTarget], dict[str, list[str]]]:
        """Every target from the sources' current groups, and the skipped ones' problems."""
        out = dict(self._static)
        static_at = {(address_of(t.url), t.kind) for t in self.config.targets}
        by_url = {dt.target.url: dt for dt in self._static.values()}
        problems: dict[str, list[str]] = {s.config.name: [] for s in self._sources}
        pools = [p.name for p in self.config.pools]
        for s in self._sources:
            d = s.config
            for key, groups in s.groups.items():
                origin = f"{d.mechanism} {d.name} ({key})"
                for group in groups:
                    for address in group.targets:
                        made = _target(d, group, address, pools)
                        if isinstance(made, str):
                            problems[d.name].append(f"{key}: target {address!r}: {made}")
                            continue
                        if (address_of(made.url), made.kind) in static_at:
                            continue  # the static target is this one
                        first = by_url.get(made.url)
                        if first is not None:
                            t = first.target
                            if (t.pool, t.kind) != (made.pool, made.kind):
                                problems[d.name].append(
                                    f"{key}: target {address!r}: {made.url} is also "
                                    f"{first.origin} (pool {t.pool!r}, kind {t.kind!r}); "
                                    "that one is kept")
                            continue
                        name = _unique_name(made.name, made.url, out)
                        if name != made.name:
                            made = made.model_copy(update={"name": name})
                        out[name] = by_url[made.url] = DiscoveredTarget(made, origin)
        return out, problems


def _make_source(d: DiscoveryConfig, index: int, base: Path,
                 client: httpx.AsyncClient | None) -> Source:
    if d.mechanism == "file_sd":
        return FileSource(d, base=base, index=index)
    if d.mechanism == "http_sd":
        return HttpSource(d, client=client)
    return DnsSource(d, index=index)


def _target(d: DiscoveryConfig, group: TargetGroup, address: str,
            pools: list[str]) -> TargetConfig | str:
    """The target ``address`` of ``group`` becomes, or why it is skipped."""
    labels = dict(group.labels)
    if not address or "/" in address or any(c.isspace() for c in address):
        return "not a host:port address"
    pool = labels.get(d.pool_label) or d.pool
    if not pool:
        return (f"no pool: the group has no {d.pool_label!r} label and the [[discovery]] "
                "entry sets no pool")
    if pool not in pools:
        known = ", ".join(repr(p) for p in pools) or "none defined"
        return f"pool {pool!r} does not exist (pools: {known})"
    kind = labels.get(LABEL_KIND) or d.kind
    if kind not in TARGET_KINDS:
        return f"kind {kind!r} is neither vllm nor dcgm"
    scheme = labels.get("__scheme__") or d.scheme
    path = labels.get("__metrics_path__") or d.metrics_path
    if scheme not in _DEFAULT_PORTS:
        return f"__scheme__ {scheme!r} is neither http nor https"
    if not path.startswith("/"):
        path = "/" + path
    series = {k: v for k, v in labels.items()
              if v and not k.startswith("__") and k != d.pool_label and k not in TARGET_LABELS}
    try:
        return TargetConfig(
            name=labels.get(LABEL_INSTANCE) or address,
            url=f"{scheme}://{address}{path}",
            pool=pool,
            kind=kind,
            scrape_interval=d.scrape_interval,
            scrape_timeout=d.scrape_timeout,
            labels=series,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        return str(err["msg"]).removeprefix("Value error, ")


def _unique_name(name: str, url: str, taken: dict[str, DiscoveredTarget]) -> str:
    if name not in taken:
        return name
    with_path = name + httpx.URL(url).path
    candidate, n = with_path, 2
    while candidate in taken:
        candidate, n = f"{with_path}#{n}", n + 1
    return candidate


def _diff(old: dict[str, DiscoveredTarget], new: dict[str, DiscoveredTarget]) -> TargetChanges:
    return TargetChanges(
        added=tuple(t for n, t in new.items() if n not in old),
        removed=tuple(t for n, t in old.items() if n not in new),
        changed=tuple(t for n, t in new.items() if n in old and old[n].target != t.target),
    )
