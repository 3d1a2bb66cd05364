"""`vigil ingest` and `vigil targets` through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import require_binary
from support.loopback import FIXTURES

from collector.store import Store

V1 = FIXTURES / "vllm_v1_metrics_sample.txt"
OM = FIXTURES / "vllm_v1_metrics_sample.openmetrics.txt"


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "vigil.toml"
    p.write_text(
        '[store]\npath = "vigil.db"\n'
        '[[pools]]\nname = "chat"\nmodel = "m"\n'
        '[[targets]]\nname = "chat-0"\nurl = "http://127.0.0.1:9/metrics"\npool = "chat"\n'
        '[[targets]]\nname = "chat-1"\nurl = "http://127.0.0.1:9/metrics"\npool = "chat"\n'
    )
    return p


def vigil(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vigil_shell.cli", *args],
        capture_output=True, text=stdin is None, input=stdin, timeout=120,
    )


def count_rows(db) -> int:
    with Store(db) as s:
        return sum(len(v) for n in s.metric_names() for v in s.points(n).values())


def test_ingest_one_scrape_at_time(cfg, tmp_path):
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-0", "--at", "1795943100", str(V1))
    assert r.returncode == 0, r.stderr
    assert "(scrape)" in r.stdout
    with Store(tmp_path / "vigil.db") as s:
        pts = s.points("vllm:num_requests_running", {"instance": "chat-0"})
        (values,) = pts.values()
        assert values[0].ts_ms == 1_795_943_100_000 and values[0].value == 24.0
        (up,) = s.points("up", {"instance": "chat-0"}).values()
        assert up[0].value == 1.0


def test_backfill_text_format_ms_timestamps(cfg, tmp_path):
    body = "".join(
        '# TYPE vllm:num_requests_waiting gauge\n' if i == 0 else ""
        for i in range(1)
    ) + "".join(
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {i} {1795943000000 + i * 15000}\n'
        for i in range(5)
    )
    f = tmp_path / "backfill.prom"
    f.write_text(body)
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-1", str(f))
    assert r.returncode == 0, r.stderr
    assert "(backfill)" in r.stdout
    with Store(tmp_path / "vigil.db") as s:
        (values,) = s.points("vllm:num_requests_waiting").values()
        assert [p.ts_ms for p in values] == [1795943000000 + i * 15000 for i in range(5)]
        (up,) = s.points("up", {"instance": "chat-1", "pool": "chat"}).values()
        assert [(p.ts_ms, p.value) for p in up] == [
            (1795943000000 + i * 15000, 1.0) for i in range(5)
        ]


def test_backfill_openmetrics_seconds(cfg, tmp_path):
    f = tmp_path / "b.om"
    f.write_text(
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 7 1795943000.5\n'
        "# EOF\n"
    )
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-1", str(f))
    assert r.returncode == 0, r.stderr
    with Store(tmp_path / "vigil.db") as s:
        (values,) = s.points("vllm:num_requests_waiting").values()
        assert values[0].ts_ms == 1795943000500 and values[0].value == 7


def test_stdin(cfg, tmp_path):
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-0", "--at", "1795943100", "-",
              stdin=V1.read_bytes())
    assert r.returncode == 0, r.stderr
    with Store(tmp_path / "vigil.db") as s:
        assert s.points("vllm:kv_cache_usage_perc")


def test_bad_file_names_file_and_line_and_writes_nothing(cfg, tmp_path):
    ok = vigil("ingest", "--config", str(cfg), "--target", "chat-0", "--at", "1795943000", str(V1))
    assert ok.returncode == 0
    before = count_rows(tmp_path / "vigil.db")
    bad = tmp_path / "bad.prom"
    lines = V1.read_text().splitlines()
    lines[99] = lines[99].rsplit(" ", 1)[0] + " 12x"
    bad.write_text("\n".join(lines) + "\n")
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-0", "--at", "1795943100",
              str(V1), str(bad))
    assert r.returncode == 2
    assert f"{bad}:100" in r.stderr and "nothing was written" in r.stderr
    assert count_rows(tmp_path / "vigil.db") == before


def test_unknown_target(cfg):
    r = vigil("ingest", "--config", str(cfg), "--target", "nope", str(V1))
    assert r.returncode == 2 and "'nope' is not a target" in r.stderr


def test_targets_json_and_table(cfg, tmp_path):
    vigil("ingest", "--config", str(cfg), "--target", "chat-0", "--at", "1795943100", str(V1))
    r = vigil("targets", "--config", str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    rows = {t["target"]: t for t in data["targets"]}
    assert rows["chat-0"]["up"] is True and rows["chat-0"]["samples"] == 507
    assert rows["chat-1"]["up"] is None  # never scraped
    table = vigil("targets", "--config", str(cfg))
    assert "chat-0" in table.stdout and "never" in table.stdout


def test_targets_without_store(cfg):
    r = vigil("targets", "--config", str(cfg))
    assert r.returncode == 0 and "no store" in r.stdout


def test_mixed_timestamps_rejected(cfg, tmp_path):
    f = tmp_path / "mixed.prom"
    f.write_text("# TYPE a gauge\na 1 1795943000000\n# TYPE b gauge\nb 2\n")
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-0", str(f))
    assert r.returncode == 2 and "mixes samples with and without timestamps" in r.stderr
    assert not (tmp_path / "vigil.db").exists(), "a failed ingest must not create the store"


def test_two_untimestamped_files_rejected(cfg, tmp_path):
    a, b = tmp_path / "a.prom", tmp_path / "b.prom"
    a.write_text("# TYPE a gauge\na 5\n")
    b.write_text("# TYPE a gauge\na 6\n")
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-0", "--at", "1795943000",
              str(a), str(b))
    assert r.returncode == 2 and "same --at" in r.stderr


@pytest.mark.parametrize("at", ["nan", "inf", "1e300", "-5"])
def test_bad_at(cfg, at):
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-0", "--at", at, str(V1))
    assert r.returncode == 2 and "--at must be a Unix time" in r.stderr


def test_old_ingest_does_not_move_health_backwards(cfg, tmp_path):
    vigil("ingest", "--config", str(cfg), "--target", "chat-0", "--at", "1795943100", str(V1))
    vigil("ingest", "--config", str(cfg), "--target", "chat-0", "--at", "1795940000", str(V1))
    with Store(tmp_path / "vigil.db") as s:
        (h,) = [h for h in s.target_health() if h.target == "chat-0"]
        assert h.last_scrape == 1795943100


# --- backfills in every layout promtool accepts ---------------------------------------------
T0 = 1_795_943_000  # Unix seconds of the first scrape in the backfills below
SCRAPES = 4  # scrapes 15 s apart


def _fixture_scrapes() -> tuple[list, list[list[tuple[str, dict, object]]]]:
    """The OpenMetrics fixture's families, and per scrape i its samples with values x (i + 1):
    counts stay integers and cumulative, so every scrape is a valid exposition on its own."""
    from collector.exposition import parse

    families = parse(OM.read_bytes(), source=str(OM))
    scrapes = [
        [[(x.name, x.labels, x.value * (i + 1)) for x in f.samples] for f in families]
        for i in range(SCRAPES)
    ]
    return families, scrapes


def _sample_line(name: str, labels: dict, value: object, ts: int) -> str:
    esc = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
           for k, v in labels.items()}
    inner = ",".join(f'{k}="{v}"' for k, v in esc.items())
    return f"{name}{{{inner}}} {value!r} {ts}" if labels else f"{name} {value!r} {ts}"


def _meta(fam) -> list[str]:
    doc = fam.documentation.replace("\\", "\\\\").replace("\n", "\\n")
    out = [f"# HELP {fam.name} {doc}", f"# TYPE {fam.name} {fam.type}"]
    return out + ([f"# UNIT {fam.name} {fam.unit}"] if fam.unit else [])


def backfill_layouts() -> dict[str, str]:
    """One history of ``SCRAPES`` scrapes of the fixture in three layouts.

    ``scrape``: each family once, each label set over time (what a strict parser reads in one
    pass); ``series``: each series' samples together, histogram bucket series one after
    another (promtool's usual input); ``concatenated``: scrape after scrape, every family
    declared again each time, families in reverse order.
    """
    families, scrapes = _fixture_scrapes()
    times = [T0 + 15 * i for i in range(SCRAPES)]
    scrape: list[str] = []
    series: list[str] = []
    for f, fam in enumerate(families):
        scrape += _meta(fam)
        series += _meta(fam)
        groups: dict[frozenset, list[int]] = {}
        for j, (_, labels, _) in enumerate(scrapes[0][f]):
            group = frozenset((k, v) for k, v in labels.items() if k != "le")
            groups.setdefault(group, []).append(j)
        for members in groups.values():
            for i, ts in enumerate(times):
                scrape += [_sample_line(*scrapes[i][f][j], ts) for j in members]
        for j in range(len(scrapes[0][f])):
            series += [_sample_line(*scrapes[i][f][j], ts) for i, ts in enumerate(times)]
    concatenated: list[str] = []
    for i, ts in enumerate(times):
        for f in reversed(range(len(families))):
            concatenated += _meta(families[f])
            concatenated += [_sample_line(*x, ts) for x in scrapes[i][f]]
    return {name: "\n".join([*lines, "# EOF"]) + "\n"
            for name, lines in (("scrape", scrape), ("series", series),
                                ("concatenated", concatenated))}


def store_dump(db) -> dict:
    """Every stored point: series -> [(Unix ms, value)]."""
    with Store(db) as s:
        return {
            key: [(p.ts_ms, p.value) for p in pts]
            for n in s.metric_names() for key, pts in s.points(n).items()
        }


def ingest_into(db, path, **kwargs):
    from collector.ingest import ingest_files
    from collector.scrape import TargetInfo

    target = TargetInfo("chat-1", "http://127.0.0.1:9/metrics", "chat", "vllm")
    with Store(db) as s:
        return ingest_files(s, target, [str(path)], at=T0 + 3600, **kwargs)


def test_every_layout_gives_the_same_store_point_for_point(tmp_path):
    dumps = {}
    for name, body in backfill_layouts().items():
        f = tmp_path / f"{name}.om"
        f.write_text(body)
        report = ingest_into(tmp_path / f"{name}.db", f)
        assert report.files == [(str(f), "backfill", report.files[0][2])]
        dumps[name] = store_dump(tmp_path / f"{name}.db")
    assert dumps["series"] == dumps["scrape"]
    assert dumps["concatenated"] == dumps["scrape"]
    # The history is the fixture four times over, x1 .. x4: 507 samples per scrape plus `up`.
    assert sum(len(v) for v in dumps["scrape"].values()) == SCRAPES * (507 + 1)
    (hit,) = [v for k, v in dumps["scrape"].items()
              if k.name == "vllm:num_requests_running"]
    assert hit == [((T0 + 15 * i) * 1000, 24.0 * (i + 1)) for i in range(SCRAPES)]


def test_promtool_accepts_the_layouts(tmp_path):
    promtool = require_binary("promtool", apt="prometheus")
    for name, body in backfill_layouts().items():
        f = tmp_path / f"{name}.om"
        f.write_text(body)
        out = tmp_path / f"blocks-{name}"
        r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(f),
                            str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr


BUCKETS_PER_SERIES = (
    "# TYPE vllm:e2e_request_latency_seconds histogram\n"
    'vllm:e2e_request_latency_seconds_bucket{le="1.0"} 0 100\n'
    'vllm:e2e_request_latency_seconds_bucket{le="1.0"} 3 115\n'
    'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 0 100\n'
    'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 5 115\n'
    "vllm:e2e_request_latency_seconds_count 0 100\n"
    "vllm:e2e_request_latency_seconds_count 5 115\n"
    "vllm:e2e_request_latency_seconds_sum 0 100\n"
    "vllm:e2e_request_latency_seconds_sum 7.5 115\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running 2 115\n"
    "vllm:num_requests_running 1 100\n"
    "# EOF\n"
)


def test_bucket_series_one_after_another(tmp_path):
    f = tmp_path / "b.om"
    f.write_text(BUCKETS_PER_SERIES)
    report = ingest_into(tmp_path / "v.db", f)
    assert report.up_added == 2
    dump = {(k.name, dict(k.labels).get("le")): v for k, v in store_dump(tmp_path / "v.db").items()}
    assert dump == {
        ("vllm:e2e_request_latency_seconds_bucket", "1.0"): [(100_000, 0.0), (115_000, 3.0)],
        ("vllm:e2e_request_latency_seconds_bucket", "+Inf"): [(100_000, 0.0), (115_000, 5.0)],
        ("vllm:e2e_request_latency_seconds_count", None): [(100_000, 0.0), (115_000, 5.0)],
        ("vllm:e2e_request_latency_seconds_sum", None): [(100_000, 0.0), (115_000, 7.5)],
        ("vllm:num_requests_running", None): [(100_000, 1.0), (115_000, 2.0)],
        ("up", None): [(100_000, 1.0), (115_000, 1.0)],
    }


def test_up_labelled_as_a_scrape_would(cfg, tmp_path):
    f = tmp_path / "b.om"
    f.write_text(BUCKETS_PER_SERIES)
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-1", str(f))
    assert r.returncode == 0, r.stderr
    assert "up = 1 at 2 backfill timestamps" in r.stdout
    with Store(tmp_path / "vigil.db") as s:
        (key,) = s.points("up")
        assert dict(key.labels) == {"instance": "chat-1", "pool": "chat", "kind": "vllm"}


def test_no_up(cfg, tmp_path):
    f = tmp_path / "b.om"
    f.write_text(BUCKETS_PER_SERIES)
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-1", "--no-up", str(f))
    assert r.returncode == 0, r.stderr
    assert "up = 1" not in r.stdout
    with Store(tmp_path / "vigil.db") as s:
        assert s.points("up") == {}
        assert s.points("vllm:num_requests_running")


def test_backfill_with_its_own_up_keeps_it(tmp_path):
    f = tmp_path / "b.om"
    f.write_text("# TYPE up gauge\nup 0 100\nup 1 115\n"
                 "# TYPE g gauge\ng 1 100\ng 2 115\ng 3 130\n# EOF\n")
    report = ingest_into(tmp_path / "v.db", f)
    assert report.up_added == 0
    (up,) = [v for k, v in store_dump(tmp_path / "v.db").items() if k.name == "up"]
    assert up == [(100_000, 0.0), (115_000, 1.0)]


@pytest.mark.parametrize(("body", "line", "reason"), [
    # The same series twice at one timestamp (promtool keeps the first, silently).
    ("# TYPE g gauge\ng 1 100\ng 2 115\ng 3 100\n# EOF\n", 4,
     "duplicate series g (first on line 2)"),
    # Buckets that do not add up at one timestamp, wherever their lines are.
    ('# TYPE h histogram\nh_bucket{le="1"} 4 100\nh_bucket{le="1"} 3 115\n'
     'h_bucket{le="+Inf"} 4 100\nh_bucket{le="+Inf"} 2 115\nh_count 4 100\n'
     "h_count 2 115\nh_sum 1 100\nh_sum 1 115\n# EOF\n", 5,
     "bucket counts are not cumulative"),
    ('# TYPE h histogram\nh_bucket{le="1"} 1 100\nh_bucket{le="+Inf"} 2 100\n'
     "h_count 3 100\nh_sum 1 100\n# EOF\n", 4, "_count 3 differs from the +Inf bucket 2"),
    ("# TYPE g gauge\ng 1 100\n# TYPE h gauge\nh 1 100\ng 1x 115\n# EOF\n", 5,
     "invalid sample value '1x'"),
    ("# TYPE g gauge\ng 1 100\n# TYPE g counter\ng_total 1 115\n# EOF\n", 3,
     "TYPE 'counter' for 'g' differs from 'gauge' on line 1"),
    ("# TYPE g gauge\ng 1 100\n# TYPE h gauge\nh 1 100\ng 2\n# EOF\n", 5,
     "mixes samples with and without timestamps"),
    ("# TYPE g gauge\ng 1 115\n# TYPE h gauge\nh 1 100\ng 2 100\n\n# EOF\n", 6,
     "blank line"),
])
def test_real_faults_write_nothing(cfg, tmp_path, body, line, reason):
    ok = vigil("ingest", "--config", str(cfg), "--target", "chat-0", "--at", "1795943000", str(V1))
    assert ok.returncode == 0
    before = store_dump(tmp_path / "vigil.db")
    f = tmp_path / "bad.om"
    f.write_text(body)
    r = vigil("ingest", "--config", str(cfg), "--target", "chat-1", str(f))
    assert r.returncode == 2
    assert f"{f}:{line}: " in r.stderr and reason in r.stderr, r.stderr
    assert "nothing was written" in r.stderr
    assert store_dump(tmp_path / "vigil.db") == before
