"""Tiers end to end on the simulator: premium overtakes a backlog, standard waits then gets 429
with Retry-After, batch keys on the synchronous endpoints need headroom."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.gateway import (
    BATCH,
    MODEL,
    PREMIUM,
    STANDARD,
    GatewayHandle,
    gateway_config,
    running_gateway,
    scripted_upstream,
    wait_until,
)

from collector.exposition import parse
from serving.gateway.admission import has_headroom, in_off_peak
from serving.gateway.tiers import PoolLoad
from serving.sim.testing import FleetHandle, running_fleet, sample_values, total
from slo.planning.replica.profiles import get_profile
from vigil.config import BatchConfig

CHAT = "/v1/chat/completions"
#: One sequence at a time: every other request waits in vLLM's queue.
ONE_AT_A_TIME = dataclasses.replace(get_profile("small"), max_num_seqs=1)
#: 10 decode steps: short, so the queue drains in a fraction of a second.
WORK = {"max_tokens": 10, "ignore_eos": True}


def _in_flight(fleet: FleetHandle) -> tuple[float, float]:
    s = sample_values(httpx.get(fleet.metrics_urls[0], timeout=10).text)
    return total(s, "vllm:num_requests_running"), total(s, "vllm:num_requests_waiting")


class Sender:
    """Sends chat requests from threads and notes the order in which they finish."""

    def __init__(self, gw: GatewayHandle) -> None:
        self.gw = gw
        self.finished: list[str] = []
        self.responses: dict[str, httpx.Response] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._client = httpx.Client(base_url=gw.url, timeout=60)  # thread-safe, shared

    def send(self, name: str, key: str) -> None:
        def run() -> None:
            r = self._client.post(CHAT, headers={"Authorization": f"Bearer {key}"}, json={
                "model": MODEL, "messages": [{"role": "user", "content": f"request {name}"}],
                **WORK})
            with self._lock:
                self.finished.append(name)
                self.responses[name] = r

        t = threading.Thread(target=run, name=name)
        t.start()
        self._threads.append(t)

    def join(self) -> None:
        for t in self._threads:
            t.join(60)
        self._client.close()


@contextlib.contextmanager
def _blocker(gw: GatewayHandle, fleet: FleetHandle) -> Iterator[None]:
    """A long streaming request occupying the replica's only slot; it is cancelled (the
    client leaves) when the block ends, and the queue behind it starts moving."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "block"}],
            "stream": True, "max_tokens": 5000, "ignore_eos": True}
    with gw.http(key=PREMIUM) as c, c.stream("POST", CHAT, json=body) as r:
        assert r.status_code == 200
        wait_until(lambda: _in_flight(fleet) == (1, 0), what="the blocker running")
        yield


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_premium_overtakes_a_backlog(tmp_path: Path, policy: str) -> None:
    with running_fleet(1, profile=ONE_AT_A_TIME, scheduling_policy=policy) as fleet:
        cfg = gateway_config(tmp_path, fleet.base_urls,
                             pool={"vllm": {"scheduling_policy": policy}})
        with running_gateway(cfg) as gw:
            sender = Sender(gw)
            backlog = ["b1", "s1", "b2", "s2", "s3"]
            with _blocker(gw, fleet):
                for i, name in enumerate(backlog, 1):
                    sender.send(name, BATCH if name.startswith("b") else STANDARD)
                    wait_until(lambda i=i: _in_flight(fleet)[1] == i, what=f"{name} queued")
                sender.send("premium", PREMIUM)
                wait_until(lambda: _in_flight(fleet)[1] == len(backlog) + 1,
                           what="premium queued")
            sender.join()
    assert all(r.status_code == 200 for r in sender.responses.values())
    if policy == "priority":
        # vLLM's priority scheduler takes the premium request (priority 0) before the batch
        # (2) and standard (1) requests that were waiting before it.
        assert sender.finished[0] == "premium", sender.finished
        assert sender.finished[1:] == ["s1", "s2", "s3", "b1", "b2"]
    else:
        # Without priority scheduling the gateway sends no priority: first come, first served.
        assert sender.finished == [*backlog, "premium"]


@pytest.fixture
def busy_fleet() -> Iterator[FleetHandle]:
    with running_fleet(1, profile=ONE_AT_A_TIME, scheduling_policy="priority") as fleet:
        yield fleet


def test_standard_waits_for_the_queue_then_goes(tmp_path: Path, busy_fleet: FleetHandle) -> None:
    cfg = gateway_config(tmp_path, busy_fleet.base_urls, gateway={
        "tiers": {"standard": {"queue_limit": 2, "max_wait": "30s"}}})
    with running_gateway(cfg) as gw:
        backlog = Sender(gw)
        sender = Sender(gw)
        with _blocker(gw, busy_fleet):
            for i in range(3):
                backlog.send(f"p{i}", PREMIUM)
            wait_until(lambda: gw.gateway.upstreams.load("chat").queue_length == 3,
                       what="the poller to see the queue")
            sender.send("standard", STANDARD)
            wait_until(lambda: gw.gateway.queue_depth().get(("chat", "standard")) == 1,
                       what="the standard request waiting at the gateway")
            assert _in_flight(busy_fleet)[1] == 3  # held at the gateway, not upstream
        backlog.join()
        sender.join()
        r = sender.responses["standard"]
        assert r.status_code == 200
        rec = gw.record(r.headers["x-vigil-request-id"])
    assert rec.queue_s > 0 and rec.tier == "standard"


def test_standard_gets_429_with_retry_after(tmp_path: Path) -> None:
    with scripted_upstream() as up:
        up.waiting = 5
        cfg = gateway_config(tmp_path, [up.url], gateway={
            "health_interval": "0.5s",
            "tiers": {"standard": {"queue_limit": 5, "max_wait": "0.3s"},
                      "premium": {"queue_limit": 0}}})
        with running_gateway(cfg) as gw, gw.http() as c:
            r = c.post(CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 429
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
            rec = gw.record(r.headers["x-vigil-request-id"])
            assert (rec.error_class, rec.error, rec.e2e_s) == ("rejected", False, None)
            assert up.bodies == []  # never sent upstream
            # Premium never waits, whatever the queue.
            with gw.http(key=PREMIUM) as p:
                ok = p.post(CHAT, json={"model": MODEL,
                                        "messages": [{"role": "user", "content": "x"}]})
            assert ok.status_code == 200 and up.bodies[-1]["priority"] == 0
            metrics = {f.name: f for f in parse(httpx.get(f"{gw.url}/metrics").text)}
    rejected = [s for s in metrics["vigil_gateway_rejections"].samples
                if s.name.endswith("_total")]
    assert [(s.labels["tier"], s.labels["reason"], s.value) for s in rejected] == [
        ("standard", "queue_full", 1.0)]


def test_batch_key_needs_headroom(tmp_path: Path) -> None:
    with scripted_upstream() as up:
        up.kv = 0.7  # above the batch headroom (0.60), below the admission line (0.90)
        cfg = gateway_config(tmp_path, [up.url], gateway={
            "tiers": {"batch": {"max_wait": "0.3s"}}})
        with running_gateway(cfg) as gw:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
            with gw.http(key=BATCH) as c:
                assert c.post(CHAT, json=body).status_code == 429
            with gw.http(key=STANDARD) as c:
                assert c.post(CHAT, json=body).status_code == 200
            assert [b["priority"] for b in up.bodies] == [1]
            up.kv = 0.2
            wait_until(lambda: gw.gateway.upstreams.load("chat").kv_cache_usage == 0.2,
                       what="the poller to see the headroom")
            with gw.http(key=BATCH) as c:
                r = c.post(CHAT, json=body)
            assert r.status_code == 200 and up.bodies[-1]["priority"] == 2
            assert gw.record(r.headers["x-vigil-request-id"]).tier == "batch"


def test_client_priority_is_overridden_and_dropped_for_fcfs(tmp_path: Path) -> None:
    with scripted_upstream() as up:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                "priority": -100}
        cfg = gateway_config(tmp_path / "a", [up.url])
        with running_gateway(cfg) as gw, gw.http(key=STANDARD) as c:
            assert c.post(CHAT, json=body).status_code == 200
        assert up.bodies[-1]["priority"] == 1
        # vLLM refuses any priority but 0 without --scheduling-policy priority.
        cfg = gateway_config(tmp_path / "b", [up.url],
                             pool={"vllm": {"scheduling_policy": "fcfs"}})
        with running_gateway(cfg) as gw, gw.http(key=STANDARD) as c:
            assert c.post(CHAT, json=body).status_code == 200
        assert "priority" not in up.bodies[-1]


def test_no_healthy_replica_is_503(tmp_path: Path) -> None:
    with scripted_upstream() as up:
        up.healthy = False
        cfg = gateway_config(tmp_path, [up.url], gateway={
            "tiers": {"standard": {"max_wait": "0.2s"}}})
        with running_gateway(cfg) as gw:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
            for key in (PREMIUM, STANDARD):
                with gw.http(key=key) as c:
                    r = c.post(CHAT, json=body)
                assert r.status_code == 503 and r.json()["error"]["code"] == "no_replica"
                assert "retry-after" in r.headers
            assert up.bodies == []


# --- unit: the batch tier's headroom rule ----------------------------------------------------

NOON = 1_794_312_000.0  # 2026-11-10 12:00:00 UTC


def test_off_peak_windows() -> None:
    assert in_off_peak(NOON, ["11:00-13:00"])
    assert not in_off_peak(NOON, ["13:00-14:00"])
    assert in_off_peak(NOON, ["23:00-12:01"])  # wraps midnight
    assert not in_off_peak(NOON, ["23:00-12:00"])  # end exclusive
    assert in_off_peak(NOON, ["00:00-24:00"])
    assert not in_off_peak(NOON, [])


def test_headroom() -> None:
    cfg = BatchConfig(headroom_kv_usage=0.6, headroom_queue_length=10, off_peak=["11:00-13:00"])
    busy = PoolLoad(kv_cache_usage=0.9, queue_length=30, healthy_replicas=1)
    idle = PoolLoad(kv_cache_usage=0.1, queue_length=0, healthy_replicas=1)
    unknown = PoolLoad(kv_cache_usage=None, queue_length=None, healthy_replicas=1)
    evening = NOON + 8 * 3600
    assert has_headroom(idle, cfg, evening)
    assert not has_headroom(busy, cfg, evening)
    assert not has_headroom(PoolLoad(0.1, 10, 1), cfg, evening)  # queue must be below 10
    assert not has_headroom(unknown, cfg, evening)
    assert has_headroom(busy, cfg, NOON)  # off-peak: any load


def test_client_leaving_while_it_waits_is_let_go(tmp_path: Path) -> None:
    with scripted_upstream() as up:
        up.waiting = 9
        cfg = gateway_config(tmp_path, [up.url], gateway={
            "tiers": {"standard": {"queue_limit": 5, "max_wait": "60s"}}})
        with running_gateway(cfg) as gw, gw.http() as c:
            with pytest.raises(httpx.ReadTimeout):
                c.post(CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                       timeout=httpx.Timeout(10, read=0.5))
            wait_until(lambda: not gw.gateway.admission.waiting, what="the waiter let go")
            records = wait_until(lambda: gw.all_records(), what="the record")
    assert [(r.status, r.error_class, r.replica) for r in records] == [
        (499, "client_cancel", "")]
    assert up.bodies == []
