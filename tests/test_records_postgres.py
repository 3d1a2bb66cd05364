"""The gateway's per-request records on PostgreSQL: the same rows as on SQLite, no record lost
while the server is down (stopped and started again under the writer), and only the rows the
server refuses dropped from a batch."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import psycopg
import pytest
from support.loopback import free_port, wait_for
from support.postgres import PostgresServer

from dashboard.gateway_data import open_request_log
from serving.gateway.telemetry.record_writer import RecordWriter
from slo.sources.open import request_log
from slo.sources.request_log import POOL_SIZE, GatewayRecords
from vigil.config import parse_config
from vigil.errors import StoreError, StoreUnavailable
from vigil.storage.gateway_records import GatewayRecord

#: A writer that retries quickly: the tests wait for failures, then for the recovery.
FAST_RETRY = {"retry_interval": 0.02, "max_retry_interval": 0.1}


def _rec(i: int, **changes: object) -> GatewayRecord:
    rec = GatewayRecord(
        id=f"vgl-{i:04d}", start_s=1_764_000_000.123456789 + i, ts_s=1_764_000_001.987654321 + i,
        pool="chat", model="m", endpoint="chat", tenant="acme", tier="standard", key_id="abc",
        replica="r0", status=200, stream=True, prompt_tokens=10, completion_tokens=20,
        tokens_source="usage", ttft_s=0.1 + 0.2, e2e_s=1.0 / 3.0, queue_s=1e-7,
        error=False, error_class="", cache_hit="", requested_max_tokens=None, max_tokens=512,
        max_tokens_decision="default", cost_usd=3.141592653589793e-9, saved_usd=None,
        upstream_id="chatcmpl-x", batch_id="", message="")
    return rec._replace(**changes)


#: Every kind of value a column holds: None in each nullable column, doubles that float4
#: would round, a large integer, flags both ways, text beyond ASCII.
VARIED = [
    _rec(0),
    _rec(1, ttft_s=None, e2e_s=None, cost_usd=None, max_tokens=None, stream=False,
         status=429, error_class="rejected", tokens_source="unknown", completion_tokens=0),
    _rec(2, error=True, error_class="timeout", status=504, message="upstream timed out — ✓ naïve",
         prompt_tokens=2**40, requested_max_tokens=100_000, saved_usd=0.000123456789012345),
    _rec(3, pool="other", cache_hit="l2", cost_usd=0.0, saved_usd=2.5e-300, batch_id="batch_x"),
]
AT, WINDOW = 1_764_000_100.0, 1000.0


def _write(target: str | Path, records: list[GatewayRecord], **options: object) -> RecordWriter:
    w = RecordWriter(target, **options)  # type: ignore[arg-type]
    w.start()
    for r in records:
        w.put(r)
    assert w.flush(timeout=30)
    return w


def _stored_ids(url: str) -> list[str]:
    with GatewayRecords(url) as reader:
        return [r.id for r in reader.rows(None, AT + 10_000, 1e9)]


def test_round_trip_is_identical_on_both_databases(tmp_path: Path, postgres_url: str) -> None:
    for target in (tmp_path / "gw.db", postgres_url):
        _write(target, VARIED).close()
    sqlite, postgres = GatewayRecords(tmp_path / "gw.db"), GatewayRecords(postgres_url)
    try:
        assert postgres.rows(None, AT, WINDOW) == sqlite.rows(None, AT, WINDOW) == VARIED
        assert list(postgres.records("chat", AT, WINDOW)) == list(
            sqlite.records("chat", AT, WINDOW))
        assert [r.ttft_s for r in postgres.records("chat", AT, WINDOW)] == [0.1 + 0.2, None,
                                                                            0.1 + 0.2]
        assert postgres.get("vgl-0002") == VARIED[2] and postgres.get("nope") is None
    finally:
        postgres.close()


def test_postgres_columns_are_doubles_and_bigints(postgres_url: str) -> None:
    _write(postgres_url, VARIED[:1]).close()
    with psycopg.connect(postgres_url) as conn:
        types = dict(conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = 'gateway_requests'").fetchall())
    assert types["ts_s"] == types["ttft_s"] == types["cost_usd"] == "double precision"
    assert types["prompt_tokens"] == types["stream"] == "bigint"
    assert set(types.values()) == {"text", "double precision", "bigint"}


def test_a_database_that_cannot_be_opened_fails_the_start_by_name(
        postgres_server: PostgresServer) -> None:
    missing = postgres_server.url("no_such_database", password="s3cret")
    with pytest.raises(StoreError, match=r"postgres:\*\*\*@.*/no_such_database") as caught:
        RecordWriter(missing).start()
    assert "s3cret" not in str(caught.value)
    nobody = f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/vigil"
    with pytest.raises(StoreUnavailable, match=r"postgres:\*\*\*@127\.0\.0\.1") as caught:
        RecordWriter(nobody).start()
    assert "s3cret" not in str(caught.value)


def test_the_same_record_put_twice_is_stored_once(postgres_url: str) -> None:
    first = _rec(1)
    w = _write(postgres_url, [first])
    w.put(first._replace(message="written again"))  # a later batch: the stored one is kept
    assert w.flush(timeout=30)
    w.close()
    with GatewayRecords(postgres_url) as reader:
        assert reader.rows(None, AT, WINDOW) == [first]


def _first_batch(target: str | Path, records: list[GatewayRecord]) -> RecordWriter:
    """A writer whose first batch is ``records`` (all put before the thread starts)."""
    w = RecordWriter(target)
    for r in records:
        w.put(r)
    w.start()
    assert w.flush(timeout=30)
    return w


def _transactions(url: str, first_id: str = "") -> int:
    """How many transactions wrote the stored records (from ``first_id`` on)."""
    with psycopg.connect(url) as conn:
        (n,) = conn.execute("SELECT count(DISTINCT xmin::text) FROM gateway_requests "
                            "WHERE id >= %s", (first_id,)).fetchone()
    return int(n)


def test_an_id_twice_in_one_batch_is_stored_once(postgres_url: str) -> None:
    twice = [_rec(1), _rec(1), _rec(2), _rec(3), _rec(2), _rec(4)]
    w = _first_batch(postgres_url, twice)
    assert (w.written, w.rejected, w.write_failures) == (6, 0, 0)
    w.close()
    assert _stored_ids(postgres_url) == ["vgl-0001", "vgl-0002", "vgl-0003", "vgl-0004"]
    assert _transactions(postgres_url) == 1  # the batch as a whole, not split


def test_nul_in_text_is_stored_alike_on_both_databases(tmp_path: Path,
                                                       postgres_url: str) -> None:
    # A client's {"model": "\u0000"} is quoted in the model and the 404's message.
    nul = [_rec(1, model="\x00", message="model '\x00' not found", status=404),
           _rec(2, tenant="a\x00b", batch_id="\x00", upstream_id="x\x00")]
    for target in (tmp_path / "gw.db", postgres_url):
        w = _first_batch(target, [*nul, _rec(3)])
        assert (w.written, w.rejected) == (3, 0)
        w.close()
    sqlite, postgres = GatewayRecords(tmp_path / "gw.db"), GatewayRecords(postgres_url)
    try:
        assert postgres.rows(None, AT, WINDOW) == sqlite.rows(None, AT, WINDOW)
        first = postgres.get("vgl-0001")
        assert first is not None
        assert (first.model, first.message) == ("\ufffd", "model '\ufffd' not found")
    finally:
        postgres.close()


def _staging_tables(url: str) -> set[int]:
    """The oids of the writer connections' staging tables (temporary, one per session)."""
    with psycopg.connect(url) as conn:
        return {oid for (oid,) in conn.execute(
            "SELECT oid::bigint FROM pg_class WHERE relname = 'gateway_requests_in' "
            "AND relpersistence = 't'").fetchall()}


def test_rows_the_server_refuses_are_dropped_alone(postgres_url: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="vigil.gateway.records")
    records = [_rec(i) for i in range(60)]
    records[5] = records[5]._replace(pool=None)  # NOT NULL
    records[41] = records[41]._replace(prompt_tokens=2**63)  # beyond BIGINT
    records[42] = records[42]._replace(ttft_s="fast")  # not a number
    w = _first_batch(postgres_url, records)
    try:
        assert (w.written, w.rejected, w.write_failures, w.buffered) == (57, 3, 0, 0)
        # The first transaction made the staging table and rolled back: it was made again.
        made = _staging_tables(postgres_url)
        assert 1 <= len(made) <= POOL_SIZE
        for i in range(3):
            for r in range(10):
                w.put(_rec(100 + 10 * i + r))
            assert w.flush(timeout=30)
        assert _staging_tables(postgres_url) == made  # kept, not made per batch
        assert _transactions(postgres_url, "vgl-0100") == 3  # one per batch: by the COPY
    finally:
        w.close()
    stored = _stored_ids(postgres_url)
    assert stored == [f"vgl-{i:04d}" for i in [*range(60), *range(100, 130)]
                      if i not in (5, 41, 42)]
    told = " ".join(r.getMessage() for r in caplog.records)
    for bad in ("'vgl-0005'", "'vgl-0041'", "'vgl-0042'"):
        assert bad in told
    assert "null value in column \"pool\"" in told and "bigint out of range" in told


def test_a_database_without_the_table_has_no_records_until_written(postgres_url: str) -> None:
    reader = GatewayRecords(postgres_url)
    try:
        assert reader.rows(None, AT, WINDOW) == [] and reader.get("vgl-0000") is None
        _write(postgres_url, VARIED).close()
        assert reader.rows(None, AT, WINDOW) == VARIED  # the same reader sees the new table
    finally:
        reader.close()


def test_a_reader_keeps_one_small_pool(postgres_url: str) -> None:
    _write(postgres_url, VARIED).close()
    with GatewayRecords(postgres_url) as reader:
        for _ in range(20):
            assert len(reader.rows(None, AT, WINDOW)) == 4
        with psycopg.connect(postgres_url) as conn:
            (n,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                "current_database() AND pid <> pg_backend_pid()").fetchone()
    assert 1 <= n <= POOL_SIZE


def test_the_config_url_is_read_without_a_records_file(tmp_path: Path,
                                                       postgres_url: str) -> None:
    _write(postgres_url, VARIED).close()
    config = parse_config({"gateway": {"database": postgres_url,
                                       "records_path": str(tmp_path / "never.db")}})
    log = request_log(config)
    assert isinstance(log, GatewayRecords) and log.target == postgres_url
    shared = open_request_log(config)
    try:
        assert shared is open_request_log(config)  # one pool for every query of the pages
        assert list(log.records("chat", AT, WINDOW)) == list(
            shared.records("chat", AT, WINDOW))  # type: ignore[union-attr]
        assert len(list(log.records("chat", AT, WINDOW))) == 3
    finally:
        log.close()
        shared.close()  # type: ignore[union-attr]
    assert not (tmp_path / "never.db").exists()


def test_a_stopped_server_loses_no_record(postgres_server: PostgresServer,
                                          postgres_url: str) -> None:
    w = _write(postgres_url, [_rec(0)], **FAST_RETRY)
    n = 300
    try:
        postgres_server.stop()
        for i in range(1, n + 1):
            w.put(_rec(i))
        wait_for("a failed write", lambda: w.write_failures > 0)
        assert w.buffered == n and w.written == 1
    finally:
        postgres_server.start()
    assert w.flush(timeout=30)
    assert (w.written, w.dropped, w.buffered) == (n + 1, 0, 0) and w.write_failures > 0
    assert w.close() == 0
    assert _stored_ids(postgres_url) == [f"vgl-{i:04d}" for i in range(n + 1)]


def test_a_bound_smaller_than_the_outage_drops_the_oldest_and_counts(
        postgres_server: PostgresServer, postgres_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    bound, n = 10, 25
    w = _write(postgres_url, [], max_queue=bound, **FAST_RETRY)
    caplog.set_level(logging.ERROR, logger="vigil.gateway.records")
    try:
        postgres_server.stop()
        for i in range(n):
            w.put(_rec(i))
        assert (w.dropped, w.buffered) == (n - bound, bound)
        wait_for("a failed write", lambda: w.write_failures > 0)
    finally:
        postgres_server.start()
    assert w.flush(timeout=30)
    assert (w.written, w.dropped, w.buffered) == (bound, n - bound, 0)
    assert w.close() == 0
    stored = _stored_ids(postgres_url)
    # The newest are kept; the oldest record may be too, when it was in flight as the others
    # arrived (a batch being committed is never dropped).
    assert len(stored) == bound
    assert set(stored) >= {f"vgl-{i:04d}" for i in range(n - bound + 1, n)}
    told = [int(m.group(1)) for m in (re.search(r"dropped (\d+) gateway records.*records_buffer",
                                                r.getMessage()) for r in caplog.records) if m]
    assert sum(told) == n - bound
