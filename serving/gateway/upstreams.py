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
Connections: each replica has ``CLIENT_SHARDS`` ``httpx.AsyncClient``s (each its own connection
pool), shared by all requests to it and used in turn. Why not one: httpcore 1.0's pool walks all
of its connections on every request start and end, and for each idle one counts all of them again
(quadratic; encode/httpcore#1035, still open) and probes its socket with ``poll()``. At 200
concurrent streams on one replica that bookkeeping took most of the gateway's CPU; spread over 16
pools each walk sees about a sixteenth of the connections (see bench/gateway_bench.py).
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
#: Connection pools per replica (see the module docstring).
CLIENT_SHARDS = 16


@dataclass(eq=False)
class Replica:
    """One upstream vLLM server of a pool and what the gateway knows about it."""

    name: str
    pool: str
    api_base: str
    metrics_url: str
    #: USD per second the replica costs (GPUs x hourly price / 3600).
    cost_per_second: float
    #: The replica's connection pools, used in turn (``client``).
    clients: tuple[httpx.AsyncClient, ...]
    healthy: bool = False
    #: vllm:kv_cache_usage_perc (mean over its engines, ratio 0-1), waiting and running
    #: requests (sums), from the last good poll; None when the server does not export them.
    kv_usage: float | None = None
    waiting: int | None = None
    running: int | None = None
    last_error: str = ""
    ledger: ShareLedger = field(default_factory=ShareLedger)
    _turn: int = 0

    @property
    def client(self) -> httpx.AsyncClient:
        """The next of the replica's clients (round robin); keep it for the whole exchange."""
        self._turn = (self._turn + 1) % len(self.clients)
        return self.clients[self._turn]

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
        # Reads of a stream may pause for long between tokens: only a silent upstream times out.
        self._timeout = httpx.Timeout(connect=gw.connect_timeout, read=gw.read_timeout,
                                      write=gw.read_timeout, pool=gw.connect_timeout)
        poll_timeout = max(1.0, gw.health_interval)
        self._poll_client = httpx.AsyncClient(
            timeout=httpx.Timeout(poll_timeout, connect=min(poll_timeout, gw.connect_timeout)),
            headers={"User-Agent": _USER_AGENT, "Accept": SCRAPE_ACCEPT},
            transport=transport, follow_redirects=False)
        self.pools: dict[str, list[Replica]] = {p.name: [] for p in cfg.pools}
        for t in cfg.targets:
            if t.kind != KIND_VLLM:
                continue
            clients = tuple(httpx.AsyncClient(
                base_url=t.api_base, timeout=self._timeout, transport=transport,
                # No cap on connections: each in-flight stream holds one; the tiers and the
                # pool's own queue are the limits, not a hidden pool timeout here.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=32,
                                    keepalive_expiry=30.0),
                headers={"User-Agent": _USER_AGENT}) for _ in range(CLIENT_SHARDS))
            self.pools[t.pool].append(Replica(
                name=t.name, pool=t.pool, api_base=t.api_base, metrics_url=t.url,
                cost_per_second=gpu_cost_per_second(cfg, t.pool), clients=clients,
                ledger=ShareLedger(monotonic=monotonic)))
        self._rotation: dict[str, int] = dict.fromkeys(self.pools, 0)
        self._refreshed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Poll every replica once (so routing starts informed), then keep polling."""
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
        for replicas in self.pools.values():
            for r in replicas:
                for client in r.clients:
                    await client.aclose()

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

    async def _poll(self, r: Replica) -> None:
        try:
            health, metrics = await asyncio.gather(
                self._poll_client.get(f"{r.api_base}/health"),
                self._poll_client.get(r.metrics_url, params=_METRICS_QUERY))
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
