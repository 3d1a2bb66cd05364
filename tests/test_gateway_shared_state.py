"""Two ``vigil gateway`` processes on one PostgreSQL database behave as one gateway: every
request is recorded once, a batch submitted through one is served and read through the other
(also when one is killed mid-batch), a restart of PostgreSQL does not stop the answers, and an
answer cached through one is a hit through the other.

Real parts throughout: the gateways are child processes (``tests/support/shared_gateways.py``) in
front of a simulated fleet on 127.0.0.1, the database is the session's PostgreSQL server
(``tests/support/postgres.py``), and the client is the official ``openai`` one, alternating
between the two instances as a load balancer would. Starting two gateway processes is most of
a test's time, so one pair (and one database) serves the module's tests one after the other;
each reads back only what it sent (its request ids, or the records that finished after it
began). The kill test has a pair, a slow replica and a database of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.gateway import MODEL, POOL, STANDARD
from support.loopback import wait_for
from support.postgres import PostgresServer, postgres_server, postgres_url  # noqa: F401
from support.shared_gateways import GatewayProcess, running_gateways, write_config

from serving.sim.testing import FleetHandle, running_fleet, sample_values, total
from slo.planning.replica.profiles import SMALL
from slo.sources.protocol import RequestLog
from slo.sources.request_log import GatewayRecords
from vigil.conventions import METRIC_GW_CACHE_SHARED, METRIC_GW_RECORDS_BUFFERED
from vigil.errors import StoreError
from vigil.storage.database import SqlDatabase, open_database
from vigil.storage.gateway_records import GatewayRecord

pytestmark = pytest.mark.slow

#: Seconds of the batch lease in these tests: an instance killed with requests claimed holds
#: them this long, then the other one takes them over.
LEASE_S = 1.5
#: How often an instance reads the cache entries the other stored (seconds).
SYNC_S = 0.2
#: A record or a batch result has this long to appear (a bound on the wait, not a timing).
DEADLINE_S = 30.0


def _chat(client: openai.OpenAI, text: str, *, stream: bool, max_tokens: int = 4) -> str:
    """One chat request (temperature 0: the cache may answer it), read to its end; the
    ``X-Vigil-Request-Id`` the client got."""
    messages: list[Any] = [{"role": "user", "content": text}]
    if stream:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True})
        chunks = list(raw.parse())
        assert chunks and chunks[-1].usage is not None
    else:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0)
        assert raw.parse().choices[0].message.content
    return str(raw.headers["x-vigil-request-id"])


def _rows_since(url: str, t0: float) -> list[GatewayRecord]:
    """The records of requests that finished after Unix time ``t0``: tests in this module run
    one after the other on one database, so these are the current test's."""
    at = time.time() + 60
    return GatewayRecords(url).rows(None, at, at - t0)


def _stopped_cleanly(*gateways: GatewayProcess) -> None:
    for g in gateways:
        code = g.stop()
        assert code == 0, f"gateway {g.name} exited {code}:\n{g.log()}"


@dataclasses.dataclass
class Shared:
    """Two instances on one database in front of one fast simulated replica."""

    url: str
    fleet: FleetHandle
    a: GatewayProcess
    b: GatewayProcess

    def alive(self) -> Shared:
        for g in (self.a, self.b):
            assert g.alive(), f"gateway {g.name} exited {g.proc.returncode}:\n{g.log()}"
        return self


@pytest.fixture(scope="module")
def module_pair(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    server = request.getfixturevalue("postgres_server")
    url = server.create_database()
    try:
        with running_fleet(1, scheduling_policy="priority") as fleet:
            config = write_config(tmp_path_factory.mktemp("shared"), url, fleet.base_urls,
                                  gateway={"batch": {"poll_interval": "0.1s"}, "cache": {
                                      "enabled": True, "embeddings": fleet.base_urls[0],
                                      "embedding_model": MODEL,
                                      "sync_interval": f"{SYNC_S}s"}})
            with running_gateways(config) as (a, b):
                yield Shared(url, fleet, a, b)
                _stopped_cleanly(a, b)
    finally:
        server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture
def pair(module_pair: Shared) -> Shared:
    """The module's pair, both instances still running."""
    return module_pair.alive()


@pytest.fixture
def database(request: pytest.FixtureRequest) -> str:
    """A fresh database of its own on the session's server (``postgres_url``), its URL."""
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def server(request: pytest.FixtureRequest) -> PostgresServer:
    """The session's PostgreSQL server (``postgres_server``)."""
    found = request.getfixturevalue("postgres_server")
    assert isinstance(found, PostgresServer)
    return found


# --- 1. the records ---------------------------------------------------------------------------

def test_every_request_is_in_the_shared_records_once(pair: Shared) -> None:
    n, t0 = 24, time.time()
    clients = [pair.a.client(), pair.b.client()]
    # Alternate the instance every request and streaming every two: each instance gets both.
    ids = [_chat(clients[i % 2], f"Records, question {i}", stream=(i // 2) % 2 == 1)
           for i in range(n)]
    wait_for("every record in the shared database",
             lambda: len(_rows_since(pair.url, t0)) >= n, timeout_s=DEADLINE_S)
    rows = _rows_since(pair.url, t0)
    assert len(set(ids)) == n
    assert sorted(r.id for r in rows) == sorted(ids)  # each once, none else
    assert sum(r.stream for r in rows) == n // 2
    assert {(r.pool, r.endpoint, r.status) for r in rows} == {(POOL, "chat", 200)}
    reader = GatewayRecords(pair.url)
    assert isinstance(reader, RequestLog)
    seen = list(reader.records(POOL, time.time() + 1, time.time() + 1 - t0))
    assert len(seen) == n and {r.id for r in seen} == set(ids)


# --- 2. a batch, submitted through one instance, read through the other -----------------------

def _batch_input(n: int, *, max_tokens: int) -> bytes:
    lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL, "max_tokens": max_tokens, "messages": [
                  {"role": "user", "content": f"Batch question {i}, {secrets.token_hex(4)}"}]}}
             for i in range(n)]
    return "\n".join(json.dumps(x) for x in lines).encode()


def _submit(client: openai.OpenAI, data: bytes) -> str:
    f = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    return batch.id


def _completed(client: openai.OpenAI, batch_id: str) -> Any:
    batch = client.batches.retrieve(batch_id)
    assert batch.status not in ("failed", "expired", "cancelled"), batch
    return batch if batch.status == "completed" else None


def _output(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def test_a_batch_submitted_through_one_instance_completes_through_the_other(
        pair: Shared) -> None:
    n = 10
    batch_id = _submit(pair.a.client(), _batch_input(n, max_tokens=4))
    via_b = pair.b.client()
    seen = via_b.batches.retrieve(batch_id)
    assert seen.id == batch_id and seen.request_counts is not None
    assert seen.request_counts.total == n
    done = wait_for("the batch to complete, read through B",
                    lambda: _completed(via_b, batch_id), timeout_s=DEADLINE_S)
    out = _output(via_b, done.output_file_id)
    assert pair.a.client().batches.retrieve(batch_id).status == "completed"
    assert done.request_counts.completed == n and done.request_counts.failed == 0
    assert sorted(x["custom_id"] for x in out) == sorted(f"q{i}" for i in range(n))
    assert all(x["response"]["status_code"] == 200 for x in out)
    wait_for("a record of every batch request",
             lambda: len([r for r in _rows_since(pair.url, seen.created_at - 1)
                          if r.batch_id == batch_id]) == n, timeout_s=DEADLINE_S)


# --- 3. kill -9 of one instance mid-batch -----------------------------------------------------

def _holding(db: SqlDatabase, g: GatewayProcess) -> int:
    """Batch requests in flight under a lease of ``g``'s process (an owner names the host and
    the process id: ``batch_store.new_owner``)."""
    found = db.query("SELECT COUNT(*) FROM batch_requests WHERE state = 'in_flight' "
                     "AND owner LIKE ?", (f"%:{g.proc.pid}:%",))
    return int(found[0][0])


def _states(db: SqlDatabase) -> dict[str, int]:
    """Batch requests per state."""
    return {str(s): int(c) for s, c in db.query(
        "SELECT state, COUNT(*) FROM batch_requests GROUP BY state", ())}


def test_the_other_instance_finishes_a_batch_when_one_is_killed(
        database: str, tmp_path: Path) -> None:
    n, per_instance = 12, 4
    # 30 decode steps of ~30 ms: each request is in flight for about a second.
    slow = dataclasses.replace(SMALL, name="slow", decode_base_s=0.03)
    db = open_database(database, what="the batch queue (test)", readonly=True)
    with contextlib.closing(db), running_fleet(1, profile=slow,
                                               scheduling_policy="priority") as fleet:
        config = write_config(tmp_path, database, fleet.base_urls, gateway={"batch": {
            "poll_interval": "0.1s", "max_in_flight": per_instance, "lease": f"{LEASE_S}s"}})
        with running_gateways(config) as (a, b):
            batch_id = _submit(a.client(), _batch_input(n, max_tokens=30))
            wait_for("both instances sending batch work",
                     lambda: _holding(db, a) and _holding(db, b), timeout_s=DEADLINE_S,
                     interval_s=0.02)
            a.kill()
            killed_at = time.monotonic()
            stranded = _holding(db, a)
            assert stranded >= 1  # claimed by A, whose answers will never come
            via_b = b.client()
            done = wait_for("B to finish the batch", lambda: _completed(via_b, batch_id),
                            timeout_s=DEADLINE_S)
            finished_after_s = time.monotonic() - killed_at
            out = _output(via_b, done.output_file_id)
            states = _states(db)
            _stopped_cleanly(b)
    assert done.request_counts.total == n
    assert done.request_counts.completed == n and done.request_counts.failed == 0
    assert sorted(x["custom_id"] for x in out) == sorted(f"q{i}" for i in range(n))  # each once
    assert len({x["id"] for x in out}) == n
    assert all(x["response"]["status_code"] == 200 for x in out)
    assert states == {"ok": n}
    # A's requests went back to the queue once their lease ran out, not before.
    assert finished_after_s >= LEASE_S


# --- 4. PostgreSQL restarted under load -------------------------------------------------------

@dataclasses.dataclass
class _Load:
    """Requests sent without pause, alternating between the instances, from one thread."""

    gateways: list[GatewayProcess]
    answered: list[tuple[str, float, float]] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def run(self) -> None:
        clients = [g.client(timeout=10.0) for g in self.gateways]
        i = 0
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                rid = _chat(clients[i % len(clients)], f"Restart, question {i}",
                            stream=i % 3 == 0, max_tokens=2)
            except (openai.OpenAIError, AssertionError) as exc:
                self.failures.append(f"request {i}: {type(exc).__name__}: {exc}")
            else:
                self.answered.append((rid, t0, time.monotonic()))
            i += 1

    def count(self) -> int:
        return len(self.answered)


def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return sample_values(httpx.get(f"{url}/metrics", timeout=10).text)


def _records_buffered(g: GatewayProcess) -> float:
    """The instance's ``vigil_gateway_records_buffered``: records not written yet."""
    return total(_scrape(g.url), METRIC_GW_RECORDS_BUFFERED)


def _cache_shared(g: GatewayProcess, outcome: str) -> float:
    """The gateway's ``vigil_gateway_cache_shared_entries_total`` of ``outcome``."""
    return total(_scrape(g.url), METRIC_GW_CACHE_SHARED + "_total", outcome=outcome)


def test_requests_are_answered_and_recorded_across_a_postgres_restart(
        server: PostgresServer, pair: Shared) -> None:
    a, b, t0 = pair.a, pair.b, time.time()
    load = _Load([a, b])
    thread = threading.Thread(target=load.run, name="load", daemon=True)
    thread.start()
    try:
        wait_for("load before the restart", lambda: load.count() >= 6, timeout_s=DEADLINE_S)
        # restart() with the down time held open until the instances have answered requests
        # that they could not record.
        server.stop()
        down_at, before = time.monotonic(), load.count()
        try:
            wait_for("answers while PostgreSQL is down",
                     lambda: load.count() >= before + 8 or load.failures, timeout_s=DEADLINE_S)
            # Each instance holds the records it could not write.
            held = {g.name: _records_buffered(g) for g in (a, b)}
        finally:
            up_at = time.monotonic()
            server.start()
        after = load.count()
        wait_for("answers after the restart",
                 lambda: load.count() >= after + 6 or load.failures, timeout_s=DEADLINE_S)
    finally:
        load.stop.set()
        thread.join(20)
    assert not load.failures, load.failures[:5]
    during = [t1 - t0 for _, t0, t1 in load.answered if t0 >= down_at and t1 <= up_at]
    assert len(during) >= 4  # answered while no instance could reach the database
    ids = {rid for rid, _, _ in load.answered}
    assert len(ids) == len(load.answered)
    # Each instance writes what it held as soon as the server is back, while it runs.
    wait_for("every answered request recorded after the restart",
             lambda: ids <= {r.id for r in _rows_since(pair.url, t0)},
             timeout_s=DEADLINE_S, interval_s=0.2, ignore=(StoreError,))
    wait_for("both buffers empty", lambda: not any(_records_buffered(g) for g in (a, b)),
             timeout_s=DEADLINE_S)
    assert all(n > 0 for n in held.values()), held
    assert {r.id for r in _rows_since(pair.url, t0)} == ids  # none lost, none else
    # The hot path never waited on the database: no answer took a connect attempt's time.
    assert max(during) < 3.0, sorted(during)[-3:]


# --- 5. the cache, shared ---------------------------------------------------------------------

def _served(fleet: FleetHandle) -> float:
    """Requests the simulated replica finished."""
    return total(_scrape(fleet.base_urls[0]), "vllm:request_success_total")


def _shared_entries(url: str) -> list[tuple[str, str]]:
    """``(l1, origin)`` of every cache entry in the shared database."""
    db = open_database(url, what="the cache entries (test)", readonly=True)
    try:
        return [(str(a), str(b)) for a, b in db.query(
            "SELECT l1, origin FROM cache_entries ORDER BY seq", ())]
    finally:
        db.close()


def test_an_answer_cached_through_one_instance_hits_through_the_other(pair: Shared) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    other = [{"role": "user", "content": "What is the capital of Italy?"}]
    via_a, via_b = pair.a.client(STANDARD), pair.b.client(STANDARD)
    before = len(_shared_entries(pair.url))
    applied_by_b = _cache_shared(pair.b, "applied")
    first = via_a.chat.completions.with_raw_response.create(
        model=MODEL, messages=question, temperature=0, max_tokens=12)
    assert first.headers["x-vigil-cache"] == "miss"
    wait_for("A's answer in the shared cache entries",
             lambda: len(_shared_entries(pair.url)) > before, timeout_s=DEADLINE_S)
    # B reads what the others stored every sync interval. The question is asked of B once,
    # after B has put A's entry into its cache: a miss through B would store B's own copy.
    wait_for("A's entry applied by B", lambda: _cache_shared(pair.b, "applied") > applied_by_b,
             timeout_s=DEADLINE_S)
    assert _cache_shared(pair.a, "written") >= 1
    served = _served(pair.fleet)
    again = via_b.chat.completions.with_raw_response.create(
        model=MODEL, messages=question, temperature=0, max_tokens=12)
    assert again.headers["x-vigil-cache"] == "hit-l1"
    assert _served(pair.fleet) == served  # no GPU work
    assert (again.parse().choices[0].message.content
            == first.parse().choices[0].message.content)
    # A question nobody asked before is a miss through B: the hit came from A's entry.
    fresh = via_b.chat.completions.with_raw_response.create(
        model=MODEL, messages=other, temperature=0, max_tokens=12)
    assert fresh.headers["x-vigil-cache"] == "miss"
    reader = GatewayRecords(pair.url)
    miss, hit = (wait_for(f"record {r.headers['x-vigil-request-id']}",
                          lambda r=r: reader.get(r.headers["x-vigil-request-id"]),
                          timeout_s=DEADLINE_S) for r in (first, again))
    assert miss.cache_hit == "" and miss.cost_usd is not None and miss.cost_usd > 0
    assert (hit.cache_hit, hit.cost_usd, hit.replica) == ("l1", 0.0, "")
