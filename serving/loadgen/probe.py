"""One load level of a capacity search against a live endpoint (``vigil capacity``).

``run_probe`` keeps exactly ``concurrency`` streamed chat completions in flight (a closed
loop: each client sends its next request the moment the previous one ends), timing each with
``client.send_one`` as ``vigil loadgen`` and ``vllm bench serve`` time theirs. Each request has
a prompt that shares no prefix with the others (so neither a prefix cache nor the gateway's
cache makes it cheaper than real traffic) and generates exactly its ``max_tokens`` (vLLM's
``ignore_eos``); both lengths are drawn uniformly within ±50 % of ``prompt_tokens`` and
``output_tokens`` (``slo.planning.capacity_search.RANGE_RATIO``, ``vllm bench serve``'s
``--random-range-ratio 0.5``), so that the loop does not stay in lock step.

What is measured, and why (which requests count and when the probe ends is decided by
``slo.planning.capacity_search.ProbeWindow``, pure, so that its rules are tested on synthetic
outcomes):

* The first ``concurrency`` requests are a warm-up and are not counted: they start together
  on an idle server, which real steady load never does.
* The measured window opens with the first request after the warm-up. A level whose every
  request is far within each SLO's threshold (``[capacity] clear_margin``) closes it after
  ``clear_probe_requests`` requests, whatever the time (judged in send order, as far as every
  request has finished: the first to finish are the fast ones). Any other level runs at least
  ``probe_duration`` and ``min_probe_requests`` requests, and while the requests finished so
  far leave its attainment interval unresolved it is extended by chunks, up to
  ``max_probe_requests``.
* When the window closes, the load goes on: the clients keep sending (uncounted) requests
  until every counted one has finished, so the last counted requests run at the same load as
  the others and none is cut short (no truncation bias). Then the uncounted ones are cancelled.
  Should a counted request still in flight when the margin closed the window be slower than
  the margin allows, the window opens again and the level is measured as any other.
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
import random
import time
from collections.abc import Callable, Sequence

import httpx

from serving.loadgen.client import send_one
from serving.loadgen.report import RequestResult
from serving.loadgen.workload import PlannedRequest
from slo.planning.capacity_search import (
    Margin,
    ProbeWindow,
    RequestOutcome,
    probe_from_outcomes,
    probe_length,
)
from vigil.capacity import Probe, SloTarget
from vigil.config import CapacityConfig
from vigil.conventions import TIER_PREMIUM

__all__ = ["outcome_of", "probe_request", "run_probe"]

log = logging.getLogger(__name__)

#: The tier a probe's requests are sent as: vLLM priority 0, which vLLM accepts under either
#: scheduling policy (a non-zero priority is refused under ``fcfs``).
_TIER = TIER_PREMIUM
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
    cacheable prefix) asking for exactly ``output_tokens`` tokens, both drawn within
    ``RANGE_RATIO`` of the given means (``slo.planning.capacity_search.probe_length``)."""
    prompt_tokens = probe_length(prompt_tokens, rng)
    output_tokens = probe_length(output_tokens, rng)
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
    window = ProbeWindow(slos, capacity, concurrency)
    errors: list[str] = []  # the counted requests' errors
    sent = 0
    all_done = asyncio.Event()

    async def worker() -> None:
        nonlocal sent
        while True:
            index = window.admit(clock())
            if window.done:
                # Closed on this send with every counted request finished (at concurrency 1,
                # say): nothing is left to wait for.
                all_done.set()
                return
            req = probe_request(model, prompt_tokens, output_tokens, sent, rng)
            sent += 1
            result = RequestResult(tier=_TIER, kind="normal", stream=True)
            await send_one(client, base, req, keys, result, clock)
            if result.error:
                # A server refusing at once would otherwise be hit in a tight loop.
                await asyncio.sleep(0.01)
            if index is not None:
                if result.error:
                    errors.append(result.error)
                window.finish(index, outcome_of(result), clock())
                if window.done:
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
    outcomes = window.outcomes
    if errors:
        log.warning("probe at concurrency %d: %d of %d requests failed (first: %s)",
                    concurrency, len(errors), len(outcomes), errors[0])
    return probe_from_outcomes(concurrency, outcomes, window.duration_s, slos,
                               capacity.confidence, Margin.of(capacity))
