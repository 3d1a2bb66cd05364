"""Routing: prefix-aware vs least-outstanding, on simulated replicas with prefix caching.

Run: ``.venv/bin/python bench/routing_bench.py [--seconds 40] [--warmup 10] [--rate 4]
[--tenants 20] [--replicas 4] [--seed 1] [--workloads shared,unique]
[--modes least_outstanding,prefix_aware] [--ttft-slo 1.0]``.

Separate processes on loopback: one child process running ``--replicas`` simulated vLLM
replicas (one model, the profile ``PROFILE`` below), one ``vigil gateway`` per routing mode
(``[gateway] routing``; started fresh for each run, after every replica was restarted, so each
run starts with empty KV caches and empty routing state), and this script's load generator,
which sends streaming chat requests through the gateway with Poisson arrivals.

Workloads, built once from ``--seed`` and replayed identically in every mode:

* ``shared``: ``--tenants`` tenants, each with a system prompt of 8,000-16,000 characters
  (2,000-4,000 simulated tokens); each arrival belongs to a tenant drawn uniformly and is the
  next turn of one of its conversations (2-6 turns; each turn appends the previous answer and
  a new user message of 200-800 characters). A conversation's next turn is sent no sooner than
  ``THINK_S`` after its previous one, so it is normally answered by then; otherwise the tenant
  opens another conversation. The previous answer is written by the workload, not taken from
  the replica, so the request sequence does not depend on timing.
* ``unique``: the same requests with the first characters of every system prompt replaced by
  the request's number: the same lengths, but two prompts share no KV block beyond the first
  (16 tokens, most of them the chat template's header).

Each request asks for ``OUTPUT_TOKENS`` tokens with ``ignore_eos``, so the output work is the
same everywhere and the difference between modes is the prefill the cache saves.

Measured: the requests sent after ``--warmup`` seconds, each awaited to its end. TTFT is from
sending to the first content chunk; throughput is completed measured requests over the time
from the end of the warm-up to the last of them finishing; goodput counts those with TTFT <=
``--ttft-slo``. The prefix-cache hit rate is the replicas' ``vllm:prefix_cache_hits`` over
``vllm:prefix_cache_queries`` (tokens), their increase from the end of the warm-up to the end,
summed over replicas (the simulator counts a preempted request's re-admission, which hits its
own blocks, so the row gives the preemptions too). Each row also gives the CPU seconds the
simulator, the gateway and the load generator used, and the share of the run's time in which
some thread on the machine waited for a CPU (Linux PSI): on a shared 2-core machine, a row with
high pressure measured the neighbours too. The simulator runs in real time (it has no
time-scale option); its CPU use says whether it kept up. Prints Markdown.

Targets checked, not asserted: TTFT p90 at least 2x lower with ``prefix_aware`` on ``shared``,
and within 2 % of ``least_outstanding`` on ``unique``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench.processes import (  # noqa: E402
    cpu_pressure_us,
    cpu_seconds,
    free_port,
    own_cpu_seconds,
    stop,
)
from serving.loadgen.client import send_one  # noqa: E402
from serving.loadgen.report import RequestResult  # noqa: E402
from serving.loadgen.workload import PlannedRequest  # noqa: E402
from serving.sim.testing import sample_values, total  # noqa: E402
from slo.planning.replica.profiles import Profile  # noqa: E402
from slo.planning.replica.text import CHARS_PER_TOKEN  # noqa: E402

MODEL = "bench-model"
KEY = "sk-routing-bench"
MODES = ("least_outstanding", "prefix_aware")
WORKLOADS = ("shared", "unique")

#: One replica: prefill at 5,000 tokens/s, so an uncached 3,000-token system prompt costs
#: 0.6 s of GPU time and a cached one almost nothing; 1,500 KV blocks (24,000 tokens) hold
#: about 7 of the 20 tenants' prompts, fewer with requests in flight: all 20 do not fit on one
#: replica, but a quarter of them (about 15,000 tokens) fits on each of 4. Decode steps are
#: slow enough (20 ms + 0.5 ms per sequence) to keep the number of streamed chunks, and so
#: the CPU of the gateway and the load generator, low.
PROFILE = Profile(
    name="routing-bench", num_gpu_blocks=1500, num_gpu_blocks_override=1500,
    max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=8192,
    prefill_tokens_per_s=5_000.0, decode_base_s=0.020, decode_per_seq_s=0.0005)

#: Output tokens of every request (with ``ignore_eos``).
OUTPUT_TOKENS = 32
#: Seconds at least between two turns of one conversation (the user reads the answer).
THINK_S = 3.0
SYSTEM_CHARS = (8_000, 16_000)
USER_CHARS = (200, 800)
TURNS = (2, 6)

_WORDS = ("account", "billing", "policy", "customer", "request", "order", "refund", "answer",
          "always", "never", "politely", "clearly", "service", "support", "product", "check",
          "escalate", "verify", "identity", "summary", "details", "shipping", "warranty",
          "invoice", "the", "a", "of", "to", "and", "with", "for", "when", "if", "you")


# --- the workload --------------------------------------------------------------------------

def _text(rng: random.Random, chars: int) -> str:
    """Deterministic prose of exactly ``chars`` characters."""
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


@dataclass(frozen=True)
class Arrival:
    """One request of a workload: when it leaves (seconds from the start), whose it is, and
    its chat messages."""

    offset: float
    tenant: int
    conversation: int
    turn: int
    messages: tuple[dict[str, str], ...]

    @property
    def prompt_chars(self) -> int:
        return sum(len(m["content"]) for m in self.messages)


@dataclass
class _Conversation:
    ident: int
    turns: int
    history: list[dict[str, str]]
    last_sent: float = -math.inf
    sent: int = 0


def system_prompts(seed: int, tenants: int) -> list[str]:
    """Each tenant's system prompt, 8,000-16,000 characters, deterministic from ``seed``."""
    out = []
    for t in range(tenants):
        rng = random.Random(f"{seed}:system:{t}")
        head = f"You are the support assistant of tenant {t:03d}. "
        out.append(head + _text(rng, rng.randint(*SYSTEM_CHARS) - len(head)))
    return out


def shared_workload(seed: int, tenants: int, rate: float, seconds: float) -> list[Arrival]:
    """The shared-prefix workload: Poisson arrivals at ``rate`` (requests/s) for ``seconds``,
    each the next turn of a conversation of a tenant drawn uniformly (module docstring)."""
    if rate <= 0 or tenants < 1:
        raise ValueError("rate must be > 0 and tenants >= 1")
    rng = random.Random(f"{seed}:arrivals")
    prompts = system_prompts(seed, tenants)
    open_: list[list[_Conversation]] = [[] for _ in range(tenants)]
    out: list[Arrival] = []
    t = rng.expovariate(rate)
    ident = 0
    while t < seconds:
        tenant = rng.randrange(tenants)
        ready = [c for c in open_[tenant] if t - c.last_sent >= THINK_S]
        if ready:
            conv = ready[0]
        else:
            conv = _Conversation(ident, rng.randint(*TURNS),
                                 [{"role": "system", "content": prompts[tenant]}])
            ident += 1
            open_[tenant].append(conv)
        conv.history.append({"role": "user", "content": _text(rng, rng.randint(*USER_CHARS))})
        out.append(Arrival(t, tenant, conv.ident, conv.sent, tuple(conv.history)))
        conv.sent += 1
        conv.last_sent = t
        # The answer the next turn carries: about as long as the output asked for.
        conv.history.append({"role": "assistant",
                             "content": _text(rng, OUTPUT_TOKENS * CHARS_PER_TOKEN)})
        if conv.sent >= conv.turns:
            open_[tenant].remove(conv)
        t += rng.expovariate(rate)
    return out


def unique_workload(shared: list[Arrival]) -> list[Arrival]:
    """The same requests, each system prompt starting with the request's number instead: the
    same lengths, and no KV block shared between two prompts after the first one, which the
    number reaches (block hashes are chained: one different block makes every later block
    different)."""
    out = []
    for i, a in enumerate(shared):
        system = a.messages[0]["content"]
        stamp = f"#{i:07d} "
        first = {"role": "system", "content": stamp + system[len(stamp):]}
        out.append(dataclasses.replace(a, messages=(first, *a.messages[1:])))
    return out


def planned(a: Arrival) -> PlannedRequest:
    """The HTTP request of an arrival."""
    body = {"model": MODEL, "messages": list(a.messages), "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": OUTPUT_TOKENS,
            "ignore_eos": True}
    return PlannedRequest(path="/v1/chat/completions", body=body, tier="premium",
                          kind="normal", stream=True)


def prefill_capacity(arrivals: list[Arrival], replicas: int, profile: Profile) -> float:
    """Requests/s the fleet could prefill if nothing were cached (prompt tokens / prefill
    rate; decode steps not counted, so the true capacity is lower)."""
    mean_tokens = (sum(a.prompt_chars for a in arrivals) / len(arrivals) / CHARS_PER_TOKEN
                   if arrivals else 0.0)
    return replicas * profile.prefill_tokens_per_s / mean_tokens if mean_tokens else 0.0


# --- processes ---------------------------------------------------------------------------------

_FLEET = """
import json, sys
from slo.planning.replica.profiles import Profile
from serving.sim.testing import running_fleet
spec = json.loads(sys.argv[1])
with running_fleet(spec["replicas"], profile=Profile(**spec["profile"]),
                   model=spec["model"]) as fleet:
    print(" ".join(fleet.base_urls), flush=True)
    for line in sys.stdin:
        if line.strip() == "restart":
            for i in range(len(fleet.replicas)):
                fleet.restart(i)
            print("ok", flush=True)
"""


@dataclass
class FleetProcess:
    """The simulated replicas' child process: their URLs, and ``restart()`` (empty caches,
    counters from zero)."""

    proc: subprocess.Popen[str]
    urls: list[str]

    def restart(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("restart\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "ok":
            raise RuntimeError("the simulated replicas did not restart")


@contextlib.contextmanager
def fleet_process(replicas: int, profile: Profile, log: Path) -> Iterator[FleetProcess]:
    spec = {"replicas": replicas, "profile": dataclasses.asdict(profile), "model": MODEL}
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", _FLEET, json.dumps(spec)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if len(line) != replicas:
            raise RuntimeError("the simulated replicas did not start: "
                               + log.read_text(errors="replace")[-2000:])
        yield FleetProcess(proc, line)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def gateway_config(tmp: Path, mode: str, urls: list[str], port: int) -> Path:
    targets = "".join(f'\n[[targets]]\nname = "sim-{i}"\nurl = "{u}/metrics"\npool = "bench"\n'
                      for i, u in enumerate(urls))
    path = tmp / f"vigil-{mode}.toml"
    path.write_text(f"""
[[pools]]
name = "bench"
model = "{MODEL}"
{targets}
[gateway]
listen = "127.0.0.1:{port}"
records_path = "{tmp / f'records-{mode}.db'}"
routing = "{mode}"

[[gateway.api_keys]]
sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"
tenant = "bench"
tier = "premium"
""")
    return path


@contextlib.contextmanager
def gateway_process(config: Path, url: str, replicas: int, log: Path
                    ) -> Iterator[subprocess.Popen[bytes]]:
    """``vigil gateway`` until the block ends; up once its /health shows every replica
    healthy."""
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "vigil_shell", "gateway", "--config",
                                 str(config)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with {proc.returncode}: "
                                   + log.read_text(errors="replace")[-2000:])
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway did not see its replicas healthy in 60 s")
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                r = httpx.get(f"{url}/health", timeout=1)
                if r.json()["pools"]["bench"]["healthy_replicas"] == replicas:
                    break
            time.sleep(0.2)
        yield proc
    finally:
        stop(proc)


# --- one run -----------------------------------------------------------------------------------

@dataclass
class Run:
    """One workload through one routing mode: the measured requests and the counters."""

    workload: str
    mode: str
    results: list[RequestResult] = field(default_factory=list)
    #: Seconds from the end of the warm-up to the last measured request's end.
    window: float = 0.0
    queries: float = 0.0
    hits: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0
    stalled: float | None = None
    #: Requests finished per replica over the measured window (the replicas' counters).
    per_replica: list[float] = field(default_factory=list)
    #: Preemptions over the measured window, all replicas.
    preemptions: float = 0.0


def prefix_counters(urls: list[str]) -> list[tuple[float, float, float, float]]:
    """Per replica: prefix-cache queries and hits (tokens), finished requests, preemptions."""
    out = []
    for u in urls:
        s = sample_values(httpx.get(f"{u}/metrics", timeout=10).text)
        out.append((total(s, "vllm:prefix_cache_queries_total"),
                    total(s, "vllm:prefix_cache_hits_total"),
                    total(s, "vllm:request_success_total"),
                    total(s, "vllm:num_preemptions_total")))
    return out


async def drive(base: str, arrivals: list[Arrival], warmup: float, urls: list[str],
                drain_s: float = 120.0) -> tuple[list[RequestResult], float, list, list]:
    """Send every arrival on schedule; wait for all to end (at most ``drain_s`` after the
    last is sent). Returns the measured requests' results, their window (seconds) and the
    replicas' counters at the end of the warm-up and at the end."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(600.0, connect=5.0)
    keys = {"premium": KEY}
    measured: list[RequestResult] = []
    ends: list[float] = []
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        start = time.perf_counter()

        async def one(a: Arrival) -> None:
            result = RequestResult(tier="premium", kind="normal", stream=True)
            if a.offset >= warmup:
                measured.append(result)
            await send_one(client, base, planned(a), keys, result)
            if a.offset >= warmup:
                ends.append(time.perf_counter())

        tasks: list[asyncio.Task[None]] = []
        before: list = []
        for a in arrivals:
            if not before and a.offset >= warmup:
                # In a thread: the requests in flight keep streaming while it scrapes.
                before = await loop.run_in_executor(None, prefix_counters, urls)
            delay = start + a.offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(a)))
        if not before:
            before = await loop.run_in_executor(None, prefix_counters, urls)
        window_start = start + warmup
        _done, pending = await asyncio.wait(tasks, timeout=drain_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    after = await loop.run_in_executor(None, prefix_counters, urls)
    window = max(ends, default=window_start) - window_start
    return measured, window, before, after


def run_one(workload: str, mode: str, arrivals: list[Arrival], args: argparse.Namespace,
            fleet: FleetProcess, tmp: Path) -> Run:
    """Restart the replicas, start a gateway in ``mode``, send ``arrivals`` through it."""
    fleet.restart()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = gateway_config(tmp, mode, fleet.urls, port)
    with gateway_process(config, url, len(fleet.urls), tmp / f"gateway-{mode}.log") as gw:
        cpu0 = {"sim": cpu_seconds(fleet.proc.pid), "gateway": cpu_seconds(gw.pid),
                "loadgen": own_cpu_seconds()}
        pressure, wall = cpu_pressure_us(), time.perf_counter()
        measured, window, before, after = asyncio.run(
            drive(url, arrivals, args.warmup, fleet.urls))
        run = Run(workload, mode, measured, window)
        run.cpu = {"sim": cpu_seconds(fleet.proc.pid) - cpu0["sim"],
                   "gateway": cpu_seconds(gw.pid) - cpu0["gateway"],
                   "loadgen": own_cpu_seconds() - cpu0["loadgen"]}
    run.wall = time.perf_counter() - wall
    end_pressure = cpu_pressure_us()
    run.stalled = (None if pressure is None or end_pressure is None
                   else (end_pressure - pressure) / 1e6)
    run.queries = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    run.hits = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    run.per_replica = [a[2] - b[2] for a, b in zip(after, before, strict=True)]
    run.preemptions = sum(a[3] - b[3] for a, b in zip(after, before, strict=True))
    return run


# --- the report --------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation, as ``vllm bench serve``); NaN if none."""
    return float(np.percentile(values, q)) if values else math.nan


def summary(run: Run, ttft_slo: float) -> dict[str, float]:
    """The figures of one row (seconds, requests/s, tokens/s, ratios 0-1)."""
    ok = [r for r in run.results if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    window = max(run.window, 1e-9)
    return {
        "requests": float(len(run.results)), "errors": float(len(run.results) - len(ok)),
        "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
        "e2e_p50": pct(e2e, 50), "rps": len(ok) / window,
        "tok_s": sum(r.output_tokens for r in ok) / window,
        "hit_rate": run.hits / run.queries if run.queries else math.nan,
        "goodput": sum(1 for t in ttft if t <= ttft_slo) / window,
    }


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v * 1000:.0f}"


def report(runs: list[Run], args: argparse.Namespace, capacity: float,
           load_avg: tuple[tuple[float, ...], tuple[float, ...]], stalled: str) -> str:
    p = PROFILE
    lines = [
        f"Machine: {os.cpu_count()} CPUs, load average {load_avg[0][0]:.2f} at the start, "
        f"{load_avg[1][0]:.2f} at the end (1 min); CPU pressure over the whole run {stalled}; "
        f"Python {platform.python_version()}.",
        f"Fleet: {args.replicas} simulated replicas in real time, profile `{p.name}` "
        f"(prefill {p.prefill_tokens_per_s:,.0f} tok/s, {p.num_gpu_blocks} KV blocks of "
        f"{p.block_size} tokens, step {p.decode_base_s * 1000:g} ms + "
        f"{p.decode_per_seq_s * 1000:g} ms/seq, max_num_batched_tokens "
        f"{p.max_num_batched_tokens}).",
        f"Load: {args.tenants} tenants, Poisson {args.rate:g} req/s "
        f"({args.rate / capacity:.0%} of the fleet's no-cache prefill capacity, "
        f"{capacity:.1f} req/s), {OUTPUT_TOKENS} output tokens each; {args.warmup:g} s "
        f"warm-up then {args.seconds:g} s measured per run; seed {args.seed}. "
        f"Goodput: TTFT <= {args.ttft_slo:g} s.",
        "",
        "| workload | routing | requests | errors | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms "
        "| e2e p50 ms | req/s | output tok/s | prefix-cache hit rate | goodput req/s "
        "| preemptions | requests per replica | CPU s sim / gateway / load gen "
        "| CPU pressure |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | --- | --- | ---: |",
    ]
    sums: dict[tuple[str, str], dict[str, float]] = {}
    for r in runs:
        s = summary(r, args.ttft_slo)
        sums.setdefault((r.workload, r.mode), s)  # a mode run twice: the ratio uses the first
        pressure = "" if r.stalled is None or not r.wall else f"{r.stalled / r.wall:.0%}"
        lines.append(
            f"| {r.workload} | {r.mode} | {s['requests']:.0f} | {s['errors']:.0f} | "
            f"{_ms(s['ttft_p50'])} | {_ms(s['ttft_p90'])} | {_ms(s['ttft_p99'])} | "
            f"{_ms(s['e2e_p50'])} | {s['rps']:.2f} | {s['tok_s']:.0f} | "
            f"{s['hit_rate']:.1%} | {s['goodput']:.2f} | {r.preemptions:.0f} | "
            f"{' / '.join(f'{n:.0f}' for n in r.per_replica)} | "
            f"{r.cpu['sim']:.0f} / {r.cpu['gateway']:.0f} / {r.cpu['loadgen']:.0f} | "
            f"{pressure} |")
    ratios = []
    for w in dict.fromkeys(r.workload for r in runs):
        lo, pa = sums.get((w, "least_outstanding")), sums.get((w, "prefix_aware"))
        if lo is None or pa is None:
            continue
        ratio = lo["ttft_p90"] / pa["ttft_p90"]
        if w == "shared":
            target, met = ">= 2", ratio >= 2
        else:
            target, met = "0.98 - 1.02", 0.98 <= ratio <= 1.02
        ratios.append(f"| {w} | {ratio:.2f} | {target} | {'met' if met else 'not met'} |")
    if ratios:
        lines += ["", "| workload | TTFT p90 least_outstanding / prefix_aware | target | result |",
                  "| --- | ---: | --- | --- |", *ratios]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--seconds", type=float, default=40.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=10.0,
                   help="seconds of arrivals before the measured ones (not measured)")
    p.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals, requests/s")
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help="comma-separated: shared, unique")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated routing modes: least_outstanding, prefix_aware")
    p.add_argument("--ttft-slo", type=float, default=1.0, help="goodput's TTFT bound, seconds")
    args = p.parse_args()
    workloads = args.workloads.split(",")
    modes = args.modes.split(",")
    if not set(workloads) <= set(WORKLOADS) or not set(modes) <= set(MODES):
        raise SystemExit(f"workloads are {WORKLOADS}, modes {MODES}")
    shared = shared_workload(args.seed, args.tenants, args.rate, args.warmup + args.seconds)
    built = {"shared": shared, "unique": unique_workload(shared)}
    capacity = prefill_capacity(shared, args.replicas, PROFILE)
    load_start = os.getloadavg()
    pressure, wall = cpu_pressure_us(), time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with fleet_process(args.replicas, PROFILE, tmp / "fleet.log") as fleet:
            for w in workloads:
                for mode in modes:
                    run = run_one(w, mode, built[w], args, fleet, tmp)
                    runs.append(run)
                    s = summary(run, args.ttft_slo)
                    print(f"  {w} {mode}: {s['requests']:.0f} requests, TTFT p90 "
                          f"{_ms(s['ttft_p90'])} ms, hit rate {s['hit_rate']:.1%}, load "
                          f"average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    end = cpu_pressure_us()
    stalled = ("unknown" if pressure is None or end is None
               else f"{(end - pressure) / 1e6 / (time.perf_counter() - wall):.0%}")
    print(report(runs, args, capacity, (load_start, os.getloadavg()), stalled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
