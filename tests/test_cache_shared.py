"""The semantic cache shared through the gateway database: two caches on one database act as
two gateway instances (exact and paraphrase hits cross over after one sync, expired rows are
never served, the purge bound holds, an unreachable database costs sharing, never a request),
on SQLite and on a real PostgreSQL server, with the real all-MiniLM-L6-v2."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.cache import T0, answer, ask, chat, config, decide, local_embedder
from support.postgres import postgres_server, postgres_url  # noqa: F401

from serving.cache import SemanticCache
from serving.cache.shared import SharedEntries
from serving.gateway.caching import CacheBridge
from vigil.clock import ManualClock
from vigil.errors import StoreError
from vigil.storage.database import open_database

PASSWORD = "How do I reset my password?"
PARAPHRASE = "What is the way to reset my password?"
PASSWORD_ANSWER = "Open Settings, then Security, then Reset password."
#: Long enough that only the explicit syncs of a test read the database.
QUIET = 3600.0


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """The gateway database: an SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "gateway.db"
    return str(request.getfixturevalue("postgres_url"))


def instance(target: str | Path, clock: ManualClock, name: str,
             **overrides: Any) -> SemanticCache:
    """One gateway instance's cache on ``target``."""
    return SemanticCache.from_config(config(sync_interval=QUIET, **overrides), clock=clock,
                                     embedder=local_embedder(), database=target, origin=name)


async def store(cache: SemanticCache, body: dict[str, Any], text: str) -> None:
    """Look ``body`` up (a miss) and store ``text`` as its answer, as the gateway does."""
    key = decide(cache, body).key
    assert key is not None
    assert await cache.lookup(key) is None
    await cache.store(key, answer(text))


def content(hit: Any) -> str:
    return str(hit.response["choices"][0]["message"]["content"])


def rows(target: str | Path) -> list[tuple[Any, ...]]:
    db = open_database(target, what="the cache entries")
    try:
        return [tuple(r) for r in db.query(
            "SELECT seq, l1, origin, expires_at FROM cache_entries ORDER BY seq")]
    finally:
        db.close()


def test_an_answer_stored_by_one_instance_is_an_exact_hit_on_another(
        target: str | Path) -> None:
    async def go() -> None:
        clock = ManualClock(T0)
        a, b = instance(target, clock, "a"), instance(target, clock, "b")
        await a.start()
        await b.start()
        try:
            await store(a, chat(PASSWORD), PASSWORD_ANSWER)
            assert await ask(b, chat(PASSWORD)) is None  # not synced yet
            await a.sync_now()
            await b.sync_now()
            hit = await ask(b, chat(PASSWORD))
            assert hit is not None and hit.layer == "l1"
            assert content(hit) == PASSWORD_ANSWER
            assert hit.response["id"] != "chatcmpl-upstream0000"  # a fresh identity
            assert (a.stats().shared_written, b.stats().shared_applied) == (1, 1)
            await a.sync_now()
            assert a.stats().shared_applied == 0  # its own rows are not read back
        finally:
            await a.aclose()
            await b.aclose()
        [(_, _, origin, expires_at)] = rows(target)
        assert (origin, expires_at) == ("a", T0 + 3600)
    asyncio.run(go())


def test_a_paraphrase_stored_by_one_instance_hits_the_others_vector_index(
        target: str | Path) -> None:
    async def go() -> None:
        clock = ManualClock(T0)
        a, b = instance(target, clock, "a"), instance(target, clock, "b")
        await a.start()
        await b.start()
        try:
            await store(a, chat(PASSWORD), PASSWORD_ANSWER)
            await a.sync_now()
            await b.sync_now()
            assert b.stats().partitions == 1
            hit = await ask(b, chat(PARAPHRASE))
            assert hit is not None and hit.layer == "l2"
            assert 0.95 < hit.similarity <= 1.0 and content(hit) == PASSWORD_ANSWER
            # The negation guard applies to shared entries as to local ones.
            assert await ask(b, chat("How do I not reset my password?")) is None
        finally:
            await a.aclose()
            await b.aclose()
    asyncio.run(go())


def test_the_other_instance_is_updated_by_its_own_reader(target: str | Path) -> None:
    async def go() -> None:
        clock = ManualClock(T0)
        a = instance(target, clock, "a")
        b = SemanticCache.from_config(config(sync_interval=0.05), clock=clock,
                                      embedder=local_embedder(), database=target, origin="b")
        await a.start()
        await b.start()
        try:
            await store(a, chat(PASSWORD), PASSWORD_ANSWER)
            for _ in range(400):  # the reader thread polls every 50 ms; no lookup needed
                if b.stats().entries:
                    break
                await asyncio.sleep(0.01)
            assert b.stats().shared_applied == 1
            hit = await ask(b, chat(PASSWORD))
            assert hit is not None and hit.layer == "l1"
        finally:
            await a.aclose()
            await b.aclose()
    asyncio.run(go())


def test_expired_entries_are_not_served(target: str | Path) -> None:
    async def go() -> None:
        clock = ManualClock(T0)
        a, b = instance(target, clock, "a", ttl=60), instance(target, clock, "b", ttl=3600)
        await a.start()
        await b.start()
        try:
            await store(a, chat(PASSWORD), PASSWORD_ANSWER)
            await store(a, chat("What is the capital of France?"), "Paris.")
            await a.sync_now()
            await b.sync_now()  # the capital is applied before it expires ...
            clock.advance(61)
            await a.sync_now()  # ... the password row is read after
            await b.sync_now()
            # Each row keeps the expiry it was stored with (A's 60 s, not B's 3600 s).
            assert await ask(b, chat("What is the capital of France?")) is None
            assert await ask(b, chat(PASSWORD)) is None
            assert await ask(b, chat(PARAPHRASE)) is None
        finally:
            await a.aclose()
            await b.aclose()
        # A third instance starting now loads none of them.
        c = instance(target, clock, "c")
        await c.start()
        try:
            assert c.stats().entries == 0
            assert await ask(c, chat(PASSWORD)) is None
        finally:
            await c.aclose()
    asyncio.run(go())


def test_the_purge_keeps_the_newest_max_entries_live_rows(target: str | Path) -> None:
    async def go() -> None:
        clock = ManualClock(T0)
        a = instance(target, clock, "a", max_entries=3, ttl=100)
        await a.start()
        try:
            for i in range(5):
                await store(a, chat(f"Question number {i} about billing?"), f"Answer {i}.")
                clock.advance(10)
            await a.sync_now()
            assert len(rows(target)) == 5
            assert a.shared is not None
            assert a.shared.purge() == 2  # beyond max_entries, oldest seq first
            kept = rows(target)
            assert [r[3] for r in kept] == [T0 + 120, T0 + 130, T0 + 140]
            clock.advance(75)  # now T0 + 125: the first kept row has expired
            assert a.shared.purge() == 1
            assert [r[3] for r in rows(target)] == [T0 + 130, T0 + 140]
        finally:
            await a.aclose()
        b = instance(target, clock, "b", max_entries=3, ttl=100)
        await b.start()
        try:
            hit = await ask(b, chat("Question number 4 about billing?"))
            assert hit is not None and content(hit) == "Answer 4."
            assert await ask(b, chat("Question number 2 about billing?")) is None
        finally:
            await b.aclose()
    asyncio.run(go())


def test_the_start_loads_only_the_newest_max_entries(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(T0)
        a = instance(tmp_path / "gateway.db", clock, "a")
        await a.start()
        for i in range(4):
            await store(a, chat(f"Question number {i} about billing?"), f"Answer {i}.")
        await a.aclose()
        b = instance(tmp_path / "gateway.db", clock, "b", max_entries=2)
        await b.start()
        try:
            assert b.stats().entries == 2
            assert await ask(b, chat("Question number 3 about billing?")) is not None
            assert await ask(b, chat("Question number 1 about billing?")) is None
        finally:
            await b.aclose()
    asyncio.run(go())


def test_a_single_gateway_keeps_its_entries_across_a_restart(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(T0)
        first = instance(tmp_path / "gateway.db", clock, "first")
        await first.start()
        await store(first, chat(PASSWORD), PASSWORD_ANSWER)
        await first.aclose()  # writes what is queued
        again = instance(tmp_path / "gateway.db", clock, "again")
        await again.start()
        try:
            l1 = await ask(again, chat(PASSWORD))
            l2 = await ask(again, chat(PARAPHRASE))
            assert l1 is not None and l1.layer == "l1"
            assert l2 is not None and l2.layer == "l2"
            clock.advance(3601)  # the TTL still applies
            assert await ask(again, chat(PASSWORD)) is None
        finally:
            await again.aclose()
    asyncio.run(go())


def test_an_unreachable_database_drops_and_counts_stores(tmp_path: Path) -> None:
    (tmp_path / "not-a-directory").write_text("")
    target = tmp_path / "not-a-directory" / "gateway.db"

    async def go() -> None:
        clock = ManualClock(T0)
        a = instance(target, clock, "a")
        await a.start()  # no exception: the cache runs unshared
        try:
            await store(a, chat(PASSWORD), PASSWORD_ANSWER)
            await a.sync_now()
            hit = await ask(a, chat(PASSWORD))
            assert hit is not None and hit.layer == "l1"
            hit = await ask(a, chat(PARAPHRASE))
            assert hit is not None and hit.layer == "l2"
            stats = a.stats()
            assert (stats.shared_written, stats.shared_dropped, stats.stores) == (0, 1, 1)
        finally:
            await a.aclose()
    asyncio.run(go())


def test_a_database_that_goes_down_costs_sharing_not_requests(
        postgres_server: Any, postgres_url: str) -> None:  # noqa: F811
    async def go() -> None:
        clock = ManualClock(T0)
        a, b = instance(postgres_url, clock, "a"), instance(postgres_url, clock, "b")
        await a.start()
        await b.start()
        try:
            await store(a, chat(PASSWORD), PASSWORD_ANSWER)
            await a.sync_now()
            await b.sync_now()
            postgres_server.stop()
            try:
                await store(a, chat("What is the capital of France?"), "Paris.")
                await a.sync_now()  # the write fails: dropped and counted
                await b.sync_now()  # the read fails: nothing new, no exception
                assert a.stats().shared_dropped == 1
                hit = await ask(a, chat("What is the capital of France?"))
                assert hit is not None  # still served where it was stored
                hit = await ask(b, chat(PARAPHRASE))
                assert hit is not None and hit.layer == "l2"  # what B had, B keeps
                assert await ask(b, chat("What is the capital of France?")) is None
            finally:
                postgres_server.start()
            await store(a, chat("Which port does the gateway listen on?"), "8080.")
            await a.sync_now()
            await b.sync_now()  # back: sharing resumes
            assert await ask(b, chat("Which port does the gateway listen on?")) is not None
            assert a.stats().shared_written == 2
        finally:
            await a.aclose()
            await b.aclose()
    asyncio.run(go())


def test_a_full_queue_drops_and_counts(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    shared = SharedEntries(tmp_path / "gateway.db", clock=clock, max_entries=10,
                           max_queue=2, origin="a")
    for i in range(5):  # not started: nothing drains the queue
        shared.publish(l1=f"k{i}", body=b"{}", l2_partition=None, query=None, vector=None,
                       expires_at=T0 + 60)
    assert shared.dropped == 3
    shared.start()
    assert shared.flush()
    shared.close()
    assert (shared.written, shared.dropped) == (2, 3)


def test_another_embedding_model_is_shared_on_the_exact_layer_only(
        target: str | Path) -> None:
    async def go() -> None:
        clock = ManualClock(T0)
        b = instance(target, clock, "b")
        await b.start()
        other = SharedEntries(target, clock=clock, max_entries=10, origin="other-model")
        other.start()
        try:
            await store(b, chat("What is the capital of France?"), "Paris.")  # B's dim known
            probe = decide(b, chat(PASSWORD)).key
            assert probe is not None
            body = b'{"id":"x","object":"chat.completion","created":1,"model":"m",' \
                   b'"choices":[{"index":0,"message":{"role":"assistant","content":"8-d"},' \
                   b'"finish_reason":"stop"}],"usage":null}'
            vector = np.ones(8, dtype=np.float32) / np.sqrt(8)
            other.publish(l1=probe.l1, body=body, l2_partition=probe.l2_partition,
                          query=probe.query, vector=vector, expires_at=T0 + 60)
            assert other.flush()
            await b.sync_now()
            assert b.stats().shared_applied == 1
            hit = await ask(b, chat(PASSWORD))
            assert hit is not None and hit.layer == "l1" and content(hit) == "8-d"
            assert b.stats().partitions == 1  # B's own 384-d entry only
            assert await ask(b, chat(PARAPHRASE)) is None
        finally:
            other.close()
            await b.aclose()
    asyncio.run(go())


def test_a_disabled_cache_opens_nothing(tmp_path: Path) -> None:
    async def go() -> None:
        bridge = CacheBridge(config(enabled=False), database=tmp_path / "gateway.db")
        await bridge.warm_up()
        await bridge.aclose()
        cache = SemanticCache.from_config(config(enabled=False), embedder=local_embedder(),
                                          database=tmp_path / "gateway.db")
        await cache.start()
        assert cache.shared is None
        await cache.aclose()
    asyncio.run(go())
    assert not (tmp_path / "gateway.db").exists()


def test_the_bridge_shares_through_its_database(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(T0)
        target = tmp_path / "gateway.db"
        a = CacheBridge(config(), clock=clock, cache=instance(target, clock, "a"))
        b = CacheBridge(config(), clock=clock, cache=instance(target, clock, "b"))
        await a.warm_up()
        await b.warm_up()
        try:
            key = a.decide(pool="chat", tenant="acme", endpoint="chat", body=chat(PASSWORD),
                           headers={}).key
            a.store_later(key, answer(PASSWORD_ANSWER), cost_usd=0.002)
            await a.drain()
            await a._cache.sync_now()
            await b._cache.sync_now()
            decision = b.decide(pool="chat", tenant="acme", endpoint="chat",
                                body=chat(PARAPHRASE), headers={})
            hit = await b.lookup(decision.key)
            assert hit is not None and b.hit_header(hit) == "hit-l2"
        finally:
            await a.aclose()
            await b.aclose()
    asyncio.run(go())


def test_a_row_committed_after_a_later_one_is_still_read(postgres_url: str) -> None:  # noqa: F811
    # PostgreSQL hands out seq before commit: seq 1 may become visible after seq 2 was read.
    import psycopg

    from serving.cache.shared import _INSERT

    def insert(conn: Any, l1: str) -> None:
        conn.execute(_INSERT.replace("?", "%s"),
                     (l1, None, b"{}", None, None, None, T0, T0 + 60, "writer"))

    def read() -> list[str]:
        reader.sync()
        return [e.l1 for e in reader.take()]

    reader = SharedEntries(postgres_url, clock=ManualClock(T0), max_entries=10, origin="r")
    try:
        assert reader.sync() == 0  # opens the database, creates the table
        with psycopg.connect(postgres_url) as slow, psycopg.connect(postgres_url) as fast:
            insert(slow, "early")  # seq 1, not committed yet
            with fast.transaction():
                insert(fast, "late")  # seq 2
            assert read() == ["late"]
            slow.commit()
        assert read() == ["early"]
        assert read() == []  # and not twice
    finally:
        reader.close()


def publish(shared: SharedEntries, l1: str, *, query: str | None = None,
            partition: str | None = None) -> None:
    """Queue one entry (a 4-d unit vector when it has a query)."""
    vector = None if query is None else np.full(4, 0.5, dtype=np.float32)
    shared.publish(l1=l1, body=b"{}", l2_partition=partition, query=query, vector=vector,
                   expires_at=T0 + 60)


def test_a_prompt_with_nul_is_shared_with_its_batch(target: str | Path) -> None:
    # PostgreSQL refuses NUL in text: it must cost neither the row nor the 500-row batch.
    clock = ManualClock(T0)
    writer = SharedEntries(target, clock=clock, max_entries=10, origin="w")
    reader = SharedEntries(target, clock=clock, max_entries=10, origin="r")
    publish(writer, "before")
    publish(writer, "nul", query="reset\x00password", partition="chat\x00m")
    publish(writer, "after")
    writer.start()  # one batch: all three were queued before the thread ran
    try:
        assert writer.flush()
        assert (writer.written, writer.dropped, writer.rejected) == (3, 0, 0)
        reader.sync()
        entries = {e.l1: e for e in reader.take()}
        assert sorted(entries) == ["after", "before", "nul"]
        assert entries["nul"].query == "reset\ufffdpassword"  # the same on both databases
        assert entries["nul"].l2_partition == "chat\ufffdm"
    finally:
        writer.close()
        reader.close()


def test_a_row_the_database_refuses_costs_only_that_row(target: str | Path) -> None:
    # A lone surrogate (valid in JSON, "\ud800") cannot be encoded to UTF-8 by either driver.
    clock = ManualClock(T0)
    writer = SharedEntries(target, clock=clock, max_entries=10, origin="w")
    publish(writer, "good-1")
    publish(writer, "bad", query="reset \ud800 password", partition="chat")
    publish(writer, "good-2")
    writer.start()
    try:
        assert writer.flush()
        assert (writer.written, writer.rejected, writer.dropped) == (2, 1, 1)
        assert not writer._down  # a refused row is no outage ...
        publish(writer, "queued-at-shutdown")
    finally:
        writer.close()  # ... so what is queued at shutdown is still written
    assert writer.written == 3
    assert [r[1] for r in rows(target)] == ["good-1", "good-2", "queued-at-shutdown"]


def test_a_row_committed_late_during_the_start_is_still_read(
        postgres_url: str) -> None:  # noqa: F811
    # The initial load must settle like any read: seq 1 commits after the load saw seq 2.
    import psycopg

    from serving.cache.shared import _INSERT

    def insert(conn: Any, l1: str) -> None:
        conn.execute(_INSERT.replace("?", "%s"),
                     (l1, None, b"{}", None, None, None, T0, T0 + 60, "writer"))

    creator = SharedEntries(postgres_url, clock=ManualClock(T0), max_entries=10, origin="x")
    assert creator.sync() == 0  # creates the table
    creator.close()
    reader = SharedEntries(postgres_url, clock=ManualClock(T0), max_entries=10, origin="r")
    try:
        with psycopg.connect(postgres_url) as slow, psycopg.connect(postgres_url) as fast:
            insert(slow, "early")  # seq 1, not committed yet
            with fast.transaction():
                insert(fast, "late")  # seq 2
            assert reader.sync() == 1  # the load
            assert [e.l1 for e in reader.take()] == ["late"]
            slow.commit()
        assert reader.sync() == 1
        assert [e.l1 for e in reader.take()] == ["early"]
        assert reader.sync() == 0  # and not twice
    finally:
        reader.close()


class FailingFetch:
    """A database whose next fetch of rows by ``seq`` fails (listing still works)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.fail = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)

    def query(self, sql: str, params: Any = (), **kwargs: Any) -> list[Any]:
        if "seq IN" in sql and self.fail:
            self.fail = False
            raise StoreError("cannot read new cache entries: connection reset")
        return self.db.query(sql, params, **kwargs)


def test_a_failed_fetch_loses_no_row(target: str | Path) -> None:
    clock = ManualClock(T0)
    writer = SharedEntries(target, clock=clock, max_entries=10, origin="w")
    reader = SharedEntries(target, clock=clock, max_entries=10, origin="r")
    try:
        assert reader.sync() == 0  # loaded (empty)
        writer.start()
        publish(writer, "shared")
        assert writer.flush() and writer.written == 1
        assert reader._db is not None
        reader._db = FailingFetch(reader._db)  # type: ignore[assignment]
        assert reader.sync() == 0  # the fetch failed
        assert reader.sync() == 1  # the row was not marked seen: read now
        assert [e.l1 for e in reader.take()] == ["shared"]
        assert reader.sync() == 0
    finally:
        writer.close()
        reader.close()


class PurgeFails(SharedEntries):
    """Its first purge fails with an error that is not the database's."""

    purges = 0

    def _purge(self, db: Any) -> int:
        self.purges += 1
        if self.purges == 1:
            raise RuntimeError("unexpected")
        return super()._purge(db)


def test_an_unexpected_error_does_not_end_the_background_thread(tmp_path: Path) -> None:
    shared = PurgeFails(tmp_path / "gateway.db", clock=ManualClock(T0), max_entries=10,
                        origin="a", sync_interval=0.005, purge_interval=0.005)
    shared.start()
    try:
        for _ in range(400):
            if shared.purges >= 2:
                break
            time.sleep(0.005)
        assert shared.purges >= 2 and shared.failures == 1  # logged, counted, went on
        publish(shared, "after")
        assert shared.flush(timeout=2.0) and shared.written == 1
    finally:
        shared.close()
