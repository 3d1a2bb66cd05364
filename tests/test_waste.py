"""The lower bound ceil(λ/μ) and the waste above it, on a synthetic traffic curve.

An hour of a 2-GPU pool in four 15-minute steps, scraped every 15 s: idle, then 3 rps on one
replica, then 8 rps on two, then 1.2 rps on one while the other idles and goes down for the
last 5 minutes. Every figure below is computed by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from collector.store import Store
from slo.cost.waste import lower_bound_replicas, step_times, waste
from slo.sources.embedded import EmbeddedSource
from vigil.config import parse_config
from vigil.model import SeriesKey

START = 1_795_000_000.0  # Unix seconds, on a 15 s boundary
STEP = 900.0
SCRAPE = 15.0
MU = 4.0  # requests per second one replica serves at the SLO
CONFIG = parse_config({
    "pools": [{"name": "chat", "model": "llama", "gpu": "H100", "gpus_per_replica": 2},
              {"name": "batch", "model": "llama", "gpu": "H100"}],
    "prices": {"H100": 2.0},
})
POOL = CONFIG.pools[0]
#: Per step, per replica: requests per second (None: not serving, no vLLM series).
TRAFFIC: dict[str, list[float | None]] = {
    "r0": [0.0, 3.0, 4.0, 1.2],
    "r1": [None, None, 4.0, 0.0],
}


def _key(name: str, instance: str, pool: str = "chat", **extra: str) -> SeriesKey:
    labels = {"instance": instance, "pool": pool, "kind": "vllm", **extra}
    return SeriesKey(name, tuple(sorted(labels.items())))


def _write(store: Store, instance: str, rates: list[float | None], *, pool: str = "chat",
           down_after: float | None = None, counter: bool = True) -> None:
    """Scrapes at START + 15 s, ..., START + 3600 s: ``up`` 1 where ``rates`` is not None (until
    ``down_after``), 0 after it; the success counter grows by rate × 15 per scrape from a
    large base (no zero-point cap in ``increase``)."""
    rows: list[tuple[SeriesKey, str, int, float | None]] = []
    value = 10_000.0
    for i in range(1, int(4 * STEP / SCRAPE) + 1):
        t = START + i * SCRAPE
        rate = rates[min(3, int((i - 1) * SCRAPE // STEP))]
        if rate is None:
            continue
        up = down_after is None or t <= down_after
        rows.append((_key("up", instance, pool), "gauge", round(t * 1000), 1.0 if up else 0.0))
        if up and counter:
            value += rate * SCRAPE
            rows.append((_key("vllm:request_success_total", instance, pool,
                              finished_reason="stop", model_name="llama"),
                         "counter", round(t * 1000), value))
    store.write(rows)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


def _fleet(store: Store) -> None:
    _write(store, "r0", TRAFFIC["r0"])
    _write(store, "r1", TRAFFIC["r1"], down_after=START + 4 * STEP - 300)
    # Another pool's replica, hot all hour: none of it may count.
    _write(store, "b0", [50.0] * 4, pool="batch")


def test_lower_bound_equals_the_hand_computation(store: Store) -> None:
    _fleet(store)
    result = waste(EmbeddedSource(store), CONFIG, POOL, MU, START, START + 4 * STEP, STEP)
    assert [s.t_s for s in result.steps] == [START + k * STEP for k in (1, 2, 3, 4)]
    assert [s.rps for s in result.steps] == pytest.approx([0.0, 3.0, 8.0, 1.2])
    # ceil(0/4), ceil(3/4), ceil(8/4) (exactly 2, float noise or not), ceil(1.2/4)
    assert [s.lower_bound_replicas for s in result.steps] == [0, 1, 2, 1]
    # replicas × 0.25 h × 2 GPUs
    assert [s.lower_bound_gpu_hours for s in result.steps] == [0.0, 0.5, 1.0, 0.5]
    assert result.lower_bound_gpu_hours == 2.0
    # r0 all hour; r1 the third step and 10 of the fourth step's 15 minutes
    assert [s.used_gpu_hours for s in result.steps] == pytest.approx([0.5, 0.5, 1.0, 0.5 + 1 / 3])
    assert result.used_gpu_hours == pytest.approx(2.5 + 1 / 3)
    assert result.waste_gpu_hours == pytest.approx(0.5 + 1 / 3)
    assert result.waste_usd == pytest.approx((0.5 + 1 / 3) * 2.0)
    assert result.unmeasured_gpu_hours == 0.0
    assert result.ratio == pytest.approx((2.5 + 1 / 3) / 2.0)


def test_a_pool_running_hotter_than_its_capacity_has_negative_waste(store: Store) -> None:
    _fleet(store)
    result = waste(EmbeddedSource(store), CONFIG, POOL, 1.0, START, START + 4 * STEP, STEP)
    # ceil(0), ceil(3), ceil(8), ceil(1.2) replicas: 14 × 0.5 GPU-hours
    assert [s.lower_bound_replicas for s in result.steps] == [0, 3, 8, 2]
    assert result.lower_bound_gpu_hours == 6.5
    assert result.waste_gpu_hours == pytest.approx(2.5 + 1 / 3 - 6.5)


def test_billed_replicas_without_a_request_counter_are_unmeasured(store: Store) -> None:
    _write(store, "r0", [1.0] * 4, counter=False)
    result = waste(EmbeddedSource(store), CONFIG, POOL, MU, START, START + 2 * STEP, STEP)
    assert [s.rps for s in result.steps] == [None, None]
    assert [s.lower_bound_replicas for s in result.steps] == [None, None]
    assert result.used_gpu_hours == pytest.approx(1.0)
    assert result.unmeasured_gpu_hours == pytest.approx(1.0)
    assert result.waste_gpu_hours == pytest.approx(0.0)
    assert result.ratio is None


def test_no_data_at_all_is_no_traffic_and_no_cost(store: Store) -> None:
    result = waste(EmbeddedSource(store), CONFIG, POOL, MU, START, START + STEP, STEP)
    (step,) = result.steps
    assert (step.rps, step.used_gpu_hours, step.lower_bound_replicas) == (0.0, 0.0, 0)
    assert result.waste_usd == 0.0


def test_step_times_are_the_whole_steps_ends() -> None:
    assert step_times(0.0, 86_400.0, 900.0)[-1] == 86_400.0
    assert len(step_times(0.0, 86_400.0, 900.0)) == 96
    assert step_times(0.0, 1000.0, 900.0) == [900.0]
    assert step_times(0.0, 899.0, 900.0) == []


@pytest.mark.parametrize("call", [
    lambda: lower_bound_replicas(1.0, 0.0),
    lambda: lower_bound_replicas(-1.0, 1.0),
    lambda: lower_bound_replicas(float("nan"), 1.0),
    lambda: step_times(0.0, 10.0, 0.0),
])
def test_argument_errors(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        call()


def test_the_ceiling_ignores_float_noise_but_not_a_real_excess() -> None:
    assert lower_bound_replicas(0.1 * 3, 0.1) == 3  # 0.30000000000000004 / 0.1
    assert lower_bound_replicas(3.0001, 1.0) == 4
    assert lower_bound_replicas(0.0, 2.0) == 0
