"""The pools' upstream replicas: health and load polling, and least-outstanding routing.

A pool's replicas are its ``kind = "vllm"`` targets (``TargetConfig.api_base``). Every
``[gateway] health_interval`` each replica's ``GET /health`` and ``GET /metrics`` are fetched
concurrently; a replica is healthy while both answer (a request that cannot connect marks it
down at once, the next good poll brings it back). Only the three gauges routing needs are asked
for (``/metrics?name[]=...``, prometheus_client's filter, which vLLM's endpoint inherits) and the
answer goes through ``collector.exposition.parse``; a server that ignores the filter still
parses, only slower.

Routing: among healthy replicas whose KV-cache usage is at most ``max_kv_usage`` (unknown usage
counts as room), the one with the fewest requests this gateway has in flight; ties rotate.

Connections: requests to a replica go through its ``upstream_http.ReplicaConnections`` (its
own keep-alive connections, opened by ``start``; why not httpx is said there); the polls use
httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from collector.exposition import normalise_vllm_names, parse
from serving.gateway.accounting import ShareLedger, gpu_cost_per_second
from serving.gateway.types import PoolLoad
from serving.gateway.upstream_http import ReplicaConnections
from vigil.config import Config
from vigil.conventions import (
    GATEWAY_POLLED_SERIES,
    KIND_VLLM,
    SCRAPE_ACCEPT,
    VLLM_KV_CACHE_USAGE,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
)
from vigil.errors import ParseError

__all__ = ["Replica", "Upstreams"]

log = logging.getLogger("vigil.gateway.upstreams")

_USER_AGENT = "vigil-gateway/0.1"
_METRICS_QUERY = [("name[]", n) for n in GATEWAY_POLLED_SERIES]
#: A poll answer larger than this is refused (bytes): the three gauges take a few hundred.
_MAX_POLL_BYTES = 8 * 1024 * 1024
#: Seconds an idle upstream connection is kept: below uvicorn's (so vLLM's) 5 s keep-alive, so
#: the gateway never sends a request on a connection the replica is about to close.
KEEPALIVE_S = 4.0
#: What every request upstream carries: the body is relayed byte for byte, never decompressed.
_REQUEST_HEADERS = {"User-Agent": _USER_AGENT, "Content-Type": "application/json",
                    "Accept-Encoding": "identity"}


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
    #: The replica's keep-alive connections for requests; open from ``Upstreams.start`` to
    #: ``Upstreams.aclose``.
    connections: ReplicaConnections | None = None

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
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        gw = cfg.gateway
        self._interval = gw.health_interval
        self._max_kv = gw.max_kv_usage
        self._connect_timeout = gw.connect_timeout
        # Reads of a stream may pause for long between tokens: only a silent upstream times out.
        self._read_timeout = gw.read_timeout
        poll_timeout = max(1.0, gw.health_interval)
        self._poll_client = httpx.AsyncClient(
            timeout=httpx.Timeout(poll_timeout, connect=min(poll_timeout, gw.connect_timeout)),
            headers={"User-Agent": _USER_AGENT, "Accept": SCRAPE_ACCEPT},
            transport=transport, follow_redirects=False)
        self.pools: dict[str, list[Replica]] = {p.name: [] for p in cfg.pools}
        for t in cfg.targets:
            if t.kind != KIND_VLLM:
                continue
            self.pools[t.pool].append(Replica(
                name=t.name, pool=t.pool, api_base=t.api_base, metrics_url=t.url,
                cost_per_second=gpu_cost_per_second(cfg, t.pool),
                ledger=ShareLedger(monotonic=monotonic)))
        self._rotation: dict[str, int] = dict.fromkeys(self.pools, 0)
        self._refreshed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the replicas' connection pools, poll every replica once (so routing starts
        informed), then keep polling."""
        for r in self.replicas():
            if r.connections is None:  # made here: it belongs to the running event loop
                # No cap on connections: each in-flight stream holds one; the tiers and the
                # pool's own queue are the limits, not a hidden pool timeout here.
                r.connections = ReplicaConnections(
                    r.api_base, connect_timeout=self._connect_timeout,
                    read_timeout=self._read_timeout, keepalive=KEEPALIVE_S,
                    headers=_REQUEST_HEADERS)
        await self.poll_once()
        self._task = asyncio.create_task(self._loop(), name="gateway-upstream-poll")

    async def aclose(self) -> None:
        """Stop polling and close every connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._poll_client.aclose()
        for r in self.replicas():
            if r.connections is not None:
                await r.connections.aclose()
                r.connections = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.poll_once()
            except Exception:  # never let one bad round stop health checks
                log.exception("upstream poll round failed")

    # --- polling ----------------------------------------------------------------------------

    async def poll_once(self) -> None:
        """Poll every replica now, then wake whoever waits for fresh load figures."""
        replicas = [r for rs in self.pools.values() for r in rs]
        await asyncio.gather(*(self._poll(r) for r in replicas))
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
                self._get(r.metrics_url, params=_METRICS_QUERY))
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
        if not r.healthy:
            log.info("replica %s of pool %s is healthy", r.name, r.pool)
        r.healthy = True
        r.last_error = ""

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

    def _has_room(self, r: Replica) -> bool:
        return r.healthy and (r.kv_usage is None or r.kv_usage <= self._max_kv)

    def pick(self, pool: str, *, beyond_kv_limit: bool = False,
             exclude: Replica | None = None) -> Replica | None:
        """The replica a new request of ``pool`` goes to, or None.

        Least outstanding among healthy replicas with KV room; with ``beyond_kv_limit``
        (premium), the healthy replica with the least KV usage when none has room.
        """
        replicas = self.pools.get(pool, [])
        n = len(replicas)
        if not n:
            return None
        start = self._rotation[pool] = (self._rotation[pool] + 1) % n
        best: Replica | None = None
        for i in range(n):
            r = replicas[(start + i) % n]
            if r is exclude or not self._has_room(r):
                continue
            if best is None or r.outstanding < best.outstanding:
                best = r
        if best is None and beyond_kv_limit:
            healthy = [r for r in replicas if r.healthy and r is not exclude]
            if healthy:
                best = min(healthy, key=lambda r: (r.kv_usage or 0.0, r.outstanding))
        return best

    def replicas(self) -> list[Replica]:
        """Every replica of every pool."""
        return [r for rs in self.pools.values() for r in rs]
