"""`vigil vllm-args` / `vigil vllm-serve`: golden commands for a few launch profiles, errors
(serving/vllm_args.py, vigil_shell/vllm_serve_cli.py)."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

import pytest

from serving.vllm_args import build_command, histogram_buckets, speculative_config
from vigil.config import Config, parse_config
from vigil.errors import ConfigError
from vigil_shell import vllm_serve_cli as vllm_launch
from vigil_shell.cli import main
from vigil_shell.vllm_serve_cli import missing_requirements

CONFIG = """
[[pools]]
name = "chat"
model = "meta-llama/Llama-3.1-8B-Instruct"

[[pools]]
name = "big"
model = "org/Big-70B"
gpus_per_replica = 4
[pools.vllm]
quantization = "fp8"
speculative_method = "ngram"
num_speculative_tokens = 3
enable_prefix_caching = false
max_num_seqs = 128
max_model_len = 8192
gpu_memory_utilization = 0.85
max_new_tokens = 8192
extra_args = ["--enable-lora", "--max-loras", "2"]

[[pools]]
name = "w4"
model = "org/Llama-3.1-8B-Instruct-AWQ"
[pools.vllm]
quantization = "int4"
scheduling_policy = "fcfs"
speculative_method = "org/Llama-3.2-1B-Instruct"

[[pools]]
name = "w8"
model = "org/Llama-3.1-8B-Instruct-W8A8"
[pools.vllm]
quantization = "int8"

[[slos]]
name = "w8-ttft"
pool = "w8"
indicator = "ttft"
threshold_seconds = 1.0

[[slos]]
name = "w8-e2e"
pool = "w8"
indicator = "e2e"
threshold_seconds = 10.0

[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
threshold_seconds = 0.3

[[slos]]
name = "chat-e2e"
pool = "chat"
indicator = "e2e"

[[slos]]
name = "big-e2e"
pool = "big"
indicator = "e2e"
threshold_seconds = 8.0
"""

TTFT_WITH_03 = ("[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.3, 0.5, 0.75, 1.0, "
                "2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]")
E2E_WITH_8 = ("[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 40.0, "
              "50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]")

GOLDEN = {
    "chat": (
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --served-model-name "
        "meta-llama/Llama-3.1-8B-Instruct --host 127.0.0.1 --port 8001 --scheduling-policy "
        "priority --enable-prefix-caching --enable-prompt-tokens-details --max-num-seqs 256 "
        "--gpu-memory-utilization 0.9 "
        "--override-generation-config '{\"max_new_tokens\": 512}' --custom-histogram-buckets "
        f"'{{\"time_to_first_token\": {TTFT_WITH_03}, \"request_latency\": {E2E_WITH_8}}}'"),
    "big": (
        "vllm serve org/Big-70B --served-model-name org/Big-70B --host 127.0.0.1 --port 8001 "
        "--tensor-parallel-size 4 --quantization fp8 --scheduling-policy priority "
        "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}' "
        "--no-enable-prefix-caching --enable-prompt-tokens-details --max-num-seqs 128 "
        "--max-model-len 8192 "
        "--gpu-memory-utilization 0.85 --override-generation-config "
        "'{\"max_new_tokens\": 8192}' --custom-histogram-buckets "
        f"'{{\"request_latency\": {E2E_WITH_8}}}' --enable-lora --max-loras 2"),
    "w4": (
        "vllm serve org/Llama-3.1-8B-Instruct-AWQ --served-model-name "
        "org/Llama-3.1-8B-Instruct-AWQ --host 127.0.0.1 --port 8001 --scheduling-policy fcfs "
        "--speculative-config '{\"method\": \"draft_model\", \"model\": "
        "\"org/Llama-3.2-1B-Instruct\", \"num_speculative_tokens\": 5}' "
        "--enable-prefix-caching --enable-prompt-tokens-details --max-num-seqs 256 "
        "--gpu-memory-utilization 0.9 "
        "--override-generation-config '{\"max_new_tokens\": 512}'"),
    # Thresholds 1.0 s and 10 s already are vLLM bucket bounds: no custom buckets.
    "w8": (
        "vllm serve org/Llama-3.1-8B-Instruct-W8A8 --served-model-name "
        "org/Llama-3.1-8B-Instruct-W8A8 --host 127.0.0.1 --port 8001 --scheduling-policy "
        "priority --enable-prefix-caching --enable-prompt-tokens-details --max-num-seqs 256 "
        "--gpu-memory-utilization 0.9 "
        "--override-generation-config '{\"max_new_tokens\": 512}'"),
}


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "vigil.toml"
    path.write_text(CONFIG)
    return path


def _cfg(text: str = CONFIG) -> Config:
    return parse_config(tomllib.loads(text))


@pytest.mark.parametrize("pool", sorted(GOLDEN))
def test_golden_commands(config_file: Path, pool: str,
                         capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["vllm-args", "--config", str(config_file), "--pool", pool, "--host",
               "127.0.0.1", "--port", "8001"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out == GOLDEN[pool] + "\n"
    assert shlex.split(out) == build_command(_cfg(), pool, host="127.0.0.1", port=8001).argv


def test_json_prints_the_argv(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vllm-args", "-c", str(config_file), "--pool", "big", "--json"]) == 0
    argv = json.loads(capsys.readouterr().out)
    assert argv[:3] == ["vllm", "serve", "org/Big-70B"] and "--port" not in argv
    spec = argv[argv.index("--speculative-config") + 1]
    assert json.loads(spec) == {"method": "ngram", "num_speculative_tokens": 3}


@pytest.mark.parametrize(("pool", "expected"), [
    ("w8", "must be a checkpoint already quantized that way"),
    ("w4", "INT4 W4A16 (AWQ or GPTQ)"),
    ("w4", "Priority scheduling is not enabled"),
    ("chat", "vLLM applies it as a ceiling on every request"),
])
def test_notes_go_to_stderr(config_file: Path, pool: str, expected: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vllm-args", "-c", str(config_file), "--pool", pool]) == 0
    captured = capsys.readouterr()
    assert expected in captured.err and captured.err.startswith("# note: ")
    assert len(captured.out.splitlines()) == 1


def test_no_ceiling_note_when_max_new_tokens_covers_every_cap() -> None:
    assert not any("ceiling" in n for n in build_command(_cfg(), "big").notes)


def test_unknown_pool_exits_2_listing_the_pools(config_file: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vllm-args", "-c", str(config_file), "--pool", "nope"]) == 2
    err = capsys.readouterr().err
    assert "pool 'nope' does not exist (pools: 'chat', 'big', 'w4', 'w8')" in err


def test_bad_port_is_refused(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["vllm-args", "-c", str(config_file), "--pool", "chat", "--port", "70000"])
    assert info.value.code == 2
    assert "port 70000 is out of range" in capsys.readouterr().err


def test_speculative_methods() -> None:
    cfg = _cfg(CONFIG.replace('speculative_method = "ngram"', 'speculative_method = "eagle3"'))
    with pytest.raises(ConfigError, match="needs a draft or head checkpoint"):
        speculative_config(cfg.pool("big"))
    assert speculative_config(_cfg().pool("chat")) is None
    suffix = _cfg(CONFIG.replace('speculative_method = "ngram"', 'speculative_method = "suffix"'))
    assert speculative_config(suffix.pool("big")) == {"method": "suffix",
                                                      "num_speculative_tokens": 3}


def test_histogram_buckets_keep_every_default_bound() -> None:
    b = histogram_buckets([0.8, 0.75], [12.5])
    assert b is not None and set(b) == {"time_to_first_token", "request_latency"}
    assert 0.8 in b["time_to_first_token"] and 12.5 in b["request_latency"]
    assert len(b["time_to_first_token"]) == 23 and len(b["request_latency"]) == 22
    assert histogram_buckets([1.0], [0.8, 10.0]) is None


def test_default_slos_add_08_and_8_seconds() -> None:
    cfg = _cfg('[[pools]]\nname = "p"\nmodel = "m"\n')
    argv = build_command(cfg, "p").argv
    buckets = json.loads(argv[argv.index("--custom-histogram-buckets") + 1])
    assert 0.8 in buckets["time_to_first_token"] and 8.0 in buckets["request_latency"]


def _pretend(monkeypatch: pytest.MonkeyPatch, *, installed: bool, gpu: bool) -> None:
    """Make ``vllm-serve`` see vLLM and a GPU as given, whatever this machine has."""
    monkeypatch.setattr(vllm_launch, "missing_requirements", lambda: missing_requirements(
        installed=lambda: installed, gpu=lambda: gpu))


def test_vllm_serve_fails_clearly_without_vllm_or_gpu(
        config_file: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend(monkeypatch, installed=False, gpu=False)
    assert main(["vllm-serve", "-c", str(config_file), "--pool", "chat"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vigil vllm-serve: error: cannot start vLLM here: ")
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in err
    for reason in missing_requirements(installed=lambda: False, gpu=lambda: False):
        assert reason in err


def test_vllm_serve_execs_vllm_with_the_profile_when_it_can(
        config_file: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend(monkeypatch, installed=True, gpu=True)
    execs: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(vllm_launch.os, "execv", lambda path, argv: execs.append((path, argv)))
    assert main(["vllm-serve", "-c", str(config_file), "--pool", "big"]) == 0
    [(path, argv)] = execs
    command = build_command(_cfg(), "big")
    expected = command.argv
    assert path == argv[0]
    # vLLM's own entry point (a script or ``python -m``), then exactly `vllm-args`' command.
    assert argv[-(len(expected) - 1):] == expected[1:]
    err = capsys.readouterr().err
    assert all(f"# note: {note}" in err for note in command.notes)
    assert f"vigil vllm-serve: exec {shlex.join(argv)}" in err


def test_missing_requirements_name_what_is_missing() -> None:
    both = missing_requirements(installed=lambda: False, gpu=lambda: False)
    assert len(both) == 2
    assert "pip install 'vigil[vllm]'" in both[0] and "no NVIDIA GPU found" in both[1]
    assert missing_requirements(installed=lambda: True, gpu=lambda: False) == both[1:]
    assert missing_requirements(installed=lambda: True, gpu=lambda: True) == []


def test_vllm_serve_checks_the_pool_first(config_file: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vllm-serve", "-c", str(config_file), "--pool", "nope"]) == 2
    assert "pool 'nope' does not exist" in capsys.readouterr().err
