"""How long a capacity search takes, and how close it lands to an exhaustive sweep.

Run: ``.venv/bin/python bench/capacity_bench.py [--cases fast,wide] [--probe-duration 1]
[--min-requests 20]``.

For each case a simulated replica with its own calibration runs in a child process (so the
client and the server do not share one interpreter), and on it:

1. the search ``vigil capacity`` runs (``slo.planning.capacity_search.search`` over
   ``serving.loadgen.probe.run_probe``): its wall time, probes and requests;
2. an independent sweep of fixed concurrencies with the same probes, not the search: up from 8
   in steps of 2 until one fails, then down one by one until one passes; the true SLO-limited
   goodput is the best passing level's.

Cases (e2e SLO 0.5 s for 90 %, TTFT 1 s for 90 %; 64 prompt / 6 output tokens a request):
``fast`` — steps of 25 ms + 3.6 ms per running sequence (the SLO binds near 16 in flight);
``wide`` — 15 ms + 1.6 ms per sequence (near 40 in flight: more bisection steps). Prints
Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from serving.loadgen.probe import run_probe  # noqa: E402
from slo.planning.capacity_search import search  # noqa: E402
from slo.planning.replica.profiles import Profile  # noqa: E402
from vigil.capacity import Probe, SloTarget  # noqa: E402
from vigil.config import CapacityConfig  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SLOS = [SloTarget("e2e", "e2e", 0.5, 0.9), SloTarget("ttft", "ttft", 1.0, 0.9)]


def _profile(name: str, base_s: float, per_seq_s: float) -> Profile:
    return Profile(name=name, num_gpu_blocks=20_000, max_num_seqs=256,
                   max_num_batched_tokens=8192, max_model_len=16_384,
                   prefill_tokens_per_s=50_000.0, decode_base_s=base_s,
                   decode_per_seq_s=per_seq_s, decode_per_ctx_token_s=0.0)


CASES = {"fast": _profile("fast", 0.025, 0.0036), "wide": _profile("wide", 0.015, 0.0016)}

_CHILD = """
import json, sys
from slo.planning.replica.profiles import Profile
from serving.sim.testing import running_fleet
with running_fleet(1, profile=Profile(**json.loads(sys.argv[1])), port=int(sys.argv[2])):
    print("ready", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def replica(profile: Profile) -> Iterator[str]:
    """A simulated replica in a child process; yields its API base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(asdict(profile)),
                             str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        if proc.stdout is None or proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the simulated replica did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(20)


async def measure(url: str, cap: CapacityConfig) -> dict:
    limits = httpx.Limits(max_connections=cap.max_concurrency + 4,
                          max_keepalive_connections=cap.max_concurrency + 4)
    async with httpx.AsyncClient(limits=limits, timeout=60, trust_env=False) as client:
        async def probe(c: int) -> Probe:
            return await run_probe(url, MODEL, c, prompt_tokens=64, output_tokens=6,
                                   api_key=None, slos=SLOS, capacity=cap, client=client)

        t0 = time.perf_counter()
        result = await search(probe, max_concurrency=cap.max_concurrency,
                              precision=cap.precision)
        search_s = time.perf_counter() - t0
        sweep: list[Probe] = []
        t0 = time.perf_counter()
        c = 8
        sweep.append(await probe(c))
        while sweep[-1].passed and c < cap.max_concurrency:
            c += 2
            sweep.append(await probe(c))
        while not sweep[-1].passed and c > 1:
            c -= 1  # the one between the last pass and the failure (or down from 8)
            sweep.append(await probe(c))
        sweep_s = time.perf_counter() - t0
    best = result.best
    passing = [p for p in sweep if p.passed]
    true = max(passing, key=lambda p: p.goodput_rps) if passing else None
    return {
        "search_s": search_s, "probes": len(result.probes),
        "requests": sum(p.requests for p in result.probes),
        "conc": best.concurrency if best else 0, "goodput": best.goodput_rps if best else 0.0,
        "attainment": best.attainment if best else 0.0,
        "sweep_s": sweep_s, "sweep_probes": len(sweep),
        "sweep_requests": sum(p.requests for p in sweep),
        "true_conc": max((p.concurrency for p in passing), default=0),
        "true_goodput": true.goodput_rps if true else 0.0,
        "true_attainment": true.attainment if true else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="fast,wide", help="comma-separated: fast, wide")
    ap.add_argument("--probe-duration", type=float, default=1.0, metavar="SECONDS")
    ap.add_argument("--min-requests", type=int, default=20)
    args = ap.parse_args()
    cap = CapacityConfig(probe_duration=args.probe_duration,
                         min_probe_requests=args.min_requests, max_probe_requests=400,
                         max_concurrency=128)
    print(f"probe_duration {cap.probe_duration:g} s, min_probe_requests "
          f"{cap.min_probe_requests}, precision {cap.precision:g}, confidence "
          f"{cap.confidence:g}\n")
    print("| case | search wall s | probes | requests | concurrency | attainment | "
          "goodput req/s | sweep wall s | sweep probes | sweep max passing concurrency | "
          "sweep best goodput req/s (attainment) | search vs sweep |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.cases.split(","):
        with replica(CASES[name]) as url:
            r = asyncio.run(measure(url, cap))
        diff = (r["goodput"] / r["true_goodput"] - 1) * 100 if r["true_goodput"] else 0.0
        print(f"| {name} | {r['search_s']:.1f} | {r['probes']} | {r['requests']} | "
              f"{r['conc']} | {r['attainment'] * 100:.1f} % | {r['goodput']:.2f} | "
              f"{r['sweep_s']:.1f} | {r['sweep_probes']} | {r['true_conc']} | "
              f"{r['true_goodput']:.2f} ({r['true_attainment'] * 100:.1f} %) | "
              f"{diff:+.1f} % |", flush=True)


if __name__ == "__main__":
    main()
