"""``vigil dashboard --config F [--port P] [--address A] [--at T]``: run the Streamlit app.

It starts ``python -m streamlit run dashboard/app.py`` headless, without usage statistics,
on ``[dashboard] address:port`` (127.0.0.1:8501 by default; flags override), and hands the
config file to the app in ``VIGIL_CONFIG`` (``--at`` pins "now" in ``VIGIL_DASHBOARD_AT``).
Binding to anything but loopback without authentication (a password in ``[dashboard]
password_env``'s variable, or st.login configured) is refused with exit code 2 and a message
that says how to configure it (``dashboard.auth.access_problem``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from dashboard.auth import access_problem, secrets_files
from vigil.config import Config, load_config
from vigil.conventions import DASHBOARD_ENV_AT, DASHBOARD_ENV_CONFIG
from vigil.errors import ConfigError

__all__ = ["APP_PATH", "add_arguments", "run", "streamlit_command"]

#: The Streamlit entry point.
APP_PATH = Path(__file__).resolve().parent / "app.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `vigil dashboard`."""
    parser.add_argument("--config", "-c", required=True, metavar="FILE",
                        help="Vigil TOML config file")
    parser.add_argument("--port", type=int, metavar="PORT",
                        help="port to listen on (default: [dashboard] port, 8501)")
    parser.add_argument("--address", metavar="ADDRESS",
                        help="address to bind (default: [dashboard] address, 127.0.0.1); any "
                             "other than loopback needs a password or st.login")
    parser.add_argument("--at", type=float, metavar="UNIX_SECONDS",
                        help="pin the dashboard's 'now' to this time (default: follow the clock)")


def streamlit_command(address: str, port: int) -> list[str]:
    """The command that serves the app: headless, no usage statistics, no file watcher (the
    code does not change under a running dashboard), a viewer's toolbar."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP_PATH),
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
    """Check the access rules, then run Streamlit until it exits (Ctrl-C stops it)."""
    config = load_config(args.config)
    address = args.address or config.dashboard.address
    port = args.port if args.port is not None else config.dashboard.port
    _check(config, args.config, address, port, os.environ)
    env = {**os.environ, DASHBOARD_ENV_CONFIG: str(Path(args.config).resolve())}
    if args.at is not None:
        env[DASHBOARD_ENV_AT] = repr(float(args.at))
    host = f"[{address}]" if ":" in address else address
    print(f"vigil dashboard: http://{host}:{port} (config {args.config}; Ctrl-C stops)",
          flush=True)
    proc = subprocess.Popen(streamlit_command(address, port), env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # The terminal's Ctrl-C reached Streamlit too (same process group): let it finish.
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return 130
