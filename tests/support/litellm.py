"""A real LiteLLM proxy in front of a replica, exporting its OpenTelemetry spans over OTLP/HTTP.

``make litellm-venv`` builds ``.venv-litellm``: ``litellm[proxy]`` (``LITELLM_VERSION``) with the
OpenTelemetry SDK and OTLP/HTTP exporter that its ``otel`` callback needs, in a venv of its own
because it pins fastapi, openai and OpenTelemetry versions other than Vigil's.
``running_litellm`` starts ``litellm --config`` on a free loopback port with one
``hosted_vllm/<model>`` deployment (the simulator or a real vLLM), ``litellm_settings:
callbacks: ["otel"]`` and the exporter pointed at an OTLP receiver, waits for
``/health/liveliness`` (about 6 s on two cores), and stops it when the block ends.

What a request exports (LiteLLM 1.108.7, the legacy ``otel`` callback): a SERVER span
``POST /chat/completions`` (FastAPI's own), under it ``Received Proxy Server Request`` (SERVER),
whose children are ``auth``, ``proxy_pre_call``, ``router``, ``self`` (INTERNAL service spans) and
``litellm_request`` (INTERNAL: ``gen_ai.usage.input_tokens``/``output_tokens``,
``gen_ai.response.id`` = the id the client got, ``gen_ai.system`` = ``hosted_vllm``,
``llm.is_streaming`` ``"True"``/``"False"``, ``llm.user`` and
``metadata.user_api_key_end_user_id`` from the request's ``user``, ``metadata.*`` for the key),
with a ``raw_gen_ai_request`` child. The exporter appends ``/v1/traces`` to the endpoint when it
is missing, so the receiver's base URL is enough.

Offline only three things need the environment set here: ``LITELLM_LOCAL_MODEL_COST_MAP`` (else
the proxy spends 7 s at start failing to fetch its price list from GitHub), ``HF_HUB_OFFLINE``
(else each streamed request waits 23 s for a Hugging Face tokenizer lookup before counting with
tiktoken) and a master key (1.108 refuses to start without one).

Virtual keys, teams and spend logs need ``DATABASE_URL``, and LiteLLM's database is Prisma's:
at start it npm-installs the Prisma CLI (that works) and the CLI then downloads its query engine
from binaries.prisma.sh, which is unreachable here, so the proxy exits ("Database migration
cannot proceed ... getaddrinfo ENOTFOUND binaries.prisma.sh"); no PyPI or npm package ships the
native engines. Without a database ``/key/generate`` and ``/spend/logs`` answer 500 ("DB not
connected"). Tenants are therefore given by ``tenants``: LiteLLM's ``custom_auth`` hook (a module
written into the work folder) maps each tenant's key to a key alias, team and user, which the
spans carry as ``metadata.user_api_key_alias``, ``metadata.user_api_key_team_id``,
``metadata.user_api_key_team_alias``, ``metadata.user_api_key_user_id`` and
``metadata.user_api_key_hash`` (the key's SHA-256). With custom auth no ``Received Proxy Server
Request`` span is made, and LiteLLM would then put its attributes on FastAPI's span instead of
a ``litellm_request``; ``USE_OTEL_LITELLM_REQUEST_SPAN`` keeps the ``litellm_request`` span. A
refused key's request is exported too: a ``litellm_request`` with status ERROR, ``error.code``
``"401"`` and an empty key alias.

Where ``.venv-litellm`` is missing the tests are skipped with the command that builds it, except
under CI, where they fail: CI must run them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import pytest
from conftest import in_ci

from support.loopback import free_port

__all__ = [
    "LITELLM_VERSION",
    "MASTER_KEY",
    "PROXY_SPAN",
    "REQUEST_SPAN",
    "Tenant",
    "litellm_bin",
    "require_litellm",
    "running_litellm",
]

REPO = Path(__file__).resolve().parents[2]

#: LiteLLM's version in ``.venv-litellm`` (the Makefile's ``LITELLM_VERSION``).
LITELLM_VERSION = "1.108.7"

#: The span of one LLM call, and the proxy's span around the whole request.
REQUEST_SPAN = "litellm_request"
PROXY_SPAN = "Received Proxy Server Request"

#: The proxy's master key (this test process's own): the API key to send when ``tenants`` is
#: empty. LiteLLM refuses to start without one, and refuses a weak one.
MASTER_KEY = "sk-" + secrets.token_hex(32)

#: Start-up takes about 6 s on two idle cores; this bounds the wait, it measures nothing.
START_TIMEOUT_S = 120.0
#: How long a SIGTERM'd proxy may take to exit before it is killed.
STOP_TIMEOUT_S = 30.0
#: The span processor's export delay (ms; the SDK's default is 5000): spans reach the receiver
#: within a fraction of a second of the response.
EXPORT_DELAY_MS = 200

#: The ``custom_auth`` module written beside the config when there are tenants: each tenant's
#: key is a caller with that tenant's alias, team and user; any other key is refused (401).
_CUSTOM_AUTH = '''\
"""Vigil's tests: each tenant's API key is a key alias, a team and a user (tenants.json)."""

import json
from pathlib import Path

from fastapi import Request
from litellm.proxy._types import ProxyErrorTypes, ProxyException, UserAPIKeyAuth

TENANTS = {t["key"]: t for t in json.loads((Path(__file__).parent / "tenants.json").read_text())}


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    tenant = TENANTS.get(api_key)
    if tenant is None:
        raise ProxyException(message="unknown API key", type=ProxyErrorTypes.auth_error,
                             param="api_key", code=401)
    return UserAPIKeyAuth(api_key=api_key, key_alias=tenant["alias"], team_id=tenant["team"],
                          team_alias=tenant["team"], user_id=tenant["alias"])
'''
_AUTH_MODULE = "vigil_litellm_auth"

#: The watchdog's program: argv[1] the process group to kill once its stdin closes, which only
#: the test process holds open, so a killed test run does not leave a proxy running.
_WATCHDOG = """
import contextlib, os, signal, sys
sys.stdin.buffer.read()
with contextlib.suppress(ProcessLookupError):
    os.killpg(int(sys.argv[1]), signal.SIGKILL)
"""


@dataclass(frozen=True)
class Tenant:
    """A tenant of the proxy: its API key, and the key alias, team and user it stands for."""

    key: str
    alias: str
    team: str


def litellm_bin() -> Path:
    """The ``litellm`` command of the LiteLLM venv: ``$VIGIL_LITELLM_BIN``, else
    ``.venv-litellm/bin/litellm``."""
    return Path(os.environ.get("VIGIL_LITELLM_BIN") or REPO / ".venv-litellm" / "bin" / "litellm")


def require_litellm() -> Path:
    """The LiteLLM venv's ``litellm`` command, or end the test: fail under CI, skip elsewhere."""
    command = litellm_bin()
    if command.exists():
        return command
    message = f"LiteLLM is not installed ({command} is missing: run `make litellm-venv`)"
    if in_ci():
        pytest.fail(f"{message}; CI must run this test", pytrace=False)
    pytest.skip(message)


def _api_base(upstream_base_url: str) -> str:
    """The upstream's OpenAI base URL, ``.../v1``, with or without it given."""
    base = upstream_base_url.rstrip("/")
    return base if base.endswith("/v1") else f"{base}/v1"


def write_config(workdir: Path, upstream_base_url: str, model: str,
                 tenants: Sequence[Tenant] = ()) -> Path:
    """Write ``workdir/config.yaml`` (JSON, which YAML reads): ``model`` served by the vLLM at
    ``upstream_base_url``, spans to the ``otel`` callback; with ``tenants``, the custom auth
    module and its ``tenants.json`` beside it."""
    config: dict[str, object] = {
        "model_list": [{"model_name": model,
                        "litellm_params": {"model": f"hosted_vllm/{model}",
                                           "api_base": _api_base(upstream_base_url),
                                           "api_key": "none"}}],
        "litellm_settings": {"callbacks": ["otel"]},
    }
    if tenants:
        (workdir / f"{_AUTH_MODULE}.py").write_text(_CUSTOM_AUTH)
        (workdir / "tenants.json").write_text(json.dumps([asdict(t) for t in tenants]))
        config["general_settings"] = {"custom_auth": f"{_AUTH_MODULE}.user_api_key_auth"}
    path = workdir / "config.yaml"
    path.write_text(json.dumps(config, indent=1))
    return path


def proxy_env(otlp_endpoint: str, *, tenants: bool) -> dict[str, str]:
    """The proxy's environment: spans over OTLP/HTTP to ``otlp_endpoint``, nothing fetched from
    the internet, no database."""
    env = {**os.environ,
           "LITELLM_MASTER_KEY": MASTER_KEY,
           "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_SERVICE_NAME": "litellm",
           "OTEL_BSP_SCHEDULE_DELAY": str(EXPORT_DELAY_MS),
           # The bundled price list, not GitHub's.
           "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           # No tokenizer lookups on the Hugging Face Hub (tiktoken counts instead).
           "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1",
           "DO_NOT_TRACK": "1",
           "PYTHONUNBUFFERED": "1"}
    if tenants:
        env["USE_OTEL_LITELLM_REQUEST_SPAN"] = "true"
    # No database (Prisma cannot run offline), and the test session's Python path and venv
    # must not leak into LiteLLM's venv.
    for key in ("DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(key, None)
    return env


def _tail(log: Path, lines: int = 60) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the proxy's process group, SIGKILL after ``STOP_TIMEOUT_S``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def running_litellm(upstream_base_url: str, model: str, otlp_endpoint: str, workdir: Path, *,
                    tenants: Sequence[Tenant] = (),
                    start_timeout_s: float = START_TIMEOUT_S) -> Iterator[str]:
    """A LiteLLM proxy serving ``model`` from the vLLM OpenAI server at ``upstream_base_url``
    (``http://host:port`` or ``.../v1``), exporting spans to the OTLP/HTTP receiver at
    ``otlp_endpoint`` (its base URL); yields the proxy's base URL (the OpenAI client's
    ``base_url``). Its config and ``litellm.log`` are in ``workdir``.

    Clients send ``MASTER_KEY``, or with ``tenants`` a tenant's key (no other key is accepted).
    RuntimeError with the log's tail when the proxy exits or is not live within
    ``start_timeout_s``; stopped (SIGTERM, then SIGKILL) when the block ends."""
    command = require_litellm()
    workdir.mkdir(parents=True, exist_ok=True)
    config = write_config(workdir, upstream_base_url, model, tenants)
    port = free_port()
    log = workdir / "litellm.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(command), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
             "--num_workers", "1"],
            env=proxy_env(otlp_endpoint, tenants=bool(tenants)), stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir,
            start_new_session=True)
    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(proc.pid)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"LiteLLM exited with {proc.returncode} while starting:\n"
                                   f"{_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health/liveliness", timeout=2.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"LiteLLM not live within {start_timeout_s:g} s:\n"
                                   f"{_tail(log)}")
            time.sleep(0.2)
        yield url
    finally:
        _stop(proc)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            watchdog.stdin.close()  # type: ignore[union-attr]
            watchdog.wait(10)
