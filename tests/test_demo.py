"""`vigil demo` starts the fleet, load and collector, and stops all of it cleanly."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from helpers import free_port

from collector.store import Store
from vigil.errors import StoreError

pytestmark = pytest.mark.slow


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_demo_runs_and_stops_cleanly(tmp_path):
    port = free_port()
    while port_open(port + 1) or port_open(port + 2):  # fleet (2) + serve: consecutive ports
        port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vigil.cli", "demo", "--port", str(port), "--dir", str(tmp_path),
         "--rate", "4", "--ramp-to", "8", "--ramp", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        # Wait until the collector has scraped every target at least twice.
        deadline = time.monotonic() + 90
        db = tmp_path / "vigil.db"
        seen: set[str] = set()
        while time.monotonic() < deadline:
            if db.exists():
                try:
                    with Store(db, readonly=True) as store:
                        ups = store.points("up")
                        reqs = store.points("vllm:request_success_total")
                except StoreError:
                    ups, reqs = {}, {}  # the collector is still creating the schema
                seen = {k.as_dict()["instance"] for k, v in ups.items()
                        if len(v) >= 2 and v[-1].value == 1.0}
                if len(seen) == 4 and any(
                    (p := v[-1].value) is not None and p > 0 for v in reqs.values()
                ):
                    break
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.5)
        assert seen == {"chat-0", "chat-1", "chat-0-gpu", "chat-1-gpu"}, seen
        # vigil serve's exporter answers with the targets' health
        body = ""
        while time.monotonic() < deadline and "vigil_target_up{" not in body:
            with contextlib.suppress(httpx.HTTPError):
                body = httpx.get(f"http://127.0.0.1:{port + 2}/metrics", timeout=2).text
            time.sleep(0.5)
        assert 'vigil_target_up{' in body
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "Vigil demo is running" in out and "nothing left running" in out
    assert not port_open(port) and not port_open(port + 1), "the fleet is still listening"
    assert not port_open(port + 2), "vigil serve is still listening"
