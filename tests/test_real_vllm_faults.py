"""A real vLLM server that dies mid-stream, and comes back: what the client, the gateway's
routing, its records and the SLO engine make of it.

The session's server (``tests/support/real_vllm.py``) is killed with SIGKILL (the API server and its
engine core at once, as the OOM killer does) while the gateway streams an answer from it, then
started again: its counters start from zero, and the rates Vigil computes across the restart
must stay whole (PromQL's counter-reset rule), never negative.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.gateway import STANDARD
from support.loopback import wait_for
from support.real_vllm import MODEL, POOL, VllmServer, monitored_config, real_vllm, run_vigil  # noqa: F401
from support.shared_gateways import running_gateways

from serving.sim.testing import sample_values, total
from slo.sources.request_log import GatewayRecords

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]



def _complete(url: str, n: int) -> None:
    for i in range(n):
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60.0,
                       headers={"Authorization": f"Bearer {STANDARD}"},
                       json={"model": MODEL, "max_tokens": 8, "messages": [
                           {"role": "user", "content": f"after the restart {i}"}]})
        assert r.status_code == 200, r.text


def test_an_engine_killed_mid_stream_then_restarted(real_vllm: VllmServer,  # noqa: F811
                                                    tmp_path: Path) -> None:
    config = monitored_config(tmp_path, [real_vllm.url])
    with running_gateways(config, 1) as (gateway,):
        _complete(gateway.url, 3)
        run_vigil("collect", "--config", str(config), "--once")
        before = total(sample_values(real_vllm.metrics()), "vllm:request_success_total")
        assert before >= 3

        # A long streamed answer; the engine dies after its first chunks.
        events: list[str] = []
        got_chunks = threading.Event()

        def stream() -> None:
            body = {"model": MODEL, "max_tokens": 1800, "stream": True, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "a story that never ends"}]}
            with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body,
                              timeout=60.0,
                              headers={"Authorization": f"Bearer {STANDARD}"}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        if len(events) >= 5:
                            got_chunks.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert got_chunks.wait(60), events
        real_vllm.kill()
        reader.join(60)
        assert not reader.is_alive(), "the client's stream did not end"

        # The client gets an OpenAI-style error event, then the end of the stream.
        errors = [json.loads(e)["error"] for e in events
                  if e.startswith("{") and "error" in json.loads(e)]
        assert errors and errors[-1].get("message"), events[-3:]
        assert {"type", "code"} <= set(errors[-1]), errors[-1]
        assert events[-1] == "[DONE]", events[-3:]

        # The replica leaves routing; a new request is refused at once with 503.
        wait_for("the dead replica out of routing", lambda: (
            h := gateway.health()) is not None and h["pools"][POOL]["healthy_replicas"] == 0,
                 timeout_s=30)
        r = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30.0,
                       headers={"Authorization": f"Bearer {STANDARD}"},
                       json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["error"]["message"], r.text

        # Its record says what happened.
        now = time.time()
        rows = GatewayRecords(tmp_path / "records.db").rows(None, now + 1, 600)
        broken = [x for x in rows if x.stream and x.completion_tokens >= 4]
        assert broken and broken[-1].error, rows
        assert broken[-1].error_class not in ("", "client_cancel"), broken[-1]

        # Down: the collector records the target down, with why.
        run_vigil("collect", "--config", str(config), "--once")
        (down,) = json.loads(run_vigil("targets", "--config", str(config), "--json"))["targets"]
        assert down["up"] is False and down["last_error"], down

        # Back: every counter starts from zero again.
        real_vllm.start()
        real_vllm.wait_ready()
        wait_for("the replica back in routing", lambda: (
            h := gateway.health()) is not None and h["pools"][POOL]["healthy_replicas"] == 1,
                 timeout_s=30)
        run_vigil("collect", "--config", str(config), "--once")
        _complete(gateway.url, 4)
        after = total(sample_values(real_vllm.metrics()), "vllm:request_success_total")
        assert after == 4, "the restarted engine's counter counts from zero again"
        run_vigil("collect", "--config", str(config), "--once")

    status = json.loads(run_vigil("slo", "status", "--config", str(config), "--json",
                               "--window", "10m"))
    cost = status["pools"][POOL]["cost"]
    # Across the reset: the 4 requests after it (PromQL's rule: a drop is a restart from zero),
    # not the drop from the old total to 0 taken as a negative increase.
    # A naive difference (4 - the old total) would be less than 4, or negative.
    assert cost["requests"] is not None and 4 <= cost["requests"] < before + 4, (cost, before)
    assert cost["output_tokens"] is not None and cost["output_tokens"] > 0, cost
    for slo in status["slos"]:
        sli = slo.get("sli")
        assert sli is None or 0 <= sli <= 1, slo
