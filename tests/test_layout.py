"""The repeat-scrape fast path stores exactly what the full parse stores, or steps aside."""

from __future__ import annotations

import pytest
from support.loopback import FIXTURES

from collector.exposition import parse_text
from collector.layout import Layout
from collector.scrape import Fetched, TargetInfo, points_from_families
from collector.service import ScrapeWriter
from collector.store import Store

V1 = (FIXTURES / "vllm_v1_metrics_sample.txt").read_text()
DCGM = (FIXTURES / "dcgm_exporter_sample.txt").read_text()
TARGET = TargetInfo("chat-0", "http://127.0.0.1:1/metrics", "chat", "vllm")
CTYPE = "text/plain; version=0.0.4; charset=utf-8"


def fetched(text: str, ctype: str = CTYPE) -> Fetched:
    return Fetched(text.encode(), ctype, 0.001, "")


def stored(db, at_ms: int) -> dict:
    with Store(db) as s:
        out = {}
        for name in s.metric_names():
            for key, pts in s.points(name, start_ms=at_ms, end_ms=at_ms).items():
                out[key] = [p.value for p in pts]
        return out


def bump(text: str) -> str:
    """The same exposition with every counter moved on (values change, shape does not)."""
    return text.replace("9876.0", "9900.0").replace(" 24.0", " 25.0")


@pytest.mark.parametrize("body", [V1, DCGM], ids=["vllm", "dcgm"])
def test_fast_path_stores_what_the_full_path_stores(tmp_path, body):
    fast = ScrapeWriter(Store(tmp_path / "fast.db"))
    full = ScrapeWriter(Store(tmp_path / "full.db"))
    for i, text in enumerate([body, bump(body), bump(body)]):
        now = 1_795_000_000.0 + 15 * i
        fast.process(TARGET, fetched(text), now)
        full._layouts.clear()  # force the full parse every time
        full.process(TARGET, fetched(text), now)
    assert fast._layouts[TARGET.name] is not None
    fast.store.close()
    full.store.close()
    for i in range(3):
        ts = 1_795_000_000_000 + 15_000 * i
        a, b = stored(tmp_path / "fast.db", ts), stored(tmp_path / "full.db", ts)
        # scrape_duration_seconds differs between runs; everything else is identical
        a = {k: v for k, v in a.items() if k.name != "scrape_duration_seconds"}
        b = {k: v for k, v in b.items() if k.name != "scrape_duration_seconds"}
        assert a == b


def test_layout_reads_only_the_same_shape():
    points = points_from_families(parse_text(V1), TARGET, 1000)
    layout = Layout.build(V1, points, 1000)
    assert layout is not None and layout.samples == len(points)
    assert layout.read(V1, 1000) == points
    lines = V1.splitlines()
    assert layout.read("\n".join(lines[:-1]) + "\n", 1000) is None  # a series missing
    assert layout.read(V1 + 'extra_metric 1\n', 1000) is None  # a series more
    swapped = lines[:]
    i = next(n for n, line in enumerate(lines) if line.startswith("vllm:num_requests_running"))
    j = next(n for n, line in enumerate(lines) if line.startswith("vllm:num_requests_waiting{"))
    swapped[i], swapped[j] = swapped[j], swapped[i]
    assert layout.read("\n".join(swapped) + "\n", 1000) is None  # reordered
    with_ts = V1.replace(" 24.0\n", " 24.0 1795000000000\n")
    assert layout.read(with_ts, 1000) is None  # a timestamp appeared
    assert layout.read(V1.replace(" 24.0\n", " 2_4\n"), 1000) is None  # odd number spelling
    assert layout.read(V1.replace("# HELP vllm:num_requests_running Number",
                                  "# HELP vllm:num_requests_running Count"), 1000) is None


def test_bad_value_on_a_repeat_scrape_gets_the_full_error(tmp_path):
    w = ScrapeWriter(Store(tmp_path / "v.db"))
    assert w.process(TARGET, fetched(V1), 1_795_000_000.0).up
    bad = V1.replace(" 24.0\n", " 24.0.1\n")
    h = w.process(TARGET, fetched(bad), 1_795_000_015.0)
    assert not h.up and "parse error: line" in h.error
    assert TARGET.name not in w._layouts  # forgotten after a failure
    assert w.process(TARGET, fetched(V1), 1_795_000_030.0).up
    w.store.close()


def test_non_cumulative_buckets_on_a_repeat_scrape_fall_back(tmp_path):
    body = (
        "# TYPE h histogram\n"
        'h_bucket{le="1.0"} 1\nh_bucket{le="2.0"} 2\nh_bucket{le="+Inf"} 3\nh_count 3\nh_sum 4\n'
    )
    w = ScrapeWriter(Store(tmp_path / "v.db"))
    assert w.process(TARGET, fetched(body), 1_795_000_000.0).up
    bad = body.replace('h_bucket{le="2.0"} 2', 'h_bucket{le="2.0"} 0')
    h = w.process(TARGET, fetched(bad), 1_795_000_015.0)
    assert not h.up, "the fast path must not accept what the full parser rejects"
    w.store.close()


def test_openmetrics_bodies_have_no_layout(tmp_path):
    om = (FIXTURES / "vllm_v1_metrics_sample.openmetrics.txt").read_text()
    w = ScrapeWriter(Store(tmp_path / "v.db"))
    h = w.process(TARGET, fetched(om, "application/openmetrics-text; version=1.0.0"), 1.0e9)
    assert h.up and TARGET.name not in w._layouts
    w.store.close()


def test_samples_with_own_timestamps_get_no_layout():
    body = "# TYPE g gauge\ng 1000 1000\n"
    points = points_from_families(parse_text(body), TARGET, 5000)
    assert points[0][2] == 1000  # honoured timestamp
    assert Layout.build(body, points, 5000) is None


def test_nan_values_keep_the_layout():
    body = "# TYPE g gauge\ng NaN\n"
    points = points_from_families(parse_text(body), TARGET, 5000)
    assert Layout.build(body, points, 5000) is not None
