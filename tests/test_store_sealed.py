"""Sealed chunks in the store (collector.store.sealed): what compaction seals reads back
exactly, every read gives what the rows gave, a schema-3 store is migrated in place, and a
kill -9 or a concurrent reader sees nothing lost or half-done."""

from __future__ import annotations

import math
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from support.store_rows import downgrade_to_v3

from collector.store import SCHEMA_VERSION, Store
from slo.sources.embedded import EmbeddedSource
from vigil.errors import StoreError
from vigil.model import SeriesKey, labels_of

H = 3_600_000
T0 = 1_760_000_000_000 // H * H + 17  # Unix ms, just past an hour
DAY = 24 * H
END = T0 + 2 * DAY

Row = tuple[SeriesKey, str, int, float | None]


def key(name: str, **labels: str) -> SeriesKey:
    return SeriesKey(name, labels_of(labels))


def history(seed: int = 0, start: int = T0, end: int = END) -> list[Row]:
    """Every value kind: a counter with resets, NaN and ±Inf; a gauge of floats, -0.0,
    huge and tiny values, staleness markers and gaps; histogram buckets; irregular and
    sub-second timestamps."""
    rng = random.Random(seed)
    rows: list[Row] = []
    for i in range(3):
        k = key("reqs_total", instance=f"r{i}")
        t, v = start + rng.randint(0, 30_000), 0.0
        while t < end:
            r = rng.random()
            if r < 0.004:
                v = rng.choice([0.0, 1.0, v / 3])  # a restart
            elif r < 0.006:
                rows.append((k, "counter", t, math.nan))
                t += 15_000
                continue
            elif r < 0.007:
                rows.append((k, "counter", t, None))
                t += rng.randint(1, 4) * H  # down for hours
                continue
            else:
                v += rng.choice([0.0, 0.0, 1.0, 2.0, 0.5, 1e-3])
            rows.append((k, "counter", t, math.inf if r > 0.9995 else v))
            t += 15_000 + rng.randint(-900, 900)
    g = key("kv_usage", instance="r0")
    for j, t in enumerate(range(start + 5, end, 20_000)):
        choice = j % 97
        value: float | None = (
            None if choice == 3 else math.nan if choice == 5 else -0.0 if choice == 7
            else -math.inf if choice == 11 else 1e300 if choice == 13 else 5e-324
            if choice == 17 else rng.random())
        rows.append((g, "gauge", t, value))
    for le in ("0.1", "+Inf"):
        k = key("lat_bucket", le=le, instance="r0")
        n = 0.0
        for t in range(start + 3, end, 60_000):
            n += rng.randint(0, 3)
            rows.append((k, "histogram", t, n))
    rows.append((key("once_total"), "counter", start + 12_345, 7.0))
    return rows


def bits(v: float | None) -> bytes | None:
    return None if v is None else struct.pack("<d", v)


def expected(rows: list[Row]) -> dict[SeriesKey, list[tuple[int, bytes | None]]]:
    """The samples as the store gives them back: the last write of a (series, ts) wins, and
    -0.0 is 0.0 (a REAL column of SQLite drops a zero's sign before anything is sealed)."""
    out: dict[SeriesKey, dict[int, bytes | None]] = {}
    for k, _, t, v in rows:
        out.setdefault(k, {})[t] = bits(0.0 if v == 0 else v)
    return {k: sorted(pts.items()) for k, pts in out.items()}


def everything(store: Store) -> dict[SeriesKey, list[tuple[int, bytes | None]]]:
    out = {}
    for name in store.metric_names():
        for k, pts in store.points(name).items():
            out[k] = [(p.ts_ms, bits(p.value)) for p in pts]
    return out


def span_store(path: Path, **kw: float) -> Store:
    """A store that keeps everything (no downsampling, no expiry) in one-hour chunks."""
    kw.setdefault("raw_retention_s", 400 * 86400)
    kw.setdefault("downsampled_retention_s", 400 * 86400)
    kw.setdefault("chunk_span_s", 3600)
    return Store(path, **kw)


def counts(store: Store) -> tuple[int, int]:
    c = store._c
    return (c.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
            + c.execute("SELECT COUNT(*) FROM samples_head").fetchone()[0],
            c.execute("SELECT COALESCE(SUM(n), 0) FROM chunks").fetchone()[0])


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "vigil.db"


def test_sealed_samples_read_back_bit_for_bit(path: Path) -> None:
    rows = history()
    with span_store(path) as s:
        s.write(rows)
        s.compact(now=END / 1000)
        in_rows, in_chunks = counts(s)
        n = sum(len(pts) for pts in expected(rows).values())
        assert in_chunks > 0.9 * n and in_rows + in_chunks == n
        assert everything(s) == expected(rows)
        # Every chunk lies below the sealed mark and within its own span.
        mark = int(s._meta()["sealed_below_ms"])
        for start, lo, hi in s._c.execute("SELECT start_ts, min_ts, max_ts FROM chunks"):
            assert start % H == 0 and start <= lo <= hi < start + H and hi < mark


def test_a_rewrite_or_backfill_into_a_sealed_span_wins_and_is_kept(path: Path) -> None:
    rows = history()
    g = key("kv_usage", instance="r0")
    t_old = next(t for k, _, t, _ in rows if k == g and t > T0 + 3 * H)
    with span_store(path) as s:
        s.write(rows)
        s.compact(now=END / 1000)
        changes: list[Row] = [(g, "gauge", t_old, 42.0),  # the same ts, a new value
                              (g, "gauge", t_old + 1, None),  # between two sealed samples
                              (g, "gauge", T0 - 5 * H, 1.5)]  # before everything
        s.write(changes)
        want = expected(rows + changes)
        assert everything(s) == want  # from the head, over the chunks
        s.compact(now=END / 1000)
        assert everything(s) == want  # moved, unsealed, sealed again
        assert s.last_points("kv_usage", None, t_old + 1)[g].value is None
        assert s.last_points("kv_usage", None, t_old)[g].value == 42.0
        assert counts(s)[0] < 0.1 * len(rows)


def test_last_points_look_into_chunks(path: Path) -> None:
    rows = history()
    with span_store(path) as s:
        s.write(rows)
        s.compact(now=END / 1000)
        raw = expected(rows)
        rng = random.Random(3)
        for at in [rng.randint(T0 - H, END + H) for _ in range(40)] + [T0 + 12_345]:
            got = s.last_points("reqs_total", None, at, lookback_ms=3 * H)
            for k in [k for k in raw if k.name == "reqs_total"]:
                before = [p for p in raw[k] if at - 3 * H <= p[0] <= at]
                if not before:
                    assert k not in got
                else:
                    assert (got[k].ts_ms, bits(got[k].value)) == before[-1]


def answers(store: Store, times: list[float]) -> list[object]:
    """What the SLO engine asks of the store, at ``times`` (Unix s)."""
    out: list[object] = []
    for sem in ("2", "3"):
        src = EmbeddedSource(store, semantics=sem)
        for at in times:
            for w in (300.0, 3600.0, 6 * 3600.0, 86400.0 + 1, 2 * 86400.0):
                out.append(bits_of(src.increase("reqs_total", {}, at, w)))
                out.append(bits_of(src.increase("lat_bucket", {}, at, w)))
                out.append(bits_of(src.avg_over_time("kv_usage", {}, at, w)))
    for at in times:
        at_ms = round(at * 1000)
        out.append(store.counter_windows("reqs_total", {}, at_ms - DAY, at_ms))
        out.append(store.gauge_windows("kv_usage", {}, at_ms - 6 * H, at_ms))
        out.append({k: (p.ts_ms, bits(p.value)) for k, p in
                    store.last_points("kv_usage", None, at_ms).items()})
    return out


def bits_of(x: object) -> object:
    if isinstance(x, dict):
        return {k: bits_of(v) for k, v in sorted(x.items(), key=lambda kv: repr(kv[0]))}
    if isinstance(x, float):
        return bits(x)
    return x


def test_a_schema_3_store_is_migrated_in_place_and_answers_as_before(path: Path) -> None:
    rows = history(seed=1)
    with span_store(path) as s:
        s.write(rows)
        s.compact(now=END / 1000)
    downgrade_to_v3(path)
    rng = random.Random(5)
    times = [rng.randint(T0, END + H) / 1000 for _ in range(10)] + [(T0 + 7 * H) / 1000]
    with Store.open_readonly(path) as ro:  # read as it is, from rows
        assert ro._meta()["schema_version"] == "3"
        before = answers(ro, times)
        assert everything(ro) == expected(rows)
    big = path.stat().st_size
    early = Store.open_readonly(path)  # open before the migration, reading on after it
    with early, span_store(path) as s:
        assert s._meta()["schema_version"] == str(SCHEMA_VERSION) == "4"
        assert counts(s)[1] == 0  # the rows stay until compaction seals them
        assert answers(s, times) == before
        s.compact(now=END / 1000)
        assert counts(s)[1] > 0.9 * len(rows)
        assert "vacuum_pending" not in s._meta()
        assert answers(s, times) == before
        assert everything(s) == expected(rows)
        assert everything(early) == expected(rows)
    assert path.stat().st_size < big / 2  # the freed pages went back to the file system
    with Store.open_readonly(path) as ro:
        assert answers(ro, times) == before


_KILLED_CHILD = textwrap.dedent("""
    import sys
    sys.path[:0] = {paths!r}
    from test_store_sealed import END, history, span_store
    with span_store({db!r}) as s:
        if {write!r}:
            s.write(history(seed=2))
        print("ready", flush=True)
        while True:
            s.compact(now=END / 1000)
""")


@pytest.mark.parametrize("when", ["sealing", "migrating"])
def test_a_kill_during_sealing_or_migration_loses_nothing(path: Path, when: str) -> None:
    rows = history(seed=2)
    if when == "migrating":
        with span_store(path) as s:
            s.write(rows)
            s.compact(now=END / 1000)
        downgrade_to_v3(path)
    here = Path(__file__).parent
    code = _KILLED_CHILD.format(paths=[str(here), str(here.parent)], db=str(path),
                                write=when == "sealing")
    for delay in (0.05, 0.2, 0.5):
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        with Store.open_readonly(path) as ro:
            assert everything(ro) == expected(rows), delay
    with span_store(path) as s:
        s.compact(now=END / 1000)
        assert everything(s) == expected(rows)
        assert counts(s)[1] > 0.9 * len(rows)


def test_readers_during_sealing_see_whole_windows(path: Path) -> None:
    rows = history(seed=4)
    with span_store(path) as s:
        s.write(rows)
        s.compact(now=(T0 + 2 * H) / 1000)  # the rollup exists; the rest waits in rows
        assert counts(s)[0] > 0.9 * len(rows)
    want = expected(rows)
    with Store.open_readonly(path) as ro:
        windows = ro.counter_windows("reqs_total", {}, T0, END)
        assert windows
    stop = threading.Event()
    seen: list[object] = []

    def read() -> None:
        with Store.open_readonly(path) as r:
            while not stop.is_set():
                seen.append(everything(r) == want
                            and r.counter_windows("reqs_total", {}, T0, END) == windows)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        with span_store(path) as s:
            s.compact(now=END / 1000)
            assert counts(s)[1] > 0
    finally:
        stop.set()
        reader.join()
    assert seen and all(seen)


def test_sealed_spans_are_downsampled_and_expired_as_rows_are(tmp_path: Path) -> None:
    """The same history and compactions, once with one-hour chunks and once with day-long
    ones (nothing sealed where it is downsampled): the same samples survive."""
    rows = history(seed=6)
    got = {}
    for span in (3600, 86400 * 30):
        p = tmp_path / f"{span}.db"
        with Store(p, raw_retention_s=6 * 3600, downsampled_retention_s=36 * 3600,
                   resolution_s=60, chunk_span_s=span) as s:
            s.write(rows)
            for t in range(T0 + DAY, END + 3 * H, H):
                s.compact(now=t / 1000)
            got[span] = everything(s)
            if span == 3600:
                assert counts(s)[1] > 0
    hourly, rowwise = got[3600], got[86400 * 30]
    assert hourly == rowwise
    oldest = min(pts[0][0] for pts in hourly.values())
    assert oldest >= (END + 2 * H) - 36 * H - H  # expired in whole hours
    assert sum(len(v) for v in hourly.values()) < 0.5 * len(rows)


def test_a_chunk_span_that_is_not_whole_hours_is_refused(path: Path) -> None:
    with pytest.raises(StoreError, match="whole number of hours"):
        Store(path, chunk_span_s=1800)


def test_a_copy_of_a_sealed_store_is_self_contained(path: Path, tmp_path: Path) -> None:
    rows = history(seed=7, end=T0 + 6 * H)
    with span_store(path) as s:
        s.write(rows)
        s.compact(now=(T0 + 6 * H) / 1000)
    copy = tmp_path / "copy.db"
    shutil.copy(path, copy)
    with Store.open_readonly(copy) as ro:
        assert everything(ro) == expected(rows)
