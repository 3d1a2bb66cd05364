"""`vigil serve` in two copies with one voice, the two ways docs/serve.md describes.

* **Through Alertmanager**: both copies evaluate and post to a real Alertmanager's API, each
  from its own outbox; Alertmanager's dedup by labels makes one notification of two senders.
  One copy is killed with SIGKILL during the incident: the receiver behind Alertmanager still
  gets the alert once and its resolution once.
* **Direct webhooks, a leader on PostgreSQL**: both copies share the outbox and a lease in a
  real PostgreSQL; the leader is killed with SIGKILL while the receiver holds its request;
  the standby takes over within the lease, resends that notification with the same
  idempotency key and delivers the resolution: each arrives exactly once. The takeover time
  is printed.

The incident is a replica going away (TargetDown after three failed one-second scrapes) and
coming back (resolved): it starts and ends on cue, without load on the machine's two cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from support.alertmanager import run_alertmanager
from support.alerts import HoldFirstOfEach, Request, receiver
from support.loopback import free_port
from support.serve import MODEL, stop_process, wait_for

ROOT = Path(__file__).resolve().parent.parent
#: The leader's lease in the PostgreSQL test (seconds); the route's timeout is under half.
LEASE = 6.0
ROUTE_TIMEOUT = 2.5


def _config(path: Path, sim_base: str, *, store: str, route: str, serve: str = "") -> None:
    path.write_text(f"""
[store]
path = "{store}"
[collector]
scrape_interval = "1s"
scrape_timeout = "800ms"
[engine]
evaluation_interval = "1s"
window = "1m"
[[pools]]
name = "chat"
model = "{MODEL}"
[[targets]]
name = "r0"
url = "{sim_base}/metrics"
pool = "chat"
[alerts]
outbox_path = "{store}.alerts"
retry_initial = "500ms"
retry_max = "2s"
{serve}
[[alerts.routes]]
name = "oncall"
match = {{ alertname = "TargetDown" }}
group_by = ["alertname", "pool", "instance"]
group_wait = "1s"
group_interval = "2s"
timeout = "{ROUTE_TIMEOUT}s"
{route}
""")


@contextmanager
def _sim(port: int) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "vigil_shell.cli", "sim", "--replicas", "1", "--port", str(port),
         "--model", MODEL, "--profile", "small"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for("sim healthy", lambda: httpx.get(
            f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200, 30)
        yield proc
    finally:
        stop_process(proc)


def _serve(cfg: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "vigil_shell", "serve", "--config", str(cfg), "--listen",
             f"127.0.0.1:{port}"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def _health(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).text


def _kinds(requests: list[Request]) -> Counter[tuple[str, str]]:
    """(status, instance) of each notification: ``("firing", "r0")``, ``("resolved", "r0")``."""
    out: Counter[tuple[str, str]] = Counter()
    for r in requests:
        body = r.json()
        for a in body["alerts"]:
            out[(body["status"] if body.get("status") else a["status"],
                 a["labels"]["instance"])] += 1
    return out


@pytest.mark.slow
@pytest.mark.serial  # serve evaluates every second; a starved CPU would blur the timeline
@pytest.mark.timeout(150)
def test_two_copies_through_alertmanager_one_killed(tmp_path: Path) -> None:
    sim_port = free_port()
    sim_base = f"http://127.0.0.1:{sim_port}"
    procs: list[subprocess.Popen[bytes]] = []
    with receiver() as hook, run_alertmanager(
            tmp_path, hook, match={"alertname": "TargetDown"},
            group_by=["alertname", "pool", "instance"]) as am:
        configs = []
        for name in ("a", "b"):
            cfg = tmp_path / f"{name}.toml"
            _config(cfg, sim_base, store=f"{name}.db",
                    route=f'url = "{am.url}/api/v2/alerts"\nformat = "alertmanager_api"')
            configs.append(cfg)
        ports = [free_port(), free_port()]
        try:
            with _sim(sim_port) as sim:
                for i, cfg in enumerate(configs):
                    procs.append(_serve(cfg, ports[i], tmp_path / f"serve{i}.log"))
                for port in ports:
                    wait_for("both copies evaluating", lambda p=port: "ok: 2" in _health(p)
                             or "ok: 3" in _health(p), 30)
                os.kill(sim.pid, signal.SIGKILL)
                sim.wait(10)

                def fired() -> bool:
                    return _kinds(hook.accepted())[("firing", "r0")] >= 1

                wait_for("Alertmanager notifies the replica down", fired, 40)
                # Both copies posted it: Alertmanager holds one alert.
                assert len([a for a in am.alerts()
                            if a["labels"]["alertname"] == "TargetDown"]) == 1
                os.kill(procs[0].pid, signal.SIGKILL)
                assert procs[0].wait(10) == -signal.SIGKILL
            with _sim(sim_port):  # the replica is back: the survivor posts the resolution
                def resolved() -> bool:
                    return _kinds(hook.accepted())[("resolved", "r0")] >= 1

                wait_for("Alertmanager notifies the resolution", resolved, 40)
                time.sleep(3)  # a second resolution or firing would arrive by now
            procs[1].send_signal(signal.SIGTERM)
            assert procs[1].wait(30) == 0
        finally:
            for p in procs:
                stop_process(p)
    assert _kinds(hook.accepted()) == Counter({("firing", "r0"): 1, ("resolved", "r0"): 1}), \
        [r.json() for r in hook.accepted()]


@pytest.mark.slow
@pytest.mark.serial  # the takeover time is measured
@pytest.mark.timeout(150)
def test_two_copies_on_postgresql_the_leader_killed_mid_delivery(
        tmp_path: Path, postgres_url: str) -> None:
    sim_port = free_port()
    sim_base = f"http://127.0.0.1:{sim_port}"
    behaviour = HoldFirstOfEach()
    procs: list[subprocess.Popen[bytes]] = []
    ports = [free_port(), free_port()]
    logs = [tmp_path / "serve-a.log", tmp_path / "serve-b.log"]
    with receiver(behaviour) as hook:
        configs = []
        for name in ("a", "b"):
            cfg = tmp_path / f"{name}.toml"
            _config(cfg, sim_base, store=f"{name}.db", route=f'url = "{hook.url}"',
                    serve=f'[serve]\ndatabase = "{postgres_url}"\n'
                          f'lease_duration = "{LEASE:g}s"\nname = "copy-{name}"')
            configs.append(cfg)
        try:
            with _sim(sim_port) as sim:
                procs.append(_serve(configs[0], ports[0], logs[0]))
                wait_for("copy-a leads", lambda: "leader copy-a" in _health(ports[0]), 30)
                procs.append(_serve(configs[1], ports[1], logs[1]))
                wait_for("copy-b stands by", lambda: "standby copy-b: leader is copy-a"
                         in _health(ports[1]), 30)
                metrics = httpx.get(f"http://127.0.0.1:{ports[1]}/metrics", timeout=5).text
                assert 'vigil_serve_leader{copy="copy-b"} 0.0' in metrics
                os.kill(sim.pid, signal.SIGKILL)
                sim.wait(10)
                assert behaviour.held_one.wait(40), logs[0].read_text()[-3000:]
                # copy-a's request is in flight (its timeout is 2.5 s): kill -9 now.
                os.kill(procs[0].pid, signal.SIGKILL)
                killed_at = time.monotonic()
                assert procs[0].wait(10) == -signal.SIGKILL
                behaviour.answer_from_now_on()
                wait_for("copy-b takes over", lambda: "leader copy-b" in _health(ports[1]),
                         LEASE + 10)
                takeover = time.monotonic() - killed_at
                held = {r.key for r in behaviour.held}
                wait_for("the held notification delivered by copy-b",
                         lambda: held <= {r.key for r in hook.accepted()}, 20)
            with _sim(sim_port):
                wait_for("the resolution delivered", lambda: _kinds(hook.accepted())[
                    ("resolved", "r0")] >= 1, 40)
                time.sleep(3)  # a repeated notification would arrive by now
            metrics = httpx.get(f"http://127.0.0.1:{ports[1]}/metrics", timeout=5).text
            assert 'vigil_serve_leader{copy="copy-b"} 1.0' in metrics
            assert 'vigil_serve_lease_term{copy="copy-b"} 2.0' in metrics
            procs[1].send_signal(signal.SIGTERM)
            assert procs[1].wait(30) == 0, logs[1].read_text()[-3000:]
        finally:
            behaviour.answer_from_now_on()
            for p in procs:
                stop_process(p)

    print(f"\ntakeover: copy-b leads {takeover:.2f} s after copy-a was killed "
          f"(lease {LEASE:g} s)")
    assert takeover <= LEASE + 2.0
    accepted = hook.accepted()
    keys = Counter(r.key for r in accepted)
    assert [k for k, n in keys.items() if n > 1] == []  # nothing acknowledged twice
    assert _kinds(accepted) == Counter({("firing", "r0"): 1, ("resolved", "r0"): 1}), \
        [r.json() for r in accepted]
    # The held notification went out again under its own key, as a later attempt.
    (again,) = [r for r in accepted if r.key in held]
    assert again.attempt >= 2
    log_b = logs[1].read_text()
    assert "was being sent when the previous process stopped" in log_b
    assert "leader copy-b (term 2): delivering alerts from now on" in log_b
