"""bench/routing_bench.py: its workloads, and one tiny run through a real gateway and fleet."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from slo.planning.replica.text import encode_text, render_chat

_PATH = Path(__file__).resolve().parent.parent / "bench" / "routing_bench.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("routing_bench", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["routing_bench"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _blocks(arrival: object) -> tuple[int, ...]:
    return encode_text(render_chat(arrival.messages)).block_hashes  # type: ignore[attr-defined]


def test_shared_workload_is_deterministic(bench: ModuleType) -> None:
    a = bench.shared_workload(7, 5, 4.0, 20.0)
    b = bench.shared_workload(7, 5, 4.0, 20.0)
    assert a == b
    assert a != bench.shared_workload(8, 5, 4.0, 20.0)


def test_system_prompts_are_2k_to_4k_tokens(bench: ModuleType) -> None:
    prompts = bench.system_prompts(1, 20)
    assert len(set(prompts)) == 20
    assert all(8000 <= len(p) <= 16000 for p in prompts)


def test_poisson_arrivals_near_the_rate(bench: ModuleType) -> None:
    arrivals = bench.shared_workload(1, 20, 5.0, 200.0)
    offsets = [a.offset for a in arrivals]
    assert offsets == sorted(offsets) and offsets[-1] < 200.0
    assert 900 < len(arrivals) < 1100  # 1000 expected, sd ~32


def test_each_turn_extends_the_previous_one(bench: ModuleType) -> None:
    arrivals = bench.shared_workload(3, 4, 6.0, 60.0)
    last: dict[int, object] = {}
    for a in arrivals:
        prev = last.get(a.conversation)
        if prev is None:
            assert a.turn == 0 and [m["role"] for m in a.messages] == ["system", "user"]
        else:
            assert a.turn == prev.turn + 1
            assert a.offset - prev.offset >= bench.THINK_S
            # The previous prompt, its answer, a new user message.
            assert a.messages[:len(prev.messages)] == prev.messages
            assert [m["role"] for m in a.messages[len(prev.messages):]] == ["assistant", "user"]
            # So every full block of the previous prompt is a prefix of this one's blocks.
            before = _blocks(prev)
            assert _blocks(a)[:len(before) - 1] == before[:-1]
        last[a.conversation] = a
    assert max(a.turn for a in arrivals) >= 2


def test_unique_workload_keeps_lengths_and_shares_only_the_first_block(
        bench: ModuleType) -> None:
    shared = bench.shared_workload(1, 3, 4.0, 15.0)
    unique = bench.unique_workload(shared)
    assert [a.prompt_chars for a in unique] == [a.prompt_chars for a in shared]
    assert [a.offset for a in unique] == [a.offset for a in shared]
    blocks = [_blocks(a) for a in unique]
    rest = [h for b in blocks for h in b[1:]]
    assert len(rest) == len(set(rest))
    # The shared workload does repeat its tenants' blocks.
    again = [h for a in shared for h in _blocks(a)[1:]]
    assert len(set(again)) < len(again) / 2


def test_one_tiny_run_through_a_gateway(bench: ModuleType, tmp_path: Path) -> None:
    """Two tenants, 4 s of arrivals on 2 replicas: every request answered, the cache hit."""
    args = argparse.Namespace(warmup=1.0, seconds=3.0, rate=4.0, tenants=2, replicas=2,
                              seed=1, ttft_slo=1.0)
    arrivals = bench.shared_workload(args.seed, args.tenants, args.rate,
                                     args.warmup + args.seconds)
    with bench.fleet_process(args.replicas, bench.PROFILE, tmp_path / "fleet.log") as fleet:
        run = bench.run_one("shared", "least_outstanding", arrivals, args, fleet, tmp_path)
    measured = [a for a in arrivals if a.offset >= args.warmup]
    assert len(run.results) == len(measured) > 0
    assert all(r.ok for r in run.results), [r.error for r in run.results]
    assert all(r.output_tokens == bench.OUTPUT_TOKENS for r in run.results)
    assert 0 < run.hits < run.queries
    s = bench.summary(run, args.ttft_slo)
    assert s["ttft_p50"] <= s["ttft_p90"] <= s["ttft_p99"]
    assert 0 < s["hit_rate"] < 1
    text = bench.report([run], args, 5.0, ((0.5,), (0.7,)), "10%")
    assert "| shared | least_outstanding | " in text
    assert "TTFT p90 least_outstanding / prefix_aware" not in text  # one mode: no ratio
