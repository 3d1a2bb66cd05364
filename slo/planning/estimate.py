"""Capacity estimated from the simulator's calibration: a capacity search without a GPU.

``estimated_capacity`` runs the capacity search (``slo.planning.capacity_search.search_sync``: 1, 2,
4, ... requests in flight until a level fails, then bisection to ``[capacity] precision``) over
virtual-time runs of the simulated engine calibrated for the configuration's model and GPU
(``slo.planning.replica.profiles``). Each probe is a closed loop: ``concurrency`` requests are kept
in flight, each a fresh prompt (no prefix shared, as a random benchmark dataset) generating
exactly its drawn output length (``ignore_eos``); when one finishes the next arrives at that
instant. Lengths are drawn uniformly within ``RANGE_RATIO`` (±50 %) of the identity's
``prompt_tokens`` and ``output_tokens``, as ``vllm bench serve --random-range-ratio 0.5``
does: with every request alike, a closed loop stays in lock step (all requests prefill in
one step, finish in one step) and its latency is that of a synchronised burst, not of a
steady load. The engine is stepped on
the virtual clock ``slo.planning.replica.virtual.run_virtual`` uses (each step moves the clock by
its modelled duration), so a whole search takes a second or two of CPU however long it "runs".

A probe measures as a live one does, by the same rules
(``slo.planning.capacity_search.ProbeWindow``, ``[capacity]``): the first ``concurrency`` requests
all arrive at once and are left out (the burst is not the steady state); a level far within the
thresholds passes on the latency margin; any other runs at least ``probe_duration`` of virtual time
and ``min_probe_requests`` requests, and is extended while its judgement is unresolved, up to
``max_probe_requests`` but never past ``VIRTUAL_EXTENSION`` times ``min_probe_requests`` (CPU time:
a probe near the knee would otherwise simulate thousands of requests). One still unresolved there is
decided on its point estimate, as a live probe at its request limit is, and the notes say so.

The result has basis ``"estimated"`` and says so: the simulator's step-time model is a
calibration of orders of magnitude (``slo.planning.replica.profiles``), not a measurement. Only
configurations the simulator is calibrated for are estimated (``known_calibrations``): one GPU
per replica, unquantized weights. Speculative decoding is simulated with the engine's default
draft acceptance (0.7 per position), which the notes state.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections.abc import Sequence

from slo.planning.capacity_search import (
    RANGE_RATIO,
    Margin,
    ProbeWindow,
    RequestOutcome,
    SearchResult,
    probe_from_outcomes,
    probe_length,
    profile_from_search,
    search_sync,
)
from slo.planning.replica.engine import Engine, EngineConfig, SpecDecodeConfig
from slo.planning.replica.profiles import DEFAULT_MODEL, PROFILES, Profile
from slo.planning.replica.request import EngineRequest
from slo.planning.replica.text import Prompt
from vigil.capacity import CapacityProfile, Probe, ProfileIdentity, SloTarget
from vigil.config import CapacityConfig
from vigil.errors import ConfigError

__all__ = [
    "DEFAULT_OUTPUT_TOKENS",
    "DEFAULT_PROMPT_TOKENS",
    "DEMO_PROFILES",
    "RANGE_RATIO",
    "VIRTUAL_EXTENSION",
    "calibration_for",
    "estimated_capacity",
    "known_calibrations",
    "simulate_probe",
]

#: The request shape an identity without one is estimated for (tokens): the simulator's own
#: mean natural output length, and a prompt of a typical chat turn with its history.
DEFAULT_PROMPT_TOKENS = 1000
DEFAULT_OUTPUT_TOKENS = 200
#: Profiles slowed down on purpose for laptop demos: no calibration of a real GPU, chosen
#: only by name (``sim_profile``).
DEMO_PROFILES = frozenset({"small"})
#: A simulated probe stops extending at this many times ``min_probe_requests``.
VIRTUAL_EXTENSION = 4
#: Distinct searches kept (calibration × request shape × SLOs × ``[capacity]``): a plan asks
#: for one per GPU with a price, so this holds a few configs' worth.
SEARCHES_KEPT = 64


def known_calibrations() -> list[tuple[str, str]]:
    """The ``(model, gpu)`` pairs the simulator is calibrated for (demo profiles aside)."""
    seen: dict[tuple[str, str], None] = {}
    for name, profile in PROFILES.items():
        if name not in DEMO_PROFILES:
            seen[(DEFAULT_MODEL, profile.gpu)] = None
    return list(seen)


def _same_model(a: str, b: str) -> bool:
    """Equal names, or the same name without the organisation (``meta-llama/``)."""
    return a == b or a.rsplit("/", 1)[-1].lower() == b.rsplit("/", 1)[-1].lower()


def calibration_for(identity: ProfileIdentity, sim_profile: str | None = None) -> Profile:
    """The simulator profile that stands for ``identity``: ``sim_profile`` by name, else the
    calibration of its model and GPU. ``ConfigError`` when there is none, or when the identity
    is outside what a calibration covers (several GPUs per replica, quantized weights)."""
    where = f"capacity estimate for {identity.label()}"
    if identity.gpus_per_replica != 1 or identity.quantization not in ("", "none"):
        raise ConfigError("the simulator is calibrated for one GPU per replica and "
                          "unquantized weights only", key=where)
    if sim_profile is not None:
        if sim_profile not in PROFILES:
            raise ConfigError(f"unknown simulator profile {sim_profile!r} (choose from "
                              f"{', '.join(sorted(PROFILES))})", key=where)
        return PROFILES[sim_profile]
    for name, profile in PROFILES.items():
        if (name not in DEMO_PROFILES and profile.gpu == identity.gpu
                and _same_model(DEFAULT_MODEL, identity.model)):
            return profile
    known = ", ".join(f"{m} on {g}" for m, g in known_calibrations())
    raise ConfigError(f"the simulator has no calibration for {identity.model} on "
                      f"{identity.gpu} (it has: {known})", key=where)


def _engine_config(profile: Profile, identity: ProfileIdentity, seed: int) -> EngineConfig:
    spec = None
    if identity.speculative:
        spec = SpecDecodeConfig(num_speculative_tokens=max(1, identity.num_speculative_tokens),
                                method=identity.speculative)
    # No two prompts share a block, so prefix caching would only cost CPU.
    return EngineConfig(profile=profile, scheduling_policy="fcfs", spec_decode=spec,
                        enable_prefix_caching=False, seed=seed)


def _outcome(req: EngineRequest) -> RequestOutcome:
    first, last = req.first_token_time, req.last_token_time
    ttft = None if first is None else first - req.arrival_time
    e2e = None if last is None else last - req.arrival_time
    itl = (None if first is None or last is None or req.num_generated < 2
           else (last - first) / (req.num_generated - 1))
    return RequestOutcome(ok=True, ttft_s=ttft, e2e_s=e2e, itl_s=itl,
                          output_tokens=req.num_generated)


def simulate_probe(profile: Profile, identity: ProfileIdentity, concurrency: int,
                   slos: Sequence[SloTarget], capacity: CapacityConfig, *,
                   seed: int = 0) -> Probe:
    """One closed-loop probe of ``concurrency`` requests in flight on a virtual-time engine
    with ``profile``'s calibration (module docs); the identity's shape must be set.

    Which requests count and when the probe ends is ``slo.planning.capacity_search.ProbeWindow``'s
    decision, as for a live probe; only the request cap is lower (``VIRTUAL_EXTENSION``)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency!r}")
    engine = Engine(_engine_config(profile, identity, seed))
    rng = random.Random(seed)
    most = min(capacity.max_probe_requests, VIRTUAL_EXTENSION * capacity.min_probe_requests)
    window = ProbeWindow(slos, capacity.model_copy(update={"max_probe_requests": most}),
                         concurrency)
    counted: dict[str, int] = {}  # request id -> its index among the counted requests
    sent = 0

    def send(now: float) -> None:
        nonlocal sent
        n = probe_length(identity.prompt_tokens, rng)
        # Random block hashes: no two prompts share a cached prefix.
        prompt = Prompt(num_tokens=n,
                        block_hashes=tuple(rng.getrandbits(64)
                                           for _ in range(n // profile.block_size)),
                        digest=rng.getrandbits(64))
        request_id = f"p{sent}"
        index = window.admit(now)
        if index is not None:
            counted[request_id] = index
        engine.add_request(request_id, prompt,
                           max_tokens=probe_length(identity.output_tokens, rng),
                           now=now, ignore_eos=True)
        sent += 1

    for _ in range(concurrency):
        send(0.0)
    now = 0.0
    while not window.done:
        stepped = engine.step(now)
        if stepped is None:  # a closed loop always has requests; defensive only
            break
        now, outputs = stepped
        for out in outputs:
            if not out.finished:
                continue
            index = counted.pop(out.req.request_id, None)
            if index is not None:
                window.finish(index, _outcome(out.req), now)
            if window.done:
                break
            send(now)
    return probe_from_outcomes(concurrency, window.outcomes, window.duration_s, slos,
                               capacity.confidence, Margin.of(capacity))


@functools.lru_cache(maxsize=SEARCHES_KEPT)
def _search(profile: Profile, shaped: ProfileIdentity, slos: tuple[SloTarget, ...],
            capacity: CapacityConfig) -> SearchResult:
    """The capacity search of ``shaped`` on ``profile``'s calibration, run once per distinct
    input. Its probes are virtual-time runs seeded alike and read no data, so the same
    inputs always give the same search: a planner asking again (every Plan page, every
    pool, every quarter hour) gets that search again instead of a second of CPU per ask.
    Every input is in the key (all frozen), so no answer outlives what it was computed
    from."""
    return search_sync(
        lambda c: simulate_probe(profile, shaped, c, slos, capacity),
        max_concurrency=capacity.max_concurrency, precision=capacity.precision)


def estimated_capacity(identity: ProfileIdentity, slos: Sequence[SloTarget],
                       capacity_config: CapacityConfig, *, sim_profile: str | None = None,
                       created_at: float = 0.0, pool: str = "") -> CapacityProfile:
    """The capacity of one replica of ``identity`` at ``slos``, estimated by a capacity search
    over virtual-time simulator runs (basis ``"estimated"``; module docs).

    ``sim_profile``: the simulator profile by name (default: the calibration of the identity's
    model and GPU, ``ConfigError`` without one). An identity without a request shape is
    estimated for ``DEFAULT_PROMPT_TOKENS`` / ``DEFAULT_OUTPUT_TOKENS``, which the returned
    profile's identity then carries. ``created_at``: Unix seconds to record.
    """
    profile = calibration_for(identity, sim_profile)
    shaped = dataclasses.replace(
        identity,
        prompt_tokens=identity.prompt_tokens or DEFAULT_PROMPT_TOKENS,
        output_tokens=identity.output_tokens or DEFAULT_OUTPUT_TOKENS,
    )
    longest = math.ceil((shaped.prompt_tokens + shaped.output_tokens) * (1 + RANGE_RATIO))
    if longest > profile.max_model_len:
        raise ConfigError(f"requests of up to {longest} tokens exceed the calibration's "
                          f"max_model_len ({profile.max_model_len})",
                          key=f"capacity estimate for {identity.label()}")
    cap = capacity_config
    result = _search(profile, shaped, tuple(slos), cap)
    found = profile_from_search(shaped, "estimated", result, slos, source=profile.name,
                                pool=pool, created_at=created_at, confidence=cap.confidence,
                                precision=cap.precision)
    notes = [f"from the simulator's {profile.name} calibration, not measured"]
    if identity.prompt_tokens == 0 or identity.output_tokens == 0:
        notes.append(f"request shape assumed: {shaped.prompt_tokens} prompt and "
                     f"{shaped.output_tokens} output tokens")
    if identity.speculative:
        notes.append("speculative decoding simulated with a draft acceptance of 0.7 per "
                     "position (the simulator's default), not this model's")
    return dataclasses.replace(found, notes=(*notes, *found.notes))
