"""The gateway's parts wired together: the batch queue mounted in the app (the gateway's keys,
its send path, its records), and ``vigil gateway`` as a process."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.gateway import (
    BATCH,
    KEYS,
    MODEL,
    STANDARD,
    gateway_config,
    running_gateway,
    wait_until,
)
from support.loopback import free_port

from serving.gateway.batch.queue import BatchRequest
from serving.gateway.front.api_keys import key_sha256
from serving.gateway.tiers import Caller
from serving.sim.testing import running_fleet
from slo.sources.request_log import GatewayRecords

REPO = Path(__file__).resolve().parent.parent


def test_batch_api_through_the_gateway(tmp_path: Path) -> None:
    with running_fleet(1, scheduling_policy="priority") as fleet:
        cfg = gateway_config(tmp_path, fleet.base_urls,
                             gateway={"batch": {"poll_interval": "0.1s"}})
        with running_gateway(cfg) as gw:
            oa = gw.client(STANDARD)
            lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": MODEL, "messages": [
                          {"role": "user", "content": f"Question {i}"}]}} for i in range(2)]
            data = "\n".join(json.dumps(x) for x in lines).encode()
            f = oa.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
            batch = oa.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
            done = wait_until(lambda: oa.batches.retrieve(batch.id).status == "completed",
                              timeout=30, what="the batch to complete")
            assert done
            out = [json.loads(x) for x in oa.files.content(
                oa.batches.retrieve(batch.id).output_file_id).text.splitlines()]
            assert sorted(x["custom_id"] for x in out) == ["q0", "q1"]
            assert all(x["response"]["status_code"] == 200 for x in out)
            records = [r for r in gw.all_records() if r.batch_id == batch.id]
    assert len(records) == 2
    # Queued work runs at the batch tier whatever the submitting key, with the policy's
    # default max_tokens, billed to the submitting tenant.
    assert {(r.tier, r.tenant, r.max_tokens, r.max_tokens_decision, r.status)
            for r in records} == {("batch", "acme", 512, "default", 200)}
    assert all(r.cost_usd is not None and r.cost_usd > 0 for r in records)


def test_send_batch_refusals_are_error_bodies(tmp_path: Path) -> None:
    with running_fleet(1) as fleet:
        cfg = gateway_config(tmp_path, fleet.base_urls, pool={"vllm": {
            "scheduling_policy": "fcfs"}}, gateway={"tiers": {"batch": {"max_tokens_cap": 10}}})
        with running_gateway(cfg, batch=False) as gw:
            caller = Caller(tenant="nightly", tier="batch", key_id=key_sha256(BATCH)[:12])

            def item(**body: object) -> BatchRequest:
                return BatchRequest(batch_id="batch_x", custom_id="c", pool="chat",
                                    endpoint="chat", caller=caller, body={
                                        "model": MODEL, "messages": [
                                            {"role": "user", "content": "hi"}], **body})

            status, body = gw.call(lambda: gw.gateway.send_batch(item(max_tokens=50)))
            assert status == 400 and body["error"]["code"] == "max_tokens_over_cap"
            status, body = gw.call(lambda: gw.gateway.send_batch(item(
                max_tokens=5, stream=True, stream_options={"include_usage": True})))
            assert status == 200 and body["object"] == "chat.completion"
            records = gw.all_records()
    assert [(r.status, r.error_class, r.batch_id, r.stream) for r in records] == [
        (400, "over_cap", "batch_x", False), (200, "", "batch_x", False)]


def _config_file(tmp_path: Path, upstream: str, port: int) -> Path:
    keys = "\n".join(f'[[gateway.api_keys]]\nsha256 = "{key_sha256(k)}"\ntenant = "{t}"\n'
                     f'tier = "{tier}"\n' for k, (t, tier) in KEYS.items())
    path = tmp_path / "vigil.toml"
    path.write_text(f"""
[[pools]]
name = "chat"
model = "{MODEL}"

[[targets]]
name = "chat-0"
url = "{upstream}/metrics"
pool = "chat"

[gateway]
listen = "127.0.0.1:{port}"
records_path = "records.db"
health_interval = "0.5s"
{keys}
""")
    return path


@pytest.mark.slow
def test_vigil_gateway_command(tmp_path: Path) -> None:
    with running_fleet(1) as fleet:
        port = free_port()
        config = _config_file(tmp_path, fleet.base_urls[0], port)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "vigil_shell.cli", "gateway", "--config",
                                 str(config)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            url = f"http://127.0.0.1:{port}"

            def up() -> bool:
                try:
                    return httpx.get(f"{url}/health", timeout=1).status_code == 200
                except httpx.HTTPError:
                    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                    return False

            wait_until(up, timeout=30, what="vigil gateway to serve")
            r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "hi",
                                                           "max_tokens": 3},
                           headers={"Authorization": f"Bearer {STANDARD}"}, timeout=30)
            assert r.status_code == 200
            request_id = r.headers["x-vigil-request-id"]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=20)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
    assert proc.returncode == 0, err
    assert "vigil gateway: http://127.0.0.1:" in out
    # The records database sits beside the config file, and the record was written on exit.
    rec = GatewayRecords(tmp_path / "records.db").get(request_id)
    assert rec is not None and rec.endpoint == "completions" and rec.completion_tokens == 3


def test_bad_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "vigil.toml"
    config.write_text('[gateway]\nlisten = "nowhere"\n')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "vigil_shell.cli", "gateway", "--config",
                           str(config)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "gateway.listen" in done.stderr
