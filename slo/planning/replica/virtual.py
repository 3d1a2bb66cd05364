"""Run an engine on a virtual clock, at full speed: a ten-minute load ramp takes milliseconds.

``run_virtual`` feeds timed arrivals to an ``Engine`` and steps it back to back, moving the clock
by each step's modelled duration, jumping over idle gaps. It records the scheduler state after
every step so tests and what-if studies can look at KV usage, queue length and preemptions.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from slo.planning.replica.engine import Engine
from slo.planning.replica.request import EngineRequest
from slo.planning.replica.text import Prompt

__all__ = ["Arrival", "StepSample", "VirtualRun", "poisson_arrivals", "run_virtual"]


@dataclass(frozen=True)
class Arrival:
    """A request arriving at ``time`` (seconds)."""

    time: float
    prompt: Prompt
    max_tokens: int
    priority: int = 0
    ignore_eos: bool = False
    min_tokens: int = 0
    seed: int | None = None
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class StepSample:
    """The scheduler state at the end of a step at ``time`` (seconds)."""

    time: float
    running: int
    waiting: int
    kv_usage: float
    preemptions: int


@dataclass
class VirtualRun:
    """The outcome of ``run_virtual``."""

    finished: list[EngineRequest] = field(default_factory=list)
    samples: list[StepSample] = field(default_factory=list)
    end_time: float = 0.0

    def window(self, start: float, stop: float) -> list[StepSample]:
        """Samples with ``start <= time < stop``."""
        return [s for s in self.samples if start <= s.time < stop]


def run_virtual(engine: Engine, arrivals: Iterable[Arrival], *, start: float = 0.0,
                until: float | None = None) -> VirtualRun:
    """Drive ``engine`` through ``arrivals`` (sorted by time) until all finish or ``until``."""
    run = VirtualRun()
    it: Iterator[Arrival] = iter(arrivals)
    pending = next(it, None)
    now = start
    ids = itertools.count()
    while True:
        while pending is not None and pending.time <= now:
            rid = pending.request_id or f"v-{next(ids)}"
            engine.add_request(rid, pending.prompt, max_tokens=pending.max_tokens,
                               now=pending.time, min_tokens=pending.min_tokens,
                               ignore_eos=pending.ignore_eos, seed=pending.seed,
                               priority=pending.priority)
            pending = next(it, None)
        if until is not None and now >= until:
            break
        plan = engine.schedule(now) if engine.has_unfinished else None
        if plan is None:
            if pending is None:
                if engine.has_unfinished:
                    raise RuntimeError("engine has requests but cannot schedule any")
                break
            now = max(now, pending.time)  # idle until the next arrival
            continue
        now += plan.duration
        for out in engine.complete(plan, now):
            if out.finished:
                run.finished.append(out.req)
        g = engine.gauges()
        run.samples.append(StepSample(now, g.running, g.waiting, g.kv_usage, len(plan.preempted)))
    run.end_time = now
    return run


def poisson_arrivals(rate: float, start: float, stop: float, rng: random.Random,
                     make: Callable[[float, int], Arrival]) -> list[Arrival]:
    """Poisson arrivals at ``rate``/s in ``[start, stop)``; ``make(time, i)`` builds each."""
    out: list[Arrival] = []
    t = start
    i = 0
    while True:
        t += rng.expovariate(rate)
        if t >= stop:
            return out
        out.append(make(t, i))
        i += 1
