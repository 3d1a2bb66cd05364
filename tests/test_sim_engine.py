"""The simulator's engine on a virtual clock: scheduling, KV cache, preemption, calibration."""

from __future__ import annotations

import dataclasses
import itertools
import random
import statistics

import pytest

from slo.planning.replica.engine import Engine, EngineConfig, SpecDecodeConfig
from slo.planning.replica.kv_cache import BlockPool
from slo.planning.replica.profiles import PROFILES, Profile, get_profile
from slo.planning.replica.request import EngineRequest
from slo.planning.replica.text import count_tokens, encode_ids, encode_text, natural_output_len
from slo.planning.replica.virtual import Arrival, VirtualRun, poisson_arrivals, run_virtual
from vigil.errors import ConfigError

SMALL = get_profile("small")
H100 = get_profile("h100-llama3.1-8b")
SYSTEM = "You are a careful assistant that answers questions about GPU serving. " * 8


def engine(profile: Profile = SMALL, **kw: object) -> Engine:
    return Engine(EngineConfig(profile=profile, **kw))  # type: ignore[arg-type]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[round(0.95 * (len(ordered) - 1))]


# --- calibration ------------------------------------------------------------------------------


def test_h100_profile_calibration():
    p = H100
    assert p.kv_bytes_per_token == 128 * 1024
    assert p.num_gpu_blocks == 28_117 and p.block_size == 16
    assert 50 < p.kv_cache_gib < 60  # ~55 GB left for KV after the weights
    assert p.max_num_seqs == 256 and p.max_num_batched_tokens == 8192
    assert p.max_model_len == 131_072
    batch1 = p.step_seconds(decode_seqs=1, context_tokens=1000, compute_tokens=0)
    assert 0.008 <= batch1 <= 0.012
    full = p.step_seconds(decode_seqs=256, context_tokens=256 * 1500, compute_tokens=0)
    assert 0.025 <= full <= 0.040
    assert 10_000 <= p.prefill_tokens_per_s <= 20_000


def test_small_profile_is_small():
    assert SMALL.num_gpu_blocks == 2000 and SMALL.max_num_seqs == 64
    assert SMALL.prefill_tokens_per_s < H100.prefill_tokens_per_s
    assert set(PROFILES) == {"small", "h100-llama3.1-8b"}


def test_profile_must_fit_max_model_len():
    with pytest.raises(ConfigError, match="does not fit"):
        Profile(name="bad", num_gpu_blocks=10, max_model_len=4096)
    with pytest.raises(ConfigError, match="unknown simulator profile"):
        get_profile("nope")


# --- tokenizer and output lengths -------------------------------------------------------------


def test_tokenizer_counts_four_chars_per_token():
    assert count_tokens("") == 1
    assert count_tokens("abcd") == 1
    assert count_tokens("abcde") == 2
    prompt = encode_text("x" * 400)
    assert prompt.num_tokens == 100 and len(prompt.block_hashes) == 100 // 16


def test_shared_prefix_shares_block_hashes():
    a = encode_text(SYSTEM + "What is a KV cache?")
    b = encode_text(SYSTEM + "Why does TTFT grow?")
    shared = len(SYSTEM) // 64
    assert a.block_hashes[:shared] == b.block_hashes[:shared]
    assert a.block_hashes[shared:] != b.block_hashes[shared:]
    assert encode_ids(list(range(40))).num_tokens == 40


def test_natural_output_length_is_deterministic_with_mean_about_200():
    # Values written down once: the same on every run and in every process (no hash()
    # randomisation), with and without the request's seed.
    assert natural_output_len(123, 7) == 163
    assert natural_output_len(123, None) == 126
    lengths = [natural_output_len(d, None) for d in range(4000)]
    assert 180 <= statistics.mean(lengths) <= 220
    assert len({natural_output_len(5, s) for s in range(20)}) > 10  # the request's seed matters


def test_ignore_eos_min_tokens_and_max_tokens():
    e = engine()
    prompt = encode_text("hello")
    natural = natural_output_len(prompt.digest, None)
    r1 = e.add_request("a", prompt, max_tokens=5000, now=0, ignore_eos=True)
    assert (r1.target_tokens, r1.target_reason) == (5000, "length")
    r2 = e.add_request("b", prompt, max_tokens=natural + 50, now=0)
    assert (r2.target_tokens, r2.target_reason) == (natural, "stop")
    r3 = e.add_request("c", prompt, max_tokens=natural + 50, now=0, min_tokens=natural + 10)
    assert (r3.target_tokens, r3.target_reason) == (natural + 10, "stop")
    r4 = e.add_request("d", prompt, max_tokens=max(1, natural // 2), now=0)
    assert r4.target_reason == "length"
    with pytest.raises(ValueError, match="max_model_len"):
        e.add_request("e", prompt, max_tokens=SMALL.max_model_len, now=0)


# --- scheduling -------------------------------------------------------------------------------


def test_requests_finish_with_exact_lengths_and_free_their_blocks():
    e = engine()
    arrivals = [Arrival(i * 0.01, encode_text(f"q{i} " * 50), max_tokens=30 + i,
                        ignore_eos=True) for i in range(20)]
    run = run_virtual(e, arrivals)
    assert len(run.finished) == 20
    assert sorted(r.num_generated for r in run.finished) == [30 + i for i in range(20)]
    assert all(r.finish_reason == "length" for r in run.finished)
    assert e.pool.num_free == SMALL.num_gpu_blocks and not e.running and not len(e.waiting)


def test_chunked_prefill_spans_several_steps():
    e = engine()
    e.add_request("long", encode_ids(list(range(5000))), max_tokens=4, now=0.0, ignore_eos=True)
    steps = 0
    now = 0.0
    while e.requests["long"].first_token_time is None:
        result = e.step(now)
        assert result is not None
        now, _ = result
        steps += 1
    assert steps == -(-5000 // SMALL.max_num_batched_tokens)  # ceil(5000 / 2048) = 3
    assert now == pytest.approx(5000 / SMALL.prefill_tokens_per_s + 3 * SMALL.decode_base_s)


def test_prefix_cache_hits_shared_system_prompt():
    e = engine()
    first = e.add_request("a", encode_text(SYSTEM + "first question"), max_tokens=5, now=0.0)
    run_virtual(e, [])
    second = e.add_request("b", encode_text(SYSTEM + "second question"), max_tokens=5, now=1.0)
    plan = e.schedule(1.0)
    assert plan is not None
    assert first.cached_tokens == 0
    assert second.cached_tokens == (len(SYSTEM) // 64) * 16 > 0
    assert plan.prefill_tokens == second.prompt_len - second.cached_tokens


def test_abort_frees_blocks_and_leaves_the_batch_at_once():
    e = engine()
    for i in range(5):
        e.add_request(f"r{i}", encode_text(f"{i} " * 300), max_tokens=500, now=0.0,
                      ignore_eos=True)
    plan = e.schedule(0.0)
    assert plan is not None
    e.complete(plan, plan.duration)
    assert e.gauges().running == 5 and e.gauges().kv_usage > 0
    for i in range(5):
        assert e.abort(f"r{i}")
    g = e.gauges()
    assert (g.running, g.waiting, g.kv_usage) == (0, 0, 0.0)
    assert not e.abort("r0")


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_priority_request_overtakes_a_saturated_queue(policy):
    """64 running + 10 waiting priority-5 requests, then one priority-0 request arrives."""
    e = engine(scheduling_policy=policy)
    rng = random.Random(3)
    arrivals = [Arrival(i * 0.001, encode_text(f"background {i}"), max_tokens=rng.randint(80, 400),
                        ignore_eos=True, priority=5, request_id=f"bg{i}") for i in range(74)]
    arrivals.append(Arrival(1.0, encode_text("urgent"), max_tokens=20, ignore_eos=True,
                            priority=0, request_id="urgent"))
    # Saturated when the urgent request arrives: the batch is full and ten wait.
    head = run_virtual(e, arrivals[:74], until=1.0)
    assert e.gauges().running == SMALL.max_num_seqs and e.gauges().waiting == 10
    rest = run_virtual(e, arrivals[74:], start=head.end_time)
    done = {r.request_id: r for r in head.finished + rest.finished}
    urgent = done["urgent"]
    waiting_bg = [done[f"bg{i}"] for i in range(64, 74)]
    assert urgent.first_token_time is not None
    ttfts = [r.first_token_time for r in waiting_bg]
    if policy == "priority":
        assert all(urgent.first_token_time < t for t in ttfts)  # type: ignore[operator]
    else:  # FCFS ignores priority: it queues behind all ten
        assert all(urgent.first_token_time > t for t in ttfts)  # type: ignore[operator]


def _fill_cache(e: Engine, n: int) -> VirtualRun:
    arrivals = [Arrival(i * 0.01, encode_text(f"{i:04d} " * 400), max_tokens=600,
                        ignore_eos=True, priority=i % 3, request_id=f"r{i}") for i in range(n)]
    return run_virtual(e, arrivals)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preemption_when_the_cache_is_full(policy):
    preempted: list[EngineRequest] = []
    e = engine(scheduling_policy=policy)

    class Spy:
        def __getattr__(self, name: str):
            return lambda *a, **k: None

        def on_preempted(self, req: EngineRequest) -> None:
            preempted.append(req)

    e.observer = Spy()  # type: ignore[assignment]
    # 60 requests of 500 prompt + 600 output tokens need 66k tokens; the cache holds 32k.
    run = _fill_cache(e, 60)
    assert preempted, "a full cache must preempt"
    assert len(run.finished) == 60 and all(r.num_generated == 600 for r in run.finished)
    assert sum(r.num_preemptions for r in run.finished) == len(preempted)
    assert max(s.kv_usage for s in run.samples) > 0.97
    assert e.pool.num_free == SMALL.num_gpu_blocks
    if policy == "priority":  # victims are the least urgent (largest priority value) first
        assert statistics.mean(r.priority for r in preempted) > 1.0


def test_fcfs_preempts_the_newest_running_request():
    e = engine()
    for i in range(3):
        e.add_request(f"r{i}", encode_text(str(i)), max_tokens=5, now=float(i))
    e.complete(e.schedule(3.0), 3.1)  # type: ignore[arg-type]
    assert e._pick_victim().request_id == "r2"
    p = engine(scheduling_policy="priority")
    for i, prio in enumerate((1, 7, 3)):
        p.add_request(f"r{i}", encode_text(str(i)), max_tokens=5, now=float(i), priority=prio)
    p.complete(p.schedule(3.0), 3.1)  # type: ignore[arg-type]
    assert p._pick_victim().request_id == "r1"


def test_speculative_decoding_emits_several_tokens_per_step():
    spec = SpecDecodeConfig(num_speculative_tokens=3, acceptance=0.7)
    e = engine(spec_decode=spec, seed=1)
    outputs = tokens = 0
    accepted_per_pos = [0, 0, 0]

    class Spy:
        def __getattr__(self, name: str):
            return lambda *a, **k: None

        def on_output(self, req: EngineRequest, n: int, first: bool, latency: float) -> None:
            nonlocal outputs, tokens
            outputs += 1
            tokens += n

        def on_spec_decode(self, drafts: int, draft_tokens: int, per_pos: list[int]) -> None:
            for i, n in enumerate(per_pos):
                accepted_per_pos[i] += n

    e.observer = Spy()  # type: ignore[assignment]
    arrivals = [Arrival(0.0, encode_text(f"spec {i}"), max_tokens=400, ignore_eos=True)
                for i in range(20)]
    run = run_virtual(e, arrivals)
    assert all(r.num_generated == 400 for r in run.finished)
    assert tokens == 20 * 400 == outputs + sum(accepted_per_pos)
    mean_per_output = tokens / outputs
    assert 2.2 < mean_per_output < 2.8  # 1 + 0.7 + 0.49 + 0.343 = 2.53
    assert accepted_per_pos[0] > accepted_per_pos[1] > accepted_per_pos[2] > 0


def test_lora_budget_defers_other_adapters():
    e = engine(enable_lora=True, max_loras=1)
    e.add_request("a", encode_text("a"), max_tokens=50, now=0.0, lora_name="sql")
    e.add_request("b", encode_text("b"), max_tokens=50, now=0.0, lora_name="chat")
    e.add_request("c", encode_text("c"), max_tokens=50, now=0.0)
    plan = e.schedule(0.0)
    assert plan is not None
    g = e.gauges()
    assert g.running == 2 and g.waiting == 1 and g.deferred == 1
    assert g.running_loras == ("sql",) and g.waiting_loras == ("chat",)


# --- behaviour under load ---------------------------------------------------------------------


def test_load_ramp_behaves_like_a_gpu():
    """Arrival rate steps up; KV usage, queue, TTFT and preemptions rise as on a real GPU."""
    profile = dataclasses.replace(SMALL, name="small-ramp")
    e = engine(profile)
    rng = random.Random(11)
    levels = [1.0, 3.0, 5.0, 7.0, 9.0]
    window = 40.0

    def make(t: float, i: int) -> Arrival:
        user = f"question {i}: " + "tell me more about this " * rng.randint(10, 120)
        return Arrival(t, encode_text(SYSTEM + user), max_tokens=1024)

    arrivals: list[Arrival] = []
    for k, rate in enumerate(levels):
        arrivals += poisson_arrivals(rate, k * window, (k + 1) * window, rng, make)
    run = run_virtual(e, arrivals)

    kv, ttft95, queue, queue_time, preemptions = [], [], [], [], []
    for k in range(len(levels)):
        lo, hi = k * window, (k + 1) * window
        samples = run.window(lo, hi)
        done = [r for r in run.finished if lo <= r.arrival_time < hi]
        kv.append(statistics.mean(s.kv_usage for s in samples))
        queue.append(statistics.mean(s.waiting for s in samples))
        preemptions.append(sum(s.preemptions for s in samples))
        ttft95.append(p95([r.first_token_time - r.arrival_time  # type: ignore[operator]
                           for r in done]))
        waited = [r.first_scheduled_time - r.arrival_time  # type: ignore[operator]
                  for r in done]
        queue_time.append(statistics.mean(waited))
    for a, b in itertools.pairwise(kv):
        assert b >= a - 0.02, kv
    for a, b in itertools.pairwise(ttft95):
        assert b >= a * 0.9, ttft95
    for a, b in itertools.pairwise(queue_time):
        assert b >= a * 0.9, queue_time
    assert kv[-1] > 0.9 > 0.3 > kv[0]
    assert ttft95[-1] > 10 * ttft95[0]
    assert queue[0] < 1 and queue[-1] > 50  # a queue forms once capacity is exceeded
    assert preemptions[0] == 0 and preemptions[-1] > 0  # and a full cache preempts


def test_block_pool_lru_eviction_keeps_prefixes_findable():
    pool = BlockPool(4)
    a = pool.allocate(2)
    pool.cache(a[0], 111)
    pool.cache(a[1], 222)
    pool.free(a)
    assert pool.num_free == 4 and pool.usage() == 0.0
    assert pool.cached_prefix([111, 222, 333], 3) == a
    pool.allocate(2)  # the two never-used blocks go first
    assert pool.cached_prefix([111, 222], 2) == a
    pool.allocate(1)  # then the tail of the freed request (222) is evicted before its head
    assert pool.cached_prefix([111, 222], 2) == [a[0]]
