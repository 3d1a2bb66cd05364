"""Sending the workload and timing every request (``generate``).

Arrivals are open-loop (the next request leaves on schedule whether or not earlier ones have
finished, as real users do) unless a fixed concurrency is asked for (closed loop: each client
sends its next request when the previous one ends). Stopping — ``duration`` reached, the
request budget spent, or ``stop`` set — cancels what is in flight by closing its connection,
which a vLLM server or the gateway sees as a client disconnect and aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

import httpx

from serving.loadgen.report import RequestResult
from serving.loadgen.workload import TIERS, PlannedRequest, Workload, next_interval, plan_request

__all__ = ["Progress", "generate", "send_one"]

#: The gateway's cache answer header (serving.cache); read only to count hits.
_CACHE_HEADER = "x-vigil-cache"


def _headers_and_body(
    req: PlannedRequest, keys: Mapping[str, str]
) -> tuple[dict[str, str], dict]:
    """With API keys, the tier is the key's (the gateway maps it); without, the request
    asks vLLM for the tier's priority itself."""
    key = keys.get(req.tier)
    if key:
        return {"Authorization": f"Bearer {key}"}, req.body
    return {}, {**req.body, "priority": TIERS[req.tier]}


def _content_of(chunk: dict) -> str:
    out = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        if isinstance(delta, dict):
            out.append(delta.get("content") or "")
        else:
            out.append(choice.get("text") or "")
    return "".join(out)


async def send_one(
    client: httpx.AsyncClient, base: str, req: PlannedRequest, keys: Mapping[str, str],
    result: RequestResult, clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Send ``req`` to ``base`` and fill ``result`` as the answer arrives (so a cancelled
    request keeps what it had measured)."""
    headers, body = _headers_and_body(req, keys)
    url = base.rstrip("/") + req.path
    start = clock()
    try:
        if req.stream:
            async with client.stream("POST", url, json=body, headers=headers) as resp:
                result.status = resp.status_code
                result.cache = resp.headers.get(_CACHE_HEADER, "")
                last = None
                chunks = 0
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    try:
                        chunk = json.loads(line[6:])
                    except ValueError:
                        result.error = "bad SSE chunk"
                        continue
                    if _content_of(chunk):
                        now = clock()
                        chunks += 1
                        if result.ttft is None:
                            result.ttft = now - start
                        elif last is not None:
                            result.itl.append(now - last)
                        last = now
                    usage = chunk.get("usage")
                    if usage:
                        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        result.output_tokens = int(usage.get("completion_tokens") or 0)
                if not result.output_tokens:
                    result.output_tokens = chunks  # no usage chunk: one token per chunk
        else:
            resp = await client.post(url, json=body, headers=headers)
            result.status = resp.status_code
            result.cache = resp.headers.get(_CACHE_HEADER, "")
            if resp.status_code == 200:
                usage = resp.json().get("usage") or {}
                result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                result.output_tokens = int(usage.get("completion_tokens") or 0)
        result.e2e = clock() - start
        result.ok = result.status == 200 and not result.error
        if result.status != 200 and not result.error:
            result.error = f"HTTP {result.status}"
    except asyncio.CancelledError:
        result.cancelled = True
        raise
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]


class Progress:
    """A one-line progress bar on a terminal (``\\r``), a line every ``every`` seconds
    elsewhere (logs, CI)."""

    def __init__(self, total_s: float, total_requests: int, out: TextIO | None = None,
                 every: float = 10.0) -> None:
        self.out = out if out is not None else sys.stderr
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.total_s = total_s
        self.total_requests = total_requests
        self.every = every if not self.tty else 0.25
        self._next = 0.0

    def update(self, elapsed: float, results: list[RequestResult], in_flight: int,
               force: bool = False) -> None:
        if not force and elapsed < self._next:
            return
        self._next = elapsed + self.every
        done = sum(1 for r in results if r.ok)
        failed = sum(1 for r in results if r.error and not r.cancelled)
        if self.total_s:
            frac = min(1.0, elapsed / self.total_s)
        elif self.total_requests:
            frac = min(1.0, len(results) / self.total_requests)
        else:
            frac = None
        bar = ""
        if frac is not None:
            filled = int(frac * 24)
            bar = f"[{'#' * filled}{'.' * (24 - filled)}] {frac * 100:3.0f}% "
        text = (f"{bar}{elapsed:6.0f}s  sent {len(results)}  ok {done}  failed {failed}  "
                f"in flight {in_flight}")
        if self.tty:
            self.out.write("\r" + text[:99].ljust(99))
            if force:
                self.out.write("\n")
        else:
            self.out.write("loadgen " + text + "\n")
        self.out.flush()


async def generate(
    bases: list[str], model: str, wl: Workload, stop: asyncio.Event, *,
    keys: Mapping[str, str] | None = None, progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[RequestResult], float]:
    """Send ``wl`` to ``bases`` (round-robin) until it ends or ``stop`` is set; returns every
    request's result and the elapsed seconds."""
    if not bases:
        raise ValueError("no URL to send to")
    rng = random.Random(wl.seed)
    keys = dict(keys or {})
    results: list[RequestResult] = []
    tasks: set[asyncio.Task[None]] = set()
    in_flight = 0
    limits = httpx.Limits(max_connections=wl.max_in_flight, max_keepalive_connections=64)
    timeout = httpx.Timeout(600.0, connect=5.0)
    start = clock()
    counter = 0

    def time_left() -> bool:
        return not (wl.duration and clock() - start >= wl.duration)

    def budget_left() -> bool:
        return not (wl.max_requests and counter >= wl.max_requests) and time_left()

    def claim() -> int:
        """Count a request as sent (and in flight) when it is scheduled, not when its task
        first runs: a generator that falls behind creates several tasks without yielding,
        and counting later would overshoot the request budget and the in-flight limit."""
        nonlocal counter, in_flight
        counter += 1
        in_flight += 1
        return counter - 1

    async def one(client: httpx.AsyncClient, index: int) -> None:
        nonlocal in_flight
        req = plan_request(rng, wl, model)
        result = RequestResult(tier=req.tier, kind=req.kind, stream=req.stream)
        results.append(result)
        base = bases[index % len(bases)]
        try:
            await send_one(client, base, req, keys, result, clock)
        finally:
            in_flight -= 1

    async def closed_loop_client(client: httpx.AsyncClient) -> None:
        while not stop.is_set() and budget_left():
            await one(client, claim())

    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        if wl.concurrency:
            for _ in range(wl.concurrency):
                t = asyncio.create_task(closed_loop_client(client))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            # Clients stop by themselves when the request budget is spent (their last
            # request finishes); the duration and `stop` cut what is in flight.
            while tasks and not stop.is_set() and time_left():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.25)
                if progress:
                    progress.update(clock() - start, results, in_flight)
        else:
            next_at = 0.0
            while not stop.is_set() and budget_left():
                next_at += next_interval(rng, wl.rate_at(next_at), wl.burstiness)
                delay = next_at - (clock() - start)
                if wl.duration and next_at >= wl.duration:
                    delay = wl.duration - (clock() - start)
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=delay)
                if stop.is_set() or not budget_left():
                    break
                if progress:
                    progress.update(clock() - start, results, in_flight)
                if in_flight >= wl.max_in_flight:
                    continue  # the client's own limit: this arrival is dropped, not queued
                t = asyncio.create_task(one(client, claim()))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            # A request budget (not a duration) lets what was sent finish.
            if wl.max_requests and not stop.is_set() and tasks:
                waiter = asyncio.gather(*tasks, return_exceptions=True)
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
        # Closing with requests in flight disconnects them: the server aborts them.
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = clock() - start
    if progress:
        progress.update(elapsed, results, 0, force=True)
    return results, elapsed
