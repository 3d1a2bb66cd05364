"""Two sources, one answer: ``PrometheusSource`` (the queries run on a real Prometheus 2.42)
against ``EmbeddedSource`` (our store and ``slo.promql``) on the same samples.

A day and a bit of vLLM fleet data — three pools, jittered scrapes, a replica restart
(every counter resets), a late replica, a down stretch, a scrape gap longer than the lookback,
a NaN sample, a model name full of quotes and backslashes — is written to the store (then
compacted, so that long windows come from the rollup) and loaded into Prometheus with
promtool. Every ``Source`` method must agree at many instants, including hour boundaries (the
rollup's block edges) and instants exactly one window after a sample (the range's left edge);
then the whole ``slo.status.evaluate`` JSON and ``vigil slo status --json`` must be equal from
both sources, except ``"source"``. Semantics "2": the server is 2.42.

Failures must be clean ``VigilError``s naming the URL and the query.
"""

from __future__ import annotations

import argparse
import io
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.fleet import (
    FINISHED_REASONS,
    ITL_LE,
    LATENCY_LE,
    MODEL,
    OTHER_MODEL,
    TOKENS_LE,
    TTFT_LE,
    target_labels,
    vllm_labels,
)
from support.loopback import Answer, Request, free_port, serve_http
from support.prometheus import PrometheusServer, PromSeries, prometheus_fixture
from support.same_numbers import assert_same_numbers

from collector.store import Store, rollup
from slo.promql.lookup import eval_time_ms
from slo.sources.embedded import EmbeddedSource
from slo.sources.prometheus import (
    PrometheusSource,
    SourceError,
    format_duration_ms,
    format_eval_time,
    promql_string,
    selector,
)
from slo.sources.protocol import Source
from slo.status import evaluate
from vigil.config import parse_config
from vigil.errors import VigilError
from vigil.model import Labels, SeriesKey, labels_of
from vigil_shell.slo_status_cli import add_arguments, run

pytestmark = pytest.mark.slow

SEED = 20261203
H = 3_600_000
T0_MS = 1_762_000_000_000 // H * H + 7 * 60_000  # fixed: every run builds identical blocks
SPAN_MS = 27 * H + 1_234_567
END_MS = T0_MS + SPAN_MS
#: A model name that needs escaping in PromQL, OpenMetrics, TOML and JSON.
ODD_MODEL = 'org/we"ird\\model {x="1"}'
POOLS = {"chat": MODEL, "batch": OTHER_MODEL, "odd": ODD_MODEL}
CONFIG_DATA: dict[str, Any] = {
    # Raw series from both sources: the comparison is of the engine's own arithmetic.
    "engine": {"promql_semantics": "2", "recorded_rules": "off"},
    "pools": [{"name": p, "model": m, "gpu": "H100", "max_replicas": 4}
              for p, m in POOLS.items()],
}
CONFIG = parse_config(CONFIG_DATA)
CHAT = {"pool": "chat", "kind": "vllm"}
ODD = {"pool": "odd", "kind": "vllm", "model_name": ODD_MODEL}
#: Windows of the status (burn-rate windows, the period) and odd ones (seconds).
WINDOWS = (300.0, 3600.0, 7200.0, 5432.1, 6 * 3600.0, 86400.0, 3 * 86400.0, 30 * 86400.0)
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": (TTFT_LE, 0.25, 1.0),
    "vllm:e2e_request_latency_seconds": (LATENCY_LE, 4.0, 0.8),
    "vllm:request_queue_time_seconds": (LATENCY_LE, 0.4, 1.2),
    "vllm:inter_token_latency_seconds": (ITL_LE, 0.03, 0.5),
    "vllm:request_generation_tokens": (TOKENS_LE, 150.0, 1.0),
    "vllm:request_prompt_tokens": (TOKENS_LE, 400.0, 0.7),
}


@dataclass
class Data:
    prom: list[PromSeries] = field(default_factory=list)
    rows: list[tuple[SeriesKey, str, int, float | None]] = field(default_factory=list)

    def add(self, name: str, labels: dict[str, str], family: str, times: list[int],
            values: list[float]) -> None:
        self.prom.append(PromSeries(name, labels, list(zip(times, values, strict=True))))
        key = SeriesKey(name, labels_of(labels))
        self.rows += [(key, family, t, v) for t, v in zip(times, values, strict=True)]


def _times(rng: np.random.Generator, start: int, end: int,
           gap: tuple[int, int] | None) -> list[int]:
    """~120 s scrapes with ±10 s jitter; none inside ``gap`` (ms, a scrape outage)."""
    out, t = [], start
    while t < end:
        if gap is None or not gap[0] <= t < gap[1]:
            out.append(t)
        t += 120_000 + int(rng.integers(-10_000, 10_001))
    return out


def _cumulative(increments: np.ndarray, reset_at: int | None) -> np.ndarray:
    """Counter values from per-scrape increments; at ``reset_at`` it restarts from 0."""
    values = np.cumsum(increments, axis=0)
    if reset_at is not None:
        values[reset_at:] -= values[reset_at - 1]
    return values


def build() -> Data:
    rng = np.random.default_rng(SEED)
    # vLLM's API-server counter has its own generator, so every other series stays as it was.
    http_rng = np.random.default_rng(SEED + 1)
    data = Data()
    # (instance, pool, start, scrape outage, restart at scrape #, down scrapes)
    replicas = [
        ("chat-0", "chat", T0_MS + 1_111, None, 350, range(150, 170)),
        ("chat-1", "chat", T0_MS + 4 * H + 777, (T0_MS + 9 * H, T0_MS + 9 * H + 1_200_000),
         None, range(0)),
        ("batch-0", "batch", T0_MS + 30_003, None, None, range(0)),
        ("odd-0", "odd", T0_MS + 12_345, None, 500, range(0)),
    ]
    for instance, pool, start, gap, reset_at, down in replicas:
        times = _times(rng, start, END_MS, gap)
        n = len(times)
        labels = vllm_labels(instance, pool, POOLS[pool])
        data.add("up", target_labels(instance, pool), "gauge", times,
                 [0.0 if i in down else 1.0 for i in range(n)])
        kv = [float(round(rng.uniform(0, 1), 4)) for _ in range(n)]
        if instance == "chat-0":
            kv[n // 2] = math.nan  # a NaN sample is a value, not a marker
        data.add("vllm:kv_cache_usage_perc", labels, "gauge", times, kv)
        data.add("vllm:num_requests_waiting", labels, "gauge", times,
                 [float(rng.integers(0, 8)) for _ in range(n)])
        data.add("vllm:num_requests_running", labels, "gauge", times,
                 [float(max(0, rng.integers(-3, 12))) for _ in range(n)])
        requests = rng.poisson(20, size=n)
        by_reason = rng.multinomial(1, [0.9, 0.05, 0.02, 0.02, 0.01], size=(n, 25)).sum(axis=1)
        for j, reason in enumerate(FINISHED_REASONS):
            inc = np.minimum(by_reason[:, j], requests).astype(float)
            data.add("vllm:request_success_total", {**labels, "finished_reason": reason},
                     "counter", times, _cumulative(inc, reset_at).tolist())
        # http_requests_total by status (the availability SLI): grouped statuses on chat-0,
        # plain codes elsewhere; restarts with the engine.
        statuses = {"2xx": 20.0, "4xx": 0.5, "5xx": 0.3} if instance == "chat-0" \
            else {"200": 20.0, "500": 0.2, "503": 0.1}
        for status, mean in statuses.items():
            answers = _cumulative(http_rng.poisson(mean, size=n).astype(float), reset_at)
            data.add("http_requests_total",
                     {**target_labels(instance, pool), "handler": "/v1/chat/completions",
                      "method": "POST", "status": status}, "counter", times, answers.tolist())
        tokens = _cumulative(rng.poisson(3000, size=n).astype(float), reset_at).tolist()
        if instance == "batch-0":
            tokens[n // 3] = math.nan
        data.add("vllm:generation_tokens_total", labels, "counter", times, tokens)
        for base, (bounds, scale, sigma) in HISTOGRAMS.items():
            les = np.array([float(le) for le in bounds])
            counts = np.zeros((n, len(bounds)))
            sums = np.zeros(n)
            for i in range(n):
                obs = rng.lognormal(math.log(scale), sigma, size=int(requests[i]))
                counts[i] = (obs[:, None] <= les[None, :]).sum(axis=0)
                sums[i] = float(obs.sum())
            cum = _cumulative(counts, reset_at)
            for j, le in enumerate(bounds):
                data.add(base + "_bucket", {**labels, "le": le}, "histogram", times,
                         cum[:, j].tolist())
            data.add(base + "_sum", labels, "histogram", times,
                     _cumulative(sums, reset_at).tolist())
            data.add(base + "_count", labels, "histogram", times,
                     _cumulative(requests.astype(float), reset_at).tolist())
    return data


DATA = build()
prom = prometheus_fixture(lambda: DATA.prom)


def _instants() -> list[float]:
    rng = np.random.default_rng(SEED + 1)
    out = {float(t) / 1000 for t in rng.integers(T0_MS + 600_000, END_MS + 1_800_000, size=14)}
    out |= {(T0_MS // H + k) * H / 1000 for k in (5, 13, 20, 27)}  # rollup block edges
    out |= {((T0_MS // H + 24) * H + 1) / 1000}
    chat0 = DATA.prom[0].samples  # up of chat-0
    out |= {chat0[i][0] / 1000 + w for i, w in ((250, 3600), (450, 7200), (600, 86400))}
    return sorted(out)


TIMES = _instants()


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("two-sources")
    with Store(folder / "vigil.db") as store:
        store.write(DATA.rows)
        # Everything but the last minutes moves to the main table and is rolled up by hour.
        store.compact(now=END_MS / 1000 + 60)
        assert int(store._meta()[rollup.K_WATERMARK]) > T0_MS + 26 * H
    return folder


@pytest.fixture(scope="module")
def embedded(store_dir: Path) -> Iterator[EmbeddedSource]:
    with Store.open_readonly(store_dir / "vigil.db") as store:
        yield EmbeddedSource(store, semantics="2")


@pytest.fixture(scope="module")
def remote(prom: PrometheusServer) -> Iterator[PrometheusSource]:
    assert prom.semantics() == "2"
    with PrometheusSource(prom.base_url, semantics="2") as source:
        yield source


def _by_le(buckets: list[tuple[float, float]]) -> dict[Labels, float]:
    return {(("le", repr(le)),): count for le, count in sorted(buckets)}


def _both(embedded: EmbeddedSource, remote: PrometheusSource,
          call: Callable[[Source], Any]) -> tuple[Any, Any]:
    return call(embedded), call(remote)


# --- every Source method ------------------------------------------------------------------------
def test_increase_agrees(embedded: EmbeddedSource, remote: PrometheusSource) -> None:
    m = "vllm:request_success_total"
    for at in TIMES:
        for w in WINDOWS:
            for matchers, by in ((CHAT, ()), (CHAT, ("instance", "finished_reason")),
                                 ({}, ("pool",)), (ODD, ("model_name",))):
                ours, theirs = _both(embedded, remote,
                                     lambda s, mt=matchers, b=by, w=w, at=at:
                                     s.increase(m, mt, at, w, b))
                assert_same_numbers(ours, theirs, (at, w, matchers, by))
            ours, theirs = _both(embedded, remote, lambda s, w=w, at=at: s.increase(
                "vllm:generation_tokens_total", {}, at, w, ("instance",)))
            assert_same_numbers(ours, theirs, ("tokens", at, w))


def test_bucket_increase_agrees(embedded: EmbeddedSource, remote: PrometheusSource) -> None:
    for at in TIMES:
        for w in WINDOWS:
            for base, matchers, by in (("vllm:time_to_first_token_seconds", CHAT, ("model_name",)),
                                       ("vllm:e2e_request_latency_seconds", ODD, ()),
                                       ("vllm:request_prompt_tokens", {}, ("pool", "instance"))):
                ours, theirs = _both(embedded, remote, lambda s, b=base, mt=matchers, by=by,
                                     w=w, at=at: s.bucket_increase(b, mt, at, w, by))
                assert set(ours) == set(theirs), (at, w, base)
                for k in theirs:
                    assert_same_numbers(_by_le(ours[k]), _by_le(theirs[k]), (at, w, base, k))


def test_instant_agrees(embedded: EmbeddedSource, remote: PrometheusSource) -> None:
    for at in TIMES:
        for metric in ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "up"):
            for matchers in (CHAT, {}, ODD):
                ours, theirs = _both(embedded, remote,
                                     lambda s, m=metric, mt=matchers, at=at: s.instant(m, mt, at))
                assert_same_numbers(ours, theirs, (at, metric, matchers))


def test_avg_over_time_agrees(embedded: EmbeddedSource, remote: PrometheusSource) -> None:
    for at in TIMES:
        for w in WINDOWS:
            for metric in ("up", "vllm:kv_cache_usage_perc"):
                ours, theirs = _both(embedded, remote, lambda s, m=metric, w=w, at=at:
                                     s.avg_over_time(m, {"kind": "vllm"}, at, w))
                assert_same_numbers(ours, theirs, (at, w, metric))


def test_samples_agree(embedded: EmbeddedSource, remote: PrometheusSource) -> None:
    for at in TIMES:
        for metric, r in (("up", 7200.0), ("vllm:num_requests_running", 3600.0),
                          ("vllm:request_generation_tokens_bucket", 1800.5)):
            ours, theirs = _both(embedded, remote,
                                 lambda s, m=metric, r=r, at=at: s.samples(m, CHAT, at, r))
            assert set(ours) == set(theirs), (at, metric)
            for k in theirs:
                assert [p.ts_ms for p in ours[k]] == [p.ts_ms for p in theirs[k]], (at, k)
                assert_same_numbers(
                    {(("i", str(i)),): p.value for i, p in enumerate(ours[k])},
                    {(("i", str(i)),): p.value for i, p in enumerate(theirs[k])}, (at, k))


# --- the whole status ----------------------------------------------------------------------------
def _without_source(result: dict[str, Any]) -> dict[str, Any]:
    assert result["source"] in ("embedded", "prometheus")
    return {k: v for k, v in result.items() if k != "source"}


def test_status_json_is_the_same_from_both_sources(
    embedded: EmbeddedSource, remote: PrometheusSource
) -> None:
    with_numbers = 0
    for at in TIMES[::4]:
        ours = evaluate(CONFIG, embedded, at)
        theirs = evaluate(CONFIG, remote, at)
        assert (ours["source"], theirs["source"]) == ("embedded", "prometheus")
        assert _without_source(ours) == _without_source(theirs), at
        # not vacuous: the period SLIs and the (escaped) odd model's quantiles have numbers
        odd = ours["pools"]["odd"]["models"][ODD_MODEL]["quantiles"]["ttft_seconds"]["p95"]
        if odd is not None and all(slo["sli"] is not None for slo in ours["slos"]):
            with_numbers += 1
    assert with_numbers >= 2


def _cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vigil slo status")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _toml_config(folder: Path, prometheus_url: str = "") -> Path:
    # JSON strings are valid TOML basic strings (\" \\ \uXXXX).
    lines = ['[store]', 'path = "vigil.db"', '[engine]', 'promql_semantics = "2"',
             'recorded_rules = "off"']
    if prometheus_url:
        lines.append(f"prometheus_url = {json.dumps(prometheus_url)}")
    for pool in CONFIG_DATA["pools"]:
        lines += ["[[pools]]"] + [f"{k} = {json.dumps(v)}" for k, v in pool.items()]
    path = folder / ("vigil-prom.toml" if prometheus_url else "vigil.toml")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_json_is_the_same_from_both_sources(
    store_dir: Path, prom: PrometheusServer
) -> None:
    config = _toml_config(store_dir)
    at = str(TIMES[-4])
    outputs = []
    for extra in ((), ("--prometheus-url", prom.base_url)):
        out = io.StringIO()
        assert run(_cli_args("--config", str(config), "--at", at, "--json", *extra),
                   out=out) == 0
        outputs.append(json.loads(out.getvalue()))
    assert [o["source"] for o in outputs] == ["embedded", "prometheus"]
    assert _without_source(outputs[0]) == _without_source(outputs[1])
    # [engine] prometheus_url selects the server too
    out = io.StringIO()
    run(_cli_args("--config", str(_toml_config(store_dir, prom.base_url)), "--at", at,
                  "--json"), out=out)
    assert _without_source(json.loads(out.getvalue())) == _without_source(outputs[0])


# --- errors -------------------------------------------------------------------------------------
def test_a_dead_server_is_a_clean_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with PrometheusSource(url) as source, pytest.raises(SourceError) as err:
        source.increase("vllm:request_success_total", CHAT, 1e9, 3600)
    text = str(err.value)
    assert url in text and "increase(vllm:request_success_total{" in text
    assert "cannot connect" in text
    assert isinstance(err.value, VigilError) and err.value.url == url


def test_the_cli_reports_a_dead_server_as_a_vigil_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    config = _toml_config(tmp_path, url)
    with pytest.raises(VigilError, match="cannot connect"):
        run(_cli_args("--config", str(config), "--at", "1e9", "--json"), out=io.StringIO())


def test_a_wrong_path_and_a_bad_query_carry_the_servers_message(prom: PrometheusServer) -> None:
    with PrometheusSource(prom.base_url + "/not/prometheus") as wrong:
        with pytest.raises(SourceError, match=r"HTTP 404.*page not found") as err:
            wrong.instant("up", CHAT, TIMES[0])
        assert "/not/prometheus" in str(err.value) and "up{" in str(err.value)
    with PrometheusSource(prom.base_url) as source:
        with pytest.raises(SourceError, match=r"HTTP 400 \(bad_data\).*parse error") as err:
            source.query("sum(rate(up[5m])", TIMES[0])
        assert err.value.query == "sum(rate(up[5m])"


def test_auto_semantics_follow_the_servers_major_version(
    prom: PrometheusServer, tmp_path: Path
) -> None:
    with PrometheusSource(prom.base_url) as source:
        assert source.server_semantics() is not None
        assert source.server_semantics().value == "2"  # Debian's Prometheus is 2.x
    with PrometheusSource(prom.base_url + "/not/prometheus") as wrong:
        assert wrong.server_semantics() is None  # says nothing: the configured rules stay
    # `vigil slo status` with the default "auto" reports the server's rules, the store 3's.
    config = tmp_path / "auto.toml"
    config.write_text(_toml_config(tmp_path).read_text().replace(
        'promql_semantics = "2"', 'promql_semantics = "auto"'))
    out = io.StringIO()
    run(_cli_args("--config", str(config), "--at", str(TIMES[-1]), "--json",
                  "--prometheus-url", prom.base_url), out=out)
    assert json.loads(out.getvalue())["promql_semantics"] == "2"


@pytest.fixture
def fake_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """A server answering every GET as ``state`` says: ``(status, content type, body)`` after
    ``delay`` seconds."""
    state: dict[str, Any] = {"delay": 0.0, "answer": (200, "text/plain", b"")}

    def respond(_: Request) -> Answer:
        if state["delay"]:
            server.closing.wait(state["delay"])
        answer: Answer = state["answer"]
        return answer

    with serve_http(respond) as server:
        yield server.url, state


def test_a_timeout_is_a_clean_error(fake_server: tuple[str, dict[str, Any]]) -> None:
    url, state = fake_server
    state["delay"] = 30.0
    with PrometheusSource(url, timeout_s=0.2) as source, \
            pytest.raises(SourceError, match=r"no answer within 0\.2 s") as err:
        source.instant("up", {}, 1e9)
    assert url in str(err.value)


def test_server_errors_and_foreign_answers(fake_server: tuple[str, dict[str, Any]]) -> None:
    url, state = fake_server
    body = {"status": "error", "errorType": "timeout",
            "error": "query timed out in query execution"}
    state["answer"] = (503, "application/json", json.dumps(body).encode())
    with PrometheusSource(url) as source:
        with pytest.raises(SourceError, match=r"HTTP 503 \(timeout\): query timed out"):
            source.avg_over_time("up", {}, 1e9, 3600)
        state["answer"] = (200, "text/html", b"<html>Grafana</html>")
        with pytest.raises(SourceError, match=r"an HTML page \(text/html\) where Prometheus.s "
                                              "JSON API was expected"):
            source.instant("up", {}, 1e9)
        state["answer"] = (200, "application/json", b'{"status": "success", "data": {}}')
        with pytest.raises(SourceError, match="not a Prometheus API answer"):
            source.instant("up", {}, 1e9)
        state["answer"] = (200, "application/json", json.dumps(
            {"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {}, "values": [[1, "1"]]}]}}).encode())
        with pytest.raises(SourceError, match="expected an instant vector"):
            source.instant("up", {}, 1e9)


# --- the PromQL text ---------------------------------------------------------------------------
def test_label_values_are_escaped_as_promql_strings() -> None:
    assert promql_string('a"b\\c\nd\te\x01') == '"a\\"b\\\\c\\nd\\te\\x01"'
    assert selector("vllm:x_total", {"pool": "chat", "model_name": ODD_MODEL}) == (
        'vllm:x_total{model_name="org/we\\"ird\\\\model {x=\\"1\\"}",pool="chat"}')
    assert selector("up", {}) == "up"
    # names the parser would read as keywords, or that are no identifiers, go in braces
    assert selector("sum", {"a": "b"}) == '{__name__="sum",a="b"}'
    assert selector("weird-name", {}) == '{__name__="weird-name"}'
    assert selector("up", {"__name__": "up"}) == "up"
    assert selector("up", {"__name__": "other"}) == '{__name__="up",__name__="other"}'
    with pytest.raises(ValueError, match="label name"):
        selector("up", {"bad-label": "x"})


def test_durations_and_times_are_sent_in_milliseconds() -> None:
    assert format_duration_ms(300) == "300000ms"
    assert format_duration_ms(5432.1) == "5432100ms"
    assert format_duration_ms(30 * 86400) == "2592000000ms"
    with pytest.raises(ValueError):
        format_duration_ms(0.0004)
    assert format_eval_time(1_760_000_000.0625) == "1760000000.063"  # Go rounds half away
    rng = np.random.default_rng(5)
    for at in [*rng.uniform(0, 2e9, size=2000).tolist(), -1.5, 0.0, 1e-4]:
        assert eval_time_ms(float(format_eval_time(at))) == eval_time_ms(at)


def test_prometheus_source_is_a_source() -> None:
    source = PrometheusSource("http://127.0.0.1:9/", semantics="2", lookback_s=120)
    assert isinstance(source, Source)
    assert (source.kind, source.url, source.semantics.value) == (
        "prometheus", "http://127.0.0.1:9", "2")
    assert "lookback_s=120" in repr(source)
    source.close()
    for kwargs in ({"lookback_s": 0}, {"timeout_s": -1}, {"semantics": "4"}):
        with pytest.raises(ValueError):
            PrometheusSource("http://127.0.0.1:9", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="http"):
        PrometheusSource("127.0.0.1:9090")


def test_the_fixture_data_is_what_the_tests_need() -> None:
    names = {s.name for s in DATA.prom}
    assert {"up", "vllm:request_success_total", "vllm:generation_tokens_total",
            "vllm:kv_cache_usage_perc"} <= names
    assert len(TIMES) > 15
