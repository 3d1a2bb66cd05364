"""``vigil dashboard --config F [--listen HOST:PORT] [--at T]``: run the Streamlit app.

It starts ``python -m dashboard.warm run dashboard/app.py`` (Streamlit's ``run``, after loading
the app's code so that the first visitor does not wait for it) headless, without usage statistics,
on ``[dashboard] address:port`` (127.0.0.1:8501 by default; ``--listen`` overrides both), and
hands the config file to the app in ``VIGIL_CONFIG`` (``--at`` pins "now" in
``VIGIL_DASHBOARD_AT``). Binding to anything but loopback without authentication (a password in
``[dashboard] password_env``'s variable, or st.login configured) is refused with exit code 2 and
a message that says how to configure it (``dashboard.auth.access_problem``).

Streamlit runs as a child that never outlives the command (``vigil_shell.children``): SIGTERM,
SIGINT or SIGHUP stop it (SIGTERM, ``STOP_GRACE`` seconds, then SIGKILL) before the command
exits, and should the command be killed outright the kernel stops it (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import dashboard
from dashboard.auth import access_problem, secrets_files
from vigil.config import Config, load_config
from vigil.conventions import DASHBOARD_ENV_AT, DASHBOARD_ENV_CONFIG
from vigil.errors import ConfigError
from vigil_shell.children import spawn, stop, stop_signals
from vigil_shell.extras import require_modules
from vigil_shell.options import (
    add_at_option,
    add_config_option,
    add_deprecated_alias,
    add_listen_option,
    parse_listen,
)

__all__ = ["APP_PATH", "STOP_GRACE", "add_arguments", "listen_address", "run",
           "streamlit_command"]

#: The Streamlit entry point.
APP_PATH = Path(dashboard.__file__).resolve().parent / "app.py"
#: Seconds Streamlit gets to stop after SIGTERM before it is killed.
STOP_GRACE = 10.0
#: How often the command looks for a stop request while Streamlit runs (seconds).
_POLL = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `vigil dashboard`."""
    add_config_option(parser)
    add_listen_option(parser, default=None,
                      help="address and port to serve on (default: [dashboard] address and "
                           "port, 127.0.0.1:8501); an address other than loopback needs a "
                           "password or st.login")
    add_deprecated_alias(parser, "--port", dest="port", replacement="--listen", type=int)
    add_deprecated_alias(parser, "--address", dest="address", replacement="--listen")
    add_at_option(parser, help="pin the dashboard's 'now' to this time (default: follow the "
                               "clock)")


def listen_address(args: argparse.Namespace, config: Config) -> tuple[str, int]:
    """``(address, port)``: ``--listen`` (or the old ``--address``/``--port``) over
    ``[dashboard]``."""
    address, port = config.dashboard.address, config.dashboard.port
    if args.listen:
        address, port = parse_listen(args.listen)
    address = getattr(args, "address", None) or address
    old_port = getattr(args, "port", None)
    return address, port if old_port is None else old_port


def streamlit_command(address: str, port: int) -> list[str]:
    """The command that serves the app: Streamlit's ``run`` with the app's code loaded first
    (``dashboard.warm``), headless, no usage statistics, no file watcher (the code does not
    change under a running dashboard), a viewer's toolbar."""
    return [
        sys.executable, "-m", "dashboard.warm", "run", str(APP_PATH),
        "--server.headless", "true",
        "--server.address", address,
        "--server.port", str(port),
        "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--client.toolbarMode", "viewer",
    ]


def _check(config: Config, config_file: str, address: str, port: int,
           environ: Mapping[str, str]) -> None:
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is out of range 1-65535", file=config_file)
    problem = access_problem(address, config, environ, secrets_files())
    if problem:
        raise ConfigError(problem, file=config_file, key="dashboard.address")


def run(args: argparse.Namespace) -> int:
    """Check the access rules, then run Streamlit until it exits or a stop signal arrives
    (exit code 0 then; Streamlit's own when it exits by itself)."""
    require_modules("streamlit")
    config = load_config(args.config)
    address, port = listen_address(args, config)
    _check(config, args.config, address, port, os.environ)
    env = {**os.environ, DASHBOARD_ENV_CONFIG: str(Path(args.config).resolve())}
    if args.at is not None:
        env[DASHBOARD_ENV_AT] = repr(float(args.at))
    host = f"[{address}]" if ":" in address else address
    print(f"vigil dashboard: http://{host}:{port} (config {args.config}; Ctrl-C stops)",
          flush=True)
    with stop_signals() as request:
        proc = spawn(streamlit_command(address, port), env=env)
        while True:
            try:
                return proc.wait(timeout=_POLL)
            except subprocess.TimeoutExpired:
                if request.requested:
                    break
        stop([("streamlit", proc)], STOP_GRACE,
             say=lambda line: print(f"vigil dashboard: {line}", file=sys.stderr, flush=True))
    print("vigil dashboard: stopped", flush=True)
    return 0
