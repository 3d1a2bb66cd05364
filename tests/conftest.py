"""What the whole suite shares: one policy for external programs, one loopback HTTP server.

External programs (``prometheus``, ``promtool``, ``prometheus-alertmanager``, ``chromium``)
are found by ``require_binary``. Where one is missing the test is skipped with the command that
installs it, except under CI (``CI`` set to ``true``, ``1`` or ``yes``): there a missing
program is a broken environment, and the test fails with the same command. Either way the
session summary ends with a line naming every program that was missing.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import settings
from support.loopback import LoopbackServer

from serving.sim.testing import PORTS_ENV

__all__ = ["in_ci", "require_binary"]

# No per-example deadline: the parallel part shares two cores with the image build and the
# vLLM venv's install, so an example's wall time says nothing about the code; speed is the
# benchmarks' business (bench/), never a test's. A test may still set its own deadline.
settings.register_profile("vigil", deadline=None)
settings.load_profile("vigil")

#: program name -> the command that installs it, for every program a test asked for in vain.
_MISSING: dict[str, str] = {}


def in_ci() -> bool:
    """Whether ``CI`` is set to a true value (``true``, ``1``, ``yes``; any case)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_binary(name: str, *, apt: str | None = None, also: Sequence[str] = ()) -> str:
    """The path of the program ``name`` (searched on ``PATH``, then ``also``: other names or
    absolute paths), or end the test: fail under CI, skip elsewhere, both with the
    ``apt-get install`` command of Debian's package ``apt`` (default: ``name``)."""
    for candidate in (name, *also):
        found = shutil.which(candidate)
        if found is not None:
            return found
    install = f"apt-get install {apt or name}"
    _MISSING[name] = install
    message = f"{name} is not installed ({install})"
    if in_ci():
        pytest.fail(f"{message}; CI must run this test", pytrace=False)
    pytest.skip(message)


#: The session's cache folder and the ``XDG_CACHE_HOME`` it replaced.
_CACHE_KEY = pytest.StashKey[tuple[str | None, str | None]]()


def pytest_configure(config: pytest.Config) -> None:
    """Point the user cache directory (``XDG_CACHE_HOME``) at a fresh folder for the session.

    The semantic cache exports its embedding model to ONNX under the user's cache directory on
    first use; the tests (and the gateways they start, which inherit the environment) must
    neither write into the developer's home nor depend on an export left there earlier.
    """
    folder = tempfile.mkdtemp(prefix="vigil-test-cache-")
    config.stash[_CACHE_KEY] = (folder, os.environ.get("XDG_CACHE_HOME"))
    os.environ["XDG_CACHE_HOME"] = folder
    if "PYTEST_XDIST_WORKER" in os.environ:
        # A worker inherits the controller's environment, so its own slice must replace it.
        os.environ[PORTS_ENV] = worker_ports()
    else:
        os.environ.setdefault(PORTS_ENV, worker_ports())


#: The ports the tests' servers use (``serving.sim.testing.PORTS_ENV``): below the kernel's
#: ephemeral range, where no outgoing connection's local port can fall, cut into one slice per
#: pytest-xdist worker so that no two workers hand out the same port.
TEST_PORTS = (12000, 31999)
PORTS_PER_WORKER = 2000


def worker_ports() -> str:
    """This process's slice of ``TEST_PORTS`` as ``low-high`` (worker ``gwN``, N-th slice)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(name[2:]) if name[:2] == "gw" and name[2:].isdigit() else 0
    slices = (TEST_PORTS[1] - TEST_PORTS[0] + 1) // PORTS_PER_WORKER
    low = TEST_PORTS[0] + (index % slices) * PORTS_PER_WORKER
    return f"{low}-{low + PORTS_PER_WORKER - 1}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a ``slow`` test first, each module's tests kept together and in order.

    pytest-xdist hands whole modules to the workers in this order (``--dist loadscope``), so
    the long ones start while every worker is still busy rather than last, when one worker
    would run on alone: the longest-first rule of scheduling."""
    slow = {item.module for item in items
            if item.module is not None and item.get_closest_marker("slow") is not None}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (item.module not in slow, order[id(item)]))


def pytest_unconfigure(config: pytest.Config) -> None:
    folder, before = config.stash.get(_CACHE_KEY, (None, None))
    if folder is None:
        return
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before
    shutil.rmtree(folder, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line naming the programs tests were skipped (or failed) for lack of."""
    if _MISSING:
        what = ", ".join(f"{name} ({install})" for name, install in sorted(_MISSING.items()))
        verb = "failed" if in_ci() else "skipped"
        terminalreporter.write_line(f"{verb} for lack of: {what}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A failed test that used a real vLLM server gets the tail of the server's log in its
    report, and the whole log is kept in ``tests/artifacts/``."""
    outcome = yield
    real_vllm = sys.modules.get("support.real_vllm")
    if real_vllm is not None and item.get_closest_marker("real_vllm") is not None:
        real_vllm.report_logs(item, outcome.get_result())


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the real vLLM servers the session started (they take a minute to start, so they
    live for the whole session)."""
    real_vllm = sys.modules.get("support.real_vllm")
    if real_vllm is not None:
        real_vllm.FLEET.close()


@pytest.fixture
def http_server() -> Iterator[LoopbackServer]:
    """A started loopback HTTP server answering 200 with an empty body until the test sets
    its ``respond``; it records every request and is shut down at teardown."""
    with LoopbackServer() as server:
        yield server


# The PostgreSQL fixtures (``postgres_server``, ``postgres_url``) and an event loop in a thread
# (``loop``) for every module, so a test names them as parameters without importing them;
# imported last, since those modules use ``require_binary`` above.
from support.batch import loop  # noqa: E402, F401
from support.postgres import postgres_server, postgres_url  # noqa: E402, F401
