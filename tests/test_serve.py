"""`vigil serve` end to end: a simulated replica under load breaks a tight SLO, serve pages a
webhook, a real Prometheus scrapes serve's /metrics, SIGTERM stops it cleanly."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from conftest import require_binary
from support.loopback import free_port, serve_http
from support.serve import MODEL, load, stop_process, tight_slo_config, wait_for

from vigil.errors import ConfigError
from vigil_shell import alerts_cli
from vigil_shell.serve import parse_listen


def test_parse_listen():
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:0") == ("::1", 0)
    with pytest.raises(ConfigError):
        parse_listen("0.0.0.0:9464")
    assert parse_listen("0.0.0.0:1", allow_remote=True) == ("0.0.0.0", 1)
    with pytest.raises(ConfigError):
        parse_listen("nonsense")








@pytest.mark.slow
def test_serve_pages_under_overload_and_is_scraped_by_prometheus(tmp_path):
    prometheus = require_binary("prometheus")
    sim_port, serve_port, prom_port = free_port(), free_port(), free_port()
    sim_base = f"http://127.0.0.1:{sim_port}"
    procs: list[subprocess.Popen[bytes]] = []
    stop_load = threading.Event()
    with serve_http() as receiver:
        hook = receiver.url + "/hook"
        cfg = tmp_path / "vigil.toml"
        cfg.write_text(tight_slo_config(sim_base, hook))
        prom_cfg = tmp_path / "prometheus.yml"
        prom_cfg.write_text(f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: vigil
    honor_labels: true  # vigil_target_up's own `instance` (the target) must win
    static_configs:
      - targets: ["127.0.0.1:{serve_port}"]
""")
        try:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "vigil_shell.cli", "sim", "--replicas", "1", "--port",
                 str(sim_port), "--model", MODEL, "--profile", "small"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_for("sim healthy",
                     lambda: httpx.get(sim_base + "/health", timeout=1).status_code == 200, 30)
            loaders = [threading.Thread(target=load, args=(sim_base, stop_load), daemon=True)
                       for _ in range(16)]
            for t in loaders:
                t.start()
            serve = subprocess.Popen(
                [sys.executable, "-m", "vigil_shell", "serve", "--config", str(cfg), "--listen",
                 f"127.0.0.1:{serve_port}"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            procs.append(serve)
            procs.append(subprocess.Popen(
                [prometheus, f"--config.file={prom_cfg}",
                 f"--storage.tsdb.path={tmp_path / 'prom'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

            def paged() -> list[dict]:
                return [b for b in (r.json() for r in receiver.recorded())
                        if b.get("status") == "firing"]

            pages = wait_for("a page at the webhook", paged, 60)
            assert pages[0]["alerts"][0]["labels"]["severity"] == "page"
            assert pages[0]["alerts"][0]["labels"]["alertname"] == "ErrorBudgetBurn"

            metrics = httpx.get(f"http://127.0.0.1:{serve_port}/metrics", timeout=5).text
            assert 'vigil_alerts_firing{alertname="ErrorBudgetBurn",severity="page"}' in metrics
            assert "vigil_notifications_delivered_total" in metrics
            assert httpx.get(f"http://127.0.0.1:{serve_port}/healthz", timeout=5).status_code \
                == 200

            def prom_has_target_up() -> list:
                r = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/query",
                              params={"query": 'vigil_target_up{instance="r0"}'}, timeout=2)
                return r.json()["data"]["result"]

            (series,) = wait_for("vigil_target_up in Prometheus", prom_has_target_up, 30)
            assert series["metric"]["pool"] == "chat"

            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert alerts_cli.run(argparse.Namespace(config=str(cfg), json=True)) == 0
            listing = json.loads(out.getvalue())
            assert any(a["labels"]["severity"] == "page" for a in listing["firing"])
            assert listing["outbox"]["done"] >= 1

            serve.send_signal(signal.SIGTERM)
            stdout, stderr = serve.communicate(timeout=30)
            assert serve.returncode == 0, stderr.decode()[-2000:]
            assert b"metrics: http://127.0.0.1:" in stdout
            assert b"stopped after" in stdout
        finally:
            stop_load.set()
            for p in procs:
                stop_process(p)
