"""``vigil plan`` end to end: a config file, a store with three days of history, saved
profiles and gateway records on disk; the JSON output parsed and checked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support.history import AT, MODEL, base_rate, write_history

from collector.store import Store
from serving.gateway.telemetry.record_writer import RecordWriter
from slo.planning.profile_store import ProfileStore
from vigil.capacity import CapacityProfile, ProfileIdentity, SloTarget
from vigil.storage.gateway_records import GatewayRecord
from vigil_shell.cli import main

SLOS = (SloTarget("chat-ttft", "ttft", 0.8, 0.95), SloTarget("chat-e2e", "e2e", 8.0, 0.95))
LOOSE = (SloTarget("ttft", "ttft", 3.0, 0.95), SloTarget("e2e", "e2e", 8.0, 0.95))
CONFIG = f"""
[[pools]]
name = "chat"
model = "{MODEL}"
gpu = "H100"
min_replicas = 1
max_replicas = 8

[prices]
H100 = 6.0
L40S = 2.0

[capacity]
plan_step = "1h"
"""


def profile(gpu: str, mu: float, slos: tuple[SloTarget, ...] = SLOS) -> CapacityProfile:
    return CapacityProfile(identity=ProfileIdentity(MODEL, gpu, output_tokens=200),
                           basis="measured", max_concurrency=16, max_goodput_rps=mu,
                           max_output_tokens_per_s=mu * 200, slos=slos, source="test",
                           pool="chat", created_at=AT - 3600)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "vigil.toml"
    path.write_text(CONFIG)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["plan", *argv])
    return code, capsys.readouterr().out


def with_history(config: Path) -> None:
    with Store(config.parent / "vigil.db") as store:
        write_history(store, 3, lambda day, hour: base_rate(hour) * (1 + 0.1 * day))


def test_forecast_plan_picks_the_cheaper_configuration_and_shows_the_saving(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with_history(config)
    saved = ProfileStore(config.parent / "vigil-capacity.json")
    saved.save(profile("H100", 10.0))
    saved.save(profile("L40S", 4.0))
    code, out = run(capsys, "--config", str(config), "--forecast", "--days", "3",
                    "--at", str(AT), "--no-estimates", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["traffic"]["basis"] == "observed" and report["traffic"]["days"] == 3
    forecast = [base_rate(h) * 1.3 for h in range(24)]
    assert report["traffic"]["peak_rps"] == pytest.approx(max(forecast), rel=1e-6)
    first, second = report["candidates"]
    assert first["identity"]["gpu"] == "L40S" and first["meets_slo"]
    assert second["identity"]["gpu"] == "H100" and second["meets_slo"]
    # Every figure says how it is known: measured profiles, observed traffic.
    assert first["basis"] == "observed" and first["profile_basis"] == "measured"
    replicas = [max(1, math.ceil(r / 4.0 - 1e-9)) for r in forecast]
    assert [n for _, n in first["replicas_curve"]] == replicas
    assert first["gpu_hours_per_day"] == pytest.approx(sum(replicas))
    assert first["cost_per_month_usd"] == pytest.approx(sum(replicas) * 2.0 * 730 / 24)
    assert report["today"]["identity"]["gpu"] == "H100"
    assert report["best"] == first["configuration"]
    assert report["saving_per_month_usd"] == pytest.approx(
        second["cost_per_month_usd"] - first["cost_per_month_usd"])
    assert report["saving_per_month_usd"] > 0
    # The history has no latency histograms: no observed capacity, and it says so.
    assert any("no observed capacity" in n for n in report["notes"])

    code, table = run(capsys, "--config", str(config), "--days", "3", "--at", str(AT),
                      "--no-estimates")
    assert code == 0
    lines = table.splitlines()
    assert "L40S" in lines[3] and "meets" in lines[3]
    assert lines[4].startswith("2*") and "H100" in lines[4]
    assert "saves $" in table


def test_no_candidate_meeting_the_slo_exits_1_and_says_why(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ProfileStore(config.parent / "vigil-capacity.json").save(profile("L40S", 4.0, LOOSE))
    code, out = run(capsys, "--config", str(config), "--rate", "10", "--no-estimates",
                    "--json")
    assert code == 1
    report = json.loads(out)
    assert report["best"] is None
    assert "does not count" in report["verdict"] and "chat-ttft" in report["verdict"]
    code, out = run(capsys, "--config", str(config), "--rate", "10", "--no-estimates")
    assert code == 1 and "no candidate meets every SLO" in out


def test_no_profile_at_all_exits_1(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--config", str(config), "--rate", "10", "--no-estimates",
                    "--json")
    assert code == 1
    assert "no capacity profile of" in json.loads(out)["verdict"]


def test_the_simulator_estimates_the_pools_gpu(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--config", str(config), "--rate", "5", "--json")
    report = json.loads(out)
    estimated = [c for c in report["candidates"] if c["profile_basis"] == "estimated"]
    assert estimated, report["notes"]
    assert all(c["basis"] == "estimated" for c in estimated)
    assert {c["identity"]["gpu"] for c in estimated} <= {"H100", "L40S"}
    assert code == (0 if report["best"] is not None else 1)


def test_measured_levers_from_the_gateway_records(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ProfileStore(config.parent / "vigil-capacity.json").save(profile("H100", 10.0))

    def rec(i: int, tier: str, cache_hit: str = "") -> GatewayRecord:
        return GatewayRecord(
            id=f"r{i}", start_s=AT - 61, ts_s=AT - 60, pool="chat", model=MODEL,
            endpoint="chat", tenant="acme", tier=tier, key_id="k", replica="chat-0",
            status=200, stream=True, prompt_tokens=20, completion_tokens=400,
            tokens_source="usage", ttft_s=0.2, e2e_s=1.0, queue_s=0.0, error=False,
            error_class="", cache_hit=cache_hit, requested_max_tokens=None, max_tokens=512,
            max_tokens_decision="default", cost_usd=0.001, saved_usd=None, upstream_id="",
            batch_id="", message="")

    writer = RecordWriter(config.parent / "vigil-gateway.db")
    writer.start()
    for i in range(10):  # 1 batch in 10; 2 cache hits in 10
        writer.put(rec(i, "batch" if i == 0 else "standard", "l2" if i in (1, 2) else ""))
    writer.close()
    code, out = run(capsys, "--config", str(config), "--rate", "25", "--at", str(AT),
                    "--lever", "cache", "--lever", "output-tokens", "--no-estimates",
                    "--json")
    assert code == 0
    report = json.loads(out)
    levers = {e["name"]: e for e in report["levers"]}
    assert levers["cache_hit_rate"]["value"] == pytest.approx(0.2)
    assert levers["mean_output_tokens"]["value"] == pytest.approx(400.0)
    (c,) = report["candidates"]
    # 25 × 0.8 = 20 requests/s on μ = 10 × 200 / 400 = 5 per replica: 4 replicas all day.
    assert c["rps_per_replica"] == pytest.approx(5.0)
    assert {n for _, n in c["replicas_curve"]} == {4}


def test_config_errors_exit_2(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(config), "--pool", "nope", "--rate", "1"]) == 2
    assert "--pool 'nope' is not a pool" in capsys.readouterr().err
    bad = config.parent / "bad.toml"
    bad.write_text("[capacity]\nplan_step = 'soon'\n")
    assert run(capsys, "--config", str(bad), "--rate", "1")[0] == 2
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--config", str(config), "--rate", "1", "--forecast"])
    assert exc.value.code == 2
