"""Several ``vigil gateway`` processes on one database, for tests (no tests here).

``write_config`` writes one config file whose pool ``chat`` is served by the given replicas and
whose ``[gateway] database`` is the given PostgreSQL URL (or, for an SQLite path, whose
``records_path`` is that file); ``running_gateways(config, 2)`` starts that many gateway
processes from it, each on its own loopback port (``--listen``), and stops them on exit. A
``GatewayProcess`` can be killed (SIGKILL) or stopped (SIGTERM) by the test, and reads its own
output (kept in a file, so that a chatty process never blocks on a full pipe).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from serving.gateway.front.api_keys import key_sha256
from support.gateway import KEYS, MODEL, POOL, STANDARD
from support.loopback import free_port
from vigil.storage.database import is_postgres_url

__all__ = ["GatewayProcess", "running_gateways", "start_gateway", "toml_value", "write_config"]

REPO = Path(__file__).resolve().parents[2]

#: A gateway process has this long to serve (seconds): a bound on the wait, not a measurement.
START_TIMEOUT_S = 40.0


def toml_value(value: Any) -> str:
    """``value`` (str, bool, int, float or a list of them) in TOML's spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML spelling for {type(value).__name__}")


def _table(name: str, values: Mapping[str, Any]) -> list[str]:
    """``[name]`` with the plain keys of ``values``, then each sub-table (a dict value)."""
    lines = [f"[{name}]"] + [f"{k} = {toml_value(v)}" for k, v in values.items()
                             if not isinstance(v, Mapping)]
    for k, v in values.items():
        if isinstance(v, Mapping):
            lines += ["", *_table(f"{name}.{k}", v)]
    return lines


def write_config(folder: Path, database: str | Path, upstream_urls: list[str], *,
                 gateway: Mapping[str, Any] | None = None) -> Path:
    """Write ``folder/vigil.toml``: pool ``chat`` on the replicas ``upstream_urls`` (bases),
    the records, batch queue and cache entries in ``database`` (a PostgreSQL URL, or an SQLite
    path), the suite's API keys (``test_gateway_support.KEYS``), and the ``[gateway]`` keys of
    ``gateway`` (nested dicts are sub-tables: ``{"batch": {"poll_interval": "0.1s"}}``)."""
    gw: dict[str, Any] = {"health_interval": "0.2s"}
    if is_postgres_url(str(database)):
        gw["database"] = str(database)
        gw["records_path"] = str(folder / "unused-records.db")
    else:
        gw["records_path"] = str(database)
    gw.update(gateway or {})
    lines = ["[[pools]]", f'name = "{POOL}"', f"model = {toml_value(MODEL)}", 'gpu = "H100"', ""]
    for i, url in enumerate(upstream_urls):
        lines += ["[[targets]]", f'name = "{POOL}-{i}"',
                  f"url = {toml_value(url.rstrip('/') + '/metrics')}", f'pool = "{POOL}"', ""]
    lines += _table("gateway", gw)
    for key, (tenant, tier) in KEYS.items():
        lines += ["", "[[gateway.api_keys]]", f'sha256 = "{key_sha256(key)}"',
                  f'tenant = "{tenant}"', f'tier = "{tier}"']
    path = folder / "vigil.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class GatewayProcess:
    """One ``vigil gateway`` child process listening on ``127.0.0.1:port``."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    #: When the process was started (``time.monotonic()``), and how long it took to serve.
    started_at: float = 0.0
    serving_after_s: float | None = None
    _clients: list[openai.OpenAI] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"{self.url}/v1"

    def client(self, key: str = STANDARD, **kw: Any) -> openai.OpenAI:
        """The official client, unchanged, pointed at this instance (no retries: a failed
        request must show)."""
        kw.setdefault("timeout", 30.0)
        c = openai.OpenAI(base_url=self.api, api_key=key, max_retries=0, **kw)
        self._clients.append(c)
        return c

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        """What the process printed so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def health(self) -> dict[str, Any] | None:
        """``GET /health`` as JSON, None while it does not answer 200."""
        try:
            r = httpx.get(f"{self.url}/health", timeout=2.0)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until ``/health`` answers with a healthy replica in the pool; AssertionError
        with the process's output if it exits or does not get there in ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise AssertionError(f"gateway {self.name} exited with {self.proc.returncode}:"
                                     f"\n{self.log()}")
            h = self.health()
            if h is not None and h["pools"][POOL]["healthy_replicas"] > 0:
                self.serving_after_s = time.monotonic() - self.started_at
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"gateway {self.name}: not serving within {timeout_s:g} s"
                                     f"\n{self.log()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: nothing is flushed, no lease is given back."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (a graceful stop) and the exit code; SIGKILL after ``timeout_s``."""
        for c in self._clients:
            c.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)


def start_gateway(config: Path, name: str, *, code: Path = REPO) -> GatewayProcess:
    """One gateway process from ``config`` on a free port, running the Vigil in ``code`` (this
    repository, or another release's tree: its packages come first on the path)."""
    port = free_port()
    log_path = config.parent / f"gateway-{name}.log"
    env = {**os.environ, "PYTHONPATH": str(code), "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "vigil_shell.cli", "gateway", "--config",
                                 str(config), "--listen", f"127.0.0.1:{port}"],
                                cwd=config.parent, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    return GatewayProcess(name=name, port=port, proc=proc, log_path=log_path,
                          started_at=time.monotonic())


@contextlib.contextmanager
def running_gateways(config: Path, n: int = 2) -> Iterator[list[GatewayProcess]]:
    """Start ``n`` gateway processes from ``config`` (named ``a``, ``b``, ...) together, wait
    until each serves, and stop them all (SIGTERM) when the block ends."""
    gateways = [start_gateway(config, chr(ord("a") + i)) for i in range(n)]
    try:
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(GatewayProcess.wait_serving, gateways))
        yield gateways
    finally:
        for g in gateways:
            g.stop()
