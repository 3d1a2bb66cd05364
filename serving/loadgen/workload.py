"""What the load generator sends and when: the request mix, the rate over time, the arrivals.

A workload is a rate shape (``steady``, ``ramp``, ``diurnal``, ``burst``), an arrival process
(Poisson, or gamma with a burstiness factor, as ``vllm bench serve`` draws them; or a fixed
number of concurrent clients) and a mix: chat vs. completions, streaming share, long-output
outliers (far above 10x the mean tokens, the cost anomaly), FAQ questions asked again in other
words (what a semantic cache can answer), and a priority-tier mix. Scenarios are named
presets of these (``SCENARIOS``). Everything random comes from one seeded ``random.Random``:
the same seed sends the same requests at the same offsets.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from vigil.conventions import TIER_BATCH, TIER_PREMIUM, TIER_PRIORITY, TIER_STANDARD
from vigil.errors import ArgumentError

__all__ = [
    "FAQ",
    "SCENARIOS",
    "TIERS",
    "PlannedRequest",
    "Workload",
    "next_interval",
    "plan_request",
]

Shape = Literal["steady", "ramp", "diurnal", "burst"]

#: The gateway's tiers and vLLM's request ``priority`` for each (lower is served first).
TIERS: dict[str, int] = dict(TIER_PRIORITY)

#: FAQ questions, each with paraphrases a semantic cache should recognise as the same question.
FAQ: tuple[tuple[str, ...], ...] = (
    ("How do I reset my password?", "What is the way to reset my password?",
     "How can I reset my password?"),
    ("What are your opening hours?", "When are you open?", "What time do you open and close?"),
    ("How long does a refund take?", "How long do refunds take?",
     "How many days until I get my refund?"),
    ("Which payment methods do you accept?", "What payment methods do you accept?",
     "What ways can I pay?"),
    ("Can I change the delivery address of an order?",
     "Can I change the shipping address of my order?",
     "Is it possible to change the delivery address of an order?"),
)
_TOPICS = (
    "the KV cache in transformer inference",
    "continuous batching in LLM servers",
    "why p95 latency matters more than the average",
    "error budgets and burn rates",
    "speculative decoding and draft acceptance",
    "GPU cost per thousand requests",
    "prefix caching for shared system prompts",
)
SYSTEM_PROMPT = "You are a concise, friendly assistant for an online shop. Answer in plain English."


@dataclass(frozen=True)
class Workload:
    """The request mix and its timing. Shares are ratios 0-1, rates requests per second,
    times seconds."""

    rate: float = 2.0
    shape: Shape = "steady"
    #: ``ramp``: the rate reached after ``ramp`` seconds (then held); ``diurnal``: the peak
    #: rate (the trough is ``rate``); ``burst``: the rate during a burst.
    peak_rate: float | None = None
    ramp: float = 0.0
    #: ``diurnal``: one day compressed into this many seconds; ``burst``: the burst period.
    period: float = 600.0
    #: ``burst``: how long each burst lasts.
    burst_length: float = 30.0
    #: Gamma shape of the inter-arrival times: 1 = Poisson, < 1 burstier, > 1 more regular.
    burstiness: float = 1.0
    #: A fixed number of concurrent clients instead of an arrival rate (0 = use the rate).
    concurrency: int = 0
    duration: float = 0.0  # 0 = until stopped
    max_requests: int = 0  # 0 = no limit
    stream_share: float = 0.8
    chat_share: float = 0.7
    long_share: float = 0.02
    long_tokens: int = 4096
    #: Share of requests that are FAQ questions (asked in one of their phrasings).
    faq_share: float = 0.3
    #: Share of requests that set no max_tokens (the gateway's default applies).
    no_max_tokens_share: float = 0.3
    #: The max_tokens the other normal requests ask for (one drawn per request).
    max_tokens_choices: tuple[int, ...] = (128, 256, 512)
    tiers: dict[str, float] = field(
        default_factory=lambda: {TIER_PREMIUM: 0.2, TIER_STANDARD: 0.6, TIER_BATCH: 0.2}
    )
    max_in_flight: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if not (self.rate > 0 or self.concurrency > 0):
            problems.append(f"rate must be positive, got {self.rate}")
        if self.peak_rate is not None and self.peak_rate < 0:
            problems.append(f"peak rate must be >= 0, got {self.peak_rate}")
        if self.burstiness <= 0:
            problems.append(f"burstiness must be positive, got {self.burstiness}")
        for name in ("stream_share", "chat_share", "long_share", "faq_share",
                     "no_max_tokens_share"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                problems.append(f"{name.replace('_', ' ')} must be within 0-1, got {v}")
        for name in ("duration", "ramp", "concurrency", "max_requests"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.max_tokens_choices or any(v < 1 for v in self.max_tokens_choices):
            problems.append(f"max_tokens choices must be >= 1, got {self.max_tokens_choices}")
        if self.period <= 0 or self.burst_length <= 0:
            problems.append("period and burst length must be positive")
        unknown = set(self.tiers) - set(TIERS)
        if unknown:
            problems.append(f"unknown tier(s) {sorted(unknown)} (tiers: {', '.join(TIERS)})")
        if self.tiers and (any(v < 0 for v in self.tiers.values())
                           or sum(self.tiers.values()) <= 0):
            problems.append("tier shares must be >= 0 and not all 0")
        if problems:
            raise ArgumentError("; ".join(problems))

    def with_(self, **changes: Any) -> Workload:
        """A copy with ``changes``."""
        return replace(self, **changes)

    def rate_at(self, elapsed: float) -> float:
        """The arrival rate (req/s) ``elapsed`` seconds into the run."""
        peak = self.rate if self.peak_rate is None else self.peak_rate
        if self.shape == "ramp":
            span = self.ramp or self.duration
            if span <= 0:
                return peak
            return self.rate + (peak - self.rate) * min(1.0, elapsed / span)
        if self.shape == "diurnal":
            # Trough at the start, peak half a "day" later: a raised cosine.
            phase = (elapsed % self.period) / self.period
            return self.rate + (peak - self.rate) * (1 - math.cos(2 * math.pi * phase)) / 2
        if self.shape == "burst":
            return peak if (elapsed % self.period) < self.burst_length else self.rate
        return self.rate


def next_interval(rng: random.Random, rate: float, burstiness: float) -> float:
    """Seconds to the next arrival at ``rate`` req/s: exponential (Poisson arrivals) when
    ``burstiness`` is 1, else gamma with shape ``burstiness`` and the same mean ``1/rate``
    (the coefficient of variation is ``1/sqrt(burstiness)``), as ``vllm bench serve``."""
    if rate <= 0:
        return math.inf
    if burstiness == 1.0:
        return rng.expovariate(rate)
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


@dataclass(frozen=True)
class PlannedRequest:
    """One request to send: endpoint path, JSON body, tier, and what kind of request it is."""

    path: str
    body: dict[str, Any]
    tier: str
    kind: Literal["normal", "long", "faq"]
    stream: bool


def plan_request(rng: random.Random, wl: Workload, model: str) -> PlannedRequest:
    """Draw one request of the mix."""
    tiers = wl.tiers or {TIER_STANDARD: 1.0}
    names = sorted(tiers)
    tier = rng.choices(names, weights=[tiers[n] for n in names])[0]
    stream = rng.random() < wl.stream_share
    r = rng.random()
    kind: Literal["normal", "long", "faq"]
    body: dict[str, Any] = {"model": model, "stream": stream}
    if r < wl.long_share:
        kind = "long"
        question = f"Write a detailed report on {rng.choice(_TOPICS)}."
        # ignore_eos (a vLLM extension): the outlier really generates long_tokens tokens.
        body.update(max_tokens=wl.long_tokens, ignore_eos=True)
    elif r < wl.long_share + wl.faq_share:
        kind = "faq"
        question = rng.choice(rng.choice(FAQ))
        # Deterministic answers: what a cache may serve again (sampled ones are bypassed).
        body.update(temperature=0.0, max_tokens=rng.choice([64, 128]))
    else:
        kind = "normal"
        question = f"Explain {rng.choice(_TOPICS)} in {rng.choice([2, 3, 5, 8])} paragraphs."
        if rng.random() >= wl.no_max_tokens_share:
            body["max_tokens"] = rng.choice(wl.max_tokens_choices)
    if stream:
        body["stream_options"] = {"include_usage": True}
    if kind == "faq" or rng.random() < wl.chat_share:
        body["messages"] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ]
        return PlannedRequest("/v1/chat/completions", body, tier, kind, stream)
    body["prompt"] = f"{SYSTEM_PROMPT}\nQuestion: {question}\nAnswer:"
    return PlannedRequest("/v1/completions", body, tier, kind, stream)


#: Named presets: ``vigil loadgen --scenario NAME`` (explicit flags override them).
SCENARIOS: dict[str, dict[str, Any]] = {
    "steady": {"shape": "steady"},
    "ramp": {"shape": "ramp"},
    "diurnal": {"shape": "diurnal", "period": 600.0},
    "burst": {"shape": "burst", "burstiness": 0.5, "period": 120.0, "burst_length": 20.0},
    "outliers": {"shape": "steady", "long_share": 0.05},
    "faq": {"shape": "steady", "faq_share": 0.8, "long_share": 0.0},
    "tiers": {"shape": "steady",
              "tiers": {TIER_PREMIUM: 0.3, TIER_STANDARD: 0.4, TIER_BATCH: 0.3}},
}


def keyed_workload(wl: Workload, keys: dict[str, str], *, explicit_mix: bool) -> Workload:
    """The workload ``wl`` sent with ``keys`` (tier -> API key).

    A gateway answers a request without a key 401, so with keys given only keyed tiers are
    sent: the tier mix (a scenario's or the default) keeps the keyed tiers' shares. A mix the
    user gave (``explicit_mix``) that sends a tier without a key is refused, naming it.
    Without keys every tier is sent, carrying vLLM's ``priority`` (straight to vLLM)."""
    if not keys:
        return wl
    mix = wl.tiers or {TIER_STANDARD: 1.0}
    unkeyed = sorted(t for t, share in mix.items() if share > 0 and t not in keys)
    if not unkeyed:
        return wl
    if explicit_mix:
        raise ArgumentError(f"--tier-mix sends {', '.join(unkeyed)} requests but --key gives no "
                         f"key for {'it' if len(unkeyed) == 1 else 'them'} (the gateway would "
                         f"answer 401): add --key {unkeyed[0]}=KEY or leave "
                         f"{'it' if len(unkeyed) == 1 else 'them'} out of --tier-mix")
    kept = {t: share for t, share in mix.items() if t in keys and share > 0}
    if not kept:
        # The default mix has no share for the keyed tiers: send them evenly.
        kept = dict.fromkeys(keys, 1.0)
    return dataclasses.replace(wl, tiers=kept)
