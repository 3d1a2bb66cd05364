"""Seeded data for the dashboard's tests: a store with every series the pages read, a config
naming it, and gateway records written by the gateway's own ``RecordWriter``.

The story, over ``SPAN_S`` ending at ``AT``:

* pool ``chat`` (2 replicas of Llama on H100): load rising through the last two hours, KV-cache
  usage climbing to ~0.86 (scale-out), errors spiking in the last 40 minutes (burn-rate page),
  every ~40th step a 12,000-token generation (histogram anomaly), prefix caching and
  speculative decoding on, one DCGM target per replica;
* pool ``batch`` (1 replica of Qwen on L40S): light, steady traffic, down for 20 minutes two
  hours ago (``up`` 0, no answers), a 12,000-token generation every ~45 minutes, no
  speculative decoding and no gateway records (so its anomalies are histogram estimates).

Values need not be round: the tests compare what the dashboard shows with what `vigil slo
status --json` answers for the same store and time.
"""

from __future__ import annotations

import math
from pathlib import Path

from collector.store import Store
from serving.sim.metrics import ITERATION_TOKENS_BUCKETS
from support.fleet import (
    FINISHED_REASONS,
    ITL_LE,
    LATENCY_LE,
    MODEL,
    OTHER_MODEL,
    TOKENS_LE,
    TTFT_LE,
    Fleet,
    le_strings,
)

AT = 1_795_000_000.0
STEP_S = 30.0
#: Longer than the default 6 h view, so that its first points have a full window behind.
SPAN_S = 7 * 3600.0
ITERATION_LE = le_strings(float(b) for b in ITERATION_TOKENS_BUCKETS)
#: Pools: name -> (model, GPU, replica names).
POOLS = {"chat": (MODEL, "H100", ("chat-0", "chat-1")),
         "batch": (OTHER_MODEL, "L40S", ("batch-0",))}


def config_toml(*, targets: bool = True, extra: str = "") -> str:
    """The test config: both pools, a vLLM and a DCGM target per replica (never scraped: the
    store is seeded), every file beside the config."""
    lines = [
        '[store]\npath = "vigil.db"',
        '[collector]\nscrape_interval = "30s"\nscrape_timeout = "10s"',
        '[alerts]\noutbox_path = "vigil-alerts.db"',
        '[gateway]\nrecords_path = "vigil-gateway.db"',
    ]
    for name, (model, gpu, _) in POOLS.items():
        lines.append(f'[[pools]]\nname = "{name}"\nmodel = "{model}"\ngpu = "{gpu}"\n'
                     f"min_replicas = 1\nmax_replicas = 4")
    if targets:
        port = 9
        for pool, (_, _, replicas) in POOLS.items():
            for r in replicas:
                lines.append(f'[[targets]]\nname = "{r}"\nurl = "http://127.0.0.1:{port}/metrics"'
                             f'\npool = "{pool}"')
                lines.append(f'[[targets]]\nname = "{r}-gpu"\n'
                             f'url = "http://127.0.0.1:{port}/dcgm/metrics"\npool = "{pool}"\n'
                             'kind = "dcgm"')
    return "\n\n".join(lines) + "\n" + extra


def _load(pool: str, i: int, steps: int) -> float:
    """Requests per step: chat rises over the last two hours, batch is flat."""
    if pool == "batch":
        return 4.0
    ramp = max(0.0, (i - (steps - 240)) / 240)
    return 14.0 + 22.0 * ramp + 2.0 * math.sin(i / 17.0)


def _replica(w: Fleet, pool: str, model: str, instance: str, n: int) -> None:
    steps = w.steps
    target = {"instance": instance, "pool": pool, "kind": "vllm"}
    labels = {**target, "engine": "0", "model_name": model}
    loads = [_load(pool, i, steps) for i in range(steps)]
    down = pool == "batch" and (lambda i: steps - 280 <= i < steps - 240)
    up = [0.0 if down and down(i) else 1.0 for i in range(steps)]
    w.gauge("up", target, up)
    if pool == "chat":
        kv = [min(0.97, 0.25 + 0.017 * x + 0.04 * n) for x in loads]
    else:
        kv = [0.12 + 0.01 * math.sin(i / 9.0) for i in range(steps)]
    w.gauge("vllm:kv_cache_usage_perc", labels, kv)
    w.gauge("vllm:num_requests_waiting", labels,
            [float(max(0, round(x - 24))) for x in loads])
    w.gauge("vllm:num_requests_running", labels,
            [0.0 if i % 7 == 0 else float(round(x / 2)) for i, x in enumerate(loads)])
    served = [round(x) * u for x, u in zip(loads, up, strict=True)]
    spike = lambda i: pool == "chat" and i >= steps - 80  # noqa: E731 - the last 40 minutes
    errors = [(5.0 if spike(i) else (1.0 if i % 10 == 0 else 0.0)) if s else 0.0
              for i, s in enumerate(served)]
    reasons = {"stop": [max(0.0, s - e - 1) for s, e in zip(served, errors, strict=True)],
               "length": [1.0 if s else 0.0 for s in served],
               "abort": [1.0 if s and i % 5 == 0 else 0.0 for i, s in enumerate(served)],
               "error": errors, "repetition": [0.0] * steps}
    for reason in FINISHED_REASONS:
        w.running_total("vllm:request_success_total", {**labels, "finished_reason": reason},
                        reasons[reason])
    # vLLM's API server answers each (unstreamed) error with a 500: one request, counted once.
    for status, counts in (("2xx", [s - e for s, e in zip(served, errors, strict=True)]),
                           ("5xx", errors)):
        w.running_total("http_requests_total", {**target, "handler": "/v1/chat/completions",
                                                "method": "POST", "status": status}, counts)
    every = 40 if pool == "chat" else 90  # a rare very long generation: a token anomaly
    gen = [[150.0] * int(s) + ([12000.0] if i % every == 0 and s else [])
           for i, s in enumerate(served)]
    w.running_total("vllm:generation_tokens_total", labels, [math.fsum(g) for g in gen])
    # Latency grows with load; the batch pool is fast.
    slow = [(1.0 + 0.02 * max(0.0, x - 20)) * (0.5 if pool == "batch" else 1.0) for x in loads]
    w.observed("vllm:time_to_first_token_seconds", labels, TTFT_LE,
               [[0.05 * k] * int(s * 0.6) + [0.3 * k] * int(s * 0.3) + [0.9 * k] * (
                   int(s) - int(s * 0.6) - int(s * 0.3)) for s, k in zip(served, slow,
                                                                         strict=True)])
    w.observed("vllm:e2e_request_latency_seconds", labels, LATENCY_LE,
               [[2.0 * k] * int(s * 0.8) + [6.0 * k] * (int(s) - int(s * 0.8))
                for s, k in zip(served, slow, strict=True)])
    w.observed("vllm:request_queue_time_seconds", labels, LATENCY_LE,
               [[0.1 * k] * int(s) for s, k in zip(served, slow, strict=True)])
    w.observed("vllm:inter_token_latency_seconds", labels, ITL_LE,
               [[0.02] * int(s) for s in served])
    w.observed("vllm:request_generation_tokens", labels, TOKENS_LE, gen)
    w.observed("vllm:request_prompt_tokens", labels, TOKENS_LE,
               [[400.0] * int(s) for s in served])
    w.observed("vllm:iteration_tokens_total", labels, ITERATION_LE,
               [[16.0] * 20 + [128.0] * int(s) + [600.0] * 3 for s in served])
    w.running_total("vllm:num_preemptions_total", labels,
                    [1.0 if k > 1.2 and i % 3 == 0 else 0.0 for i, k in enumerate(slow)])
    w.running_total("vllm:prefix_cache_queries_total", labels, [400.0 * s for s in served])
    w.running_total("vllm:prefix_cache_hits_total", labels, [180.0 * s for s in served])
    if pool == "chat":
        w.running_total("vllm:spec_decode_num_draft_tokens_total", labels,
                        [300.0 * s for s in served])
        w.running_total("vllm:spec_decode_num_accepted_tokens_total", labels,
                        [210.0 * s for s in served])
    gpu = {"instance": f"{instance}-gpu", "pool": pool, "kind": "dcgm", "gpu": "0",
           "modelName": "NVIDIA H100 80GB HBM3"}
    w.gauge("up", {"instance": gpu["instance"], "pool": pool, "kind": "dcgm"}, up)
    w.gauge("DCGM_FI_PROF_SM_ACTIVE", gpu, [min(1.0, 0.2 + 0.02 * x) for x in loads])
    w.gauge("DCGM_FI_DEV_GPU_UTIL", gpu, [min(100.0, 30 + 2.0 * x) for x in loads])


def seed_store(path: Path) -> None:
    """Write the story above into a new store at ``path``."""
    with Store(path) as store:
        w = Fleet(store, span_s=SPAN_S, step_s=STEP_S, at=AT)
        for pool, (model, _, replicas) in POOLS.items():
            for n, instance in enumerate(replicas):
                _replica(w, pool, model, instance, n)
        w.flush()
        # What the collector's periodic compaction leaves: samples in the main table and the
        # counter rollup, so long windows read as they do in production.
        store.compact(now=AT + 120)


def seed_gateway(path: Path) -> int:
    """Gateway records of the last hour, written by the gateway's ``RecordWriter``: three
    tiers, cache hits with savings, error classes, and one 60,000-token request (an exact
    anomaly). Returns how many."""
    from serving.gateway.telemetry.record_writer import RecordWriter
    from vigil.storage.gateway_records import GatewayRecord

    writer = RecordWriter(path)
    writer.start()
    tiers = ("premium", "standard", "batch")
    classes = ("", "", "", "", "", "", "", "timeout", "upstream_5xx", "client_cancel")
    n = 0
    for i in range(300):
        ts = AT - 3590 + i * 12
        tier = tiers[i % 3]
        cache = "l2" if i % 11 == 0 else ""
        tokens = 60_000 if i == 150 else 200 + (i % 7) * 10
        cls = classes[i % len(classes)]
        writer.put(GatewayRecord(
            id=f"vgl-{i:032x}", start_s=ts - 2, ts_s=ts, pool="chat", model=MODEL,
            endpoint="chat" if i % 4 else "completions", tenant=f"team-{i % 5}", tier=tier,
            key_id="abcdef012345", replica="chat-0", status=200 if not cls else 504,
            stream=True, prompt_tokens=400, completion_tokens=tokens, tokens_source="usage",
            ttft_s=0.2 + (i % 9) * 0.1, e2e_s=2.0 + (i % 5), queue_s=0.0,
            error=cls in ("timeout", "upstream_5xx"), error_class=cls, cache_hit=cache,
            requested_max_tokens=None, max_tokens=512, max_tokens_decision="default",
            cost_usd=0.0 if cache else 0.0004 * (3 if tier == "premium" else 1),
            saved_usd=0.0012 if cache else 0.0, upstream_id="", batch_id="", message=""))
        n += 1
    writer.flush()
    writer.close()
    return n


def seed_dashboard(folder: Path, *, targets: bool = True, gateway: bool = False,
                   store: bool = True, extra: str = "") -> Path:
    """A config in ``folder`` with its seeded store (and gateway records); returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "vigil.toml"
    config.write_text(config_toml(targets=targets, extra=extra))
    if store:
        seed_store(folder / "vigil.db")
    if gateway:
        seed_gateway(folder / "vigil-gateway.db")
    return config
