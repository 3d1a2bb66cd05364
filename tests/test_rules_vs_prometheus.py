"""The generated rules, evaluated by a real Prometheus 2.42, record what the engine reports.

A synthetic fleet (jittered scrapes, a replica restart, a late replica with a scrape gap, a
down stretch, an idle stretch, Poisson traffic) is backfilled into Prometheus and written to
Vigil's store. Prometheus evaluates rules only as new samples arrive, never over backfilled
history, so each rule's expression is run as an instant query instead, at several times: its
``standalone`` form, in which the recorded series it reads are replaced by their own
expressions. Every recorded number must equal the engine's (``EmbeddedSource(store,
semantics="2")``: ``slo.objectives.sli.error_ratio``, ``slo.objectives.burn_rate``,
``slo.objectives.quantiles``, ``slo.scaling.signals``, ``slo.cost.pool``) to 1e-9 relative, absent
exactly where the engine says ``None``, and every alert must fire exactly when the engine's
``evaluate_slo`` (or the KV / ``up`` condition) says so.

The config's SLOs cover the interpolation's edge cases: a threshold inside a bucket, on a
bucket bound, below the lowest bound (the first bucket starts at 0), above the highest finite
bound, the first bound itself; a period equal to a burn window; another period; a skipped
per-endpoint SLO.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from support.fleet import LATENCY_LE, MODEL, OTHER_MODEL, TTFT_LE
from support.prometheus import PrometheusServer, PromSeries, prometheus_fixture
from support.same_numbers import assert_same_numbers

from alerts.rules.pipeline import Rule, generate
from collector.store import Store
from slo.cost.pool import pool_cost
from slo.objectives.burn_rate import (
    SloReport,
    budget_remaining,
    burn_rate,
    evaluate_slo,
    slo_burn_alerts,
)
from slo.objectives.quantiles import model_quantiles, quantile_key
from slo.objectives.sli import error_ratio
from slo.objectives.spec import SloSpec
from slo.scaling.signals import kv_usage_at, queue_length_at
from slo.sources.embedded import EmbeddedSource
from slo.sources.protocol import Source
from vigil.config import BurnRateAlert, Config, parse_config
from vigil.model import Labels, SeriesKey, labels_of

pytestmark = pytest.mark.slow

SEED = 20261130
T0_MS = 1_760_000_000_000  # fixed, so every run builds identical blocks
SPAN_MS = 7 * 3600 * 1000
REASONS = ("stop", "length", "abort", "error", "repetition")

# An SLO on "availability" warns that it counts requests now (replica_up: the old figure).
_AVAILABILITY_CHANGED = pytest.warns(DeprecationWarning, match="replica_up")
with _AVAILABILITY_CHANGED:
    CONFIG = parse_config({
        "pools": [
            {"name": "chat", "model": MODEL},
            {"name": "batch", "model": OTHER_MODEL, "gpu": "L40S", "gpus_per_replica": 2},
        ],
        "targets": [
            {"name": "chat-0", "url": "http://127.0.0.1:9/metrics", "pool": "chat"},
            {"name": "chat-1", "url": "http://127.0.0.1:10/metrics", "pool": "chat"},
            {"name": "batch-0", "url": "http://127.0.0.1:11/metrics", "pool": "batch"},
        ],
        "engine": {"promql_semantics": "2"},
        "slos": [
            {"name": "chat-ttft", "pool": "chat", "indicator": "ttft"},  # 0.8 in (0.75, 1.0]
            {"name": "chat-ttft-bound", "pool": "chat", "indicator": "ttft",
             "threshold_seconds": 1.0, "objective": 0.9},
            {"name": "chat-ttft-low", "pool": "chat", "indicator": "ttft",
             "threshold_seconds": 0.0004, "objective": 0.5},
            {"name": "chat-ttft-high", "pool": "chat", "indicator": "ttft",
             "threshold_seconds": 3000.0},
            {"name": "chat-e2e", "pool": "chat", "indicator": "e2e"},  # 8 in (5, 10]
            {"name": "chat-e2e-first", "pool": "chat", "indicator": "e2e",
             "threshold_seconds": 0.3},
            {"name": "chat-e2e-low", "pool": "chat", "indicator": "e2e",
             "threshold_seconds": 0.1, "objective": 0.2},
            {"name": "chat-error-rate", "pool": "chat", "indicator": "error_rate",
             "period": "3d"},
            {"name": "chat-availability", "pool": "chat", "indicator": "availability"},
            {"name": "chat-replica-up", "pool": "chat", "indicator": "replica_up"},
            {"name": "chat-completions-ttft", "pool": "chat", "indicator": "ttft",
             "endpoint": "completions"},
            {"name": "batch-ttft", "pool": "batch", "indicator": "ttft", "period": "7d"},
            {"name": "batch-error-rate", "pool": "batch", "indicator": "error_rate",
             "objective": 0.99},
            {"name": "batch-availability", "pool": "batch", "indicator": "availability"},
        ],
    })
RESULT = generate(CONFIG)


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
        t += 60_000 + int(rng.integers(-8_000, 8_001)) + (gap_ms if len(out) == gap_at else 0)
    return out


def _histogram(data: Data, rng: np.random.Generator, base: str, labels: dict[str, str],
               bounds: list[str], times: list[int], reset_at: int | None,
               idle: range) -> None:
    n = len(times)
    # Per-scrape increments per bucket, heavier in the middle buckets, cumulative over le.
    lam = np.array([0.2 + 2.0 * math.exp(-((j - len(bounds) / 2.5) ** 2) / 8)
                    for j in range(len(bounds))])
    incs = rng.poisson(lam, size=(n, len(bounds))).astype(float)
    incs[list(idle)] = 0.0
    per_le = np.cumsum(incs, axis=1)
    running = np.zeros(len(bounds))
    cumulative = []
    for i in range(n):
        running = per_le[i].copy() if i == reset_at else running + per_le[i]
        cumulative.append(running.copy())
    for j, le in enumerate(bounds):
        data.add(base + "_bucket", {**labels, "le": le}, "histogram", times,
                 [float(c[j]) for c in cumulative])


def build() -> Data:
    rng = np.random.default_rng(SEED)
    http_rng = np.random.default_rng(SEED + 1)
    data = Data()
    end = T0_MS + SPAN_MS
    # (instance, pool, model, first scrape, gap at scrape, gap ms, counter reset at, idle, down)
    replicas = [
        ("chat-0", "chat", MODEL, T0_MS + 1_111, None, 0, 140, range(0), range(200, 220)),
        ("chat-1", "chat", MODEL, T0_MS + 2 * 3600_000 + 777, 60, 600_000, None, range(0),
         range(0)),
        ("batch-0", "batch", OTHER_MODEL, T0_MS + 30_303, None, 0, None, range(300, 345),
         range(0)),
    ]
    for instance, pool, model, start, gap_at, gap_ms, reset_at, idle, down in replicas:
        times = _times(rng, start, end, gap_at, gap_ms)
        n = len(times)
        target = {"instance": instance, "pool": pool, "kind": "vllm"}
        labels = {**target, "engine": "0", "model_name": model}
        data.add("up", target, "gauge", times, [0.0 if i in down else 1.0 for i in range(n)])
        data.add("vllm:kv_cache_usage_perc", labels, "gauge", times,
                 [float(round(rng.uniform(0.5, 1.0), 4)) for _ in range(n)])
        data.add("vllm:num_requests_waiting", labels, "gauge", times,
                 [float(rng.integers(0, 30)) for _ in range(n)])
        for reason in REASONS:
            mean = {"stop": 20.0, "error": 0.7}.get(reason, 1.5)
            values, v = [], 9.0
            for i in range(n):
                step = 0.0 if i in idle else float(rng.poisson(mean))
                v = step if i == reset_at else v + step
                values.append(v)
            data.add("vllm:request_success_total", {**labels, "finished_reason": reason},
                     "counter", times, values)
        if pool == "chat":
            # vLLM's API server; batch-0 exposes none (an older vLLM): availability absent,
            # error_rate the finished-requests ratio. chat-1 does not group its statuses.
            # Its own generator: every other series stays as it was. 5xx fewer than the
            # finished errors on average, more in some windows: both sides of max(E, H).
            statuses = {"2xx": 20.0, "4xx": 0.5, "5xx": 0.3} if instance == "chat-0" \
                else {"200": 20.0, "500": 0.6, "503": 0.4}
            for status, mean in statuses.items():
                values, v = [], 3.0
                for i in range(n):
                    step = 0.0 if i in idle else float(http_rng.poisson(mean))
                    v = step if i == reset_at else v + step
                    values.append(v)
                data.add("http_requests_total", {**target, "handler": "/v1/chat/completions",
                                                 "method": "POST", "status": status},
                         "counter", times, values)
        _histogram(data, rng, "vllm:time_to_first_token_seconds", labels, TTFT_LE, times,
                   reset_at, idle)
        _histogram(data, rng, "vllm:e2e_request_latency_seconds", labels, LATENCY_LE, times,
                   reset_at, idle)
        if instance == "chat-0":
            # On a sample, one 5m window after one, right after the restart, while down.
            data.times_s += [times[90] / 1000, times[100] / 1000 + 300,
                             times[reset_at + 2] / 1000 if reset_at else 0.0,
                             times[210] / 1000]
        if instance == "batch-0":
            data.times_s += [times[330] / 1000]  # idle: 5m and 30m windows have no requests
    data.times_s += [end / 1000 - 7.5, (T0_MS + 2 * 3600_000 + 120_000) / 1000]
    data.times_s = sorted(set(data.times_s))
    return data


DATA = build()
prom = prometheus_fixture(lambda: DATA.prom)


def _spec(name: str) -> SloSpec:
    return next(s for s in RESULT.validated.specs if s.name == name)


class Engine:
    """The embedded engine's answer to each rule, cached per (what, time)."""

    def __init__(self, config: Config, source: Source) -> None:
        self.config = config
        self.source = source
        self._ratios: dict[tuple[str, float, float], float | None] = {}
        self._reports: dict[tuple[str, float], SloReport] = {}

    def report(self, spec: SloSpec, at: float) -> SloReport:
        key = (spec.name, at)
        if key not in self._reports:
            self._reports[key] = evaluate_slo(spec, self.source, at,
                                              self.config.engine.burn_rate_alerts)
        return self._reports[key]

    def ratio(self, spec: SloSpec, at: float, window: float) -> float | None:
        key = (spec.name, at, window)
        if key not in self._ratios:
            self._ratios[key] = error_ratio(spec, self.source, at, window).error_ratio
        return self._ratios[key]

    def recorded(self, rule: Rule, at: float) -> dict[str, float | None]:
        """Per model (``""`` for a per-SLO or per-pool number), the value the rule records."""
        o = rule.origin
        if o.slo:
            spec = _spec(o.slo)
            values = {
                "objective": lambda: spec.objective,
                "error_budget": lambda: 1.0 - spec.objective,
                "time_period_days": lambda: spec.period_s / 86400,
                "spec_info": lambda: 1.0,
                "sli_error": lambda: self.ratio(spec, at, o.window_s),
                "current_burn_rate": lambda: burn_rate(self.ratio(spec, at, o.window_s),
                                                       spec.objective),
                "period_burn_rate": lambda: burn_rate(self.ratio(spec, at, spec.period_s),
                                                      spec.objective),
                "period_budget_remaining": lambda: budget_remaining(
                    self.ratio(spec, at, spec.period_s), spec.objective),
            }
            return {"": values[o.kind]()}
        pool = self.config.pool(o.pool)
        if o.kind == "quantile":
            models = model_quantiles(self.source, pool.name, at, o.window_s)
            return {m: q["quantiles"][o.signal][quantile_key(o.quantile)]
                    for m, q in models.items()}
        if o.kind in ("kv_avg", "kv_max"):
            kv = kv_usage_at(self.source, pool, at)
            return {"": None if kv is None else kv[0 if o.kind == "kv_avg" else 1]}
        if o.kind == "queue":
            return {"": queue_length_at(self.source, pool, at)}
        cost = pool_cost(self.source, self.config, pool, at, o.window_s)
        return {"": cost["cost_usd" if o.kind == "gpu_cost" else "per_1000_requests"]}

    def fires(self, rule: Rule, at: float) -> set[str]:
        """The instances (``""`` for an SLO alert) for which the alert's condition holds."""
        o = rule.origin
        if o.kind == "watchdog":
            return {""}  # always
        if o.kind == "evaluation_stale":
            return set()  # no vigil serve in this history: nothing to be stale
        if o.slo:
            spec = _spec(o.slo)
            report = self.report(spec, at)
            if o.kind == "burn_alert":
                return {""} if o.severity in report.alerts else set()
            left = report.budget_remaining
            low = self.config.alerts.budget_low_ratio
            return {""} if left is not None and left < low else set()
        pool = self.config.pool(o.pool)
        m = {"pool": pool.name, "kind": "vllm"}
        if o.kind == "kv_high":
            per: dict[str, list[float]] = {}
            for labels, v in self.source.instant("vllm:kv_cache_usage_perc", m, at).items():
                per.setdefault(dict(labels)["instance"], []).append(v)
            limit = self.config.alerts.kv_usage_high
            return {i for i, vs in per.items() if sum(vs) / len(vs) > limit}
        ups = self.source.instant("up", {"pool": pool.name}, at)
        return {dict(labels)["instance"] for labels, v in ups.items() if v == 0}


class Memo:
    """``EmbeddedSource`` with each distinct query answered once: seven latency SLOs read the
    same two histograms, and the engine's answers are what is being compared, not its speed."""

    def __init__(self, inner: EmbeddedSource) -> None:
        self.inner = inner
        self.semantics = inner.semantics
        self._cache: dict[tuple[object, ...], object] = {}

    def _memo(self, method: str, metric: str, matchers: Mapping[str, str],
              *args: object) -> Any:
        key = (method, metric, tuple(sorted(matchers.items())), *args)
        if key not in self._cache:
            self._cache[key] = getattr(self.inner, method)(metric, matchers, *args)
        return self._cache[key]

    def increase(self, metric: str, matchers: Mapping[str, str], at_s: float, window_s: float,
                 by: Sequence[str] = ()) -> Any:
        return self._memo("increase", metric, matchers, at_s, window_s, tuple(by))

    def bucket_increase(self, metric: str, matchers: Mapping[str, str], at_s: float,
                        window_s: float, by: Sequence[str] = ()) -> Any:
        return self._memo("bucket_increase", metric, matchers, at_s, window_s, tuple(by))

    def instant(self, metric: str, matchers: Mapping[str, str], at_s: float) -> Any:
        return self._memo("instant", metric, matchers, at_s)

    def avg_over_time(self, metric: str, matchers: Mapping[str, str], at_s: float,
                      window_s: float) -> Any:
        return self._memo("avg_over_time", metric, matchers, at_s, window_s)

    def samples(self, metric: str, matchers: Mapping[str, str], at_s: float,
                range_s: float) -> Any:
        return self._memo("samples", metric, matchers, at_s, range_s)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with Store(tmp_path_factory.mktemp("rules-vs-prom") / "vigil.db") as store:
        store.write(DATA.rows)
        yield Engine(CONFIG, Memo(EmbeddedSource(store, semantics="2")))


def _model(labels: Labels) -> str:
    return dict(labels).get("model_name", "")


def test_the_config_exercises_every_rule_kind() -> None:
    kinds = {r.origin.kind for r in RESULT.rules()}
    assert kinds == {
        "sli_error", "objective", "error_budget", "time_period_days", "current_burn_rate",
        "period_burn_rate", "period_budget_remaining", "spec_info", "quantile", "kv_avg", "kv_max",
        "queue",
        "gpu_cost", "gpu_cost_per_1000", "burn_alert", "budget_low", "kv_high", "target_down",
        "watchdog", "evaluation_stale",
    }
    assert [name for name, _ in RESULT.validated.skipped] == ["chat-completions-ttft"]
    assert len(DATA.times_s) >= 7


def test_recorded_values_equal_the_engine(prom: PrometheusServer, engine: Engine) -> None:
    compared = absent = 0
    for rule in (r for r in RESULT.rules() if r.record):
        for at in DATA.times_s:
            theirs = {_model(k): v for k, v in prom.query(rule.standalone, at).items()}
            ours = {m: v for m, v in engine.recorded(rule, at).items() if v is not None}
            what = f"{rule.record}{rule.labels} at {at}"
            if rule.origin.kind != "quantile":  # one series (its labels: the next test)
                assert len(theirs) <= 1, what
                theirs = dict.fromkeys([""], *theirs.values()) if theirs else {}
            assert_same_numbers(theirs, ours, what)
            compared += len(ours)
            absent += not ours
    # Both "there is a number" and "there is none" happen, for each kind of data.
    assert compared > 1000 and absent > 10


def test_recorded_series_carry_the_rule_labels(prom: PrometheusServer) -> None:
    at = DATA.times_s[-1]
    for rule in (r for r in RESULT.rules() if r.record):
        for labels in prom.query(rule.standalone, at):
            got = dict(labels)
            # The expression's own labels never contradict the rule's static ones...
            assert all(got[k] == v for k, v in rule.labels.items() if k in got), rule.record
            # ... and a per-SLO series knows its model even where `up` has none.
            if rule.origin.slo:
                assert set(got) <= {"pool", "model_name"}


def test_alerts_fire_exactly_when_the_engine_says(prom: PrometheusServer,
                                                  engine: Engine) -> None:
    fired = quiet = 0
    for rule in (r for r in RESULT.rules() if r.alert):
        for at in DATA.times_s:
            got = prom.query(rule.standalone, at)
            instances = {dict(k).get("instance", "") for k in got}
            if rule.origin.slo:
                instances = {""} if got else set()
            if rule.origin.kind == "target_down" and rule.origin.instance:
                want = engine.fires(rule, at) & {rule.origin.instance}
            else:
                want = engine.fires(rule, at)
            assert instances == want, (rule.alert, rule.labels, at)
            fired += bool(want)
            quiet += not want
    assert fired > 20 and quiet > 20


def test_burn_alerts_of_other_periods_use_their_own_factors(prom: PrometheusServer,
                                                            engine: Engine) -> None:
    """The 3-day and the 7-day SLO page at their own factors (0.02 × 72 = 1.44 and 0.02 × 168 =
    3.36 over 1h), on Prometheus as in the engine, and that decides: at several times a
    30-day SLO's factors (14.4, 6) would not page."""
    thirty_day = [
        BurnRateAlert(severity=a.severity, factor=r.factor, long_window=a.long_window,
                      short_window=a.short_window)
        for a, r in zip(CONFIG.engine.burn_rate_alerts,
                        slo_burn_alerts(CONFIG.engine.burn_rate_alerts, 30 * 86400.0),
                        strict=True)]
    decided = 0
    for name, page_1h in (("chat-error-rate", "1.44"), ("batch-ttft", "3.36")):
        spec = _spec(name)
        (page,) = [r for r in RESULT.rules() if r.alert and r.origin.kind == "burn_alert"
                   and r.origin.slo == name and r.origin.severity == "page"]
        assert f"ratio_rate1h{{slo=\"{name}\"}} / (1 - {spec.objective}) > {page_1h}\n" \
            in page.expr
        for at in DATA.times_s:
            fires = bool(prom.query(page.standalone, at))
            assert fires == ("page" in engine.report(spec, at).alerts), (name, at)
            decided += fires and "page" not in evaluate_slo(spec, engine.source, at,
                                                            thirty_day).alerts
    assert decided >= 3
