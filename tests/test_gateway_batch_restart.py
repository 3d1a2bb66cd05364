"""The batch queue survives a gateway restart: what was in flight is sent again (at once after
a clean stop, which hands it back; once its lease has run out after a crash), and every
request has exactly one result (serving/gateway/batch/queue.py, store.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from support.batch import (
    POOL,
    ControlledLoad,
    FakeClock,
    HttpSender,
    LoopThread,
    batch_config,
    chat_line,
    file_lines,
    get_batch,
    running_queue,
    submit,
    wait_status,
    wait_until,
)

from serving.gateway.batch.queue import BatchRequest
from serving.gateway.batch.store import DEFAULT_LEASE, BatchStore, NewRequest
from serving.sim.testing import running_fleet
from vigil.conventions import BATCH_TABLE_BATCHES, BATCH_TABLE_FILES, BATCH_TABLE_REQUESTS
from vigil.storage.database import SCHEMA_TABLE


def _states(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT state, COUNT(*) FROM batch_requests GROUP BY state"))


def _handed_back(path: Path) -> list[tuple[str, float, int]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT custom_id, lease_until, attempts FROM batch_requests "
                          "WHERE state = 'in_flight' ORDER BY line").fetchall()


def test_restart_mid_batch_delivers_every_result_exactly_once(loop: LoopThread,
                                                              tmp_path: Path) -> None:
    path = tmp_path / "gw.db"
    ids = [f"q{i}" for i in range(6)]
    clock = FakeClock()
    load = ControlledLoad()
    load.idle()
    with running_fleet(1, scheduling_policy="priority") as fleet:
        first = HttpSender(fleet.base_urls[0])
        stuck = asyncio.Event()  # never set: the upstream "hangs" for q2 and later

        async def send_then_hang(req: BatchRequest) -> tuple[int, dict[str, object]]:
            if req.custom_id not in ("q0", "q1"):
                first.sent.append(req.custom_id)
                await stuck.wait()
            return await first(req)

        with running_queue(loop, path, batch_config(max_in_flight=2), send=send_then_hang,
                           load=load, clock=clock) as (client, queue):
            b = submit(client, [chat_line(x) for x in ids])
            wait_until(lambda: get_batch(client, b["id"])["request_counts"]["completed"] == 2)
            wait_until(lambda: len(first.sent) == 4, what="q2 and q3 in flight")
            wait_until(lambda: queue.depth(POOL) == 4, what="the depth of the next poll")
        # The gateway stopped with q2 and q3 in flight and q4, q5 queued; stopping cleanly,
        # it handed q2 and q3 back (lease 0) without counting a try.
        assert _states(path) == {"ok": 2, "in_flight": 2, "queued": 2}
        assert _handed_back(path) == [("q2", 0.0, 0), ("q3", 0.0, 0)]

        second = HttpSender(fleet.base_urls[0])
        with running_queue(loop, path, batch_config(max_in_flight=2), send=second,
                           load=load, clock=clock) as (client, queue):
            # Handed back: claimed at once, the clock has not moved.
            done = wait_status(client, b["id"], "completed")
            assert done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
            out = file_lines(client, done["output_file_id"])
            assert queue.depth(POOL) == 0
        loop.call(first.aclose())
        loop.call(second.aclose())
    assert [x["custom_id"] for x in out] == ids  # each once, in file order
    assert all(x["response"]["status_code"] == 200 for x in out)
    assert len({x["id"] for x in out}) == 6
    assert sorted(second.sent) == ["q2", "q3", "q4", "q5"]  # q2, q3: sent again (at least once)
    assert done["error_file_id"] is None


def test_a_restarted_store_takes_in_flight_requests_back_when_the_lease_runs_out(
        tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "gw.db")
    store.add_batch(tenant="t", key_id="k", input_file_id="file-1",
                    endpoint="/v1/chat/completions", completion_window="24h", window_s=86400,
                    metadata=None, model=None, now=0,
                    requests=[NewRequest(i + 1, f"c{i}", POOL, "/v1/chat/completions", "{}")
                              for i in range(3)])
    claimed = store.claim(POOL, 2, now=0)
    assert [c.custom_id for c in claimed] == ["c0", "c1"]
    store.close()
    reopened = BatchStore(tmp_path / "gw.db")
    assert reopened.owner != store.owner
    assert [c.custom_id for c in reopened.claim(POOL, 5, now=DEFAULT_LEASE - 1)] == ["c2"]
    assert [c.custom_id for c in reopened.claim(POOL, 5, now=DEFAULT_LEASE + 1)] == ["c0", "c1"]
    reopened.close()


def test_requests_of_a_cancelled_or_expired_batch_are_not_requeued(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "gw.db")
    ids = [store.add_batch(
        tenant="t", key_id="k", input_file_id="file-1", endpoint="/v1/chat/completions",
        completion_window=window, window_s=seconds, metadata=None, model=None, now=0,
        requests=[NewRequest(1, f"{name}-1", POOL, "/v1/chat/completions", "{}")])
        for name, window, seconds in (("cancel", "1h", 3600), ("expire", "1h", 3600),
                                      ("keep", "2h", 7200))]
    assert len(store.claim(POOL, 3, now=0)) == 3
    store.cancel(ids[0], now=10)
    assert store.expire_due(now=3600) == [ids[1]]
    store.close()  # the process stops with all three in flight
    reopened = BatchStore(tmp_path / "gw.db")
    assert [c.custom_id for c in reopened.claim(POOL, 5, now=3600)] == ["keep-1"]
    assert reopened.finalize_ready(now=3601) == ids[:2]
    statuses = [b.status for i in ids if (b := reopened.batch(i, "t")) is not None]
    assert statuses == ["cancelled", "expired", "in_progress"]
    reopened.close()


def test_tables_are_the_conventions_names(tmp_path: Path) -> None:
    BatchStore(tmp_path / "gw.db").close()
    with sqlite3.connect(tmp_path / "gw.db") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                           "AND name NOT LIKE 'sqlite_%'")}
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    assert tables == {BATCH_TABLE_FILES, BATCH_TABLE_BATCHES, BATCH_TABLE_REQUESTS, SCHEMA_TABLE}
    assert mode == "wal"
