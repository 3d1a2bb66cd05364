"""``vigil capacity`` against a simulated replica on 127.0.0.1.

The replica runs in a child process (its own interpreter, so the client's and the server's
timing do not share one GIL) with a calibration whose SLO-limited capacity is reached at a
modest concurrency: each step costs 25 ms plus 3.6 ms per running sequence, a request makes 6
tokens, so e2e grows from ~0.17 s alone to the 0.5 s threshold near 16 in flight, while
throughput still grows with concurrency. The search's answer is compared with a sweep of fixed
concurrencies that does not use the search.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
from support.loopback import free_port

from serving.loadgen.probe import run_probe
from slo.planning.profile_store import ProfileStore
from slo.planning.replica.profiles import Profile
from vigil.capacity import CapacityProfile, Probe, SloTarget
from vigil.config import CapacityConfig, load_config
from vigil_shell.capacity_cli import slo_targets
from vigil_shell.cli import main

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPT_TOKENS, OUTPUT_TOKENS = 64, 6

#: Fast enough that a search takes seconds, slow enough that the SLO limits it at ~16 in flight.
FAST = Profile(name="capacity-test", num_gpu_blocks=20_000, max_num_seqs=256,
               max_num_batched_tokens=8192, max_model_len=16_384,
               prefill_tokens_per_s=50_000.0, decode_base_s=0.025, decode_per_seq_s=0.0036,
               decode_per_ctx_token_s=0.0)
#: One request alone takes ~0.6 s: above the 0.5 s e2e threshold at any load.
SLOW = Profile(name="capacity-slow", num_gpu_blocks=20_000, max_num_seqs=256,
               max_num_batched_tokens=8192, max_model_len=16_384,
               prefill_tokens_per_s=50_000.0, decode_base_s=0.1, decode_per_seq_s=0.0036,
               decode_per_ctx_token_s=0.0)

CONFIG = """
[[pools]]
name = "chat"
model = "meta-llama/Llama-3.1-8B-Instruct"
gpu = "L4"

[[slos]]
name = "chat-e2e"
pool = "chat"
indicator = "e2e"
objective = 0.9
threshold_seconds = 0.5

[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
objective = 0.9
threshold_seconds = 1.0

[[slos]]
name = "chat-errors"
pool = "chat"
indicator = "error_rate"
objective = 0.99

[capacity]
profiles_path = "profiles.json"
probe_duration = "1s"
min_probe_requests = {min_requests}
max_probe_requests = 300
max_concurrency = 64
"""

_CHILD = """
import json, sys
from slo.planning.replica.profiles import Profile
from serving.sim.testing import running_fleet
with running_fleet(1, profile=Profile(**json.loads(sys.argv[1])), port=int(sys.argv[2])):
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes the pipe
"""


@contextlib.contextmanager
def replica(profile: Profile) -> Iterator[str]:
    """A simulated replica with ``profile`` in a child process; yields its API base URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(asdict(profile)),
                             str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=REPO, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _config(tmp: Path, min_requests: int = 20) -> Path:
    path = tmp / "vigil.toml"
    path.write_text(CONFIG.format(min_requests=min_requests))
    return path


def _sweep(url: str, slos: list[SloTarget], capacity: CapacityConfig) -> list[Probe]:
    """Fixed concurrencies, without the search: up from 8 in steps of 2 (down from 8 one by
    one if 8 fails) until one fails, then the one between the last pass and that failure.
    The true SLO-limited goodput is the best passing probe's."""

    async def go() -> list[Probe]:
        limits = httpx.Limits(max_connections=80, max_keepalive_connections=80)
        async with httpx.AsyncClient(limits=limits, timeout=60, trust_env=False) as client:
            async def at(c: int) -> Probe:
                return await run_probe(url, MODEL, c, prompt_tokens=PROMPT_TOKENS,
                                       output_tokens=OUTPUT_TOKENS, api_key=None, slos=slos,
                                       capacity=capacity, client=client, seed=7)
            c = 8
            probes = [await at(c)]
            if not probes[0].passed:
                while c > 1 and not probes[-1].passed:
                    c -= 1
                    probes.append(await at(c))
                return probes
            while probes[-1].passed and c < 64:
                c += 2
                probes.append(await at(c))
            if not probes[-1].passed:
                probes.append(await at(c - 1))
            return probes

    return asyncio.run(go())


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One ``vigil capacity --save --json`` run and one independent sweep, on one replica."""
    tmp = tmp_path_factory.mktemp("capacity")
    # 60 requests a probe at least: request lengths are drawn within ±50 % of 6 output
    # tokens, so a level's goodput moves with its sample's mean length (about ±5 % on 60
    # requests, ±8 % on 20), and the search and the sweep draw different samples.
    cfg = _config(tmp, min_requests=60)
    with replica(FAST) as url:
        out = _run_cli(["capacity", "--url", url, "--config", str(cfg), "--pool", "chat",
                        "--prompt-tokens", str(PROMPT_TOKENS), "--output-tokens",
                        str(OUTPUT_TOKENS), "--json", "--save"])
        config = load_config(cfg)
        sweep = _sweep(url, slo_targets(config, config.pool("chat"), MODEL), config.capacity)
        yield {"cfg": cfg, "tmp": tmp, "out": out, "sweep": sweep}


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``vigil capacity ...`` in this process, as the command line runs it (an option error
    becomes the exit code 2 and a line on stderr there): exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_capacity_is_within_10_percent_of_an_independent_sweep(measured: dict) -> None:
    code, out, err = measured["out"]
    assert code == 0, err
    result = json.loads(out)
    passing = [p for p in measured["sweep"] if p.passed]
    assert passing, [(p.concurrency, p.attainment) for p in measured["sweep"]]
    true_goodput = max(p.goodput_rps for p in passing)
    table = [(p.concurrency, round(p.goodput_rps, 1), p.passed) for p in measured["sweep"]]
    assert result["max_goodput_rps"] == pytest.approx(true_goodput, rel=0.10), (err, table)
    # the SLO, not the simulator's batch limit, is what stops it: a modest concurrency
    assert 4 <= result["max_concurrency"] <= 40
    assert result["basis"] == "measured" and result["confidence"] == 0.95
    assert result["identity"]["gpu"] == "L4" and result["identity"]["output_tokens"] == 6
    assert {s["name"] for s in result["slos"]} == {"chat-e2e", "chat-ttft"}
    probes = result["probes"]
    # The ramp estimated the knee and the search started there, not at 1, 2, 4, ...
    search = result["search"]
    assert search["ramp"]["streams"] > search["ramp"]["start"] >= 1
    assert probes[0]["concurrency"] == search["ramp"]["start"] == search["levels"][0]
    assert any("opening ramp" in n for n in result["notes"])
    best = next(p for p in probes if p["concurrency"] == result["max_concurrency"])
    assert best["passed"] and best["goodput_rps"] == result["max_goodput_rps"]
    assert best["attainment_low"] <= best["attainment"] <= best["attainment_high"]
    assert set(best["e2e_s"]) == {"p50", "p95", "p99"} and best["ttft_s"]["p95"] > 0
    assert best["itl_s"]["p50"] > 0 and best["output_tokens_per_s"] > 0
    assert best["requests"] >= 20 and best["errors"] == 0
    # the first failure above it is within the precision, or the next integer
    failed = min((p for p in probes if not p["passed"]
                  and p["concurrency"] > result["max_concurrency"]),
                 key=lambda p: p["concurrency"])
    gap = failed["concurrency"] - result["max_concurrency"]
    assert gap == 1 or gap / result["max_concurrency"] <= 0.10
    assert "conc" in err and "pass" in err  # the probe table goes to stderr with --json


def test_save_then_list_round_trip(measured: dict) -> None:
    code, out, _ = measured["out"]
    result = json.loads(out)
    path = measured["tmp"] / "profiles.json"
    assert result["saved_to"] == str(path)
    saved = ProfileStore(path).load()
    assert len(saved) == 1 and saved[0].key == result["key"]
    result.pop("saved_to"), result.pop("search_seconds"), result.pop("key")
    result.pop("search")
    assert saved[0] == CapacityProfile.from_dict(result)
    code, listed, _ = _run_cli(["capacity", "--config", str(measured["cfg"]), "--list",
                                "--json"])
    assert code == 0
    data = json.loads(listed)
    assert [p["key"] for p in data["profiles"]] == [saved[0].key]
    assert data["profiles"][0]["max_goodput_rps"] == saved[0].max_goodput_rps
    code, table, _ = _run_cli(["capacity", "--config", str(measured["cfg"]), "--list"])
    assert code == 0
    row = table.splitlines()[2]
    assert row.startswith(saved[0].key) and "measured" in row and "L4" in row
    assert "chat" in row and f"{saved[0].max_goodput_rps:.2f}" in row and "s ago" in row


def test_a_probe_spends_few_requests_far_from_the_knee_and_runs_on_near_it() -> None:
    # One request alone takes ~0.17 s on FAST: far within 5 s, but past half of 0.3 s.
    capacity = CapacityConfig(probe_duration=0.5, min_probe_requests=40,
                              max_probe_requests=300, clear_margin=0.5,
                              clear_probe_requests=20)
    far = [SloTarget("e2e", "e2e", 5.0, 0.9)]
    near = [SloTarget("e2e", "e2e", 0.3, 0.9)]

    async def go(url: str) -> tuple[Probe, Probe]:
        async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
            probes = [await run_probe(url, MODEL, 1, prompt_tokens=PROMPT_TOKENS,
                                      output_tokens=OUTPUT_TOKENS, api_key=None, slos=slos,
                                      capacity=capacity, client=client)
                      for slos in (far, near)]
        return probes[0], probes[1]

    with replica(FAST) as url:
        clear, close = asyncio.run(go(url))
    assert clear.passed and clear.requests == 20 and clear.errors == 0
    assert clear.e2e_s["p99"] is not None and clear.e2e_s["p99"] < 2.5
    assert close.requests >= 40  # the interval decides it, on min_probe_requests at least


def test_a_replica_too_slow_for_the_slo_exits_1_and_says_so(tmp_path: Path) -> None:
    cfg = _config(tmp_path, min_requests=10)
    with replica(SLOW) as url:
        code, out, err = _run_cli(["capacity", "--url", url, "--config", str(cfg), "--pool",
                                   "chat", "--prompt-tokens", "64", "--output-tokens", "6",
                                   "--save"])
    assert code == 1, err
    assert "even concurrency 1" in err and "chat-e2e" in err and "nothing saved" in err
    assert "0.0% within 0.5 s" in err
    assert out.count("FAIL") == 1  # one probe: concurrency 1
    assert not (tmp_path / "profiles.json").exists()


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path)

    def vigil(*argv: str) -> tuple[int, str]:
        code = main(["capacity", *argv])
        return code, capsys.readouterr().err

    code, err = vigil("--url", "http://127.0.0.1:1", "--model", MODEL, "--pool", "chat")
    assert code == 2 and "--pool needs --config" in err
    code, err = vigil("--url", "http://127.0.0.1:1", "--config", str(cfg), "--pool", "nope")
    assert code == 2 and "'nope' is not a pool" in err and "chat" in err
    code, err = vigil("--config", str(cfg))
    assert code == 2 and "--url and --model are required" in err
    code, err = vigil("--url", f"http://127.0.0.1:{free_port()}", "--model", MODEL)
    assert code == 2 and "cannot reach" in err
    code, err = vigil("--url", "ftp://x", "--model", MODEL)
    assert code == 2 and "--url" in err
    code, err = vigil("--url", "http://127.0.0.1:1", "--model", MODEL, "--save")
    assert code == 2 and "--gpu" in err
    (tmp_path / "bad.toml").write_text("[capacity]\nprecision = 2\n")
    code, err = vigil("--url", "http://127.0.0.1:1", "--model", MODEL, "--config",
                      str(tmp_path / "bad.toml"))
    assert code == 2 and "precision" in err


def test_an_unknown_model_exits_2_before_any_probe(tmp_path: Path) -> None:
    with replica(FAST) as url:
        code, out, err = _run_cli(["capacity", "--url", url, "--model", "other/model"])
    assert code == 2 and "does not serve model 'other/model'" in err and MODEL in err
    assert "conc" not in out


def test_slos_are_the_pools_latency_slos_or_the_defaults(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path))
    got = slo_targets(config, config.pool("chat"), MODEL)
    assert got == [SloTarget("chat-e2e", "e2e", 0.5, 0.9),
                   SloTarget("chat-ttft", "ttft", 1.0, 0.9)]
    assert slo_targets(config, None, MODEL) == got  # the model's pool
    d = config.slo_defaults
    assert slo_targets(config, None, "other/model") == [
        SloTarget("ttft", "ttft", d.ttft_threshold_seconds, d.ttft_objective),
        SloTarget("e2e", "e2e", d.e2e_threshold_seconds, d.e2e_objective)]
