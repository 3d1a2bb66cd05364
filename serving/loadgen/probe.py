"""One load level of a capacity search against a live endpoint (``vigil capacity``).

``run_probe`` keeps exactly ``concurrency`` streamed chat completions in flight (a closed
loop: each client sends its next request the moment the previous one ends), timing each with
``client.send_one`` as ``vigil loadgen`` and ``vllm bench serve`` time theirs. Every request has
the same shape: a prompt of about ``prompt_tokens`` tokens that shares no prefix with the others
(so neither a prefix cache nor the gateway's cache makes it cheaper than real traffic) and
exactly ``output_tokens`` generated tokens (``max_tokens`` with vLLM's ``ignore_eos``).

What is measured, and why:

* The first ``concurrency`` requests are a warm-up and are not counted: they start together
  on an idle server, which real steady load never does.
* The measured window opens with the first request after the warm-up and stays open for at
  least ``[capacity] probe_duration`` and ``min_probe_requests`` requests; while the requests
  finished so far leave the verdict unresolved (``slo.capacity_search.judge``), it is extended
  by chunks, up to ``max_probe_requests``.
* When the window closes, the load goes on: the clients keep sending (uncounted) requests
  until every counted one has finished, so the last counted requests run at the same load as
  the others and none is cut short (no truncation bias). Then the uncounted ones are cancelled.
* Rates come from Little's law, exact for a closed loop without think time: ``concurrency``
  slots are always busy, so the counted requests took ``sum(slot time) / concurrency``
  seconds of the run (``Probe.duration_s``), whatever the phase of the clients. Counting
  sends or completions in a wall-clock window instead is off by up to one "wave" of
  ``concurrency`` requests when identical requests move in lockstep, as they do on a server
  that treats them alike.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Sequence

import httpx

from serving.loadgen.client import send_one
from serving.loadgen.report import RequestResult
from serving.loadgen.workload import PlannedRequest
from slo.capacity_search import RequestOutcome, judge, probe_from_outcomes
from vigil.capacity import Probe, SloTarget
from vigil.config import CapacityConfig

__all__ = ["outcome_of", "probe_request", "run_probe"]

log = logging.getLogger(__name__)

#: The tier a probe's requests are sent as: vLLM priority 0, which vLLM accepts under either
#: scheduling policy (a non-zero priority is refused under ``fcfs``).
_TIER = "premium"
#: Prompt tokens a chat template adds around the user's message (Llama-3's is about this).
_TEMPLATE_TOKENS = 8
#: Characters per token of English text, the usual rule of thumb (and the simulator's).
_CHARS_PER_TOKEN = 4
_WORDS = ("capacity", "latency", "tokens", "replica", "budget", "queue", "batch", "cache",
          "prefill", "decode", "objective", "request", "server", "model", "memory", "step")


def probe_request(model: str, prompt_tokens: int, output_tokens: int, index: int,
                  rng: random.Random) -> PlannedRequest:
    """The ``index``-th request of a probe: a streamed chat completion of about
    ``prompt_tokens`` prompt tokens (the count opens the text, so no two requests share a
    cacheable prefix) asking for exactly ``output_tokens`` tokens."""
    want = max(1, prompt_tokens - _TEMPLATE_TOKENS) * _CHARS_PER_TOKEN
    parts = [f"{index}:{rng.getrandbits(32):08x}"]
    size = len(parts[0])
    while size < want:
        word = rng.choice(_WORDS)
        parts.append(word)
        size += len(word) + 1
    body = {
        "model": model,
        "messages": [{"role": "user", "content": " ".join(parts)[:want]}],
        "max_tokens": output_tokens,
        # A vLLM extension, as `vllm bench serve` uses it: exactly max_tokens are generated.
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return PlannedRequest("/v1/chat/completions", body, _TIER, "normal", True)


def outcome_of(r: RequestResult) -> RequestOutcome:
    """A loadgen result as the search judges it (ITL: the request's mean gap between
    streamed chunks, seconds)."""
    itl = sum(r.itl) / len(r.itl) if r.itl else None
    return RequestOutcome(ok=r.ok, ttft_s=r.ttft, e2e_s=r.e2e, itl_s=itl,
                          output_tokens=r.output_tokens)


async def run_probe(base_url: str, model: str, concurrency: int, *, prompt_tokens: int,
                    output_tokens: int, api_key: str | None, slos: Sequence[SloTarget],
                    capacity: CapacityConfig, client: httpx.AsyncClient, seed: int = 0,
                    clock: Callable[[], float] = time.perf_counter) -> Probe:
    """Measure ``model`` at ``base_url`` (the API base, ``http://host:port``) with
    ``concurrency`` requests in flight; see the module's docstring for the method.

    ``api_key`` is sent as a bearer token; ``client`` must allow ``concurrency`` connections.
    Percentiles are seconds; rates per second over the measured window."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency!r}")
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError("prompt_tokens and output_tokens must be at least 1")
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    keys = {_TIER: api_key} if api_key else {}
    rng = random.Random(f"{seed}:{concurrency}")
    cap = capacity.max_probe_requests
    chunk = max(concurrency, math.ceil(capacity.min_probe_requests / 2))
    target = capacity.min_probe_requests
    # (send time, result) of every counted request, in send order
    measured: list[tuple[float, RequestResult]] = []
    busy = [0.0]  # seconds of slot time the counted requests took
    done: list[RequestOutcome] = []  # the counted requests finished so far
    sent = 0
    closed = False
    all_done = asyncio.Event()

    def close() -> None:
        nonlocal closed
        closed = True
        if len(done) == len(measured):
            all_done.set()

    def counted(now: float) -> bool:
        """Whether the request about to be sent now is counted; closes the window."""
        nonlocal target
        if sent < concurrency or closed:
            return False
        n = len(measured)
        if n >= cap:
            close()
            return False
        if n < target or now - measured[0][0] < capacity.probe_duration:
            return True
        if len(done) < capacity.min_probe_requests or (
                judge(done, slos, capacity.confidence).verdict == "unresolved"):
            target = min(cap, n + chunk)
            if n < target:
                return True
        close()
        return False

    async def worker() -> None:
        nonlocal sent
        while True:
            now = clock()
            mine = counted(now)
            req = probe_request(model, prompt_tokens, output_tokens, sent, rng)
            sent += 1
            result = RequestResult(tier=_TIER, kind="normal", stream=True)
            if mine:
                measured.append((now, result))
            await send_one(client, base, req, keys, result, clock)
            if result.error:
                # A server refusing at once would otherwise be hit in a tight loop.
                await asyncio.sleep(0.01)
            if mine:
                busy[0] += clock() - now
                done.append(outcome_of(result))
                if closed and len(done) == len(measured):
                    all_done.set()

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    waiter = asyncio.ensure_future(all_done.wait())
    try:
        await asyncio.wait({waiter, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            if t.done() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        waiter.cancel()
    errors = [r.error for _, r in measured if r.error]
    if errors:
        log.warning("probe at concurrency %d: %d of %d requests failed (first: %s)",
                    concurrency, len(errors), len(measured), errors[0])
    return probe_from_outcomes(concurrency, [outcome_of(r) for _, r in measured],
                               busy[0] / concurrency, slos, capacity.confidence)
