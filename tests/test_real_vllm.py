"""What Vigil claims about vLLM, checked against a real vLLM server (the CPU build, 0.32).

The launch profile that ``vigil vllm-args`` prints is accepted by the engine and puts the SLO
thresholds into its histograms; every family Vigil reads is in the engine's ``/metrics``;
Vigil's parser reads the live body as prometheus_client does; the simulator's exposition has
the engine's families, types, labels and bucket layouts, except for the differences that
``docs/simulator.md`` lists with their reason; the collector, ``vigil targets`` and ``vigil slo
status`` work on it. The server comes from ``tests/support/real_vllm.py`` (one per test session).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.exposition import assert_identical
from support.real_vllm import (  # noqa: F401
    MODEL,
    POOL,
    VLLM_VERSION,
    VllmServer,
    monitored_config,
    real_vllm,
    run_vigil,
)

from collector.exposition import parse
from collector.exposition.openmetrics import parse_openmetrics
from collector.exposition.text import parse_text
from serving.sim.testing import invariant_violations, running_fleet
from vigil.conventions import (
    VLLM_BUCKET_FAMILY_REQUEST_LATENCY,
    VLLM_BUCKET_FAMILY_TTFT,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_ITERATION_TOKENS,
    VLLM_ITL,
    VLLM_KV_CACHE_USAGE,
    VLLM_PREEMPTIONS,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
    VLLM_PROMPT_TOKENS_HIST,
    VLLM_QUEUE_TIME,
    VLLM_REQUEST_LATENCY_BUCKETS,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
    VLLM_TTFT,
    VLLM_TTFT_BUCKETS,
)

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
SIMULATOR_DOC = REPO / "docs" / "simulator.md"

#: Every vLLM family the SLO engine, the scaling policy, the cost figures and the dashboard read
#: (metric names without the ``_total`` a counter's samples carry).
FAMILIES_READ = (VLLM_TTFT, VLLM_E2E, VLLM_QUEUE_TIME, VLLM_ITL, VLLM_PROMPT_TOKENS_HIST,
                 VLLM_GENERATION_TOKENS_HIST, VLLM_REQUEST_SUCCESS, VLLM_GENERATION_TOKENS,
                 VLLM_KV_CACHE_USAGE, VLLM_REQUESTS_WAITING, VLLM_REQUESTS_RUNNING,
                 VLLM_ITERATION_TOKENS, VLLM_PREEMPTIONS, VLLM_PREFIX_CACHE_QUERIES,
                 VLLM_PREFIX_CACHE_HITS, "vllm:cache_config_info")


def _family(name: str) -> str:
    """A sample or metric name as prometheus_client names the family."""
    return name.removesuffix("_total")


def _complete(url: str, n: int = 2, max_tokens: int = 8) -> None:
    """``n`` small chat completions straight to the replica."""
    for i in range(n):
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60.0, json={
            "model": MODEL, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"request number {i} of a warm-up"}]})
        r.raise_for_status()


@pytest.fixture(scope="module")
def live(real_vllm: VllmServer) -> Iterator[str]:  # noqa: F811
    """The real server's ``/metrics`` body after a few finished requests."""
    _complete(real_vllm.url, 3)
    yield real_vllm.metrics()


# --- the launch profile ------------------------------------------------------------------


def test_the_launch_profile_starts_and_the_slo_thresholds_are_bucket_bounds(
        real_vllm: VllmServer, live: str) -> None:  # noqa: F811
    argv = real_vllm.argv
    for flag in ("--scheduling-policy", "--enable-prefix-caching",
                 "--enable-prompt-tokens-details", "--max-num-seqs",
                 "--override-generation-config", "--custom-histogram-buckets"):
        assert flag in argv, flag
    bounds = _bucket_bounds(live)
    # Vigil's default SLOs: TTFT 0.8 s and e2e 8 s, added to vLLM's own bounds, which stay.
    assert bounds[VLLM_TTFT] == sorted({*VLLM_TTFT_BUCKETS, 0.8})
    assert bounds[VLLM_E2E] == sorted({*VLLM_REQUEST_LATENCY_BUCKETS, 8.0})
    # The request-latency family is shared: queue time carries the same bounds.
    assert bounds[VLLM_QUEUE_TIME] == bounds[VLLM_E2E]
    assert VLLM_BUCKET_FAMILY_TTFT in " ".join(argv)
    assert VLLM_BUCKET_FAMILY_REQUEST_LATENCY in " ".join(argv)


# --- the collector -------------------------------------------------------------------------


def test_every_family_vigil_reads_is_present(live: str) -> None:
    names = {f.name for f in text_string_to_metric_families(live)}
    missing = [f for f in FAMILIES_READ if f not in names and _family(f) not in names]
    assert not missing, f"vLLM {VLLM_VERSION} lacks {missing}"


def test_vigils_parse_of_the_live_body_equals_prometheus_clients(
        real_vllm: VllmServer, live: str) -> None:  # noqa: F811
    assert_identical(parse_text(live), list(text_string_to_metric_families(live)))
    # What a Prometheus asks for: OpenMetrics, if the server speaks it (0.32 answers the text
    # format either way); whichever comes back, it parses as the library parses it.
    r = httpx.get(f"{real_vllm.url}/metrics", timeout=10.0,
                  headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    ours = parse(r.text, content_type=r.headers.get("content-type"))
    if r.text.rstrip().endswith("# EOF"):
        from prometheus_client.openmetrics.parser import (
            text_string_to_metric_families as library_openmetrics,
        )
        assert_identical(parse_openmetrics(r.text), list(library_openmetrics(r.text)))
    else:
        assert_identical(ours, list(text_string_to_metric_families(r.text)))


def test_the_live_body_keeps_the_invariants_the_simulator_keeps(
        real_vllm: VllmServer) -> None:  # noqa: F811
    _complete(real_vllm.url, 2)
    text = real_vllm.metrics()
    running = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M)
    assert running is not None
    assert invariant_violations(text, at_rest=float(running.group(1)) == 0) == []



def test_collector_targets_status_and_cost_on_the_real_engine(
        real_vllm: VllmServer, tmp_path: Path) -> None:  # noqa: F811
    config = monitored_config(tmp_path, [real_vllm.url])
    run_vigil("collect", "--config", str(config), "--once")
    _complete(real_vllm.url, 4, max_tokens=16)
    time.sleep(1.0)  # two scrapes a second apart: increase() needs two samples
    run_vigil("collect", "--config", str(config), "--once")
    targets = json.loads(run_vigil("targets", "--config", str(config), "--json"))
    (target,) = targets["targets"]
    assert target["up"] is True and target["last_error"] == "", target
    assert target["samples"] > 300, target
    status = json.loads(run_vigil("slo", "status", "--config", str(config), "--json",
                               "--window", "5m"))
    chat = status["pools"][POOL]
    model = chat["models"][MODEL]
    ttft = model["quantiles"]["ttft_seconds"]
    assert ttft["p95"] is not None and ttft["p95"] > 0, ttft
    assert chat["kv_cache_usage"] is not None
    cost = chat["cost"]
    assert cost["requests"] is not None and cost["requests"] >= 4, cost
    assert cost["per_1000_requests"] is not None and cost["per_1000_requests"] > 0


# --- the simulator against the engine --------------------------------------------------------


def _bucket_bounds(text: str) -> dict[str, list[float]]:
    """Each histogram family's finite bucket bounds (the first label set's)."""
    out: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.type != "histogram":
            continue
        first: dict[str, str] | None = None
        bounds: list[float] = []
        for s in fam.samples:
            if not s.name.endswith("_bucket"):
                continue
            rest = {k: v for k, v in s.labels.items() if k != "le"}
            if first is None:
                first = rest
            if rest == first and s.labels["le"] != "+Inf":
                bounds.append(float(s.labels["le"]))
        out[fam.name] = bounds
    return out


def shape(text: str) -> dict[str, dict[str, object]]:
    """Per ``vllm:`` family: its type, label names, bucket bounds, and the label names of an
    info gauge (``*_info``), the parts a consumer of ``/metrics`` relies on."""
    bounds = _bucket_bounds(text)
    out: dict[str, dict[str, object]] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:"):
            continue
        labels = sorted({k for s in fam.samples for k in s.labels if k != "le"})
        out[fam.name] = {"type": fam.type, "labels": labels,
                         "buckets": bounds.get(fam.name)}
    return out


def differences(sim: str, real: str) -> dict[tuple[str, str], str]:
    """``(family, aspect) -> what differs`` between the simulator's and vLLM's exposition;
    aspects: ``only in vLLM``, ``only in the simulator``, ``type``, ``labels``,
    ``buckets``."""
    a, b = shape(sim), shape(real)
    out: dict[tuple[str, str], str] = {}
    for name in sorted(set(a) | set(b)):
        if name not in a:
            out[(name, "only in vLLM")] = f"labels {b[name]['labels']}"
            continue
        if name not in b:
            out[(name, "only in the simulator")] = f"labels {a[name]['labels']}"
            continue
        for aspect in ("type", "buckets"):
            if a[name][aspect] != b[name][aspect]:
                out[(name, aspect)] = f"simulator {a[name][aspect]}, vLLM {b[name][aspect]}"
        sim_labels, real_labels = set(a[name]["labels"]), set(b[name]["labels"])  # type: ignore[call-overload]
        if sim_labels != real_labels:
            out[(name, "labels")] = (f"only the simulator's: {sorted(sim_labels - real_labels)}, "
                                     f"only vLLM's: {sorted(real_labels - sim_labels)}")
    return out


def documented_differences() -> dict[tuple[str, str], str]:
    """The rows of ``docs/simulator.md``'s table of differences from the real engine:
    ``| `family` | aspect | reason |``."""
    text = SIMULATOR_DOC.read_text()
    section = text.split("## Compared with the real engine", 1)
    assert len(section) == 2, "docs/simulator.md has no section 'Compared with the real engine'"
    out: dict[tuple[str, str], str] = {}
    for line in section[1].split("\n## ", 1)[0].splitlines():
        m = re.match(r"^\|\s*`([^`]+)`\s*\|\s*([^|]+?)\s*\|\s*(.+?)\s*\|$", line)
        if m:
            out[(m.group(1), m.group(2))] = m.group(3)
    return out


def test_the_simulator_cannot_drift_from_the_engine_unseen(
        real_vllm: VllmServer, live: str) -> None:  # noqa: F811
    # The simulator with the real server's flags: priority scheduling, prefix caching, the
    # same extra bucket bounds, context length and model name.
    argv = real_vllm.argv
    flags = {"max_model_len": int(argv[argv.index("--max-model-len") + 1]),
             "custom_histogram_buckets": argv[argv.index("--custom-histogram-buckets") + 1]}
    with running_fleet(1, scheduling_policy="priority", model=MODEL, **flags) as fleet:
        _complete(fleet.base_urls[0], 3)
        sim = httpx.get(fleet.metrics_urls[0], timeout=10.0).text
    real = real_vllm.metrics()
    found = differences(sim, real)
    listed = documented_differences()
    unlisted = {k: v for k, v in found.items() if k not in listed}
    stale = sorted(k for k in listed if k not in found)
    assert not unlisted, (
        "the simulator's /metrics differs from vLLM " + VLLM_VERSION + " where docs/simulator.md "
        "lists no reason:\n" + "\n".join(f"| `{f}` | {a} | {d} |"
                                        for (f, a), d in unlisted.items()))
    assert not stale, f"docs/simulator.md lists differences that no longer exist: {stale}"
