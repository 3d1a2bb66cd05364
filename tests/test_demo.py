"""`vigil demo` tells the story within five minutes, and stops all of it cleanly.

The story: the store holds data from every target, the engine recommends a scale-out for the
loaded pool, and the webhook receiver got a page. The dashboard's browser check then passes on
the live demo (a screenshot of each page is saved under tests/artifacts; it needs chromium,
``conftest.require_binary``'s policy), and an interrupt stops every process and port.

One demo serves the whole module (``demo``); the tests run in file order, the last one stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.browser import PAGES, artifacts, check_pages, chromium

from collector.store import Store
from serving.sim.testing import free_port_block
from vigil.errors import StoreError
from vigil_shell.slo_status_cli import add_arguments, run

# The story's five minutes, the browser check and a clean stop, all under one demo.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: A bound on the wait for the story, not a measurement (bench/limits_bench.py measures it).
STORY_DEADLINE_S = 300.0
STOP_TIMEOUT_S = 90.0
#: Live data has no speculative decoding and fewer series than the sample store the dashboard's
#: own browser test uses: fewer charts per page, but each page must still render some.
# The Plan page needs days of history (a forecast) that a demo minutes old does not have.
DEMO_PAGES = {path: (title, selector, min(count, 3)) for path, (title, selector, count)
              in PAGES.items() if path != "plan"}
# With the gateway's records the anomalies are listed request by request (a table).
DEMO_PAGES["anomalies"] = ("Anomalies", "[data-testid='stDataFrame'], "
                           "[data-testid='stVegaLiteChart'] canvas", 1)
TARGETS = {"chat-0", "chat-1", "code-0", "chat-0-gpu", "chat-1-gpu", "code-0-gpu"}


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _status(config: Path) -> dict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = io.StringIO()
    run(parser.parse_args(["--config", str(config), "--json"]), out=out)
    return json.loads(out.getvalue())


def _pages(webhook_log: Path) -> list[dict]:
    if not webhook_log.exists():
        return []
    alerts = []
    for line in webhook_log.read_text().splitlines():
        payload = json.loads(line)
        alerts += [a for a in payload["alerts"]
                   if a["status"] == "firing" and a["labels"].get("severity") == "page"]
    return alerts


def _ports() -> tuple[int, int, int]:
    """A block of five ports (chat x2, code, serve, webhook), the gateway's and the
    dashboard's, all distinct."""
    base = free_port_block(5)
    gateway, dashboard = free_port_block(1), free_port_block(1)
    while gateway in range(base, base + 5) or dashboard in (gateway, *range(base, base + 5)):
        gateway, dashboard = free_port_block(1), free_port_block(1)
    return base, gateway, dashboard


@dataclass
class Demo:
    """A running ``vigil demo`` and what the story showed of it so far."""

    proc: subprocess.Popen[bytes]
    log: Path
    data: Path
    ports: tuple[int, ...]
    dashboard: int
    seen: set[str] = field(default_factory=set)
    scale_out: dict | None = None
    pages: list[dict] = field(default_factory=list)
    waited_s: float = 0.0

    def text(self) -> str:
        return self.log.read_text()

    def told(self) -> bool:
        return self.seen >= TARGETS and self.scale_out is not None and bool(self.pages)

    def look(self) -> None:
        """One look at the store, the status and the webhook's log."""
        if not self.seen >= TARGETS and (self.data / "vigil.db").exists():
            # A StoreError: the collector is still creating the schema; look again later.
            with contextlib.suppress(StoreError), \
                    Store(self.data / "vigil.db", readonly=True) as store:
                self.seen = {k.as_dict()["instance"] for k, v in store.points("up").items()
                             if any(p.value == 1.0 for p in v)}
        if self.seen >= TARGETS and self.scale_out is None:
            chat = _status(self.data / "vigil.toml")["pools"]["chat"]["scaling"]
            if chat and chat["action"] == "scale_out":
                self.scale_out = chat
        self.pages = _pages(self.data / "webhook.jsonl")

    def wait_for_story(self, deadline_s: float = STORY_DEADLINE_S) -> float:
        """Look every 2 s until the story is told, the demo exits or ``deadline_s`` passes;
        returns the seconds waited (also kept in ``waited_s``)."""
        start = time.monotonic()
        while time.monotonic() - start < deadline_s and self.proc.poll() is None:
            self.look()
            if self.told():
                break
            time.sleep(2.0)
        self.waited_s = time.monotonic() - start
        return self.waited_s

    def stop(self) -> None:
        """SIGINT, as a user's Ctrl-C; killed if it does not stop within STOP_TIMEOUT_S."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def start_demo(work: Path) -> Demo:
    """``vigil demo`` on free ports, its data and log under ``work``."""
    base, gateway, dashboard = _ports()
    log = work / "demo.log"
    data = work / "demo"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vigil_shell.cli", "demo", "--port", str(base),
             "--gateway-port", str(gateway), "--dashboard-port", str(dashboard),
             "--dir", str(data)],
            stdout=out, stderr=subprocess.STDOUT)
    return Demo(proc, log, data, (*range(base, base + 5), gateway, dashboard), dashboard)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """A running demo once its story is told (or the deadline passed, or it exited: the first
    test says which); always stopped at the end."""
    demo = start_demo(tmp_path_factory.mktemp("demo"))
    try:
        print(f"story complete after {demo.wait_for_story():.0f} s")
        yield demo
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            demo.stop()


def test_the_demo_tells_the_story_in_five_minutes(demo: Demo) -> None:
    text = demo.text()
    assert demo.proc.poll() is None, f"the demo exited: {text[-5000:]}"
    waited = f"after {demo.waited_s:.0f} s"
    assert demo.seen >= TARGETS, (demo.seen, text[-5000:])
    assert demo.scale_out is not None, f"no scale-out advice for chat {waited}"
    assert demo.scale_out["desired"] > demo.scale_out["current"], demo.scale_out
    assert demo.pages, f"no page reached the webhook {waited}: {text[-5000:]}"
    assert any(a["labels"].get("pool") == "chat" for a in demo.pages), demo.pages
    assert "Vigil demo is running" in text and "webhook received [page]" in text


def test_the_dashboard_renders_on_the_live_demo(demo: Demo, tmp_path: Path) -> None:
    browser_path = chromium()
    assert demo.proc.poll() is None, f"the demo exited: {demo.text()[-5000:]}"
    check_pages(f"http://127.0.0.1:{demo.dashboard}", artifacts(), tmp_path / "chromium-profile",
                prefix="demo-", pages=DEMO_PAGES, browser_path=browser_path)


def test_an_interrupt_stops_all_of_it(demo: Demo) -> None:
    demo.stop()
    text = demo.text()
    assert demo.proc.returncode == 0, text[-5000:]
    assert "nothing left running" in text
    for port in demo.ports:
        assert not port_open(port), f"port {port} still listening after the demo stopped"
