"""A real Alertmanager (Debian's ``prometheus-alertmanager``) on a loopback port, sending its
notifications to a webhook receiver of the test's. The binary is found by
``conftest.require_binary``: missing, the test is skipped, or fails under CI."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from conftest import require_binary

from support.alerts import Receiver
from support.loopback import free_port, wait_for

__all__ = ["POLL_S", "Alertmanager", "run_alertmanager"]

#: How often the tests poll Alertmanager and the receiver (seconds).
POLL_S = 0.05


@dataclass
class Alertmanager:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    hook: Receiver

    def alerts(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v2/alerts", timeout=5)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]


@contextmanager
def run_alertmanager(workdir: Path, hook: Receiver, *, match: dict[str, str],
                     group_by: Sequence[str], group_wait: str = "1s",
                     group_interval: str = "1s") -> Iterator[Alertmanager]:
    """Alertmanager with one child route (``match``, ``group_by``, tiny waits so tests are
    quick) to ``hook``, resolutions included; everything else goes nowhere."""
    binary = require_binary("prometheus-alertmanager", also=("alertmanager",))
    cfg = workdir / "alertmanager.yml"
    matchers = "".join(f"        {k}: {json.dumps(v)}\n" for k, v in match.items())
    cfg.write_text(
        "route:\n"
        "  receiver: blackhole\n"
        "  routes:\n"
        "    - receiver: hook\n"
        "      match:\n"
        f"{matchers}"
        f"      group_by: {json.dumps(list(group_by))}\n"
        f"      group_wait: {group_wait}\n"
        f"      group_interval: {group_interval}\n"
        "receivers:\n"
        "  - name: blackhole\n"
        "  - name: hook\n"
        "    webhook_configs:\n"
        f"      - url: {hook.url}\n"
        "        send_resolved: true\n"
    )
    port = free_port()
    log = workdir / "alertmanager.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.path={workdir / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
             "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
        )
    am = Alertmanager(f"http://127.0.0.1:{port}", proc, log, hook)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"alertmanager exited: {log.read_text()[-2000:]}")
            try:
                return httpx.get(f"{am.url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("alertmanager to be ready", ready, 20, POLL_S)
        yield am
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
