"""The SLO engine's queries through ``EmbeddedSource`` against a real Prometheus (2.42).

The same deterministic vLLM-like data (jittered scrapes, a replica restart, a late replica, a
down stretch, scrape gaps) is written to our store and loaded into Prometheus; every query the
SLO engine makes is then evaluated both ways at many instants — the per-series and summed
increases, the bucket increases behind quantiles and SLIs, ``avg_over_time(up)`` and the
``avg`` over targets behind availability and cost, instant lookups behind KV usage and queue
length. With ``semantics="2"`` the results must agree to 1e-9 relative (they are expected to
be bit-identical) and the same series must be present on both sides.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from support.fleet import MODEL, TTFT_LE, target_labels, vllm_labels
from support.prometheus import PrometheusServer, PromSeries, prometheus_fixture
from support.same_numbers import assert_same_numbers

from collector.store import Store
from slo.objectives.sli import error_ratio
from slo.objectives.spec import SloSpec
from slo.promql.quantile import histogram_quantile
from slo.sources.embedded import EmbeddedSource, avg_aggregate
from vigil.model import Labels, SeriesKey, labels_of

pytestmark = pytest.mark.slow

REL_TOL = 1e-9
SEED = 20261118
T0_MS = 1_760_000_000_000  # fixed, so every run builds identical blocks
SPAN_MS = 2 * 3600 * 1000 + 600_000
POOL = {"pool": "chat", "kind": "vllm"}
REASONS = ("stop", "length", "abort", "error", "repetition")


@dataclass
class Data:
    prom: list[PromSeries] = field(default_factory=list)
    rows: list[tuple[SeriesKey, str, int, float | None]] = field(default_factory=list)
    times_s: list[float] = field(default_factory=list)

    def add(self, name: str, labels: dict[str, str], family: str, times: list[int],
            values: list[float]) -> None:
        self.prom.append(PromSeries(name, labels, list(zip(times, values, strict=True))))
        key = SeriesKey(name, labels_of(labels))
        self.rows += [(key, family, t, v) for t, v in zip(times, values, strict=True)]


def _times(rng: np.random.Generator, start: int, end: int, gap_at: int | None = None,
           gap_ms: int = 0) -> list[int]:
    out, t = [], start
    while t < end:
        out.append(t)
        t += 15_000 + int(rng.integers(-2_000, 2_001)) + (gap_ms if len(out) == gap_at else 0)
    return out


def _counter(rng: np.random.Generator, n: int, mean: float, first: float,
             reset_at: int | None) -> list[float]:
    """Poisson increments from ``first``; at ``reset_at`` the counter restarts near 0."""
    values, v = [], first
    for i in range(n):
        v = float(rng.poisson(mean)) if i == reset_at else v + float(rng.poisson(mean))
        values.append(v)
    return values


def build() -> Data:
    rng = np.random.default_rng(SEED)
    data = Data()
    end = T0_MS + SPAN_MS
    # chat-0: all along, restarts at scrape 300; chat-1: starts 50 min late, a 6-min gap.
    replicas = [("chat-0", T0_MS + 1_111, None, 0, 300),
                ("chat-1", T0_MS + 50 * 60_000 + 777, 100, 360_000, None)]
    for instance, start, gap_at, gap_ms, reset_at in replicas:
        times = _times(rng, start, end, gap_at, gap_ms)
        n = len(times)
        labels = vllm_labels(instance)
        # up: down (0) for 40 scrapes in the middle of chat-0's life
        up = [0.0 if instance == "chat-0" and 200 <= i < 240 else 1.0 for i in range(n)]
        data.add("up", target_labels(instance), "gauge", times, up)
        data.add("vllm:kv_cache_usage_perc", labels, "gauge", times,
                 [float(round(rng.uniform(0, 1), 4)) for _ in range(n)])
        data.add("vllm:num_requests_waiting", labels, "gauge", times,
                 [float(rng.integers(0, 30)) for _ in range(n)])

        for reason in REASONS:
            mean = {"stop": 20, "error": 0.7}.get(reason, 1.5)
            data.add("vllm:request_success_total", {**labels, "finished_reason": reason},
                     "counter", times, _counter(rng, n, mean, 9.0, reset_at))
        # TTFT buckets: per-scrape increments per bucket, cumulative over le and over time
        incs = rng.poisson(2.0, size=(n, len(TTFT_LE)))
        if reset_at is not None:
            incs[reset_at] = rng.poisson(0.5, size=len(TTFT_LE))
        per_le = np.cumsum(incs, axis=1)  # cumulative over le
        running = np.zeros(len(TTFT_LE))
        cumulative = []
        for i in range(n):
            running = per_le[i].astype(float) if i == reset_at else running + per_le[i]
            cumulative.append(running.copy())
        for j, le in enumerate(TTFT_LE):
            data.add("vllm:time_to_first_token_seconds_bucket", {**labels, "le": le},
                     "histogram", times, [float(c[j]) for c in cumulative])
        # on sample timestamps, and exactly one window after one (the left edge of 5m and 1h)
        data.times_s += [t / 1000 for t in times[::37]]
        data.times_s += [t / 1000 + w for t in times[5::41] for w in (300, 3600)]
    grid = np.arange(T0_MS + 600_000, end + 60_000, 397_000) / 1000
    data.times_s = sorted(set(data.times_s) | set(grid.tolist()))
    return data


DATA = build()
prom = prometheus_fixture(lambda: DATA.prom)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedSource]:
    with Store(tmp_path_factory.mktemp("vs-prom") / "vigil.db") as store:
        store.write(DATA.rows)
        yield EmbeddedSource(store, semantics="2")


def _strip_name(vector: dict[Labels, float]) -> dict[Labels, float]:
    return {tuple(kv for kv in k if kv[0] != "__name__"): v for k, v in vector.items()}


def _match(extra: str = "") -> str:
    return '{pool="chat",kind="vllm"' + extra + "}"


def test_increases_match_prometheus(prom: PrometheusServer, source: EmbeddedSource) -> None:
    metric = "vllm:request_success_total"
    for at in DATA.times_s:
        for w, text in ((300, "5m"), (3600, "1h"), (1800, "30m")):
            assert_same_numbers(
                source.increase(metric, POOL, at, w),
                prom.query(f"sum(increase({metric}{_match()}[{text}]))", at), f"sum {at}")
            assert_same_numbers(
                source.increase(metric, POOL, at, w, by=("instance", "finished_reason")),
                prom.query(f"sum by (instance, finished_reason) "
                           f"(increase({metric}{_match()}[{text}]))", at), f"by {at}")


def test_error_rate_sli_matches_the_promql_ratio(
    prom: PrometheusServer, source: EmbeddedSource
) -> None:
    spec = SloSpec("e", "chat", MODEL, "all", "error_rate", 0.995, None, 30 * 86400.0)
    m = "vllm:request_success_total"
    for at in DATA.times_s:
        expr = (f'sum(increase({m}{_match(",finished_reason=" + chr(34) + "error" + chr(34))}'
                f"[1h])) / sum(increase({m}{_match()}[1h]))")
        theirs = prom.query(expr, at)
        ours = error_ratio(spec, source, at, 3600).error_ratio
        if not theirs:
            assert ours is None
        else:
            assert ours == pytest.approx(theirs[()], rel=REL_TOL)


def test_quantiles_from_bucket_increases_match_prometheus(
    prom: PrometheusServer, source: EmbeddedSource
) -> None:
    metric = "vllm:time_to_first_token_seconds"
    for at in DATA.times_s:
        groups = source.bucket_increase(metric, POOL, at, 300, by=("model_name",))
        for q in (0.5, 0.95, 0.99):
            ours = {k: histogram_quantile(q, b, "2") for k, b in groups.items()}
            theirs = prom.query(f"histogram_quantile({q}, sum by (model_name, le) "
                                f"(increase({metric}_bucket{_match()}[5m])))", at)
            assert_same_numbers(ours, theirs, f"q{q} at {at}")


def test_avg_over_time_of_up_and_its_average_match_prometheus(
    prom: PrometheusServer, source: EmbeddedSource
) -> None:
    for at in DATA.times_s:
        for w, text in ((300, "5m"), (3600, "1h"), (7 * 86400, "7d")):
            ours = source.avg_over_time("up", POOL, at, w)
            assert_same_numbers(ours, prom.query(f"avg_over_time(up{_match()}[{text}])", at),
                                f"{at} {w}")
            theirs = prom.query(f"avg(avg_over_time(up{_match()}[{text}]))", at)
            mean = avg_aggregate(ours, "2")
            assert (mean is None) == (not theirs)
            if theirs:
                assert mean == pytest.approx(theirs[()], rel=REL_TOL)


def test_instant_lookups_match_prometheus(prom: PrometheusServer, source: EmbeddedSource) -> None:
    for at in DATA.times_s:
        for metric in ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "up"):
            assert_same_numbers(source.instant(metric, POOL, at),
                                _strip_name(prom.query(f"{metric}{_match()}", at)),
                                f"{metric} {at}")


def test_raw_samples_match_prometheus(prom: PrometheusServer, source: EmbeddedSource) -> None:
    for at in DATA.times_s[::5]:
        theirs = prom.query_range_samples(f"up{_match()}", at, 600)
        ours = source.samples("up", POOL, at, 600)
        assert {k: [(p.ts_ms, p.value) for p in v] for k, v in ours.items()} == {
            tuple(kv for kv in k if kv[0] != "__name__"): v for k, v in theirs.items()}
