"""A real ``kill -9`` of a delivering process: after a restart, the receiver has every
notification, and no acknowledged one was sent twice.

A driver script (the notifier as ``vigil serve`` runs it: system clock, real outbox file)
queues 12 notifications in 3 groups, then delivers them to a receiver that stalls on the
fifth request. The test kills the driver with SIGKILL while that request is in flight, runs
the driver again, and checks what the receiver got.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from support.alerts import Request, receiver

from alerts.outbox import Outbox

ROOT = Path(__file__).resolve().parent.parent

DRIVER = r'''
import asyncio, sys, time
from alerts.model import Alert
from alerts.notifier import Notifier
from vigil.config import parse_config

url, db, mode = sys.argv[1:4]
cfg = parse_config({"alerts": {"retry_initial": 0.05, "retry_max": 0.2, "routes": [
    {"name": "hook", "url": url, "group_wait": 10, "group_interval": 60, "timeout": 60,
     "group_by": ["alertname", "slo"]}]}})
notifier = Notifier(cfg, db)
if mode == "enqueue":
    t0 = time.time() - 3600
    for k in range(5):
        # Each step adds one alert to each of the groups s0, s1, s2: 4 notifications each.
        alerts = [Alert({"alertname": "SLOBurnRate", "slo": f"s{g}", "model": f"m{j}",
                         "pool": "chat", "severity": "page"}, starts_at=t0)
                  for g in range(3) for j in range(k + 1)]
        notifier.process(t0 + 60 * k, alerts)
    print("queued", notifier.counters().queue_depth, flush=True)
while notifier.counters().queue_depth:
    asyncio.run(notifier.deliver_due())
    time.sleep(0.02)
print("done", flush=True)
'''

STALL_AT = 5


@pytest.mark.slow
def test_kill_9_during_delivery_then_restart(tmp_path: Path) -> None:
    stalled = threading.Event()
    release = threading.Event()
    lock = threading.Lock()
    count = [0]
    stalled_key: list[str] = []

    def stall_fifth(req: Request) -> tuple[int, bytes]:
        with lock:
            count[0] += 1
            n = count[0]
        if n == STALL_AT:
            stalled_key.append(req.key)
            stalled.set()
            release.wait(30)  # the sender is dead by then: this answer goes nowhere
        return 200, b"ok"

    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    db = tmp_path / "outbox.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(mode: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"{mode}.log").open("wb")
        try:
            return subprocess.Popen([sys.executable, str(driver), rec.url, str(db), mode],
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()

    with receiver(stall_fifth) as rec:
        first = run("enqueue")
        try:
            assert stalled.wait(60), (tmp_path / "enqueue.log").read_text()
            os.kill(first.pid, signal.SIGKILL)
            assert first.wait(30) == -signal.SIGKILL
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        release.set()

        # The state the killed process left behind.
        ob = Outbox(db)
        rows = ob.items()
        ob.close()
        assert len(rows) == 12
        acked_before = {r.key for r in rows if r.status == "done"}
        in_flight = [r for r in rows if r.inflight_since is not None]
        [key_in_flight] = stalled_key
        assert acked_before, "some notifications were acknowledged before the kill"
        assert key_in_flight in {r.key for r in in_flight}
        assert key_in_flight not in acked_before

        second = run("resume")
        try:
            assert second.wait(60) == 0, (tmp_path / "resume.log").read_text()
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()
        assert "done" in (tmp_path / "resume.log").read_text()

    ob = Outbox(db)
    rows = ob.items()
    ob.close()
    keys = {r.key for r in rows}
    assert all(r.status == "done" for r in rows)
    received = Counter(r.key for r in rec.requests)
    assert set(received) == keys  # every notification arrived; nothing else did
    for key in acked_before:
        assert received[key] == 1, "an acknowledged notification was sent again"
    # The in-flight one was retried with the same key and the next attempt number.
    retried = [r for r in rec.requests if r.key == key_in_flight]
    assert [r.attempt for r in retried] == [1, 2]
    # A receiver that drops repeated keys processes each notification once, in group order.
    deduped = rec.deduped()
    assert sorted(r.key for r in deduped) == sorted(keys)
    by_key = {r.key: r for r in rows}
    for group in {r.group_key for r in rows}:
        seqs = [by_key[r.key].seq for r in deduped if by_key[r.key].group_key == group]
        assert seqs == [1, 2, 3, 4]
