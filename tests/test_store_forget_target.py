"""Forgetting a target: its health record goes, its samples stay; the collector forgets a
discovered target when it vanishes (after its staleness markers), so ``target_health()`` and
what reads it (the dashboard, ``vigil targets``) stop listing it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from collector.service import Collector
from collector.store import Store
from serving.sim.testing import running_fleet
from vigil.clock import ManualClock
from vigil.config import parse_config
from vigil.errors import StoreError
from vigil.model import SeriesKey, TargetHealth

T0 = 1_795_000_000.0
UP = SeriesKey("up", (("instance", "r1"), ("kind", "vllm"), ("pool", "p")))


def health(target: str) -> TargetHealth:
    return TargetHealth(target, "p", "vllm", f"http://{target}:8000/metrics", True,
                        T0, 0.25, 700, "")


def test_forget_drops_the_health_record_only(tmp_path: Path) -> None:
    with Store(tmp_path / "vigil.db") as store:
        store.write([(UP, "gauge", round(T0 * 1000), 1.0)])
        store.set_target_health(health("r1"))
        store.set_target_health(health("r2"))
        assert store.forget_target("r1") is True
        assert store.target_health() == [health("r2")]
        assert [p.value for p in store.points("up")[UP]] == [1.0]


def test_forgetting_an_unknown_target_is_a_no_op(tmp_path: Path) -> None:
    with Store(tmp_path / "vigil.db") as store:
        store.set_target_health(health("r1"))
        assert store.forget_target("r9") is False
        assert store.target_health() == [health("r1")]


def test_forget_joins_the_callers_transaction(tmp_path: Path) -> None:
    with Store(tmp_path / "vigil.db") as store:
        store.set_target_health(health("r1"))
        with pytest.raises(RuntimeError), store.transaction():
            store.forget_target("r1")
            raise RuntimeError("undo")
        assert store.target_health() == [health("r1")]


def test_a_read_only_store_cannot_forget(tmp_path: Path) -> None:
    with Store(tmp_path / "vigil.db") as store:
        store.set_target_health(health("r1"))
    with Store(tmp_path / "vigil.db", readonly=True) as store, \
            pytest.raises(StoreError, match="read-only"):
        store.forget_target("r1")


def _address(metrics_url: str) -> str:
    return metrics_url.removeprefix("http://").removesuffix("/metrics")


def test_the_collector_forgets_a_vanished_target_after_ending_its_series(
        tmp_path: Path) -> None:
    clock = ManualClock(T0)
    sd = tmp_path / "sd"
    sd.mkdir()
    cfg = parse_config({
        "store": {"path": "vigil.db"},
        "collector": {"scrape_interval": "15s", "scrape_timeout": "5s"},
        "pools": [{"name": "chat", "model": "m"}],
        "targets": [{"name": "static-0", "url": "http://127.0.0.1:9/metrics", "pool": "chat"}],
        "discovery": [{"name": "fleet", "files": ["sd/*.json"], "pool": "chat"}],
    }, file=str(tmp_path / "vigil.toml"))
    with running_fleet(2) as fleet:
        a, b = (_address(u) for u in fleet.metrics_urls)
        (sd / "fleet.json").write_text(json.dumps([{"targets": [a, b]}]))

        async def go() -> tuple[list[str], list[str]]:
            async with Collector(cfg, clock=clock) as c:
                await c.scrape_all()
                before = [h.target for h in c._store.target_health()]  # type: ignore[union-attr]
                clock.advance(15)
                (sd / "fleet.json").write_text(json.dumps([{"targets": [b]}]))
                assert [t.name for t in (await c.target_set.refresh(force=True)).removed] == [a]
                after = [h.target for h in c._store.target_health()]  # type: ignore[union-attr]
                return before, after

        before, after = asyncio.run(go())
    assert before == sorted([a, b, "static-0"])
    # The static target (down: nothing listens on port 9) keeps its record.
    assert after == sorted([b, "static-0"])
    with Store(cfg.store_path(), readonly=True) as store:
        assert [h.target for h in store.target_health()] == sorted([b, "static-0"])
        up_a = next(pts for k, pts in store.points("up").items()
                    if k.as_dict()["instance"] == a)
        # Its samples stay, ended by the staleness marker written before the record went.
        assert [p.value for p in up_a] == [1.0, None]
