"""The load of the Prometheus-mode run (``test_prometheus_mode.py``): a stop-the-world rhythm,
a freezer that pauses the simulated fleet's engines, and the load driver.

Why stop the world. Two systems that scrape the same counter at different instants see it
differ by what happened between the instants, and nobody can know how much that was: it is
whatever the fleet did in that second. So the fleet's engines are paused (``FleetFreezer``:
no engine step runs, no request arrives) for a few seconds of every cycle, and the evaluation
instants, every window edge and every point of the scaling timelines fall in the middle of a
pause, where both systems have scraped the same frozen values. What happens between the two
scrape instants is then zero, and checked to be zero (``prometheus_mode_samples.
edge_violations``); what remains is only *where* the instants are, and its effect is derived,
not guessed (``prometheus_mode_tolerance``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from serving.sim.testing import FleetHandle

__all__ = ["CyclePlan", "FleetFreezer", "LoadStats", "Schedule", "drive_load"]


# --- the rhythm -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    """The stop-the-world rhythm (seconds): each cycle of ``cycle_s`` runs the fleet for
    ``run_s`` (requests arrive only then), then pauses it. ``settle_s`` bounds the engine step
    still under way when the pause starts (a 2048-token prefill chunk takes 0.34 s on the
    ``small`` profile). Evaluation instants sit midway between the settled pause and the thaw,
    so the last scrape before them and the first after them (one ``scrape_interval_s`` away
    at most) both see the paused state, with ``margin_s`` to spare on each side."""

    cycle_s: float = 6.0
    run_s: float = 2.0
    settle_s: float = 0.5
    scrape_interval_s: float = 1.0

    @property
    def eval_offset_s(self) -> float:
        """Evaluation instants relative to their cycle's start."""
        return (self.run_s + self.settle_s + self.cycle_s) / 2

    @property
    def margin_s(self) -> float:
        """Slack on each side of the instants' scrape-interval neighbourhoods."""
        return self.cycle_s - self.eval_offset_s - self.scrape_interval_s

    def eval_time(self, start_s: float, cycle: int) -> float:
        """The evaluation instant of ``cycle`` (Unix seconds) for cycles starting at
        ``start_s``."""
        return start_s + cycle * self.cycle_s + self.eval_offset_s


@dataclass(frozen=True)
class CyclePlan:
    """The load of one cycle: Poisson arrivals at ``rate`` per second of run time, ``giant``
    requests with a prompt of more than 10,000 tokens (cost anomalies), or ``restart``: replica
    index restarted (every counter back to zero) while the whole cycle stays paused."""

    rate: float = 0.0
    giant: int = 0
    restart: int | None = None


# --- stopping the world ---------------------------------------------------------------------
class FleetFreezer:
    """Pauses the engines of an in-thread fleet: while ``frozen``, ``Engine.schedule`` finds
    nothing to run, so no step starts (the one under way finishes), no token is produced and no
    gauge or counter moves; the HTTP servers keep answering, ``/metrics`` included. It works on
    the replicas' public ``engine`` objects; call ``install`` again after a restart, which
    builds a new engine."""

    def __init__(self, fleet: FleetHandle) -> None:
        self.fleet = fleet
        self.frozen = False
        for replica in fleet.replicas:
            self.install(replica.engine)

    def install(self, engine: Any) -> None:
        """Wrap ``engine.schedule`` (an instance attribute shadows the method)."""
        original = type(engine).schedule

        def schedule(now: float) -> Any:
            return None if self.frozen else original(engine, now)

        engine.schedule = schedule

    def restart(self, index: int) -> None:
        """Restart replica ``index`` (counters start from zero) and keep it paused."""
        self.fleet.restart(index)
        self.install(self.fleet.replicas[index].engine)


# --- load -----------------------------------------------------------------------------------
@dataclass
class LoadStats:
    """What the client saw: requests sent, answered 2xx, failed (HTTP error or broken stream,
    e.g. by a restart), and cancelled by the client mid-stream (vLLM aborts those)."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    cancelled: int = 0
    giant: int = 0


_SYSTEM = "You are a concise assistant for an online shop. "
_FILLER = "Tell me about the KV cache, batching and tail latency of LLM serving. "


def _body(rng: random.Random, model: str, n: int, giant: bool) -> tuple[str, dict[str, Any]]:
    """One request (path, JSON): chat or completions, 250-1000 prompt tokens (4 characters a
    token in the simulator), 16-160 output tokens; a giant one has a 44,000-character prompt
    (11,000 tokens: the bucket (10000, 20000] of vLLM's token histograms)."""
    if giant:
        text = f"{n} " + _FILLER * (44_000 // len(_FILLER))
        return "/v1/completions", {"model": model, "prompt": text, "max_tokens": 8}
    text = f"{n} " + _FILLER * rng.randint(14, 55)
    body: dict[str, Any] = {"model": model, "max_tokens": rng.choice((16, 48, 96, 160)),
                            "stream": rng.random() < 0.5}
    if rng.random() < 0.7:
        body["messages"] = [{"role": "system", "content": _SYSTEM},
                            {"role": "user", "content": text}]
        return "/v1/chat/completions", body
    body["prompt"] = _SYSTEM + text
    return "/v1/completions", body


async def _send(client: httpx.AsyncClient, url: str, body: dict[str, Any], cancel_after: int,
                stats: LoadStats) -> None:
    stats.sent += 1
    try:
        if body.get("stream"):
            chunks = 0
            async with client.stream("POST", url, json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        chunks += 1
                        if cancel_after and chunks >= cancel_after:
                            # Tokens arrive only while the fleet runs, so the disconnect (and
                            # vLLM's abort) happens in a run phase, never inside a pause.
                            stats.cancelled += 1
                            return
            ok = resp.status_code == 200
        else:
            ok = (await client.post(url, json=body)).status_code == 200
        if ok:
            stats.ok += 1
        else:
            stats.failed += 1
    except httpx.HTTPError:
        stats.failed += 1


async def _sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        await asyncio.sleep(min(left, 0.05))


def drive_load(fleet: FleetHandle, freezer: FleetFreezer, schedule: Schedule,
               start_s: float, plan: Sequence[CyclePlan], *, seed: int = 7) -> LoadStats:
    """Run ``plan`` from ``start_s`` (Unix seconds), one cycle per entry, round-robin over the
    replicas; returns when the last cycle ends (in-flight requests are then cancelled). The
    fleet is left paused between cycles and at the end."""
    stats = LoadStats()
    model = fleet.replicas[0].served_model
    bases = fleet.base_urls

    async def run() -> None:
        rng = random.Random(seed)
        tasks: set[asyncio.Task[None]] = set()
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=5.0), limits=limits,
                                     trust_env=False) as client:
            n = 0
            for k, cycle in enumerate(plan):
                begin = start_s + k * schedule.cycle_s
                await _sleep_until(begin)
                if cycle.restart is not None:
                    # Mid-pause: both systems scrape the paused values before the restart
                    # and the zeroed ones after it, so the reset is the same on both sides.
                    await _sleep_until(begin + schedule.run_s / 2)
                    await asyncio.to_thread(freezer.restart, cycle.restart)
                    continue
                freezer.frozen = False
                arrivals: list[tuple[float, bool]] = []
                t = begin
                while (t := t + rng.expovariate(cycle.rate)) < begin + schedule.run_s - 0.1:
                    arrivals.append((t, False))
                arrivals += [(begin + 0.1 + 0.3 * i, True) for i in range(cycle.giant)]
                for at, giant in sorted(arrivals):
                    await _sleep_until(at)
                    path, body = _body(rng, model, n, giant)
                    cancel = rng.randint(2, 10) if body.get("stream") and rng.random() < 0.12 \
                        else 0
                    stats.giant += giant
                    task = asyncio.create_task(
                        _send(client, bases[n % len(bases)] + path, body, cancel, stats))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    n += 1
                await _sleep_until(begin + schedule.run_s)
                freezer.frozen = True
            await _sleep_until(start_s + len(plan) * schedule.cycle_s)
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    return stats

