"""``vigil loadgen``: arrivals, the request mix, the report's definitions, and real runs
against the simulator (and a recording loopback server for API keys)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import random
import statistics
from pathlib import Path

import httpx
import numpy as np
import pytest
from support.loopback import LoopbackServer

from serving.loadgen.client import generate
from serving.loadgen.report import RequestResult, Slo, percentiles, summarize
from serving.loadgen.workload import FAQ, Workload, next_interval, plan_request
from serving.sim.testing import running_fleet, sample_values, total
from vigil.config import SloDefaults
from vigil.errors import ArgumentError
from vigil_shell import loadgen_cli as loadgen
from vigil_shell.cli import main

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    loadgen.add_arguments(p)
    return p.parse_args(list(argv))


# --- timing -------------------------------------------------------------------------------------
def test_rate_shapes() -> None:
    ramp = Workload(rate=2, shape="ramp", peak_rate=10, ramp=100)
    assert [ramp.rate_at(t) for t in (0, 50, 100, 500)] == [2, 6, 10, 10]
    day = Workload(rate=1, shape="diurnal", peak_rate=9, period=100)
    assert day.rate_at(0) == pytest.approx(1) and day.rate_at(50) == pytest.approx(9)
    assert day.rate_at(25) == pytest.approx(5) and day.rate_at(100) == pytest.approx(1)
    burst = Workload(rate=1, shape="burst", peak_rate=20, period=60, burst_length=10)
    assert [burst.rate_at(t) for t in (0, 9.9, 10, 59, 60)] == [20, 20, 1, 1, 20]
    assert Workload(rate=3).rate_at(1e6) == 3


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_arrivals_have_the_rate_and_the_burstiness_asked_for(burstiness: float) -> None:
    rng = random.Random(7)
    gaps = [next_interval(rng, 5.0, burstiness) for _ in range(40_000)]
    mean = statistics.fmean(gaps)
    cv = statistics.pstdev(gaps) / mean
    assert mean == pytest.approx(0.2, rel=0.03)
    # gamma(k): coefficient of variation 1/sqrt(k); Poisson (k = 1): exponential, cv 1
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_bad_workloads_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="rate must be positive"):
        Workload(rate=0)
    with pytest.raises(ValueError, match="long share must be within 0-1"):
        Workload(long_share=1.5)
    with pytest.raises(ValueError, match="unknown tier"):
        Workload(tiers={"gold": 1.0})


# --- the mix ------------------------------------------------------------------------------------
def test_the_mix_has_faq_paraphrases_outliers_and_requests_without_max_tokens() -> None:
    rng = random.Random(1)
    faq = Workload(faq_share=1.0, long_share=0.0)
    phrasings = {q for group in FAQ for q in group}
    asked = set()
    for _ in range(200):
        r = plan_request(rng, faq, MODEL)
        assert r.kind == "faq" and r.path == "/v1/chat/completions"
        assert r.body["temperature"] == 0.0
        asked.add(r.body["messages"][-1]["content"])
    assert asked <= phrasings and len(asked) > len(FAQ)  # several phrasings of each
    longs = Workload(long_share=1.0, long_tokens=3000)
    r = plan_request(rng, longs, MODEL)
    assert (r.kind, r.body["max_tokens"], r.body["ignore_eos"]) == ("long", 3000, True)
    plain = Workload(faq_share=0.0, long_share=0.0, no_max_tokens_share=1.0)
    assert all("max_tokens" not in plan_request(rng, plain, MODEL).body for _ in range(50))
    streaming = plan_request(rng, Workload(stream_share=1.0), MODEL)
    assert streaming.body["stream_options"] == {"include_usage": True}
    tiers = [plan_request(rng, Workload(tiers={"premium": 1.0}), MODEL).tier for _ in range(20)]
    assert set(tiers) == {"premium"}


def test_scenarios_are_presets_and_explicit_options_win() -> None:
    wl = loadgen.workload_from_args(_args("--url", "http://x", "--model", "m",
                                          "--scenario", "burst", "--rate", "4"))
    assert (wl.shape, wl.burstiness, wl.rate) == ("burst", 0.5, 4.0)
    wl = loadgen.workload_from_args(_args("--url", "http://x", "--model", "m",
                                          "--ramp-to", "9", "--tier-mix", "batch=1"))
    assert (wl.shape, wl.peak_rate, wl.tiers) == ("ramp", 9.0, {"batch": 1.0})


# --- the report ---------------------------------------------------------------------------------
def test_report_definitions_follow_vllm_bench() -> None:
    a = RequestResult("premium", "normal", True, 200, True, ttft=0.1, e2e=1.1,
                      output_tokens=11, itl=[0.1] * 10)
    b = RequestResult("standard", "long", True, 200, True, ttft=0.5, e2e=9.5,
                      output_tokens=91, itl=[0.1] * 90)
    c = RequestResult("standard", "normal", False, 200, True, e2e=2.0, output_tokens=1)
    d = RequestResult("batch", "normal", True, 503, False, error="HTTP 503", e2e=0.01)
    e = RequestResult("batch", "normal", True, cancelled=True)
    assert a.tpot == pytest.approx(0.1) and b.tpot == pytest.approx(0.1)
    assert c.tpot is None  # one token: no time per output token after the first
    report = summarize([a, b, c, d, e], 10.0, Slo(ttft=0.8, e2e=8.0))
    assert (report["sent"], report["completed"], report["failed"], report["cancelled"]) == (
        5, 3, 1, 1)
    assert report["status"] == {"200": 3, "503": 1, "cancelled": 1}
    assert report["ttft_seconds"] == percentiles([0.1, 0.5])
    assert report["e2e_seconds"]["p50"] == pytest.approx(float(np.percentile([1.1, 9.5, 2.0],
                                                                            50)))
    assert report["itl_seconds"]["mean"] == pytest.approx(0.1)
    # b breaks the e2e SLO; c has no TTFT and is judged on e2e alone
    assert report["good_requests"] == 2 and report["goodput"] == pytest.approx(0.2)
    assert report["output_token_throughput"] == pytest.approx((11 + 91 + 1) / 10)
    assert report["by_tier"]["standard"]["completed"] == 2
    assert percentiles([]) == {"mean": None, "p50": None, "p95": None, "p99": None}
    assert len(max(loadgen.format_report(report).splitlines(), key=len)) <= 100


def test_goodput_thresholds_are_the_slo_defaults_unless_given(tmp_path: Path) -> None:
    defaults = SloDefaults()
    assert Slo() == Slo(defaults.ttft_threshold_seconds, defaults.e2e_threshold_seconds)
    base = ("--url", "http://x", "--model", "m")
    assert loadgen._slo(_args(*base)) == Slo()
    cfg = tmp_path / "vigil.toml"
    cfg.write_text("[slo_defaults]\nttft_threshold_seconds = 0.5\ne2e_threshold_seconds = 20.0\n")
    assert loadgen._slo(_args(*base, "--config", str(cfg))) == Slo(0.5, 20.0)
    assert loadgen._slo(_args(*base, "--config", str(cfg), "--goodput-ttft", "2")) == Slo(2.0,
                                                                                        20.0)


# --- real runs ----------------------------------------------------------------------------------
def test_a_run_against_the_simulator_reports_what_the_fleet_served() -> None:
    with running_fleet(1) as fleet:
        base = fleet.base_urls[0]

        def served() -> float:
            text = httpx.get(fleet.metrics_urls[0], trust_env=False).text
            return total(sample_values(text), "vllm:request_success_total")

        before = served()
        out = io.StringIO()
        args = _args("--url", base, "--model", MODEL, "--num-requests", "30", "--rate", "40",
                     "--stream-share", "0.7", "--long-share", "0", "--json", "--quiet",
                     "--seed", "3")
        with contextlib.redirect_stdout(out):
            assert loadgen.run(args) == 0
        report = json.loads(out.getvalue())
        count = served() - before
    assert report["sent"] == 30 and report["completed"] == 30 and count == 30
    for key in ("ttft_seconds", "tpot_seconds", "itl_seconds", "e2e_seconds"):
        p = report[key]
        assert p["p50"] is not None and p["p50"] <= p["p95"] <= p["p99"], key
    assert report["ttft_seconds"]["p99"] <= report["e2e_seconds"]["p99"]
    assert report["total_output_tokens"] > 30
    assert report["goodput"] <= report["request_throughput"]


def test_concurrency_mode_keeps_that_many_in_flight() -> None:
    with running_fleet(1) as fleet:
        wl = Workload(concurrency=3, max_requests=12, long_share=0.0, seed=2)
        peak = 0

        async def main() -> list[RequestResult]:
            nonlocal peak
            stop = asyncio.Event()
            task = asyncio.create_task(generate(fleet.base_urls, MODEL, wl, stop))
            engine = fleet.replicas[0].engine
            while not task.done():
                peak = max(peak, len(engine.running) + len(engine.waiting))
                await asyncio.sleep(0.005)
            return (await task)[0]

        results = asyncio.run(main())
    assert len(results) == 12 and all(r.ok for r in results)
    assert 1 <= peak <= 3


_COMPLETION = json.dumps({"choices": [{"text": "ok", "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()


def test_api_keys_carry_the_tier_and_without_them_the_priority_does(
        http_server: LoopbackServer) -> None:
    http_server.respond = lambda _: (200, "application/json", _COMPLETION)

    def seen() -> list[tuple[str | None, dict]]:
        return [(r.headers.get("authorization"), r.json()) for r in http_server.recorded()]

    wl = Workload(max_requests=20, stream_share=0.0, rate=200, seed=5,
                  tiers={"premium": 0.5, "batch": 0.5})
    asyncio.run(generate([http_server.url], MODEL, wl, asyncio.Event(),
                         keys={"premium": "k-prem", "batch": "k-batch"}))
    assert {auth for auth, _ in seen()} == {"Bearer k-prem", "Bearer k-batch"}
    assert all("priority" not in body for _, body in seen())
    http_server.clear()
    asyncio.run(generate([http_server.url], MODEL, wl, asyncio.Event()))
    assert {body["priority"] for _, body in seen()} == {0, 2}
    assert all(auth is None for auth, _ in seen())


def test_with_keys_only_the_keyed_tiers_are_sent(http_server: LoopbackServer,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # The default mix is premium 0.2 / standard 0.6 / batch 0.2; a gateway answers 401 to a
    # request without a key, so one key means one tier.
    http_server.respond = lambda _: (200, "application/json", _COMPLETION)
    args = _args("--url", http_server.url, "--model", MODEL, "--key", "premium=k-prem",
                 "--num-requests", "15", "--rate", "200", "--stream-share", "0", "--quiet")
    assert loadgen.run(args) == 0
    # Every request that reached the server carried the key, and the report counts all 15 as
    # premium (one may find the loopback server's backlog full on a loaded machine).
    auths = [r.headers.get("authorization") for r in http_server.recorded()]
    assert auths and set(auths) == {"Bearer k-prem"}
    tiers = [line.split() for line in capsys.readouterr().out.splitlines()
             if line.split()[:1] in (["premium"], ["standard"], ["batch"])]
    assert [row[:2] for row in tiers] == [["premium", "15"]], tiers
    # Two keys keep the default mix's shares between them (0.2 : 0.2 here).
    wl = loadgen.keyed_workload(Workload(), {"premium": "a", "batch": "b"}, explicit_mix=False)
    assert wl.tiers == {"premium": 0.2, "batch": 0.2}
    # A mix the user asked for is not changed behind their back: refused, with the fix.
    with pytest.raises(ArgumentError) as refused:
        loadgen.run(_args("--url", http_server.url, "--model", MODEL, "--key", "premium=k",
                          "--tier-mix", "premium=0.5,standard=0.5"))
    assert "--tier-mix sends standard requests but --key gives no key for it" in str(
        refused.value)
    assert "--key standard=KEY" in str(refused.value)
    # Keys for every tier of the mix, or no keys at all: the mix as asked.
    assert loadgen.keyed_workload(Workload(), {}, explicit_mix=False) == Workload()
    both = Workload(tiers={"premium": 0.5, "batch": 0.5})
    assert loadgen.keyed_workload(both, {"premium": "a", "batch": "b"},
                                  explicit_mix=True) == both


def test_bad_options_exit_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, said in ((["--url", "ftp://x", "--model", "m"], "--url must be http(s)://"),
                       (["--url", "http://x", "--model", "m", "--key", "gold=abc"],
                        "--key: unknown tier 'gold'"),
                       (["--url", "http://x", "--model", "m", "--rate", "-1"],
                        "rate must be positive")):
        assert main(["loadgen", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("vigil loadgen: error: ") and said in err, err
