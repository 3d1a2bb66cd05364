"""``OnGrid``: at every grid instant, exactly the wrapped source's instant answers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from support.fleet import AT, vllm_labels

from collector.store import Store
from slo.promql.tracks import Grid
from slo.sources.embedded import EmbeddedSource
from slo.sources.on_grid import OnGrid, grid_of, on_grid
from vigil.model import SeriesKey, labels_of

AT_MS = round(AT * 1000)
STEP_S = 15.0
SPAN_S = 3 * 3600.0


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """Three hours of jittered 15 s scrapes of three replicas: counters with resets and
    staleness markers, histogram buckets, ``up`` with a down stretch, a fractional gauge."""
    s = Store(tmp_path / "vigil.db")
    rng = random.Random(7)
    rows = []
    for r in range(3):
        labels = vllm_labels(f"chat-{r}")
        counter = 1000.0 * r
        buckets = [0.0, 0.0, 0.0]
        t = AT - SPAN_S
        while t <= AT:
            ms = round((t + rng.uniform(-2.0, 2.0)) * 1000)
            if rng.random() < 0.01:
                counter = 0.0  # a restart
            counter += rng.uniform(0.0, 40.0)
            stale = rng.random() < 0.02
            rows.append((SeriesKey("vllm:generation_tokens_total", labels_of(labels)),
                         "counter", ms, None if stale else counter))
            for i, le in enumerate(("0.1", "1.0", "+Inf")):
                buckets[i] = (buckets[i - 1] if i else 0.0) + rng.uniform(0.0, 5.0) + buckets[i]
                rows.append((SeriesKey("vllm:time_to_first_token_seconds_bucket",
                                       labels_of({**labels, "le": le})),
                             "histogram", ms, buckets[i]))
            down = r == 1 and AT - 5400 < t < AT - 4800
            rows.append((SeriesKey("up", labels_of(labels)), "gauge", ms, 0.0 if down else 1.0))
            rows.append((SeriesKey("vllm:kv_cache_usage_perc", labels_of(labels)), "gauge",
                         ms, rng.uniform(0.0, 1.0)))
            t += STEP_S
    s.write(rows)
    yield s
    s.close()


def _grid(step_s: float = 300.0) -> Grid:
    return Grid(AT_MS - 2 * 3600 * 1000, round(step_s * 1000), round(7200 / step_s) + 1)


@pytest.mark.parametrize("sem", ["2", "3"])
def test_every_query_at_every_instant_is_the_instant_answer(store: Store, sem: str) -> None:
    source = EmbeddedSource(store, semantics=sem)
    grid = _grid()
    batch = OnGrid(source, grid)
    pool = {"pool": "chat"}
    for at_ms in grid.instants_ms().tolist():
        at = at_ms / 1000.0
        for w in (60.0, 300.0, 3600.0):
            assert batch.increase("vllm:generation_tokens_total", pool, at, w) == \
                source.increase("vllm:generation_tokens_total", pool, at, w)
            assert batch.increase("vllm:generation_tokens_total", pool, at, w, ("instance",)) \
                == source.increase("vllm:generation_tokens_total", pool, at, w, ("instance",))
            got = batch.bucket_increase("vllm:time_to_first_token_seconds", pool, at, w,
                                        ("model_name",))
            want = source.bucket_increase("vllm:time_to_first_token_seconds", pool, at, w,
                                          ("model_name",))
            assert {k: sorted(v) for k, v in got.items()} == \
                {k: sorted(v) for k, v in want.items()}
            assert batch.avg_over_time("up", pool, at, w) == \
                source.avg_over_time("up", pool, at, w)
            # A fractional gauge: the instant query answers (the range form is exact only
            # for integer-valued series).
            assert batch.avg_over_time("vllm:kv_cache_usage_perc", pool, at, w) == \
                source.avg_over_time("vllm:kv_cache_usage_perc", pool, at, w)
            assert batch.samples("up", pool, at, w) == source.samples("up", pool, at, w)
        assert batch.instant("vllm:kv_cache_usage_perc", pool, at) == \
            source.instant("vllm:kv_cache_usage_perc", pool, at)
        for w in (60.0, 3600.0):
            cut = batch.window_arrays("up", pool, at, w)
            assert cut is not None
            want = source.samples("up", pool, at, w)
            assert {labels: (ts.tolist(), vals.tolist()) for labels, (ts, vals) in cut.items()} \
                == {labels: ([p.ts_ms for p in pts], [p.value for p in pts])
                    for labels, pts in want.items()}


def test_off_grid_instants_go_to_the_wrapped_source(store: Store) -> None:
    source = EmbeddedSource(store)
    batch = OnGrid(source, _grid())
    at = AT - 77.5  # not one of the grid's instants
    assert batch.increase("vllm:generation_tokens_total", {}, at, 300.0) == \
        source.increase("vllm:generation_tokens_total", {}, at, 300.0)
    assert batch.semantics is source.semantics and batch.store is source.store
    # Off the grid, the wrapped store's own arrays.
    off = batch.window_arrays("up", {}, at, 300.0)
    want = source.window_arrays("up", {}, at, 300.0)
    assert off is not None and off and {k: (t.tolist(), v.tolist()) for k, (t, v) in off.items()} \
        == {k: (t.tolist(), v.tolist()) for k, (t, v) in want.items()}


def test_one_range_read_answers_every_instant(store: Store, monkeypatch) -> None:
    source = EmbeddedSource(store)
    reads: list[str] = []
    real = source.increase_range
    monkeypatch.setattr(source, "increase_range",
                        lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    batch = OnGrid(source, _grid())
    for at_ms in _grid().instants_ms().tolist():
        batch.increase("vllm:generation_tokens_total", {"pool": "chat"}, at_ms / 1000, 300.0)
    assert reads == ["vllm:generation_tokens_total"]


def test_grid_of_chart_times() -> None:
    # A chart's times: multiples of its step, then the range's end (off the step).
    times = [AT - 900.0, AT - 600.0, AT - 300.0, AT + 12.5]
    assert grid_of(times) == Grid(round((AT - 900) * 1000), 300_000, 3)
    # Gaps are filled, up to twice as many instants as times.
    assert grid_of([AT, AT + 60.0, AT + 180.0]) == Grid(round(AT * 1000), 60_000, 4)
    assert grid_of([AT, AT + 60.0, AT + 6000.0]) is None
    assert grid_of([AT, AT + 60.0]) is None  # too few to pay for a range read
    assert grid_of([]) is None


def test_on_grid_keeps_a_source_it_cannot_batch(store: Store) -> None:
    source = EmbeddedSource(store)
    assert on_grid(source, [AT]) is source
    assert isinstance(on_grid(source, [AT, AT + 60, AT + 120]), OnGrid)
    plain = object()  # no range queries
    assert on_grid(plain, [AT, AT + 60, AT + 120]) is plain
