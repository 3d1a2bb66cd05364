"""The collector follows file_sd: simulated vLLM replicas on 127.0.0.1 come and go by
rewriting the files, without a restart; a vanished replica's series end with staleness
markers and it stops costing at its last scrape."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from collector.service import Collector
from collector.store import Store
from serving.sim.testing import running_fleet
from slo.cost.pool import up_seconds
from slo.sources.embedded import EmbeddedSource
from vigil.clock import ManualClock
from vigil.config import parse_config

T0 = 1_795_000_000.0


def address(metrics_url: str) -> str:
    return metrics_url.removeprefix("http://").removesuffix("/metrics")


def write_json(path: Path, groups: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(groups))


def config(tmp_path: Path, refresh: str = "15s"):
    return parse_config({
        "store": {"path": "vigil.db"},
        "collector": {"scrape_interval": "15s", "scrape_timeout": "5s"},
        "pools": [{"name": "chat", "model": "m"}],
        "discovery": [{"name": "fleet", "files": ["sd/*.json", "sd/*.yaml"],
                       "refresh_interval": refresh}],
    }, file=str(tmp_path / "vigil.toml"))


def test_targets_come_and_go_with_their_series_and_cost(tmp_path):
    clock = ManualClock(T0)
    sd = tmp_path / "sd"
    with running_fleet(2) as fleet:
        a, b = (address(u) for u in fleet.metrics_urls)
        write_json(sd / "fleet.json", [{"targets": [a], "labels": {"pool": "chat",
                                                                   "zone": "z1"}}])
        cfg = config(tmp_path)

        async def go() -> None:
            async with Collector(cfg, clock=clock) as c:
                assert [t.name for t in c.targets] == [a]
                await c.scrape_all()  # T0
                clock.advance(15)
                (sd / "more.yaml").write_text(f"- targets: ['{b}']\n  labels: {{pool: chat}}\n")
                assert [t.name for t in (await c.target_set.refresh()).added] == [b]
                for _ in range(2):  # T0+15, T0+30: both
                    await c.scrape_all()
                    clock.advance(15)
                write_json(sd / "fleet.json", [])
                assert [t.name for t in (await c.target_set.refresh()).removed] == [a]
                assert [t.name for t in c.targets] == [b]
                for _ in range(2):  # T0+45, T0+60: b only
                    await c.scrape_all()
                    clock.advance(15)

        asyncio.run(go())
    with Store(cfg.store_path()) as store:
        up = {k.as_dict()["instance"]: (k, pts) for k, pts in store.points("up").items()}
        key_a, up_a = up[a]
        assert key_a.as_dict() | {"instance": "-"} == {
            "instance": "-", "pool": "chat", "kind": "vllm", "zone": "z1"}
        # Three scrapes, then the marker at the refresh that removed it; nothing after.
        assert [p.value for p in up_a] == [1.0, 1.0, 1.0, None]
        assert [p.ts_ms for p in up_a] == [round((T0 + s) * 1000) for s in (0, 15, 30, 45)]
        series_a = store.points("vllm:num_requests_running", {"instance": a})
        assert series_a and all(pts[-1].value is None for pts in series_a.values())
        assert [p.value for p in up[b][1]] == [1.0] * 4
        billed = {dict(labels)["instance"]: s for labels, s in up_seconds(
            EmbeddedSource(store), cfg, cfg.pools[0], T0 + 60, 3600).items()}
        assert billed == {a: 45.0, b: 60.0}  # a: 3 scrapes x 15 s, stopped at its last
        later = {dict(labels)["instance"]: s for labels, s in up_seconds(
            EmbeddedSource(store), cfg, cfg.pools[0], T0 + 600, 3600).items()}
        assert later[a] == 45.0


async def poll(what: str, check, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        result = await asyncio.to_thread(check)
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(0.05)


def test_scheduled_collector_scrapes_a_new_target_at_once_and_ends_a_removed_one(tmp_path):
    clock = ManualClock(T0)
    sd = tmp_path / "sd"
    write_json(sd / "fleet.json", [])
    cfg = config(tmp_path, refresh="5s")

    def up_of(name: str):
        if not cfg.store_path().exists():
            return []
        with Store(cfg.store_path(), readonly=True) as s:
            return [p.value for pts in s.points("up", {"instance": name}).values()
                    for p in pts]

    with running_fleet(1) as fleet:
        (a,) = (address(u) for u in fleet.metrics_urls)

        async def go() -> None:
            stop = asyncio.Event()
            async with Collector(cfg, clock=clock) as c:
                task = asyncio.create_task(c.run(stop))
                write_json(sd / "fleet.json", [{"targets": [a], "labels": {"pool": "chat"}}])
                clock.advance(5)  # the source is due: the loop reads it within a second
                # Scraped at once, not after its offset in a 15 s interval.
                await poll("first scrape of the new target", lambda: up_of(a) == [1.0])
                write_json(sd / "fleet.json", [])
                clock.advance(5)
                await poll("staleness marker of the removed target",
                           lambda: up_of(a) == [1.0, None])
                assert c.targets == []
                stop.set()
                await task

        asyncio.run(go())
