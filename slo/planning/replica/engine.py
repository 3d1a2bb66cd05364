"""A continuous-batching engine in the manner of vLLM V1's scheduler, pure and clock-driven.

Nothing here sleeps or reads the time: callers pass ``now`` (seconds) in. One engine iteration is
two calls, so that a real-time driver can sleep in between and a virtual-clock driver can jump:

- ``schedule(now) -> StepPlan | None`` picks the batch: running requests first (one decode token
  each, plus draft tokens with speculative decoding, or their next prefill chunk), then waiting
  requests in policy order while the token budget, ``max_num_seqs`` and the KV cache allow. The
  plan says how long the step takes on the profiled GPU.
- ``complete(plan, end) -> list[StepOutput]`` applies the step's results at time ``end``:
  sampled tokens, finished requests, freed blocks.

vLLM behaviours reproduced (``vllm/v1/core/sched/scheduler.py``):

- waiting requests are admitted only if the blocks for their *whole* prompt are free
  (``scheduler_reserve_full_isl``), and only when no preemption happened in the same step;
- prompts are prefilled in chunks within ``max_num_batched_tokens`` per step;
- when a running request cannot get a block, requests are preempted until it can: under
  ``priority`` the running request with the largest ``(priority, arrival_time)``, under ``fcfs``
  the most recently scheduled one. A preempted request loses its blocks and is recomputed later;
- prefix caching: a request admitted with a prompt whose first blocks are cached reuses them
  (at most ``num_tokens - 1`` tokens, so at least one token is computed);
- with LoRA, at most ``max_loras`` adapters run at once; other adapters' requests are deferred.

Statistics go to an ``EngineObserver`` (``serving.sim.metrics`` implements it).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from slo.planning.replica.kv_cache import BlockPool
from slo.planning.replica.profiles import Profile
from slo.planning.replica.queues import SchedulingPolicy, WaitingQueue
from slo.planning.replica.request import EngineRequest, FinishReason, RequestStatus
from slo.planning.replica.text import Prompt, natural_output_len

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineGauges",
    "EngineObserver",
    "NullObserver",
    "ScheduledItem",
    "SpecDecodeConfig",
    "StepOutput",
    "StepPlan",
]


@dataclass(frozen=True)
class SpecDecodeConfig:
    """Speculative decoding: ``num_speculative_tokens`` drafts per step and running sequence.

    Draft position ``i`` is accepted with probability ``acceptance * decay**i`` given that all
    earlier positions were accepted (verification stops at the first rejection), so the
    per-position acceptance rate decreases with the position.
    """

    num_speculative_tokens: int = 3
    acceptance: float = 0.7
    decay: float = 1.0
    method: str = "ngram"

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        if not 0 <= self.acceptance <= 1 or not 0 <= self.decay <= 1:
            raise ValueError("acceptance and decay must be in [0, 1]")

    def accept_probability(self, position: int) -> float:
        """P(draft ``position`` accepted | earlier drafts accepted), ratio 0-1."""
        return self.acceptance * self.decay ** position


@dataclass(frozen=True)
class EngineConfig:
    """What the engine runs: a profile and vLLM's scheduling options."""

    profile: Profile
    scheduling_policy: SchedulingPolicy = "fcfs"
    spec_decode: SpecDecodeConfig | None = None
    enable_prefix_caching: bool = True
    enable_lora: bool = False
    #: Distinct LoRA adapters that may run in one batch (vLLM's ``--max-loras``).
    max_loras: int = 1
    #: Mean of the lognormal natural output length, tokens.
    output_len_mean: float = 200.0
    #: Sigma of that lognormal (0.8: a long tail, median ~145 tokens).
    output_len_sigma: float = 0.8
    #: Seeds the speculative-decoding acceptance draws.
    seed: int = 0


@dataclass(frozen=True)
class EngineGauges:
    """The scheduler's state, as vLLM's gauges show it."""

    running: int
    #: Waiting requests, deferred ones included (vLLM's ``num_requests_waiting``).
    waiting: int
    #: Waiting requests deferred by a transient constraint (here: the LoRA budget).
    deferred: int
    #: Fraction 0-1 of KV blocks in use.
    kv_usage: float
    running_loras: tuple[str, ...] = ()
    waiting_loras: tuple[str, ...] = ()


class EngineObserver(Protocol):
    """Receives the engine's statistics. Times are seconds, lengths tokens."""

    def on_admitted(self, req: EngineRequest, queried_tokens: int, hit_tokens: int) -> None:
        """A request entered the running batch after a prefix-cache lookup."""

    def on_preempted(self, req: EngineRequest) -> None:
        """A running request lost its KV blocks and went back to waiting."""

    def on_output(self, req: EngineRequest, num_tokens: int, first: bool,
                  latency: float) -> None:
        """A request produced ``num_tokens`` tokens; ``latency`` is its TTFT if ``first``,
        else the time since its previous output (inter-token latency)."""

    def on_spec_decode(self, num_drafts: int, num_draft_tokens: int,
                       accepted_per_pos: Sequence[int]) -> None:
        """Speculative-decoding counts of one step."""

    def on_iteration(self, num_tokens: int) -> None:
        """One step ended: computed prompt tokens of completed prefills + generated tokens."""

    def on_finished(self, req: EngineRequest, now: float) -> None:
        """A request finished with ``stop`` or ``length`` (aborts bypass stats, as in vLLM)."""

    def on_gauges(self, gauges: EngineGauges) -> None:
        """The scheduler state changed."""


class NullObserver:
    """An observer that ignores everything."""

    def on_admitted(self, req: EngineRequest, queried_tokens: int, hit_tokens: int) -> None:
        pass

    def on_preempted(self, req: EngineRequest) -> None:
        pass

    def on_output(self, req: EngineRequest, num_tokens: int, first: bool,
                  latency: float) -> None:
        pass

    def on_spec_decode(self, num_drafts: int, num_draft_tokens: int,
                       accepted_per_pos: Sequence[int]) -> None:
        pass

    def on_iteration(self, num_tokens: int) -> None:
        pass

    def on_finished(self, req: EngineRequest, now: float) -> None:
        pass

    def on_gauges(self, gauges: EngineGauges) -> None:
        pass


@dataclass(slots=True)
class ScheduledItem:
    """One request's share of a step: ``num_new`` tokens computed, of which ``drafts`` drafts."""

    req: EngineRequest
    num_new: int
    drafts: int = 0


@dataclass
class StepPlan:
    """One scheduled engine step. ``start`` and ``duration`` are seconds."""

    start: float
    duration: float
    items: list[ScheduledItem]
    #: Prompt tokens computed in this step (prefill work).
    prefill_tokens: int = 0
    #: Sequences in the decode phase in this step.
    decode_seqs: int = 0
    preempted: list[EngineRequest] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one step produced for one request."""

    req: EngineRequest
    num_new_tokens: int
    finished: bool


class Engine:
    """The continuous-batching engine of one simulated vLLM replica."""

    def __init__(self, config: EngineConfig, observer: EngineObserver | None = None) -> None:
        self.config = config
        self.profile = config.profile
        self.observer: EngineObserver = observer or NullObserver()
        self.pool = BlockPool(self.profile.num_gpu_blocks,
                              enable_prefix_caching=config.enable_prefix_caching)
        self.waiting = WaitingQueue(config.scheduling_policy)
        self.running: list[EngineRequest] = []
        #: Unfinished requests by id.
        self.requests: dict[str, EngineRequest] = {}
        self._deferred = 0
        self._rng = random.Random(config.seed)
        self._plan_in_flight = False

    # --- requests ---------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: Prompt, *, max_tokens: int, now: float,
                    min_tokens: int = 0, ignore_eos: bool = False, seed: int | None = None,
                    priority: int = 0, lora_name: str | None = None) -> EngineRequest:
        """Queue a request that arrived at ``now`` (seconds).

        ``max_tokens`` is the effective limit (>= 1; prompt + max_tokens <= max_model_len).
        Without ``ignore_eos`` the request ends at its natural length (deterministic from the
        prompt and ``seed``), at least ``min_tokens``, at most ``max_tokens``.
        """
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if prompt.num_tokens + max_tokens > self.profile.max_model_len:
            raise ValueError(f"prompt ({prompt.num_tokens}) + max_tokens ({max_tokens}) exceeds "
                             f"max_model_len ({self.profile.max_model_len})")
        reason: FinishReason
        if ignore_eos:
            target, reason = max_tokens, "length"
        else:
            natural = natural_output_len(prompt.digest, seed, mean=self.config.output_len_mean,
                                         sigma=self.config.output_len_sigma)
            n = max(natural, min_tokens)
            target, reason = (max_tokens, "length") if n >= max_tokens else (n, "stop")
        req = EngineRequest(request_id=request_id, prompt=prompt, max_tokens=max_tokens,
                            target_tokens=target, target_reason=reason, priority=priority,
                            arrival_time=now, lora_name=lora_name)
        self.requests[request_id] = req
        self.waiting.add(req)
        self._publish_gauges()
        return req

    def _take(self, request_id: str) -> EngineRequest | None:
        """Remove an unfinished request from the engine (batch or queue); None if unknown."""
        req = self.requests.pop(request_id, None)
        if req is not None:
            (self.running if req.status is RequestStatus.RUNNING else self.waiting).remove(req)
        return req

    def abort(self, request_id: str) -> bool:
        """Abort a request at once: it leaves the batch or queue and its blocks are freed.

        Returns False when the request is unknown or already finished. Like a client disconnect
        in vLLM, this records no statistics (``OutputProcessor.abort_requests`` bypasses them).
        """
        req = self._take(request_id)
        if req is None:
            return False
        self._release(req, "abort")
        self._publish_gauges()
        return True

    def fail(self, request_id: str, now: float) -> bool:
        """Finish a request with reason ``error`` (vLLM's retryable internal error, e.g. a KV
        load failure): unlike an abort it is a finished request, counted in
        ``request_success_total{finished_reason="error"}``. False when unknown or finished."""
        req = self._take(request_id)
        if req is None:
            return False
        self._release(req, "error")
        self.observer.on_finished(req, now)
        self._publish_gauges()
        return True

    def abort_all(self) -> list[EngineRequest]:
        """Abort every unfinished request (engine shutdown); returns them."""
        reqs = list(self.requests.values())
        for r in reqs:
            self.abort(r.request_id)
        return reqs

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def prefill_backlog(self) -> int:
        """Prompt tokens of unfinished requests still to prefill (first token not yet out)."""
        return sum(r.prompt_len - min(r.num_computed, r.prompt_len)
                   for r in self.requests.values() if r.first_token_time is None)

    def gauges(self) -> EngineGauges:
        """The current scheduler state."""
        running_loras: tuple[str, ...] = ()
        waiting_loras: tuple[str, ...] = ()
        if self.config.enable_lora:
            running_loras = tuple(sorted({r.lora_name for r in self.running if r.lora_name}))
            waiting_loras = tuple(sorted({r.lora_name for r in self.waiting if r.lora_name}))
        return EngineGauges(running=len(self.running), waiting=len(self.waiting),
                            deferred=min(self._deferred, len(self.waiting)),
                            kv_usage=self.pool.usage(), running_loras=running_loras,
                            waiting_loras=waiting_loras)

    # --- one step -----------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan | None:
        """Pick the next batch at ``now``; None when there is nothing to run."""
        if self._plan_in_flight:
            raise RuntimeError("schedule() called twice without complete()")
        budget = self.profile.max_num_batched_tokens
        items: list[ScheduledItem] = []
        preempted: list[EngineRequest] = []
        k = self.config.spec_decode.num_speculative_tokens if self.config.spec_decode else 0

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            drafts = 0
            if k and req.decoding:
                drafts = max(0, min(k, req.target_tokens - req.num_generated - 1))
            num_new = min(req.num_tokens + drafts - req.num_computed, budget)
            if req.decoding:
                drafts = max(0, min(drafts, num_new - 1))
            need = self.profile.blocks_for(req.num_computed + num_new) - len(req.blocks)
            while need > self.pool.num_free:
                victim = self._pick_victim()
                vi = self.running.index(victim)
                self._preempt(victim)
                preempted.append(victim)
                for j, it in enumerate(items):  # refund a victim scheduled earlier this step
                    if it.req is victim:
                        budget += it.num_new
                        del items[j]
                        break
                if victim is req:
                    break
                if vi < i:
                    i -= 1
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted itself; running[i] is now the next request
            if need > 0:
                req.blocks.extend(self.pool.allocate(need))
            items.append(ScheduledItem(req, num_new, drafts))
            budget -= num_new
            i += 1

        if not preempted:
            budget = self._admit_waiting(now, budget, items)

        if not items:
            if preempted:
                self._publish_gauges()
            return None
        prefill = sum(it.num_new for it in items if not it.req.decoding)
        decode = [it for it in items if it.req.decoding]
        duration = self.profile.step_seconds(
            decode_seqs=len(decode),
            context_tokens=sum(it.req.num_computed for it in decode),
            compute_tokens=prefill + sum(it.drafts for it in decode),
        )
        self._plan_in_flight = True
        self._publish_gauges()
        return StepPlan(start=now, duration=duration, items=items, prefill_tokens=prefill,
                        decode_seqs=len(decode), preempted=preempted)

    def complete(self, plan: StepPlan, end: float) -> list[StepOutput]:
        """Apply a step's results at ``end`` (seconds): tokens, finished requests, stats."""
        self._plan_in_flight = False
        spec = self.config.spec_decode
        outputs: list[StepOutput] = []
        iteration_tokens = 0
        num_drafts = num_draft_tokens = 0
        accepted_per_pos = [0] * (spec.num_speculative_tokens if spec else 0)
        any_finished = False
        for item in plan.items:
            req = item.req
            if req.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            req.num_computed += item.num_new
            self._cache_full_blocks(req)
            if req.num_computed < req.num_tokens:
                continue  # a prefill chunk that did not reach the end of the prompt
            accepted = 0
            if item.drafts and spec is not None:
                while (accepted < item.drafts
                       and self._rng.random() < spec.accept_probability(accepted)):
                    accepted_per_pos[accepted] += 1
                    accepted += 1
                num_drafts += 1
                num_draft_tokens += item.drafts
                req.num_computed -= item.drafts - accepted  # rejected drafts' KV is discarded
            new = 1 + accepted
            first = req.first_token_time is None
            req.num_generated += new
            req.decoding = True
            iteration_tokens += new
            if first:
                req.first_token_time = end
                iteration_tokens += req.prompt_len - min(req.cached_tokens, req.prompt_len)
                self.observer.on_output(req, new, True, end - req.arrival_time)
            else:
                last = req.last_token_time if req.last_token_time is not None else end
                self.observer.on_output(req, new, False, end - last)
            req.last_token_time = end
            done = (req.num_generated >= req.target_tokens
                    or req.num_tokens >= self.profile.max_model_len)
            if done:
                reason: FinishReason = (req.target_reason
                                        if req.num_generated >= req.target_tokens else "length")
                self.requests.pop(req.request_id, None)
                self._release(req, reason)
                self.observer.on_finished(req, end)
                any_finished = True
            outputs.append(StepOutput(req, new, done))
        if any_finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        if num_drafts:
            self.observer.on_spec_decode(num_drafts, num_draft_tokens, accepted_per_pos)
        self.observer.on_iteration(iteration_tokens)
        self._publish_gauges()
        return outputs

    def step(self, now: float) -> tuple[float, list[StepOutput]] | None:
        """One whole step on a virtual clock: schedule at ``now``, complete when it ends.

        Returns ``(end, outputs)`` with ``end = now + duration`` (seconds), or None when idle.
        """
        plan = self.schedule(now)
        if plan is None:
            return None
        end = now + plan.duration
        return end, self.complete(plan, end)

    # --- internals ----------------------------------------------------------------------------

    def _admit_waiting(self, now: float, budget: int, items: list[ScheduledItem]) -> int:
        """Move waiting requests into the batch while everything allows; returns the budget."""
        bs = self.profile.block_size
        deferred: list[EngineRequest] = []
        running_loras = ({r.lora_name for r in self.running if r.lora_name}
                         if self.config.enable_lora else set())
        while budget > 0 and len(self.running) < self.profile.max_num_seqs:
            req = self.waiting.peek()
            if req is None:
                break
            if (req.lora_name and req.lora_name not in running_loras
                    and len(running_loras) >= self.config.max_loras):
                deferred.append(self.waiting.pop())  # another adapter must finish first
                continue
            num_tokens = req.num_tokens
            hit = self.pool.cached_prefix(req.prompt.block_hashes, (num_tokens - 1) // bs)
            hit_tokens = len(hit) * bs
            # scheduler_reserve_full_isl: the whole prompt must fit, not only the first chunk.
            needed = self.profile.blocks_for(num_tokens) - len(hit)
            if needed > self.pool.num_free - self.pool.count_free(hit):
                break
            num_new = min(num_tokens - hit_tokens, budget)
            self.waiting.pop()
            self.pool.touch(hit)
            req.blocks = list(hit)
            req.blocks.extend(self.pool.allocate(
                self.profile.blocks_for(hit_tokens + num_new) - len(hit)))
            req.num_computed = hit_tokens
            req.num_cached_blocks = len(hit)
            req.cached_tokens = hit_tokens
            req.decoding = False
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            if req.lora_name:
                running_loras.add(req.lora_name)
            self.running.append(req)
            self.observer.on_admitted(req, num_tokens, hit_tokens)
            items.append(ScheduledItem(req, num_new))
            budget -= num_new
        if deferred:
            self.waiting.put_back(deferred)
        self._deferred = len(deferred)
        return budget

    def _pick_victim(self) -> EngineRequest:
        if self.config.scheduling_policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, req: EngineRequest) -> None:
        self.running.remove(req)
        self.pool.free(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.num_cached_blocks = 0
        req.decoding = False
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.add_preempted(req)
        self.observer.on_preempted(req)

    def _release(self, req: EngineRequest, reason: FinishReason) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        self.pool.free(req.blocks)
        req.blocks = []

    def _cache_full_blocks(self, req: EngineRequest) -> None:
        """Register the prompt blocks this request has fully computed in the prefix cache."""
        hashes = req.prompt.block_hashes
        full = min(req.num_computed // self.profile.block_size, len(hashes))
        for b in range(req.num_cached_blocks, full):
            self.pool.cache(req.blocks[b], hashes[b])
        req.num_cached_blocks = max(req.num_cached_blocks, full)

    def _publish_gauges(self) -> None:
        self.observer.on_gauges(self.gauges())
