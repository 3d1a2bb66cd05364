"""A real PostgreSQL server for the tests: one per test session, a fresh database per test.

``tests/conftest.py`` imports both fixtures, so every test module can name them as
parameters (importing them again into a module works too, but then ruff's F811 flags each
parameter that shadows the import)::

    def test_something(postgres_url):
        db = PostgresDatabase(postgres_url, what="the records")

    def test_restart(postgres_server, postgres_url):
        postgres_server.stop()    # fast shutdown: clients are cut off
        postgres_server.start()   # same port, same data

How it works: Debian's server binaries (``initdb``, ``postgres``, ``pg_ctl`` of package
``postgresql``, found through ``conftest.require_binary``: missing, the test is skipped, or
fails under CI) create a cluster in a fresh temporary directory (trust authentication, user
``postgres``) and start it on a free loopback port, its socket in the same directory, with
``fsync=off`` (nothing here must survive a power loss). ``pg_ctl -w`` waits until it accepts
connections. PostgreSQL refuses to run as root: when the tests run as root the directory
belongs to the ``postgres`` user the package creates and the programs run through ``runuser``.

The session fixture is shared by every module that imports it (pytest would otherwise start
one server per importing module); the server is stopped and its directory removed when the
session ends, also after failures, and by a watchdog process when the test process was
killed (``timeout``, ``kill -9``). A test that stops the server should start it again;
``postgres_url`` starts it if it is down.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_binary

from support.loopback import free_port

__all__ = ["PostgresServer", "postgres_server", "postgres_url", "require_postgres"]

#: Debian's package holding the server binaries.
APT_PACKAGE = "postgresql"

#: How long ``pg_ctl`` may wait for the server to start or stop (seconds).
PG_CTL_TIMEOUT_S = 60

#: Server settings: durability is not tested here, speed and many clients are. With minimal
#: WAL, ``CREATE DATABASE ... STRATEGY = FILE_COPY`` takes ~50 ms instead of ~900 ms.
SETTINGS = ("listen_addresses=127.0.0.1", "fsync=off", "synchronous_commit=off",
            "full_page_writes=off", "max_connections=200", "wal_level=minimal",
            "max_wal_senders=0")

#: The user PostgreSQL runs as when the tests run as root (Debian's package creates it).
SERVER_USER = "postgres"


class PostgresServerError(RuntimeError):
    """initdb or pg_ctl failed; the message carries its output and the server log."""


def require_postgres() -> Path:
    """The directory of the server binaries, or end the test (``require_binary``'s policy)."""
    found = require_binary("postgres", apt=APT_PACKAGE,
                           also=sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                                       reverse=True))
    return Path(os.path.realpath(found)).parent


class PostgresServer:
    """A PostgreSQL cluster in its own directory, on ``port`` of 127.0.0.1.

    ``url(dbname)`` names a database on it (user ``postgres``, no password needed; a given
    ``password`` is put in the URL and ignored by trust authentication, for testing that
    messages hide it). ``stop()`` is a fast shutdown (open connections are cut, as when the
    server restarts), ``start()`` starts it again on the same port with the same data.
    """

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.as_root = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="vigil-pg-", dir="/tmp"))
        self.datadir = self.root / "data"
        self.log_path = self.root / "server.log"
        self.port = free_port()
        self.running = False
        self._names = itertools.count(1)
        self._lock = threading.Lock()
        if self.as_root:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._watchdog = self._start_watchdog()
        self._run("initdb", "-D", str(self.datadir), "--auth=trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8", "--locale=C")

    def _command(self, program: str, *args: str) -> list[str]:
        command = [str(self.bindir / program), *args]
        if self.as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        return command

    def _start_watchdog(self) -> subprocess.Popen[bytes]:
        """A process that stops the server and removes its directory once this one is gone,
        however it ended (``pg_ctl`` detaches the server: a killed test run would leave it
        running). It waits for the end of its stdin, which only this process holds open."""
        stop = self._command("pg_ctl", "stop", "-D", str(self.datadir), "-m", "immediate",
                             "-w", "-t", str(PG_CTL_TIMEOUT_S))
        return subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, json.dumps(stop), str(self.root)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd=self.root, start_new_session=True)

    def _run(self, program: str, *args: str) -> str:
        command = self._command(program, *args)
        # The server user may not be able to enter the current directory.
        done = subprocess.run(command, cwd=self.root, capture_output=True, text=True,
                              timeout=PG_CTL_TIMEOUT_S + 30, check=False)
        if done.returncode != 0:
            log = (self.log_path.read_text(errors="replace")[-4000:]
                   if self.log_path.exists() else "")
            raise PostgresServerError(f"{' '.join(command)} exited {done.returncode}:\n"
                                      f"{done.stdout}{done.stderr}\nserver log:\n{log}")
        return done.stdout

    def url(self, dbname: str = "postgres", *, password: str | None = None) -> str:
        """The ``postgresql://`` URL of database ``dbname`` on this server."""
        user = f"postgres:{password}" if password is not None else "postgres"
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        """Start the server (same port, same data) and wait until it accepts connections."""
        options = " ".join([f"-p {self.port}", f"-k {self.root}",
                            *(f"-c {s}" for s in SETTINGS)])
        self._run("pg_ctl", "start", "-D", str(self.datadir), "-l", str(self.log_path),
                  "-w", "-t", str(PG_CTL_TIMEOUT_S), "-o", options)
        self.running = True

    def stop(self) -> None:
        """Fast shutdown: open transactions are rolled back and clients disconnected."""
        self._run("pg_ctl", "stop", "-D", str(self.datadir), "-m", "fast", "-w",
                  "-t", str(PG_CTL_TIMEOUT_S))
        self.running = False

    def restart(self) -> None:
        """``stop()`` then ``start()``: every open connection is cut."""
        self.stop()
        self.start()

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def create_database(self) -> str:
        """A new empty database; its URL."""
        if not self.running:
            self.start()
        with self._lock:
            name = f"vigil_test_{os.getpid()}_{next(self._names)}"
        self._admin(f'CREATE DATABASE "{name}" STRATEGY = FILE_COPY')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, disconnecting whoever still uses it."""
        if not self.running:
            self.start()
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        """Stop the server (immediate shutdown) and remove its directory; idempotent."""
        if not self.root.exists():
            return
        if (self.datadir / "postmaster.pid").exists():
            with contextlib.suppress(PostgresServerError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "stop", "-D", str(self.datadir), "-m", "immediate", "-w",
                          "-t", str(PG_CTL_TIMEOUT_S))
        self.running = False
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self._watchdog.stdin.close()  # type: ignore[union-attr]
            self._watchdog.wait(PG_CTL_TIMEOUT_S)


#: The watchdog's program: argv[1] the stop command (JSON), argv[2] the directory.
_WATCHDOG = """
import json, os, shutil, subprocess, sys
sys.stdin.buffer.read()
stop, root = json.loads(sys.argv[1]), sys.argv[2]
if os.path.exists(os.path.join(root, "data", "postmaster.pid")):
    subprocess.run(stop, cwd=root, capture_output=True, timeout=90, check=False)
shutil.rmtree(root, ignore_errors=True)
"""


_SERVER: PostgresServer | None = None
_SERVER_LOCK = threading.Lock()


def _session_server() -> PostgresServer:
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None:
            server = PostgresServer(require_postgres())
            try:
                for attempt in range(3):
                    try:
                        server.start()
                        break
                    except PostgresServerError:
                        # The free port may have been taken since (tests run in parallel).
                        if attempt == 2:
                            raise
                        server.port = free_port()
            except BaseException:
                server.close()
                raise
            atexit.register(server.close)
            _SERVER = server
        return _SERVER


def _close_session_server() -> None:
    global _SERVER
    with _SERVER_LOCK:
        server, _SERVER = _SERVER, None
    if server is not None:
        server.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server, started on first use. A test that stops it should
    start it again; ``postgres_url`` starts it if an earlier test did not."""
    server = _session_server()
    yield server
    # Session-scoped finalizers run at the end of the session only, whichever module's
    # copy of this fixture finalizes first.
    _close_session_server()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a fresh empty database, dropped after the test (``WITH (FORCE)``)."""
    if not postgres_server.running:
        postgres_server.start()
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url.rsplit("/", 1)[1])

