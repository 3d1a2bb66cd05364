"""Child processes that never outlive the command that started them.

Every long-running child (``vigil demo``'s fleet, gateway, serve and load; ``vigil dashboard``'s
Streamlit server) is started here, the same way:

* in its own session, so a terminal's Ctrl-C or hang-up reaches only the parent, which stops
  its children in the order it chooses (``stop``);
* with ``PR_SET_PDEATHSIG`` (Linux): should the parent die without stopping them (``kill -9``),
  the kernel sends each child SIGTERM.

``stop_signals`` turns SIGINT, SIGTERM and SIGHUP into a flag the parent's loop watches.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "STOP_SIGNALS",
    "StopRequest",
    "die_with_parent",
    "port_free",
    "spawn",
    "stop",
    "stop_signals",
]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
#: The signals that stop a parent and its children; SIGHUP too: closing the terminal must stop
#: the children, not orphan them.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the parent dies, however it dies (Linux)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
          **popen_kwargs: object) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a session of its own that dies with this process (see the module)."""
    # ignore: Popen's overloads pick the output type from text/encoding keywords, which
    # **popen_kwargs hides; callers never pass them, so the pipes are bytes.
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        list(cmd), env=env, start_new_session=True, preexec_fn=die_with_parent,
        **popen_kwargs)


def stop(procs: Sequence[tuple[str, subprocess.Popen[bytes]]], grace: float = 10.0, *,
         say: Callable[[str], None] | None = None) -> None:
    """SIGTERM each child's process group in order and wait up to ``grace`` seconds for it;
    SIGKILL whatever still runs after that. ``say`` hears about each child killed."""
    for _, p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    for name, p in procs:
        if p.poll() is None:
            if say is not None:
                say(f"{name} did not stop in {grace:.0f}s; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@dataclass
class StopRequest:
    """Set by ``stop_signals``' handler: ``signum`` is the first stop signal received."""

    signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None


@contextlib.contextmanager
def stop_signals(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[StopRequest]:
    """While inside: each of ``signals`` sets the yielded ``StopRequest`` instead of killing
    the process; the previous handlers come back on exit. Main thread only."""
    request = StopRequest()

    def handler(signum: int, frame: object) -> None:
        if request.signum is None:
            request.signum = signum

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield request
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be bound on ``host`` now: a server child that is gone no longer
    holds it (``SO_REUSEADDR``, so its TIME_WAIT connections do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
