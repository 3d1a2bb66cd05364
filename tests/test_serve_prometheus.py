"""`vigil serve` reading a Prometheus: no collector, no store, alerts and exporter from PromQL.

A real Prometheus 2.42 holds a fleet's series backfilled from 20 minutes ago to 10 minutes
ahead, so that whatever instant anyone evaluates, every sample at or before it is already
there: `vigil serve` (evaluating at its own clock) and `vigil slo status --at` (at serve's
evaluation time, later) see the very same data. Pool ``chat`` carries Vigil's labels (``pool``,
``kind``, ``instance``: what the generated scrape config writes); pool ``batch`` carries a
team's Kubernetes labels only and is chosen by its ``selector``, its replicas named by ``pod``.
In each pool one replica has been down for the last minute.

Checked: the tight TTFT SLO of ``chat`` pages a webhook on 127.0.0.1; ``TargetDown`` fires for
both down replicas, named by their pool's replica label, from Prometheus's ``up``; every
``vigil_*`` series the status feeds equals what ``vigil slo status --prometheus-url`` computes
at the same instant; no store file is created; the banner and ``/healthz`` name the source.
Then Prometheus stops: the evaluation fails in the log and ``/healthz`` (503) while the alerts
stay as they were (nothing resolved), and once Prometheus is back on its port the next tick
recovers with the page still firing since the same ``startsAt``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.loopback import free_port, serve_http, wait_for
from support.prometheus import PrometheusServer, PromSeries, require_prometheus, run_prometheus
from support.same_numbers import EXACT, assert_same_numbers

from alerts.exporter import Exporter, Snapshot
from vigil_shell import alerts_cli

pytestmark = pytest.mark.slow

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BATCH_MODEL = "Qwen/Qwen2.5-7B-Instruct"
STEP_S = 5
HISTORY_S = 20 * 60
AHEAD_S = 10 * 60
#: The down replicas' last minute: every scrape failed (12 of them, > target_down_scrapes).
DOWN_S = 60
TTFT_LE = ("0.05", "0.1", "0.5", "1.0", "+Inf")
E2E_LE = ("0.5", "1.0", "5.0", "10.0", "+Inf")
#: The exporter's series that come from the status (the rest: alerts, notifier, targets,
#: the evaluation's own timing).
STATUS_SERIES = ("vigil_slo_", "vigil_latency_", "vigil_cost_", "vigil_scaling_",
                 "vigil_kv_cache_", "vigil_queue_", "vigil_anomalous_")


def _replica(out: list[PromSeries], target: dict[str, str], model: str, times: list[int],
             down_from_ms: int | None, ttft: list[float], e2e: list[float]) -> None:
    """One replica's series: ``up`` and Prometheus's scrape series with the target labels,
    vLLM's with ``model_name`` and ``engine`` too; a down replica's vLLM series end when it
    went down (its ``up`` goes on, at 0)."""
    serving = [t for t in times if down_from_ms is None or t < down_from_ms]
    up = [(t, 0.0 if down_from_ms is not None and t >= down_from_ms else 1.0) for t in times]
    out.append(PromSeries("up", target, up))
    out.append(PromSeries("scrape_duration_seconds", target, [(t, 0.012) for t in times]))
    out.append(PromSeries("scrape_samples_scraped", target, [(t, 480.0) for t in times]))
    vllm = {**target, "model_name": model, "engine": "0"}

    def counter(name: str, labels: dict[str, str], per_step: float) -> None:
        out.append(PromSeries(name, labels,
                              [(t, (100 + i) * per_step) for i, t in enumerate(serving)]))

    def gauge(name: str, value: float) -> None:
        out.append(PromSeries(name, vllm, [(t, value) for t in serving]))

    gauge("vllm:kv_cache_usage_perc", 0.35 if down_from_ms is None else 0.6)
    gauge("vllm:num_requests_waiting", 2.0)
    gauge("vllm:num_requests_running", 4.0)
    counter("vllm:request_success_total", {**vllm, "finished_reason": "stop"}, len(ttft))
    counter("vllm:generation_tokens_total", vllm, 120.0 * len(ttft))
    counter("vllm:prompt_tokens_total", vllm, 400.0 * len(ttft))
    for base, bounds, observed in (("vllm:time_to_first_token_seconds", TTFT_LE, ttft),
                                   ("vllm:e2e_request_latency_seconds", E2E_LE, e2e)):
        for le in bounds:
            counter(base + "_bucket", {**vllm, "le": le},
                    sum(1 for v in observed if v <= float(le)))
        counter(base + "_sum", vllm, math.fsum(observed))
        counter(base + "_count", vllm, len(observed))


def fleet(now_s: int) -> list[PromSeries]:
    """Both pools' series, every ``STEP_S`` from ``now - HISTORY_S`` to ``now + AHEAD_S``."""
    times = list(range((now_s - HISTORY_S) * 1000, (now_s + AHEAD_S) * 1000 + 1, STEP_S * 1000))
    down_ms = (now_s - DOWN_S) * 1000
    out: list[PromSeries] = []
    slow_ttft = [0.3] * 9 + [0.04]  # 9 of 10 requests over chat's 100 ms
    for name, down in (("r0", None), ("r1", down_ms)):
        _replica(out, {"instance": name, "pool": "chat", "kind": "vllm"}, MODEL, times, down,
                 slow_ttft, [2.0] * 10)
    for n, down in enumerate((None, down_ms)):
        pod = f"batch-vllm-{n}"
        k8s = {"namespace": "llm", "service": "batch-vllm", "pod": pod, "job": "llm/batch-vllm",
               "container": "vllm", "endpoint": "http", "instance": f"10.0.3.{10 + n}:8000"}
        _replica(out, k8s, BATCH_MODEL, times, down, [0.04] * 10, [3.0] * 10)
    return out


def serve_config(hook: str, prometheus_url: str) -> str:
    """Pools ``chat`` (Vigil's labels) and ``batch`` (a selector, replicas by ``pod``), a TTFT
    SLO ``chat`` breaks, a burn-rate row over 10 min / 1 min, and pages to ``hook``."""
    return f"""
[store]
path = "vigil.db"
[collector]
scrape_interval = "5s"
scrape_timeout = "4s"
[engine]
prometheus_url = "{prometheus_url}"
evaluation_interval = "1s"
window = "1m"
[[engine.burn_rate_alerts]]
severity = "page"
factor = 10
long_window = "10m"
short_window = "1m"
[[pools]]
name = "chat"
model = "{MODEL}"
[[pools]]
name = "batch"
model = "{BATCH_MODEL}"
selector = 'namespace="llm", service="batch-vllm"'
replica_label = "pod"
[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
threshold_seconds = 0.1
objective = 0.99
[[slos]]
name = "batch-ttft"
pool = "batch"
indicator = "ttft"
[alerts]
outbox_path = "alerts.db"
[[alerts.routes]]
name = "oncall"
match = {{ severity = "page" }}
url = "{hook}"
format = "generic"
group_wait = "1s"
group_interval = "2s"
"""


def _series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _status_series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {k: v for k, v in _series(text).items() if k[0].startswith(STATUS_SERIES)}


def _restart(prometheus: str, workdir: Path, port: int) -> PrometheusServer:
    """Prometheus again on its old port and data directory (as ``run_prometheus`` ran it)."""
    log_path = workdir / "prometheus-again.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [prometheus, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}", "--storage.tsdb.retention.time=100y",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    server = PrometheusServer(process, f"http://127.0.0.1:{port}", workdir, log_path)
    server.wait_ready()
    return server


@contextlib.contextmanager
def _serve(cfg: Path, port: int, url: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "vigil_shell", "serve", "--config", str(cfg), "--listen",
         f"127.0.0.1:{port}", "--prometheus-url", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cfg.parent)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def _firing(receiver_bodies: list[dict]) -> list[dict]:
    return [a for b in receiver_bodies for a in b.get("alerts", []) if b.get("status") == "firing"]


def _listing(cfg: Path) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert alerts_cli.run(argparse.Namespace(config=str(cfg), json=True)) == 0
    return json.loads(out.getvalue())


def test_serve_evaluates_from_prometheus_and_survives_its_outage(tmp_path: Path) -> None:
    prometheus, _ = require_prometheus()
    now = int(time.time())
    serve_port = free_port()
    base = f"http://127.0.0.1:{serve_port}"
    with run_prometheus(fleet(now)) as prom, serve_http() as receiver:
        prom_port = int(prom.base_url.rsplit(":", 1)[1])
        cfg = tmp_path / "vigil.toml"
        # The config names a dead Prometheus: --prometheus-url wins.
        cfg.write_text(serve_config(receiver.url + "/hook", f"http://127.0.0.1:{free_port()}"))
        with _serve(cfg, serve_port, prom.base_url) as serve:
            def bodies() -> list[dict]:
                if serve.poll() is not None:
                    raise AssertionError(f"vigil serve exited with {serve.returncode}:\n"
                                         f"{serve.communicate()[1].decode()[-3000:]}")
                return [r.json() for r in receiver.recorded()]

            pages = wait_for("a page at the webhook", lambda: _firing(bodies()), 60,
                             interval_s=0.25)
            assert pages[0]["labels"]["alertname"] == "ErrorBudgetBurn"
            assert pages[0]["labels"]["slo"] == "chat-ttft"
            health = httpx.get(base + "/healthz", timeout=5)
            assert health.status_code == 200
            assert f"Prometheus {prom.base_url} (PromQL 2" in health.text

            # TargetDown from Prometheus's `up`, each replica named by its pool's label.
            def down() -> set[tuple[str, str]]:
                return {(a["labels"]["pool"], a["labels"]["instance"])
                        for a in _listing(cfg)["firing"] if a["labels"]["alertname"] ==
                        "TargetDown"}

            assert wait_for("TargetDown for both down replicas", down, 30) == {
                ("chat", "r1"), ("batch", "batch-vllm-1")}

            # The exporter's status series equal `vigil slo status` at serve's instant.
            text = httpx.get(base + "/metrics", timeout=5).text
            (at,) = [v for (name, _), v in _series(text).items()
                     if name == "vigil_last_evaluation_timestamp_seconds"]
            status = subprocess.run(
                [sys.executable, "-m", "vigil_shell.cli", "slo", "status", "--config",
                 str(cfg), "--prometheus-url", prom.base_url, "--at", repr(at), "--json"],
                capture_output=True, text=True, timeout=120, check=True, cwd=tmp_path)
            reference = Exporter()
            reference.update(Snapshot(status=json.loads(status.stdout)))
            want = _status_series(generate_latest(reference.registry).decode())
            got = _status_series(text)
            assert_same_numbers(got, want, tolerance=EXACT)
            burn = got[("vigil_slo_burn_rate_ratio",
                        (("model_name", MODEL), ("pool", "chat"), ("slo", "chat-ttft"),
                         ("window", "1m")))]
            assert burn == pytest.approx(90.0)
            # The selector's pool is read too: its two replicas' KV usage (0.35, 0.6).
            assert got[("vigil_kv_cache_usage_ratio", (("pool", "batch"), ("stat", "max")))] \
                == 0.6
            assert not list(tmp_path.glob("vigil.db*")), "serve must not create a store"

            # Prometheus goes away: the evaluation fails loudly, the alerts stay.
            started = {a["fingerprint"]: a["starts_at"] for a in _listing(cfg)["firing"]}
            prom.stop()
            failing = wait_for("/healthz failing", lambda: (
                r := httpx.get(base + "/healthz", timeout=5)).status_code == 503 and r, 30,
                interval_s=0.25)
            assert "failed" in failing.text and prom.base_url in failing.text
            text = httpx.get(base + "/metrics", timeout=5).text
            assert 'vigil_alerts_firing{alertname="ErrorBudgetBurn",severity="page"} 1.0' \
                in text
            again = _restart(prometheus, prom.workdir, prom_port)
            try:
                wait_for("/healthz recovered", lambda: httpx.get(
                    base + "/healthz", timeout=5).status_code == 200, 30, interval_s=0.25)
                after = {a["fingerprint"]: a["starts_at"] for a in _listing(cfg)["firing"]}
                assert after == started  # same alerts, same startsAt: none lost or restarted
                assert not [b for b in bodies() if b.get("status") == "resolved"]
            finally:
                again.stop()
            serve.send_signal(signal.SIGTERM)
            stdout, stderr = serve.communicate(timeout=30)
            assert serve.returncode == 0, stderr.decode()[-2000:]
        assert b"no collector and no store" in stdout
        assert f"from Prometheus {prom.base_url}".encode() in stdout
        # The error names what happened: refused while Prometheus is down, or a connection it
        # dropped when it stopped in the middle of a query.
        failed = [line for line in stderr.splitlines() if b"evaluation at" in line
                  and b"failed" in line]
        assert failed and all(prom.base_url.encode() in line for line in failed), \
            stderr.decode()[-3000:]
        assert b"recovered after" in stderr
        assert not list(tmp_path.glob("vigil.db*"))
