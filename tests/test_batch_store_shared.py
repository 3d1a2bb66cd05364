"""Several gateway instances share one batch queue (serving/gateway/batch/store.py, queue.py):
each request is claimed by one instance, a lease that runs out passes the request to another,
a stale owner writes nothing, and each batch is finalized once. Run on SQLite and, where the
fixture's server is available, on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.batch import (
    POOL,
    ControlledLoad,
    FakeClock,
    LoopThread,
    auth,
    batch_config,
    chat_line,
    file_lines,
    get_batch,
    headers,
    jsonl,
    pool_of_model,
    running_queue,
    submit,
    upload,
    wait_status,
    wait_until,
)

from serving.gateway.batch.queue import BatchQueue, BatchRequest
from serving.gateway.batch.store import MIGRATIONS, BatchStore, NewRequest
from vigil.storage.database import SCHEMA_TABLE

LEASE = 30.0
CHAT = "/v1/chat/completions"

#: The batch tables exactly as the release before leases created them.
OLD_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS batch_files (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    content BLOB NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS batch_batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    in_progress_at INTEGER,
    finalizing_at INTEGER,
    completed_at INTEGER,
    failed_at INTEGER,
    expired_at INTEGER,
    cancelling_at INTEGER,
    cancelled_at INTEGER,
    -- when the batch reached its final status: retention counts from here
    ended_at INTEGER,
    output_file_id TEXT,
    error_file_id TEXT,
    errors TEXT,
    metadata TEXT,
    model TEXT
)""",
    "CREATE INDEX IF NOT EXISTS batch_batches_tenant ON batch_batches (tenant, seq)",
    "CREATE INDEX IF NOT EXISTS batch_batches_status ON batch_batches (status)",
    """CREATE TABLE IF NOT EXISTS batch_requests (
    batch_id TEXT NOT NULL,
    custom_id TEXT NOT NULL,
    -- the batch's seq, copied so that the release order needs no join
    batch_seq INTEGER NOT NULL,
    line INTEGER NOT NULL,
    pool TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    not_before REAL NOT NULL DEFAULT 0,
    result TEXT,
    finished_at REAL,
    PRIMARY KEY (batch_id, custom_id)
)""",
    """CREATE INDEX IF NOT EXISTS batch_requests_release
    ON batch_requests (pool, state, batch_seq, line)""",
    "CREATE INDEX IF NOT EXISTS batch_requests_state ON batch_requests (batch_id, state)",
)


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """The queue's database: an SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "gw.db"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def stores(target: str | Path) -> Iterator[Callable[[str], BatchStore]]:
    """``stores(owner)``: a BatchStore on ``target`` for one instance; closed after the test."""
    opened: list[BatchStore] = []

    def make(owner: str) -> BatchStore:
        s = BatchStore(target, owner=owner, lease=LEASE)
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


def add_batch(store: BatchStore, n: int, *, prefix: str = "c", now: int = 0,
              window_s: float = 86400) -> str:
    return store.add_batch(
        tenant="t", key_id="k", input_file_id="file-in", endpoint=CHAT,
        completion_window="24h", window_s=window_s, metadata=None, model=None, now=now,
        requests=[NewRequest(i + 1, f"{prefix}{i}", POOL, CHAT, json.dumps({"i": i}))
                  for i in range(n)])


def answer(custom_id: str, who: str) -> dict[str, Any]:
    return {"id": f"batch_req_{who}_{custom_id}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": who, "body": {"by": who}},
            "error": None}


def output_lines(store: BatchStore, batch_id: str) -> list[dict[str, Any]]:
    b = store.batch(batch_id, "t")
    assert b is not None and b.output_file_id is not None
    content = store.file_content(b.output_file_id, "t")
    assert content is not None
    return [json.loads(x) for x in content.decode().splitlines()]


# --- claims and leases ----------------------------------------------------------------------
def test_concurrent_claims_get_disjoint_requests_and_all_of_them(
        stores: Callable[[str], BatchStore]) -> None:
    a, b = stores("instance-a"), stores("instance-b")
    n = 240
    add_batch(a, n)
    start = threading.Barrier(2)

    def drain(store: BatchStore) -> list[str]:
        start.wait()
        got: list[str] = []
        while claimed := store.claim(POOL, 7, now=1.0):
            got += [c.custom_id for c in claimed]
        return got

    with ThreadPoolExecutor(2) as pool:
        got_a, got_b = pool.map(drain, (a, b))
    assert not set(got_a) & set(got_b)
    assert sorted(got_a + got_b) == sorted(f"c{i}" for i in range(n))
    assert len(got_a) + len(got_b) == n  # nobody got a request twice either


def test_a_lapsed_lease_passes_to_another_instance_and_the_stale_owner_writes_nothing(
        stores: Callable[[str], BatchStore]) -> None:
    a, b = stores("instance-a"), stores("instance-b")
    batch_id = add_batch(a, 3)
    assert [c.custom_id for c in a.claim(POOL, 3, now=0)] == ["c0", "c1", "c2"]
    assert b.claim(POOL, 3, now=LEASE - 1) == []  # still A's
    assert not b.has_queued(POOL, LEASE - 1)
    assert b.has_queued(POOL, LEASE + 1)
    taken = b.claim(POOL, 3, now=LEASE + 1)  # A died, as far as anyone can tell
    assert [c.custom_id for c in taken] == ["c0", "c1", "c2"]
    assert [c.attempts for c in taken] == [1, 1, 1]  # the lapsed lease was a try
    # A was only slow: its answers come now, and are not stored.
    assert not a.finish(batch_id, "c0", ok=True, line=answer("c0", "a"), now=LEASE + 2)
    assert not a.retry_later(batch_id, "c1", attempts=1, not_before=LEASE + 3)
    assert a.renew([(batch_id, "c2")], now=LEASE + 2) == 0
    for c in taken:
        assert b.finish(batch_id, c.custom_id, ok=True, line=answer(c.custom_id, "b"),
                        now=LEASE + 4)
    assert not a.finish(batch_id, "c2", ok=True, line=answer("c2", "a"), now=LEASE + 5)
    assert a.finalize_ready(now=100) == [batch_id]
    lines = output_lines(a, batch_id)
    assert [x["custom_id"] for x in lines] == ["c0", "c1", "c2"]  # one line each
    assert {x["response"]["request_id"] for x in lines} == {"b"}
    assert a.counts(batch_id).completed == 3


def test_a_renewed_lease_is_not_taken_over(stores: Callable[[str], BatchStore]) -> None:
    a, b = stores("instance-a"), stores("instance-b")
    batch_id = add_batch(a, 2)
    assert len(a.claim(POOL, 2, now=0)) == 2
    # Only the request A still works on is renewed; the other one lapses.
    assert a.renew([(batch_id, "c0")], now=LEASE * 2 / 3) == 1
    assert [c.custom_id for c in b.claim(POOL, 2, now=LEASE + 1)] == ["c1"]
    assert a.finish(batch_id, "c0", ok=True, line=answer("c0", "a"), now=LEASE + 2)
    assert b.claim(POOL, 2, now=LEASE * 2) == []  # c0 is done, c1 is B's under a fresh lease


def test_a_lapsed_request_of_a_cancelled_batch_ends_cancelled(
        stores: Callable[[str], BatchStore]) -> None:
    a, b = stores("instance-a"), stores("instance-b")
    batch_id = add_batch(a, 2)
    assert len(a.claim(POOL, 2, now=0)) == 2
    b.cancel(batch_id, now=5)
    assert b.claim(POOL, 2, now=LEASE + 1) == []
    assert b.finalize_ready(now=LEASE + 2) == [batch_id]
    done = b.batch(batch_id, "t")
    assert done is not None and done.status == "cancelled" and done.output_file_id is None


def test_two_finalizers_at_once_write_one_output_file_per_batch(
        stores: Callable[[str], BatchStore], target: str | Path) -> None:
    a, b = stores("instance-a"), stores("instance-b")
    ids = [add_batch(a, 3, prefix=f"b{i}-") for i in range(30)]
    for claimed in iter(lambda: a.claim(POOL, 50, now=0), []):
        for c in claimed:
            assert a.finish(c.batch_id, c.custom_id, ok=True, line=answer(c.custom_id, "a"),
                            now=1)
    start = threading.Barrier(2)

    def finalize(store: BatchStore) -> list[str]:
        start.wait()
        return store.finalize_ready(now=10)

    with ThreadPoolExecutor(2) as pool:
        ended_a, ended_b = pool.map(finalize, (a, b))
    assert not set(ended_a) & set(ended_b)
    assert sorted(ended_a + ended_b) == sorted(ids)
    outputs = {}
    for batch_id in ids:
        batch = a.batch(batch_id, "t")
        assert batch is not None and batch.status == "completed"
        outputs[batch_id] = batch.output_file_id
        assert len(output_lines(a, batch_id)) == 3
    assert a.finalize_ready(now=11) == [] and b.finalize_ready(now=11) == []
    files = a._read("SELECT filename FROM batch_files WHERE purpose = 'batch_output'")
    assert sorted(r[0] for r in files) == sorted(f"{i}_output.jsonl" for i in ids)


def test_two_instances_expiring_at_once_expire_each_batch_once(
        stores: Callable[[str], BatchStore]) -> None:
    a, b = stores("instance-a"), stores("instance-b")
    ids = [add_batch(a, 2, prefix=f"b{i}-", window_s=60) for i in range(20)]
    start = threading.Barrier(2)

    def expire(store: BatchStore) -> list[str]:
        start.wait()
        return store.expire_due(now=60)

    with ThreadPoolExecutor(2) as pool:
        got_a, got_b = pool.map(expire, (a, b))
    assert not set(got_a) & set(got_b)
    assert sorted(got_a + got_b) == sorted(ids)
    assert a.claim(POOL, 100, now=61) == []
    assert sorted(a.finalize_ready(now=62) + b.finalize_ready(now=62)) == sorted(ids)
    assert {s for i in ids if (x := a.batch(i, "t")) for s in [x.status]} == {"expired"}


# --- the schema ------------------------------------------------------------------------------
def test_step_one_is_the_schema_of_the_release_before_leases() -> None:
    assert tuple(MIGRATIONS[0]) == OLD_SCHEMA


def test_an_old_schema_file_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "gw.db"
    with sqlite3.connect(path) as db:
        for ddl in OLD_SCHEMA:
            db.execute(ddl)
        db.execute("INSERT INTO batch_files VALUES ('file-in', 't', 'batch', 'in.jsonl', 3, 5, "
                   "x'7b7d0a')")
        db.execute("INSERT INTO batch_batches (id, tenant, key_id, input_file_id, endpoint, "
                   "completion_window, status, created_at, expires_at, in_progress_at) VALUES "
                   "('batch_old', 't', 'k', 'file-in', ?, '24h', 'in_progress', 5, 86405, 5)",
                   (CHAT,))
        db.executemany("INSERT INTO batch_requests (batch_id, custom_id, batch_seq, line, pool, "
                       "endpoint, body, state) VALUES ('batch_old', ?, 1, ?, ?, ?, '{}', ?)",
                       [("sent", 1, POOL, CHAT, "ok"), ("flying", 2, POOL, CHAT, "in_flight"),
                        ("waiting", 3, POOL, CHAT, "queued")])
        db.execute("UPDATE batch_requests SET result = ? WHERE custom_id = 'sent'",
                   (json.dumps(answer("sent", "old")),))
    db.close()
    store = BatchStore(path, owner="new")
    try:
        old = store.batch("batch_old", "t")
        assert old is not None and old.status == "in_progress" and old.created_at == 5
        assert store.file_content("file-in", "t") == b"{}\n"
        assert store.counts("batch_old").total == 3
        # What the old release left in flight has no lease: it is taken back at once.
        claimed = store.claim(POOL, 5, now=10)
        assert [c.custom_id for c in claimed] == ["flying", "waiting"]
        for c in claimed:
            assert store.finish(c.batch_id, c.custom_id, ok=True,
                                line=answer(c.custom_id, "new"), now=11)
        assert store.finalize_ready(now=12) == ["batch_old"]
        assert [x["custom_id"] for x in output_lines(store, "batch_old")] == [
            "sent", "flying", "waiting"]
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        version = db.execute(f"SELECT version FROM {SCHEMA_TABLE} WHERE component = "
                             "'gateway_batch'").fetchone()[0]
        columns = {r[1] for r in db.execute("PRAGMA table_info(batch_requests)")}
    db.close()
    assert version == len(MIGRATIONS)
    assert {"owner", "lease_until"} <= columns
    BatchStore(path).close()  # opening again applies nothing twice


# --- two queues on one database --------------------------------------------------------------
class CountingSender:
    """``send`` for the queue: answers 200 at once and counts every send per custom_id."""

    def __init__(self, name: str, sent: dict[str, list[str]], *,
                 hold: tuple[str, ...] = ()) -> None:
        self.name = name
        self.sent = sent
        self.hold = hold  # custom_ids answered only once ``release`` is set
        self.release = asyncio.Event()

    async def __call__(self, req: BatchRequest) -> tuple[int, dict[str, Any]]:
        self.sent.setdefault(req.custom_id, []).append(self.name)
        if req.custom_id in self.hold:
            await self.release.wait()
        await asyncio.sleep(0.01)  # long enough for the other instance to poll meanwhile
        return 200, {"id": f"chatcmpl-{req.custom_id}", "object": "chat.completion",
                     "choices": [], "by": self.name}


def test_two_gateways_share_the_queue_and_each_request_is_sent_once(
        loop: LoopThread, target: str | Path) -> None:
    load = ControlledLoad()
    load.idle()
    sent: dict[str, list[str]] = {}
    ids = [f"q{i}" for i in range(40)]
    cfg = batch_config(max_in_flight=3)
    with running_queue(loop, target, cfg, send=CountingSender("a", sent), load=load) as (
            client_a, _), \
            running_queue(loop, target, cfg, send=CountingSender("b", sent), load=load) as (
            client_b, _):
        b = submit(client_a, [chat_line(x) for x in ids])
        done = wait_status(client_b, b["id"], "completed")
        out = file_lines(client_b, done["output_file_id"])
        assert get_batch(client_a, b["id"])["output_file_id"] == done["output_file_id"]
    assert [x["custom_id"] for x in out] == ids
    assert sorted(sent) == sorted(ids)
    assert all(len(by) == 1 for by in sent.values()), sent
    assert {by[0] for by in sent.values()} == {"a", "b"}  # both took part


def outage_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "serving.gateway.batch"
            and "unreachable" in r.getMessage()]


def test_the_queue_survives_a_database_outage(
        loop: LoopThread, postgres_server: Any, postgres_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    load = ControlledLoad()
    load.idle()
    sent: dict[str, list[str]] = {}
    clock = FakeClock()
    sender = CountingSender("a", sent, hold=("q1",))
    with running_queue(loop, postgres_url, batch_config(), send=sender, load=load,
                       clock=clock) as (client, queue):
        first = submit(client, [chat_line("q0")])
        wait_status(client, first["id"], "completed")
        held = submit(client, [chat_line("q1")])
        wait_until(lambda: "q1" in sent, what="q1 sent")
        caplog.set_level(logging.WARNING, logger="serving.gateway.batch")
        caplog.set_level(logging.WARNING, logger="serving.gateway.batch_api")
        postgres_server.stop()
        try:
            # q1's answer comes while its result cannot be stored: it is kept for later.
            loop.loop.call_soon_threadsafe(sender.release.set)
            r = client.get(f"/v1/batches/{first['id']}", headers=headers())
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "database_unavailable"
            assert r.headers["retry-after"]
            # The client learns nothing of the database; the log names it.
            url = urlsplit(postgres_url)
            database = url.path.strip("/")
            for secret in (url.hostname, str(url.port), url.username, database):
                assert secret and secret not in r.text
            assert any(r.name == "serving.gateway.batch_api" and database in r.getMessage()
                       for r in caplog.records)
            wait_until(lambda: outage_logs(caplog), what="the outage in the log")
            # The loop goes on polling (each poll waits for the pool's timeout) and does not
            # log the same outage again.
            wait_until(clock.readings_after(2), what="more polls during the outage")
            assert len(outage_logs(caplog)) == 1
        finally:
            postgres_server.start()
        done = wait_status(client, held["id"], "completed")
        assert [x["custom_id"] for x in file_lines(client, done["output_file_id"])] == ["q1"]
        second = submit(client, [chat_line("q2")])
        wait_status(client, second["id"], "completed")
        wait_until(lambda: queue.depth(POOL) == 0, what="an empty queue")
    assert sent == {"q0": ["a"], "q1": ["a"], "q2": ["a"]}  # q1 was not sent again


# Serial: it bounds how long a call into the event loop takes (1 s), beside no other test.
@pytest.mark.serial
def test_a_slow_database_does_not_block_the_event_loop(loop: LoopThread, tmp_path: Path
                                                       ) -> None:
    path = tmp_path / "gw.db"
    load = ControlledLoad()
    clock = FakeClock()
    with running_queue(loop, path, batch_config(), send=CountingSender("a", {}), load=load,
                       clock=clock) as (client, _):
        wait_until(clock.readings_after(2), what="the release loop polling")
        # Another process holds the write lock: the next poll waits for it (up to SQLite's
        # busy timeout, 10 s) in the database thread.
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            seen = clock.calls
            wait_until(lambda: clock.calls > seen, what="a poll that waits for the lock")
            time.sleep(0.2)
            polls = clock.calls
            for _ in range(5):
                started = time.monotonic()
                loop.call(asyncio.sleep(0), timeout=5)
                assert time.monotonic() - started < 1.0  # the loop is free meanwhile
            assert clock.calls == polls  # while the poll still waits for the lock
        finally:
            other.execute("ROLLBACK")
            other.close()
        wait_until(clock.readings_after(2), what="polls after the lock is released")
        assert client.get("/v1/batches", headers=headers()).status_code == 200


# --- stopped batches, attempts, hand-back ---------------------------------------------------
def _put_back(store: BatchStore, batch_id: str, custom_id: str) -> None:
    """What a retry writes when it read the batch as running while another instance
    cancelled it (PostgreSQL, READ COMMITTED): the request is queued again."""
    store._db.execute("UPDATE batch_requests SET state = 'queued', owner = NULL, "
                      "lease_until = NULL WHERE batch_id = ? AND custom_id = ?",
                      (batch_id, custom_id))


def error_lines(store: BatchStore, batch_id: str) -> list[dict[str, Any]]:
    b = store.batch(batch_id, "t")
    assert b is not None and b.error_file_id is not None
    content = store.file_content(b.error_file_id, "t")
    assert content is not None
    return [json.loads(x) for x in content.decode().splitlines()]


def test_a_request_queued_again_in_a_cancelled_batch_is_not_sent_and_the_batch_ends(
        stores: Callable[[str], BatchStore]) -> None:
    a, b = stores("instance-a"), stores("instance-b")
    batch_id = add_batch(a, 2)
    assert len(a.claim(POOL, 2, now=0)) == 2
    b.cancel(batch_id, now=5)  # both in flight: the cancel leaves them to finish
    _put_back(a, batch_id, "c0")
    assert a.finish(batch_id, "c1", ok=True, line=answer("c1", "a"), now=6)
    assert b.claim(POOL, 2, now=7) == []
    assert b.finalize_ready(now=8) == [batch_id]
    done = b.batch(batch_id, "t")
    assert done is not None and done.status == "cancelled"
    assert [x["error"]["code"] for x in error_lines(b, batch_id)] == ["batch_cancelled"]


def test_a_request_queued_again_in_an_expired_batch_is_not_sent_and_the_batch_ends(
        stores: Callable[[str], BatchStore]) -> None:
    a, b = stores("instance-a"), stores("instance-b")
    batch_id = add_batch(a, 1, window_s=60)
    assert len(a.claim(POOL, 1, now=0)) == 1
    assert b.expire_due(now=60) == [batch_id]
    _put_back(a, batch_id, "c0")
    # Without headroom no claim runs: the next expiry pass ends the request instead.
    assert b.expire_due(now=61) == []
    assert b.finalize_ready(now=62) == [batch_id]
    assert [x["error"]["code"] for x in error_lines(b, batch_id)] == ["batch_expired"]


def test_a_batch_past_its_window_is_not_claimed_before_it_is_marked_expired(
        stores: Callable[[str], BatchStore]) -> None:
    a = stores("instance-a")
    add_batch(a, 1, window_s=60)
    assert a.claim(POOL, 1, now=60) == []
    assert a.expire_due(now=60)


def test_a_request_whose_lease_keeps_running_out_ends_with_an_error_line(
        target: str | Path) -> None:
    store = BatchStore(target, owner="a", lease=LEASE, max_attempts=3)
    try:
        batch_id = add_batch(store, 1)
        t = 0.0
        for attempts in (0, 1, 2):  # every instance that sends it dies
            [c] = store.claim(POOL, 1, now=t)
            assert c.attempts == attempts
            t += LEASE + 1
        assert store.claim(POOL, 1, now=t) == []  # the third lapse was the last try
        assert store.finalize_ready(now=int(t) + 1) == [batch_id]
        [line] = error_lines(store, batch_id)
        assert line["custom_id"] == "c0" and line["response"] is None
        assert line["error"]["code"] == "upstream_error"
        assert "tried 3 times" in line["error"]["message"]
    finally:
        store.close()


def test_handed_back_requests_are_claimed_at_once_and_count_no_attempt(
        stores: Callable[[str], BatchStore]) -> None:
    a, b = stores("instance-a"), stores("instance-b")
    batch_id = add_batch(a, 3)
    assert len(a.claim(POOL, 3, now=0)) == 3
    assert a.hand_back([(batch_id, "c0"), (batch_id, "c1")]) == 2
    assert b.hand_back([(batch_id, "c2")]) == 0  # not B's to hand back
    assert b.has_queued(POOL, 1)
    taken = b.claim(POOL, 3, now=1)  # long before A's lease would have run out
    assert [(c.custom_id, c.attempts) for c in taken] == [("c0", 0), ("c1", 0)]


# --- leases and the clock -------------------------------------------------------------------
def test_a_claim_reads_the_clock_inside_its_transaction(
        stores: Callable[[str], BatchStore]) -> None:
    a = stores("instance-a")
    batch_id = add_batch(a, 1)
    readings: list[float] = []

    def clock() -> float:
        readings.append(100.0 + len(readings))
        return readings[-1]

    [c] = a.claim(POOL, 1, clock)
    assert readings == [100.0] and c.leased_at == 100.0
    [[lease_until]] = a._read("SELECT lease_until FROM batch_requests WHERE batch_id = ?",
                              (batch_id,))
    assert lease_until == 100.0 + LEASE


class SteppingClock(FakeClock):
    """A clock that moves forward ``step`` seconds at every reading."""

    step: float = 0.25

    def __call__(self) -> float:
        self.now += self.step
        return super().__call__()


def _lease_until(store: BatchStore, custom_id: str) -> float:
    [[lease_until]] = store._read("SELECT lease_until FROM batch_requests WHERE custom_id = ?",
                                  (custom_id,))
    return float(lease_until)


def test_the_renewal_schedule_counts_from_the_time_the_claim_used(
        loop: LoopThread, target: str | Path, stores: Callable[[str], BatchStore]) -> None:
    load = ControlledLoad()
    load.idle()
    sender = CountingSender("a", {}, hold=("r0",))
    with running_queue(loop, target, batch_config(lease=LEASE), send=sender, load=load,
                       clock=SteppingClock()) as (client, queue):
        submit(client, [chat_line("r0")])
        wait_until(lambda: queue._held, what="r0 claimed")
        assert _lease_until(stores("reader"), "r0") == queue._renewed_at + LEASE
        loop.loop.call_soon_threadsafe(sender.release.set)


def test_renewals_wait_neither_for_api_calls_nor_for_the_release_loop(
        loop: LoopThread, target: str | Path, stores: Callable[[str], BatchStore]) -> None:
    load = ControlledLoad()
    load.idle()
    clock = FakeClock()
    sender = CountingSender("a", {}, hold=("r0",))
    reader = stores("reader")
    blocked = threading.Event()
    entered: list[str] = []

    def stuck(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            entered.append(name)
            blocked.wait(30)
            return None
        return call

    with running_queue(loop, target, batch_config(lease=LEASE), send=sender, load=load,
                       clock=clock) as (client, queue):
        submit(client, [chat_line("r0")])
        wait_until(lambda: queue._held, what="r0 claimed")
        first = _lease_until(reader, "r0")
        # Every API thread and the release loop's thread wait on a slow database call.
        queue._store.file = stuck("api")  # type: ignore[method-assign]
        queue._store.has_queued = stuck("loop")  # type: ignore[method-assign]
        callers = ThreadPoolExecutor(2)
        try:
            for _ in range(2):
                callers.submit(client.get, "/v1/files/file-x", headers=headers())
            loop.loop.call_soon_threadsafe(queue._wake.set)
            wait_until(lambda: entered.count("api") == 2 and "loop" in entered,
                       what="the executors busy")
            clock.now += LEASE / 2
            wait_until(lambda: _lease_until(reader, "r0") == clock.now + LEASE, timeout=5,
                       what="a renewal while the other threads wait")
            assert _lease_until(reader, "r0") > first
        finally:
            blocked.set()
            callers.shutdown(wait=True)
            loop.loop.call_soon_threadsafe(sender.release.set)


# --- maintenance and shutdown ---------------------------------------------------------------
def test_maintenance_runs_on_a_timer_not_on_every_wake(loop: LoopThread, tmp_path: Path
                                                       ) -> None:
    load = ControlledLoad()
    load.idle()
    poll = 0.3
    with running_queue(loop, tmp_path / "gw.db", batch_config(poll_interval=poll,
                                                              max_in_flight=1),
                       send=CountingSender("a", {}), load=load) as (client, queue):
        calls: dict[str, int] = {}

        def counting(name: str) -> Callable[..., Any]:
            fn = getattr(queue._store, name)

            def counted(*args: Any, **kwargs: Any) -> Any:
                calls[name] = calls.get(name, 0) + 1
                return fn(*args, **kwargs)
            return counted

        for name in ("has_queued", "expire_due", "finalize_ready", "purge", "depths"):
            setattr(queue._store, name, counting(name))
        started = time.monotonic()
        b = submit(client, [chat_line(f"m{i}") for i in range(20)])
        wait_status(client, b["id"], "completed")
        elapsed = time.monotonic() - started
    assert calls["has_queued"] >= 20  # every finished request woke the loop
    timer = int(elapsed / poll) + 2
    for name in ("expire_due", "finalize_ready", "depths"):
        assert calls[name] <= timer, (name, calls, elapsed)
    assert calls.get("purge", 0) <= 1  # once a minute


def test_finalizing_ends_each_batch_in_its_own_transaction(
        stores: Callable[[str], BatchStore]) -> None:
    a = stores("instance-a")
    ids = [add_batch(a, 1, prefix=f"b{i}-") for i in range(3)]
    for c in a.claim(POOL, 3, now=0):
        assert a.finish(c.batch_id, c.custom_id, ok=True, line=answer(c.custom_id, "a"), now=1)
    doings: list[str] = []
    transaction = a._db.transaction

    def counted(*args: Any, **kwargs: Any) -> Any:
        doings.append(kwargs.get("doing", ""))
        return transaction(*args, **kwargs)

    a._db.transaction = counted  # type: ignore[method-assign]
    assert a.finalize_ready(now=2) == ids
    assert len(doings) == 3


def test_closing_from_the_event_loop_does_not_block_it(loop: LoopThread, tmp_path: Path
                                                       ) -> None:
    # A queue whose database thread is busy with a slow call when it is closed.
    q = BatchQueue(tmp_path / "gw.db", batch_config(), pools=[POOL], load=ControlledLoad(),
                   send=CountingSender("a", {}), auth=auth, pool_of_model=pool_of_model)
    busy = threading.Event()
    q._executor.submit(busy.wait, 30)
    closing = asyncio.run_coroutine_threadsafe(q.aclose(), loop.loop)
    started = time.monotonic()
    loop.call(asyncio.sleep(0), timeout=5)
    assert time.monotonic() - started < 1.0 and not closing.done()
    busy.set()
    closing.result(10)
    assert q._store._db.closed


# --- text PostgreSQL cannot store ---------------------------------------------------------
def test_nul_in_a_custom_id_a_file_name_or_an_id_is_refused_not_a_server_error(
        loop: LoopThread, target: str | Path) -> None:
    load = ControlledLoad()
    with running_queue(loop, target, batch_config(), send=CountingSender("a", {}),
                       load=load) as (client, _):
        r = upload(client, jsonl([chat_line("a\u0000b")]))
        assert r.status_code == 400, r.text
        assert "NUL" in r.json()["error"]["message"]
        # Written by hand: httpx would percent-encode the NUL in the file name.
        body = (b'--x\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
                b'--x\r\nContent-Disposition: form-data; name="file"; filename="in\x00put.jsonl"'
                b"\r\nContent-Type: application/jsonl\r\n\r\n" + jsonl([chat_line("a")])
                + b"\r\n--x--\r\n")
        r = client.post("/v1/files", content=body,
                        headers={**headers(), "Content-Type": "multipart/form-data; boundary=x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "file", r.text
        for path in ("/v1/files/file-%00", "/v1/files/file-%00/content", "/v1/batches/b%00"):
            assert client.get(path, headers=headers()).status_code == 404
        r = client.post("/v1/batches", headers=headers(),
                        json={"input_file_id": "file-\u0000", "endpoint": CHAT,
                              "completion_window": "24h"})
        assert r.status_code == 404, r.text
        assert client.post("/v1/batches/b%00/cancel", headers=headers()).status_code == 404
        assert client.get("/v1/batches?after=b%00", headers=headers()).status_code == 400
