"""When the batch queue releases work: headroom, off-peak windows (injected clock), the
in-flight bound, retries, expiry, cancellation and retention (serving/gateway/batch/queue.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.batch import (
    NOON,
    POOL,
    ControlledLoad,
    FakeClock,
    HttpSender,
    LoopThread,
    ScriptedUpstream,
    batch_config,
    chat_line,
    file_lines,
    get_batch,
    headers,
    running_queue,
    submit,
    wait_status,
    wait_until,
)

from serving.gateway.batch.queue import _PURGE_EVERY as PURGE_EVERY
from serving.gateway.batch.queue import BatchRequest, OffPeakWindow, has_headroom, parse_off_peak
from serving.gateway.tiers import PoolLoad
from serving.sim.testing import FleetHandle, running_fleet, sample_values, total
from vigil.config import BatchConfig
from vigil.errors import ConfigError


@pytest.fixture
def fleet() -> Iterator[FleetHandle]:
    with running_fleet(1, scheduling_policy="priority") as f:
        yield f


def finished_upstream(fleet: FleetHandle) -> float:
    return total(sample_values(httpx.get(fleet.metrics_urls[0]).text),
                 "vllm:request_success_total")


# --- pure rules ------------------------------------------------------------------------------
@pytest.mark.parametrize(("load", "expected"), [
    (PoolLoad(0.59, 9, 1), True),
    (PoolLoad(0.60, 0, 1), False),  # at the KV line: no headroom
    (PoolLoad(0.10, 10, 1), False),  # at the queue line
    (PoolLoad(None, 0, 1), False),  # unknown KV usage
    (PoolLoad(0.10, None, 1), False),  # unknown queue
    (PoolLoad(0.10, 0, 0), False),  # no healthy replica
])
def test_headroom(load: PoolLoad, expected: bool) -> None:
    assert has_headroom(load, BatchConfig()) is expected


def test_off_peak_windows_wrap_midnight() -> None:
    night, late, day = parse_off_peak(["01:00-06:00", "22:30-02:00", "00:00-24:00"])
    assert night == OffPeakWindow(3600.0, 21600.0)
    at = lambda hh, mm: NOON - 12 * 3600 + hh * 3600 + mm * 60  # noqa: E731
    assert night.contains(at(1, 0)) and night.contains(at(5, 59))
    assert not night.contains(at(6, 0)) and not night.contains(at(0, 59))
    assert late.contains(at(23, 0)) and late.contains(at(1, 59)) and late.contains(at(22, 30))
    assert not late.contains(at(2, 0)) and not late.contains(at(12, 0))
    assert all(day.contains(at(h, 0)) for h in range(24))
    assert parse_off_peak(["22:00-24:00"])[0].contains(at(23, 59))


@pytest.mark.parametrize(("spec", "expected"), [
    ("1:00-6:00", "expected 'HH:MM-HH:MM'"),
    ("25:00-06:00", "not a time of day"),
    ("01:60-06:00", "not a time of day"),
    ("03:00-03:00", "starts where it ends"),
])
def test_bad_off_peak_window_names_the_entry(spec: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as info:
        parse_off_peak(["01:00-02:00", spec])
    assert info.value.key == "gateway.batch.off_peak[1]"


# --- release ---------------------------------------------------------------------------------
def test_batch_waits_for_headroom_then_goes(loop: LoopThread, fleet: FleetHandle,
                                            tmp_path: Path) -> None:
    sender = HttpSender(fleet.base_urls[0])
    load = ControlledLoad(kv_cache_usage=0.85, queue_length=0)
    with running_queue(loop, tmp_path / "gw.db", batch_config(), send=sender,
                       load=load) as (client, queue):
        b = submit(client, [chat_line(f"r{i}") for i in range(3)])
        wait_until(load.polls_after(5), what="five polls without headroom")
        assert sender.sent == [] and queue.depth(POOL) == 3
        assert get_batch(client, b["id"])["status"] == "in_progress"
        load.kv_cache_usage, load.queue_length = 0.30, 12  # KV fine, queue too long
        wait_until(load.polls_after(5))
        assert sender.sent == [] and finished_upstream(fleet) == 0
        load.idle()
        done = wait_status(client, b["id"], "completed")
        assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        assert queue.depth(POOL) == 0 and finished_upstream(fleet) == 3
    loop.call(sender.aclose())


def test_off_peak_window_releases_at_any_load(loop: LoopThread, fleet: FleetHandle,
                                              tmp_path: Path) -> None:
    sender = HttpSender(fleet.base_urls[0])
    load = ControlledLoad(kv_cache_usage=0.95, queue_length=40)  # busy all along
    clock = FakeClock(NOON)
    cfg = batch_config(off_peak=["01:00-06:00"])
    with running_queue(loop, tmp_path / "gw.db", cfg, send=sender, load=load,
                       clock=clock) as (client, queue):
        b = submit(client, [chat_line(f"n{i}") for i in range(2)])
        wait_until(load.polls_after(5))
        assert sender.sent == [] and not queue.in_off_peak()
        load.healthy_replicas = 0
        clock.now = NOON + 14 * 3600  # 02:00 the next day, but no replica is healthy
        wait_until(load.polls_after(5))
        assert sender.sent == []
        load.healthy_replicas = 1
        assert queue.in_off_peak()
        done = wait_status(client, b["id"], "completed")
        assert done["request_counts"]["completed"] == 2
        assert done["completed_at"] == int(clock.now)
    loop.call(sender.aclose())


def test_in_flight_bound_per_pool(loop: LoopThread, tmp_path: Path) -> None:
    upstream = ScriptedUpstream(hold=True)
    base, _ = loop.serve(upstream.app())
    sender = HttpSender(base)
    load = ControlledLoad()
    load.idle()
    clock = FakeClock()
    with running_queue(loop, tmp_path / "gw.db", batch_config(max_in_flight=2), send=sender,
                       load=load, clock=clock) as (client, queue):
        b = submit(client, [chat_line(f"h{i}") for i in range(5)])
        wait_until(lambda: upstream.waiting == 2, what="two requests parked upstream")
        wait_until(clock.readings_after(5), what="five more polls")
        assert len(sender.sent) == 2 and queue.depth(POOL) == 5
        loop.loop.call_soon_threadsafe(upstream.release.set)
        wait_status(client, b["id"], "completed")
        assert upstream.max_waiting == 2 and sorted(sender.sent) == [f"h{i}" for i in range(5)]
    loop.call(sender.aclose())


def test_release_order_is_oldest_batch_first_in_file_order(loop: LoopThread,
                                                           tmp_path: Path) -> None:
    upstream = ScriptedUpstream()
    base, _ = loop.serve(upstream.app())
    sender = HttpSender(base)
    load = ControlledLoad()
    with running_queue(loop, tmp_path / "gw.db", batch_config(max_in_flight=1), send=sender,
                       load=load) as (client, _):
        first = submit(client, [chat_line(x) for x in ("a3", "a1", "a2")])
        second = submit(client, [chat_line(x) for x in ("b1", "b2")], key="key-beta")
        load.idle()
        wait_status(client, first["id"], "completed")
        wait_status(client, second["id"], "completed", key="key-beta")
        assert sender.sent == ["a3", "a1", "a2", "b1", "b2"]
    loop.call(sender.aclose())


# --- failures --------------------------------------------------------------------------------
def test_5xx_is_retried_with_backoff_then_succeeds(loop: LoopThread, tmp_path: Path) -> None:
    upstream = ScriptedUpstream(fail_first=2, fail_status=503)
    base, _ = loop.serve(upstream.app())
    sender = HttpSender(base)
    load = ControlledLoad()
    load.idle()
    with running_queue(loop, tmp_path / "gw.db", batch_config(), send=sender, load=load,
                       retry_attempts=3, retry_backoff=0.01) as (client, _):
        b = wait_status(client, submit(client, [chat_line("x"), chat_line("y")])["id"],
                        "completed")
        assert b["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
        assert upstream.tries == {"x": 3, "y": 3} and b["error_file_id"] is None
    loop.call(sender.aclose())


@pytest.mark.parametrize("status", [500, 429])
def test_retries_run_out_into_the_error_file(loop: LoopThread, tmp_path: Path,
                                             status: int) -> None:
    upstream = ScriptedUpstream(fail_first=99, fail_status=status)
    base, _ = loop.serve(upstream.app())
    sender = HttpSender(base)
    load = ControlledLoad()
    load.idle()
    with running_queue(loop, tmp_path / "gw.db", batch_config(), send=sender, load=load,
                       retry_attempts=3, retry_backoff=0.01) as (client, _):
        b = wait_status(client, submit(client, [chat_line("x")])["id"], "completed")
        assert b["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
        assert b["output_file_id"] is None and upstream.tries == {"x": 3}
        [line] = file_lines(client, b["error_file_id"])
        assert line["custom_id"] == "x" and line["response"]["status_code"] == status
        assert line["response"]["body"]["error"]["message"] == "scripted failure"
    loop.call(sender.aclose())


def test_4xx_goes_to_the_error_file_without_retry(loop: LoopThread, tmp_path: Path) -> None:
    upstream = ScriptedUpstream(fail_first=99, fail_status=400)
    base, _ = loop.serve(upstream.app())
    sender = HttpSender(base)
    load = ControlledLoad()
    load.idle()
    with running_queue(loop, tmp_path / "gw.db", batch_config(), send=sender, load=load,
                       retry_attempts=3, retry_backoff=0.01) as (client, _):
        b = wait_status(client, submit(client, [chat_line("x")])["id"], "completed")
        assert upstream.tries == {"x": 1}
        assert file_lines(client, b["error_file_id"])[0]["response"]["status_code"] == 400
    loop.call(sender.aclose())


def test_unreachable_upstream_is_an_error_line(loop: LoopThread, tmp_path: Path) -> None:
    sender = HttpSender("http://127.0.0.1:9")  # discard port: connection refused
    load = ControlledLoad()
    load.idle()
    with running_queue(loop, tmp_path / "gw.db", batch_config(), send=sender, load=load,
                       retry_attempts=2, retry_backoff=0.01) as (client, _):
        b = wait_status(client, submit(client, [chat_line("x")])["id"], "completed")
        [line] = file_lines(client, b["error_file_id"])
        assert line["response"] is None and line["error"]["code"] == "upstream_error"
        assert "ConnectError" in line["error"]["message"] and "2 times" in line["error"]["message"]
        assert sender.sent == ["x", "x"]
    loop.call(sender.aclose())


# --- lifecycle -------------------------------------------------------------------------------
async def _never_sent(req: BatchRequest) -> tuple[int, dict[str, object]]:
    raise AssertionError(f"{req.custom_id} should not have been sent")


def test_expiry_after_the_completion_window(loop: LoopThread, tmp_path: Path) -> None:
    clock = FakeClock(NOON)
    load = ControlledLoad()  # never any headroom
    with running_queue(loop, tmp_path / "gw.db", batch_config(), send=_never_sent, load=load,
                       clock=clock) as (client, queue):
        b = submit(client, [chat_line("e1"), chat_line("e2")], window="2h")
        assert b["expires_at"] == int(NOON) + 7200
        clock.now = NOON + 7199
        wait_until(load.polls_after(3))
        assert get_batch(client, b["id"])["status"] == "in_progress"
        clock.now = NOON + 7200
        done = wait_status(client, b["id"], "expired")
        assert done["expired_at"] == int(NOON) + 7200 and done["completed_at"] is None
        assert done["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
        lines = file_lines(client, done["error_file_id"])
        assert [(x["custom_id"], x["error"]["code"]) for x in lines] == \
            [("e1", "batch_expired"), ("e2", "batch_expired")]
        assert queue.depth(POOL) == 0


def test_cancel_drops_queued_requests(loop: LoopThread, tmp_path: Path) -> None:
    load = ControlledLoad()
    with running_queue(loop, tmp_path / "gw.db", batch_config(), send=_never_sent,
                       load=load) as (client, queue):
        b = submit(client, [chat_line("c1"), chat_line("c2")])
        r = client.post(f"/v1/batches/{b['id']}/cancel", headers=headers())
        assert r.status_code == 200
        c = r.json()
        assert c["status"] == "cancelled" and c["cancelling_at"] and c["cancelled_at"]
        assert [x["error"]["code"] for x in file_lines(client, c["error_file_id"])] == \
            ["batch_cancelled", "batch_cancelled"]
        assert queue.depth(POOL) == 0
        again = client.post(f"/v1/batches/{b['id']}/cancel", headers=headers())
        assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_cancel_waits_for_requests_in_flight(loop: LoopThread, tmp_path: Path) -> None:
    upstream = ScriptedUpstream(hold=True)
    base, _ = loop.serve(upstream.app())
    sender = HttpSender(base)
    load = ControlledLoad()
    load.idle()
    with running_queue(loop, tmp_path / "gw.db", batch_config(max_in_flight=1), send=sender,
                       load=load) as (client, _):
        b = submit(client, [chat_line("f1"), chat_line("f2")])
        wait_until(lambda: upstream.waiting == 1)
        c = client.post(f"/v1/batches/{b['id']}/cancel", headers=headers()).json()
        assert c["status"] == "cancelling"
        loop.loop.call_soon_threadsafe(upstream.release.set)
        done = wait_status(client, b["id"], "cancelled")
        assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
        assert [x["custom_id"] for x in file_lines(client, done["output_file_id"])] == ["f1"]
        assert sender.sent == ["f1"]
    loop.call(sender.aclose())


def test_failed_request_of_a_cancelled_batch_is_not_retried(loop: LoopThread,
                                                             tmp_path: Path) -> None:
    upstream = ScriptedUpstream(hold=True, fail_first=99, fail_status=503)
    base, _ = loop.serve(upstream.app())
    sender = HttpSender(base)
    load = ControlledLoad()
    load.idle()
    with running_queue(loop, tmp_path / "gw.db", batch_config(max_in_flight=1), send=sender,
                       load=load, retry_attempts=4, retry_backoff=0.01) as (client, _):
        b = submit(client, [chat_line("f1"), chat_line("f2")])
        wait_until(lambda: upstream.waiting == 1)
        assert client.post(f"/v1/batches/{b['id']}/cancel",
                           headers=headers()).json()["status"] == "cancelling"
        loop.loop.call_soon_threadsafe(upstream.release.set)  # f1 now fails with a 503
        done = wait_status(client, b["id"], "cancelled")
        assert upstream.tries == {"f1": 1}  # not retried: its batch is cancelled
        assert [(x["custom_id"], x["error"]["code"])
                for x in file_lines(client, done["error_file_id"])] == \
            [("f1", "batch_cancelled"), ("f2", "batch_cancelled")]
    loop.call(sender.aclose())


def test_completed_batch_cannot_be_cancelled(loop: LoopThread, tmp_path: Path) -> None:
    upstream = ScriptedUpstream()
    base, _ = loop.serve(upstream.app())
    sender = HttpSender(base)
    load = ControlledLoad()
    load.idle()
    with running_queue(loop, tmp_path / "gw.db", batch_config(), send=sender,
                       load=load) as (client, _):
        b = wait_status(client, submit(client, [chat_line("d")])["id"], "completed")
        r = client.post(f"/v1/batches/{b['id']}/cancel", headers=headers())
        assert r.status_code == 409 and "already completed" in r.json()["error"]["message"]
    loop.call(sender.aclose())


def test_results_are_kept_for_the_retention_then_purged(loop: LoopThread,
                                                        tmp_path: Path) -> None:
    upstream = ScriptedUpstream()
    base, _ = loop.serve(upstream.app())
    sender = HttpSender(base)
    clock = FakeClock(NOON)
    load = ControlledLoad()
    load.idle()
    with running_queue(loop, tmp_path / "gw.db", batch_config(retention=3600.0), send=sender,
                       load=load, clock=clock) as (client, _):
        b = wait_status(client, submit(client, [chat_line("k")])["id"], "completed")
        kept = [f"/v1/batches/{b['id']}", f"/v1/files/{b['output_file_id']}",
                f"/v1/files/{b['input_file_id']}"]
        clock.now = NOON + 3599
        wait_until(clock.readings_after(5))
        assert all(client.get(p, headers=headers()).status_code == 200 for p in kept)
        # Retention is applied once a minute of the clock: gone within a minute of 3600 s.
        clock.now = NOON + 3599 + PURGE_EVERY
        wait_until(lambda: client.get(kept[0], headers=headers()).status_code == 404)
        assert all(client.get(p, headers=headers()).status_code == 404 for p in kept)
    loop.call(sender.aclose())


def test_send_sees_the_batch_caller(loop: LoopThread, tmp_path: Path) -> None:
    seen: list[BatchRequest] = []

    async def send(req: BatchRequest) -> tuple[int, dict[str, object]]:
        seen.append(req)
        await asyncio.sleep(0)
        return 200, {"id": "cmpl-1", "choices": []}

    load = ControlledLoad()
    load.idle()
    with running_queue(loop, tmp_path / "gw.db", batch_config(), send=send,
                       load=load) as (client, _):
        wait_status(client, submit(client, [chat_line("s")], key="key-alpha-2")["id"],
                    "completed", key="key-alpha-2")
    [req] = seen
    assert (req.pool, req.endpoint, req.custom_id) == (POOL, "chat", "s")
    assert (req.caller.tenant, req.caller.tier, req.caller.key_id) == \
        ("alpha", "batch", "a2a2a2a2a2a2")
    assert req.body["messages"][0]["content"] == "Say hi." and "priority" not in req.body
