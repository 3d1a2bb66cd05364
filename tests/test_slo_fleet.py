"""Synthetic vLLM fleet data for the SLO engine's tests, written to a real ``Store``.

The other ``test_slo_*`` modules import ``Fleet`` from here; the tests below check that what it
writes looks like what the collector stores from a real vLLM (names, labels, cumulative
buckets spelled as vLLM spells ``le``) and that its counters grow exactly as specified, so that
expected values in the other tests can be computed by hand.

Time grid: samples every ``STEP_S`` seconds ending exactly at ``AT``; a window that is a
multiple of the step then holds whole steps, and ``increase`` over it equals
``per-step increment × window / step`` exactly (the counters start well above 0, so the
zero-point cap of extrapolation never applies).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from collector.store import Store
from slo.sources.embedded import EmbeddedSource
from vigil.model import Point, SeriesKey, labels_of

AT = 1_795_000_000.0  # the evaluation time of every test (Unix seconds)
STEP_S = 15.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OTHER_MODEL = "Qwen/Qwen2.5-7B-Instruct"
#: How many steps of history each counter already has before the first written sample.
HISTORY_STEPS = 100

# Bucket bounds as vLLM 0.33 exposes them (prometheus_client's float formatting).
TTFT_LE = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5",
           "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0",
           "640.0", "2560.0", "+Inf"]
LATENCY_LE = ["0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0",
              "30.0", "40.0", "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0",
              "7680.0", "+Inf"]
ITL_LE = ["0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.75",
          "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "+Inf"]
TOKENS_LE = ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0",
             "2000.0", "5000.0", "10000.0", "20000.0", "50000.0", "100000.0", "+Inf"]
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

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
    """Writes synthetic series ending at ``AT`` into ``store`` (call ``flush()`` at the end)."""

    store: Store
    span_s: float = 3900.0  # 65 min: every window up to 1 h is fully covered
    rows: list[Row] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return int(self.span_s // STEP_S) + 1

    def ts_ms(self, i: int) -> int:
        """Timestamp (ms) of step ``i``: the last step is exactly ``AT``."""
        return round((AT - (self.steps - 1 - i) * STEP_S) * 1000)

    def series(self, name: str, labels: dict[str, str], family: str, per_step: PerStep,
               steps: Iterable[int] | None = None) -> None:
        key = SeriesKey(name, labels_of(labels))
        for i in range(self.steps) if steps is None else steps:
            self.rows.append((key, family, self.ts_ms(i), per_step(i)))

    def gauge(self, name: str, labels: dict[str, str], value: float | PerStep) -> None:
        per_step = value if callable(value) else (lambda _i, v=float(value): v)
        self.series(name, labels, "gauge", per_step)

    def counter(self, name: str, labels: dict[str, str], per_step: float,
                family: str = "counter") -> None:
        """A counter growing by ``per_step`` each step, with ``HISTORY_STEPS`` of history."""
        self.series(name, labels, family, lambda i: (HISTORY_STEPS + i) * per_step)

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


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


# --- the builder writes what the collector would ----------------------------------------------


def test_histogram_buckets_are_cumulative_with_vllm_le_spelling(store: Store) -> None:
    fleet = Fleet(store, span_s=60)
    fleet.histogram("vllm:time_to_first_token_seconds", vllm_labels("chat-0"), TTFT_LE,
                    [0.3, 0.6, 0.9])
    fleet.flush()
    last = store.last_points("vllm:time_to_first_token_seconds_bucket")
    by_le = {k.label("le"): p.value for k, p in last.items()}
    step_counts = {"0.25": 0, "0.5": 1, "0.75": 2, "1.0": 3, "+Inf": 3}
    n = HISTORY_STEPS + fleet.steps - 1
    for le, c in step_counts.items():
        assert by_le[le] == n * c
    assert sorted(by_le) == sorted(TTFT_LE)


def test_every_vllm_series_carries_target_and_vllm_labels(store: Store) -> None:
    fleet = Fleet(store, span_s=30)
    fleet.requests(vllm_labels("chat-0"), {"stop": 1})
    fleet.up("chat-0")
    fleet.flush()
    (key, _), *_ = store.series("vllm:request_success_total")
    assert {"instance", "pool", "kind", "engine", "model_name", "finished_reason"} == set(
        key.as_dict()
    )
    assert store.series("up")[0][0].as_dict() == target_labels("chat-0")


def test_increase_over_whole_steps_is_exactly_rate_times_window(store: Store) -> None:
    fleet = Fleet(store)
    fleet.counter("vllm:generation_tokens_total", vllm_labels("chat-0"), 30.0)
    fleet.flush()
    for sem in ("2", "3"):
        src = EmbeddedSource(store, semantics=sem)
        for window in (300.0, 1800.0, 3600.0):
            got = src.increase("vllm:generation_tokens_total", {}, AT, window)
            assert got == {(): 30.0 * window / STEP_S}


def test_busy_pool_writes_every_series_the_status_reads(store: Store) -> None:
    busy_pool(store, instances=("chat-0",), span_s=60)
    names = set(store.metric_names())
    assert {"up", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
            "vllm:num_requests_running", "vllm:request_success_total",
            "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
            "vllm:e2e_request_latency_seconds_count", "vllm:request_prompt_tokens_sum"} <= names


def test_last_sample_is_at_the_evaluation_time(store: Store) -> None:
    fleet = Fleet(store, span_s=45)
    fleet.gauge("vllm:num_requests_waiting", vllm_labels("chat-0"), 2.0)
    fleet.flush()
    (pts,) = store.points("vllm:num_requests_waiting").values()
    assert pts[-1] == Point(round(AT * 1000), 2.0)
    assert len(pts) == 4
