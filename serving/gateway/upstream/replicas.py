"""The pools' upstream replicas: health and load polling, and least-outstanding routing.

A pool's replicas are its ``kind = "vllm"`` targets (``TargetConfig.api_base``): the static
``[[targets]]``, and, with ``[[discovery]]`` sources, the targets a ``TargetSet`` finds, followed
as they come and go without a restart (``Upstreams`` runs the set's refresh loop itself, on the
gateway's event loop, so the gateway needs no collector):

* an added replica is polled at once and is routable as soon as that poll says healthy (a
  replica is never routed to before a good poll, as at start: an unready vLLM server would
  only fail the requests sent to it);
* a removed one leaves routing at once; requests already on it, streams included, finish on
  their own connections, which are closed when the last one ends (it "drains");
* a changed one keeps its state when only its metrics URL moved; a new API base or pool makes
  it a new replica (polled before it is routed to), the old one draining as if removed.

Every
``[gateway] health_interval`` each replica's ``GET /health`` and ``GET /metrics`` are fetched
concurrently; a replica is healthy while both answer (a request that cannot connect marks it
down at once, the next good poll brings it back). Only the three gauges routing needs are asked
for (``/metrics?name[]=...``, prometheus_client's filter, which vLLM's endpoint inherits) and the
answer goes through ``collector.exposition.parse``; a server that ignores the filter still
parses, only slower.

Routing: among healthy replicas whose KV-cache usage is at most ``max_kv_usage`` (unknown usage
counts as room), the one with the fewest requests this gateway has in flight; ties rotate
(``[gateway] routing = "least_outstanding"``). With ``prefix_aware`` (the default) a chat or
completions request whose prompt a replica holds goes there instead, within bounds on load and
TTFT (``routing`` says how); the poll then also reads ``vllm:cache_config_info`` (the KV
cache's size) and ``process_start_time_seconds`` (a restart empties the cache).

Connections: requests to a replica go through its ``http_client.ReplicaConnections`` (its
own keep-alive connections, opened by ``start``; why not httpx is said there); the polls use
httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from collector.discovery import ORIGIN_STATIC, TargetSet
from collector.exposition import normalise_vllm_names, parse
from serving.gateway.accounting import ShareLedger, gpu_cost_per_second
from serving.gateway.errors import NoReplica
from serving.gateway.tiers import PoolLoad
from serving.gateway.upstream.http_client import ReplicaConnections
from serving.gateway.upstream.prompt_key import PromptKey, prompt_key
from serving.gateway.upstream.routing import (
    ReplicaRouting,
    Sent,
    choose_replica,
    threshold_for,
    ttft_thresholds,
    uncached_tokens,
)
from vigil.clock import Clock, system_clock
from vigil.config import Config, TargetConfig
from vigil.conventions import (
    GATEWAY_POLLED_SERIES,
    KIND_VLLM,
    SCRAPE_ACCEPT,
    VLLM_KV_CACHE_USAGE,
    VLLM_PREFIX_CACHE_QUERIES,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
)
from vigil.errors import ParseError

__all__ = ["Replica", "TargetSource", "Upstreams"]

log = logging.getLogger("vigil.gateway.upstreams")

_USER_AGENT = "vigil-gateway/0.1"
_METRICS_QUERY = [("name[]", n) for n in GATEWAY_POLLED_SERIES]
#: What prefix-aware routing also reads: the KV cache's size (an info gauge whose labels
#: carry ``num_gpu_blocks`` and ``block_size``), and two signs of a restart, which empties the
#: cache: the server's start time, and a counter going back (the start time is missing where
#: the filter or a multiprocess registry leaves the process collector out).
_CACHE_CONFIG_INFO = "vllm:cache_config_info"
_PROCESS_START = "process_start_time_seconds"
_RESTART_COUNTER = VLLM_PREFIX_CACHE_QUERIES
_PREFIX_METRICS_QUERY = [*_METRICS_QUERY, *(("name[]", n) for n in (
    _CACHE_CONFIG_INFO, _PROCESS_START, _RESTART_COUNTER))]
#: A poll answer larger than this is refused (bytes): the three gauges take a few hundred.
_MAX_POLL_BYTES = 8 * 1024 * 1024
#: Seconds an idle upstream connection is kept: below uvicorn's (so vLLM's) 5 s keep-alive, so
#: the gateway never sends a request on a connection the replica is about to close.
KEEPALIVE_S = 4.0
#: What every request upstream carries: the body is relayed byte for byte, never decompressed.
_REQUEST_HEADERS = {"User-Agent": _USER_AGENT, "Content-Type": "application/json",
                    "Accept-Encoding": "identity"}
#: Seconds between two looks at a draining replica's in-flight count: its connections close
#: at most this long after its last request ends.
_DRAIN_CHECK_S = 0.25
#: Seconds before a discovery loop that failed is started again, and that a stopping one gets
#: to return before it is cancelled.
_DISCOVERY_RESTART_S = 5.0


class TargetSource(Protocol):
    """What ``Upstreams`` needs of ``collector.discovery.TargetSet``: the targets found now
    (name -> ``DiscoveredTarget``, each with ``.target`` and ``.origin``), change callbacks
    (``TargetChanges`` with ``added``, ``removed``, ``changed``), a refresh and its loop."""

    def current(self) -> Mapping[str, Any]: ...

    def subscribe(self, callback: Callable[[Any], Awaitable[None] | None]) -> Any: ...

    async def refresh(self, *, force: bool = False) -> Any: ...

    async def run(self, stop: asyncio.Event) -> Any: ...


@dataclass(eq=False)
class Replica:
    """One upstream vLLM server of a pool and what the gateway knows about it."""

    name: str
    pool: str
    api_base: str
    metrics_url: str
    #: USD per second the replica costs (GPUs x hourly price / 3600).
    cost_per_second: float
    healthy: bool = False
    #: vllm:kv_cache_usage_perc (mean over its engines, ratio 0-1), waiting and running
    #: requests (sums), from the last good poll; None when the server does not export them.
    kv_usage: float | None = None
    waiting: int | None = None
    running: int | None = None
    last_error: str = ""
    ledger: ShareLedger = field(default_factory=ShareLedger)
    #: The replica's keep-alive connections for requests; open from ``Upstreams.start`` (or
    #: its arrival, if later) to ``Upstreams.aclose`` (or the end of its draining).
    connections: ReplicaConnections | None = None
    #: Where it came from: ``static`` (``[[targets]]``) or the discovery source that found it.
    origin: str = ORIGIN_STATIC
    #: Out of routing (removed from discovery, or replaced): only its in-flight requests use
    #: it until they end.
    draining: bool = False
    #: What prefix-aware routing knows of it (``routing.ReplicaRouting``).
    routing: ReplicaRouting = field(default_factory=ReplicaRouting)

    @property
    def outstanding(self) -> int:
        """Requests this gateway has in flight on the replica."""
        return self.ledger.in_flight

    def mark_down(self, reason: str) -> None:
        """Take the replica out of routing until the next good poll."""
        if self.healthy:
            log.warning("replica %s of pool %s marked down: %s", self.name, self.pool, reason)
        self.healthy = False
        self.last_error = reason


class Upstreams:
    """Every pool's replicas, polled in the background; ``pick`` routes, ``load`` summarises."""

    def __init__(self, cfg: Config, *, monotonic: Callable[[], float] = time.perf_counter,
                 transport: httpx.AsyncBaseTransport | None = None,
                 targets: TargetSource | None = None, clock: Clock = system_clock) -> None:
        """``targets``: the discovered targets to follow; default: a ``TargetSet`` of the
        config's ``[[discovery]]`` sources (on ``clock``, Unix seconds) when there are any,
        else none (static replicas only)."""
        gw = cfg.gateway
        self._cfg = cfg
        self._monotonic = monotonic
        self._interval = gw.health_interval
        self._max_kv = gw.max_kv_usage
        self.prefix_aware = gw.routing == "prefix_aware"
        self._metrics_query = _PREFIX_METRICS_QUERY if self.prefix_aware else _METRICS_QUERY
        #: (pool, endpoint) -> TTFT SLO threshold (seconds) prefix-aware routing keeps to.
        self._ttft = ttft_thresholds(cfg) if self.prefix_aware else {}
        self._connect_timeout = gw.connect_timeout
        # Reads of a stream may pause for long between tokens: only a silent upstream times out.
        self._read_timeout = gw.read_timeout
        poll_timeout = max(1.0, gw.health_interval)
        self._poll_client = httpx.AsyncClient(
            timeout=httpx.Timeout(poll_timeout, connect=min(poll_timeout, gw.connect_timeout)),
            headers={"User-Agent": _USER_AGENT, "Accept": SCRAPE_ACCEPT},
            transport=transport, follow_redirects=False)
        #: The routable replicas of every pool (draining ones are not here).
        self.pools: dict[str, list[Replica]] = {p.name: [] for p in cfg.pools}
        self._by_name: dict[str, Replica] = {}
        self._started = False
        for t in cfg.targets:
            if t.kind == KIND_VLLM:
                self._add(t, ORIGIN_STATIC)
        self._rotation: dict[str, int] = dict.fromkeys(self.pools, 0)
        self._refreshed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._targets = targets if targets is not None else (
            TargetSet(cfg, clock=clock) if cfg.discovery else None)
        self._discovery: asyncio.Task[None] | None = None
        self._stop_discovery: asyncio.Event | None = None
        #: Replicas out of routing whose last requests are still running, and their drains.
        self._draining: dict[Replica, asyncio.Task[None]] = {}

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the replicas' connection pools, read the discovered targets once, poll every
        replica once (so routing starts informed), then keep polling and following
        discovery."""
        self._started = True
        for r in self.replicas():
            self._open(r)
        if self._targets is not None:
            targets = self._targets
            # Subscribed before anything is read, so no change falls between the two.
            targets.subscribe(self._on_changes)
            self._take_in(targets.current().values())
            try:
                await targets.refresh()
            except Exception:  # the static replicas serve; the loop tries again
                log.exception("reading the discovered targets failed")
        for r in self.replicas():
            log.info("replica %s of pool %s (%s): %s", r.name, r.pool, r.origin, r.api_base)
        await self.poll_once()
        self._task = asyncio.create_task(self._loop(), name="gateway-upstream-poll")
        if self._targets is not None:
            self._stop_discovery = asyncio.Event()
            self._discovery = asyncio.create_task(self._discover(self._targets),
                                                  name="gateway-discovery")

    @property
    def targets(self) -> TargetSource | None:
        """The discovered targets followed (None: static replicas only)."""
        return self._targets

    def _open(self, r: Replica) -> None:
        if r.connections is None:  # made here: it belongs to the running event loop
            # No cap on connections: each in-flight stream holds one; the tiers and the
            # pool's own queue are the limits, not a hidden pool timeout here.
            r.connections = ReplicaConnections(
                r.api_base, connect_timeout=self._connect_timeout,
                read_timeout=self._read_timeout, keepalive=KEEPALIVE_S,
                headers=_REQUEST_HEADERS)

    async def aclose(self) -> None:
        """Stop following discovery, stop polling, and close every connection (draining
        replicas' included: the server is stopping)."""
        if self._discovery is not None and self._stop_discovery is not None:
            self._stop_discovery.set()
            done, _ = await asyncio.wait({self._discovery}, timeout=_DISCOVERY_RESTART_S)
            if not done:
                self._discovery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._discovery
            self._discovery = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        drains = list(self._draining.values())
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
        await self._poll_client.aclose()
        for r in self.replicas():
            if r.connections is not None:
                await r.connections.aclose()
                r.connections = None
        self._started = False

    async def _discover(self, targets: TargetSource) -> None:
        """The target set's refresh loop, until ``aclose``; restarted if it fails."""
        stop = self._stop_discovery or asyncio.Event()
        while not stop.is_set():
            try:
                await targets.run(stop)
            except Exception:  # the replicas known so far keep serving meanwhile
                log.exception("target discovery failed; trying again in %g s",
                              _DISCOVERY_RESTART_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _DISCOVERY_RESTART_S)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.poll_once()
            except Exception:  # never let one bad round stop health checks
                log.exception("upstream poll round failed")

    # --- the fleet as discovery sees it ---------------------------------------------------

    def _add(self, t: TargetConfig, origin: str) -> Replica | None:
        """A new routable-once-healthy replica for target ``t`` (None: not one for the
        gateway)."""
        if t.kind != KIND_VLLM:
            return None
        if t.pool not in self.pools:
            log.warning("target %s (%s) names pool %r, which the config does not have: "
                        "ignored", t.name, origin, t.pool)
            return None
        r = Replica(name=t.name, pool=t.pool, api_base=t.api_base, metrics_url=t.url,
                    cost_per_second=gpu_cost_per_second(self._cfg, t.pool),
                    ledger=ShareLedger(monotonic=self._monotonic), origin=origin)
        self.pools[t.pool].append(r)
        self._by_name[t.name] = r
        if self._started:
            self._open(r)
            log.info("replica %s of pool %s joined (%s): %s", r.name, r.pool, origin,
                     r.api_base)
        return r

    def _remove(self, name: str) -> None:
        """Take replica ``name`` out of routing now; close its connections once its last
        request ends."""
        r = self._by_name.pop(name, None)
        if r is None:
            return
        self.pools[r.pool].remove(r)
        r.draining = True
        r.routing.forget()
        log.info("replica %s of pool %s left (%s); %d request(s) still on it", r.name,
                 r.pool, r.origin, r.outstanding)
        if r.connections is not None:
            self._draining[r] = asyncio.create_task(self._drain(r),
                                                    name=f"gateway-drain-{r.name}")

    async def _drain(self, r: Replica) -> None:
        try:
            while r.outstanding:
                await asyncio.sleep(_DRAIN_CHECK_S)
        finally:
            self._draining.pop(r, None)
            if r.connections is not None:
                await r.connections.aclose()
                r.connections = None

    def _change(self, t: TargetConfig, origin: str) -> Replica | None:
        """Target ``t`` is known under its name with something else changed; the replica to
        poll before it is routed to (None: none, or the same one, kept as it is)."""
        r = self._by_name.get(t.name)
        if r is None:
            return self._add(t, origin)
        if t.kind != KIND_VLLM:
            self._remove(t.name)
            return None
        r.origin = origin
        if t.pool == r.pool and t.api_base == r.api_base:
            r.metrics_url = t.url  # the next poll reads it; in-flight requests are unaffected
            return None
        # Requests on the old address finish there; the new one is routed to once polled.
        self._remove(t.name)
        return self._add(t, origin)

    def _take_in(self, found: Iterable[Any]) -> None:
        """Take in the target set's targets (``DiscoveredTarget``): the static ones are
        already here (they only get their origin), the others join (``start`` polls them)."""
        for d in found:
            self._change(d.target, d.origin)

    async def _on_changes(self, changes: Any) -> None:
        """Apply a ``TargetChanges``: removed ones leave routing now, added and changed ones
        are polled at once and routable as soon as they answer healthy."""
        for d in changes.removed:
            self._remove(d.target.name)
        fresh: list[Replica] = []
        for d in changes.changed:
            r = self._change(d.target, d.origin)
            if r is not None:
                fresh.append(r)
        for d in changes.added:
            r = self._change(d.target, d.origin)  # a name already known is a change
            if r is not None:
                fresh.append(r)
        if fresh and self._started:
            await asyncio.gather(*(self._poll(r) for r in fresh))
            self._wake()

    # --- polling ----------------------------------------------------------------------------

    async def poll_once(self) -> None:
        """Poll every replica now, then wake whoever waits for fresh load figures."""
        replicas = [r for rs in self.pools.values() for r in rs]
        await asyncio.gather(*(self._poll(r) for r in replicas))
        self._wake()

    def _wake(self) -> None:
        """Wake whoever waits for fresh load figures (``wait_refresh``)."""
        event, self._refreshed = self._refreshed, asyncio.Event()
        event.set()

    async def _get(self, url: str, **kwargs: object) -> httpx.Response:
        try:
            return await self._poll_client.get(url, **kwargs)  # type: ignore[arg-type]
        except httpx.RemoteProtocolError as exc:
            # The replica closed the kept-alive connection as we reused it (its keep-alive
            # timeout racing our poll interval): nothing was answered, so the GET is retried
            # once on a new connection, as the collector does (collector.scrape.fetch).
            if "without sending a response" not in str(exc):
                raise
            return await self._poll_client.get(url, **kwargs)  # type: ignore[arg-type]

    async def _poll(self, r: Replica) -> None:
        try:
            health, metrics = await asyncio.gather(
                self._get(f"{r.api_base}/health"),
                self._get(r.metrics_url, params=self._metrics_query))
        except httpx.HTTPError as exc:
            r.mark_down(f"poll failed: {type(exc).__name__}: {exc}".rstrip(": "))
            return
        if health.status_code != 200:
            r.mark_down(f"/health answered {health.status_code}")
            return
        if metrics.status_code != 200 or len(metrics.content) > _MAX_POLL_BYTES:
            r.mark_down(f"/metrics answered {metrics.status_code} "
                        f"({len(metrics.content)} bytes)")
            return
        try:
            families = normalise_vllm_names(parse(
                metrics.content, content_type=metrics.headers.get("content-type"),
                source=r.name))
        except ParseError as exc:
            r.mark_down(f"/metrics unreadable: {exc}")
            return
        values: dict[str, list[float]] = {}
        for fam in families:
            if fam.name in GATEWAY_POLLED_SERIES:
                values[fam.name] = [float(s.value) for s in fam.samples if s.name == fam.name]
        kv = values.get(VLLM_KV_CACHE_USAGE)
        waiting = values.get(VLLM_REQUESTS_WAITING)
        running = values.get(VLLM_REQUESTS_RUNNING)
        r.kv_usage = sum(kv) / len(kv) if kv else None
        r.waiting = round(sum(waiting)) if waiting else None
        r.running = round(sum(running)) if running else None
        if self.prefix_aware:
            self._cache_facts(r, families)
        if not r.healthy:
            log.info("replica %s of pool %s is healthy", r.name, r.pool)
        r.healthy = True
        r.last_error = ""

    def _cache_facts(self, r: Replica, families: Iterable[Any]) -> None:
        """Take the KV cache's size and the signs of a restart from a good poll; forget what
        was sent to a replica whose cache is empty again (its start time changed or its
        counter went back, or it comes back from down with neither to tell)."""
        capacity = 0
        start: float | None = None
        queries: float | None = None
        for fam in families:
            for s in fam.samples:
                if s.name == _CACHE_CONFIG_INFO:
                    # One sample per engine, each with its own cache; "None" when unset.
                    with contextlib.suppress(KeyError, ValueError):
                        capacity += int(s.labels["num_gpu_blocks"]) * int(s.labels["block_size"])
                elif s.name == _PROCESS_START:
                    start = float(s.value)
                elif s.name == _RESTART_COUNTER:
                    queries = (queries or 0.0) + float(s.value)
        state = r.routing
        if capacity > 0:
            state.set_capacity(capacity)
        restarted = ((state.start_time is not None and start is not None
                      and start != state.start_time)
                     or (state.counter is not None and queries is not None
                         and queries < state.counter))
        if restarted or (start is None and queries is None and not r.healthy):
            if state.chunks:
                log.info("replica %s of pool %s %s: its prefix cache is empty", r.name, r.pool,
                         "restarted" if restarted else "is back")
            state.forget()
        # A poll without a sign keeps the last one: else the next poll would compare nothing.
        if start is not None:
            state.start_time = start
        if queries is not None:
            state.counter = queries

    async def wait_refresh(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the next poll round; True if one finished."""
        if timeout <= 0:
            return False
        try:
            await asyncio.wait_for(self._refreshed.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # --- what admission and routing ask -----------------------------------------------------

    def load(self, pool: str) -> PoolLoad:
        """The pool's load from the last poll: mean KV usage and summed queue of healthy
        replicas (None when none of them reports it)."""
        healthy = [r for r in self.pools.get(pool, ()) if r.healthy]
        kv = [r.kv_usage for r in healthy if r.kv_usage is not None]
        waiting = [r.waiting for r in healthy if r.waiting is not None]
        return PoolLoad(kv_cache_usage=sum(kv) / len(kv) if kv else None,
                        queue_length=sum(waiting) if waiting else None,
                        healthy_replicas=len(healthy))

    def routable(self, pool: str) -> bool:
        """Some healthy replica of ``pool`` has KV-cache room."""
        return any(self._has_room(r) for r in self.pools.get(pool, ()))

    def no_replica(self, pool: str, *, retry_after: int) -> NoReplica:
        """The 503 for a request of ``pool`` no replica can take; it says when the pool has
        no replica at all (every one removed from discovery, say)."""
        return NoReplica(pool, retry_after=retry_after, empty=not self.pools.get(pool))

    def _has_room(self, r: Replica) -> bool:
        return r.healthy and (r.kv_usage is None or r.kv_usage <= self._max_kv)

    def pick(self, pool: str, *, beyond_kv_limit: bool = False,
             exclude: Replica | None = None, prompt: PromptKey | None = None
             ) -> Replica | None:
        """The replica a new request of ``pool`` goes to, or None (``routing.choose_replica``).

        Least outstanding among healthy replicas with KV room; with ``beyond_kv_limit``
        (premium), the healthy replica with the least KV usage when none has room. With
        prefix-aware routing and a ``prompt``, the replica holding most of it, within the
        load bound and the TTFT SLO (``routing`` says what happens past it); least
        outstanding when none holds enough of it, ties placed by rendezvous on the prompt.
        Each call moves the pool's rotation on by one.
        """
        replicas = self.pools.get(pool, [])
        if not replicas:
            return None
        start = self._rotation[pool] = (self._rotation[pool] + 1) % len(replicas)
        by_prefix = prompt is not None and self.prefix_aware
        chosen, how = choose_replica(
            replicas, start, has_room=self._has_room, exclude=exclude,
            beyond_kv_limit=beyond_kv_limit, prompt=prompt if by_prefix else None,
            ttft_objective_s=(threshold_for(self._ttft, pool, prompt.endpoint)
                              if by_prefix and prompt is not None else None))
        if chosen is not None and how == "prefix":
            chosen.routing.prefix_routed += 1
        elif chosen is not None and how == "load":
            chosen.routing.load_routed += 1
        return chosen

    def prompt_of(self, endpoint: str, body: Mapping[str, Any]) -> PromptKey | None:
        """The prompt of a request to route by (``prompt_key.prompt_key``); None when routing
        is least outstanding (nothing is hashed then)."""
        return prompt_key(endpoint, body) if self.prefix_aware else None

    def sent(self, replica: Replica, prompt: PromptKey) -> Sent:
        """``prompt`` is being sent to ``replica``: remember its chunks there, and count its
        uncached tokens as prefill waiting there until ``Sent.settle``."""
        state = replica.routing
        tokens = uncached_tokens(prompt, state.matched(prompt.hashes))
        added = state.record(prompt.hashes)
        ticket = Sent(state, tokens, state.pending_tokens, self._monotonic, self._monotonic(),
                      added)
        state.pending_tokens += tokens
        return ticket

    def replicas(self) -> list[Replica]:
        """Every routable replica of every pool (not the draining ones)."""
        return [r for rs in self.pools.values() for r in rs]

    def draining(self) -> list[Replica]:
        """Replicas out of routing whose last requests are still running."""
        return list(self._draining)

    def describe(self) -> list[dict[str, Any]]:
        """Every replica, draining ones included, as ``/health`` shows it: name, pool, API
        base, origin, health, requests in flight, KV-cache usage (ratio 0-1); with
        prefix-aware routing also ``routing`` (``ReplicaRouting.describe``)."""
        out: list[dict[str, Any]] = []
        for r in [*self.replicas(), *self._draining]:
            d: dict[str, Any] = {
                "name": r.name, "pool": r.pool, "url": r.api_base, "origin": r.origin,
                "healthy": r.healthy, "draining": r.draining, "in_flight": r.outstanding,
                "kv_cache_usage": r.kv_usage, "last_error": r.last_error}
            if self.prefix_aware:
                d["routing"] = r.routing.describe()
            out.append(d)
        return out
