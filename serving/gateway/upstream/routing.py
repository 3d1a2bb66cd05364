"""Prefix-aware routing: send a request where its prompt's prefix is likely cached.

``[gateway] routing = "prefix_aware"`` (the default). For each replica the gateway remembers the
prompt chunks (``prompt_key.PromptKey``) it sent there recently, in an LRU as large as the
replica's KV cache (``vllm:cache_config_info``: ``num_gpu_blocks`` x ``block_size`` tokens,
else ``DEFAULT_KV_TOKENS``). The candidates are the replicas that can take the
request (healthy, KV usage at most ``max_kv_usage``) whose load stays within a bound: requests
in flight at most the least loaded replica's plus ``max(LOAD_SLACK, LOAD_RATIO x the mean)``
(a cache hit saves prefill, not decode: a replica far busier than the others would make every
token of the request slower than the prefill it saves). A replica holds the prompt when it
holds a run of its leading chunks worth at least ``max(MIN_MATCH_TOKENS, MIN_MATCH_RATIO x
the prompt)`` tokens (a shorter match saves too little to outweigh load: a company's short
boilerplate would pull every tenant to one replica). Then:

* no candidate holds it: the fewest requests in flight, then the least prefill waiting, then
  rendezvous hashing of the prompt's ``anchor`` with the replicas' names (``rendezvous``), so
  a new tenant's first requests land on the same replica from every gateway instance when the
  replicas are equally idle, and not on one by the rotation's chance; traffic that shares no
  prefix is still routed by least outstanding;
* else the one holding the longest run (ties: fewer in flight), when the pool has no TTFT SLO
  or its predicted time to first token meets the SLO threshold: (uncached prompt tokens +
  tokens still waiting for a first token there) / the replica's prefill rate, learned from
  the TTFT of its streaming requests (``DEFAULT_PREFILL_TOKENS_PER_S`` before any);
* else the candidate with the smallest predicted TTFT (ties: fewer in flight), the holder's
  included: a replica without the prefix must prefill all of it, which may well be slower.

A replica that leaves or restarts (``process_start_time_seconds`` changed or
``vllm:prefix_cache_queries_total`` went back; or back from down when it exports neither)
starts with an empty LRU: its cache is empty.

This module holds the per-replica state, the arithmetic and the choice itself
(``choose_replica``, a pure function of the replicas' state); ``replicas.Upstreams`` keeps the
membership and the rotation and calls it, ``forwarder.Forwarder`` records what it sent and when the
first token came.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from serving.gateway.upstream.prompt_key import CHUNK_TOKENS, PromptKey
from slo.objectives.spec import effective_slos
from vigil.config import Config
from vigil.conventions import ENDPOINT_ALL

__all__ = [
    "DEFAULT_KV_TOKENS",
    "DEFAULT_PREFILL_TOKENS_PER_S",
    "LOAD_RATIO",
    "LOAD_SLACK",
    "MIN_LEARN_TOKENS",
    "MIN_MATCH_RATIO",
    "MIN_MATCH_TOKENS",
    "PREFILL_EWMA_ALPHA",
    "RATE_STEP",
    "UNARY_PREFILL_FACTOR",
    "UNARY_PREFILL_MAX_S",
    "Candidate",
    "ReplicaRouting",
    "Sent",
    "choose_replica",
    "load_bound",
    "rendezvous",
    "threshold_for",
    "ttft_thresholds",
    "uncached_tokens",
    "useful_match",
]

#: KV-cache capacity assumed for a replica whose /metrics has no ``vllm:cache_config_info``
#: (tokens): a 7-8B model on one 80 GB GPU holds a few hundred thousand, a smaller GPU or a
#: larger model far fewer; underestimating only forgets prefixes early.
DEFAULT_KV_TOKENS = 100_000
#: Prefill throughput assumed before a replica's first observed TTFT (tokens per second):
#: below what one H100 prefills for a 7-8B model (well over 10,000), so until it has data the
#: router rather doubts than overloads a replica.
DEFAULT_PREFILL_TOKENS_PER_S = 5_000.0
#: Weight of a new observation in the prefill-rate EWMA: about the last ten streams count.
PREFILL_EWMA_ALPHA = 0.2
#: A TTFT observation teaches the prefill rate only when the prefill work it waited for was at
#: least this many tokens: below, network and scheduling overheads, not prefill, make its TTFT.
MIN_LEARN_TOKENS = 256
#: One TTFT observation moves the learned rate by at most this factor either way: a first
#: byte that came early for another reason (a proxy's buffering, an error cut short) must not
#: turn 5,000 tokens/s into 64,000 in one step.
RATE_STEP = 4.0
#: A match counts only when it saves at least ``max(MIN_MATCH_TOKENS, MIN_MATCH_RATIO x the
#: prompt's tokens)`` of prefill (SGLang's cache-aware router has a similar match-ratio
#: threshold): a few shared chunks of boilerplate are not worth a busier replica.
MIN_MATCH_TOKENS = 256
MIN_MATCH_RATIO = 0.3
#: A non-streaming request's prefill counts as waiting for ``UNARY_PREFILL_FACTOR`` x its
#: predicted prefill time, at most ``UNARY_PREFILL_MAX_S`` seconds: its first token is not
#: seen, and counting it until the whole answer would inflate every prediction behind it.
UNARY_PREFILL_FACTOR = 1.5
UNARY_PREFILL_MAX_S = 60.0
#: The load bound: a replica may have at most ``min + max(LOAD_SLACK, LOAD_RATIO x mean)``
#: requests in flight to be chosen for its cache. The slack lets a tenant's bursts stay on
#: one replica at low load (a few requests more cost little on a batch of dozens); the ratio
#: lets the imbalance grow with the load but never past half the mean again, the point where
#: decode slowdown on the busy replica outweighs the prefill saved (SGLang's cache-aware
#: router uses the same two-part shape: an absolute and a relative threshold).
LOAD_SLACK = 4
LOAD_RATIO = 0.5


def load_bound(outstanding: list[int]) -> float:
    """The most requests in flight a replica may have to be chosen for its cache, given the
    in-flight counts of the replicas that can take the request."""
    return min(outstanding) + max(LOAD_SLACK, LOAD_RATIO * sum(outstanding) / len(outstanding))


def rendezvous(anchor: int, name: str) -> int:
    """The weight of replica ``name`` for a prompt of ``anchor`` (``PromptKey.anchor``): the
    highest weight among tied replicas wins. blake2b, so every gateway process agrees."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8,
                             key=anchor.to_bytes(8, "big")).digest()
    return int.from_bytes(digest, "big")


def useful_match(prompt: PromptKey, matched: int) -> int:
    """``matched`` leading chunks of ``prompt`` when they save enough prefill to count
    (``MIN_MATCH_TOKENS``, ``MIN_MATCH_RATIO``), else 0."""
    saved = matched * CHUNK_TOKENS
    return matched if saved >= max(MIN_MATCH_TOKENS, MIN_MATCH_RATIO * prompt.tokens) else 0


def ttft_thresholds(cfg: Config) -> dict[tuple[str, str], float]:
    """(pool, endpoint) -> the strictest TTFT SLO threshold (seconds) that applies to it
    (``endpoint`` ``all`` for an SLO over every endpoint); pools without one are absent."""
    out: dict[tuple[str, str], float] = {}
    for spec in effective_slos(cfg):
        if spec.indicator != "ttft" or spec.threshold_seconds is None:
            continue
        key = (spec.pool, spec.endpoint)
        out[key] = min(out.get(key, spec.threshold_seconds), spec.threshold_seconds)
    return out


def threshold_for(thresholds: dict[tuple[str, str], float], pool: str,
                  endpoint: str) -> float | None:
    """The TTFT threshold (seconds) a request of ``pool`` and ``endpoint`` must meet, or None."""
    both = [t for t in (thresholds.get((pool, endpoint)), thresholds.get((pool, ENDPOINT_ALL)))
            if t is not None]
    return min(both) if both else None


class ReplicaRouting:
    """What prefix-aware routing knows of one replica: the prompt chunks sent to it recently
    (an LRU of at most ``capacity_tokens`` worth of chunks), the prefill work waiting there
    for a first token, its learned prefill rate, and how its requests were routed."""

    __slots__ = ("_lru", "capacity_tokens", "counter", "load_routed", "pending_tokens",
                 "prefill_rate", "prefix_routed", "start_time")

    def __init__(self, capacity_tokens: int = DEFAULT_KV_TOKENS) -> None:
        # Least recently sent first: that end is forgotten first, as vLLM evicts free blocks.
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.capacity_tokens = capacity_tokens
        #: Uncached prompt tokens of the requests sent here still waiting for their first token.
        self.pending_tokens = 0
        #: Learned prefill throughput (tokens per second); None before the first observation.
        self.prefill_rate: float | None = None
        #: Requests sent here for their cached prefix, and by load (no prefix, or over bounds).
        self.prefix_routed = 0
        self.load_routed = 0
        #: The replica's ``process_start_time_seconds`` (Unix seconds) and
        #: ``vllm:prefix_cache_queries_total`` (tokens) at the last poll: how a restart shows.
        self.start_time: float | None = None
        self.counter: float | None = None

    @property
    def chunks(self) -> int:
        """Chunks remembered now."""
        return len(self._lru)

    @property
    def capacity_chunks(self) -> int:
        return max(1, self.capacity_tokens // CHUNK_TOKENS)

    def set_capacity(self, tokens: int) -> None:
        """The replica's KV cache holds ``tokens``: remember at most that much."""
        self.capacity_tokens = max(CHUNK_TOKENS, tokens)
        self._trim()

    def matched(self, hashes: tuple[int, ...]) -> int:
        """How many leading chunks of ``hashes`` were sent here (and not forgotten)."""
        lru = self._lru
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def record(self, hashes: tuple[int, ...]) -> tuple[int, ...]:
        """The chunks ``hashes`` were sent here: they are the most recent now, the first one
        most of all (vLLM frees a request's blocks tail first, so a prefix outlives its
        continuations, and so does its memory here). Returns the ones not remembered before."""
        lru = self._lru
        added: list[int] = []
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                added.append(h)
        self._trim()
        return tuple(added)

    def unrecord(self, hashes: tuple[int, ...]) -> None:
        """The chunks ``hashes`` never reached the replica's cache after all."""
        lru = self._lru
        for h in hashes:
            lru.pop(h, None)

    def _trim(self) -> None:
        lru, cap = self._lru, self.capacity_chunks
        while len(lru) > cap:
            lru.popitem(last=False)

    def forget(self) -> None:
        """The replica's cache is empty (it restarted, or it is a new one)."""
        self._lru.clear()

    @property
    def rate(self) -> float:
        """The prefill rate routing assumes (tokens per second)."""
        return self.prefill_rate if self.prefill_rate is not None \
            else DEFAULT_PREFILL_TOKENS_PER_S

    def predicted_ttft(self, uncached_tokens: int) -> float:
        """Seconds to the first token of a request with ``uncached_tokens`` to prefill here,
        behind the prefill work already waiting."""
        return (uncached_tokens + self.pending_tokens) / self.rate

    def learn(self, work_tokens: int, ttft_s: float) -> None:
        """A request that had ``work_tokens`` of prefill ahead of and including its own got
        its first token after ``ttft_s`` seconds."""
        if work_tokens < MIN_LEARN_TOKENS or ttft_s <= 0:
            return
        now = self.rate
        sample = min(max(work_tokens / ttft_s, now / RATE_STEP), now * RATE_STEP)
        rate = self.prefill_rate
        self.prefill_rate = sample if rate is None else \
            rate + PREFILL_EWMA_ALPHA * (sample - rate)

    def describe(self) -> dict[str, object]:
        """For ``/health``: chunks remembered and capacity (tokens), waiting prefill (tokens),
        learned prefill rate (tokens per second, None before data), routing counters."""
        return {"prefix_chunks": self.chunks, "kv_capacity_tokens": self.capacity_tokens,
                "pending_prefill_tokens": self.pending_tokens,
                "prefill_tokens_per_s": None if self.prefill_rate is None
                else round(self.prefill_rate, 1),
                "prefix_routed": self.prefix_routed, "load_routed": self.load_routed}


def uncached_tokens(prompt: PromptKey, matched: int) -> int:
    """Prompt tokens a replica holding ``matched`` leading chunks must still prefill."""
    return max(0, prompt.tokens - matched * CHUNK_TOKENS)


@dataclass(slots=True)
class Sent:
    """One request sent with prefix-aware routing: its prefill work on its replica, until
    its first token (``first_token``), its estimated end (``settle_after``, for a request
    whose first token is not seen) or its end (``settle``); and the chunks it added to the
    replica's memory, taken back if it never ran there (``fail``)."""

    routing: ReplicaRouting
    #: Uncached prompt tokens it brought, and prefill tokens waiting there when it was sent.
    tokens: int
    ahead: int
    #: The monotonic clock (seconds) and its reading when it was sent.
    clock: Callable[[], float]
    sent_at: float
    #: Chunk hashes that were new to the replica's memory when it was sent.
    added: tuple[int, ...] = ()
    waiting: bool = True
    #: The pending ``settle_after`` call (an ``asyncio.TimerHandle``), if any.
    timer: Any = None

    def first_token(self) -> None:
        """Its first token came now: its prefill is over, and its TTFT teaches the rate."""
        if self.waiting:
            self.settle()
            self.routing.learn(self.tokens + self.ahead, self.clock() - self.sent_at)

    def prefill_estimate_s(self) -> float:
        """Seconds its prefill is assumed to wait when its first token is not seen:
        ``UNARY_PREFILL_FACTOR`` x (its work + the work ahead) / the rate, at most
        ``UNARY_PREFILL_MAX_S``."""
        return min(UNARY_PREFILL_MAX_S,
                   UNARY_PREFILL_FACTOR * (self.tokens + self.ahead) / self.routing.rate)

    def settle_after(self, call_later: Callable[[float, Callable[[], None]], Any]) -> None:
        """Settle after ``prefill_estimate_s`` (``call_later``: the event loop's), unless
        settled before."""
        if self.waiting:
            self.timer = call_later(self.prefill_estimate_s(), self.settle)

    def settle(self) -> None:
        """Its prefill waits no more (its answer ended, or failed): nothing learned."""
        if self.waiting:
            self.waiting = False
            r = self.routing
            r.pending_tokens = max(0, r.pending_tokens - self.tokens)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def fail(self) -> None:
        """It never ran on the replica (no connection, a transport error or cancellation
        before the answer's head, an error status): settle, and forget the chunks it added,
        which the replica does not hold."""
        self.settle()
        if self.added:
            self.routing.unrecord(self.added)
            self.added = ()


class Candidate(Protocol):
    """What the choice reads of a replica (``replicas.Replica``)."""

    name: str
    healthy: bool
    kv_usage: float | None
    routing: ReplicaRouting

    @property
    def outstanding(self) -> int: ...


C = TypeVar("C", bound=Candidate)
#: How a replica was chosen, for the routing counters: for its cached prefix, by load in
#: prefix-aware routing, or ``None`` (least outstanding routing, or a premium request past
#: every replica's KV limit).
How = Literal["prefix", "load"] | None


def choose_replica(
    replicas: Sequence[C],
    start: int,
    *,
    has_room: Callable[[C], bool],
    exclude: C | None = None,
    beyond_kv_limit: bool = False,
    prompt: PromptKey | None = None,
    ttft_objective_s: float | None = None,
) -> tuple[C | None, How]:
    """The replica a new request goes to, and how it was chosen; ``(None, None)`` when none
    can take it. Pure: it reads the replicas' state and changes nothing.

    ``replicas`` in the pool's order, tried from index ``start`` on (the caller rotates it per
    request, so that equal replicas take turns); ``has_room``: healthy with KV-cache room.
    Without ``prompt`` (least outstanding routing), the fewest requests in flight among those
    with room, the first in rotation order on a tie. With a ``prompt`` (prefix-aware routing),
    the rule of the module docs, the TTFT SLO being ``ttft_objective_s`` (seconds; None: no
    SLO). Either way, with ``beyond_kv_limit`` (premium) and no replica with room, the healthy
    one with the least KV usage."""
    n = len(replicas)
    if not n:
        return None, None
    ordered = [replicas[(start + i) % n] for i in range(n)]
    room = [r for r in ordered if r is not exclude and has_room(r)]
    if not room:
        if beyond_kv_limit:
            healthy = [r for r in replicas if r.healthy and r is not exclude]
            if healthy:
                return min(healthy, key=lambda r: (r.kv_usage or 0.0, r.outstanding)), None
        return None, None
    if prompt is None:
        best = room[0]
        for r in room[1:]:
            if r.outstanding < best.outstanding:
                best = r
        return best, None
    return _by_prefix(room, prompt, ttft_objective_s)


def _by_prefix(room: Sequence[C], prompt: PromptKey,
               ttft_objective_s: float | None) -> tuple[C, How]:
    """``choose_replica`` for a prompt among ``room`` (in rotation order)."""
    loads = [r.outstanding for r in room]
    bound = load_bound(loads)
    candidates: list[tuple[C, int]] = []
    best: C | None = None
    best_matched = 0
    for r in room:  # in rotation order: full ties keep the first
        if r.outstanding > bound:
            continue
        matched = useful_match(prompt, r.routing.matched(prompt.hashes))
        candidates.append((r, matched))
        if matched > best_matched or (matched and matched == best_matched and best
                                      is not None and r.outstanding < best.outstanding):
            best, best_matched = r, matched
    if best is None:
        # Fewest in flight, then least prefill waiting (a random pick among replicas
        # equal in flight would put new prefills behind others' more often than the
        # rotation does: p90 TTFT about 10 % worse on unshared prompts), then rendezvous.
        fewest = min(loads)
        ties = [r for r in room if r.outstanding == fewest]
        if len(ties) > 1:
            least_pending = min(r.routing.pending_tokens for r in ties)
            ties = [r for r in ties if r.routing.pending_tokens == least_pending]
        chosen = ties[0] if len(ties) == 1 else \
            max(ties, key=lambda r: rendezvous(prompt.anchor, r.name))
        return chosen, "load"
    if ttft_objective_s is not None and best.routing.predicted_ttft(
            uncached_tokens(prompt, best_matched)) > ttft_objective_s:
        # Past the SLO even with its prefix: wherever the first token comes soonest.
        fastest_s = float("inf")
        for r, matched in candidates:
            t = r.routing.predicted_ttft(uncached_tokens(prompt, matched))
            if t < fastest_s or (t == fastest_s and r.outstanding < best.outstanding):
                best, best_matched, fastest_s = r, matched, t
    return best, "prefix" if best_matched else "load"
