"""The collector against three simulated replicas, one killed mid-run and restarted."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support.loopback import free_port, wait_for

from collector.service import Collector
from collector.store import Store
from vigil.config import Config, parse_config

pytestmark = pytest.mark.slow

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: The scrape interval of the scenario (seconds).
SCRAPE_INTERVAL_S = 0.5


def start_replica(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "vigil_shell.cli", "sim", "--replicas", "1", "--port", str(port),
         "--model", MODEL, "--profile", "small"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def wait_healthy(base: str, timeout: float = 30.0) -> None:
    wait_for(f"{base} healthy",
             lambda: httpx.get(base + "/health", timeout=1.0).status_code == 200,
             timeout, ignore=(httpx.HTTPError,))


def send_requests(base: str, n: int) -> None:
    for _ in range(n):
        r = httpx.post(
            base + "/v1/completions",
            json={"model": MODEL, "prompt": "Hello there", "max_tokens": 4, "ignore_eos": True},
            timeout=30,
        )
        assert r.status_code == 200, r.text


def kill_and_restart(tmp_path: Path) -> tuple[Config, float]:
    """Three replicas scraped every ``SCRAPE_INTERVAL_S``; the third is killed after 2.5 s and
    restarted 2.5 s later, and the collector runs 2.5 s more. Returns the config (its store
    holds what was scraped) and how long the collector ran (seconds)."""
    ports = [free_port() for _ in range(3)]
    procs = [start_replica(p) for p in ports]
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for b in bases:
            wait_healthy(b)
        for b in bases:
            send_requests(b, 3)
        cfg = parse_config({
            "store": {"path": str(tmp_path / "vigil.db")},
            "collector": {"scrape_interval": f"{SCRAPE_INTERVAL_S * 1000:.0f}ms",
                          "scrape_timeout": "400ms"},
            "pools": [{"name": "chat", "model": MODEL}],
            "targets": [
                {"name": f"r{i}", "url": f"{b}/metrics", "pool": "chat"}
                for i, b in enumerate(bases)
            ],
        })

        async def scenario() -> None:
            stop = asyncio.Event()
            async with Collector(cfg) as c:
                task = asyncio.create_task(c.run(stop))
                await asyncio.sleep(2.5)
                procs[2].kill()
                procs[2].wait()
                await asyncio.sleep(2.5)
                procs[2] = start_replica(ports[2])
                await asyncio.to_thread(wait_healthy, bases[2])
                await asyncio.to_thread(send_requests, bases[2], 1)
                await asyncio.sleep(2.5)
                stop.set()
                await task

        t0 = time.monotonic()
        asyncio.run(scenario())
        return cfg, time.monotonic() - t0
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()


# Serial: the scrape timeout is 400 ms, which a loaded machine can miss for a live replica.
@pytest.mark.serial
def test_replica_killed_and_restarted(tmp_path):
    cfg, _ = kill_and_restart(tmp_path)
    with Store(cfg.store_path()) as store:
        up = {k.as_dict()["instance"]: v for k, v in store.points("up").items()}
        # The killed replica was recorded down, then up again.
        r2 = [p.value for p in up["r2"]]
        assert 0.0 in r2, r2
        first_down = r2.index(0.0)
        assert 1.0 in r2[first_down:], "the restarted replica was never seen up again"
        down_ms = up["r2"][first_down].ts_ms
        back_ms = next(p.ts_ms for p in up["r2"][first_down:] if p.value == 1.0)
        # The others were scraped before, during and after the outage, and never marked down
        # (how closely they kept the schedule is bench/limits_bench.py's "collector fleet").
        for name in ("r0", "r1"):
            assert all(p.value == 1.0 for p in up[name]), name
            stamps = [p.ts_ms for p in up[name]]
            assert any(t < down_ms for t in stamps), (name, "before the kill")
            assert any(down_ms <= t < back_ms for t in stamps), (name, "during the outage")
            assert any(t >= back_ms for t in stamps), (name, "after the restart")
        # The counter reset is stored: the restarted process starts from zero again.
        series = store.points(
            "vllm:request_success_total", {"instance": "r2", "finished_reason": "length"}
        )
        (values,) = series.values()
        vals = [p.value for p in values if p.value is not None]
        assert vals[0] >= 3
        assert any(b < a for a, b in itertools.pairwise(vals)), vals
        health = {h.target: h for h in store.target_health()}
        assert health["r2"].up
