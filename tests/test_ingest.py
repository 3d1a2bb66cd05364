"""`vigil ingest` and `vigil targets` through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import FIXTURES

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
        assert s.points("up") == {}  # backfills write only the file's samples


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
