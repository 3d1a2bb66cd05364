"""A vLLM target whose /metrics lacks a family Vigil reads: the collector stores the scrape,
records a warning naming the family, what needs it, the older name the target exposes and the
vLLM version; ``vigil targets`` shows it and ``vigil slo status`` gives it as the reason an
SLI is null. A complete exposition (a real vLLM 0.32 capture) raises nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest
from support.loopback import FIXTURES, LoopbackServer, by_path, slow, text

from collector.exposition import parse
from collector.scrape import TargetInfo, points_from_families, version_url
from collector.service import Collector
from collector.store import Store
from collector.vllm_families import (
    COMPLETE,
    REQUIRED_FAMILIES,
    check_families,
    declared_names,
    health_warnings,
    parse_version,
)
from slo.sources.embedded import EmbeddedSource
from slo.status import evaluate
from vigil.clock import ManualClock
from vigil.config import load_config, parse_config
from vigil.conventions import VLLM_TTFT
from vigil.model import TargetHealth
from vigil_shell.cli import main
from vigil_shell.slo_status_cli import TABLE_WIDTH, format_table

V0 = (FIXTURES / "vllm_v0_metrics_sample.txt").read_text()
V0_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: A real vLLM 0.32.0 /metrics (tests/fixtures/README.md).
REAL = (FIXTURES / "vllm_cpu_0.32_real_metrics.txt").read_text()
REAL_MODEL = "tiny"
INTERVAL_S = 15.0


def without(exposition: str, family: str) -> str:
    """``exposition`` with every line of ``family`` (its samples, HELP and TYPE, and those of
    its ``_created`` twin) cut out, as a release that dropped it would serve it."""
    def name(line: str) -> str:
        return line.split()[2] if line.startswith("# ") else line

    return "".join(line + "\n" for line in exposition.splitlines()
                   if not name(line).startswith(family))


NO_TTFT = without(REAL, VLLM_TTFT)


def names_of(exposition: str) -> frozenset[str]:
    families = parse(exposition.encode(), content_type="text/plain", source="fixture")
    return frozenset(key.name for key, _, _, _ in
                     points_from_families(families, TargetInfo("t", "u", "p", "vllm"), 0))


def version(v: str):
    return text(json.dumps({"version": v}), ctype="application/json")


def config(tmp_path: Path, url: str, model: str, timeout: str = "1s"):
    return parse_config({
        "store": {"path": str(tmp_path / "vigil.db")},
        "collector": {"scrape_interval": f"{INTERVAL_S:g}s", "scrape_timeout": timeout},
        "pools": [{"name": "chat", "model": model}],
        "targets": [{"name": "chat-0", "url": url, "pool": "chat", "kind": "vllm"}],
    })


def scrape(cfg, clock: ManualClock, times: int = 2,
           between=None) -> list[TargetHealth]:
    """Scrape every target ``times`` times, ``INTERVAL_S`` apart; ``between(i)`` runs before
    scrape ``i`` (from 1). The health of each scrape of the first target."""
    async def go() -> list[TargetHealth]:
        out = []
        async with Collector(cfg, clock=clock) as c:
            for i in range(times):
                if i:
                    clock.advance(INTERVAL_S)
                    if between is not None:
                        between(i)
                out.append((await c.scrape_all())[0])
        return out

    return asyncio.run(go())


def version_requests(server: LoopbackServer) -> int:
    return sum(1 for r in server.recorded() if r.path == "/version")


# --- the check itself --------------------------------------------------------------------------
def test_a_complete_modern_exposition_lacks_nothing():
    assert check_families(names_of(REAL)) == COMPLETE
    # The synthetic 0.33 sample is the simulator's reference: it must be complete as well.
    assert check_families(names_of((FIXTURES / "vllm_v1_metrics_sample.txt").read_text())) \
        == COMPLETE


def test_every_required_family_is_in_the_real_capture():
    names = names_of(REAL)
    assert [f.name for f in REQUIRED_FAMILIES if not f.present(names)] == []


def test_the_v0_exposition_names_each_renamed_family():
    check = check_families(names_of(V0))
    assert check.v0
    lines = check.warnings(parse_version(b'{"version": "0.6.6.post1"}'))
    kv = next(w for w in lines if w.startswith("vllm:kv_cache_usage_perc missing"))
    assert ("this target exposes vllm:gpu_cache_usage_perc, its name before vLLM 0.9; "
            "vLLM 0.6.6.post1 (GET /version), V0 engine") in kv
    itl = next(w for w in lines if w.startswith("vllm:inter_token_latency_seconds missing"))
    assert "vllm:time_per_output_token_seconds, its name before vLLM 0.10" in itl
    assert any(w.startswith("http_requests_total missing (needed for the availability SLO")
               for w in lines)
    # The families the V0 engine had under today's names are not reported.
    assert not any(w.startswith(("vllm:time_to_first_token_seconds ", "vllm:request_success"))
                   for w in lines)


def test_one_cut_family_is_the_only_one_reported():
    check = check_families(names_of(NO_TTFT))
    assert [f.name for f in check.missing] == [VLLM_TTFT] and not check.v0
    assert check.warnings() == [
        "vllm:time_to_first_token_seconds missing (needed for the TTFT SLO, TTFT quantiles and "
        "scaling on TTFT p95)"]


def test_a_family_declared_before_its_first_sample_is_not_missing():
    """vLLM (and the simulator) declare ``http_requests_total`` before the first request gives
    it a child: the target exposes it, with no sample yet."""
    lines = REAL.splitlines()
    kept = [ln for ln in lines if not ln.startswith("http_requests_total{")]
    assert len(kept) < len(lines)
    body = "\n".join(kept) + "\n"
    names = names_of(body)
    assert "http_requests_total" not in names
    assert check_families(names) != COMPLETE
    declared = declared_names(parse(body.encode(), content_type="text/plain", source="fixture"))
    assert check_families(names | declared) == COMPLETE


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"version": "0.32.0"}', ("0.32.0", "")),
    (b'{"version": "0.10.1+cu126"}', ("0.10.1+cu126", "")),
    (b"<html>not found</html>", ("", "not JSON")),
    (b'{"version": "0.1\\nforged line"}', ("", "no version in the answer")),
    (b'["0.32.0"]', ("", "no version in the answer")),
])
def test_parse_version(body, expected):
    assert tuple(parse_version(body)) == expected


@pytest.mark.parametrize(("metrics", "expected"), [
    ("http://10.0.0.1:8000/metrics", "http://10.0.0.1:8000/version"),
    ("http://gw.local/replica-0/metrics?x=1", "http://gw.local/replica-0/version"),
    ("http://10.0.0.1:8000/stats", "http://10.0.0.1:8000/version"),
])
def test_version_is_asked_beside_metrics(metrics, expected):
    assert version_url(metrics) == expected


# --- the collector against a loopback vLLM -----------------------------------------------------
def test_v0_target_warns_with_the_renamed_family_and_version_and_stores_everything(
        tmp_path, caplog):
    clock = ManualClock()
    with LoopbackServer(by_path({"/metrics": text(V0), "/version": version("0.6.6.post1")})) \
            as server:
        cfg = config(tmp_path, f"{server.url}/metrics", V0_MODEL)
        with caplog.at_level(logging.INFO, logger="vigil.collector"):
            first, second = scrape(cfg, clock)
        asked = version_requests(server)
    assert first.up and second.up
    assert asked == 1  # once per target, not per scrape
    warnings = health_warnings(second)
    kv = next(w for w in warnings if w.startswith("vllm:kv_cache_usage_perc missing"))
    assert kv == (
        "vllm:kv_cache_usage_perc missing (needed for scaling on KV-cache usage and the "
        "KvCacheUsageHigh alert); this target exposes vllm:gpu_cache_usage_perc, its name before "
        "vLLM 0.9; vLLM 0.6.6.post1 (GET /version), V0 engine (the default engine before "
        "vLLM 0.8)")
    assert health_warnings(first) == warnings  # the first scrape's record got the version too
    logged = [r.getMessage() for r in caplog.records if "kv_cache_usage_perc missing" in
              r.getMessage()]
    assert logged == [f"target chat-0 ({server.url}/metrics): {kv}"]  # once, not per scrape
    with Store(cfg.store_path(), readonly=True) as store:
        # Nothing lost: the old names are stored as scraped.
        pts = store.points("vllm:gpu_cache_usage_perc", {"instance": "chat-0"})
        assert [p.value for p in next(iter(pts.values()))] == [0.2631, 0.2631]
        assert [h.error for h in store.target_health()] == [second.error]


def test_slo_status_says_which_family_is_missing_and_from_which_version(tmp_path):
    clock = ManualClock()
    with LoopbackServer(by_path({"/metrics": text(NO_TTFT), "/version": version("0.32.0")})) \
            as server:
        cfg = config(tmp_path, f"{server.url}/metrics", REAL_MODEL)
        scrape(cfg, clock, times=3)
    with Store(cfg.store_path(), readonly=True) as store:
        result = evaluate(cfg, EmbeddedSource(store), clock())
    slos = {s["name"]: s for s in result["slos"]}
    assert slos["chat-ttft"]["sli"] is None
    assert slos["chat-ttft"]["reason"] == (
        "no data in the window: target chat-0: vllm:time_to_first_token_seconds missing "
        "(needed for the TTFT SLO, TTFT quantiles and scaling on TTFT p95); vLLM 0.32.0 "
        "(GET /version)")
    # The e2e histogram is there: its SLI is null for a plain reason (no traffic meanwhile).
    assert slos["chat-e2e"]["reason"] == "no requests in the window"
    table = format_table(result)
    assert max(len(line) for line in table.splitlines()) <= TABLE_WIDTH
    assert "  chat-ttft: no data in the window: target chat-0: vllm:time_to_first_token_seconds" \
        in table
    assert "vLLM 0.32.0" in table


def test_slo_status_says_when_some_replicas_could_not_be_counted(tmp_path):
    clock = ManualClock()
    with LoopbackServer(by_path({"/metrics": text(NO_TTFT), "/version": version("0.32.0")})) \
            as dropped, LoopbackServer(by_path({"/metrics": text(REAL)})) as complete:
        cfg = parse_config({
            "store": {"path": str(tmp_path / "vigil.db")},
            "pools": [{"name": "chat", "model": REAL_MODEL}],
            "targets": [
                {"name": "chat-0", "url": f"{dropped.url}/metrics", "pool": "chat"},
                {"name": "chat-1", "url": f"{complete.url}/metrics", "pool": "chat"},
            ],
        })
        scrape(cfg, clock)
    with Store(cfg.store_path(), readonly=True) as store:
        result = evaluate(cfg, EmbeddedSource(store), clock())
    slos = {s["name"]: s for s in result["slos"]}
    # chat-1's histogram is there but saw no request meanwhile; chat-0 could not be counted.
    assert slos["chat-ttft"]["reason"].startswith(
        "no requests in the window: target chat-0: vllm:time_to_first_token_seconds missing")
    assert slos["chat-e2e"]["reason"] == "no requests in the window"


def test_slo_status_names_the_family_a_v0_target_lacks(tmp_path):
    clock = ManualClock()
    with LoopbackServer(by_path({"/metrics": text(V0), "/version": version("0.6.6.post1")})) \
            as server:
        cfg = config(tmp_path, f"{server.url}/metrics", V0_MODEL)
        scrape(cfg, clock)
    with Store(cfg.store_path(), readonly=True) as store:
        result = evaluate(cfg, EmbeddedSource(store), clock())
    reason = next(s for s in result["slos"] if s["name"] == "chat-availability")["reason"]
    assert reason.startswith("no request data: ")
    assert ": target chat-0: http_requests_total missing (needed for the availability SLO" in reason
    assert reason.endswith("vLLM 0.6.6.post1 (GET /version), V0 engine (the default engine "
                           "before vLLM 0.8)")


def test_the_real_032_capture_raises_no_warning_and_never_asks_the_version(tmp_path, caplog):
    clock = ManualClock()
    with LoopbackServer(by_path({"/metrics": text(REAL), "/version": version("0.32.0")})) \
            as server:
        cfg = config(tmp_path, f"{server.url}/metrics", REAL_MODEL)
        with caplog.at_level(logging.INFO, logger="vigil.collector"):
            healths = scrape(cfg, clock)
        asked = version_requests(server)
    assert [(h.up, h.error) for h in healths] == [(True, ""), (True, "")]
    assert asked == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_without_a_version_endpoint_the_warning_says_so_and_asks_once(tmp_path):
    clock = ManualClock()
    with LoopbackServer(by_path({"/metrics": text(NO_TTFT)})) as server:
        cfg = config(tmp_path, f"{server.url}/metrics", REAL_MODEL)
        healths = scrape(cfg, clock, times=3)
        asked = version_requests(server)
    assert asked == 1
    assert health_warnings(healths[-1]) == [
        "vllm:time_to_first_token_seconds missing (needed for the TTFT SLO, TTFT quantiles and "
        "scaling on TTFT p95); vLLM version unknown (GET /version: HTTP 404)"]


def test_a_silent_version_endpoint_costs_one_short_wait(tmp_path):
    clock = ManualClock()
    routes = {"/metrics": text(NO_TTFT), "/version": slow(5.0, version("0.32.0"))}
    with LoopbackServer(by_path(routes)) as server:
        cfg = config(tmp_path, f"{server.url}/metrics", REAL_MODEL, timeout="500ms")
        t0 = time.monotonic()
        healths = scrape(cfg, clock, times=2)
        took = time.monotonic() - t0
    assert healths[-1].up
    assert health_warnings(healths[-1])[0].endswith(
        "vLLM version unknown (GET /version: no answer within 0.5s)")
    assert took < 4.0  # one wait of 0.5 s, not the 5 s the endpoint takes nor one per scrape


def test_an_upgrade_clears_the_warning_and_a_new_release_is_asked_again(tmp_path, caplog):
    clock = ManualClock()
    server = LoopbackServer(by_path({"/metrics": text(V0), "/version": version("0.6.6.post1")}))

    def upgrade(i: int) -> None:
        if i == 1:  # a release that dropped TTFT
            server.respond = by_path({"/metrics": text(NO_TTFT), "/version": version("0.32.0")})
        if i == 2:  # the fixed release
            server.respond = by_path({"/metrics": text(REAL), "/version": version("0.32.1")})

    with server:
        cfg = config(tmp_path, f"{server.url}/metrics", REAL_MODEL)
        with caplog.at_level(logging.INFO, logger="vigil.collector"):
            v0, dropped, fixed = scrape(cfg, clock, times=3, between=upgrade)
        asked = version_requests(server)
    assert any("0.6.6.post1" in w for w in health_warnings(v0))
    assert health_warnings(dropped) == [
        "vllm:time_to_first_token_seconds missing (needed for the TTFT SLO, TTFT quantiles and "
        "scaling on TTFT p95); vLLM 0.32.0 (GET /version)"]
    assert fixed.error == "" and asked == 2
    messages = [r.getMessage() for r in caplog.records]
    assert f"target chat-0 ({server.url}/metrics): vllm:kv_cache_usage_perc is exposed again" \
        in messages


# --- vigil targets -------------------------------------------------------------------------------
def test_vigil_targets_shows_the_warnings(tmp_path, capsys):
    clock = ManualClock(time.time() - INTERVAL_S)
    with LoopbackServer(by_path({"/metrics": text(V0), "/version": version("0.6.6.post1")})) \
            as server:
        path = tmp_path / "vigil.toml"
        path.write_text(f"""
[store]
path = "vigil.db"

[[pools]]
name = "chat"
model = "{V0_MODEL}"

[[targets]]
name = "chat-0"
url = "{server.url}/metrics"
pool = "chat"
""")
        scrape(load_config(str(path)), clock, times=1)
    assert main(["targets", "--config", str(path), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["targets"][0]
    assert row["up"] is True and row["last_error"] == ""
    assert any(w.startswith("vllm:kv_cache_usage_perc missing") and "0.6.6.post1" in w
               for w in row["warnings"])
    assert main(["targets", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\n  warning: vllm:kv_cache_usage_perc missing (needed for scaling" in out
