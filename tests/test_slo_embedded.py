"""``EmbeddedSource``: every ``Source`` method over a real store, against ``slo.promql``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support.fleet import AT, MODEL, STEP_S, TTFT_LE, Fleet, vllm_labels

from collector.store import Store
from slo.promql import histogram_quantile, increase, instant_value, select_range, sum_by
from slo.sources.embedded import EmbeddedSource, avg_aggregate, avg_over_time_value
from slo.sources.protocol import Source
from vigil.model import Point, SeriesKey, labels_of

AT_MS = round(AT * 1000)
BOTH = ("2", "3")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


def _write(store: Store, name: str, labels: dict[str, str], pts: list[tuple[float, float | None]],
           family: str = "counter") -> None:
    """Points given as (seconds before AT, value)."""
    key = SeriesKey(name, labels_of(labels))
    store.write([(key, family, AT_MS - round(ago * 1000), v) for ago, v in pts])


def _irregular(store: Store) -> None:
    """Three replicas of a counter: jittered scrapes, a reset, a stale marker, a late start."""
    _write(store, "vllm:generation_tokens_total", vllm_labels("chat-0"),
           [(400, 10.0), (290, 25.0), (276, 31.0), (200, 4.0), (185, 9.5), (100, None),
            (60, 30.0), (0, 41.0)])
    _write(store, "vllm:generation_tokens_total", vllm_labels("chat-1"),
           [(300, 1000.0), (287, 1012.0), (150, 1100.5), (14, 1180.0)])
    _write(store, "vllm:generation_tokens_total", vllm_labels("chat-2", pool="embed"),
           [(40, 3.0), (25, 7.0), (10, 9.0)])


def test_embedded_source_implements_the_protocol(store: Store) -> None:
    assert isinstance(EmbeddedSource(store), Source)


@pytest.mark.parametrize("sem", BOTH)
@pytest.mark.parametrize("window", [60.0, 300.0, 290.0, 3600.0])
def test_increase_equals_promql_increase_per_series_summed(
    store: Store, sem: str, window: float
) -> None:
    _irregular(store)
    per_series = {}
    for key, pts in store.points("vllm:generation_tokens_total").items():
        v = increase([p.ts_ms for p in pts], [p.value for p in pts], AT, window, sem)
        if v is not None:
            per_series[key.labels] = v
    src = EmbeddedSource(store, semantics=sem)
    assert src.increase("vllm:generation_tokens_total", {}, AT, window) == sum_by(
        per_series, (), sem
    )
    assert src.increase("vllm:generation_tokens_total", {}, AT, window, by=("pool",)) == sum_by(
        per_series, ("pool",), sem
    )


def test_increase_filters_by_matchers_and_leaves_out_series_without_two_samples(
    store: Store,
) -> None:
    _irregular(store)
    src = EmbeddedSource(store)
    assert src.increase("vllm:generation_tokens_total", {"pool": "nope"}, AT, 300) == {}
    # In the last 90 s chat-0 has two samples, chat-2 three, chat-1 only one.
    got = src.increase("vllm:generation_tokens_total", {}, AT, 90, by=("instance",))
    assert set(got) == {(("instance", "chat-0"),), (("instance", "chat-2"),)}


def test_reads_only_the_window_from_the_store(store: Store, monkeypatch) -> None:
    _irregular(store)
    calls = []
    real = store.points

    def spy(name, matchers=None, start_ms=None, end_ms=None):
        calls.append((start_ms, end_ms))
        return real(name, matchers, start_ms, end_ms)

    monkeypatch.setattr(store, "points", spy)
    EmbeddedSource(store).increase("vllm:generation_tokens_total", {}, AT, 300)
    assert calls == [(AT_MS - 300_000, AT_MS)]


def test_bucket_increase_groups_series_by_le_and_by_labels(store: Store) -> None:
    fleet = Fleet(store, span_s=600)
    obs = [0.03, 0.2, 0.6, 0.9]
    fleet.histogram("vllm:time_to_first_token_seconds", vllm_labels("chat-0"), TTFT_LE, obs)
    fleet.histogram("vllm:time_to_first_token_seconds", vllm_labels("chat-1"), TTFT_LE, obs[:2])
    fleet.flush()
    src = EmbeddedSource(store)
    steps = 300 / STEP_S
    (buckets,) = src.bucket_increase("vllm:time_to_first_token_seconds", {}, AT, 300).values()
    as_dict = dict(buckets)
    assert len(as_dict) == len(TTFT_LE)
    assert as_dict[math.inf] == 6 * steps
    assert as_dict[0.25] == 4 * steps
    assert as_dict[0.75] == 5 * steps
    per_instance = src.bucket_increase(
        "vllm:time_to_first_token_seconds", {}, AT, 300, by=("instance",)
    )
    assert dict(per_instance[(("instance", "chat-1"),)])[math.inf] == 2 * steps
    # The quantile PromQL would give for sum by (le) (increase(...)):
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.15 * (3 - 2) / 2)


def test_bucket_increase_skips_a_malformed_le_like_promql(store: Store) -> None:
    _write(store, "x_bucket", {"le": "1_0"}, [(30, 1.0), (0, 5.0)], "histogram")
    _write(store, "x_bucket", {"le": "+Inf"}, [(30, 1.0), (0, 5.0)], "histogram")
    (buckets,) = EmbeddedSource(store).bucket_increase("x", {}, AT, 60).values()
    assert [le for le, _ in buckets] == [math.inf]


def test_bucket_increase_refuses_le_in_by(store: Store) -> None:
    with pytest.raises(ValueError, match="'le'"):
        EmbeddedSource(store).bucket_increase("x", {}, AT, 60, by=("le",))


def test_instant_takes_the_latest_sample_within_the_lookback(store: Store) -> None:
    _write(store, "vllm:num_requests_waiting", vllm_labels("chat-0"),
           [(500, 1.0), (200, 3.0)], "gauge")
    _write(store, "vllm:num_requests_waiting", vllm_labels("chat-1"),
           [(330, 7.0)], "gauge")  # older than the 5-minute lookback
    got = EmbeddedSource(store).instant("vllm:num_requests_waiting", {}, AT)
    assert list(got.values()) == [3.0]


def test_instant_series_ends_at_a_staleness_marker(store: Store) -> None:
    _write(store, "vllm:num_requests_waiting", vllm_labels("chat-0"),
           [(60, 3.0), (30, None)], "gauge")
    assert EmbeddedSource(store).instant("vllm:num_requests_waiting", {}, AT) == {}


@pytest.mark.parametrize("sem", BOTH)
def test_instant_lookback_edge_follows_the_semantics(store: Store, sem: str) -> None:
    _write(store, "g", {"a": "1"}, [(60, 2.0)], "gauge")
    got = EmbeddedSource(store, semantics=sem, lookback_s=60).instant("g", {}, AT)
    expected = instant_value([AT_MS - 60_000], [2.0], AT, 60, sem)
    assert got == ({} if expected is None else {(("a", "1"),): expected})
    assert bool(got) == (sem == "2")


@pytest.mark.parametrize("sem", BOTH)
def test_avg_over_time_uses_select_range_edges_and_skips_stale_markers(
    store: Store, sem: str
) -> None:
    pts = [(300, 0.0), (285, 1.0), (150, None), (135, 1.0), (0, 1.0)]
    _write(store, "up", {"instance": "chat-0"}, pts, "gauge")
    got = EmbeddedSource(store, semantics=sem).avg_over_time("up", {}, AT, 300)
    window = select_range([AT_MS - round(a * 1000) for a, _ in pts], [v for _, v in pts],
                          AT, 300, sem)
    assert got == {(("instance", "chat-0"),): float(window.values.mean())}
    # v2 sees the 0 on the left edge (mean 3/4), v3 does not (mean 1).
    assert got[(("instance", "chat-0"),)] == (0.75 if sem == "2" else 1.0)


def test_avg_over_time_leaves_out_a_series_with_no_sample_in_the_window(store: Store) -> None:
    _write(store, "up", {"instance": "old"}, [(900, 1.0)], "gauge")
    assert EmbeddedSource(store).avg_over_time("up", {}, AT, 300) == {}


def test_samples_drop_stale_markers_and_keep_the_window(store: Store) -> None:
    _write(store, "vllm:num_requests_running", {"instance": "chat-0"},
           [(400, 9.0), (200, 0.0), (100, None), (0, 4.0)], "gauge")
    got = EmbeddedSource(store).samples("vllm:num_requests_running", {}, AT, 300)
    assert got == {(("instance", "chat-0"),): [Point(AT_MS - 200_000, 0.0), Point(AT_MS, 4.0)]}


def test_mean_of_one_window_v2_and_v3() -> None:
    for sem in BOTH:
        assert avg_over_time_value([1.0, 0.0, 1.0], sem) == pytest.approx(2 / 3, rel=1e-15)
        assert avg_over_time_value([], sem) is None
        assert avg_over_time_value([math.inf, 1.0], sem) == math.inf


def test_v3_mean_is_sum_over_count_and_v2_is_incremental() -> None:
    values = [0.1] * 10
    assert avg_over_time_value(values, "3") == math.fsum(values) / 10
    mean = c = 0.0
    for n, v in enumerate(values, start=1):  # 2.42 functions.go:449-479, step by step
        step = v / n - mean / n
        t = mean + step
        c += (mean - t) + step if abs(mean) >= abs(step) else (step - t) + mean
        mean = t
    assert avg_over_time_value(values, "2") == mean + c


def test_avg_aggregate_is_promql_avg_over_series() -> None:
    vec = {(("instance", "b"),): 0.5, (("instance", "a"),): 1.0, (("instance", "c"),): 0.0}
    for sem in BOTH:
        assert avg_aggregate(vec, sem) == pytest.approx(0.5, rel=1e-15)
        assert avg_aggregate({}, sem) is None


def test_lookback_must_be_positive(store: Store) -> None:
    with pytest.raises(ValueError, match="lookback"):
        EmbeddedSource(store, lookback_s=0)


def test_model_label_matcher_selects_one_model(store: Store) -> None:
    fleet = Fleet(store, span_s=120)
    fleet.counter("vllm:generation_tokens_total", vllm_labels("chat-0"), 1.0)
    fleet.counter("vllm:generation_tokens_total", vllm_labels("chat-0", model="other"), 5.0)
    fleet.flush()
    got = EmbeddedSource(store).increase(
        "vllm:generation_tokens_total", {"model_name": MODEL}, AT, 60
    )
    assert got == {(): 4.0}
