"""The batch tier: a durable queue released when a pool has headroom or in off-peak hours.

Callers submit work through the OpenAI batches API (``router()``, see ``batch_api``); requests
wait in SQLite (``batch_store``) until ``run()`` releases them to ``send``, per pool:

* while the pool has **headroom** -- ``load(pool)`` shows KV-cache usage below
  ``[gateway.batch] headroom_kv_usage`` and fewer than ``headroom_queue_length`` waiting
  requests (an unknown load is no headroom) -- or the clock is inside an **off-peak window**
  (``off_peak``, UTC ``"HH:MM-HH:MM"``, may wrap midnight; any load, as long as a replica is
  healthy);
* at most ``max_in_flight`` requests in flight per pool, checked every ``poll_interval``
  seconds (and at once when a batch arrives or a request finishes).

A send that raises or answers 429/5xx is retried with exponential backoff, ``retry_attempts``
tries in all, then written to the batch's error file; another 4xx goes to the error file at
once. Delivery is at-least-once: a request in flight when the process stops is sent again
after the restart, and its ``(batch_id, custom_id)`` gets exactly one line in the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Request

from serving.gateway.batch_api import MAX_FILE_BYTES, MAX_LINES, BatchApi
from serving.gateway.batch_store import BatchStore, ClaimedRequest, new_id
from serving.gateway.types import Caller, PoolLoad
from vigil.config import BatchConfig
from vigil.conventions import BATCH_ENDPOINTS, BATCH_ERROR_UPSTREAM, BATCH_REQUEST_ID_PREFIX
from vigil.errors import ConfigError

__all__ = [
    "BatchQueue",
    "BatchRequest",
    "OffPeakWindow",
    "has_headroom",
    "parse_off_peak",
]

log = logging.getLogger(__name__)

_DAY = 86400.0
_WINDOW = re.compile(r"^(\d\d):(\d\d)-(\d\d):(\d\d)$")


@dataclass(frozen=True)
class BatchRequest:
    """One request of a batch, released to the gateway's ``send``.

    ``caller.tier`` is always ``"batch"``: whatever the submitting key's tier, queued work runs
    at vLLM ``priority`` ``TIER_PRIORITY["batch"]`` (2). ``body`` is the input line's body as
    the caller wrote it (the gateway applies its max_tokens policy).
    """

    batch_id: str
    custom_id: str
    pool: str
    endpoint: Literal["chat", "completions"]
    body: dict[str, Any]
    caller: Caller


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

    ``path``: the SQLite file (the gateway's records database); ``pools``: the pools that take
    batch work; ``load(pool)``: the pool's load as last seen; ``send(request)``: performs one
    request upstream and returns ``(HTTP status, JSON body)``; ``auth(request)``: the caller of
    an API call (raises the 401 itself); ``clock``: Unix seconds (windows, expiry, retention and
    backoff follow it); ``pool_of_model(model)``: the model's pool, None when not served.
    ``retry_attempts`` tries in all for a send that fails with 429/5xx or raises, waiting
    ``retry_backoff`` seconds, then twice that, ... (capped at 64x) between tries.
    """

    def __init__(self, path: Path, cfg: BatchConfig, *, pools: list[str],
                 load: Callable[[str], PoolLoad],
                 send: Callable[[BatchRequest], Awaitable[tuple[int, dict[str, Any]]]],
                 auth: Callable[[Request], Awaitable[Caller]],
                 clock: Callable[[], float] = time.time,
                 pool_of_model: Callable[[str], str | None],
                 retry_attempts: int = 4, retry_backoff: float = 1.0,
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
        self._store = BatchStore(path)
        self._in_flight: dict[str, set[asyncio.Task[None]]] = {p: set() for p in self._pools}
        self._wake = asyncio.Event()
        self._api = BatchApi(self._store, auth=auth, clock=clock, pool_of_model=pool_of_model,
                             pools=self._pools, on_change=self._wake.set,
                             retention=cfg.retention, max_file_bytes=max_file_bytes,
                             max_lines=max_lines)

    # --- public surface ---------------------------------------------------------------------
    def router(self) -> APIRouter:
        """The OpenAI batches and files routes, to include in the gateway's app."""
        return self._api.router()

    def depth(self, pool: str) -> int:
        """Batch requests of ``pool`` waiting or in flight."""
        return self._store.depth(pool)

    def in_off_peak(self, t: float | None = None) -> bool:
        """Whether clock time ``t`` (default: now) is inside an off-peak window."""
        now = self._clock() if t is None else t
        return any(w.contains(now) for w in self._windows)

    def close(self) -> None:
        """Close the database (after ``run()`` has been cancelled)."""
        self._store.close()

    async def run(self) -> None:
        """Release queued requests until cancelled.

        First queues again what a previous process left in flight. On cancellation, sends in
        flight are cancelled too; their requests stay marked in flight in the database and are
        sent again by the next ``run()``.
        """
        requeued = self._store.requeue_in_flight()
        if requeued:
            log.info("batch queue: %d requests were in flight when the gateway stopped; "
                     "sending them again", requeued)
        try:
            while True:
                self._wake.clear()
                try:
                    self._tick()
                except Exception:  # a locked or full database must not end the loop
                    log.exception("batch queue: poll failed; retrying in %gs",
                                  self._cfg.poll_interval)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._cfg.poll_interval)
        finally:
            tasks = [t for ts in self._in_flight.values() for t in ts]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- the release loop -------------------------------------------------------------------
    def _may_release(self, pool: str, now: float) -> bool:
        try:
            load = self._load(pool)
        except Exception:
            log.exception("batch queue: load(%r) failed; holding its batch work", pool)
            return False
        if load.healthy_replicas <= 0:
            return False  # nothing to send to: sending would only spend retries
        return self.in_off_peak(now) or has_headroom(load, self._cfg)

    def _tick(self) -> None:
        now = self._clock()
        expired = self._store.expire_due(int(now))
        if expired:
            log.info("batch queue: %d batches passed their completion window", len(expired))
        for pool in self._pools:
            free = self._cfg.max_in_flight - len(self._in_flight[pool])
            if free <= 0 or not self._store.has_queued(pool, now):
                continue
            if not self._may_release(pool, now):
                continue
            for claimed in self._store.claim(pool, free, now):
                task = asyncio.create_task(self._send_one(claimed),
                                           name=f"batch-{claimed.batch_id}-{claimed.custom_id}")
                self._in_flight[pool].add(task)
                task.add_done_callback(self._sent)
        self._store.finalize_ready(int(now))
        self._store.purge(now, self._cfg.retention)

    def _sent(self, task: asyncio.Task[None]) -> None:
        for tasks in self._in_flight.values():
            tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("batch queue: storing a result failed", exc_info=task.exception())
        self._wake.set()  # a slot is free, and the batch may be complete

    async def _send_one(self, c: ClaimedRequest) -> None:
        endpoint: Literal["chat", "completions"] = (
            "chat" if BATCH_ENDPOINTS[c.endpoint] == "chat" else "completions")
        request = BatchRequest(batch_id=c.batch_id, custom_id=c.custom_id, pool=c.pool,
                               endpoint=endpoint, body=c.body,
                               caller=Caller(tenant=c.tenant, tier="batch", key_id=c.key_id))
        try:
            status, body = await self._send(request)
        except asyncio.CancelledError:
            raise  # shutting down: the request stays in flight and is re-sent after restart
        except Exception as exc:
            self._failed(c, None, None, f"{type(exc).__name__}: {exc}")
            return
        if 200 <= status < 300:
            self._store.finish(c.batch_id, c.custom_id, ok=True,
                               line=_result_line(c.custom_id, status, body, None),
                               now=self._clock())
        elif status == 429 or status >= 500:
            self._failed(c, status, body, None)
        else:  # the request itself is wrong: retrying gives the same answer
            self._store.finish(c.batch_id, c.custom_id, ok=False,
                               line=_result_line(c.custom_id, status, body, None),
                               now=self._clock())

    def _failed(self, c: ClaimedRequest, status: int | None, body: Any,
                message: str | None) -> None:
        attempts = c.attempts + 1
        now = self._clock()
        if attempts < self._retry_attempts:
            delay = self._retry_backoff * 2 ** min(attempts - 1, 6)
            log.info("batch queue: %s/%s failed (%s), try %d of %d in %gs", c.batch_id,
                     c.custom_id, message or f"HTTP {status}", attempts + 1,
                     self._retry_attempts, delay)
            self._store.retry_later(c.batch_id, c.custom_id, attempts=attempts,
                                    not_before=now + delay)
            return
        error = None
        if status is None:
            error = {"code": BATCH_ERROR_UPSTREAM,
                     "message": f"the request failed {attempts} times; last: {message}"}
        self._store.finish(c.batch_id, c.custom_id, ok=False,
                           line=_result_line(c.custom_id, status, body, error), now=now)
