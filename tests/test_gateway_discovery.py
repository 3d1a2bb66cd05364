"""The gateway follows the fleet: replicas from ``[[discovery]]`` join and leave routing while it
serves, with no restart.

Simulated vLLM replicas on 127.0.0.1, the gateway app served by uvicorn, a file_sd file
rewritten mid-test and read again by an explicit ``refresh(force=True)`` on the gateway's loop
(the sources' own interval is an hour, and so is the health poll's: whatever a test sees
happened because of that one refresh).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.gateway import (
    KEYS,
    MODEL,
    POOL,
    PREMIUM,
    STANDARD,
    GatewayHandle,
    running_gateway,
    scripted_upstream,
    wait_until,
)

from collector.discovery import ORIGIN_STATIC, TargetSet
from serving.gateway.front.api_keys import key_sha256
from serving.gateway.gateway import Gateway
from serving.gateway.upstream.replicas import Upstreams
from serving.sim.testing import FleetHandle, running_fleet
from vigil.clock import ManualClock
from vigil.config import Config, parse_config
from vigil_shell.gateway_cli import replicas_line

CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
SOURCE = "fleet"
#: How the file_sd source shows as the origin of its targets.
FILE_ORIGIN = f"file_sd {SOURCE} "
#: Steps of at least 15 ms each (the small profile): three seconds or more of streaming.
LONG_TOKENS = 200


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetHandle]:
    with running_fleet(3) as f:
        yield f


def _config(tmp_path: Path, sd_file: Path, *, static: tuple[str, ...] = (),
            refresh: str = "1h", gateway: dict[str, Any] | None = None) -> Config:
    gw: dict[str, Any] = {
        "records_path": str(tmp_path / "gateway.db"),
        # Only the arrival poll can make a discovered replica routable within a test.
        "health_interval": "1h",
        "api_keys": [{"sha256": key_sha256(k), "tenant": t, "tier": tier}
                     for k, (t, tier) in KEYS.items()],
        **(gateway or {}),
    }
    return parse_config({
        "pools": [{"name": POOL, "model": MODEL, "gpu": "H100"}],
        "targets": [{"name": f"static-{i}", "url": f"{u}/metrics", "pool": POOL}
                    for i, u in enumerate(static)],
        "discovery": [{"name": SOURCE, "files": [str(sd_file)], "pool": POOL,
                       "refresh_interval": refresh}],
        "gateway": gw,
    })


def _write_sd(path: Path, base_urls: list[str], **labels: str) -> None:
    """A file_sd file listing ``base_urls`` (as host:port), written whole at once."""
    groups = [{"targets": [u.removeprefix("http://") for u in base_urls],
               "labels": {"team": "chat", **labels}}]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)


@contextlib.contextmanager
def _gateway(cfg: Config, *, given: bool = False) -> Iterator[tuple[GatewayHandle, Any]]:
    """The gateway of ``cfg`` and the target set it follows: one it builds itself, or one
    it is ``given``."""
    if given:
        targets = TargetSet(cfg)
        gateway = Gateway(cfg, upstreams=Upstreams(cfg, targets=targets))
        with running_gateway(cfg, gateway=gateway) as gw:
            assert gw.gateway.upstreams.targets is targets
            yield gw, targets
    else:
        with running_gateway(cfg) as gw:
            assert isinstance(gw.gateway.upstreams.targets, TargetSet)
            yield gw, gw.gateway.upstreams.targets


def _refresh(gw: GatewayHandle, targets: TargetSet) -> None:
    gw.call(lambda: targets.refresh(force=True))


def _replicas(gw: GatewayHandle) -> list[dict[str, Any]]:
    return httpx.get(f"{gw.url}/health", timeout=10).json()["replicas"]


def _url_of(gw: GatewayHandle, name: str) -> str:
    return next(r["url"] for r in _replicas(gw) if r["name"] == name)


def _served_by(gw: GatewayHandle, n: int, key: str = STANDARD) -> list[str]:
    """The API bases that served ``n`` requests in a row."""
    urls = []
    with gw.http(key=key) as c:
        for _ in range(n):
            r = c.post(CHAT, json=BODY)
            assert r.status_code == 200, r.text
            urls.append(_url_of(gw, r.headers["x-vigil-replica"]))
    return urls


def _chunks(events: list[str]) -> list[dict[str, Any]]:
    """The chunks of a whole SSE stream (asserted to end with ``[DONE]``)."""
    data = [e.removeprefix("data: ") for e in events if e.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def _tokens(events: list[str]) -> int:
    """Content chunks of a whole SSE stream."""
    return sum(1 for ch in _chunks(events)
               if ch["choices"] and ch["choices"][0]["delta"].get("content"))


def test_new_replica_gets_requests_after_one_refresh(tmp_path: Path, fleet: FleetHandle) -> None:
    a, b, _ = fleet.base_urls
    sd = tmp_path / "targets.json"
    _write_sd(sd, [a])
    with _gateway(_config(tmp_path, sd)) as (gw, targets):
        assert set(_served_by(gw, 3)) == {a}
        seen = _replicas(gw)
        assert [(r["url"], r["healthy"]) for r in seen] == [(a, True)]
        assert seen[0]["origin"].startswith(FILE_ORIGIN)
        _write_sd(sd, [a, b])
        _refresh(gw, targets)
        # Polled on arrival (the poll loop is an hour away): routable at once, and sequential
        # requests alternate between the two (least outstanding, ties rotate).
        assert {r["url"]: r["healthy"] for r in _replicas(gw)} == {a: True, b: True}
        assert set(_served_by(gw, 4)) == {a, b}


def test_removed_replica_finishes_its_stream_and_gets_nothing_new(
        tmp_path: Path, fleet: FleetHandle) -> None:
    a, b, _ = fleet.base_urls
    sd = tmp_path / "targets.json"
    _write_sd(sd, [a, b])
    with _gateway(_config(tmp_path, sd)) as (gw, targets):
        body = {**BODY, "stream": True, "max_tokens": LONG_TOKENS, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        with gw.http() as c, c.stream("POST", CHAT, json=body) as stream:
            assert stream.status_code == 200
            name = stream.headers["x-vigil-replica"]
            gone = _url_of(gw, name)
            kept = b if gone == a else a
            lines = stream.iter_lines()
            events = [next(lines) for _ in range(6)]  # under way before the removal
            _write_sd(sd, [kept])
            _refresh(gw, targets)
            # Out of routing at once; still listed, draining, with its stream on it.
            listed = {r["url"]: r for r in _replicas(gw)}
            assert listed[gone]["draining"] and listed[gone]["in_flight"] == 1
            assert not listed[kept]["draining"]
            assert set(_served_by(gw, 4)) == {kept}
            events += list(lines)
        assert _tokens(events) == LONG_TOKENS
        assert _chunks(events)[-1]["usage"]["completion_tokens"] == LONG_TOKENS
        rec = gw.record(stream.headers["x-vigil-request-id"])
        assert (rec.status, rec.replica, rec.completion_tokens) == (200, name, LONG_TOKENS)
        # Its last request over, its connections are closed and it is gone.
        wait_until(lambda: not gw.gateway.upstreams.draining(), timeout=10,
                   what="the removed replica to drain")
        assert [r["url"] for r in _replicas(gw)] == [kept]


def test_pool_with_no_replica_left_answers_503(tmp_path: Path, fleet: FleetHandle) -> None:
    a = fleet.base_urls[0]
    sd = tmp_path / "targets.json"
    _write_sd(sd, [a])
    cfg = _config(tmp_path, sd, gateway={"tiers": {"standard": {"max_wait": "0.2s"}}})
    with _gateway(cfg) as (gw, targets):
        _write_sd(sd, [])
        _refresh(gw, targets)
        assert _replicas(gw) == []
        for key in (PREMIUM, STANDARD):
            with gw.http(key=key) as c:
                r = c.post(CHAT, json=BODY)
            assert r.status_code == 503
            assert r.headers["retry-after"] == "3600"
            err = r.json()["error"]
            assert (err["type"], err["code"]) == ("server_error", "no_replica")
            assert err["message"] == (f"Pool {POOL!r} has no replicas right now (none "
                                      "configured or discovered).")
        _write_sd(sd, [a])
        _refresh(gw, targets)
        assert set(_served_by(gw, 2)) == {a}


def test_static_replicas_stay_beside_discovered_ones(tmp_path: Path,
                                                      fleet: FleetHandle) -> None:
    a, b, c = fleet.base_urls
    sd = tmp_path / "targets.json"
    _write_sd(sd, [b])
    with _gateway(_config(tmp_path, sd, static=[a])) as (gw, targets):
        origins = {r["url"]: r["origin"].split(" ")[0] for r in _replicas(gw)}
        assert origins == {a: ORIGIN_STATIC, b: "file_sd"}
        _write_sd(sd, [c])
        _refresh(gw, targets)
        origins = {r["url"]: r["origin"].split(" ")[0] for r in _replicas(gw)}
        assert origins == {a: ORIGIN_STATIC, c: "file_sd"}
        assert set(_served_by(gw, 4)) == {a, c}


def test_changed_address_moves_new_requests_and_lets_old_ones_end(
        tmp_path: Path, fleet: FleetHandle) -> None:
    a, b, _ = fleet.base_urls
    sd = tmp_path / "targets.json"
    # The group's instance label names the target: a new address is a change, not a new one.
    _write_sd(sd, [a], instance="chat-x")
    with _gateway(_config(tmp_path, sd), given=True) as (gw, targets):
        assert set(_served_by(gw, 2)) == {a}
        body = {**BODY, "stream": True, "max_tokens": LONG_TOKENS, "ignore_eos": True}
        with gw.http() as c, c.stream("POST", CHAT, json=body) as stream:
            lines = stream.iter_lines()
            events = [next(lines) for _ in range(4)]
            _write_sd(sd, [b], instance="chat-x")
            _refresh(gw, targets)
            # New requests go to the new address at once (polled on the change); the stream
            # stays on the old address's connection.
            assert [(r["name"], r["url"], r["draining"]) for r in _replicas(gw)] == [
                ("chat-x", b, False), ("chat-x", a, True)]
            assert set(_served_by(gw, 3)) == {b}
            events += list(lines)
        assert _tokens(events) == LONG_TOKENS
        wait_until(lambda: not gw.gateway.upstreams.draining(), timeout=10,
                   what="the old address to drain")
        assert [r["url"] for r in _replicas(gw)] == [b]


def test_the_gateway_runs_the_refresh_loop_itself(tmp_path: Path, fleet: FleetHandle) -> None:
    a, b, _ = fleet.base_urls
    sd = tmp_path / "targets.json"
    _write_sd(sd, [a])
    clock = ManualClock()
    with running_gateway(_config(tmp_path, sd, refresh="30s"), clock=clock) as gw:
        _write_sd(sd, [a, b])
        assert [r["url"] for r in _replicas(gw)] == [a]  # not due yet
        clock.advance(30)
        wait_until(lambda: {r["url"]: r["healthy"] for r in _replicas(gw)} == {a: True, b: True},
                   timeout=10, what="the refresh loop to add the replica")
        assert set(_served_by(gw, 4)) == {a, b}


def test_static_only_config_has_no_target_set(tmp_path: Path) -> None:
    with scripted_upstream() as up:
        cfg = parse_config({
            "pools": [{"name": POOL, "model": MODEL, "gpu": "H100"}],
            "targets": [{"name": "chat-0", "url": f"{up.url}/metrics", "pool": POOL}],
            "gateway": {"records_path": str(tmp_path / "gateway.db"), "health_interval": "1h",
                        "api_keys": [{"sha256": key_sha256(STANDARD), "tenant": "acme",
                                      "tier": "standard"}]},
        })
        with running_gateway(cfg) as gw:
            assert gw.gateway.upstreams.targets is None
            assert [(r["name"], r["origin"]) for r in _replicas(gw)] == [
                ("chat-0", ORIGIN_STATIC)]


def test_start_line_names_static_replicas_and_sources(tmp_path: Path) -> None:
    cfg = _config(tmp_path, tmp_path / "targets.json", static=("http://127.0.0.1:9",),
                  refresh="30s")
    assert replicas_line(cfg) == ("replicas: static: static-0 (chat); "
                                  "discovery 'fleet' (file_sd, every 30 s)")
