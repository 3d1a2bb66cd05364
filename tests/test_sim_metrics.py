"""The simulator's /metrics and DCGM expositions: faithful to the fixtures, consistent, monotone."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serving.sim.dcgm import GpuActivity
from serving.sim.testing import invariant_violations, running_fleet, sample_values, total
from slo.planning.replica.profiles import Profile, get_profile
from vigil.clock import ManualClock

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SYSTEM = "You are a support assistant for a GPU cloud. Answer briefly and precisely. " * 6

#: A fast, cramped replica: 1536 KV tokens and 16 sequences, so a burst of 40 requests queues,
#: fills the cache and preempts within a second or two.
TINY = Profile(name="tiny", num_gpu_blocks=96, max_num_seqs=16, max_num_batched_tokens=512,
               max_model_len=1024, prefill_tokens_per_s=100_000.0, decode_base_s=0.002,
               decode_per_seq_s=0.0001)


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def label_names(fam: object) -> set[frozenset[str]]:
    return {frozenset(k for k in s.labels if k not in ("le", "quantile"))
            for s in fam.samples}  # type: ignore[attr-defined]


def buckets(fam: object) -> list[float]:
    return sorted({float(s.labels["le"]) for s in fam.samples  # type: ignore[attr-defined]
                   if "le" in s.labels})


# --- the exposition against the vLLM 0.33 fixture ----------------------------------------------


def test_metrics_match_the_vllm_fixture():
    expected = families((FIXTURES / "vllm_v1_metrics_sample.txt").read_text())
    with running_fleet(1, profile="h100-llama3.1-8b", spec_decode=3, enable_lora=True,
                       max_loras=4, lora_modules=("sql-lora",)) as fleet:
        base = fleet.base_urls[0]
        r = httpx.post(base + "/v1/completions",
                       json={"model": MODEL, "prompt": "hello", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200
        resp = httpx.get(fleet.metrics_urls[0], timeout=10)
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    got = families(resp.text)
    assert set(got) == set(expected)
    for name, want in expected.items():
        have = got[name]
        assert have.type == want.type, name  # type: ignore[attr-defined]
        assert have.documentation == want.documentation, name  # type: ignore[attr-defined]
        if name == "vllm:lora_requests_info" or want.samples:  # type: ignore[attr-defined]
            assert label_names(have) == label_names(want), name
        assert buckets(have) == buckets(want), name


def test_optional_families_follow_the_flags():
    with running_fleet(1) as fleet:
        text = httpx.get(fleet.metrics_urls[0], timeout=10).text
    names = set(families(text))
    assert not any(n.startswith("vllm:spec_decode") for n in names)
    assert "vllm:lora_requests_info" not in names
    assert "vllm:cache_config_info" in names and "process_start_time_seconds" in names
    info = next(s for s in text_string_to_metric_families(text)
                if s.name == "vllm:cache_config_info").samples[0].labels
    small = get_profile("small")
    assert info["num_gpu_blocks"] == str(small.num_gpu_blocks)
    assert info["kv_cache_size_tokens"] == str(small.kv_cache_size_tokens)
    assert "model_name" not in info and info["engine"] == "0"


def test_openmetrics_when_the_client_asks_for_it():
    with running_fleet(1) as fleet:
        om = httpx.get(fleet.metrics_urls[0], timeout=10,
                       headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")
    # prometheus_client >= 0.22 escapes ':' in OpenMetrics sample names (client_python#1177).
    assert "# TYPE vllm:request_success counter" in om.text
    assert "\nvllm_request_success_total{" in om.text


# --- invariants under real concurrent traffic ---------------------------------------------------


async def _one_request(client: httpx.AsyncClient, i: int) -> int:
    """Request ``i`` of the burst: chat or completions, streaming or not; returns tokens."""
    chat = i % 2 == 0
    stream = i % 4 < 2
    body: dict[str, object] = {"model": MODEL, "max_tokens": 80 + i % 60, "seed": i,
                               "ignore_eos": i % 3 == 0, "priority": i % 3}
    if chat:
        body["messages"] = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": f"Question {i}: why is my TTFT high?"}]
    else:
        body["prompt"] = SYSTEM + f"Q{i}: " + "explain the KV cache " * (i % 7)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if not stream:
        r = await client.post(path, json=body)
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["completion_tokens"])
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    used = 0
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                used = json.loads(line[6:])["usage"]["completion_tokens"]
    return used


async def _burst(base: str, n: int) -> tuple[list[str], str, list[int]]:
    """A burst of ``n`` requests plus one long anchor; scrapes while the anchor runs."""
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        first_chunk = asyncio.Event()

        async def anchor() -> int:
            body = {"model": MODEL, "prompt": SYSTEM, "max_tokens": 500, "ignore_eos": True,
                    "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        first_chunk.set()
            return 500

        tasks = [asyncio.create_task(anchor())]
        tasks += [asyncio.create_task(_one_request(client, i)) for i in range(n)]
        await first_chunk.wait()  # the anchor is running: these scrapes are mid-burst
        mid = [(await client.get("/metrics")).text for _ in range(3)]
        tokens = await asyncio.gather(*tasks)
        after = (await client.get("/metrics")).text
    return mid, after, list(tokens)


def _monotone_violations(before: str, after: str) -> list[str]:
    kinds = {f.name: f.type for f in text_string_to_metric_families(after)}
    a, b = sample_values(before), sample_values(after)
    bad = []
    for (name, labels), value in a.items():
        family = name.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
        family = family.removesuffix("_bucket")
        if name.endswith("_created") or kinds.get(family, kinds.get(name)) not in (
                "counter", "histogram", "summary"):
            continue
        if b.get((name, labels), value) < value:
            bad.append(f"{name}{dict(labels)}: {value} -> {b[(name, labels)]}")
    return bad


def test_invariants_hold_during_and_after_a_burst():
    with running_fleet(1, profile=TINY, spec_decode=3) as fleet:
        mid, after, tokens = asyncio.run(_burst(fleet.base_urls[0], 40))
    s = sample_values(after)
    assert total(s, "vllm:request_success_total") == 41
    assert total(s, "vllm:generation_tokens_total") == sum(tokens)
    # The burst exercised what the invariants are about.
    assert total(s, "vllm:num_preemptions_total") > 0
    assert total(s, "vllm:prefix_cache_hits_total") > 0
    assert total(s, "vllm:spec_decode_num_accepted_tokens_total") > 0
    assert total(sample_values(mid[0]), "vllm:num_requests_running") >= 1
    for text in mid:
        assert invariant_violations(text) == []
    assert invariant_violations(after, at_rest=True) == []
    scrapes = [*mid, after]
    for before, later in itertools.pairwise(scrapes):
        assert _monotone_violations(before, later) == []


# --- HTTP metrics semantics -------------------------------------------------------------------


def test_http_metrics_follow_the_instrumentator():
    with running_fleet(1) as fleet:
        base = fleet.base_urls[0]
        for path in ("/health", "/version", "/metrics", "/dcgm/metrics", "/ping", "/load"):
            assert httpx.get(base + path, timeout=10).status_code == 200
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5, "stream": True}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as r:
            r.read()
        raw = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 5}).encode()
        ok = httpx.post(base + "/v1/completions", content=raw, timeout=30,
                        headers={"content-type": "application/json"})
        bad = httpx.post(base + "/v1/completions", content=b"{", timeout=10)
        assert (ok.status_code, bad.status_code) == (200, 400)
        assert httpx.get(base + "/no/such/path", timeout=10).status_code == 404
        s = sample_values(httpx.get(fleet.metrics_urls[0], timeout=10).text)
    # /health, /version, /metrics, /ping, /load and the DCGM path are excluded.
    handlers = {dict(ls)["handler"] for (n, ls), _ in s.items() if n == "http_requests_total"}
    assert handlers == {"/v1/chat/completions", "/v1/completions", "none"}
    assert total(s, "http_requests_total", handler="/v1/completions", status="2xx") == 1
    assert total(s, "http_requests_total", handler="/v1/completions", status="4xx") == 1
    assert total(s, "http_requests_total", handler="none", status="4xx", method="GET") == 1
    # A streamed response has no Content-Length: it counts 0 bytes.
    assert total(s, "http_response_size_bytes_count", handler="/v1/chat/completions") == 1
    assert total(s, "http_response_size_bytes_sum", handler="/v1/chat/completions") == 0
    assert total(s, "http_response_size_bytes_sum", handler="/v1/completions") == (
        int(ok.headers["content-length"]) + int(bad.headers["content-length"]))
    assert total(s, "http_request_size_bytes_sum", handler="/v1/completions") == len(raw) + 1
    assert total(s, "http_request_duration_seconds_count") == 4
    assert total(s, "http_request_duration_highr_seconds_count") == 4


# --- restart ----------------------------------------------------------------------------------


def test_restart_starts_counters_from_zero():
    with running_fleet(1) as fleet:
        base = fleet.base_urls[0]
        for _ in range(3):
            r = httpx.post(base + "/v1/completions", timeout=30,
                           json={"model": MODEL, "prompt": "hello", "max_tokens": 4})
            assert r.status_code == 200
        before = sample_values(httpx.get(fleet.metrics_urls[0], timeout=10).text)
        fleet.restart(0)
        after = sample_values(httpx.get(fleet.metrics_urls[0], timeout=10).text)
        r = httpx.post(base + "/v1/completions", timeout=30,
                       json={"model": MODEL, "prompt": "hello", "max_tokens": 4})
        assert r.status_code == 200
        again = sample_values(httpx.get(fleet.metrics_urls[0], timeout=10).text)
    assert total(before, "vllm:request_success_total") == 3
    assert total(after, "vllm:request_success_total") == 0
    assert total(after, "vllm:generation_tokens_total") == 0
    assert total(after, "http_requests_total") == 0
    assert total(after, "process_start_time_seconds") > total(before, "process_start_time_seconds")
    assert total(after, "vllm:request_success_created", finished_reason="stop") > total(
        before, "vllm:request_success_created", finished_reason="stop")
    assert total(again, "vllm:request_success_total") == 1


# --- LoRA -------------------------------------------------------------------------------------


def test_lora_requests_info_shows_the_running_adapter():
    with running_fleet(1, enable_lora=True, max_loras=2, lora_modules=("sql-lora",)) as fleet:
        base = fleet.base_urls[0]
        ids = [m["id"] for m in httpx.get(base + "/v1/models", timeout=10).json()["data"]]
        assert ids == [MODEL, "sql-lora"]
        body = {"model": "sql-lora", "prompt": "SELECT", "max_tokens": 2000,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()  # keep it referenced: dropping it closes the stream
            next(lines)  # the request is running now
            text = httpx.get(fleet.metrics_urls[0], timeout=10).text
    assert total(sample_values(text), "vllm:num_requests_running") == 1
    rows = [s for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info"
            for s in f.samples]
    assert {s.labels["running_lora_adapters"] for s in rows} >= {"", "sql-lora"}
    assert all(s.labels["max_lora"] == "2" for s in rows)
    assert max(s.value for s in rows) == pytest.approx(time.time(), abs=60)


# --- DCGM -------------------------------------------------------------------------------------

REQUIRED_DCGM = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                 "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE",
                 "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_TEMP",
                 "DCGM_FI_DEV_SM_CLOCK")


def test_dcgm_endpoint_matches_the_exporter_fixture():
    expected = families((FIXTURES / "dcgm_exporter_sample.txt").read_text())
    fixture_labels = set().union(*(label_names(f) for f in expected.values()))
    with running_fleet(1, profile="h100-llama3.1-8b", gpus_per_replica=2) as fleet:
        first = httpx.get(fleet.dcgm_urls[0], timeout=10).text
        r = httpx.post(fleet.base_urls[0] + "/v1/completions", timeout=30,
                       json={"model": MODEL, "prompt": "x" * 4000, "max_tokens": 50})
        assert r.status_code == 200
        second = httpx.get(fleet.dcgm_urls[0], timeout=10).text
    got = families(second)
    assert set(REQUIRED_DCGM) <= set(got)
    for name, fam in got.items():
        assert name in expected, name
        assert fam.type == expected[name].type, name  # type: ignore[attr-defined]
        assert fam.documentation == expected[name].documentation, name  # type: ignore[attr-defined]
        assert label_names(fam) == fixture_labels, name
        assert len(fam.samples) == 2  # type: ignore[attr-defined]
    lines = {ln.split("{")[0]: ln.rsplit(" ", 1)[1] for ln in second.splitlines()
             if ln and not ln.startswith("#")}
    assert "." not in lines["DCGM_FI_DEV_GPU_UTIL"]  # integers %d
    assert len(lines["DCGM_FI_DEV_POWER_USAGE"].split(".")[1]) == 6  # doubles %f
    a, b = sample_values(first), sample_values(second)
    h100 = get_profile("h100-llama3.1-8b")
    used = total(b, "DCGM_FI_DEV_FB_USED", gpu="0")
    assert used == round(h100.gpu_memory_mib * h100.gpu_memory_utilization) + 512
    assert used + total(b, "DCGM_FI_DEV_FB_FREE", gpu="0") + total(
        b, "DCGM_FI_DEV_FB_RESERVED", gpu="0") == h100.gpu_memory_mib
    energy = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"  # the parser appends _total
    assert total(b, energy, gpu="0") > total(a, energy, gpu="0")
    assert total(b, "DCGM_FI_DEV_POWER_USAGE", gpu="0") > h100.power_idle_w
    uuids = {dict(ls)["UUID"] for (n, ls), _ in b.items() if n == "DCGM_FI_DEV_GPU_UTIL"}
    assert len(uuids) == 2 and all(u.startswith("GPU-") for u in uuids)


def test_gpu_activity_follows_the_work():
    p = get_profile("h100-llama3.1-8b")
    clock = ManualClock(1000.0)

    def run(decode_seqs: int, prefill_tokens: int) -> GpuActivity:
        gpu = GpuActivity(p, "r", clock=clock)
        t = clock.now
        for _ in range(500):  # 10 s of back-to-back 20 ms steps
            gpu.record_step(t, t + 0.02, prefill_tokens=prefill_tokens, decode_seqs=decode_seqs)
            t += 0.02
        clock.now = t
        return gpu

    idle = GpuActivity(p, "r", clock=clock)
    e0 = idle.snapshot().energy_mj
    clock.advance(10.0)
    quiet = idle.snapshot()
    assert quiet.util == 0 and quiet.power_w == pytest.approx(p.power_idle_w)
    assert quiet.energy_mj - e0 == pytest.approx(p.power_idle_w * 10 * 1000, rel=1e-6)
    assert quiet.sm_clock_mhz == p.sm_clock_idle_mhz
    small, big, prefill = run(1, 0).snapshot(), run(200, 0).snapshot(), run(0, 300).snapshot()
    assert small.util > 0.99 and big.util > 0.99
    assert small.sm_active < big.sm_active < prefill.sm_active
    assert p.power_idle_w < small.power_w < big.power_w < prefill.power_w <= p.power_max_w
    assert small.temp_c < big.temp_c < prefill.temp_c
    assert GpuActivity(p, "r").uuids == GpuActivity(p, "r").uuids != GpuActivity(p, "q").uuids


def test_a_preempted_requests_readmission_is_not_a_prefix_cache_query():
    """vLLM leaves re-admissions of preempted requests out of vllm:prefix_cache_*: their own
    blocks are often still cached, which would inflate the hit rate."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from serving.sim.metrics import VllmMetrics

    registry = CollectorRegistry()
    m = VllmMetrics(registry, model_name="m", profile=TINY)
    m.on_admitted(SimpleNamespace(num_preemptions=0), 64, 32)  # type: ignore[arg-type]
    m.on_admitted(SimpleNamespace(num_preemptions=1), 64, 64)  # type: ignore[arg-type]
    labels = {"model_name": "m", "engine": "0"}
    assert registry.get_sample_value("vllm:prefix_cache_queries_total", labels) == 64
    assert registry.get_sample_value("vllm:prefix_cache_hits_total", labels) == 32


def test_custom_histogram_buckets_replace_a_familys_bounds_as_in_vllm() -> None:
    from serving.sim.server import FleetSpec, build_replicas
    from vigil.conventions import VLLM_REQUEST_LATENCY_BUCKETS, VLLM_TTFT_BUCKETS

    spec = FleetSpec(replicas=1, port=18990, max_model_len=2048,
                     custom_histogram_buckets='{"time_to_first_token": [0.1, 0.8, 2]}')
    (replica,) = build_replicas(spec)
    text = generate_latest(replica.registry).decode()
    ttft = [float(m) for m in re.findall(
        r'^vllm:time_to_first_token_seconds_bucket\{[^}]*le="([0-9.e+]+)"', text, re.M)]
    e2e = [float(m) for m in re.findall(
        r'^vllm:e2e_request_latency_seconds_bucket\{[^}]*le="([0-9.e+]+)"', text, re.M)]
    prompt = [float(m) for m in re.findall(
        r'^vllm:request_prompt_tokens_bucket\{[^}]*le="([0-9.e+]+)"', text, re.M)]
    assert ttft == [0.1, 0.8, 2.0] != list(VLLM_TTFT_BUCKETS)
    assert e2e == list(VLLM_REQUEST_LATENCY_BUCKETS)  # a family not given keeps its defaults
    assert max(prompt) == 2000.0  # 1-2-5 up to --max-model-len, as vLLM builds them


@pytest.mark.parametrize("flag, says", [
    ('{"time_to_first_tokens": [1]}', "unknown bucket family"),
    ('{"request_latency": [1, 1]}', "strictly increasing"),
    ('{"request_latency": [-1, 2]}', "positive"),
    ('[1, 2]', "JSON object"),
    ('{"request_latency": [1,', "not JSON"),
])
def test_bad_custom_histogram_buckets_are_refused_at_start(flag: str, says: str) -> None:
    from serving.sim.server import FleetSpec, build_replicas
    from vigil.errors import ConfigError

    with pytest.raises(ConfigError, match=says) as e:
        build_replicas(FleetSpec(replicas=1, port=18990, custom_histogram_buckets=flag))
    assert "--custom-histogram-buckets" in str(e.value)
