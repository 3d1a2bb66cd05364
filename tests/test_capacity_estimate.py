"""The simulator's capacity estimate against a direct virtual-time sweep of the same engine.

The sweep below drives the engine through ``run_virtual`` itself, one step per call, keeping
``c`` requests of the same length distribution in flight with its own random draws, and reads
the e2e attainment of each level: the estimate's concurrency must sit where that sweep puts
the knee.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time

import pytest

from slo.planning.estimate import (
    RANGE_RATIO,
    calibration_for,
    estimated_capacity,
    known_calibrations,
)
from slo.planning.replica.engine import Engine, EngineConfig
from slo.planning.replica.profiles import DEFAULT_MODEL, PROFILES
from slo.planning.replica.text import Prompt
from slo.planning.replica.virtual import Arrival, run_virtual
from vigil.capacity import ProfileIdentity, SloTarget
from vigil.config import CapacityConfig
from vigil.errors import ConfigError

IDENTITY = ProfileIdentity(DEFAULT_MODEL, "H100", prompt_tokens=500, output_tokens=100)
E2E = SloTarget("chat-e2e", "e2e", threshold_seconds=3.0, objective=0.9)
CAPACITY = CapacityConfig()


def _direct_attainment(c: int, requests: int = 400, seed: int = 7) -> float:
    """The e2e attainment of ``c`` requests kept in flight on the H100 calibration, after the
    first wave, from ``run_virtual`` stepped one engine step at a time."""
    profile = PROFILES["h100-llama3.1-8b"]
    engine = Engine(EngineConfig(profile=profile))
    rng = random.Random(seed)
    ids = iter(range(10**9))

    def arrival(t: float) -> Arrival:
        lo = IDENTITY.prompt_tokens * (1 - RANGE_RATIO)
        n = rng.randint(math.floor(lo), math.ceil(IDENTITY.prompt_tokens * (1 + RANGE_RATIO)))
        out = rng.randint(math.floor(IDENTITY.output_tokens * (1 - RANGE_RATIO)),
                          math.ceil(IDENTITY.output_tokens * (1 + RANGE_RATIO)))
        prompt = Prompt(n, tuple(rng.getrandbits(64) for _ in range(n // profile.block_size)),
                        rng.getrandbits(64))
        return Arrival(t, prompt, max_tokens=out, ignore_eos=True,
                       request_id=f"d{next(ids)}")

    pending = [arrival(0.0) for _ in range(c)]
    now, done, e2e = 0.0, 0, []
    start = math.inf
    while len(e2e) < requests:
        run = run_virtual(engine, pending, start=now, until=math.nextafter(now, math.inf))
        pending = []
        now = run.end_time
        for req in run.finished:
            done += 1
            if done == c:
                start = now
            elif req.arrival_time >= start:
                e2e.append(req.last_token_time - req.arrival_time)
            pending.append(arrival(now))
    return sum(1 for v in e2e if v <= E2E.threshold_seconds) / len(e2e)


def test_known_calibrations_are_the_real_gpu_profiles() -> None:
    assert known_calibrations() == [(DEFAULT_MODEL, "H100")]
    assert calibration_for(IDENTITY).name == "h100-llama3.1-8b"
    short = dataclasses.replace(IDENTITY, model="Llama-3.1-8B-Instruct")
    assert calibration_for(short).name == "h100-llama3.1-8b"


def test_the_estimate_sits_at_the_knee_of_a_direct_sweep() -> None:
    cpu = time.process_time()
    profile = estimated_capacity(IDENTITY, [E2E], CAPACITY, created_at=1.0, pool="chat")
    cpu = time.process_time() - cpu
    assert cpu < 5.0
    assert profile.basis == "estimated" and profile.source == "h100-llama3.1-8b"
    assert profile.pool == "chat" and profile.created_at == 1.0
    assert profile.notes[0] == "from the simulator's h100-llama3.1-8b calibration, not measured"
    assert profile.identity == IDENTITY
    best = next(p for p in profile.probes if p.passed and p.concurrency == profile.max_concurrency)
    failed = min((p for p in profile.probes if not p.passed), key=lambda p: p.concurrency)
    assert failed.concurrency > profile.max_concurrency
    assert profile.max_goodput_rps == pytest.approx(best.goodput_rps)
    # The doubling sweep brackets the knee ...
    grid = [1, 2, 4, 8, 16, 32, 64]
    first_fail = next(c for c in grid if _direct_attainment(c, requests=200) < E2E.objective)
    assert first_fail // 2 <= profile.max_concurrency < first_fail
    # ... and levels a fifth either side of the search's bracket land on their side of it.
    assert _direct_attainment(math.floor(profile.max_concurrency * 0.8)) >= E2E.objective
    assert _direct_attainment(math.ceil(failed.concurrency * 1.2)) < E2E.objective


def test_a_slower_calibration_has_a_lower_capacity() -> None:
    fast = estimated_capacity(IDENTITY, [E2E], CAPACITY)
    slow = estimated_capacity(IDENTITY, [E2E], CAPACITY, sim_profile="small")
    assert slow.source == "small"
    assert 0 < slow.max_concurrency < fast.max_concurrency
    assert slow.max_goodput_rps < fast.max_goodput_rps


def test_an_identity_without_a_shape_is_estimated_for_the_default_one() -> None:
    bare = ProfileIdentity(DEFAULT_MODEL, "H100")
    profile = estimated_capacity(bare, [SloTarget("e2e", "e2e", 8.0, 0.95)], CAPACITY)
    assert (profile.identity.prompt_tokens, profile.identity.output_tokens) == (1000, 200)
    assert any("request shape assumed" in n for n in profile.notes)
    assert profile.max_concurrency >= 1


@pytest.mark.parametrize("identity, match", [
    (ProfileIdentity("Qwen/Qwen2.5-7B-Instruct", "H100"), "no calibration"),
    (ProfileIdentity(DEFAULT_MODEL, "L4"), "no calibration"),
    (ProfileIdentity(DEFAULT_MODEL, "H100", quantization="fp8"), "unquantized"),
    (ProfileIdentity(DEFAULT_MODEL, "H100", gpus_per_replica=2), "one GPU per replica"),
])
def test_configurations_outside_the_calibrations_are_refused(identity: ProfileIdentity,
                                                             match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        estimated_capacity(identity, [E2E], CAPACITY)


def test_an_unknown_profile_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown simulator profile"):
        estimated_capacity(IDENTITY, [E2E], CAPACITY, sim_profile="b200-huge")


def test_the_margin_rule_saves_simulated_requests_and_finds_the_same_capacity() -> None:
    # A TTFT SLO the low levels meet with a wide margin; the e2e one binds near the knee.
    slos = [SloTarget("ttft", "ttft", 0.5, 0.95), SloTarget("e2e", "e2e", 10.0, 0.95)]
    shape = dataclasses.replace(IDENTITY, prompt_tokens=1000, output_tokens=200)
    with_margin = estimated_capacity(shape, slos, CapacityConfig())
    without = estimated_capacity(shape, slos, CapacityConfig(clear_margin=0.0))
    assert with_margin.max_concurrency == without.max_concurrency
    spent = {name: (sum(p.requests for p in prof.probes),
                    sum(p.duration_s for p in prof.probes))
             for name, prof in (("margin", with_margin), ("interval", without))}
    # Levels 1-8 pass on the margin with about 20 requests each instead of 100-150.
    assert spent["margin"][0] < 0.8 * spent["interval"][0], spent
    assert spent["margin"][1] < 0.5 * spent["interval"][1], spent
    low = [p for p in with_margin.probes if p.concurrency <= 8]
    assert low and all(p.passed and p.requests < 40 for p in low), low
