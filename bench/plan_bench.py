"""A day-shaped traffic replay: GPU-hours of the capacity-sized policy against the lower bound
and beside today's threshold policy.

Run: ``.venv/bin/python bench/plan_bench.py [--profile small] [--low 4] [--peak 40]
[--hours 24] [--prompt-tokens 512] [--output-tokens 128]``

1. Finds μ, the capacity of one simulated replica at the pool's default latency SLOs (TTFT
   0.8 s and e2e 8 s, 95 % each): the highest per-replica Poisson rate whose simulated level
   meets both (``slo.planning.policy_replay.level_capacity``).
2. Replays a day whose arrival rate follows a cosine from ``--low`` requests/s at midnight to
   ``--peak`` at noon through both policies (``replay_policies``: 15 s ticks, 3 min spin-up,
   the ``[scaling]`` defaults), and computes the lower bound ``ceil(λ/μ)`` per 15-minute step
   (``slo.cost.waste``'s definition).
3. Prints a Markdown table: GPU-hours, their ratio to the lower bound (the target for the
   capacity-sized policy: at most 1.15 with every SLO met), SLO attainment, replica changes,
   and the CPU seconds of the whole replay. Exits 1 when the capacity-sized policy misses
   the target. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slo.planning.policy_replay import (
    LevelBook,
    level_capacity,
    lower_bound_gpu_hours,
    pool_slo_targets,
    replay_policies,
)
from slo.planning.replica.profiles import get_profile
from vigil.config import parse_config

#: Capacity-sized GPU-hours over the lower bound, at most.
TARGET_RATIO = 1.15


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="small")
    p.add_argument("--low", type=float, default=4.0, help="requests/s at midnight")
    p.add_argument("--peak", type=float, default=40.0, help="requests/s at noon")
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=128)
    args = p.parse_args(argv)

    config = parse_config({"pools": [{"name": "chat", "model": "m", "gpu": "H100",
                                      "min_replicas": 1, "max_replicas": 64}]})
    pool = config.pools[0]
    slos = pool_slo_targets(config, pool)
    t0 = time.process_time()
    book = LevelBook(get_profile(args.profile), slos, prompt_tokens=args.prompt_tokens,
                     output_tokens=args.output_tokens)
    mu = level_capacity(book, max_rps=max(args.peak, 1.0))
    if mu <= 0:
        print("no simulated load level meets the SLOs", file=sys.stderr)
        return 1
    end = args.hours * 3600.0

    def rate(t: float) -> float:
        return args.low + (args.peak - args.low) * (0.5 - 0.5 * math.cos(2 * math.pi * t / 86400))

    runs = replay_policies(rate, book.profile, config, pool, mu, end_s=end, book=book)
    lower = lower_bound_gpu_hours(rate, 0.0, end, config.capacity.plan_step, mu,
                                  pool.gpus_per_replica)
    cpu = time.process_time() - t0

    names = [s.name for s in slos]
    print(f"{args.hours:g} h, {args.low:g} -> {args.peak:g} requests/s, profile "
          f"{args.profile}, {args.prompt_tokens}/{args.output_tokens} tokens; "
          f"μ = {mu:.2f} requests/s per replica; {len(book)} simulated levels; "
          f"{cpu:.1f} s CPU\n")
    print("| policy | GPU-hours | / lower bound | " + " | ".join(names)
          + " | SLOs met | scale-outs | scale-ins |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in names) + " | --- | ---: | ---: |")
    print(f"| lower bound ceil(λ/μ) per 15 min | {lower:.1f} | 1.000 | "
          + " | ".join("" for _ in names) + " | | | |")
    for name, label in (("capacity", "capacity-sized ceil(projected λ/μ)"),
                        ("threshold", "threshold (today's policy)")):
        r = runs[name]
        print(f"| {label} | {r.gpu_hours:.1f} | {r.gpu_hours / lower:.3f} | "
              + " | ".join(f"{r.attainment_by_slo[n]:.4f}" for n in names)
              + f" | {'yes' if r.meets_slo else 'no'} | {r.scale_outs} | {r.scale_ins} |")
    cap = runs["capacity"]
    ok = cap.meets_slo and cap.gpu_hours / lower <= TARGET_RATIO
    print(f"\ncapacity-sized within {TARGET_RATIO}x of the lower bound with the SLOs met: "
          f"{'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
