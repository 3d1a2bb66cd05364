"""The counter rollup (``collector.store.rollup``, kept by ``rollup_maintenance``, read by
``rollup_reads``) gives ``increase()`` what the samples give.

Every comparison here is bit for bit: ``EmbeddedSource`` with the rollup (``use_rollup``, the
default) against the same source reading every raw sample, on counters with resets (also
exactly at an hour boundary), gaps of whole hours, staleness markers, NaN and +Inf samples,
equal consecutive values, a gauge among the counters, histogram buckets — and after the
things that change stored samples under an existing rollup: downsampling, a backfill below
the watermark, expiry, a series changing type, and the schema migration.
"""

from __future__ import annotations

import math
import random
import sqlite3
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.store_rows import downgrade_to_v3, stored_rows

from collector.store import SCHEMA_VERSION, Store, rollup, rollup_reads, windows
from collector.store.rollup import BLOCK_MS
from collector.store.rollup_reads import Plan
from collector.store.schema import set_meta
from collector.store.windows import CounterWindow
from slo.sources.embedded import EmbeddedSource
from vigil.model import Labels, SeriesKey, labels_of

H = BLOCK_MS
DAY = 24 * H
#: An hour boundary, so that "block-aligned" below means what it says.
T0 = 1_760_000_000_000 // H * H
Row = tuple[SeriesKey, str, int, float | None]

#: Windows the SLO engine uses (burn-rate windows, the period) and some odd ones (seconds).
WINDOWS = (300, 1800, 3600, 7200, 5400.5, 6 * 3600, 86400, 2 * 86400, 3 * 86400, 30 * 86400)


def key(name: str, **labels: str) -> SeriesKey:
    return SeriesKey(name, labels_of(labels))


def bits(vector: dict[Labels, float]) -> dict[Labels, bytes]:
    """Floats as their IEEE bytes: equal means bit-identical (and NaN equals NaN)."""
    return {k: struct.pack("<d", v) for k, v in vector.items()}


def sources(store: Store, sem: str) -> tuple[EmbeddedSource, EmbeddedSource]:
    fast = EmbeddedSource(store, semantics=sem)  # type: ignore[arg-type]
    raw = EmbeddedSource(store, semantics=sem)  # type: ignore[arg-type]
    raw.use_rollup = False
    return fast, raw


def counter_rows(rng: random.Random, name: str, instance: str, start: int, end: int,
                 family: str = "counter", extra: dict[str, str] | None = None,
                 step_ms: int = 60_000) -> list[Row]:
    """A jittered counter with everything that matters to ``increase``."""
    k = key(name, instance=instance, **(extra or {}))
    rows: list[Row] = []
    t, v = start + rng.randint(0, step_ms - 1), float(rng.randint(0, 1000))
    while t < end:
        r = rng.random()
        if r < 0.008:  # a restart: back near zero
            v = float(rng.randint(0, 3))
        elif r < 0.012:  # a failed scrape: a staleness marker
            rows.append((k, family, t, None))
            t += step_ms
            continue
        elif r < 0.014:  # a NaN sample (a value, not a marker)
            rows.append((k, family, t, math.nan))
            t += step_ms
            continue
        elif r < 0.015:  # down for 1-3 hours: whole empty blocks
            t += rng.randint(1, 3) * H
        elif r < 0.06:  # no traffic: the same value again
            pass
        else:
            v += float(rng.randint(1, 40))
        rows.append((k, family, t, v))
        t += step_ms + rng.randint(-step_ms // 8, step_ms // 8)
    return rows


def fleet_rows(seed: int, start: int = T0, days: float = 2) -> list[Row]:
    rng = random.Random(seed)
    end = start + int(days * DAY)
    rows: list[Row] = []
    for i in range(3):
        rows += counter_rows(rng, "x_total", f"i{i}", start, end)
    # A reset exactly on an hour boundary: the drop is between two blocks.
    k = key("x_total", instance="edge")
    rows += [(k, "counter", start + h * H - 15_000 * j, 1000.0 * h - j) for h in range(1, 60, 7)
             for j in (2, 1)]
    rows += [(k, "counter", start + h * H, 5.0) for h in range(1, 60, 7)]
    rows += [(k, "counter", start + 50 * H + 3, math.inf)]
    # A gauge under the same name: increase() treats it as a counter, the rollup skips it.
    rows += counter_rows(rng, "x_total", "gauge", start, end, family="gauge")
    for le in ("0.1", "+Inf"):
        rows += counter_rows(rng, "h_bucket", "i0", start, end, family="histogram",
                             extra={"le": le}, step_ms=120_000)
    return rows


def instants(seed: int, start: int, end: int, n: int = 12) -> list[float]:
    """Evaluation times (s): random, on hour boundaries and 1 ms either side, past the end."""
    rng = random.Random(seed)
    out = [rng.randint(start, end + 2 * H) / 1000 for _ in range(n)]
    for _ in range(n // 3):
        edge = rng.randint(start // H, end // H + 1) * H
        out += [edge / 1000, (edge + 1) / 1000, (edge - 1) / 1000]
    return out


def assert_same(store: Store, sem: str, times: list[float],
                windows: tuple[float, ...] = WINDOWS) -> int:
    """Fast and raw agree on every series' increase (the sums and buckets are built from these
    by the same code); returns how many windows the rollup answered."""
    fast, raw = sources(store, sem)
    used = 0
    for at in times:
        for w in windows:
            for metric in ("x_total", "h_bucket"):
                got = fast._series_increases(metric, {}, at, w)
                want = raw._series_increases(metric, {}, at, w)
                assert bits(got) == bits(want), (metric, sem, at, w)
            at_ms = round(at * 1000)
            if store.counter_windows("x_total", {}, at_ms - round(w * 1000), at_ms) is not None:
                used += 1
    return used


def test_sums_and_buckets_from_the_rollup_equal_the_raw_samples(path: Path) -> None:
    rows = fleet_rows(0, days=1)
    end = max(t for _, _, t, _ in rows)
    with big_store(path) as s:
        s.write(rows)
        s.compact(now=end / 1000)
        for sem in ("2", "3"):
            fast, raw = sources(s, sem)
            for at in instants(1, T0, end, n=6):
                for w in (7200, 86400):
                    assert bits(fast.increase("x_total", {}, at, w)) == bits(
                        raw.increase("x_total", {}, at, w))
                    got = fast.bucket_increase("h", {}, at, w, ("instance",))
                    want = raw.bucket_increase("h", {}, at, w, ("instance",))
                    assert {k: sorted(map(struct.Struct("<dd").pack, *zip(*v, strict=True)))
                            for k, v in got.items()} == {
                        k: sorted(map(struct.Struct("<dd").pack, *zip(*v, strict=True)))
                        for k, v in want.items()}


def assert_consistent(store: Store) -> None:
    """The stored rollup below the limit equals one computed from scratch from the samples,
    and the write head holds nothing below the limit."""
    limit = rollup.fast_limit(store._meta())
    assert limit is not None
    c = store._c
    assert c.execute("SELECT COUNT(*) FROM samples_head WHERE ts < ?", (limit,)).fetchone() == (0,)
    hours: dict[tuple[int, int], int] = {}
    resets: list[tuple[int, int, float]] = []
    prev: dict[int, object] = {}
    for sid, ts, v in stored_rows(store, counter=True, below_ms=limit, with_markers=False):
        hours[sid, ts // H] = hours.get((sid, ts // H), 0) + 1
        p = prev.get(sid)
        if type(v) is float and type(p) is float and v < p:
            resets.append((sid, ts, p))
        prev[sid] = v
    whole = limit // H  # blocks below this are whole
    stored_hours = dict(((sid, b), n) for sid, b, n in c.execute(
        "SELECT series_id, blk, n FROM rollup WHERE blk < ?", (whole,)))
    assert stored_hours == {k: n for k, n in hours.items() if k[1] < whole}
    days: dict[tuple[int, int], int] = {}
    for (sid, b), n in hours.items():
        if b < whole:
            days[sid, b // 24] = days.get((sid, b // 24), 0) + n
    stored_days = {(sid, d): n for sid, d, n in c.execute(
        "SELECT series_id, day, n FROM rollup_day WHERE day < ?", (whole // 24,))}
    assert stored_days == {k: n for k, n in days.items() if k[1] < whole // 24}
    assert c.execute("SELECT series_id, ts, before FROM rollup_resets WHERE ts < ? "
                     "ORDER BY 1, 2", (limit,)).fetchall() == resets


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "vigil.db"


def big_store(path: Path, **kwargs: float) -> Store:
    kwargs = {"raw_retention_s": 40 * 86400, "downsampled_retention_s": 60 * 86400, **kwargs}
    return Store(path, **kwargs)  # type: ignore[arg-type]


# --- the rollup's pieces ----------------------------------------------------------------------
def test_plan_splits_a_window_around_whole_rolled_up_blocks() -> None:
    assert rollup_reads.plan(T0 + 5, T0 + 3 * H + 7, T0 + 10 * H) == Plan(
        T0 + 5, T0 + H, T0 + 3 * H, T0 + 3 * H + 8, T0 + 3 * H + 7)
    # the end above the rollup: the raw part starts at the limit
    assert rollup_reads.plan(T0, T0 + 5 * H, T0 + 2 * H) == Plan(T0, T0, T0 + 2 * H, T0 + 2 * H,
                                                           T0 + 5 * H)
    # an hour ending exactly at `end` is whole (end is inclusive)
    assert rollup_reads.plan(T0, T0 + H - 1, T0 + 5 * H) == Plan(T0, T0, T0 + H, T0 + H, T0 + H - 1)
    # no whole hour inside: the part below the limit is all edge, scanned in SQL
    assert rollup_reads.plan(T0 + 1, T0 + 2 * H - 2, T0 + 5 * H) == Plan(
        T0 + 1, T0 + 2 * H - 1, T0 + 2 * H - 1, T0 + 2 * H - 1, T0 + 2 * H - 2)
    assert rollup_reads.plan(T0, T0 + 5 * H, T0) == Plan(T0, T0, T0, T0, T0 + 5 * H)  # all above
    assert rollup.block_floor(T0 + H - 1) == T0 and rollup.block_ceil(T0 + 1) == T0 + H
    assert rollup.block_floor(-1) == -H  # floor, also before 1970


def test_summarize_and_concat_follow_extrapolated_rate() -> None:
    pts = [(1, 5.0), (2, None), (3, 3.0), (4, math.nan), (5, 1.0), (6, 1.0), (7, 0.5)]
    w = windows.summarize(pts)
    # stale marker skipped (5 -> 3 is a drop), NaN never part of a drop
    assert w == CounterWindow(6, 1, 5.0, 7, 0.5, (5.0, 1.0))
    assert windows.summarize([(1, None)]) is None
    a, b = windows.summarize(pts[:3]), windows.summarize(pts[3:])
    assert a is not None and b is not None
    joined = windows.concat(a, b)
    assert joined is not None and joined.n == w.n and joined.resets == w.resets
    assert windows.concat(None, b) is b and windows.concat(a, None) is a


def test_rollup_rows_count_samples_per_hour_and_keep_every_drop(path: Path) -> None:
    k = key("c_total", instance="a")
    rows: list[Row] = [
        (k, "counter", T0 + 10, 1.0), (k, "counter", T0 + 20, None),
        (k, "counter", T0 + 30, 0.5),            # drop inside hour 0
        (k, "counter", T0 + H - 1, 9.0),
        (k, "counter", T0 + H, 2.0),             # drop across the boundary
        (k, "counter", T0 + 3 * H + 5, math.nan),
        (k, "counter", T0 + 3 * H + 6, 1.0),     # after NaN: not a drop
        (key("g", instance="a"), "gauge", T0 + 10, 1.0),  # not counter-like: a gauge row
    ]
    with Store(path) as s:
        s.write(rows)
        report = s.compact(now=(T0 + 5 * H) / 1000)
        # the counter's hours 0, 1, 3 (4 and 5 are empty) and the gauge's hour 0
        assert report.rollup_blocks == 4
        blocks = s._c.execute("SELECT blk, n FROM rollup ORDER BY blk").fetchall()
        assert blocks == [(T0 // H, 3), (T0 // H + 1, 1), (T0 // H + 3, 2)]
        resets = s._c.execute("SELECT ts, before FROM rollup_resets ORDER BY ts").fetchall()
        assert resets == [(T0 + 30, 1.0), (T0 + H, 9.0)]
        assert s._meta()[rollup.K_WATERMARK] == str(T0 + 5 * H - 60_000)  # the head's cut


# --- fast == raw ------------------------------------------------------------------------------
@pytest.mark.parametrize("sem", ["2", "3"])
def test_long_windows_from_the_rollup_equal_the_raw_samples(path: Path, sem: str) -> None:
    rows = fleet_rows(1)
    end = max(t for _, _, t, _ in rows)
    with big_store(path) as s:
        s.write(rows)
        s.compact(now=end / 1000 + 600)
        assert_consistent(s)
        used = assert_same(s, sem, instants(2, T0, end))
        assert used > 150  # the rollup really answered most long windows


def test_the_unrolled_recent_part_and_the_head_are_read_raw(path: Path) -> None:
    rows = fleet_rows(3, days=1.5)
    end = max(t for _, _, t, _ in rows)
    with big_store(path) as s:
        s.write([r for r in rows if r[2] < end - 5 * H])
        s.compact(now=(end - 5 * H) / 1000)
        s.write([r for r in rows if r[2] >= end - 5 * H])  # stays in the head: no compaction
        assert assert_same(s, "3", instants(4, end - 8 * H, end, n=12)) > 50


def test_a_long_window_reads_raw_samples_only_above_the_rollup(path: Path, monkeypatch) -> None:
    rows = fleet_rows(5)
    end = max(t for _, _, t, _ in rows)
    with big_store(path) as s:
        s.write(rows)
        s.compact(now=end / 1000)
        wm = int(s._meta()[rollup.K_WATERMARK])
        assert wm == end - 60_000  # the head keeps the last minute
        calls: list[tuple[int, int]] = []
        real = s._reader._windows

        def spy(load, ids, lo, hi):  # type: ignore[no-untyped-def]
            if ids:
                calls.append((lo, hi))
            return real(load, ids, lo, hi)

        monkeypatch.setattr(s._reader, "_windows", spy)
        monkeypatch.setattr(s, "points", None)  # never called
        EmbeddedSource(s).increase("h_bucket", {}, end / 1000, 30 * 86400)
        assert calls == [(wm, end)]  # only what is still in the write head, sample by sample


@pytest.mark.parametrize("sem", ["2", "3"])
def test_after_downsampling(path: Path, sem: str) -> None:
    rows = fleet_rows(6)
    end = max(t for _, _, t, _ in rows)
    with Store(path, raw_retention_s=6 * 3600, downsampled_retention_s=30 * 86400) as s:
        s.write(rows)
        first = s.compact(now=(end - DAY) / 1000)  # builds the rollup, downsamples 1.5 days
        assert first.rows_deleted > 0
        report = s.compact(now=end / 1000)  # downsamples a day under the existing rollup
        assert report.rows_deleted > 0 and report.rollup_blocks > 0
        assert_consistent(s)
        assert assert_same(s, sem, instants(7, T0, end)) > 150


def test_a_backfill_below_the_watermark_is_read_raw_until_rebuilt(path: Path) -> None:
    rows = fleet_rows(8, days=2)
    end = max(t for _, _, t, _ in rows)
    k = key("x_total", instance="i1")
    with big_store(path) as s:
        s.write(rows)
        s.compact(now=end / 1000 + 600)
        assert rollup.K_DIRTY not in s._meta()
        # `vigil ingest` of old data: a new drop, a marker and a new series, in rolled-up hours
        late = [(k, "counter", T0 + 20 * H + 7, 0.0), (k, "counter", T0 + 20 * H + 8, None),
                (key("x_total", instance="late"), "counter", T0 + 30 * H, 5.0),
                (key("x_total", instance="late"), "counter", T0 + 31 * H + 9, 7.0)]
        # ... and a re-written sample: the head's copy must win over the main table's
        moved = next((kk, f, t, v) for kk, f, t, v in rows
                     if kk == k and t > T0 + 25 * H and v is not None)
        late.append((k, "counter", moved[2], moved[3] - 500.0))
        s.write(late)
        assert s._meta()[rollup.K_DIRTY] == str(T0 + 20 * H)
        times = instants(9, T0, end, n=9)
        assert_same(s, "3", times)  # the stale hours are read raw
        s.compact(now=end / 1000 + 900)
        assert rollup.K_DIRTY not in s._meta() and rollup.K_REBUILD not in s._meta()
        assert_consistent(s)
        assert assert_same(s, "3", times) > 100


def test_expiry_under_the_rollup(path: Path) -> None:
    rows = fleet_rows(10, days=3)
    end = max(t for _, _, t, _ in rows)
    with Store(path, raw_retention_s=86400, downsampled_retention_s=2 * 86400) as s:
        s.write(rows)
        s.compact(now=(end - 10 * H) / 1000)
        report = s.compact(now=end / 1000)  # expires 10 more hours under the rollup
        assert report.rows_expired > 0
        assert_consistent(s)
        oldest = s._c.execute("SELECT MIN(blk) FROM rollup").fetchone()[0]
        assert oldest * H >= rollup.block_floor(end - 2 * DAY)
        assert assert_same(s, "2", instants(11, end - 3 * DAY, end)) > 100


def test_a_series_that_becomes_a_counter_is_rebuilt(path: Path) -> None:
    rng = random.Random(12)
    mid = T0 + DAY
    gauge = counter_rows(rng, "x_total", "i0", T0, mid, family="gauge")
    counter = counter_rows(rng, "x_total", "i0", mid, T0 + 2 * DAY)
    with big_store(path) as s:
        s.write(gauge)
        s.compact(now=mid / 1000)
        assert s._c.execute("SELECT COUNT(*) FROM rollup").fetchone()[0] == 0
        s.write(counter)  # the family is a counter now: its past needs a rollup too
        assert s._meta()[rollup.K_DIRTY] == "0"
        times = instants(13, T0, T0 + 2 * DAY, n=9)
        assert_same(s, "3", times)
        s.compact(now=(T0 + 2 * DAY) / 1000)
        assert_consistent(s)
        assert assert_same(s, "3", times) > 50


def test_an_interrupted_rebuild_resumes(path: Path) -> None:
    rows = fleet_rows(14, days=2)
    end = max(t for _, _, t, _ in rows)
    with big_store(path) as s:
        s.write(rows)
        s.compact(now=end / 1000)
        with s.transaction():  # as if compaction died half-way through a rebuild from hour 5
            s._c.execute("DELETE FROM rollup WHERE blk >= ?", (T0 // H + 5,))
            set_meta(s._c, rollup.K_REBUILD, str(T0 + 5 * H))
        times = instants(15, T0, end, n=9)
        assert_same(s, "3", times)
        s.compact(now=end / 1000)
        assert_consistent(s)
        assert assert_same(s, "3", times) > 50


# --- schema ---------------------------------------------------------------------------------
def downgrade_to_v2(path: Path) -> None:
    downgrade_to_v3(path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TRIGGER rollup_counter_off")
        conn.execute("DROP TABLE rollup_gauge")
        conn.execute("DROP TABLE rollup_gauge_day")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.close()


def downgrade_to_v1(path: Path) -> None:
    downgrade_to_v2(path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TRIGGER rollup_counter_on")
        conn.execute("DROP TABLE rollup")
        conn.execute("DROP TABLE rollup_resets")
        conn.execute("DROP TABLE rollup_day")
        conn.execute("DELETE FROM meta WHERE key LIKE 'rollup%'")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.close()


def test_a_version_1_store_is_migrated_and_its_rollup_built_by_compaction(path: Path) -> None:
    assert SCHEMA_VERSION == 4
    rows = fleet_rows(16, days=2)
    end = max(t for _, _, t, _ in rows)
    with big_store(path) as s:
        s.write(rows)
        s.compact(now=end / 1000)
    downgrade_to_v1(path)
    times = instants(17, T0, end, n=9)
    with Store.open_readonly(path) as ro:  # a reader does not migrate: it reads raw samples
        assert ro.counter_windows("x_total", {}, T0, end) is None
        assert_same(ro, "3", times[:5])
    with big_store(path) as s:
        assert s._meta()["schema_version"] == "4"
        assert s.counter_windows("x_total", {}, T0, end) is None  # not built yet
        s.compact(now=end / 1000)
        assert_consistent(s)
        assert assert_same(s, "3", times) > 40
    with Store.open_readonly(path) as ro:
        assert ro.counter_windows("x_total", {}, T0, end) is not None


# --- property: any series, any window -------------------------------------------------------
VALUES = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0, 3.0, 1e15, math.nan, math.inf, -1.0, None]),
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
)


@st.composite
def series_and_windows(
    draw: st.DrawFn, values: st.SearchStrategy[float | None] = VALUES,
) -> tuple[list[tuple[int, float | None]], list[tuple]]:
    n = draw(st.integers(2, 60))
    gaps = draw(st.lists(st.integers(1, 2 * H), min_size=n, max_size=n))
    ts, t = [], T0 + draw(st.integers(0, H))
    for g in gaps:
        ts.append(t)
        t += g
    values = draw(st.lists(values, min_size=n, max_size=n))
    queries = draw(st.lists(
        st.tuples(st.integers(T0, t + H), st.integers(1, 12 * H), st.sampled_from(["2", "3"])),
        min_size=1, max_size=12))
    return list(zip(ts, values, strict=True)), queries


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(series_and_windows())
def test_any_series_any_window(data: tuple[list[tuple[int, float | None]], list[tuple]]) -> None:
    points, queries = data
    k = key("x_total", instance="p")
    with tempfile.TemporaryDirectory() as d, big_store(Path(d) / "v.db") as s:
        s.write([(k, "counter", t, v) for t, v in points])
        s.compact(now=(points[-1][0] + H) / 1000)
        assert_consistent(s)
        for at_ms, w_ms, sem in queries:
            fast, raw = sources(s, sem)
            assert bits(fast.increase("x_total", {}, at_ms / 1000, w_ms / 1000)) == bits(
                raw.increase("x_total", {}, at_ms / 1000, w_ms / 1000)), (at_ms, w_ms, sem)


# --- gauges: avg_over_time from the gauge rollup (schema 3) -----------------------------------
def up_rows(rng: random.Random, instance: str, start: int, end: int,
            step_ms: int = 60_000) -> list[Row]:
    """``up`` of a flaky target: 1, runs of 0, staleness markers, gaps of whole hours."""
    k = key("up", instance=instance)
    rows: list[Row] = []
    t, v = start + rng.randint(0, step_ms - 1), 1.0
    while t < end:
        r = rng.random()
        if r < 0.01:
            v = 1.0 - v  # goes down / comes back
        elif r < 0.015:
            rows.append((k, "gauge", t, None))
            t += step_ms
            continue
        elif r < 0.017:
            t += rng.randint(1, 3) * H
        rows.append((k, "gauge", t, v))
        t += step_ms + rng.randint(-step_ms // 8, step_ms // 8)
    return rows


def gauge_fleet(seed: int, start: int = T0, days: float = 2) -> list[Row]:
    rng = random.Random(seed)
    end = start + int(days * DAY)
    rows: list[Row] = []
    for i in range(3):
        rows += up_rows(rng, f"i{i}", start, end)
    # Always up: the 2.x running mean is exact too (every sample equal).
    rows += [(key("up", instance="steady"), "gauge", t, 1.0)
             for t in range(start + 7, end, 60_000)]
    # Not integers: the rollup cannot prove the mean, the samples are read.
    rows += [(key("up", instance="frac"), "gauge", t, 0.1 * (t // 60_000 % 7))
             for t in range(start + 11, end, 60_000)]
    # A NaN and an Inf in otherwise integer series.
    rows += [(key("up", instance="nan"), "gauge", t, math.nan if t == start + 13 + 60 * 60_000
              else 1.0) for t in range(start + 13, end, 60_000)]
    rows += [(key("up", instance="inf"), "gauge", start + 5 * H + 1, math.inf),
             (key("up", instance="inf"), "gauge", start + 5 * H + 60_001, 0.0)]
    return rows


def assert_same_avg(store: Store, sem: str, times: list[float],
                    windows: tuple[float, ...] = WINDOWS) -> None:
    fast, raw = sources(store, sem)
    for at in times:
        for w in windows:
            got = fast.avg_over_time("up", {}, at, w)
            want = raw.avg_over_time("up", {}, at, w)
            assert bits(got) == bits(want), (sem, at, w)


def assert_gauges_consistent(store: Store) -> None:
    """The gauge rows below the limit equal ones computed from scratch from the samples."""
    limit = rollup.fast_limit(store._meta())
    assert limit is not None
    whole = limit // H
    want: dict[tuple[int, int], windows.GaugeWindow] = {}
    rows: dict[tuple[int, int], list[tuple[int, object]]] = {}
    for sid, ts, v in stored_rows(store, counter=False, below_ms=whole * H):
        rows.setdefault((sid, ts // H), []).append((ts, v))
    for k, pts in rows.items():
        g = windows.gauge_of_points(pts)
        if g is not None:
            want[k] = g
    got = {(sid, b): windows.GaugeWindow(n, nint, total, vmin, vmax)
           for sid, b, n, nint, total, vmin, vmax in store._c.execute(
               "SELECT series_id, blk, n, nint, total, vmin, vmax FROM rollup_gauge "
               "WHERE blk < ?", (whole,))}
    assert got == want


@pytest.mark.parametrize("sem", ["2", "3"])
def test_avg_over_time_from_the_gauge_rollup_equals_the_raw_samples(path: Path, sem: str) -> None:
    rows = gauge_fleet(21, days=2)
    end = max(t for _, _, t, _ in rows)
    with big_store(path) as s:
        s.write(rows[: len(rows) * 2 // 3])
        s.compact(now=end / 1000 - 6 * 3600)
        s.write(rows[len(rows) * 2 // 3:])  # some of it only in the head
        assert_gauges_consistent(s)
        assert_same_avg(s, sem, instants(22, T0, end, n=9))
        # The rollup answered: integer series have a provable mean over a long window.
        windows = s.gauge_windows("up", {}, T0, end)
        assert windows is not None
        means = {k.labels: w.mean(sem == "2") for k, w in windows.items()}
        steady = labels_of({"instance": "steady"})
        assert means[steady] == 1.0
        assert means[labels_of({"instance": "frac"})] is None
        assert means[labels_of({"instance": "nan"})] is None
        assert means[labels_of({"instance": "inf"})] is None
        flaky = means[labels_of({"instance": "i0"})]
        assert (flaky is None) if sem == "2" else (flaky is not None and 0 < flaky < 1)


def test_a_gauge_rollup_is_read_instead_of_the_samples(path: Path, monkeypatch) -> None:
    rows = gauge_fleet(23, days=3)
    end = max(t for _, _, t, _ in rows)
    with big_store(path) as s:
        s.write(rows)
        s.compact(now=end / 1000)
        fast, raw = sources(s, "3")
        want = raw.avg_over_time("up", {"instance": "i1"}, end / 1000, 2 * 86400)
        read: list[tuple[int, int]] = []
        points = Store.points

        def spy(self, name, matchers=None, start_ms=None, end_ms=None):  # type: ignore[no-untyped-def]
            read.append((start_ms, end_ms))
            return points(self, name, matchers, start_ms, end_ms)

        monkeypatch.setattr(Store, "points", spy)
        assert bits(fast.avg_over_time("up", {"instance": "i1"}, end / 1000, 2 * 86400)) == (
            bits(want))
        assert read == []  # no sample read through points(): all from the rollup


def test_a_version_2_store_gets_its_gauge_rollup_after_migration(path: Path) -> None:
    rows = gauge_fleet(24, days=2)
    end = max(t for _, _, t, _ in rows)
    with big_store(path) as s:
        s.write(rows)
        s.compact(now=end / 1000)
    downgrade_to_v2(path)
    times = instants(25, T0, end, n=6)
    with Store.open_readonly(path) as ro:  # read as is: samples
        assert ro.gauge_windows("up", {}, T0, end) is None
        assert_same_avg(ro, "3", times[:4])
    with big_store(path) as s:
        assert s._meta()["schema_version"] == "4"
        # empty and marked stale: read raw until compaction rebuilds it
        assert s._c.execute("SELECT COUNT(*) FROM rollup_gauge").fetchone() == (0,)
        assert rollup.fast_limit(s._meta()) == 0
        before = s.gauge_windows("up", {}, T0, end)
        assert_same_avg(s, "3", times[:2])
        s.compact(now=end / 1000)
        assert s._c.execute("SELECT COUNT(*) FROM rollup_gauge").fetchone()[0] > 100
        assert_gauges_consistent(s)
        assert_same_avg(s, "3", times)
        assert s.gauge_windows("up", {}, T0, end) == before


GAUGE_VALUES = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0, -3.0, 2.0**31, 2.0**31 + 1, math.nan, math.inf, None]),
    st.floats(min_value=-10, max_value=10, allow_nan=False),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(series_and_windows(GAUGE_VALUES), st.integers(0, 2))
def test_any_gauge_any_window(
    data: tuple[list[tuple[int, float | None]], list[tuple]], cut: int
) -> None:
    points, queries = data
    k = key("up", instance="p")
    with tempfile.TemporaryDirectory() as d, big_store(Path(d) / "v.db") as s:
        s.write([(k, "gauge", t, v) for t, v in points])
        # compacted at the end, in the middle, or not at all (all raw)
        if cut < 2:
            at = points[-1][0] + H if cut == 0 else points[len(points) // 2][0]
            s.compact(now=at / 1000)
            assert_gauges_consistent(s)
        for at_ms, w_ms, sem in queries:
            fast, raw = sources(s, sem)
            assert bits(fast.avg_over_time("up", {}, at_ms / 1000, w_ms / 1000)) == bits(
                raw.avg_over_time("up", {}, at_ms / 1000, w_ms / 1000)), (at_ms, w_ms, sem)
