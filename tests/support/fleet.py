"""Synthetic vLLM fleet data for the SLO engine's tests, written to a real ``Store``.

What ``Fleet`` writes looks like what the collector stores from a real vLLM (names, labels,
cumulative buckets spelled as vLLM spells ``le``), and its counters grow exactly as specified,
so that expected values can be computed by hand.

Time grid: samples every ``STEP_S`` seconds ending exactly at ``AT``; a window that is a
multiple of the step then holds whole steps, and ``increase`` over it equals
``per-step increment × window / step`` exactly (the counters start well above 0, so the
zero-point cap of extrapolation never applies). A ``Fleet`` may take another step and end
(``step_s``, ``at``), and counters that grow differently every step (``running_total``,
``observed``): the dashboard's seeded story (``dashboard_seed``) and the forecast's days of
history (``history``) are written with it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.utils import floatToGoString

from collector.store import Store
from serving.sim.metrics import build_1_2_5_buckets
from vigil.conventions import (
    VLLM_FINISHED_REASONS,
    VLLM_INTER_TOKEN_LATENCY_BUCKETS,
    VLLM_REQUEST_LATENCY_BUCKETS,
    VLLM_TTFT_BUCKETS,
)
from vigil.model import SeriesKey, labels_of

AT = 1_795_000_000.0  # the evaluation time of every test (Unix seconds)
STEP_S = 15.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OTHER_MODEL = "Qwen/Qwen2.5-7B-Instruct"
#: How many steps of history each counter already has before the first written sample.
HISTORY_STEPS = 100



def le_strings(bounds: Iterable[float]) -> list[str]:
    """A histogram's ``le`` values as vLLM exposes them: prometheus_client's spelling of each
    bound (``"0.001"``, ``"1.0"``, ``"2560.0"``), then ``"+Inf"``."""
    return [floatToGoString(b) for b in bounds] + ["+Inf"]


# vLLM's bucket bounds, from where Vigil defines them (vigil.conventions; the token
# histograms are 1-2-5 up to the model length, as the simulator builds them).
TTFT_LE = le_strings(VLLM_TTFT_BUCKETS)
LATENCY_LE = le_strings(VLLM_REQUEST_LATENCY_BUCKETS)
ITL_LE = le_strings(VLLM_INTER_TOKEN_LATENCY_BUCKETS)
TOKENS_LE = le_strings(float(b) for b in build_1_2_5_buckets(100_000))
FINISHED_REASONS = VLLM_FINISHED_REASONS

Row = tuple[SeriesKey, str, int, float | None]
#: A value per step index (0 = the oldest written sample), or None for a staleness marker.
PerStep = Callable[[int], float | None]


def target_labels(instance: str, pool: str = "chat", kind: str = "vllm") -> dict[str, str]:
    """The labels the collector puts on every series of a target (and on ``up``)."""
    return {"instance": instance, "pool": pool, "kind": kind}


def vllm_labels(instance: str, pool: str = "chat", model: str = MODEL,
                engine: str = "0") -> dict[str, str]:
    """A vLLM series' labels as stored: vLLM's own plus the target labels."""
    return {**target_labels(instance, pool), "engine": engine, "model_name": model}


@dataclass
class Fleet:
    """Writes synthetic series into ``store``, a sample every ``step_s`` over ``span_s``
    ending exactly at ``at`` (call ``flush()`` at the end)."""

    store: Store
    span_s: float = 3900.0  # 65 min: every window up to 1 h is fully covered
    rows: list[Row] = field(default_factory=list)
    step_s: float = STEP_S
    at: float = AT

    @property
    def steps(self) -> int:
        return int(self.span_s // self.step_s) + 1

    def ts_ms(self, i: int) -> int:
        """Timestamp (ms) of step ``i``: the last step is exactly ``at``."""
        return round((self.at - (self.steps - 1 - i) * self.step_s) * 1000)

    def series(self, name: str, labels: dict[str, str], family: str, per_step: PerStep,
               steps: Iterable[int] | None = None) -> None:
        key = SeriesKey(name, labels_of(labels))
        for i in range(self.steps) if steps is None else steps:
            self.rows.append((key, family, self.ts_ms(i), per_step(i)))

    def gauge(self, name: str, labels: dict[str, str],
              value: float | PerStep | Sequence[float | None]) -> None:
        """A gauge: one value throughout, a value per step (a function of the step or a
        sequence of them)."""
        if isinstance(value, Sequence):
            value = value.__getitem__
        per_step = value if callable(value) else (lambda _i, v=float(value): v)
        self.series(name, labels, "gauge", per_step)

    def counter(self, name: str, labels: dict[str, str], per_step: float,
                family: str = "counter") -> None:
        """A counter growing by ``per_step`` each step, with ``HISTORY_STEPS`` of history."""
        self.series(name, labels, family, lambda i: (HISTORY_STEPS + i) * per_step)

    def running_total(self, name: str, labels: dict[str, str], increments: Sequence[float],
                      family: str = "counter", *, start: float = 1000.0,
                      steps: Iterable[int] | None = None) -> None:
        """A counter at ``start`` plus ``increments[0]`` at step 0, growing by
        ``increments[i]`` at step ``i`` (written at ``steps``, every step by default).
        ``start`` stands for the history before the first sample, so that no zero-point
        extrapolation cap applies."""
        totals: list[float] = []
        total = start
        for inc in increments:
            total += inc
            totals.append(total)
        self.series(name, labels, family, totals.__getitem__, steps)

    def up(self, instance: str, pool: str = "chat", value: float | PerStep = 1.0) -> None:
        self.gauge("up", target_labels(instance, pool), value)

    def histogram(self, base: str, labels: dict[str, str], bounds: Sequence[str],
                  per_step: Sequence[float]) -> None:
        """A vLLM histogram whose every step observes the values ``per_step``."""
        for le in bounds:
            bound = float(le)
            n = sum(1 for v in per_step if v <= bound)
            self.counter(base + "_bucket", {**labels, "le": le}, n, "histogram")
        self.counter(base + "_sum", labels, math.fsum(per_step), "histogram")
        self.counter(base + "_count", labels, len(per_step), "histogram")

    def observed(self, base: str, labels: dict[str, str], bounds: Sequence[str],
                 observations: Sequence[Sequence[float]]) -> None:
        """A vLLM histogram whose step ``i`` observes the values ``observations[i]``."""
        for le in bounds:
            bound = float(le)
            self.running_total(base + "_bucket", {**labels, "le": le},
                               [float(sum(1 for v in obs if v <= bound)) for obs in observations],
                               "histogram")
        self.running_total(base + "_sum", labels, [math.fsum(obs) for obs in observations],
                           "histogram")
        self.running_total(base + "_count", labels,
                           [float(len(obs)) for obs in observations], "histogram")

    def requests(self, labels: dict[str, str], per_step: dict[str, float]) -> None:
        """``vllm:request_success_total`` for every finished_reason (absent ones stay 0, as
        vLLM exports all five children from startup)."""
        for reason in FINISHED_REASONS:
            self.counter("vllm:request_success_total", {**labels, "finished_reason": reason},
                         per_step.get(reason, 0.0))

    def flush(self) -> None:
        self.store.write(self.rows)
        self.rows.clear()


def busy_pool(store: Store, pool: str = "chat", model: str = MODEL,
              instances: Sequence[str] = ("chat-0", "chat-1"), span_s: float = 3900.0) -> None:
    """Every series the status reads, for a pool of serving replicas: ``up``, KV-cache usage,
    queue, running requests, finished requests, tokens, and the latency/token histograms."""
    fleet = Fleet(store, span_s=span_s)
    for n, instance in enumerate(instances):
        labels = vllm_labels(instance, pool, model)
        fleet.gauge("up", target_labels(instance, pool), 1.0)
        fleet.gauge("vllm:kv_cache_usage_perc", labels, 0.4 + 0.2 * n)
        fleet.gauge("vllm:num_requests_waiting", labels, 3.0 * n)
        fleet.gauge("vllm:num_requests_running", labels, lambda i: float(i % 4))
        fleet.requests(labels, {"stop": 18, "length": 1, "error": 1})
        fleet.counter("vllm:generation_tokens_total", labels, 3000.0)
        fleet.histogram("vllm:time_to_first_token_seconds", labels, TTFT_LE,
                        [0.05] * 12 + [0.3] * 5 + [0.9] * 3)
        fleet.histogram("vllm:e2e_request_latency_seconds", labels, LATENCY_LE,
                        [2.0] * 15 + [6.0] * 4 + [12.0])
        fleet.histogram("vllm:request_queue_time_seconds", labels, LATENCY_LE, [0.1] * 20)
        fleet.histogram("vllm:inter_token_latency_seconds", labels, ITL_LE, [0.02] * 20)
        fleet.histogram("vllm:request_generation_tokens", labels, TOKENS_LE,
                        [150] * 19 + [900])
        fleet.histogram("vllm:request_prompt_tokens", labels, TOKENS_LE, [400] * 20)
    fleet.flush()


