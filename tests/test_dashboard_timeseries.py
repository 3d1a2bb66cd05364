"""``dashboard.timeseries``: the chart grid, and every point function against the SLO engine —
at the evaluation time and the same window, a chart's last point is the status JSON's value."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.dashboard_seed import AT, STEP_S, seed_dashboard
from support.fleet import MODEL

from collector.store import Store
from dashboard import timeseries as ts
from slo.objectives.quantiles import histogram_figures, model_quantiles
from slo.objectives.sli import error_ratio
from slo.objectives.spec import effective_slos
from slo.sources.embedded import EmbeddedSource
from slo.status import evaluate
from vigil.config import Config, load_config
from vigil.conventions import (
    DCGM_SM_ACTIVE,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_ITERATION_TOKENS,
    VLLM_PREEMPTIONS,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
    VLLM_QUEUE_TIME,
    VLLM_SPEC_ACCEPTED_TOKENS,
    VLLM_SPEC_DRAFT_TOKENS,
    VLLM_TTFT,
)
from vigil.model import SeriesKey, labels_of


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Config, EmbeddedSource]]:
    path = seed_dashboard(tmp_path_factory.mktemp("ts"))
    with Store(path.parent / "vigil.db", readonly=True) as store:
        yield load_config(path), EmbeddedSource(store)


@pytest.fixture(scope="module")
def status(seeded: tuple[Config, EmbeddedSource]) -> dict[str, Any]:
    config, source = seeded
    return evaluate(config, source, AT)


# --- the grid -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("range_s", "min_step", "step"), [
    (900, 15, 15), (3600, 15, 60), (6 * 3600, 15, 300), (86400, 15, 900),
    (7 * 86400, 15, 7200), (30 * 86400, 15, 43200), (3600, 30, 60), (900, 60, 60)])
def test_chart_step_is_round_and_bounds_the_points(range_s: float, min_step: float,
                                                   step: float) -> None:
    got = ts.chart_step(range_s, min_step_s=min_step)
    assert got == step
    assert range_s / got <= ts.MAX_POINTS - 1


def test_chart_step_beyond_the_coarsest_round_step_divides_evenly() -> None:
    assert ts.chart_step(400 * 86400) == pytest.approx(400 * 86400 / (ts.MAX_POINTS - 1))


@pytest.mark.parametrize("bad", [0.0, -5.0, math.inf, math.nan])
def test_chart_step_refuses_a_range_that_is_not_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        ts.chart_step(bad)


def test_chart_times_are_step_multiples_then_the_end() -> None:
    times = ts.chart_times(1000.0 + 37, 300.0, 60.0)
    assert times == [780.0, 840.0, 900.0, 960.0, 1020.0, 1037.0]


def test_chart_times_keep_their_grid_when_the_end_moves() -> None:
    """A refresh moves the end; every grid point but the newest is the same (cache hits)."""
    before = ts.chart_times(10_000.0, 3600.0, 60.0)
    after = ts.chart_times(10_015.0, 3600.0, 60.0)
    assert set(before[1:-1]) <= set(after)
    assert after[-1] == 10_015.0


def test_chart_times_on_a_step_boundary_end_with_it_once() -> None:
    assert ts.chart_times(600.0, 120.0, 60.0) == [480.0, 540.0, 600.0]


# --- points equal the status at the same instant and window -------------------------------------
def test_quantile_point_is_model_quantiles(seeded: tuple[Config, EmbeddedSource]) -> None:
    _, source = seeded
    for window in (300.0, 3600.0):
        expected = model_quantiles(source, "chat", AT, window)
        for key, metric in (("ttft_seconds", VLLM_TTFT), ("e2e_seconds", VLLM_E2E),
                            ("queue_seconds", VLLM_QUEUE_TIME)):
            got = ts.quantile_point(source, "chat", AT, window, metric)
            assert got[MODEL] == histogram_figures(expected[MODEL]["quantiles"][key])
        tokens = ts.quantile_point(source, "chat", AT, window, VLLM_GENERATION_TOKENS_HIST,
                                   (0.95,))
        assert tokens[MODEL]["p95"] == expected[MODEL]["tokens_per_request"]["generated"]["p95"]
        mean = ts.mean_point(source, "chat", AT, window, VLLM_GENERATION_TOKENS_HIST)
        assert mean[MODEL] == expected[MODEL]["tokens_per_request"]["generated"]["mean"]


def test_quantile_point_of_the_status_window(seeded: tuple[Config, EmbeddedSource],
                                             status: dict[str, Any]) -> None:
    _, source = seeded
    got = ts.quantile_point(source, "chat", AT, 300.0, VLLM_TTFT)
    assert got[MODEL] == histogram_figures(
        status["pools"]["chat"]["models"][MODEL]["quantiles"]["ttft_seconds"])


def test_finished_point_error_share_is_the_error_rate_sli(
        seeded: tuple[Config, EmbeddedSource]) -> None:
    config, source = seeded
    spec = next(s for s in effective_slos(config) if s.name == "chat-error-rate")
    by_reason = ts.finished_point(source, "chat", AT, 3600.0, MODEL)
    assert set(by_reason) == {"stop", "length", "abort", "error", "repetition"}
    share = by_reason["error"] / sum(by_reason.values())
    assert share == pytest.approx(error_ratio(spec, source, AT, 3600.0).error_ratio, rel=1e-12)
    assert by_reason["error"] > 0 and by_reason["abort"] > 0


def test_burn_point_is_the_status_window(seeded: tuple[Config, EmbeddedSource],
                                         status: dict[str, Any]) -> None:
    config, source = seeded
    specs = {s.name: s for s in effective_slos(config)}
    # The default SLOs of both seeded pools, so that the loop below checks each of them.
    assert sorted(slo["name"] for slo in status["slos"]) == sorted(
        f"{pool}-{indicator}" for pool in ("chat", "batch")
        for indicator in ("ttft", "e2e", "error-rate", "availability"))
    for slo in status["slos"]:
        for window, seconds in (("5m", 300.0), ("1h", 3600.0), ("3d", 3 * 86400.0)):
            got = ts.burn_point(specs[slo["name"]], source, AT, seconds)
            assert got == slo["windows"][window], (slo["name"], window)


def test_kv_point_is_the_status_kv_and_lists_replicas(seeded: tuple[Config, EmbeddedSource],
                                                      status: dict[str, Any]) -> None:
    config, source = seeded
    got = ts.kv_point(source, config.pool("chat"), AT)
    kv = status["pools"]["chat"]["kv_cache_usage"]
    assert got["mean"] == pytest.approx(kv["avg"], rel=1e-12)
    assert got["max"] == pytest.approx(kv["max"], rel=1e-12)
    assert set(got["replicas"]) == {"chat-0", "chat-1"}
    assert max(got["replicas"].values()) == pytest.approx(kv["max"], rel=1e-12)


def test_queue_point_is_the_status_queue(seeded: tuple[Config, EmbeddedSource],
                                         status: dict[str, Any]) -> None:
    config, source = seeded
    assert ts.queue_point(source, config.pool("chat"), AT) == status["pools"]["chat"][
        "queue_length"]


def test_cost_point_is_the_status_cost(seeded: tuple[Config, EmbeddedSource],
                                       status: dict[str, Any]) -> None:
    config, source = seeded
    for pool in ("chat", "batch"):
        got = ts.cost_point(source, config, config.pool(pool), AT, config.engine.cost_window)
        assert got == status["pools"][pool]["cost"]


def test_sm_point_prefers_sm_active_and_falls_back_to_gpu_util(tmp_path: Path) -> None:
    with Store(tmp_path / "vigil.db") as store:
        ts_ms = round(AT * 1000)
        gpu = {"pool": "p", "kind": "dcgm", "gpu": "0"}
        store.write([
            (SeriesKey(DCGM_SM_ACTIVE, labels_of({**gpu, "instance": "a-gpu"})), "gauge",
             ts_ms, 0.42),
            (SeriesKey("DCGM_FI_DEV_GPU_UTIL", labels_of({**gpu, "instance": "a-gpu"})),
             "gauge", ts_ms, 90.0),
            (SeriesKey("DCGM_FI_DEV_GPU_UTIL", labels_of({**gpu, "instance": "b-gpu"})),
             "gauge", ts_ms, 55.0),
        ])
        got = ts.sm_point(EmbeddedSource(store), "p", AT)
    assert got == {"a-gpu gpu 0": 0.42, "b-gpu gpu 0": pytest.approx(0.55)}


def test_counter_ratios_and_rates(seeded: tuple[Config, EmbeddedSource]) -> None:
    _, source = seeded
    hit = ts.counter_ratio_point(source, "chat", AT, 3600.0, VLLM_PREFIX_CACHE_HITS,
                                 VLLM_PREFIX_CACHE_QUERIES)
    assert hit == pytest.approx(180 / 400)
    accept = ts.counter_ratio_point(source, "chat", AT, 3600.0, VLLM_SPEC_ACCEPTED_TOKENS,
                                    VLLM_SPEC_DRAFT_TOKENS)
    assert accept == pytest.approx(210 / 300)
    # The batch pool has no speculative decoding: no ratio, not 0.
    assert ts.counter_ratio_point(source, "batch", AT, 3600.0, VLLM_SPEC_ACCEPTED_TOKENS,
                                  VLLM_SPEC_DRAFT_TOKENS) is None
    rate = ts.counter_rate_point(source, "chat", AT, 3600.0, VLLM_PREEMPTIONS)
    assert rate is not None and rate > 0
    assert ts.counter_rate_point(source, "chat", AT, 3600.0, "vllm:no_such_total") is None


def test_iteration_distribution_is_per_bucket_and_sums_to_one(
        seeded: tuple[Config, EmbeddedSource]) -> None:
    _, source = seeded
    rows = ts.histogram_distribution(source, "chat", AT, 3600.0, VLLM_ITERATION_TOKENS)
    assert [r["upper"] for r in rows][-1] == math.inf
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    by_upper = {r["upper"]: r for r in rows}
    # Per step: 20 steps of 16 tokens, one per request of 128, 3 of 600.
    assert by_upper[16.0]["lower"] == 8.0 and by_upper[16.0]["count"] > 0
    assert by_upper[1024.0]["count"] == pytest.approx(3 / 20 * by_upper[16.0]["count"])
    assert by_upper[32.0]["count"] == 0


def test_points_without_data_are_none_not_zero(tmp_path: Path) -> None:
    config = load_config(seed_dashboard(tmp_path, store=False))
    with Store(tmp_path / "vigil.db") as store:
        source = EmbeddedSource(store)
        pool = config.pool("chat")
        assert ts.quantile_point(source, "chat", AT, 300.0, VLLM_TTFT) == {}
        assert ts.kv_point(source, pool, AT) == {"mean": None, "max": None, "replicas": {}}
        assert ts.queue_point(source, pool, AT) is None
        assert ts.cost_point(source, config, pool, AT, 3600.0)["per_1000_requests"] is None
        assert ts.histogram_distribution(source, "chat", AT, 3600.0) == []
        assert ts.sm_point(source, "chat", AT) == {}


def test_seed_step_is_the_configured_scrape_interval(
        seeded: tuple[Config, EmbeddedSource]) -> None:
    config, _ = seeded
    assert config.collector.scrape_interval == STEP_S


# --- a young store: the range fitted to its data --------------------------------------------------
@pytest.mark.parametrize("range_s", [900.0, 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0,
                                     30 * 86400.0, 2400.0, 14_400.0, 5 * 3600.0])
def test_chart_step_gives_a_line_enough_points(range_s: float) -> None:
    step = ts.chart_step(range_s, min_step_s=15.0)
    assert ts.MIN_POINTS <= len(ts.chart_times(AT, range_s, step)) <= ts.MAX_POINTS


def test_round_steps_at_most_double() -> None:
    assert all(b <= 2 * a for a, b in zip(ts.STEPS, ts.STEPS[1:], strict=False))


def test_chart_step_of_minutes_of_data_is_the_scrape_interval() -> None:
    assert ts.chart_step(360.0, min_step_s=30.0) == 30.0
    assert len(ts.chart_times(AT, 360.0, 30.0)) == 13


def _young_store(path: Path, first_s: float, last_s: float, step_s: float = 15.0) -> None:
    """``up`` of two targets from ``first_s`` to ``last_s`` (Unix seconds)."""
    with Store(path) as store:
        n = int((last_s - first_s) // step_s) + 1
        store.write([(SeriesKey("up", labels_of({"instance": i, "pool": "chat"})), "gauge",
                      round((first_s + k * step_s) * 1000), 1.0)
                     for i in ("a", "b") for k in range(n)])


class _Generic:
    """The ``Source`` protocol without the embedded store behind it (as Prometheus answers)."""

    def __init__(self, inner: EmbeddedSource):
        self.inner = inner
        self.semantics = inner.semantics

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("generic", [False, True], ids=["embedded", "generic"])
def test_first_sample_of_a_young_store(tmp_path: Path, generic: bool) -> None:
    _young_store(tmp_path / "vigil.db", AT - 360.0, AT)
    with Store(tmp_path / "vigil.db", readonly=True) as store:
        source: Any = EmbeddedSource(store)
        source = _Generic(source) if generic else source
        assert ts.first_sample(source, AT, 6 * 3600.0) == AT - 360.0
        # Pinned before the data: nothing to fit.
        assert ts.first_sample(source, AT - 3600.0, 6 * 3600.0) is None
        # Data older than the range asked about.
        assert ts.first_sample(source, AT, 300.0) is None


def test_first_sample_beyond_the_lookback_of_an_old_store(tmp_path: Path) -> None:
    # A gap of an hour across the range's start: the embedded store still sees the older data.
    _young_store(tmp_path / "vigil.db", AT - 8 * 3600.0, AT - 7 * 3600.0)
    with Store(tmp_path / "vigil.db") as store:
        store.write([(SeriesKey("up", labels_of({"instance": "a", "pool": "chat"})), "gauge",
                      round((AT - 600.0 + k * 15) * 1000), 1.0) for k in range(41)])
    with Store(tmp_path / "vigil.db", readonly=True) as store:
        assert ts.first_sample(EmbeddedSource(store), AT, 6 * 3600.0) is None


def test_first_sample_of_an_old_or_empty_store(seeded: tuple[Config, EmbeddedSource],
                                               tmp_path: Path) -> None:
    _, source = seeded
    assert ts.first_sample(source, AT, 6 * 3600.0) is None
    Store(tmp_path / "empty.db").close()
    with Store(tmp_path / "empty.db", readonly=True) as store:
        assert ts.first_sample(EmbeddedSource(store), AT, 6 * 3600.0) is None
