"""Per-request records on SQLite: written off the response path, read (read-only, WAL) by the
SLO engine, and the cost share each request is charged. tests/test_records_postgres.py runs
the writer and reader on PostgreSQL, and through its outages."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
from support.loopback import wait_for

from serving.gateway.accounting import ShareLedger, gpu_cost_per_second
from serving.gateway.batch.store import BatchStore
from serving.gateway.telemetry.record_writer import RecordWriter
from slo.sources.protocol import RequestLog
from slo.sources.request_log import GatewayRecords
from vigil.clock import ManualClock
from vigil.config import parse_config
from vigil.errors import StoreError
from vigil.model import RequestRecord
from vigil.storage.gateway_records import GatewayRecord


def _rec(i: int, *, ts: float, pool: str = "chat", error_class: str = "",
         status: int = 200, cache_hit: str = "") -> GatewayRecord:
    return GatewayRecord(
        id=f"vgl-{i}", start_s=ts - 1, ts_s=ts, pool=pool, model="m", endpoint="chat",
        tenant="acme", tier="standard", key_id="abc", replica="r0", status=status, stream=True,
        prompt_tokens=10, completion_tokens=20, tokens_source="usage", ttft_s=0.1, e2e_s=1.0,
        queue_s=0.0, error=error_class in ("timeout", "upstream_5xx", "oom"),
        error_class=error_class, cache_hit=cache_hit, requested_max_tokens=None,
        max_tokens=512, max_tokens_decision="default", cost_usd=0.0 if cache_hit else 0.002,
        saved_usd=0.002 if cache_hit else None, upstream_id="chatcmpl-x", batch_id="",
        message="")


@pytest.fixture
def writer(tmp_path: Path):
    w = RecordWriter(tmp_path / "sub" / "gw.db")
    w.start()
    yield w
    w.close()


def test_round_trip_of_every_column(writer: RecordWriter) -> None:
    rec = _rec(1, ts=1000.0)
    writer.put(rec)
    assert writer.flush()
    assert GatewayRecords(writer.target).get("vgl-1") == rec


def test_window_is_left_open_right_closed(writer: RecordWriter) -> None:
    for i, ts in enumerate((100.0, 150.0, 200.0, 250.0)):
        writer.put(_rec(i, ts=ts))
    writer.put(_rec(9, ts=200.0, pool="other"))
    writer.flush()
    reader = GatewayRecords(writer.target)
    assert [r.ts_s for r in reader.records("chat", 200.0, 100.0)] == [150.0, 200.0]
    assert [r.ts_s for r in reader.rows(None, 200.0, 100.0)] == [150.0, 200.0, 200.0]


def test_request_log_protocol_and_fields(writer: RecordWriter) -> None:
    writer.put(_rec(1, ts=10.0, error_class="timeout", status=504))
    writer.put(_rec(2, ts=11.0, error_class="client_cancel", status=499))
    writer.put(_rec(3, ts=12.0, cache_hit="l2"))
    writer.flush()
    reader = GatewayRecords(writer.target)
    assert isinstance(reader, RequestLog)
    out = list(reader.records("chat", 20.0, 60.0))
    assert [type(r) for r in out] == [RequestRecord] * 3
    timeout, cancel, hit = out
    assert timeout.error and timeout.error_class == "timeout"
    assert not cancel.error and cancel.error_class == "client_cancel"
    assert (hit.cache_hit, hit.cost_usd, hit.saved_usd) == ("l2", 0.0, 0.002)
    assert (timeout.generated_tokens, timeout.tenant, timeout.tier) == (20, "acme", "standard")


def test_readers_open_read_only_while_the_writer_writes(writer: RecordWriter) -> None:
    writer.put(_rec(1, ts=1.0))
    writer.flush()
    reader = GatewayRecords(writer.target)
    assert len(reader.rows(None, 10.0, 10.0)) == 1
    # The writer keeps its connection open (WAL): readers neither block it nor are blocked.
    for i in range(2, 50):
        writer.put(_rec(i, ts=1.0 + i / 100))
        assert reader.rows(None, 10.0, 10.0)
    writer.flush()
    assert len(reader.rows(None, 10.0, 10.0)) == 49
    ro = sqlite3.connect(f"file:{writer.target}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError):
        ro.execute("DELETE FROM gateway_requests")
    ro.close()


def test_no_file_means_no_records(tmp_path: Path) -> None:
    reader = GatewayRecords(tmp_path / "missing.db")
    assert list(reader.records("chat", 1e9, 1e9)) == [] and reader.get("x") is None
    assert not (tmp_path / "missing.db").exists()


def test_a_file_of_the_batch_queue_alone_has_no_records(tmp_path: Path) -> None:
    BatchStore(tmp_path / "gw.db").close()
    assert GatewayRecords(tmp_path / "gw.db").rows(None, 1e9, 1e9) == []


def test_a_file_that_is_not_sqlite_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "gw.db"
    bad.write_bytes(b"not a database " * 100)
    with pytest.raises(StoreError, match=r"gw\.db: not a usable SQLite file for the gateway"):
        GatewayRecords(bad).get("x")
    with pytest.raises(StoreError, match=r"gw\.db: not a usable SQLite file for the gateway"):
        RecordWriter(bad).start()


def test_a_full_buffer_drops_the_oldest_and_counts(tmp_path: Path) -> None:
    w = RecordWriter(tmp_path / "gw.db", max_queue=2)  # not started: nothing drains it
    for i in range(5):
        w.put(_rec(i, ts=1.0 + i))
    assert (w.dropped, w.buffered, w.written) == (3, 2, 0)
    w.start()
    assert w.flush()
    assert w.close() == 0
    assert [r.id for r in GatewayRecords(w.target).rows(None, 10, 10)] == ["vgl-3", "vgl-4"]
    assert (w.dropped, w.buffered, w.written, w.write_failures) == (3, 0, 2, 0)


def test_the_same_record_put_twice_is_stored_once(writer: RecordWriter) -> None:
    first = _rec(1, ts=5.0)
    writer.put(first)
    writer.flush()
    # A retried batch carries the same id (and the same record): the stored one is kept.
    writer.put(first._replace(message="written again"))
    writer.flush()
    assert GatewayRecords(writer.target).rows(None, 10, 10) == [first]
    assert (writer.written, writer.rejected) == (2, 0)


def test_nul_in_text_is_stored_as_the_replacement_character(writer: RecordWriter) -> None:
    writer.put(_rec(1, ts=5.0)._replace(model="\x00", message="model '\x00x\x00' not found"))
    assert writer.flush()
    stored = GatewayRecords(writer.target).get("vgl-1")
    assert stored is not None
    assert (stored.model, stored.message) == ("\ufffd", "model '\ufffdx\ufffd' not found")
    assert writer.rejected == 0


def _started_with(path: Path, records: list[object], **options: object) -> RecordWriter:
    """A writer whose first batch is ``records`` (all put before the thread starts)."""
    w = RecordWriter(path, **options)  # type: ignore[arg-type]
    for r in records:
        w.put(r)  # type: ignore[arg-type]
    w.start()
    return w


def test_a_record_that_cannot_be_converted_is_rejected_and_the_writer_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="vigil.gateway.records")
    bad_flag = _rec(2, ts=2.0)._replace(stream=object())  # int() of it raises
    w = _started_with(tmp_path / "gw.db", [_rec(1, ts=1.0), None, bad_flag, _rec(3, ts=3.0)])
    try:
        assert w.flush()
        w.put(_rec(4, ts=4.0))  # the thread is still there
        assert w.flush()
        assert (w.written, w.rejected, w.write_failures, w.buffered) == (3, 2, 0, 0)
    finally:
        assert w.close() == 0
    assert [r.id for r in GatewayRecords(w.target).rows(None, 10, 10)] == [
        "vgl-1", "vgl-3", "vgl-4"]
    told = " ".join(r.getMessage() for r in caplog.records)
    assert "'vgl-2'" in told and "<not a record: NoneType>" in told and "TypeError" in told


def test_a_row_the_database_refuses_is_dropped_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="vigil.gateway.records")
    records = [_rec(i, ts=1.0 + i) for i in range(40)]
    records[17] = records[17]._replace(pool=None)  # NOT NULL
    records[30] = records[30]._replace(tier=None)
    w = _started_with(tmp_path / "gw.db", records)
    try:
        assert w.flush()
        assert (w.written, w.rejected, w.write_failures, w.buffered) == (38, 2, 0, 0)
    finally:
        assert w.close() == 0
    stored = [r.id for r in GatewayRecords(w.target).rows(None, 100, 100)]
    assert stored == [f"vgl-{i}" for i in range(40) if i not in (17, 30)]
    told = [r.getMessage() for r in caplog.records if "cannot be stored" in r.getMessage()]
    assert any("'vgl-17'" in m and "NOT NULL constraint failed: gateway_requests.pool" in m
               for m in told)
    assert any("'vgl-30'" in m and "gateway_requests.tier" in m for m in told)


def test_a_locked_file_is_retried_not_rejected(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import vigil.storage.sqlite

    monkeypatch.setattr(vigil.storage.sqlite, "BUSY_TIMEOUT_MS", 20)  # read when the file is opened
    w = RecordWriter(tmp_path / "gw.db", retry_interval=0.01, max_retry_interval=0.02)
    w.start()
    blocker = sqlite3.connect(tmp_path / "gw.db", isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        w.put(_rec(1, ts=1.0))
        wait_for("failed writes", lambda: w.write_failures >= 2, interval_s=0.01)
        assert (w.written, w.rejected, w.buffered) == (0, 0, 1)
        blocker.execute("ROLLBACK")
        assert w.flush()
        assert (w.written, w.rejected) == (1, 0)
    finally:
        blocker.close()
        w.close()


# The table as the SQLite-only versions created it, before schema steps were recorded.
_OLD_SCHEMA = """CREATE TABLE IF NOT EXISTS gateway_requests (
    id TEXT PRIMARY KEY,
    start_s REAL NOT NULL,
    ts_s REAL NOT NULL,
    pool TEXT NOT NULL,
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    tenant TEXT NOT NULL,
    tier TEXT NOT NULL,
    key_id TEXT NOT NULL,
    replica TEXT NOT NULL,
    status INTEGER NOT NULL,
    stream INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    tokens_source TEXT NOT NULL,
    ttft_s REAL,
    e2e_s REAL,
    queue_s REAL NOT NULL,
    error INTEGER NOT NULL,
    error_class TEXT NOT NULL,
    cache_hit TEXT NOT NULL,
    requested_max_tokens INTEGER,
    max_tokens INTEGER,
    max_tokens_decision TEXT NOT NULL,
    cost_usd REAL,
    saved_usd REAL,
    upstream_id TEXT NOT NULL,
    batch_id TEXT NOT NULL,
    message TEXT NOT NULL
)"""


_LAYOUT = ("SELECT type, name, sql FROM sqlite_master WHERE tbl_name = 'gateway_requests' "
           "ORDER BY name")


def test_an_old_records_file_is_adopted_unchanged_with_its_rows(tmp_path: Path) -> None:
    """A file the SQLite-only versions wrote is adopted as schema step 1 (its table as it
    is), then step 2 adds the cached prompt tokens: its rows read back with None there."""
    path = tmp_path / "gw.db"
    old = sqlite3.connect(path)
    old.execute(_OLD_SCHEMA)
    old.execute("CREATE INDEX IF NOT EXISTS gateway_requests_pool_ts "
                "ON gateway_requests (pool, ts_s)")
    kept = _rec(1, ts=5.0)
    old.execute(f"INSERT OR REPLACE INTO gateway_requests VALUES ({', '.join('?' * 29)})",
                tuple(kept)[:29])
    old.commit()
    layout = old.execute(_LAYOUT).fetchall()
    old.close()
    w = RecordWriter(path)
    w.start()
    w.put(_rec(2, ts=6.0)._replace(cached_tokens=4))
    w.close()
    assert GatewayRecords(path).rows(None, 10, 10) == [
        kept, _rec(2, ts=6.0)._replace(cached_tokens=4)]
    conn = sqlite3.connect(path)
    (table,) = [row for row in conn.execute(_LAYOUT).fetchall() if row[0] == "table"]
    (old_table,) = [row for row in layout if row[0] == "table"]
    assert table[2].startswith(old_table[2].rstrip(")").rstrip())
    assert table[2].endswith("cached_tokens INTEGER)")
    assert [r for r in conn.execute(_LAYOUT).fetchall() if r[0] != "table"] == [
        r for r in layout if r[0] != "table"]
    assert conn.execute("SELECT component, version FROM vigil_schema").fetchall() == [
        ("gateway_records", 2)]
    conn.close()


def test_close_says_how_many_it_could_not_write(tmp_path: Path) -> None:
    w = RecordWriter(tmp_path / "gw.db", retry_interval=0.01, max_retry_interval=0.02)
    w.start()
    # Another writer holds the file's write lock: every attempt waits it out, then fails.
    blocker = sqlite3.connect(tmp_path / "gw.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    w.put(_rec(1, ts=1.0))
    w.put(_rec(2, ts=2.0))
    assert w.close(timeout=0.2) == 2 and w.written == 0
    blocker.execute("ROLLBACK")
    blocker.close()


def test_metrics_export_the_writers_counts(tmp_path: Path) -> None:
    from prometheus_client import generate_latest

    from serving.gateway.telemetry.metrics import GatewayMetrics

    w = RecordWriter(tmp_path / "gw.db", max_queue=3)
    for i in range(5):
        w.put(_rec(i, ts=1.0))
    w.write_failures, w.rejected = 7, 4  # as the writer thread counts them
    m = GatewayMetrics(depth=dict, replicas=list, dropped=lambda: w.dropped,
                       buffered=lambda: w.buffered, write_failures=lambda: w.write_failures,
                       rejected=lambda: w.rejected)
    text = generate_latest(m.registry).decode()
    assert "vigil_gateway_records_dropped 2.0" in text
    assert "vigil_gateway_records_buffered 3.0" in text
    assert "# TYPE vigil_gateway_record_write_failures_total counter" in text
    assert "vigil_gateway_record_write_failures_total 7.0" in text
    assert "# TYPE vigil_gateway_records_rejected_total counter" in text
    assert "vigil_gateway_records_rejected_total 4.0" in text


def test_records_survive_close_and_reopen(tmp_path: Path) -> None:
    w = RecordWriter(tmp_path / "gw.db")
    w.start()
    w.put(_rec(1, ts=5.0))
    w.close()  # writes what was queued
    w2 = RecordWriter(tmp_path / "gw.db")
    w2.start()
    w2.put(_rec(2, ts=6.0))
    w2.close()
    assert [r.id for r in GatewayRecords(tmp_path / "gw.db").rows(None, 10, 10)] == [
        "vgl-1", "vgl-2"]


# --- the cost share ----------------------------------------------------------------------


def test_alone_a_request_pays_its_whole_time() -> None:
    clock = ManualClock(0.0)
    ledger = ShareLedger(monotonic=clock)
    mark = ledger.enter()
    clock.advance(3.0)
    assert ledger.leave(mark) == pytest.approx(3.0)


def test_overlapping_requests_split_the_time() -> None:
    clock = ManualClock(0.0)
    ledger = ShareLedger(monotonic=clock)
    a = ledger.enter()          # t=0: a alone
    clock.advance(2.0)
    b = ledger.enter()          # t=2: a and b
    clock.advance(4.0)
    share_a = ledger.leave(a)   # t=6: b alone
    clock.advance(1.0)
    share_b = ledger.leave(b)   # t=7
    assert share_a == pytest.approx(2.0 + 4.0 / 2)
    assert share_b == pytest.approx(4.0 / 2 + 1.0)
    # The shares add up to the time the replica was busy, 7 s; idle time is nobody's.
    clock.advance(10.0)
    c = ledger.enter()
    clock.advance(1.0)
    assert share_a + share_b == pytest.approx(7.0)
    assert ledger.leave(c) == pytest.approx(1.0) and ledger.in_flight == 0


def test_gpu_cost_per_second_uses_price_and_gpus() -> None:
    cfg = parse_config({"pools": [{"name": "p", "model": "m", "gpu": "H100",
                                   "gpus_per_replica": 2}], "prices": {"H100": 7.2}})
    assert gpu_cost_per_second(cfg, "p") == pytest.approx(2 * 7.2 / 3600)
