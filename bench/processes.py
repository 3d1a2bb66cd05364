"""What the benchmarks share to run the processes they measure: ports, readiness, stop, CPU.

Each benchmark starts real processes on loopback (a gateway, simulated replicas, an upstream
stub) and measures them from outside; these are the few steps they all take the same way.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cpu_pressure_us", "cpu_seconds", "free_port", "fresh_postgres", "own_cpu_seconds",
           "postgres", "stop", "wait_http"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    """Return once ``url`` answers 200; raise with the end of ``log`` if ``proc`` exits first,
    or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}: {err}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as r:
            if r.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; waits for the exit."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far (Linux /proc), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """User + system CPU time of this process so far, seconds."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_pressure_us() -> float | None:
    """Microseconds in which some runnable task waited for a CPU since boot (Linux PSI,
    ``/proc/pressure/cpu``); None where the kernel does not report it."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return float(line.rsplit("total=", 1)[1])


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A throw-away PostgreSQL server on a free loopback port, started the way the tests start
    theirs (tests/support/postgres.py: Debian's binaries, as the ``postgres`` user when run as
    root); yields the URL of its ``postgres`` database and stops it at the end."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    # conftest first: it imports postgres_server, which imports it back.
    import conftest  # noqa: F401
    from support.postgres import PostgresServer, require_postgres

    server = PostgresServer(require_postgres())
    server.start()
    try:
        yield server.url()
    finally:
        server.close()


def fresh_postgres(url: str, name: str) -> str:
    """A new empty database ``name`` on the server of ``url``; its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name
