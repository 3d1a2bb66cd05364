"""Capacity profiles: how much load one replica of a configuration serves within the SLOs.

A profile is the answer of one capacity search (``vigil capacity``, a benchmark against a live
replica: ``measured``), of the store's production history (``observed``), or of the
simulator's GPU/model calibration (``estimated``). Every figure derived from a profile carries
its ``basis`` so that what is shown says how it is known.

The figures (Units in the names): ``max_concurrency`` in requests in flight,
``max_goodput_rps`` requests per second that meet every latency SLO at that concurrency,
``max_output_tokens_per_s`` output tokens per second at that concurrency. ``attainment`` is the
ratio 0-1 of requests meeting every latency SLO (TTFT and e2e thresholds), the figure GuideLLM
and ``vllm bench serve --goodput`` search on.

This module is the shared data model only (pure data, JSON round trip); the search, the store
of saved profiles and the planner live in the rooms that use them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

__all__ = [
    "BASES",
    "CEIL_DECIMALS",
    "Basis",
    "CapacityProfile",
    "Probe",
    "ProfileIdentity",
    "SloTarget",
    "ceil_replicas",
    "replicas_needed",
]

#: A replica count is ``ceil()`` of a ratio rounded to this many decimals first: 1.9999999999999998
#: (0.8 × 0.8 is 0.6400000000000001) must not add a replica for float noise.
CEIL_DECIMALS = 9


def ceil_replicas(ratio: float) -> int:
    """``ceil(ratio)`` as a replica count, float noise rounded away first (``CEIL_DECIMALS``)."""
    return math.ceil(round(ratio, CEIL_DECIMALS))


def replicas_needed(rps: float, capacity_rps: float) -> int:
    """``ceil(λ / μ)``: the fewest replicas that serve ``rps`` requests per second, each at
    most at ``capacity_rps`` (requests per second one replica serves within the SLOs); 0
    without load. ``ValueError`` for a capacity that is not above 0 or a negative rate."""
    if not (math.isfinite(capacity_rps) and capacity_rps > 0):
        raise ValueError("the capacity must be > 0 requests per second per replica, not "
                         f"{capacity_rps!r}")
    if not (math.isfinite(rps) and rps >= 0):
        raise ValueError(f"the rate must be a finite rate >= 0, not {rps!r}")
    return max(0, ceil_replicas(rps / capacity_rps))


Basis = Literal["measured", "observed", "estimated"]
#: How a capacity is known, from the most to the least trustworthy.
BASES: tuple[Basis, ...] = ("measured", "observed", "estimated")


@dataclass(frozen=True)
class ProfileIdentity:
    """What a capacity is the capacity of: the configuration and the request shape.

    ``speculative``: "" (off), "ngram" or a draft model's name; ``prompt_tokens`` /
    ``output_tokens``: the mean request shape the capacity holds for (tokens).
    """

    model: str
    gpu: str
    gpus_per_replica: int = 1
    quantization: str = "none"
    speculative: str = ""
    num_speculative_tokens: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0

    def key(self) -> str:
        """A short stable id of this identity (12 hex digits), the same on every machine."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def label(self) -> str:
        """``"Llama-3.1-8B-Instruct on 1x H100, fp8, ngram"``-style text for people."""
        parts = [f"{self.model.rsplit('/', 1)[-1]} on {self.gpus_per_replica}x {self.gpu}"]
        if self.quantization not in ("", "none"):
            parts.append(self.quantization)
        if self.speculative:
            parts.append(f"spec {self.speculative}"
                         + (f" x{self.num_speculative_tokens}" if self.num_speculative_tokens
                            else ""))
        return ", ".join(parts)


@dataclass(frozen=True)
class SloTarget:
    """One latency SLO a capacity is judged against: indicator ``ttft`` or ``e2e``, its
    threshold (seconds) and objective (ratio 0-1 of requests within it)."""

    name: str
    indicator: Literal["ttft", "e2e"]
    threshold_seconds: float
    objective: float


@dataclass(frozen=True)
class Probe:
    """One load level of a search: ``concurrency`` requests kept in flight for ``duration_s``.

    ``attainment``: ratio 0-1 of the probe's requests meeting every SLO threshold, with its
    confidence interval ``[attainment_low, attainment_high]`` (Wilson score, at the search's
    confidence level); ``passed``: the level meets every objective (decided on the interval,
    see the search). Percentiles are seconds, keyed ``p50``/``p95``/``p99``; rates per second.
    """

    concurrency: int
    requests: int
    errors: int
    duration_s: float
    attainment: float
    attainment_low: float
    attainment_high: float
    passed: bool
    goodput_rps: float
    throughput_rps: float
    output_tokens_per_s: float
    ttft_s: dict[str, float | None] = field(default_factory=dict)
    itl_s: dict[str, float | None] = field(default_factory=dict)
    e2e_s: dict[str, float | None] = field(default_factory=dict)
    #: Per SLO name: the ratio 0-1 of requests within that SLO's threshold.
    attainment_by_slo: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CapacityProfile:
    """The capacity of one configuration at its SLOs.

    ``source``: where it came from (the URL benchmarked, ``"store"``, or the simulator
    calibration's name); ``pool``: the pool it was measured for ("" when none);
    ``created_at``: Unix seconds; ``confidence``: the confidence level 0-1 of the probes'
    attainment intervals; ``precision``: the relative width 0-1 the search bisected to.
    """

    identity: ProfileIdentity
    basis: Basis
    max_concurrency: int
    max_goodput_rps: float
    max_output_tokens_per_s: float
    slos: tuple[SloTarget, ...]
    source: str = ""
    pool: str = ""
    created_at: float = 0.0
    confidence: float = 0.95
    precision: float = 0.10
    probes: tuple[Probe, ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.basis not in BASES:
            raise ValueError(f"basis must be one of {', '.join(BASES)}, not {self.basis!r}")
        for name in ("max_goodput_rps", "max_output_tokens_per_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, not {v!r}")
        if self.max_concurrency < 0:
            raise ValueError(f"max_concurrency must be >= 0, not {self.max_concurrency!r}")

    @property
    def key(self) -> str:
        """The identity's key: one saved profile per identity and basis."""
        return self.identity.key()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``from_dict`` reads it back equal)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityProfile:
        """The profile ``to_dict`` wrote; ``ValueError``/``KeyError``/``TypeError`` naming the
        field on a malformed one."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown profile field(s): {', '.join(sorted(unknown))}")
        d = dict(data)
        d["identity"] = ProfileIdentity(**d["identity"])
        d["slos"] = tuple(SloTarget(**s) for s in d.get("slos", ()))
        d["probes"] = tuple(Probe(**p) for p in d.get("probes", ()))
        d["notes"] = tuple(d.get("notes", ()))
        return cls(**d)
