"""The load of a capacity search against a live endpoint (``vigil capacity``): its levels and its
opening ramp.

A probe keeps exactly ``concurrency`` streamed chat completions in flight (a closed
loop: each client sends its next request the moment the previous one ends), timing each with
``client.send_one`` as ``vigil loadgen`` and ``vllm bench serve`` time theirs. Each request has
a prompt that shares no prefix with the others (so neither a prefix cache nor the gateway's
cache makes it cheaper than real traffic) and generates exactly its ``max_tokens`` (vLLM's
``ignore_eos``); both lengths are drawn uniformly within ±50 % of ``prompt_tokens`` and
``output_tokens`` (``slo.planning.capacity_search.RANGE_RATIO``, ``vllm bench serve``'s
``--random-range-ratio 0.5``), so that the loop does not stay in lock step.

What is measured, and why (which requests count and when the probe ends is decided by
``slo.planning.capacity_search.ProbeWindow``, pure, so that its rules are tested on synthetic
outcomes; how the opening ramp grows and stops by ``slo.planning.capacity_search.Ramp``):

* Warm levels (``LoadRunner``). A search keeps one closed loop running from its first
  request to its last, and each level only changes its number of clients: a level never
  starts on an idle server, so the wave of ``concurrency`` requests that a cold start sends
  together (and must throw away) is not sent at all. Going up, only the first requests of the
  clients added are left out (they start together, a burst the steady load does not have);
  going down, the surplus clients are cancelled with their requests, uncounted ones, which
  the server aborts (vLLM and the simulator abort a request whose client goes away), and the
  level counts from its next request. ``run_probe`` measures one level from a cold start, a
  loop of its own: its first ``concurrency`` requests are the warm-up.
* The opening ramp (``LoadRunner.ramp``, ``[capacity] ramp``): one client, one more each time
  a request finishes, until the last requests miss an SLO too often; each request tagged
  with the mean number in flight over its life. It judges no level: it estimates the knee,
  where the search starts probing.
* The measured window opens with the first request after the warm-up. A level whose every
  request is far within each SLO's threshold (``[capacity] clear_margin``) closes it after
  ``clear_probe_requests`` requests, whatever the time (judged in send order, as far as every
  request has finished: the first to finish are the fast ones). A level whose finished
  requests already show a clear failure, at a confidence corrected for the repeated looks,
  closes it after one full turnover of the loop at the earliest (``[capacity] early_fail``).
  Any other level runs at least ``probe_duration`` and ``min_probe_requests`` requests, and
  while the requests finished so far leave its attainment interval unresolved it is extended
  by chunks, up to ``max_probe_requests``.
* When the window closes, the load goes on: the clients keep sending (uncounted) requests
  until every counted one has finished, so the last counted requests run at the same load as
  the others and none is cut short (no truncation bias). Then the next level changes the
  number of clients (``run_probe``: the uncounted requests are cancelled). Should a counted
  request still in flight when the margin closed the window be slower than the margin
  allows, the window opens again and the level is measured as any other.
* Rates come from Little's law, exact for a closed loop without think time: ``concurrency``
  slots are always busy, so the counted requests took ``sum(slot time) / concurrency``
  seconds of the run (``Probe.duration_s``), whatever the phase of the clients. Counting
  sends or completions in a wall-clock window instead is off by up to one "wave" of
  ``concurrency`` requests when identical requests move in lockstep, as they do on a server
  that treats them alike. Each level's requests are its own (sent once the load is at the
  level, finished before it changes), so the accounting stays per level.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import httpx

from serving.loadgen.client import send_one
from serving.loadgen.report import RequestResult
from serving.loadgen.workload import PlannedRequest
from slo.planning.capacity_search import (
    Margin,
    ProbeWindow,
    Ramp,
    RampSummary,
    RequestOutcome,
    probe_from_outcomes,
    probe_length,
)
from vigil.capacity import Probe, SloTarget
from vigil.config import CapacityConfig
from vigil.conventions import TIER_PREMIUM

__all__ = ["LoadRunner", "outcome_of", "probe_request", "run_probe"]

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


class _Phase(ABC):
    """What the loop's requests count for while it lasts: a level's ``ProbeWindow`` or the
    opening ``Ramp``; ``ended`` is set once the phase is over."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    @abstractmethod
    def admit(self, now: float) -> int | None:
        """A request is sent at ``now``: its token, None when it is not counted."""

    @abstractmethod
    def finish(self, token: int, result: RequestResult, now: float) -> None:
        """The counted request ``token`` ended at ``now`` with ``result``."""


class _LevelPhase(_Phase):
    def __init__(self, window: ProbeWindow) -> None:
        super().__init__()
        self.window = window
        self.errors: list[str] = []  # the counted requests' errors

    def admit(self, now: float) -> int | None:
        index = self.window.admit(now)
        if self.window.done:
            # Closed on this send with every counted request finished (at concurrency 1,
            # say): nothing is left to wait for.
            self.ended.set()
        return index

    def finish(self, token: int, result: RequestResult, now: float) -> None:
        if result.error:
            self.errors.append(result.error)
        self.window.finish(token, outcome_of(result), now)
        if self.window.done:
            self.ended.set()


class _RampPhase(_Phase):
    def __init__(self, ramp: Ramp, grow: Callable[[int], None]) -> None:
        super().__init__()
        self.ramp = ramp
        self._grow = grow

    def admit(self, now: float) -> int | None:
        return None if self.ramp.done else self.ramp.admit(now)

    def finish(self, token: int, result: RequestResult, now: float) -> None:
        added = self.ramp.finish(token, outcome_of(result), now)
        if added:
            self._grow(added)
        if self.ramp.done:
            self.ended.set()


class LoadRunner:
    """One closed loop against a live endpoint, kept running across the levels of a search
    (module docs, "Warm levels"): ``ramp`` opens it, each ``probe`` sets its number of streams
    and measures one level, ``close`` cancels what is in flight.

    ``client`` must allow as many connections as the most streams asked for."""

    def __init__(self, base_url: str, model: str, *, prompt_tokens: int, output_tokens: int,
                 api_key: str | None, client: httpx.AsyncClient, seed: int = 0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must be at least 1")
        base = base_url.rstrip("/")
        self._base = base[:-3] if base.endswith("/v1") else base
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._output_tokens = output_tokens
        self._keys = {_TIER: api_key} if api_key else {}
        self._client = client
        self._clock = clock
        self._rng = random.Random(f"{seed}:loop")
        self._sent = 0
        self._workers: list[asyncio.Task[None]] = []
        self._phase: _Phase | None = None
        self._failure: BaseException | None = None
        #: Concurrencies of the levels that stopped early on a clear failure.
        self.early_failed: list[int] = []

    @property
    def streams(self) -> int:
        """The closed-loop clients running now."""
        return len(self._workers)

    def _resize(self, streams: int) -> None:
        """Run ``streams`` clients: new ones send at once; surplus ones are cancelled with
        their request in flight, which the server aborts (vLLM and the simulator abort a
        request whose client goes away), so the load drops at once. Only uncounted requests
        are ever in flight when streams are retired (``probe`` retires them between levels,
        after the last level's counted requests have all finished)."""
        while len(self._workers) > streams:
            self._workers.pop().cancel()
        while len(self._workers) < streams:
            task = asyncio.create_task(self._worker())
            task.add_done_callback(self._worker_ended)
            self._workers.append(task)

    def _worker_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self._failure is None:
            # A client that died (not an HTTP error, which send_one records) would leave the
            # level waiting for requests that never come: end the phase with the error.
            self._failure = exc
            if self._phase is not None:
                self._phase.ended.set()

    async def _worker(self) -> None:
        while True:
            phase = self._phase
            token = phase.admit(self._clock()) if phase is not None else None
            req = probe_request(self._model, self._prompt_tokens, self._output_tokens,
                                self._sent, self._rng)
            self._sent += 1
            result = RequestResult(tier=_TIER, kind="normal", stream=True)
            await send_one(self._client, self._base, req, self._keys, result, self._clock)
            if result.error:
                # A server refusing at once would otherwise be hit in a tight loop.
                await asyncio.sleep(0.01)
            if phase is not None and token is not None:
                phase.finish(token, result, self._clock())

    async def _run(self, phase: _Phase) -> None:
        await phase.ended.wait()
        self._phase = None
        if self._failure is not None:
            raise self._failure

    async def ramp(self, slos: Sequence[SloTarget], max_concurrency: int) -> RampSummary:
        """The opening ramp (``slo.planning.capacity_search.Ramp``) from the streams running
        now (one when none): its summary gives where the search starts. The loop goes on
        afterwards, at the streams the ramp reached, until the first ``probe``."""
        ramp = Ramp(slos, max_concurrency)
        phase = _RampPhase(ramp, lambda n: self._resize(self.streams + n))
        self._phase = phase
        if not self._workers:
            self._resize(1)
        await self._run(phase)
        return ramp.summary()

    async def probe(self, concurrency: int, slos: Sequence[SloTarget],
                    capacity: CapacityConfig) -> Probe:
        """Measure one level: ``concurrency`` streams, judged by a ``ProbeWindow``. From a
        loop already running, going up skips only the first requests of the streams added
        (they start together); going down retires the surplus streams first; from none, the
        first ``concurrency`` requests are the warm-up, as ``run_probe``'s."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency!r}")
        running = self.streams
        warm_up = concurrency if running == 0 else max(0, concurrency - running)
        phase = _LevelPhase(ProbeWindow(slos, capacity, concurrency, warm_up=warm_up))
        if concurrency < running:
            self._resize(concurrency)
        # The window is in place before the new streams send, so that their first requests
        # are the ones it skips.
        self._phase = phase
        self._resize(concurrency)
        await self._run(phase)
        window = phase.window
        if window.early_failed:
            self.early_failed.append(concurrency)
        outcomes = window.outcomes
        if phase.errors:
            log.warning("probe at concurrency %d: %d of %d requests failed (first: %s)",
                        concurrency, len(phase.errors), len(outcomes), phase.errors[0])
        return probe_from_outcomes(concurrency, outcomes, window.duration_s, slos,
                                   capacity.confidence, Margin.of(capacity))

    async def close(self) -> None:
        """Cancel every client and its request in flight."""
        workers, self._workers = self._workers, []
        for t in workers:
            t.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


async def run_probe(base_url: str, model: str, concurrency: int, *, prompt_tokens: int,
                    output_tokens: int, api_key: str | None, slos: Sequence[SloTarget],
                    capacity: CapacityConfig, client: httpx.AsyncClient, seed: int = 0,
                    clock: Callable[[], float] = time.perf_counter) -> Probe:
    """Measure ``model`` at ``base_url`` (the API base, ``http://host:port``) with
    ``concurrency`` requests in flight from a cold start (a loop of its own, ended after the
    level); see the module's docstring for the method.

    ``api_key`` is sent as a bearer token; ``client`` must allow ``concurrency`` connections.
    Percentiles are seconds; rates per second over the measured window."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency!r}")
    runner = LoadRunner(base_url, model, prompt_tokens=prompt_tokens,
                        output_tokens=output_tokens, api_key=api_key, client=client,
                        seed=seed + concurrency, clock=clock)
    try:
        return await runner.probe(concurrency, slos, capacity)
    finally:
        await runner.close()
