"""A small load generator: Poisson arrivals of a mixed OpenAI-API workload.

It sends what a real chat product sends to vLLM: chat and plain completions, streaming and
not, three priority tiers, mostly short answers with a few very long generations (the cost
outliers the anomaly alarm looks for), and a rate that can ramp up so the fleet shows KV
pressure and queueing. Only loopback/configured URLs are targeted; the run is bounded by
``--duration`` or stops on SIGINT/SIGTERM, closing in-flight connections (which aborts them
on the server, as a disconnecting client does).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import sys
import time
from dataclasses import dataclass, field

import httpx

__all__ = ["LoadStats", "Workload", "add_arguments", "generate", "run"]

_FAQ = [
    "How do I reset my password?",
    "What are your opening hours?",
    "Can I change the delivery address of an order?",
    "How long does a refund take?",
    "Which payment methods do you accept?",
]
_TOPICS = [
    "the KV cache in transformer inference",
    "continuous batching in LLM servers",
    "why p95 latency matters more than the average",
    "error budgets and burn rates",
    "speculative decoding and draft acceptance",
    "GPU cost per thousand requests",
    "prefix caching for shared system prompts",
]
_SYSTEM = "You are a concise, friendly assistant for an online shop. Answer in plain English."


@dataclass
class Workload:
    """The request mix. Shares are ratios 0-1; rates in requests per second."""

    rate: float = 2.0
    ramp_to: float | None = None
    ramp: float = 0.0  # seconds from rate to ramp_to; the rate then stays at ramp_to
    duration: float = 0.0  # seconds; 0 = until stopped
    stream_share: float = 0.5
    chat_share: float = 0.7
    long_share: float = 0.02
    long_tokens: int = 4096
    priorities: tuple[float, float, float] = (0.2, 0.6, 0.2)  # premium, standard, batch
    max_in_flight: int = 512
    seed: int = 0

    def rate_at(self, elapsed: float) -> float:
        """The arrival rate (req/s) ``elapsed`` seconds into the run (linear ramp, then hold)."""
        if self.ramp_to is None:
            return self.rate
        span = self.ramp or self.duration
        if span <= 0:
            return self.ramp_to
        frac = min(1.0, elapsed / span)
        return self.rate + (self.ramp_to - self.rate) * frac


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    errors: int = 0
    cancelled: int = 0  # in flight when the run stopped (the client disconnected)
    in_flight: int = 0
    output_tokens: int = 0
    status: dict[str, int] = field(default_factory=dict)

    def line(self, elapsed: float) -> str:
        return (
            f"loadgen {elapsed:6.0f}s: sent {self.sent}, ok {self.ok}, errors {self.errors}, "
            f"cancelled {self.cancelled}, in flight {self.in_flight}, "
            f"output tokens {self.output_tokens}"
        )


def _request(rng: random.Random, wl: Workload, model: str) -> tuple[str, dict]:
    """One request: (path, JSON body)."""
    priority = rng.choices([0, 1, 2], weights=wl.priorities)[0]
    long = rng.random() < wl.long_share
    stream = rng.random() < wl.stream_share
    if rng.random() < 0.3:
        question = rng.choice(_FAQ)
    else:
        question = f"Explain {rng.choice(_TOPICS)} in {rng.choice([2, 3, 5, 8])} paragraphs."
    body: dict = {"model": model, "stream": stream, "priority": priority}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if long:
        body.update(max_tokens=wl.long_tokens, ignore_eos=True)
    elif rng.random() < 0.7:
        body["max_tokens"] = rng.choice([128, 256, 512])
    if rng.random() < wl.chat_share:
        body["messages"] = [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": question},
        ]
        return "/v1/chat/completions", body
    body["prompt"] = f"{_SYSTEM}\nQuestion: {question}\nAnswer:"
    return "/v1/completions", body


async def _send(client: httpx.AsyncClient, url: str, body: dict, stats: LoadStats) -> None:
    stats.sent += 1
    stats.in_flight += 1
    try:
        if body.get("stream"):
            async with client.stream("POST", url, json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {") and '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage") or {}
                        stats.output_tokens += int(usage.get("completion_tokens") or 0)
                code = resp.status_code
        else:
            resp = await client.post(url, json=body)
            code = resp.status_code
            if code == 200:
                usage = resp.json().get("usage") or {}
                stats.output_tokens += int(usage.get("completion_tokens") or 0)
        key = f"{code // 100}xx"
        stats.status[key] = stats.status.get(key, 0) + 1
        if code == 200:
            stats.ok += 1
        else:
            stats.errors += 1
    except asyncio.CancelledError:
        stats.cancelled += 1
        raise
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        stats.errors += 1
    finally:
        stats.in_flight -= 1


async def generate(
    bases: list[str], model: str, wl: Workload, stop: asyncio.Event, *, report_every: float = 10.0
) -> LoadStats:
    """Send requests to ``bases`` (round-robin) until ``wl.duration`` passes or ``stop`` is set."""
    rng = random.Random(wl.seed)
    stats = LoadStats()
    tasks: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=wl.max_in_flight, max_keepalive_connections=64)
    timeout = httpx.Timeout(600.0, connect=5.0)
    start = time.monotonic()
    next_report = start + report_every
    i = 0
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        while not stop.is_set():
            elapsed = time.monotonic() - start
            if wl.duration and elapsed >= wl.duration:
                break
            rate = max(wl.rate_at(elapsed), 1e-6)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=rng.expovariate(rate))
            if stop.is_set():
                break
            if stats.in_flight >= wl.max_in_flight:
                continue
            path, body = _request(rng, wl, model)
            url = bases[i % len(bases)].rstrip("/") + path
            i += 1
            task = asyncio.create_task(_send(client, url, body, stats))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if time.monotonic() >= next_report:
                print(stats.line(time.monotonic() - start), flush=True)
                next_report += report_every
        # Closing the client with requests in flight disconnects them: the server aborts them.
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url", action="append", required=True, metavar="BASE",
        help="API base of a replica or gateway (http://127.0.0.1:8000); repeat for several",
    )
    p.add_argument("--model", required=True, help="the model name to request")
    p.add_argument("--rate", type=float, default=2.0, help="arrivals per second (Poisson)")
    p.add_argument("--ramp-to", type=float, help="ramp the rate linearly to this...")
    p.add_argument("--ramp", type=float, default=0.0,
                   help="...over this many seconds, then hold it (default: the whole --duration)")
    p.add_argument("--duration", type=float, default=0.0, help="seconds; 0 runs until Ctrl-C")
    p.add_argument("--long-share", type=float, default=0.02, help="share of very long outputs")
    p.add_argument("--stream-share", type=float, default=0.5, help="share of streaming requests")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    for name in ("rate", "ramp_to", "ramp", "duration"):
        v = getattr(args, name)
        if v is not None and (v < 0 or (name == "rate" and v == 0)):
            print(f"vigil loadgen: error: --{name.replace('_', '-')} must be positive, got {v}",
                  file=sys.stderr)
            return 2
    for u in args.url:
        if not u.startswith(("http://", "https://")):
            print(f"vigil loadgen: error: --url must be http(s)://, got {u!r}", file=sys.stderr)
            return 2
    wl = Workload(
        rate=args.rate, ramp_to=args.ramp_to, ramp=args.ramp, duration=args.duration,
        long_share=args.long_share, stream_share=args.stream_share, seed=args.seed,
    )

    async def main() -> LoadStats:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await generate(args.url, args.model, wl, stop)

    stats = asyncio.run(main())
    print(f"loadgen done: {stats.line(0).split(': ', 1)[1]}; status {stats.status}")
    return 0
