"""A fleet's series as a Prometheus holds them, for the Grafana dashboards' queries: every family
a panel reads, in two pools labelled the two ways Vigil's rules handle.

* ``chat`` carries Vigil's labels (``pool``, ``kind``, ``instance``: what the generated scrape
  config writes): two replicas, one of them idle, and a DCGM exporter target;
* ``batch`` carries a team's Kubernetes labels only (``namespace``, ``service``, ``pod``...) and
  is chosen by its ``selector``, its replicas named by ``pod``;
* the gateway's own series (``vigil_gateway_*``) by pool, tier and endpoint.

Samples run from ``history_s`` before ``now`` up to ``now``, every ``step_s``, and nothing is
scraped: the data never changes, so a sample a rule recorded and ``vigil slo status --at`` its
timestamp see the same data. (None lies ahead of ``now``: Prometheus refuses to append the
rules' samples at times older than its newest block's end.) The windows of the rules are 30
minutes and more, so every number stays defined for many minutes after ``now``. Chat's TTFT misses
its 100 ms threshold for 9 requests of 10, so the TTFT SLO burns its budget and pages.
"""

from __future__ import annotations

import math

from support.prometheus import PromSeries

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BATCH_MODEL = "Qwen/Qwen2.5-7B-Instruct"
TTFT_LE = ("0.05", "0.1", "0.5", "1.0", "+Inf")
E2E_LE = ("0.5", "1.0", "5.0", "10.0", "+Inf")
ITL_LE = ("0.01", "0.025", "0.05", "0.1", "+Inf")
BATCH_SELECTOR = 'namespace="llm", service="batch-vllm"'

CONFIG = f"""
[collector]
scrape_interval = "5s"
scrape_timeout = "4s"

[engine]
window = "30m"

# Every window 30 minutes or longer: the data ends when the test starts, and every number stays
# defined for as long as a window still holds two samples.
[[engine.burn_rate_alerts]]
severity = "page"
budget_share = 0.02
long_window = "1h"
short_window = "30m"

[[engine.burn_rate_alerts]]
severity = "ticket"
budget_share = 0.1
long_window = "6h"
short_window = "1h"

[[pools]]
name = "chat"
model = "{MODEL}"

[[targets]]
name = "r0"
url = "http://127.0.0.1:9/metrics"
pool = "chat"

[[targets]]
name = "r1"
url = "http://127.0.0.1:9/metrics"
pool = "chat"

[[targets]]
name = "dcgm0"
url = "http://127.0.0.1:9/metrics"
pool = "chat"
kind = "dcgm"

[[pools]]
name = "batch"
model = "{BATCH_MODEL}"
gpu = "L40S"
selector = '{BATCH_SELECTOR}'
replica_label = "pod"

[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
threshold_seconds = 0.1
objective = 0.99

[[slos]]
name = "chat-errors"
pool = "chat"
indicator = "error_rate"
period = "7d"

[[slos]]
name = "batch-e2e"
pool = "batch"
indicator = "e2e"
threshold_seconds = 5.0
"""


def _replica(out: list[PromSeries], target: dict[str, str], model: str, times: list[int],
             *, ttft: list[float], e2e: list[float], running: float, errors_per_step: float
             ) -> None:
    out.append(PromSeries("up", target, [(t, 1.0) for t in times]))
    vllm = {**target, "model_name": model, "engine": "0"}

    def counter(name: str, labels: dict[str, str], per_step: float) -> None:
        out.append(PromSeries(name, labels,
                              [(t, (100 + i) * per_step) for i, t in enumerate(times)]))

    def gauge(name: str, value: float) -> None:
        out.append(PromSeries(name, vllm, [(t, value) for t in times]))

    gauge("vllm:kv_cache_usage_perc", 0.35 + running / 20)
    gauge("vllm:num_requests_waiting", 2.0)
    gauge("vllm:num_requests_running", running)
    counter("vllm:request_success_total", {**vllm, "finished_reason": "stop"}, len(ttft))
    counter("vllm:request_success_total", {**vllm, "finished_reason": "error"},
            errors_per_step)
    counter("vllm:generation_tokens_total", vllm, 120.0 * len(ttft))
    counter("vllm:prompt_tokens_total", vllm, 400.0 * len(ttft))
    counter("vllm:prefix_cache_queries_total", vllm, 400.0 * len(ttft))
    counter("vllm:prefix_cache_hits_total", vllm, 250.0 * len(ttft))
    counter("vllm:num_preemptions_total", vllm, 0.5)
    counter("vllm:spec_decode_num_draft_tokens_total", vllm, 60.0)
    counter("vllm:spec_decode_num_accepted_tokens_total", vllm, 42.0)
    itl = [0.02] * 8 + [0.06] * 2
    for base, bounds, observed in (("vllm:time_to_first_token_seconds", TTFT_LE, ttft),
                                   ("vllm:e2e_request_latency_seconds", E2E_LE, e2e),
                                   ("vllm:inter_token_latency_seconds", ITL_LE, itl)):
        for le in bounds:
            counter(base + "_bucket", {**vllm, "le": le},
                    sum(1 for v in observed if v <= float(le)))
        counter(base + "_sum", vllm, math.fsum(observed))
        counter(base + "_count", vllm, len(observed))


def fleet_series(now_s: int, *, step_s: int = 5, history_s: int = 30 * 60
                 ) -> list[PromSeries]:
    """Both pools' and the gateway's series, every ``step_s`` from ``now - history_s`` to
    ``now``."""
    times = list(range((now_s - history_s) * 1000, now_s * 1000 + 1, step_s * 1000))
    out: list[PromSeries] = []
    slow_ttft = [0.3] * 9 + [0.04]  # 9 of 10 requests over chat's 100 ms
    for name, running in (("r0", 4.0), ("r1", 0.0)):
        _replica(out, {"instance": name, "pool": "chat", "kind": "vllm"}, MODEL, times,
                 ttft=slow_ttft, e2e=[2.0] * 10, running=running, errors_per_step=0.2)
    dcgm = {"instance": "dcgm0", "pool": "chat", "kind": "dcgm"}
    out.append(PromSeries("up", dcgm, [(t, 1.0) for t in times]))
    for gpu in ("0", "1"):
        out.append(PromSeries("DCGM_FI_PROF_SM_ACTIVE", {**dcgm, "gpu": gpu,
                                                          "UUID": f"GPU-{gpu}"},
                              [(t, 0.5 + 0.2 * int(gpu)) for t in times]))
    for n, running in enumerate((3.0, 1.0)):
        pod = f"batch-vllm-{n}"
        k8s = {"namespace": "llm", "service": "batch-vllm", "pod": pod, "job": "llm/batch-vllm",
               "container": "vllm", "endpoint": "http", "instance": f"10.0.3.{10 + n}:8000"}
        _replica(out, k8s, BATCH_MODEL, times, ttft=[0.04] * 10, e2e=[3.0] * 9 + [6.0],
                 running=running, errors_per_step=0.0)
    gateway = {"job": "vigil-gateway", "instance": "gw-0"}
    for pool, tier, endpoint, per_step, usd in (
            ("chat", "premium", "chat", 6.0, 0.004), ("chat", "standard", "completions", 3.0,
                                                        0.003),
            ("batch", "batch", "chat", 2.0, 0.002)):
        labels = {**gateway, "pool": pool, "tier": tier}
        out.append(PromSeries("vigil_gateway_requests_total",
                              {**labels, "endpoint": endpoint, "status": "200"},
                              [(t, (100 + i) * per_step) for i, t in enumerate(times)]))
        out.append(PromSeries("vigil_gateway_cost_usd_total", labels,
                              [(t, (100 + i) * per_step * usd) for i, t in enumerate(times)]))
    return out
