"""The lifespan's ``on_started`` hook and the heap freeze ``vigil gateway`` runs there."""

from __future__ import annotations

import gc
from pathlib import Path

import httpx
from support.gateway import PREMIUM, gateway_config, running_gateway
from support.loopback import free_port

from serving.gateway.gateway import Gateway
from vigil_shell.gateway_cli import freeze_heap


def test_on_started_runs_once_after_start_up(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # polled once at start-up, found down
    cfg = gateway_config(tmp_path, [down])
    seen: list[bool] = []
    gateway = Gateway(cfg)

    def started() -> None:
        # The records database exists once start() has run; the replica has been polled.
        seen.append((tmp_path / "gateway.db").exists()
                    and bool(gateway.upstreams.describe()[0].get("last_error")))

    with running_gateway(cfg, gateway=gateway, on_started=started) as gw:
        assert seen == [True]
        r = httpx.get(f"{gw.url}/v1/models", headers={"Authorization": f"Bearer {PREMIUM}"})
        assert r.status_code == 200
    assert seen == [True]


def test_freeze_heap_moves_live_objects_out_of_the_generations() -> None:
    kept = [[i] for i in range(1000)]
    try:
        freeze_heap()
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()
