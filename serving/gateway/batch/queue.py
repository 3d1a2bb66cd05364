"""The batch tier: a durable queue released when a pool has headroom or in off-peak hours.

Callers submit work through the OpenAI batches API (``router()``, see ``api``); requests
wait in the gateway's database (``store``: SQLite, or PostgreSQL shared by several
gateway instances) until ``run()`` releases them to ``send`` (``interface.SendBatch``: the
gateway's ``send_batch``), per pool:

* while the pool has **headroom** -- ``load(pool)`` shows KV-cache usage below
  ``[gateway.batch] headroom_kv_usage`` and fewer than ``headroom_queue_length`` waiting
  requests (an unknown load is no headroom) -- or the clock is inside an **off-peak window**
  (``off_peak``, UTC ``"HH:MM-HH:MM"``, may wrap midnight; any load, as long as a replica is
  healthy);
* at most ``max_in_flight`` requests in flight per pool, checked every ``poll_interval``
  seconds (and at once when a batch arrives or a request finishes).

A send that raises or answers 429/5xx is retried with exponential backoff, ``retry_attempts``
tries in all, then written to the batch's error file; another 4xx goes to the error file at
once. Delivery is at-least-once: a request is claimed under a lease that the instance renews
while it works on it; a request in flight when its instance stops (or loses the database for
longer than the lease) is sent again by whichever instance claims it next, after the lease has
run out, and its ``(batch_id, custom_id)`` gets exactly one line in the results.

A request whose lease ran out counts as a failed try too: after ``retry_attempts`` of them it
gets an error line instead of being sent again. On a clean stop (``run()`` cancelled) the
requests in flight are handed back, to be claimed again at once by any instance.

Database calls never run on the event loop (on PostgreSQL a call is a network round trip, and
during an outage it waits for the pool's timeout), and they run on three executors so that
one kind of work never waits behind another: the release loop's (claims, results,
maintenance), the API's (uploads and batches of up to 200 MB), and one thread that only renews
leases, so a long API call cannot let a lease run out. The maintenance (expiry, finalizing,
depths) runs every ``poll_interval``, retention once a minute, not on every wake-up. While the
database is unreachable (``StoreUnavailable``) the release loop logs once, keeps what it has
sent in memory and tries again every poll; the API answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from fastapi import APIRouter

from serving.gateway.batch.api import MAX_FILE_BYTES, MAX_LINES, BatchApi
from serving.gateway.batch.interface import (
    AuthenticateCaller,
    BatchRequest,
    PoolLoadOf,
    PoolOfModel,
    SendBatch,
)
from serving.gateway.batch.store import BatchStore, ClaimedRequest, new_id
from serving.gateway.tiers import Caller, PoolLoad
from vigil.config import BatchConfig
from vigil.conventions import (
    BATCH_ENDPOINTS,
    BATCH_ERROR_UPSTREAM,
    BATCH_REQUEST_ID_PREFIX,
    TIER_BATCH,
)
from vigil.errors import ConfigError, StoreUnavailable

__all__ = [
    "BatchQueue",
    "BatchRequest",
    "OffPeakWindow",
    "has_headroom",
    "parse_off_peak",
]

#: The logger's name is the module's before the gateway's modules moved into rooms: log
#: settings that name it keep working.
log = logging.getLogger("serving.gateway.batch")

T = TypeVar("T")

_DAY = 86400.0
#: Clock seconds between two purges of batches past their retention.
_PURGE_EVERY = 60.0
#: Threads for API calls: a large upload being stored does not hold up every other call.
_API_THREADS = 2
_WINDOW = re.compile(r"^(\d\d):(\d\d)-(\d\d):(\d\d)$")


@dataclass(frozen=True)
class OffPeakWindow:
    """A daily UTC window ``[start, end)`` in seconds after midnight; ``end < start`` wraps."""

    start: float
    end: float

    def contains(self, t: float) -> bool:
        """Whether Unix time ``t`` (seconds) falls inside the window."""
        s = t % _DAY
        if self.start < self.end:
            return self.start <= s < self.end
        return s >= self.start or s < self.end


def parse_off_peak(specs: Sequence[str], *, key: str = "gateway.batch.off_peak"
                   ) -> list[OffPeakWindow]:
    """``"HH:MM-HH:MM"`` strings (UTC; ``24:00`` may end a window) as windows.

    Raises ``ConfigError`` naming the entry for a bad time or an empty window.
    """
    out: list[OffPeakWindow] = []
    for i, spec in enumerate(specs):
        m = _WINDOW.match(spec)
        if not m:
            raise ConfigError(f"expected 'HH:MM-HH:MM' (UTC), got {spec!r}", key=f"{key}[{i}]")
        h1, m1, h2, m2 = (int(g) for g in m.groups())
        if h1 > 23 or m1 > 59 or m2 > 59 or h2 > 24 or (h2 == 24 and m2 != 0):
            raise ConfigError(f"not a time of day in {spec!r} (00:00 to 23:59; 24:00 may end "
                              "a window)", key=f"{key}[{i}]")
        start, end = (h1 * 60 + m1) * 60.0, ((h2 * 60 + m2) * 60.0) % _DAY
        if (h1, m1, h2, m2) == (0, 0, 24, 0):
            end = _DAY  # the whole day: contains() needs start < end here
        elif start == end:
            raise ConfigError(f"window {spec!r} starts where it ends: write '00:00-24:00' for "
                              "the whole day", key=f"{key}[{i}]")
        out.append(OffPeakWindow(start, end))
    return out


def has_headroom(load: PoolLoad, cfg: BatchConfig) -> bool:
    """Whether ``load`` leaves room for batch work: KV-cache usage (ratio 0-1) below
    ``headroom_kv_usage`` and fewer waiting requests than ``headroom_queue_length``, with a
    healthy replica. Unknown figures are no headroom."""
    return (load.healthy_replicas > 0
            and load.kv_cache_usage is not None and load.queue_length is not None
            and load.kv_cache_usage < cfg.headroom_kv_usage
            and load.queue_length < cfg.headroom_queue_length)


def _result_line(custom_id: str, status: int | None, body: Any,
                 error: dict[str, str] | None) -> dict[str, Any]:
    """One line of an output or error file, in OpenAI's shape."""
    response = None
    if status is not None:
        request_id = body.get("id") if isinstance(body, dict) else None
        response = {"status_code": status,
                    "request_id": request_id if isinstance(request_id, str)
                    else new_id("req_"),
                    "body": body}
    return {"id": new_id(BATCH_REQUEST_ID_PREFIX), "custom_id": custom_id,
            "response": response, "error": error}


class BatchQueue:
    """The durable batch queue of the gateway (see the module docstring).

    ``target``: the gateway's database (an SQLite path or a ``postgresql://`` URL, shared
    with the other gateway instances); ``pools``: the pools that take batch work;
    ``load(pool)``: the pool's load as last seen; ``send(request)``: performs one request
    upstream and returns ``(HTTP status, JSON body)``; ``auth(request)``: the caller of an API
    call (raises the 401 itself); ``clock``: Unix seconds (windows, expiry, retention, backoff
    and leases follow it); ``pool_of_model(model)``: the model's pool, None when not served.
    The callbacks' types are the protocols of ``interface``, which the gateway's side meets.
    ``retry_attempts`` tries in all for a send that fails with 429/5xx or raises, waiting
    ``retry_backoff`` seconds, then twice that, ... (capped at 64x) between tries.
    ``cfg.lease``: seconds a claimed request stays this instance's without renewal (renewed
    every third of it); ``owner``: this instance's name in the leases (default: a fresh
    unique id).
    """

    def __init__(self, target: str | Path, cfg: BatchConfig, *, pools: list[str],
                 load: PoolLoadOf,
                 send: SendBatch,
                 auth: AuthenticateCaller,
                 clock: Callable[[], float] = time.time,
                 pool_of_model: PoolOfModel,
                 retry_attempts: int = 4, retry_backoff: float = 1.0,
                 owner: str | None = None,
                 max_file_bytes: int = MAX_FILE_BYTES, max_lines: int = MAX_LINES) -> None:
        if retry_attempts < 1:
            raise ValueError(f"retry_attempts must be at least 1, got {retry_attempts}")
        if retry_backoff < 0:
            raise ValueError(f"retry_backoff must be >= 0 seconds, got {retry_backoff}")
        self._cfg = cfg
        self._windows = parse_off_peak(cfg.off_peak)
        self._pools = list(dict.fromkeys(pools))
        self._load = load
        self._send = send
        self._clock = clock
        self._retry_attempts = retry_attempts
        self._retry_backoff = retry_backoff
        self._store = BatchStore(target, owner=owner, lease=cfg.lease,
                                 max_attempts=retry_attempts)
        # The release loop's calls run one at a time, in order (a hand-back after the results
        # of cancelled sends); API calls and renewals have threads of their own, so that
        # neither waits behind the other or behind the loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-store")
        self._api_executor = ThreadPoolExecutor(max_workers=_API_THREADS,
                                                thread_name_prefix="batch-api")
        self._renew_executor = ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="batch-renew")
        self._in_flight: dict[str, set[asyncio.Task[None]]] = {p: set() for p in self._pools}
        #: Requests this instance holds (sending, or answered but not yet stored): the leases
        #: it renews.
        self._held: dict[tuple[str, str], int] = {}
        #: Results (and retries) that could not be stored yet, retried every poll.
        self._unsaved: dict[tuple[str, str], Callable[[], bool]] = {}
        self._renewed_at = -float("inf")
        self._outage = False
        self._depths: dict[str, int] = {}
        #: Event-loop time of the next maintenance; clock time of the last purge.
        self._maintain_at = -float("inf")
        self._purged_at = -float("inf")
        self._wake = asyncio.Event()
        self._api = BatchApi(self._store, auth=auth, clock=clock, pool_of_model=pool_of_model,
                             pools=self._pools, on_change=self._wake.set,
                             retention=cfg.retention, max_file_bytes=max_file_bytes,
                             max_lines=max_lines, call=self._api_call)

    # --- public surface ---------------------------------------------------------------------
    @property
    def owner(self) -> str:
        """This instance's name in the leases it takes."""
        return self._store.owner

    def router(self) -> APIRouter:
        """The OpenAI batches and files routes, to include in the gateway's app."""
        return self._api.router()

    def depth(self, pool: str) -> int:
        """Batch requests of ``pool`` waiting or in flight (on every instance sharing the
        database), as of the release loop's last poll: a metrics scrape never waits on the
        database."""
        return self._depths.get(pool, 0)

    def in_off_peak(self, t: float | None = None) -> bool:
        """Whether clock time ``t`` (default: now) is inside an off-peak window."""
        now = self._clock() if t is None else t
        return any(w.contains(now) for w in self._windows)

    def close(self) -> None:
        """Close the database (after ``run()`` has been cancelled); blocks until the
        database calls still running are done: from the event loop, use ``aclose()``."""
        for executor in (self._executor, self._api_executor, self._renew_executor):
            executor.shutdown(wait=True)
        self._store.close()

    async def aclose(self) -> None:
        """``close()`` in a worker thread: the event loop goes on serving meanwhile."""
        await asyncio.to_thread(self.close)

    async def _db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (a store call) in the release loop's database thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor,
                                          functools.partial(fn, *args, **kwargs))

    async def _api_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (a store call of the API) in the API's threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._api_executor,
                                          functools.partial(fn, *args, **kwargs))

    async def run(self) -> None:
        """Release queued requests until cancelled.

        Requests that a stopped instance left in flight come back once their lease has run
        out. On cancellation, sends in flight are cancelled too and their requests handed
        back (any instance sends them again at once, no attempt counted); if the database
        cannot be reached then, they come back when their lease runs out.
        """
        renewer = asyncio.create_task(self._renew_loop(), name="batch-renew")
        try:
            while True:
                self._wake.clear()
                try:
                    await self._tick()
                    if self._outage:
                        self._outage = False
                        log.warning("batch queue: %s is reachable again", self._store.display)
                except StoreUnavailable as exc:
                    if not self._outage:  # once per outage: every poll would fail the same way
                        self._outage = True
                        log.warning("batch queue: the database is unreachable, holding batch "
                                    "work and retrying every %gs: %s",
                                    self._cfg.poll_interval, exc)
                except Exception:  # a locked or full database must not end the loop
                    log.exception("batch queue: poll failed; retrying in %gs",
                                  self._cfg.poll_interval)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._cfg.poll_interval)
        finally:
            renewer.cancel()
            # Taken before the cancelled sends let go of their requests.
            held = list(self._held)
            tasks = [t for ts in self._in_flight.values() for t in ts]
            for t in tasks:
                t.cancel()
            await asyncio.gather(renewer, *tasks, return_exceptions=True)
            await self._hand_back(held)

    async def _hand_back(self, held: list[tuple[str, str]]) -> None:
        """On shutdown: store the results kept during an outage, hand back the rest."""
        if not held:
            return
        try:
            await self._store_unsaved()
        except Exception as exc:
            log.warning("batch queue: %d results could not be stored before stopping; their "
                        "requests are sent again: %s", len(self._unsaved), exc)
        try:
            n = await self._db(self._store.hand_back, held)
        except Exception as exc:
            log.warning("batch queue: could not hand back %d requests in flight; they are sent "
                        "again once their lease runs out: %s", len(held), exc)
            return
        if n:
            log.info("batch queue: handed back %d requests in flight", n)

    async def _renew_loop(self) -> None:
        """Renew the leases this instance holds, every third of the lease, in a thread of
        its own: neither a slow claim nor a 200 MB upload delays a renewal."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(self._cfg.poll_interval, self._renew_every))
            if not self._held:
                continue  # (nothing to renew: the clock is not even read)
            now = self._clock()
            if now - self._renewed_at < self._renew_every:
                continue
            try:
                await loop.run_in_executor(self._renew_executor, self._store.renew,
                                           list(self._held), now)
            except StoreUnavailable:
                continue  # the release loop reports the outage; renewal tries again
            except Exception:
                log.exception("batch queue: renewing leases failed; retrying")
                continue
            self._renewed_at = now

    # --- the release loop -------------------------------------------------------------------
    @property
    def _renew_every(self) -> float:
        # A third of the lease: two renewals may fail (a slow database) before it runs out.
        return self._store.lease / 3

    def _may_release(self, pool: str, now: float) -> bool:
        try:
            load = self._load(pool)
        except Exception:
            log.exception("batch queue: load(%r) failed; holding its batch work", pool)
            return False
        if load.healthy_replicas <= 0:
            return False  # nothing to send to: sending would only spend retries
        return self.in_off_peak(now) or has_headroom(load, self._cfg)

    async def _tick(self) -> None:
        now = self._clock()
        await self._store_unsaved()
        for pool in self._pools:
            free = self._cfg.max_in_flight - len(self._in_flight[pool])
            if free <= 0 or not await self._db(self._store.has_queued, pool, now):
                continue
            if not self._may_release(pool, now):
                continue
            # The clock is read inside the claim's transaction: the lease and the renewal
            # schedule count from the same moment.
            for claimed in await self._db(self._store.claim, pool, free, self._clock):
                self._hold(claimed.key, claimed.leased_at)
                task = asyncio.create_task(self._send_one(claimed),
                                           name=f"batch-{claimed.batch_id}-{claimed.custom_id}")
                self._in_flight[pool].add(task)
                task.add_done_callback(functools.partial(self._sent, claimed.key))
        loop_now = asyncio.get_running_loop().time()
        if loop_now >= self._maintain_at:
            # Every poll_interval, not every wake-up: each finished request wakes the loop,
            # and these scan every running batch.
            await self._maintain(int(now))
            self._maintain_at = loop_now + self._cfg.poll_interval

    async def _maintain(self, now: int) -> None:
        expired = await self._db(self._store.expire_due, now)
        if expired:
            log.info("batch queue: %d batches passed their completion window", len(expired))
        await self._db(self._store.finalize_ready, now)
        if now - self._purged_at >= _PURGE_EVERY:
            await self._db(self._store.purge, now, self._cfg.retention)
            self._purged_at = now
        self._depths = await self._db(self._store.depths)

    def _hold(self, key: tuple[str, str], leased_at: float | None = None) -> None:
        if not self._held:
            # Renewal counts from the first claim: a lease taken at ``leased_at`` is good
            # for ``lease`` from then.
            self._renewed_at = self._clock() if leased_at is None else leased_at
        self._held[key] = self._held.get(key, 0) + 1

    def _release(self, key: tuple[str, str]) -> None:
        n = self._held.get(key, 0) - 1
        if n > 0:
            self._held[key] = n
        else:
            self._held.pop(key, None)

    def _sent(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        for tasks in self._in_flight.values():
            tasks.discard(task)
        self._release(key)
        if not task.cancelled() and task.exception() is not None:
            log.error("batch queue: sending a request failed", exc_info=task.exception())
        self._wake.set()  # a slot is free, and the batch may be complete

    async def _store_unsaved(self) -> None:
        """Write the results kept while the database was unreachable (in the order they
        came); stops at the first that fails again."""
        for key, write in list(self._unsaved.items()):
            stored = await self._db(write)
            del self._unsaved[key]
            self._release(key)
            if not stored:
                log.info("batch queue: %s/%s is no longer this instance's (taken over while the "
                         "database was unreachable, or stored already); its result here is "
                         "dropped", *key)

    async def _write(self, key: tuple[str, str], write: Callable[[], bool]) -> None:
        """Store a result (or a retry); kept for the next poll if the database is down."""
        try:
            stored = await self._db(write)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Kept while the lease is renewed: written once the database answers again
            # (unless another instance took the request over meanwhile). The kept write
            # holds the request from now on, the task's own hold ends with the task.
            if key not in self._unsaved:
                self._hold(key)
            self._unsaved[key] = write
            if not isinstance(exc, StoreUnavailable):
                log.error("batch queue: storing the result of %s/%s failed; retrying at the "
                          "next poll: %s", *key, exc)
            return
        if not stored:
            log.info("batch queue: %s/%s is no longer this instance's (its lease ran out and "
                     "another took it over, or it was stored already); its result here is "
                     "dropped", *key)

    async def _send_one(self, c: ClaimedRequest) -> None:
        endpoint: Literal["chat", "completions"] = (
            "chat" if BATCH_ENDPOINTS[c.endpoint] == "chat" else "completions")
        request = BatchRequest(batch_id=c.batch_id, custom_id=c.custom_id, pool=c.pool,
                               endpoint=endpoint, body=c.body,
                               caller=Caller(tenant=c.tenant, tier=TIER_BATCH, key_id=c.key_id))
        try:
            status, body = await self._send(request)
        except asyncio.CancelledError:
            raise  # shutting down: run() hands the request back
        except Exception as exc:
            await self._failed(c, None, None, f"{type(exc).__name__}: {exc}")
            return
        if 200 <= status < 300:
            await self._finish(c, ok=True, line=_result_line(c.custom_id, status, body, None))
        elif status == 429 or status >= 500:
            await self._failed(c, status, body, None)
        else:  # the request itself is wrong: retrying gives the same answer
            await self._finish(c, ok=False, line=_result_line(c.custom_id, status, body, None))

    async def _finish(self, c: ClaimedRequest, *, ok: bool, line: dict[str, Any]) -> None:
        await self._write(c.key, functools.partial(
            self._store.finish, c.batch_id, c.custom_id, ok=ok, line=line, now=self._clock()))

    async def _failed(self, c: ClaimedRequest, status: int | None, body: Any,
                      message: str | None) -> None:
        attempts = c.attempts + 1
        now = self._clock()
        if attempts < self._retry_attempts:
            delay = self._retry_backoff * 2 ** min(attempts - 1, 6)
            log.info("batch queue: %s/%s failed (%s), try %d of %d in %gs", c.batch_id,
                     c.custom_id, message or f"HTTP {status}", attempts + 1,
                     self._retry_attempts, delay)
            await self._write(c.key, functools.partial(
                self._store.retry_later, c.batch_id, c.custom_id, attempts=attempts,
                not_before=now + delay))
            return
        error = None
        if status is None:
            error = {"code": BATCH_ERROR_UPSTREAM,
                     "message": f"the request failed {attempts} times; last: {message}"}
        await self._finish(c, ok=False, line=_result_line(c.custom_id, status, body, error))
