"""The replay of a recorded run reproduces the scaling decisions `vigil serve` made live.

`vigil serve`'s own ``Server`` (collector and evaluation, on a virtual clock advanced one
scrape interval per tick) watches simulated replicas on 127.0.0.1 while their load changes:
an idle stretch long enough for the scale-in hold, then a burst that fills the queue, then a
second replica coming up (the scale-out carried out, so a cooldown follows). Each tick's live
decision is read from serve's ``/metrics`` (what KEDA reads); the replay from the store at the
same instants must give the same action, desired and current replicas, every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from prometheus_client.parser import text_string_to_metric_families

from collector.store import Store
from serve.server import Server
from serving.sim.testing import FleetHandle, free_port_block, running_fleet
from slo.planning.replay import decision_counts, replay_decisions, replay_times
from slo.planning.replica.profiles import DEFAULT_MODEL
from slo.sources.embedded import EmbeddedSource
from slo.sources.open import embedded_semantics
from vigil.config import Config, parse_config
from vigil.conventions import (
    METRIC_CURRENT_REPLICAS,
    METRIC_DESIRED_REPLICAS,
    METRIC_SCALING_ACTION,
)

pytestmark = pytest.mark.slow

T0 = 1_795_000_000.0  # the virtual clock's first tick (Unix seconds)
SCRAPE_S = 15.0
IDLE_TICKS = 44  # 11 minutes: past the 10-minute scale-in hold
SECOND_REPLICA_TICK = 50
TICKS = 58
BURST = 150  # concurrent requests: 64 run (max_num_seqs of "small"), the rest queue


class VirtualClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _config(tmp_path: Path, urls: list[str]) -> Config:
    return parse_config({
        "store": {"path": str(tmp_path / "vigil.db")},
        "alerts": {"outbox_path": str(tmp_path / "outbox.db")},
        "collector": {"scrape_interval": "15s", "scrape_timeout": "2s"},
        "pools": [{"name": "chat", "model": DEFAULT_MODEL, "min_replicas": 0,
                   "max_replicas": 4}],
        "targets": [{"name": f"r{i}", "url": u, "pool": "chat"} for i, u in enumerate(urls)],
    })


@contextlib.contextmanager
def _burst(api_url: str) -> Iterator[None]:
    """``BURST`` long completions in flight on one replica until the block ends."""
    stop = threading.Event()

    async def main() -> None:
        async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(
                max_connections=BURST + 10)) as client:
            tasks = [asyncio.create_task(client.post(f"{api_url}/completions", json={
                "model": DEFAULT_MODEL, "prompt": f"tell a long story {i}",
                "max_tokens": 3000, "ignore_eos": True})) for i in range(BURST)]
            while not stop.is_set():
                await asyncio.sleep(0.05)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def _decision(metrics_text: str) -> tuple[str, int, int]:
    values: dict[str, float] = {}
    action = ""
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.labels.get("pool") != "chat":
                continue
            if s.name == METRIC_SCALING_ACTION and s.value == 1.0:
                action = s.labels["action"]
            elif s.name in (METRIC_DESIRED_REPLICAS, METRIC_CURRENT_REPLICAS):
                values[s.name] = s.value
    return (action, int(values[METRIC_DESIRED_REPLICAS]),
            int(values[METRIC_CURRENT_REPLICAS]))


def _waiting(fleet: FleetHandle) -> int:
    return fleet.replicas[0].engine.gauges().waiting


async def _live_run(config: Config, fleet: FleetHandle, second_port: int
                    ) -> list[tuple[float, tuple[str, int, int]]]:
    clock = VirtualClock(T0)
    server = Server(config, listen=("127.0.0.1", 0), clock=clock, prometheus_url="")
    await server.start(AsyncIOScheduler())  # never started: this test is the scheduler
    live: list[tuple[float, tuple[str, int, int]]] = []
    stack = contextlib.ExitStack()
    try:
        async with httpx.AsyncClient() as http:
            for k in range(TICKS):
                if k == IDLE_TICKS:
                    stack.enter_context(_burst(fleet.api_urls[0]))
                    for _ in range(200):
                        if _waiting(fleet) > 60:
                            break
                        await asyncio.sleep(0.05)
                if k == SECOND_REPLICA_TICK:
                    stack.enter_context(running_fleet(1, port=second_port))
                clock.t = T0 + k * SCRAPE_S
                await server.collector.scrape_all()
                await server.evaluate_once()
                host, port = server.listen
                text = (await http.get(f"http://{host}:{port}/metrics")).text
                live.append((clock.t, _decision(text)))
    finally:
        stack.close()
        await server.stop()
    return live


def test_the_replay_reproduces_the_live_decisions(tmp_path: Path) -> None:
    second_port = free_port_block(1)
    with running_fleet(1) as fleet:
        config = _config(tmp_path, [fleet.metrics_urls[0],
                                    f"http://127.0.0.1:{second_port}/metrics"])
        live = asyncio.run(_live_run(config, fleet, second_port))

    actions = [d[0] for _, d in live]
    # The run went through every kind of decision: the scale-in after the idle hold, the
    # scale-out on the queue, and the hold of the cooldown once the second replica was up.
    assert "scale_in" in actions[:IDLE_TICKS], actions
    assert "scale_out" in actions[IDLE_TICKS:SECOND_REPLICA_TICK + 1], actions
    assert actions[-1] == "hold" and live[-1][1][2] == 2, live[-1]

    with Store(config.store_path(), readonly=True) as store:
        # The source `vigil serve` reads the store through.
        source = EmbeddedSource(store, lookback_s=config.engine.lookback,
                                semantics=embedded_semantics(config.engine.promql_semantics))
        pool = config.pools[0]
        replayed = replay_decisions(source, config, pool, T0, T0 + (TICKS - 1) * SCRAPE_S,
                                    SCRAPE_S)
        assert [t for t, _ in replayed] == [t for t, _ in live]
        assert [(r.action, r.desired, r.current) for _, r in replayed] == [d for _, d in live]
        # The same instants given as a log's timestamps give the same answers.
        again = replay_decisions(source, config, pool, 0, 0, 1, at=[t for t, _ in live[-3:]])
        assert [r for _, r in again] == [r for _, r in replayed[-3:]]
    counts = decision_counts(replayed)
    assert sum(counts.values()) == TICKS and counts["scale_out"] >= 1


def test_replay_times_include_both_ends_on_the_grid() -> None:
    assert replay_times(0.0, 60.0, 15.0) == [0.0, 15.0, 30.0, 45.0, 60.0]
    assert replay_times(0.0, 50.0, 15.0) == [0.0, 15.0, 30.0, 45.0]
    with pytest.raises(ValueError):
        replay_times(10.0, 0.0, 15.0)
    with pytest.raises(ValueError):
        replay_times(0.0, 10.0, 0.0)
