"""``vigil serve`` with ``[otlp] listen``: the receiver starts with serve, a span sent to it
becomes a request record in the gateway's records database once its join window is over,
its counters are on serve's ``/metrics``, and SIGTERM writes what is held before exiting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
from support.loopback import free_port, wait_for
from support.otlp import T0_NS, json_export, json_span
from support.serve import stop_process

from slo.sources.request_log import GatewayRecords

CONFIG = """
[store]
path = "vigil.db"
[collector]
scrape_interval = "1s"
scrape_timeout = "800ms"
[engine]
evaluation_interval = "2s"
[gateway]
records_path = "records.db"
[otlp]
listen = "127.0.0.1:{otlp_port}"
join_window = "1s"
[[pools]]
name = "chat"
model = "m"
[[targets]]
name = "r0"
url = "http://127.0.0.1:{dead_port}/metrics"
pool = "chat"
"""


def test_serve_receives_spans_and_writes_records(tmp_path: Path) -> None:
    otlp_port, serve_port, dead_port = free_port(), free_port(), free_port()
    cfg = tmp_path / "vigil.toml"
    cfg.write_text(CONFIG.format(otlp_port=otlp_port, dead_port=dead_port))
    serve = subprocess.Popen(
        [sys.executable, "-m", "vigil_shell", "serve", "--config", str(cfg), "--listen",
         f"127.0.0.1:{serve_port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{otlp_port}/v1/traces"

        def up() -> bool:
            if serve.poll() is not None:  # exited: say why rather than wait out the bound
                err = serve.stderr.read().decode() if serve.stderr else ""
                raise AssertionError(f"vigil serve exited {serve.returncode}: {err}")
            try:
                return httpx.get(f"http://127.0.0.1:{serve_port}/healthz",
                                 timeout=1).status_code in (200, 503)
            except httpx.HTTPError:
                return False

        wait_for("serve answering", up, 60)
        span = json_span("00f067aa0ba902b7", {
            "gen_ai.request.id": "chatcmpl-serve-1", "gen_ai.usage.prompt_tokens": 21,
            "gen_ai.usage.completion_tokens": 34, "gen_ai.latency.e2e": 2.0,
            "gen_ai.latency.time_to_first_token": 0.25, "gen_ai.latency.time_in_queue": 0.0})
        reply = httpx.post(url, content=json_export(span, resource={"vigil.pool": "chat"}),
                           headers={"Content-Type": "application/json"}, timeout=5)
        assert reply.status_code == 200 and json.loads(reply.content) == {}

        def written() -> bool:
            text = httpx.get(f"http://127.0.0.1:{serve_port}/metrics", timeout=5).text
            return "vigil_otlp_records_written_total 1.0" in text

        wait_for("the record written (join window 1 s)", written, 30)
        metrics = httpx.get(f"http://127.0.0.1:{serve_port}/metrics", timeout=5).text
        assert 'vigil_otlp_spans_total{outcome="recorded",reason=""} 1.0' in metrics
        serve.terminate()  # SIGTERM: serve stops the receiver, writing what it holds
        assert serve.wait(30) == 0
    finally:
        stop_process(serve)
    out = serve.stdout.read().decode() if serve.stdout else ""
    assert f"otlp: POST http://127.0.0.1:{otlp_port}/v1/traces" in out
    with GatewayRecords(tmp_path / "records.db") as records:
        (row,) = records.rows("chat", T0_NS * 1e-9 + 10, 60)
    assert (row.id, row.prompt_tokens, row.completion_tokens) == ("otlp-chatcmpl-serve-1", 21, 34)
    assert (row.ttft_s, row.e2e_s) == (0.25, 2.0)
