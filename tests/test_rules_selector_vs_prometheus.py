"""The rules of a pool chosen by a selector, evaluated by a real Prometheus over series that
carry only Kubernetes labels, record what the engine reports reading that same Prometheus.

The series are what kube-prometheus-stack's ServiceMonitor stores for a vLLM Deployment:
``namespace``, ``service``, ``pod``, ``job``, ``instance`` (the pod's address), ``container``,
``endpoint`` and vLLM's own labels; no ``pool``, no ``kind``. Pod ``chat-vllm-a`` serves all
along, ``chat-vllm-b`` starts later and is down for a stretch, and a pod of the same service in
another namespace (outside the selector) must change no number. Each rule's ``standalone``
expression is run as an instant query at several times and compared with the engine over
``PrometheusSource`` (``semantics="2"``, Prometheus 2.42): ``slo.objectives.sli.error_ratio``,
``slo.objectives.burn_rate``, ``slo.objectives.quantiles``, ``slo.scaling.signals``,
``slo.cost.pool``, to 1e-9 relative, absent exactly where the engine says ``None``. Scrapes are
exactly ``[collector] scrape_interval`` apart, the interval the cost rules bill a selector's samples
for.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from support.fleet import LATENCY_LE, MODEL, TTFT_LE
from support.prometheus import PrometheusServer, PromSeries, prometheus_fixture
from support.same_numbers import assert_same_numbers

from alerts.rules.pipeline import Rule, generate
from slo.cost.pool import pool_cost
from slo.objectives.burn_rate import budget_remaining, burn_rate, evaluate_slo
from slo.objectives.quantiles import model_quantiles, quantile_key
from slo.objectives.sli import error_ratio
from slo.objectives.spec import SloSpec
from slo.scaling.signals import kv_usage_at, queue_length_at
from slo.sources.prometheus import PrometheusSource
from vigil.config import parse_config

pytestmark = pytest.mark.slow

SEED = 20261201
T0_MS = 1_760_000_000_000
SPAN_MS = 4 * 3600 * 1000
STEP_MS = 60_000
REASONS = ("stop", "length", "abort", "error")
SELECTOR = 'namespace="llm", service=~"chat-vllm|chat-vllm-canary"'

with pytest.warns(DeprecationWarning, match="replica_up"):
    CONFIG = parse_config({
        "collector": {"scrape_interval": "60s", "scrape_timeout": "10s"},
        "pools": [{"name": "chat", "model": MODEL, "selector": SELECTOR,
                   "replica_label": "pod", "gpus_per_replica": 2}],
        "engine": {"promql_semantics": "2"},
        "slos": [
            {"name": "chat-ttft", "pool": "chat", "indicator": "ttft"},
            {"name": "chat-e2e", "pool": "chat", "indicator": "e2e"},
            {"name": "chat-errors", "pool": "chat", "indicator": "error_rate", "period": "3d"},
            {"name": "chat-availability", "pool": "chat", "indicator": "availability"},
            {"name": "chat-up", "pool": "chat", "indicator": "replica_up"},
        ],
    })
POOL = CONFIG.pools[0]
RESULT = generate(CONFIG)


def _series() -> tuple[list[PromSeries], list[float]]:
    rng = np.random.default_rng(SEED)
    out: list[PromSeries] = []
    end = T0_MS + SPAN_MS
    # (namespace, pod, address, first scrape, down scrapes)
    pods = [("llm", "chat-vllm-a", "10.1.0.5:8000", T0_MS + 1_000, range(0)),
            ("llm", "chat-vllm-b", "10.1.0.6:8000", T0_MS + 3600_000 + 2_000, range(40, 60)),
            ("staging", "chat-vllm-s", "10.9.0.1:8000", T0_MS + 3_000, range(0))]
    for namespace, pod, address, start, down in pods:
        times = list(range(start, end, STEP_MS))
        n = len(times)
        target = {"namespace": namespace, "service": "chat-vllm", "pod": pod,
                  "job": "chat-vllm", "instance": address, "container": "vllm",
                  "endpoint": "http"}
        labels = {**target, "engine": "0", "model_name": MODEL}

        def add(name: str, extra: dict[str, str], values: list[float],
                times: list[int] = times) -> None:
            out.append(PromSeries(name, extra, list(zip(times, values, strict=True))))

        add("up", target, [0.0 if i in down else 1.0 for i in range(n)])
        add("vllm:kv_cache_usage_perc", labels,
            [float(round(rng.uniform(0.6, 1.0), 4)) for _ in range(n)])
        add("vllm:num_requests_waiting", labels, [float(rng.integers(0, 20)) for _ in range(n)])
        for reason in REASONS:
            steps = rng.poisson({"stop": 20.0, "error": 0.5}.get(reason, 1.0), n)
            add("vllm:request_success_total", {**labels, "finished_reason": reason},
                [float(v) for v in np.cumsum(steps)])
        for status, mean in (("200", 20.0), ("500", 0.4)):
            add("http_requests_total", {**target, "handler": "/v1/chat/completions",
                                        "method": "POST", "status": status},
                [float(v) for v in np.cumsum(rng.poisson(mean, n))])
        for base, bounds in (("vllm:time_to_first_token_seconds", TTFT_LE),
                             ("vllm:e2e_request_latency_seconds", LATENCY_LE)):
            incs = rng.poisson(1.5, size=(n, len(bounds))).astype(float)
            cumulative = np.cumsum(np.cumsum(incs, axis=1), axis=0)
            for j, le in enumerate(bounds):
                add(base + "_bucket", {**labels, "le": le}, [float(c) for c in cumulative[:, j]])
    # After one scrape (no range has two samples), before the second pod, while it is down,
    # after it is back, at the end.
    times_s = [(T0_MS + k) / 1000 for k in (30_000, 1800_500, 3600_000 + 45 * 60_000 + 30_500,
                                            3600_000 + 75 * 60_000 + 10_000, SPAN_MS - 7_500)]
    return out, times_s


SERIES, TIMES_S = _series()
prom = prometheus_fixture(lambda: SERIES)


@pytest.fixture(scope="module")
def source(prom: PrometheusServer) -> Iterator[PrometheusSource]:
    with PrometheusSource(prom.base_url, semantics="2",
                          lookback_s=CONFIG.engine.lookback) as src:
        yield src


def _spec(name: str) -> SloSpec:
    return next(s for s in RESULT.validated.specs if s.name == name)


def _engine(rule: Rule, src: PrometheusSource, at: float) -> dict[str, float | None]:
    """Per model (``""`` for one number), what the engine reports for ``rule``."""
    o = rule.origin
    if o.slo:
        spec = _spec(o.slo)
        assert o.window_s is not None or o.kind in ("objective", "error_budget", "spec_info")
        window = spec.period_s if o.kind.startswith("period_") else o.window_s
        ratio = (lambda: error_ratio(spec, src, at, window).error_ratio)  # noqa: E731
        values = {
            "objective": lambda: spec.objective,
            "error_budget": lambda: 1.0 - spec.objective,
            "time_period_days": lambda: spec.period_s / 86400,
            "spec_info": lambda: 1.0,
            "sli_error": ratio,
            "current_burn_rate": lambda: burn_rate(ratio(), spec.objective),
            "period_burn_rate": lambda: burn_rate(ratio(), spec.objective),
            "period_budget_remaining": lambda: budget_remaining(ratio(), spec.objective),
        }
        return {"": values[o.kind]()}
    if o.kind == "quantile":
        assert o.window_s is not None and o.quantile is not None
        models = model_quantiles(src, POOL, at, o.window_s)
        return {m: q["quantiles"][o.signal][quantile_key(o.quantile)] for m, q in models.items()}
    if o.kind in ("kv_avg", "kv_max"):
        kv = kv_usage_at(src, POOL, at)
        return {"": None if kv is None else kv[0 if o.kind == "kv_avg" else 1]}
    if o.kind == "queue":
        return {"": queue_length_at(src, POOL, at)}
    cost = pool_cost(src, CONFIG, POOL, at, o.window_s)
    return {"": cost["cost_usd" if o.kind == "gpu_cost" else "per_1000_requests"]}


def test_the_rules_read_no_vigil_label() -> None:
    for rule in RESULT.rules():
        if not rule.origin.pool and not rule.origin.slo:
            continue  # the dead-man's switch watches vigil serve, not a pool
        assert 'pool="chat", kind=' not in rule.standalone, rule.name
        assert rule.labels["pool"] == "chat"


def test_recorded_values_equal_the_engine(prom: PrometheusServer,
                                          source: PrometheusSource) -> None:
    compared = absent = 0
    for rule in (r for r in RESULT.rules() if r.record):
        for at in TIMES_S:
            got = prom.query(rule.standalone, at)
            for labels in got:
                assert "pool" not in dict(labels), rule.record  # the rule's labels add it
            theirs = {dict(k).get("model_name", "") if rule.origin.kind == "quantile" else "": v
                      for k, v in got.items()}
            assert len(theirs) == len(got), (rule.record, got)
            ours = {k: v for k, v in _engine(rule, source, at).items()
                    if v is not None and math.isfinite(v)}
            what = f"{rule.record}{rule.labels} at {at}"
            assert_same_numbers(theirs, ours, what)
            compared += len(ours)
            absent += not ours
    assert compared > 200 and absent > 0


def test_alerts_fire_exactly_when_the_engine_says(prom: PrometheusServer,
                                                  source: PrometheusSource) -> None:
    fired = quiet = 0
    selector = POOL.series("vllm", external=True)
    for rule in (r for r in RESULT.rules() if r.alert):
        for at in TIMES_S:
            got = {dict(k).get("pod", "") for k in prom.query(rule.standalone, at)}
            o = rule.origin
            if o.kind in ("watchdog", "evaluation_stale"):
                # Always firing; and no vigil serve here, so never stale.
                assert got == ({""} if o.kind == "watchdog" else set()), (rule.alert, at)
                continue
            if o.slo:
                report = evaluate_slo(_spec(o.slo), source, at, CONFIG.engine.burn_rate_alerts)
                if o.kind == "burn_alert":
                    fires = o.severity in report.alerts
                else:
                    left = report.budget_remaining
                    fires = left is not None and left < CONFIG.alerts.budget_low_ratio
                want = {""} if fires else set()
                got = {""} if got else set()
            elif o.kind == "kv_high":
                per: dict[str, list[float]] = {}
                for labels, v in source.instant("vllm:kv_cache_usage_perc", selector,
                                                at).items():
                    per.setdefault(dict(labels)["pod"], []).append(v)
                want = {p for p, vs in per.items()
                        if sum(vs) / len(vs) > CONFIG.alerts.kv_usage_high}
            else:
                want = {dict(labels)["pod"] for labels, v in
                        source.instant("up", selector, at).items() if v == 0}
            assert got == want, (rule.alert, o.kind, at)
            assert "chat-vllm-s" not in got  # the other namespace is not the pool's
            fired += bool(want)
            quiet += not want
    assert fired > 3 and quiet > 3
