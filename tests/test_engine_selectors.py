"""A pool chosen by its selector in a real Prometheus gives the same engine answers as Vigil's
store holding the same samples under Vigil's own labels.

The Prometheus holds series the way kube-prometheus-stack leaves them: Kubernetes labels only
(``namespace``, ``pod``, ``service``, ``job``, ``container``, ``endpoint``, ``instance``, and
vLLM's ``model_name``), no ``pool``, no ``kind``. Besides the pool's two pods there are decoys
the selector must leave out: the same service in another namespace, a canary service in the
same namespace, and a second scrape job of the first pod (``up`` only). The pool's selector uses
``=``, ``=~``, ``!~`` and ``!=``, and its replicas are told apart by ``pod``. The store holds
the pool's samples under ``{instance, pool, kind}`` (and the decoys under another pool).

``slo.status.evaluate`` over ``PrometheusSource`` must equal it over ``EmbeddedSource`` to 1e-9
relative, key by key (SLIs, burn rates, budgets, quantiles, KV-cache mean per replica, replica
count, scaling, cost in GPU-hours), at several instants: both evaluate the same samples at the
same millisecond.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.fleet import ITL_LE, LATENCY_LE, MODEL, TOKENS_LE, TTFT_LE
from support.prometheus import PrometheusServer, PromSeries, prometheus_fixture
from support.same_numbers import Tolerance, assert_same_numbers

from collector.store import Store
from dashboard.empty_states import has_dcgm
from dashboard.timeseries import sm_point
from slo.cost.pool import gpu_hours, up_seconds
from slo.objectives.sli import pool_series, replica_label, vllm_matchers
from slo.objectives.spec import effective_slos
from slo.scaling.signals import current_replicas, kv_usage_at, kv_usage_by_pool_replica
from slo.sources.embedded import EmbeddedSource
from slo.sources.prometheus import PrometheusSource, selector
from slo.sources.protocol import matchers_of, with_equal
from slo.status import evaluate
from vigil.config import Config, parse_config
from vigil.conventions import (
    DCGM_GPU_UTIL,
    SERIES_UP,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_HTTP_REQUESTS,
    VLLM_ITL,
    VLLM_KV_CACHE_USAGE,
    VLLM_PROMPT_TOKENS_HIST,
    VLLM_QUEUE_TIME,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
    VLLM_TTFT,
)
from vigil.model import SeriesKey, labels_of
from vigil.selectors import LabelMatcher, Selector, as_selector, parse_selector

pytestmark = pytest.mark.slow

#: The engine over Prometheus and over the store: float rounding apart, zero exactly zero.
AGREE = Tolerance(1e-9, 0.0)
SEED = 20260417
T0_MS = 1_770_000_000_000  # fixed: identical blocks on every run
SPAN_MS = 3 * 3600 * 1000
STEP_MS = 30_000
REASONS = ("stop", "length", "abort", "error", "repetition")

SELECTOR = ('namespace="llm", service=~"chat-.*", service!~".*-canary", '
            'job!="llm/chat-vllm-extra"')
#: The same pods without the job matcher: the first pod's second scrape job is in.
SELECTOR_BOTH_JOBS = 'namespace="llm", service=~"chat-.*", service!~".*-canary"'
DCGM_SELECTOR = 'namespace="gpu-operator", service="dcgm-exporter", Hostname=~"gpu-a.*"'


def _config(selector_text: str) -> Config:
    # An SLO on "availability" warns that it counts requests now (replica_up: the old one).
    with pytest.warns(DeprecationWarning, match="replica_up"):
        return parse_config({
            "pools": [{"name": "chat", "model": MODEL, "gpus_per_replica": 2,
                       "selector": selector_text, "dcgm_selector": DCGM_SELECTOR,
                       "replica_label": "pod"}],
            # Raw series on both sides: the comparison is of the engine's own arithmetic.
            "engine": {"promql_semantics": "2", "recorded_rules": "off"},
            "slos": [
                {"name": "chat-ttft", "pool": "chat", "indicator": "ttft"},
                {"name": "chat-e2e", "pool": "chat", "indicator": "e2e"},
                {"name": "chat-error-rate", "pool": "chat", "indicator": "error_rate"},
                {"name": "chat-availability", "pool": "chat", "indicator": "availability"},
                {"name": "chat-replica-up", "pool": "chat", "indicator": "replica_up"},
            ],
        })


CONFIG = _config(SELECTOR)
CONFIG_BOTH_JOBS = _config(SELECTOR_BOTH_JOBS)


@dataclass
class Data:
    prom: list[PromSeries] = field(default_factory=list)
    rows: list[tuple[SeriesKey, str, int, float | None]] = field(default_factory=list)
    times_s: list[float] = field(default_factory=list)

    def add(self, name: str, k8s: dict[str, str], vigil: dict[str, str], family: str,
            times: list[int], values: list[float]) -> None:
        """One series: under Kubernetes labels in Prometheus, Vigil's in the store."""
        self.prom.append(PromSeries(name, k8s, list(zip(times, values, strict=True))))
        key = SeriesKey(name, labels_of(vigil))
        self.rows += [(key, family, t, v) for t, v in zip(times, values, strict=True)]


@dataclass(frozen=True)
class Pod:
    pod: str
    namespace: str
    service: str
    ip: str
    store_instance: str
    store_pool: str
    start_ms: int
    down: range = range(0)
    restart_at: int | None = None


PODS = [
    Pod("chat-vllm-0", "llm", "chat-vllm", "10.0.0.10:8000", "chat-0", "chat", T0_MS + 1_234,
        restart_at=200),
    Pod("chat-vllm-1", "llm", "chat-vllm", "10.0.0.11:8000", "chat-1", "chat",
        T0_MS + 3600_000 + 4_321, down=range(100, 115)),
    # Decoys: the same service elsewhere, and a canary beside it.
    Pod("chat-vllm-0", "llm-staging", "chat-vllm", "10.0.9.10:8000", "staging-0", "staging",
        T0_MS + 2_000),
    Pod("chat-vllm-canary-0", "llm", "chat-vllm-canary", "10.0.0.20:8000", "canary-0",
        "canary", T0_MS + 3_000),
]


def _times(rng: np.random.Generator, start: int, end: int) -> list[int]:
    out, t = [], start
    while t < end:
        out.append(t)
        t += STEP_MS + int(rng.integers(-4_000, 4_001))
    return out


def _counter(rng: np.random.Generator, n: int, mean: float, reset_at: int | None,
             down: range) -> list[float]:
    values, v = [], 5.0
    for i in range(n):
        step = 0.0 if i in down else float(rng.poisson(mean))
        v = step if i == reset_at else v + step
        values.append(v)
    return values


def _histogram(data: Data, rng: np.random.Generator, base: str, k8s: dict[str, str],
               vigil: dict[str, str], bounds: list[str], times: list[int], pod: Pod) -> None:
    lam = np.array([0.1 + 1.5 * math.exp(-((j - len(bounds) / 2.5) ** 2) / 8)
                    for j in range(len(bounds))])
    incs = rng.poisson(lam, size=(len(times), len(bounds))).astype(float)
    incs[list(pod.down)] = 0.0
    per_le = np.cumsum(incs, axis=1)
    running = np.zeros(len(bounds))
    cumulative = []
    for i in range(len(times)):
        running = per_le[i].copy() if i == pod.restart_at else running + per_le[i]
        cumulative.append(running.copy())
    for suffix, values in (("_count", [float(c[-1]) for c in cumulative]),
                           ("_sum", [float(c[-1]) * 0.7 for c in cumulative])):
        data.add(base + suffix, k8s, vigil, "histogram", times, values)
    for j, le in enumerate(bounds):
        data.add(base + "_bucket", {**k8s, "le": le}, {**vigil, "le": le}, "histogram", times,
                 [float(c[j]) for c in cumulative])


def build() -> Data:
    rng = np.random.default_rng(SEED)
    data = Data()
    end = T0_MS + SPAN_MS
    for pod in PODS:
        times = _times(rng, pod.start_ms, end)
        n = len(times)
        target = {"namespace": pod.namespace, "service": pod.service, "pod": pod.pod,
                  "job": f"{pod.namespace}/{pod.service}", "container": "vllm",
                  "endpoint": "http", "instance": pod.ip}
        vigil = {"instance": pod.store_instance, "pool": pod.store_pool, "kind": "vllm"}
        up = [0.0 if i in pod.down else 1.0 for i in range(n)]
        data.add(SERIES_UP, target, vigil, "gauge", times, up)
        if pod.pod == "chat-vllm-0" and pod.namespace == "llm":
            # A second job scraping the same pod (a PodMonitor beside the ServiceMonitor): one
            # more `up` series of the same replica, nothing else.
            extra = {**target, "job": "llm/chat-vllm-extra", "endpoint": "metrics"}
            data.prom.append(PromSeries(SERIES_UP, extra, list(zip(times, up, strict=True))))
        engines = ("0", "1") if pod.store_instance == "chat-0" else ("0",)
        for engine in engines:
            k8s = {**target, "engine": engine, "model_name": MODEL}
            ours = {**vigil, "engine": engine, "model_name": MODEL}
            data.add(VLLM_KV_CACHE_USAGE, k8s, ours, "gauge", times,
                     [float(round(rng.uniform(0.3, 0.95), 4)) for _ in range(n)])
            data.add(VLLM_REQUESTS_WAITING, k8s, ours, "gauge", times,
                     [float(rng.integers(0, 12)) for _ in range(n)])
            data.add(VLLM_REQUESTS_RUNNING, k8s, ours, "gauge", times,
                     [float(rng.integers(0, 3)) for _ in range(n)])
        k8s = {**target, "engine": "0", "model_name": MODEL}
        ours = {**vigil, "engine": "0", "model_name": MODEL}
        for reason in REASONS:
            mean = {"stop": 15.0, "error": 0.6}.get(reason, 1.0)
            data.add(VLLM_REQUEST_SUCCESS, {**k8s, "finished_reason": reason},
                     {**ours, "finished_reason": reason}, "counter", times,
                     _counter(rng, n, mean, pod.restart_at, pod.down))
        data.add(VLLM_GENERATION_TOKENS, k8s, ours, "counter", times,
                 _counter(rng, n, 900.0, pod.restart_at, pod.down))
        for status, mean in (("200", 16.0), ("400", 0.3), ("500", 0.5), ("503", 0.2)):
            http = {"handler": "/v1/chat/completions", "method": "POST", "status": status}
            data.add(VLLM_HTTP_REQUESTS, {**target, **http}, {**vigil, **http}, "counter",
                     times, _counter(rng, n, mean, pod.restart_at, pod.down))
        for base, bounds in ((VLLM_TTFT, TTFT_LE), (VLLM_E2E, LATENCY_LE),
                             (VLLM_QUEUE_TIME, LATENCY_LE), (VLLM_ITL, ITL_LE),
                             (VLLM_PROMPT_TOKENS_HIST, TOKENS_LE),
                             (VLLM_GENERATION_TOKENS_HIST, TOKENS_LE)):
            _histogram(data, rng, base, k8s, ours, bounds, times, pod)
        if pod.store_instance == "chat-1":
            data.times_s += [times[105] / 1000, times[130] / 1000 + 7.5]
        if pod.store_instance == "chat-0":
            data.times_s += [times[pod.restart_at + 3] / 1000, times[60] / 1000]
    # GPUs: the pool's node and a decoy node.
    times = _times(rng, T0_MS + 500, end)
    for host, ip, store_pool in (("gpu-a1", "10.0.1.5:9400", "chat"),
                                 ("gpu-b7", "10.0.1.6:9400", "other")):
        for gpu in ("0", "1"):
            k8s = {"namespace": "gpu-operator", "service": "dcgm-exporter", "Hostname": host,
                   "instance": ip, "gpu": gpu, "job": "gpu-operator/dcgm-exporter"}
            ours = {"instance": f"dcgm-{host}", "pool": store_pool, "kind": "dcgm", "gpu": gpu}
            data.add(DCGM_GPU_UTIL, k8s, ours, "gauge", times,
                     [float(rng.integers(0, 101)) for _ in times])
    data.times_s += [end / 1000 - 3.0]
    data.times_s = sorted(set(data.times_s))
    return data


DATA = build()
prom = prometheus_fixture(lambda: DATA.prom)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with Store(tmp_path_factory.mktemp("engine-selectors") / "vigil.db") as s:
        s.write(DATA.rows)
        yield s


@pytest.fixture(scope="module")
def sources(prom: PrometheusServer, store: Store
            ) -> Iterator[tuple[PrometheusSource, EmbeddedSource]]:
    assert prom.semantics() == "2"
    with PrometheusSource(prom.base_url, semantics="2") as p:
        yield p, EmbeddedSource(store, semantics="2")


# --- the selector reaches the pool's series only -------------------------------------------------
def test_the_selector_leaves_the_decoys_out(prom: PrometheusServer) -> None:
    at = DATA.times_s[-1]
    assert len(prom.query(f"up{{{SELECTOR}}}", at)) == 2
    assert len(prom.query(f"up{{{SELECTOR_BOTH_JOBS}}}", at)) == 3
    assert len(prom.query("up", at)) == 5
    assert prom.query("count(up{pool!=\"\"} or up{kind!=\"\"})", at) == {}


def test_matchers_as_each_source_reads_them(sources: tuple[PrometheusSource, EmbeddedSource]
                                            ) -> None:
    p, e = sources
    pool = CONFIG.pools[0]
    assert pool_series(pool, p) == parse_selector(SELECTOR)
    assert pool_series(pool, e) == {"pool": "chat", "kind": "vllm"}
    assert pool_series(pool, p, "dcgm") == parse_selector(DCGM_SELECTOR)
    assert pool_series(pool, e, "dcgm") == {"pool": "chat", "kind": "dcgm"}
    assert replica_label(pool, p) == "pod" and replica_label(pool, e) == "instance"
    assert vllm_matchers(pool, p, model=MODEL) == parse_selector(SELECTOR).and_equal(
        model_name=MODEL)
    assert vllm_matchers(pool, e, model=MODEL) == {"pool": "chat", "kind": "vllm",
                                                    "model_name": MODEL}
    # A spec carries its pool: the SLIs read the same series.
    spec = effective_slos(CONFIG)[0]
    assert vllm_matchers(spec, p) == parse_selector(SELECTOR)
    assert vllm_matchers("chat", p) == {"pool": "chat", "kind": "vllm"}


# --- the engine over both sources ----------------------------------------------------------------
@pytest.mark.parametrize("at", DATA.times_s)
def test_status_is_the_same_over_both_sources(
    sources: tuple[PrometheusSource, EmbeddedSource], at: float
) -> None:
    p, e = sources
    from_prom = evaluate(CONFIG, p, at)
    from_store = evaluate(CONFIG, e, at)
    assert from_prom.pop("source") == "prometheus"
    assert from_store.pop("source") == "embedded"
    assert_same_numbers(from_prom, from_store, tolerance=AGREE)
    pool = from_store["pools"]["chat"]
    # The comparison is not vacuous: every figure is there.
    assert pool["cost"]["gpu_hours"] is not None and pool["cost"]["gpu_hours"] > 0
    assert pool["kv_cache_usage"]["avg"] is not None
    assert pool["replicas_up"] in (1, 2)
    assert {s["name"] for s in from_store["slos"]} == {s.name for s in effective_slos(CONFIG)}
    assert all(s["windows"] for s in from_store["slos"])


def test_every_slo_has_an_sli_somewhere(sources: tuple[PrometheusSource, EmbeddedSource]
                                        ) -> None:
    _, e = sources
    status = evaluate(CONFIG, e, DATA.times_s[-1])
    # Every SLO of the config, so that the loop below checks each of them.
    assert sorted(slo["name"] for slo in status["slos"]) == [
        "chat-availability", "chat-e2e", "chat-error-rate", "chat-replica-up", "chat-ttft"]
    for slo in status["slos"]:
        ratios = [w.get("error_ratio") for w in slo["windows"].values()
                  if isinstance(w, dict)]
        assert any(r is not None for r in ratios), slo["name"]


@pytest.mark.parametrize("at", DATA.times_s)
def test_kv_mean_per_replica(sources: tuple[PrometheusSource, EmbeddedSource],
                             at: float) -> None:
    p, e = sources
    pool = CONFIG.pools[0]
    assert_same_numbers(kv_usage_at(p, pool, at), kv_usage_at(e, pool, at), tolerance=AGREE)
    by_pod = kv_usage_by_pool_replica(p, pool, at)
    by_instance = kv_usage_by_pool_replica(e, pool, at)
    names = {"chat-vllm-0": "chat-0", "chat-vllm-1": "chat-1"}
    assert_same_numbers({("chat", names[r]): v for (_, r), v in by_pod.items()}, by_instance,
                        tolerance=AGREE)
    assert all(pool_name == "chat" for pool_name, _ in by_pod)


@pytest.mark.parametrize("at", DATA.times_s)
def test_replica_count_and_gpu_hours(sources: tuple[PrometheusSource, EmbeddedSource],
                                     at: float) -> None:
    p, e = sources
    pool = CONFIG.pools[0]
    assert current_replicas(p, pool, at) == current_replicas(e, pool, at)
    assert_same_numbers(gpu_hours(p, CONFIG, pool, at, 3600.0),
                        gpu_hours(e, CONFIG, pool, at, 3600.0), tolerance=AGREE)
    assert set(up_seconds(p, CONFIG, pool, at, 3600.0)) <= {
        (("pod", "chat-vllm-0"),), (("pod", "chat-vllm-1"),)}


@pytest.mark.parametrize("at", DATA.times_s)
def test_a_pod_scraped_by_two_jobs_is_billed_and_counted_once(
    sources: tuple[PrometheusSource, EmbeddedSource], at: float
) -> None:
    p, e = sources
    both = CONFIG_BOTH_JOBS.pools[0]
    one = CONFIG.pools[0]
    assert len(p.instant(SERIES_UP, pool_series(both, p), at)) == len(
        p.instant(SERIES_UP, pool_series(one, p), at)) + 1
    assert_same_numbers(gpu_hours(p, CONFIG_BOTH_JOBS, both, at, 3600.0),
                        gpu_hours(e, CONFIG, one, at, 3600.0), tolerance=AGREE)
    assert current_replicas(p, both, at) == current_replicas(e, one, at)
    from_prom = evaluate(CONFIG_BOTH_JOBS, p, at)["pools"]["chat"]
    from_store = evaluate(CONFIG, e, at)["pools"]["chat"]
    assert_same_numbers(from_prom["cost"], from_store["cost"], tolerance=AGREE)
    assert from_prom["replicas_up"] == from_store["replicas_up"]


@pytest.mark.parametrize("at", DATA.times_s[-2:])
def test_gpu_utilisation_through_the_dcgm_selector(
    sources: tuple[PrometheusSource, EmbeddedSource], at: float
) -> None:
    p, e = sources
    pool = CONFIG.pools[0]
    from_prom = sm_point(p, pool, at)
    from_store = sm_point(e, pool, at)
    assert sorted(from_prom) == ["10.0.1.5:9400 gpu 0", "10.0.1.5:9400 gpu 1"]
    assert sorted(from_store) == ["dcgm-gpu-a1 gpu 0", "dcgm-gpu-a1 gpu 1"]
    assert_same_numbers(list(from_prom.values()), list(from_store.values()), tolerance=AGREE)


def test_the_server_page_knows_a_dcgm_selector() -> None:
    pool = CONFIG.pools[0]
    assert has_dcgm(CONFIG, pool, external=True)
    assert not has_dcgm(CONFIG, pool, external=False)
    plain = parse_config({"pools": [{"name": "chat", "model": MODEL}],
                          "discovery": [{"name": "gpus", "names": ["dcgm.gpu.svc"],
                                         "port": 9400, "kind": "dcgm", "pool": "chat"}]})
    assert has_dcgm(plain, plain.pools[0], external=False)
    other = parse_config({"pools": [{"name": "chat", "model": MODEL},
                                    {"name": "batch", "model": MODEL}],
                          "discovery": [{"name": "gpus", "names": ["dcgm.gpu.svc"],
                                         "port": 9400, "kind": "dcgm", "pool": "batch"}]})
    assert not has_dcgm(other, other.pools[0], external=True)


# --- the pieces: matchers in each source ---------------------------------------------------------
def test_prometheus_renders_every_operator() -> None:
    sel = parse_selector('a="x", b!="y\\n", c=~"z.*", d!~"w"')
    assert selector("up", sel) == 'up{a="x",b!="y\\n",c=~"z.*",d!~"w"}'
    assert selector("up", {"b": "2", "a": "1"}) == 'up{a="1",b="2"}'
    assert selector("sum", sel.and_equal(e="v")) == (
        '{__name__="sum",a="x",b!="y\\n",c=~"z.*",d!~"w",e="v"}')
    named = Selector([LabelMatcher("__name__", "=~", "u.*"), LabelMatcher("a", "=", "x")])
    assert selector("up", named) == '{__name__="up",__name__=~"u.*",a="x"}'
    assert selector("up", as_selector({"__name__": "up"})) == "up"


def test_matchers_of_and_with_equal() -> None:
    assert matchers_of(parse_selector('a="x", b="y"')) == {"a": "x", "b": "y"}
    regex = parse_selector('a=~"x"')
    assert matchers_of(regex) is regex
    twice = parse_selector('a="x", a="y"')
    assert matchers_of(twice) is twice
    assert with_equal({"a": "x"}, ("b", "y")) == {"a": "x", "b": "y"}
    assert with_equal(regex, ("b", "y")) == parse_selector('a=~"x", b="y"')
    assert with_equal(parse_selector('a!="x"'), ("a", "z")) == parse_selector(
        'a!="x", a="z"')


def _small_store(path: Path) -> Store:
    s = Store(path)
    rows = []
    for ns, pod, value in (("llm", "chat-0", 1.0), ("llm", "chat-1", 2.0),
                           ("llm", "canary-0", 3.0), ("dev", "chat-0", 4.0)):
        key = SeriesKey("g", labels_of({"namespace": ns, "pod": pod}))
        rows += [(key, "gauge", T0_MS + i * 15_000, value) for i in range(5)]
        counter = SeriesKey("c_total", labels_of({"namespace": ns, "pod": pod}))
        rows += [(counter, "counter", T0_MS + i * 15_000, value * i) for i in range(5)]
    rows.append((SeriesKey("g", labels_of({"pod": "bare"})), "gauge", T0_MS, 9.0))
    s.write(rows)
    return s


def _pods(result: dict[SeriesKey, Any]) -> list[tuple[str, str]]:
    return sorted((k.label("namespace"), k.label("pod")) for k in result)


@pytest.mark.parametrize(("text", "want"), [
    ('namespace="llm"', [("llm", "canary-0"), ("llm", "chat-0"), ("llm", "chat-1")]),
    ('namespace!="llm"', [("", "bare"), ("dev", "chat-0")]),
    ('pod=~"chat-.*"', [("dev", "chat-0"), ("llm", "chat-0"), ("llm", "chat-1")]),
    ('pod=~"chat"', []),                       # anchored
    ('pod!~"chat-.*", namespace=~".+"', [("llm", "canary-0")]),
    ('namespace=""', [("", "bare")]),          # missing label == ""
    ('namespace=~"llm|dev", pod!="chat-1"', [("dev", "chat-0"), ("llm", "canary-0"),
                                             ("llm", "chat-0")]),
])
def test_store_points_with_every_operator(tmp_path: Path, text: str,
                                          want: list[tuple[str, str]]) -> None:
    with _small_store(tmp_path / "v.db") as s:
        assert _pods(s.points("g", parse_selector(text))) == want
        assert _pods(s.last_points("g", parse_selector(text))) == want
        assert sorted((k.label("namespace"), k.label("pod")) for k, _ in
                      s.series("g", parse_selector(text))) == want


def test_store_name_matchers_in_a_selector(tmp_path: Path) -> None:
    with _small_store(tmp_path / "v.db") as s:
        by_regex = Selector([LabelMatcher("__name__", "=~", "c_.*"),
                             LabelMatcher("pod", "=", "chat-1")])
        assert [k.name for k, _ in s.series(None, by_regex)] == ["c_total"]
        by_equal = as_selector({"__name__": "g", "pod": "bare"})
        assert [k.name for k, _ in s.series(None, by_equal)] == ["g"]
        assert s.points("c_total", Selector([LabelMatcher("__name__", "!=", "c_total")])) == {}


def test_embedded_source_reads_a_selector(tmp_path: Path) -> None:
    with _small_store(tmp_path / "v.db") as s:
        src = EmbeddedSource(s, semantics="2")
        at = (T0_MS + 4 * 15_000) / 1000
        sel = parse_selector('namespace="llm", pod!~"canary-.*"')
        plain = {labels: v for labels, v in src.instant("g", {"namespace": "llm"}, at).items()
                 if dict(labels)["pod"] != "canary-0"}
        assert src.instant("g", sel, at) == plain
        def by_pods(window_s: float) -> float:
            return math.fsum(src.increase("c_total", {"namespace": "llm", "pod": pod}, at,
                                          window_s)[()] for pod in ("chat-0", "chat-1"))

        assert src.increase("c_total", sel, at, 60.0) == {(): by_pods(60.0)}
        assert sorted(src.avg_over_time("g", sel, at, 60.0).values()) == [1.0, 2.0]
        s.compact(now=at + 7200)  # the rollup answers now: the same
        assert src.increase("c_total", sel, at, 60.0) == {(): by_pods(60.0)}
        assert sorted(src.avg_over_time("g", sel, at, 60.0).values()) == [1.0, 2.0]
