"""The sample store: round trips, transactions, readers vs. writer, schema checks, compaction."""

from __future__ import annotations

import itertools
import json
import math
import random
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from collector.store import SCHEMA_VERSION, CompactionReport, Store, counter_like
from collector.store import head as store_head
from collector.store.codec import encode_labels
from vigil.clock import ManualClock
from vigil.errors import StoreError
from vigil.model import Point, SeriesKey, TargetHealth

REPO = Path(__file__).resolve().parent.parent
T0 = 1_795_000_020_000  # Unix ms, a minute boundary
MIN = 60_000


def key(name: str, **labels: str) -> SeriesKey:
    return SeriesKey(name, tuple(sorted(labels.items())))


A = key("reqs_total", instance="r1", pool="p")
B = key("reqs_total", instance="r2", pool="p", model="m")
G = key("kv_usage", instance="r1", pool="p")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


def values(store: Store, name: str) -> dict[SeriesKey, list[tuple[int, float | None]]]:
    return {k: [tuple(p) for p in pts] for k, pts in store.points(name).items()}


def health(target: str, up: bool = True) -> TargetHealth:
    return TargetHealth(target, "p", "vllm", f"http://{target}:8000/metrics", up,
                        1_795_000_000.5, 0.25, 700, "" if up else "connection refused")


# --- counter_like ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "sample", "expected"),
    [
        ("counter", "reqs_total", True),
        ("counter", "reqs", True),
        ("counter", "reqs_created", False),
        ("histogram", "lat_bucket", True),
        ("histogram", "lat_count", True),
        ("histogram", "lat_sum", True),
        ("histogram", "lat_created", False),
        ("summary", "lat_count", True),
        ("summary", "lat_sum", True),
        ("summary", "lat", False),  # a quantile
        ("summary", "lat_created", False),
        ("gaugehistogram", "q_bucket", False),
        ("gaugehistogram", "q_gcount", False),
        ("gaugehistogram", "q_gsum", False),
        ("gauge", "kv_usage", False),
        ("gauge", "x_total", False),
        ("info", "build_info", False),
        ("stateset", "state", False),
        ("unknown", "x_total", False),
        ("untyped", "x", False),
    ],
)
def test_counter_like(family: str, sample: str, expected: bool) -> None:
    assert counter_like(family, sample) is expected


# --- round trips ----------------------------------------------------------------------------
def test_points_and_labels_round_trip(store: Store) -> None:
    odd = key("reqs_total", instance="r1", model='Llama "3" \\ 8B', path="é/ü/日本\n")
    assert store.write([(odd, "counter", T0, 1.0), (odd, "counter", T0 + 15_000, 2.5),
                        (A, "counter", T0, 7.0)]) == 3
    assert values(store, "reqs_total") == {
        A: [(T0, 7.0)],
        odd: [(T0, 1.0), (T0 + 15_000, 2.5)],
    }
    assert store.series("reqs_total") == [(odd, "counter"), (A, "counter")]  # "model" < "pool"


def test_labels_are_stored_as_canonical_json() -> None:
    labels = (("b", 'q"uote'), ("a", "é\\"), ("c", "\n\t"))
    assert encode_labels(labels) == json.dumps(sorted(labels), ensure_ascii=False,
                                               separators=(",", ":"))


def test_nan_inf_and_stale_stay_distinct(store: Store) -> None:
    store.write([(G, "gauge", T0, math.nan), (G, "gauge", T0 + 1, math.inf),
                 (G, "gauge", T0 + 2, -math.inf), (G, "gauge", T0 + 3, None),
                 (G, "gauge", T0 + 4, 0.0)])
    pts = store.points("kv_usage")[G]
    assert [p.ts_ms for p in pts] == [T0, T0 + 1, T0 + 2, T0 + 3, T0 + 4]
    nan, inf, ninf, stale, zero = (p.value for p in pts)
    assert isinstance(nan, float) and math.isnan(nan)
    assert inf == math.inf and ninf == -math.inf
    assert stale is None
    assert zero == 0.0


def test_same_series_and_ts_replaces(store: Store) -> None:
    store.write([(A, "counter", T0, 1.0)])
    store.write([(A, "counter", T0, 2.0), (A, "counter", T0 + 1, 3.0)])
    store.write([(A, "counter", T0, 2.0)])  # re-ingest: nothing changes
    assert values(store, "reqs_total") == {A: [(T0, 2.0), (T0 + 1, 3.0)]}


def test_write_nothing_returns_zero(store: Store) -> None:
    assert store.write([]) == 0
    assert store.metric_names() == []


def test_type_change_is_followed(store: Store) -> None:
    store.write([(A, "untyped", T0, 1.0)])
    store.write([(A, "counter", T0 + 1, 2.0)])
    assert store.series("reqs_total") == [(A, "counter")]


def test_metric_names(store: Store) -> None:
    store.write([(A, "counter", T0, 1.0), (B, "counter", T0, 1.0), (G, "gauge", T0, 0.5)])
    assert store.metric_names() == ["kv_usage", "reqs_total"]


def table_counts(store: Store) -> tuple[int, int]:
    c = store._c
    return (c.execute("SELECT COUNT(*) FROM samples").fetchone()[0],
            c.execute("SELECT COUNT(*) FROM samples_head").fetchone()[0])


def test_recent_samples_go_to_the_head_and_compaction_moves_them(tmp_path: Path) -> None:
    clock = ManualClock(T0 / 1000)
    with Store(tmp_path / "vigil.db", clock=clock) as s:
        for i in range(20):  # five minutes of scrapes, written as they happen
            s.write([(A, "counter", T0 + i * 15_000, float(i))])
            clock.advance(15)
        assert table_counts(s) == (0, 20)
        report = s.compact()
        assert report.rows_moved == 16  # all but the newest minute
        assert table_counts(s) == (16, 4)
        assert [p.value for p in s.points("reqs_total")[A]] == [float(i) for i in range(20)]
        assert s.last_points("reqs_total") == {A: Point(T0 + 285_000, 19.0)}
        assert s.last_points("reqs_total", at_ms=T0 + 200_000) == {A: Point(T0 + 195_000, 13.0)}
        # Re-writing a moved sample: the head's newer copy wins in reads and in the next move.
        s.write([(A, "counter", T0 + 15_000, 99.0), (A, "counter", T0 + 285_000, 19.5)])
        assert table_counts(s) == (16, 5)
        got = s.points("reqs_total", start_ms=T0 + 15_000, end_ms=T0 + 30_000)
        assert got == {A: [Point(T0 + 15_000, 99.0), Point(T0 + 30_000, 2.0)]}
        assert s.last_points("reqs_total", at_ms=T0 + 15_000) == {A: Point(T0 + 15_000, 99.0)}
        assert s.last_points("reqs_total") == {A: Point(T0 + 285_000, 19.5)}
        assert s.compact().rows_moved == 1
        assert table_counts(s) == (16, 4)
        assert s.points("reqs_total", start_ms=T0 + 15_000, end_ms=T0 + 15_000) == {
            A: [Point(T0 + 15_000, 99.0)]
        }


def test_compaction_leaves_the_newest_minute_and_the_future_in_the_head(tmp_path: Path) -> None:
    with Store(tmp_path / "vigil.db", clock=ManualClock(T0 / 1000)) as s:
        s.write([(A, "counter", T0 - 10 * MIN, 1.0), (A, "counter", T0 - 30_000, 1.5),
                 (A, "counter", T0 + 3600_000, 2.0)])
        assert s.compact().rows_moved == 1
        assert table_counts(s) == (1, 2)


def test_write_moves_the_head_itself_when_nobody_compacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_head, "_HEAD_MAX_ROWS", 100)
    clock = ManualClock(T0 / 1000)
    with Store(tmp_path / "vigil.db", clock=clock) as s:
        for i in range(121):
            s.write([(A, "counter", T0 + i * 15_000, float(i))])
            clock.advance(15)
        # After the 100th write, everything older than a minute before it moved.
        assert table_counts(s) == (95, 26)
        assert len(s.points("reqs_total")[A]) == 121


# --- transactions ---------------------------------------------------------------------------
def test_transaction_rollback_leaves_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError), store.transaction():
        store.write([(A, "counter", T0, 1.0)])
        store.set_target_health(health("r1"))
        raise RuntimeError("second file failed to parse")
    assert store.points("reqs_total") == {}
    assert store.series() == []
    assert store.target_health() == []
    # The series id handed out in the rolled-back transaction was forgotten too.
    store.write([(A, "counter", T0, 1.0)])
    assert values(store, "reqs_total") == {A: [(T0, 1.0)]}


def test_write_is_all_or_nothing(store: Store) -> None:
    with pytest.raises(StoreError, match="write"):
        store.write([(A, "counter", T0, 1.0), (B, "counter", T0, object())])  # type: ignore
    assert store.series() == []


def test_nested_writes_join_the_transaction(store: Store) -> None:
    with store.transaction():
        store.write([(A, "counter", T0, 1.0)])
        store.write([(B, "counter", T0, 2.0)])
        store.set_target_health(health("r1"))
        # Not committed yet: another connection sees nothing.
        with Store.open_readonly(store.path) as reader:
            assert reader.points("reqs_total") == {}
    with Store.open_readonly(store.path) as reader:
        assert set(reader.points("reqs_total")) == {A, B}
        assert [h.target for h in reader.target_health()] == ["r1"]


def test_caught_error_in_nested_block_undoes_only_that_block(store: Store) -> None:
    with store.transaction():
        store.write([(A, "counter", T0, 1.0)])
        with pytest.raises(StoreError):
            store.write([(B, "counter", T0, 1.0), (B, "counter", T0 + 1, object())])  # type: ignore
    assert values(store, "reqs_total") == {A: [(T0, 1.0)]}


# --- reading --------------------------------------------------------------------------------
def test_matchers(store: Store) -> None:
    store.write([(A, "counter", T0, 1.0), (B, "counter", T0, 2.0)])
    assert list(store.points("reqs_total", {"instance": "r2"})) == [B]
    assert list(store.points("reqs_total", {"model": ""})) == [A]  # "" = label absent
    assert list(store.points("reqs_total", {"pool": "p", "model": "m"})) == [B]
    assert store.points("reqs_total", {"pool": "nope"}) == {}
    assert store.points("reqs_total", {"nolabel": "x"}) == {}
    assert len(store.points("reqs_total", {"nolabel": ""})) == 2
    assert [k for k, _ in store.series(None, {"instance": "r1"})] == [A]
    assert [k for k, _ in store.series(matchers={"__name__": "reqs_total", "model": "m"})] == [B]


def test_points_bounds_are_inclusive(store: Store) -> None:
    store.write([(A, "counter", T0 + i * 1000, float(i)) for i in range(5)])
    got = store.points("reqs_total", start_ms=T0 + 1000, end_ms=T0 + 3000)[A]
    assert [p.ts_ms for p in got] == [T0 + 1000, T0 + 2000, T0 + 3000]
    assert store.points("reqs_total", start_ms=T0 + 5000) == {}


def test_frame_columns_and_dtypes(store: Store) -> None:
    store.write([(A, "counter", T0, 1.0), (A, "counter", T0 + 1, None),
                 (B, "counter", T0, math.nan), (B, "counter", T0 + 1, 4.0)])
    df = store.frame("reqs_total")
    assert list(df.columns) == ["ts_ms", "value", "stale", "__name__", "instance", "model",
                                "pool"]
    assert df["ts_ms"].dtype == "int64"
    assert df["value"].dtype == "float64"
    assert df["stale"].dtype == bool
    assert pd.api.types.is_string_dtype(df["instance"])
    assert df["model"].tolist() == ["", "", "m", "m"]  # A has no model label
    assert df["stale"].tolist() == [False, True, False, False]
    assert df["value"].isna().tolist() == [False, True, True, False]
    assert set(df["__name__"]) == {"reqs_total"}


def test_frame_of_nothing_has_the_fixed_columns(store: Store) -> None:
    df = store.frame("nothing")
    assert list(df.columns) == ["ts_ms", "value", "stale", "__name__"]
    assert len(df) == 0 and df["ts_ms"].dtype == "int64" and df["value"].dtype == "float64"


def test_frame_renames_a_label_clashing_with_a_fixed_column(store: Store) -> None:
    odd = key("m", value="v")
    store.write([(odd, "gauge", T0, 1.0)])
    df = store.frame("m")
    assert df["value"].tolist() == [1.0] and df["exported_value"].tolist() == ["v"]


def test_last_points(store: Store) -> None:
    store.write([(A, "counter", T0, 1.0), (A, "counter", T0 + 10, 2.0),
                 (A, "counter", T0 + 20, None), (B, "counter", T0 + 5, 9.0)])
    assert store.last_points("reqs_total") == {A: Point(T0 + 20, None), B: Point(T0 + 5, 9.0)}
    assert store.last_points("reqs_total", at_ms=T0 + 10) == {
        A: Point(T0 + 10, 2.0), B: Point(T0 + 5, 9.0),
    }
    assert store.last_points("reqs_total", at_ms=T0 + 4) == {A: Point(T0, 1.0)}
    assert store.last_points("reqs_total", at_ms=T0 - 1) == {}
    assert store.last_points("reqs_total", {"instance": "r2"}, at_ms=T0 + 30) == {
        B: Point(T0 + 5, 9.0)
    }
    assert store.last_points("reqs_total", at_ms=T0 + 12, lookback_ms=5) == {
        A: Point(T0 + 10, 2.0)
    }


def test_last_points_lookback_from_the_clock(tmp_path: Path) -> None:
    clock = ManualClock((T0 + 60_000) / 1000)
    with Store(tmp_path / "vigil.db", clock=clock) as s:
        s.write([(A, "counter", T0, 1.0), (B, "counter", T0 + 50_000, 2.0)])
        assert s.last_points("reqs_total", lookback_ms=30_000) == {B: Point(T0 + 50_000, 2.0)}


def test_target_health_round_trip(store: Store) -> None:
    store.set_target_health(health("r2"))
    store.set_target_health(health("r1"))
    store.set_target_health(health("r2", up=False))  # replaces
    assert store.target_health() == [health("r1"), health("r2", up=False)]


# --- concurrency ----------------------------------------------------------------------------
def test_reader_thread_reads_while_a_write_transaction_is_open(store: Store) -> None:
    store.write([(A, "counter", T0, 1.0)])
    seen: dict[str, object] = {}

    def read() -> None:
        try:
            with Store.open_readonly(store.path) as reader:
                seen["points"] = reader.points("reqs_total")
        except Exception as exc:  # reported below, in the test's thread
            seen["error"] = exc

    with store.transaction():
        store.write([(A, "counter", T0 + 1, 2.0)])
        reader = threading.Thread(target=read)
        reader.start()
        reader.join(timeout=30)
        assert not reader.is_alive()
    assert "error" not in seen, seen.get("error")
    assert seen["points"] == {A: [Point(T0, 1.0)]}  # the committed snapshot


def test_writer_commits_while_a_reader_holds_a_snapshot(store: Store) -> None:
    store.write([(A, "counter", T0, 1.0)])
    with Store.open_readonly(store.path) as reader:
        reader._c.execute("BEGIN")
        assert len(reader.points("reqs_total")[A]) == 1
        store.write([(A, "counter", T0 + 1, 2.0)])  # no 'database is locked'
        assert len(reader.points("reqs_total")[A]) == 1  # still its snapshot
        reader._c.execute("COMMIT")
        assert len(reader.points("reqs_total")[A]) == 2


def test_another_process_writes_while_we_read(store: Store) -> None:
    store.write([(A, "counter", T0, 1.0)])
    code = (
        "import sys\n"
        "from collector.store import Store\n"
        "from vigil.model import SeriesKey\n"
        "k = SeriesKey('reqs_total', (('instance', 'r9'),))\n"
        "with Store(sys.argv[1]) as s:\n"
        f"    s.write([(k, 'counter', {T0}, 5.0)])\n"
    )
    with Store.open_readonly(store.path) as reader:
        assert len(reader.points("reqs_total")) == 1
        subprocess.run([sys.executable, "-c", code, str(store.path)], cwd=REPO, check=True,
                       timeout=60)
        assert len(reader.points("reqs_total")) == 2
    # Our writer's cached ids are still right after another process added series.
    store.write([(A, "counter", T0 + 1, 2.0)])
    assert len(store.points("reqs_total")[A]) == 2


# --- opening --------------------------------------------------------------------------------
def test_missing_directory_is_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "vigil.db"
    with Store(path) as s:
        s.write([(A, "counter", T0, 1.0)])
    assert path.exists()
    with Store(path) as s:  # and reopens
        assert values(s, "reqs_total") == {A: [(T0, 1.0)]}


def test_unwritable_path_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    bad = tmp_path / "file" / "vigil.db"
    with pytest.raises(StoreError, match=str(bad)):
        Store(bad)


def test_non_sqlite_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 20)
    with pytest.raises(StoreError, match="not a Vigil store") as exc:
        Store(path)
    assert str(path) in str(exc.value)


def test_other_sqlite_database_is_not_a_vigil_store(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(StoreError, match="not a Vigil store"):
        Store(path)


@pytest.mark.parametrize("version", [str(SCHEMA_VERSION + 1), "banana"])
def test_schema_version_mismatch_is_refused(tmp_path: Path, version: str) -> None:
    path = tmp_path / "vigil.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
    conn.close()
    with pytest.raises(StoreError, match="schema version") as exc:
        Store(path)
    assert str(path) in str(exc.value)


def test_readonly_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such store"):
        Store.open_readonly(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
    Store(tmp_path / "vigil.db").close()
    with Store.open_readonly(tmp_path / "vigil.db") as reader:
        with pytest.raises(StoreError, match="read-only"):
            reader.write([(A, "counter", T0, 1.0)])
        with pytest.raises(StoreError, match="read-only"):
            reader.compact()


def test_closed_store_says_so(tmp_path: Path) -> None:
    s = Store(tmp_path / "vigil.db")
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        s.points("reqs_total")


# --- compaction -----------------------------------------------------------------------------
def compacting_store(tmp_path: Path, **kw: float) -> Store:
    kw.setdefault("raw_retention_s", 3600.0)
    kw.setdefault("downsampled_retention_s", 86400.0)
    return Store(tmp_path / "vigil.db", resolution_s=60.0, **kw)


def test_gauges_keep_the_last_sample_per_minute(tmp_path: Path) -> None:
    with compacting_store(tmp_path) as s:
        s.write([(G, "gauge", T0 + i * 15_000, float(i)) for i in range(12)])  # 3 minutes
        report = s.compact(now=(T0 + 3 * MIN) / 1000 + 3600)
        assert values(s, "kv_usage") == {
            G: [(T0 + 45_000, 3.0), (T0 + MIN + 45_000, 7.0), (T0 + 2 * MIN + 45_000, 11.0)]
        }
        assert report[:6] == CompactionReport(rows_before=12, rows_deleted=9,
                                              rows_kept_downsampled=3, rows_expired=0,
                                              watermark_ms=T0 + 3 * MIN, series_deleted=0)[:6]


def test_counter_reset_inside_a_minute_keeps_the_samples_around_it(tmp_path: Path) -> None:
    with compacting_store(tmp_path) as s:
        # One minute: 10, 20, 30 | reset | 5, 8; the next minute climbs past the old value.
        pts = [(0, 10.0), (10_000, 20.0), (20_000, 30.0), (30_000, 5.0), (40_000, 8.0),
               (MIN + 10_000, 100.0), (MIN + 20_000, 2.0), (MIN + 30_000, 150.0),
               (MIN + 40_000, 160.0)]
        s.write([(A, "counter", T0 + t, v) for t, v in pts])
        s.compact(now=(T0 + 2 * MIN) / 1000 + 3600)
        # Kept: the pre-reset 30 (and 100), the post-reset 5 (and 2), each minute's last.
        assert values(s, "reqs_total") == {A: [
            (T0 + 20_000, 30.0), (T0 + 30_000, 5.0), (T0 + 40_000, 8.0),
            (T0 + MIN + 10_000, 100.0), (T0 + MIN + 20_000, 2.0), (T0 + MIN + 40_000, 160.0),
        ]}
        # From the first kept sample on, the sum of deltas is the raw one.
        kept = [p.value for p in s.points("reqs_total")[A]]
        assert sum_of_deltas(kept) == sum_of_deltas([v for _, v in pts[2:]]) == 260.0


def test_histogram_buckets_are_downsampled_as_counters(tmp_path: Path) -> None:
    bucket = key("lat_bucket", le="0.5")
    with compacting_store(tmp_path) as s:
        s.write([(bucket, "histogram", T0 + t, v)
                 for t, v in [(0, 4.0), (15_000, 9.0), (30_000, 1.0), (45_000, 3.0)]])
        s.compact(now=(T0 + MIN) / 1000 + 3600)
        assert [p.value for p in s.points("lat_bucket")[bucket]] == [9.0, 1.0, 3.0]


def test_compaction_keeps_staleness_markers_and_nan(tmp_path: Path) -> None:
    with compacting_store(tmp_path) as s:
        s.write([(G, "gauge", T0 + t, v)
                 for t, v in [(0, 1.0), (15_000, None), (30_000, 2.0), (45_000, math.nan)]])
        s.compact(now=(T0 + MIN) / 1000 + 3600)
        got = s.points("kv_usage")[G]
        assert [p.ts_ms - T0 for p in got] == [15_000, 45_000]
        assert got[0].value is None and math.isnan(got[1].value)


def test_expiry_past_the_downsampled_retention(tmp_path: Path) -> None:
    with compacting_store(tmp_path, downsampled_retention_s=2 * 3600) as s:
        old = key("old_total", instance="gone")
        s.write([(old, "counter", T0, 1.0), (A, "counter", T0, 1.0),
                 (A, "counter", T0 + 3 * 3600_000, 2.0)])
        report = s.compact(now=T0 / 1000 + 3 * 3600)
        assert report.rows_expired == 2
        assert report.series_deleted == 1  # old_total has nothing left
        assert values(s, "reqs_total") == {A: [(T0 + 3 * 3600_000, 2.0)]}
        assert s.metric_names() == ["reqs_total"]
        # A series whose row was deleted can be written again (its cached id is gone).
        s.write([(old, "counter", T0 + 3 * 3600_000, 3.0)])
        assert values(s, "old_total") == {old: [(T0 + 3 * 3600_000, 3.0)]}


def test_series_deleted_by_another_writer_are_recreated(tmp_path: Path) -> None:
    path = tmp_path / "vigil.db"
    with Store(path) as collector, Store(path, raw_retention_s=60,
                                         downsampled_retention_s=3600) as other:
        collector.write([(A, "counter", T0, 1.0)])
        assert other.compact(now=T0 / 1000 + 7200).series_deleted == 1
        # The collector's cached id for A is dead; writing A again must not orphan samples.
        collector.write([(A, "counter", T0 + 7200_000, 2.0)])
        assert values(collector, "reqs_total") == {A: [(T0 + 7200_000, 2.0)]}


def test_retention_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="shorter than raw retention"):
        Store(tmp_path / "vigil.db", raw_retention_s=7200, downsampled_retention_s=3600)


def test_compaction_is_incremental(tmp_path: Path) -> None:
    clock = ManualClock(T0 / 1000)
    with Store(tmp_path / "vigil.db", clock=clock, raw_retention_s=3600,
               downsampled_retention_s=86400, chunk_span_s=86400) as s:
        s.write([(G, "gauge", T0 + i * 15_000, float(i)) for i in range(40)])  # 10 minutes
        clock.advance(3600 + 5 * 60)
        first = s.compact()
        assert (first.rows_before, first.rows_deleted) == (20, 15)
        assert first.watermark_ms == T0 + 5 * MIN
        again = s.compact()
        assert (again.rows_before, again.rows_deleted, again.rows_expired) == (0, 0, 0)
        assert again.watermark_ms == first.watermark_ms
        clock.advance(5 * 60)
        later = s.compact()
        assert (later.rows_before, later.rows_deleted) == (20, 15)  # only the new span
        assert len(s.points("kv_usage")[G]) == 10


def test_backfill_below_the_watermark_is_downsampled_later(tmp_path: Path) -> None:
    now = (T0 + 10 * MIN) / 1000 + 3600
    # (A day's chunk span: nothing is sealed yet. A sealed span is downsampled once it is
    # wholly past the raw retention: tests/test_store_sealed.py.)
    with compacting_store(tmp_path, chunk_span_s=86400) as s:
        s.write([(G, "gauge", T0 + 9 * MIN, 0.0)])
        s.compact(now=now)
        # `vigil ingest` of an old file: raw samples land in the downsampled past.
        s.write([(G, "gauge", T0 + i * 15_000, float(i)) for i in range(4)])
        report = s.compact(now=now)
        assert report.rows_deleted == 3
        assert [p.ts_ms for p in s.points("kv_usage")[G]] == [T0 + 45_000, T0 + 9 * MIN]


# --- the rollup (collector.store.rollup; exactness in tests/test_rollup.py) ---------------------
def test_counter_windows_give_what_increase_needs(tmp_path: Path) -> None:
    from collector.store import CounterWindow

    gauge = key("reqs_total", instance="r3", pool="p")  # same name, but a gauge family
    with Store(tmp_path / "vigil.db") as s:
        s.write([(A, "counter", T0 + i * MIN, v) for i, v in
                 enumerate([5.0, 7.0, None, 2.0, math.nan, 4.0, 4.0])])
        s.write([(gauge, "gauge", T0 + i * MIN, v) for i, v in enumerate([3.0, 1.0, 2.0])])
        end = T0 + 6 * MIN
        assert s.counter_windows("reqs_total", {}, T0, end) is None  # never compacted
        s.compact(now=(T0 + 4 * 3600_000) / 1000)
        got = s.counter_windows("reqs_total", {}, T0, end)
        # A: the marker is skipped (7 -> 2 is a reset), NaN is never part of one
        assert got == {A: CounterWindow(6, T0, 5.0, end, 4.0, (7.0,)),
                       gauge: CounterWindow(3, T0, 3.0, T0 + 2 * MIN, 2.0, (3.0,))}
        assert list(got) == sorted(got)  # key order, like every read
        assert s.counter_windows("reqs_total", {"instance": "r1"}, T0 + MIN + 1, end) == {
            A: CounterWindow(4, T0 + 3 * MIN, 2.0, end, 4.0, ())}  # the drop's 7 is outside
        assert s.counter_windows("nothing", {}, T0, end) == {}
    with Store.open_readonly(tmp_path / "vigil.db") as ro:
        assert ro.counter_windows("reqs_total", {"instance": "r1"}, T0, end) == {
            A: CounterWindow(6, T0, 5.0, end, 4.0, (7.0,))}


# --- the acceptance test: increase() over downsampled data matches the raw data -------------
def sum_of_deltas(vals: list[float | None]) -> float:
    """Prometheus's counter delta: a drop counts as a restart from zero."""
    nums = [v for v in vals if v is not None]
    return sum(b - a if b >= a else b for a, b in itertools.pairwise(nums))


def prom_increase(points: list[tuple[int, float | None]], start_ms: int, end_ms: int) -> float:
    """Prometheus ``increase()`` over (start, end] (ms), extrapolated like promql's
    ``extrapolatedRate`` (staleness markers are not in a range vector)."""
    pts = [(t, v) for t, v in points if start_ms < t <= end_ms and v is not None]
    assert len(pts) >= 2
    delta = sum_of_deltas([v for _, v in pts])
    (first_t, first_v), last_t = pts[0], pts[-1][0]
    sampled = (last_t - first_t) / 1000
    average = sampled / (len(pts) - 1)
    to_start = (first_t - start_ms) / 1000
    to_end = (end_ms - last_t) / 1000
    threshold = average * 1.1
    if to_start >= threshold:
        to_start = average / 2
    if delta > 0 and first_v >= 0:
        # Counters cannot go below zero: extrapolate at most to where it would be zero.
        to_start = min(to_start, sampled * (first_v / delta))
    if to_end >= threshold:
        to_end = average / 2
    return delta * (sampled + to_start + to_end) / sampled


RESET_AT, GONE_AT, BACK_AT = 50 * MIN + 7_000, 100 * MIN, 101 * MIN + 30_000


def generate_counters(rng: random.Random) -> dict[SeriesKey, list[tuple[int, float | None]]]:
    """Three hours of token counters scraped every 15 s with jitter: a steady load (±2 % over
    half an hour, ±2 % scrape to scrape), a counter reset at ``RESET_AT`` and a process
    restart at ``GONE_AT`` (no scrapes, a staleness marker, back from 0 at ``BACK_AT``).

    Each series has its own scrape phase, 4-11 s into each 15 s, like Prometheus's per-target
    offset, and ±0.7 s of jitter keeps every scrape on its side of a minute boundary and every
    raw interval under 1.1x the average. (A phase straddling a minute boundary makes the
    per-minute samples alternate 45/75 s apart, and then Prometheus's extrapolation to a
    window edge switches between "to the edge" and "half an interval" differently in raw and
    downsampled data: up to ~1 % apart. That is extrapolation, not lost increments.)
    """
    out: dict[SeriesKey, list[tuple[int, float | None]]] = {}
    for n, rate in enumerate([3.0, 40.0, 250.0]):  # per second
        phase_ms = 4_321 + n * 3_217
        swing = rng.random() * 2 * math.pi
        pts: list[tuple[int, float | None]] = []
        value, last_t = 0.0, 0
        for i in range(3 * 240):
            t = i * 15_000 + phase_ms + rng.randint(-700, 700)
            if GONE_AT <= t < BACK_AT:
                if t < GONE_AT + 15_000:
                    pts.append((T0 + t, None))  # the scrape that failed
                continue
            since = last_t
            if last_t < RESET_AT <= t:
                value, since = 0.0, RESET_AT
            elif last_t < BACK_AT <= t:
                value, since = 0.0, BACK_AT
            load = rate * (1 + 0.02 * math.sin(swing + 2 * math.pi * t / 1_800_000))
            value += load * (t - since) / 1000 * rng.uniform(0.98, 1.02)
            last_t = t
            pts.append((T0 + t, float(math.floor(value))))
        out[key(f"tokens_{n}_total", instance="r1")] = pts
    return out


def test_increase_over_downsampled_counters_matches_raw(tmp_path: Path) -> None:
    raw = generate_counters(random.Random(42))
    end = T0 + 3 * 3600_000
    with compacting_store(tmp_path, raw_retention_s=3600) as s:
        s.write([(k, "counter", t, v) for k, pts in raw.items() for t, v in pts])
        report = s.compact(now=end / 1000)
        assert report.watermark_ms == T0 + 2 * 3600_000
        assert report.rows_kept_downsampled < report.rows_before / 3
        stored = {k: [tuple(p) for p in pts] for k, pts in s.points("tokens_0_total").items()}
        stored |= {k: [tuple(p) for p in pts] for n in (1, 2)
                   for k, pts in s.points(f"tokens_{n}_total").items()}
    assert stored.keys() == raw.keys()
    # One-hour windows at odd offsets, all in the downsampled part; most contain the reset,
    # several the restart. No window edge falls inside the restart gap: there Prometheus
    # extrapolates to the edge only if the gap is under 1.1x the average sample interval,
    # which differs (by design) between 15 s raw and 60 s downsampled data.
    starts = [90, 480, 870, 1260, 1650, 2040, 2700, 2870, 3210, 3600]
    windows = [(T0 + s * 1000, T0 + s * 1000 + 3600_000) for s in starts]
    assert all(e <= report.watermark_ms for _, e in windows)
    assert sum(a < T0 + RESET_AT <= e for a, e in windows) >= 5
    assert sum(a < T0 + GONE_AT and e > T0 + BACK_AT for a, e in windows) >= 3
    assert not any(T0 + GONE_AT - 15_000 <= edge <= T0 + BACK_AT + 15_000
                   for w in windows for edge in w)
    for k in raw:
        for start, end in windows:
            want = prom_increase(raw[k], start, end)
            got = prom_increase(stored[k], start, end)
            assert got == pytest.approx(want, rel=1e-3), (k.name, (start - T0) // 1000)
