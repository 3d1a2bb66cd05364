"""``vigil demo``: a simulated fleet, a load generator and ``vigil serve`` on this machine.

Everything runs as child processes of this one, on loopback ports, and Ctrl-C (or
``--duration``) stops all of them cleanly: load first, then serve (so its last write
finishes), then the fleet. Later issues add the gateway, alerts and the dashboard here.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from vigil.conventions import SIM_DCGM_PATH

__all__ = ["DemoPlan", "add_arguments", "demo_config", "run"]

DEMO_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class DemoPlan:
    """Where the demo puts things: a data folder, the fleet's first port, its size."""

    data_dir: Path
    port: int = 8000
    replicas: int = 2
    pool: str = "chat"
    model: str = DEMO_MODEL
    gpu: str = "H100"
    scrape_interval: str = "5s"

    @property
    def serve_port(self) -> int:
        """``vigil serve``'s /metrics port: right after the fleet's ports."""
        return self.port + self.replicas

    @property
    def config_path(self) -> Path:
        return self.data_dir / "vigil.toml"

    def bases(self) -> list[str]:
        return [f"http://127.0.0.1:{self.port + i}" for i in range(self.replicas)]


def demo_config(plan: DemoPlan) -> str:
    """The demo's TOML config: one pool, a vLLM and a DCGM target per replica."""
    lines = [
        "# Written by `vigil demo`; edit freely, it is rewritten on the next demo run.",
        "[store]",
        'path = "vigil.db"',
        "",
        "[collector]",
        f'scrape_interval = "{plan.scrape_interval}"',
        'scrape_timeout = "4s"',
        "",
        "[engine]",
        'evaluation_interval = "15s"',
        "",
        "[[pools]]",
        f'name = "{plan.pool}"',
        f'model = "{plan.model}"',
        f'gpu = "{plan.gpu}"',
        "gpus_per_replica = 1",
        "min_replicas = 1",
        "max_replicas = 8",
    ]
    for i, base in enumerate(plan.bases()):
        lines += [
            "",
            "[[targets]]",
            f'name = "{plan.pool}-{i}"',
            f'url = "{base}/metrics"',
            f'pool = "{plan.pool}"',
            'kind = "vllm"',
            "",
            "[[targets]]",
            f'name = "{plan.pool}-{i}-gpu"',
            f'url = "{base}{SIM_DCGM_PATH}"',
            f'pool = "{plan.pool}"',
            'kind = "dcgm"',
        ]
    return "\n".join(lines) + "\n"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _vigil(*args: str) -> list[str]:
    return [sys.executable, "-m", "vigil.cli", *args]


def _wait_healthy(
    bases: list[str], procs: list[subprocess.Popen[bytes]], timeout: float,
    stopping: Callable[[], bool],
) -> bool:
    """Wait until every replica answers /health; False if a stop was requested meanwhile."""
    deadline = time.monotonic() + timeout
    pending = list(bases)
    while pending:
        if stopping():
            return False
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("the simulated fleet exited during start-up (see its output above)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"replicas not healthy after {timeout:.0f}s: {', '.join(pending)}")
        for base in list(pending):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=1.0, trust_env=False).status_code == 200:
                    pending.remove(base)
        time.sleep(0.2)
    return True


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the demo dies, however it dies (Linux)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _stop(procs: list[tuple[str, subprocess.Popen[bytes]]], grace: float = 10.0) -> None:
    """SIGTERM each child in order and wait; SIGKILL whatever is still running after grace."""
    for _, p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    for name, p in procs:
        if p.poll() is None:
            print(f"vigil demo: {name} did not stop in {grace:.0f}s; killing it", flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8000, help="first port of the simulated fleet")
    p.add_argument("--dir", default="demo-data", help="folder for the demo's config and store")
    p.add_argument("--duration", type=float, default=0.0, help="seconds; 0 runs until Ctrl-C")
    p.add_argument("--rate", type=float, default=3.0, help="starting request rate (req/s)")
    p.add_argument("--ramp-to", type=float, default=25.0, help="rate reached after --ramp")
    p.add_argument("--ramp", type=float, default=300.0, help="seconds of the load ramp")


def run(args: argparse.Namespace) -> int:
    plan = DemoPlan(data_dir=Path(args.dir).resolve(), port=args.port)
    busy = [p for p in range(plan.port, plan.serve_port + 1) if not _port_free(p)]
    if busy:
        print(
            f"vigil demo: error: port(s) {', '.join(map(str, busy))} on 127.0.0.1 are in use; "
            "pick another first port with --port",
            file=sys.stderr,
        )
        return 2
    plan.data_dir.mkdir(parents=True, exist_ok=True)
    plan.config_path.write_text(demo_config(plan))

    stop_requested = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    # SIGHUP too: closing the terminal must stop the fleet, not orphan it.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    children: list[tuple[str, subprocess.Popen[bytes]]] = []

    def spawn(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        # Own session: the terminal's Ctrl-C reaches only us, and we stop children in order;
        # PDEATHSIG: should we die without stopping them (kill -9), they stop anyway.
        proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent)
        children.append((name, proc))
        return proc

    code = 0
    try:
        fleet = spawn(
            "fleet",
            _vigil("sim", "--replicas", str(plan.replicas), "--port", str(plan.port),
                   "--model", plan.model, "--gpu", plan.gpu, "--profile", "small"),
        )
        if _wait_healthy(plan.bases(), [fleet], 60, lambda: stop_requested):
            # serve = the collector, the SLO engine every 30 s, alerting and /metrics.
            spawn("serve", _vigil("serve", "--config", str(plan.config_path),
                                  "--listen", f"127.0.0.1:{plan.serve_port}"))
            load_args = ["loadgen", "--model", plan.model, "--rate", str(args.rate),
                         "--ramp-to", str(args.ramp_to), "--ramp", str(args.ramp)]
            for base in plan.bases():
                load_args += ["--url", base]
            spawn("loadgen", _vigil(*load_args))
            print(_banner(plan, args), flush=True)
        start = time.monotonic()
        while not stop_requested:
            if args.duration and time.monotonic() - start >= args.duration:
                break
            for name, p in children:
                if p.poll() is not None:
                    print(f"vigil demo: {name} exited with code {p.returncode}; stopping",
                          flush=True)
                    stop_requested = True
                    code = 1
            time.sleep(0.2)
    except RuntimeError as exc:
        print(f"vigil demo: error: {exc}", file=sys.stderr)
        code = 1
    finally:
        print("vigil demo: stopping...", flush=True)
        # Load first, then serve (so its last write finishes), then the fleet.
        order = {"loadgen": 0, "serve": 1, "fleet": 2}
        _stop(sorted(children, key=lambda c: order.get(c[0], 9)))
        print("vigil demo: stopped; nothing left running.", flush=True)
    return code


def _banner(plan: DemoPlan, args: argparse.Namespace) -> str:
    return (
        "\nVigil demo is running:\n"
        + "".join(
            f"  replica {plan.pool}-{i}: API {b}/v1  metrics {b}/metrics  "
            f"DCGM {b}{SIM_DCGM_PATH}\n"
            for i, b in enumerate(plan.bases())
        )
        + f"  vigil serve: scrapes every {plan.scrape_interval} into "
        f"{plan.data_dir / 'vigil.db'}, evaluates SLOs and alerts, "
        f"metrics http://127.0.0.1:{plan.serve_port}/metrics\n"
        + f"  load: {args.rate:g} -> {args.ramp_to:g} req/s over {args.ramp:g}s, then steady\n"
        + f"  see targets:  vigil targets --config {plan.config_path}\n"
        + f"  SLO status:   vigil slo status --config {plan.config_path}\n"
        + f"  alerts:       vigil alerts --config {plan.config_path}\n"
        + "Press Ctrl-C to stop everything."
    )
