"""Which copy of `vigil serve` delivers the alerts: the leader's lease in the shared database.

With ``[serve] database`` every copy evaluates, and exactly one, the holder of the lease
``SERVE_LEASE_NAME`` (``vigil.storage.lease``), groups the alerts into the shared outbox and
delivers them. The others stand by with their evaluation warm, and try for the lease every
``tick_interval`` seconds, so one of them takes over at most ``lease_duration`` plus one tick
after the leader's last renewal when it dies (kill -9, a lost node); a leader that stops
cleanly (SIGTERM, a drained node) releases the lease and the next tick takes it.

Exactly once across a handover comes from three things together:

* the outbox and its notification log live in the shared database, so the new leader resumes
  every group where the old one left it and resends an unacknowledged notification with the
  same idempotency key;
* every write that decides what is sent (``Outbox.enqueue``, ``Outbox.begin_attempt``) checks
  the lease in its own transaction (``Lease.fence``), so a leader that lost the lease without
  knowing it (paused, cut off) cannot queue or start anything;
* an attempt starts only while the lease has at least the route's timeout left, so it has
  ended (answered or timed out) before another copy can take the lease and send it again.

A leader that cannot renew (the database is down) stops acting at its deadline, before the
lease can pass to another copy: two leaders never deliver at once.

The methods block on the database: `vigil serve` calls them on a thread of their own.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from alerts.outbox import Fence
from vigil.conventions import SERVE_LEASE_NAME
from vigil.errors import StoreError
from vigil.storage.database import open_database
from vigil.storage.lease import LEASE_SCHEMA, Lease, LeaseState

__all__ = ["Leadership", "Transition", "default_copy_name"]

log = logging.getLogger("vigil.serve.leader")

#: Longest pause between two tries for the lease (seconds); shorter leases try every third.
MAX_TICK = 1.0


def default_copy_name() -> str:
    """``host:pid``: unique among running copies, and says where a copy runs (on Kubernetes
    the host name is the pod's name)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Transition:
    """What one ``tick`` changed: ``became`` (this copy took the lead or started a new term:
    build a fresh notifier), ``lost`` (it must stop delivering now: ``reason`` says why),
    ``kept`` or ``standby`` (nothing changed)."""

    kind: str
    term: int
    reason: str = ""


class Leadership:
    """This copy's side of the lease in ``url`` (``[serve] database``): ``name`` (``[serve]
    name``, or ``default_copy_name()``), ``duration`` (``[serve] lease_duration``, seconds).
    ``monotonic``: the local clock of deadlines (injected in tests)."""

    def __init__(self, url: str, name: str, duration: float, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.name = name or default_copy_name()
        self.duration = duration
        self._monotonic = monotonic
        # The holder in the lease is the name and a random part of this process's own: two
        # copies given the same [serve] name (one config for every replica) must still be two
        # holders, or both would pass the fence.
        self.holder = f"{self.name}/{secrets.token_hex(4)}"
        # The lease thread ticks; the event loop and the HTTP thread read: one lock.
        self._lock = threading.RLock()
        # One connection is enough: a tick every second, and nothing else uses it.
        self.db = open_database(url, what="the leader's lease", schema=LEASE_SCHEMA,
                                pool_size=1)
        self.lease = Lease(self.db, SERVE_LEASE_NAME, self.holder, duration,
                           monotonic=monotonic)
        #: The term this copy leads in, or None while it stands by.
        self.term: int | None = None
        self._deadline: float | None = None
        #: The lease as last seen (None before the first tick that reached the database).
        self.seen: LeaseState | None = None
        #: Times this copy took the lead.
        self.acquisitions = 0
        #: Why the last tick failed ("" when it reached the database).
        self.last_error = ""

    @property
    def tick_interval(self) -> float:
        """Seconds between two ticks: often enough that a standby takes over within a second
        of the lease running out, and that a leader renews at least three times a lease."""
        return min(MAX_TICK, self.duration / 3.0)

    def leads(self) -> bool:
        """Whether this copy may act as leader now (it holds a term and its deadline has not
        passed); False once the deadline passes even if no tick has said so yet."""
        with self._lock:
            term, deadline = self.term, self._deadline
        return term is not None and deadline is not None and self._monotonic() < deadline

    def fence(self) -> Fence:
        """The outbox's write check for the current term (call only while leading)."""
        with self._lock:
            term = self.term
        if term is None:
            raise RuntimeError("fence() while standing by")
        return self.lease.fence(term)

    def tick(self) -> Transition:
        """Take or renew the lease once; see ``Transition`` for what the caller must do."""
        try:
            state = self.lease.acquire()
        except StoreError as exc:
            with self._lock:
                return self._failed_tick(exc)
        with self._lock:
            return self._after_tick(state)

    def _failed_tick(self, exc: StoreError) -> Transition:
        self.last_error = str(exc)
        if self.term is not None and not self.leads():
            return self._step_down(f"could not renew the lease before it ran out: {exc}")
        if self.term is not None:
            log.warning("could not renew the leader's lease (%.1f s left): %s",
                        (self._deadline or 0.0) - self._monotonic(), exc)
            return Transition("kept", self.term)
        return Transition("standby", 0)

    def _after_tick(self, state: LeaseState) -> Transition:
        self.last_error = ""
        self.seen = state
        if not state.held:
            if self.term is not None:
                return self._step_down(f"{state.holder} holds the lease (term {state.token})")
            return Transition("standby", state.token)
        self._deadline = state.deadline
        if self.term == state.token:
            return Transition("kept", state.token)
        previous = self.term
        self.term = state.token
        self.acquisitions += 1
        if previous is not None:
            log.warning("the leader's lease ran out and was taken again: term %d follows %d",
                        state.token, previous)
        return Transition("became", state.token)

    def _step_down(self, reason: str) -> Transition:
        term, self.term, self._deadline = self.term or 0, None, None
        log.error("no longer the leader (term %d): %s", term, reason)
        return Transition("lost", term, reason)

    def step_down(self, reason: str) -> Transition | None:
        """Stop leading now (a write found the lease lost, or the deadline passed before a
        tick noticed); None when not leading."""
        with self._lock:
            if self.term is None:
                return None
            return self._step_down(reason)

    def release(self, term: int | None = None) -> None:
        """Give up term ``term`` (default: the one this copy leads in), so a standby takes the
        lease at its next tick: at a clean shutdown, or after stepping down from a term this
        copy could not act in."""
        with self._lock:
            if term is None:
                term = self.term
            if term == self.term:
                self.term, self._deadline = None, None
        if term is None:
            return
        try:
            if self.lease.release(term):
                log.info("released the leader's lease (term %d)", term)
        except StoreError as exc:
            log.warning("could not release the leader's lease (it runs out by itself in "
                        "%g s): %s", self.duration, exc)

    def describe(self) -> str:
        """One line for ``/healthz`` and the log: this copy's role and the lease's holder."""
        with self._lock:
            term, seen, error = self.term, self.seen, self.last_error
        if self.leads():
            return f"leader {self.name} (term {term})"
        if seen is None or not seen.holder:
            who = "no leader seen yet"
        elif seen.remaining > 0:
            who = f"leader is {seen.holder} (term {seen.token})"
        else:
            who = f"the lease of {seen.holder} (term {seen.token}) ran out"
        why = f"; {error}" if error else ""
        return f"standby {self.name}: {who}{why}"

    def close(self) -> None:
        self.db.close()
