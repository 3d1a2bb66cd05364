"""``vigil capacity`` on a real vLLM replica: the search completes and reports a capacity.

The replica is ``tests/support/real_vllm.py``'s (one CPU engine, ``max_num_seqs`` 4, a tiny model):
its knee is a few requests in flight. The SLOs are tight enough for the search to find it in
well under a minute (TTFT 0.5 s and e2e 2 s for 90 % of 32-token requests), and the probes short
(``probe_duration`` 2 s, 20 requests, 10 on the latency margin). What is checked is what a
user reads: a capacity with a failing level above it, the opening ramp placing the first probe
near the knee, the profile saved, and the engine's own counter of finished requests covering
every request the search counted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from support.real_vllm import MODEL, VllmServer, real_vllm, run_vigil  # noqa: F401

from serving.sim.testing import sample_values, total
from vigil.conventions import VLLM_REQUEST_SUCCESS

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

CONFIG = """
[slo_defaults]
ttft_threshold_seconds = 0.5
ttft_objective = 0.9
e2e_threshold_seconds = 2.0
e2e_objective = 0.9

[capacity]
profiles_path = "{profiles}"
probe_duration = "2s"
min_probe_requests = 20
max_probe_requests = 200
clear_probe_requests = 10
precision = 0.25
max_concurrency = 64
"""


def _finished(url: str) -> float:
    """The engine's requests finished so far, every reason."""
    return total(sample_values(httpx.get(f"{url}/metrics", timeout=10.0).text),
                 VLLM_REQUEST_SUCCESS)


@pytest.mark.timeout(600)
def test_the_capacity_search_completes_on_a_real_replica(real_vllm: VllmServer,  # noqa: F811
                                                         tmp_path: Path) -> None:
    profiles = tmp_path / "capacity.json"
    config = tmp_path / "vigil.toml"
    config.write_text(CONFIG.format(profiles=profiles))
    before = _finished(real_vllm.url)
    started = time.monotonic()
    out = run_vigil("capacity", "--config", str(config), "--url", real_vllm.url,
                    "--model", MODEL, "--prompt-tokens", "64", "--output-tokens", "32",
                    "--gpu", "cpu", "--save", "--json", timeout_s=540)
    wall = time.monotonic() - started
    found = json.loads(out)
    probes = found["probes"]
    summary = [(p["concurrency"], p["requests"], p["passed"],
                round(p["ttft_s"].get("p95") or 0, 3)) for p in probes]
    print(f"capacity on real vLLM: {found['max_concurrency']} in flight, "
          f"{found['max_goodput_rps']:.2f} good req/s, {len(probes)} probes in {wall:.0f} s: "
          f"{summary}")
    best = next(p for p in probes if p["passed"]
                and p["concurrency"] == found["max_concurrency"])
    failed = [p for p in probes if not p["passed"]]
    assert failed and min(p["concurrency"] for p in failed) > best["concurrency"], summary
    assert best["attainment"] >= 0.9 and best["errors"] == 0, best
    assert found["max_goodput_rps"] == pytest.approx(best["goodput_rps"])
    # The search opened with a ramp that stopped on the replica's misses (well below the
    # search's maximum) and probed first where the ramp put the knee, not at 1, 2, 4...
    ramp = found["search"]["ramp"]
    assert ramp["stopped"] == "misses" and ramp["streams"] < 64, ramp
    assert probes[0]["concurrency"] == ramp["start"], (ramp, summary)
    assert found["search"]["levels"] == [p["concurrency"] for p in probes]
    assert json.loads(profiles.read_text())  # saved, with --gpu
    # Every counted request (and the warm-up and the uncounted ones around it) was a request
    # the engine finished: the search measured the engine, not an error path.
    served = _finished(real_vllm.url) - before
    assert served >= sum(p["requests"] for p in probes), (served, summary)
