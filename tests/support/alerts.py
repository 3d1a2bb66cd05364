"""Shared helpers of the alert tests (no tests here): a recording webhook receiver on
127.0.0.1 (``helpers.LoopbackServer``), alert and config builders."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from alerts.model import Alert
from support.loopback import LoopbackServer, Request, serve_http
from vigil.config import Config, parse_config

__all__ = ["T0", "Behaviour", "HoldFirstOfEach", "Receiver", "Request", "alert", "config", "ok",
           "receiver", "route"]

T0 = 1_795_000_000.0

#: Decides the answer to a request: (status, body). Runs on the server's thread; may block.
Behaviour = Callable[[Request], tuple[int, bytes]]


def ok(_: Request) -> tuple[int, bytes]:
    return 200, b"ok"


class HoldFirstOfEach:
    """A receiver's behaviour for killing a sender mid-delivery: while ``holding`` is set, the
    first request of every idempotency key is held (read, then no answer until ``release``
    is set or ``hold_s`` passes, and then never a 2xx: nobody was told it arrived); every
    other request gets 200. ``held`` lists the held requests; ``held_one`` is set at the
    first."""

    def __init__(self, hold_s: float = 30.0) -> None:
        self.hold_s = hold_s
        self.holding = threading.Event()
        self.holding.set()
        self.release = threading.Event()
        self.held: list[Request] = []
        self.held_one = threading.Event()
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    def __call__(self, req: Request) -> tuple[int, bytes]:
        with self._lock:
            first = req.key not in self._seen
            self._seen.add(req.key)
        if first and self.holding.is_set():
            self.held.append(req)
            self.held_one.set()
            self.release.wait(self.hold_s)  # the sender is dead by then: this goes nowhere
            return 503, b"held"
        return 200, b"ok"

    def answer_from_now_on(self) -> None:
        """Stop holding, and let go of what is held."""
        self.holding.clear()
        self.release.set()


class Receiver:
    """A webhook receiver: records every request; ``behaviour`` answers it (200 by default)
    and may be replaced while it runs. ``url`` ends with ``/hook``."""

    def __init__(self, server: LoopbackServer, behaviour: Behaviour = ok) -> None:
        self.server = server
        self.behaviour = behaviour
        self.url = server.url + "/hook"
        server.respond = self._answer

    def _answer(self, req: Request) -> tuple[int, str, bytes]:
        status, body = self.behaviour(req)
        return status, "text/plain", body

    @property
    def requests(self) -> list[Request]:
        """Every request so far, in arrival order (the live list: read it under ``lock``
        while deliveries run)."""
        return self.server.requests

    @property
    def lock(self) -> threading.Lock:
        return self.server.lock

    def accepted(self) -> list[Request]:
        """The requests answered 2xx, in arrival order."""
        return [r for r in self.server.recorded() if 200 <= r.status < 300]

    def deduped(self) -> list[Request]:
        """What a receiver that drops repeated idempotency keys would process: the first
        accepted request of each key."""
        seen: set[str] = set()
        out = []
        for r in self.accepted():
            if r.key not in seen:
                seen.add(r.key)
                out.append(r)
        return out


@contextmanager
def receiver(behaviour: Behaviour = ok) -> Iterator[Receiver]:
    """A recording receiver on a free loopback port; yields it (``.url`` ends with /hook)."""
    with serve_http() as server:
        yield Receiver(server, behaviour)


def alert(name: str = "SLOBurnRate", *, pool: str = "chat", slo: str = "chat-ttft",
          severity: str = "page", model: str = "llama", starts_at: float = T0,
          ends_at: float | None = None, **extra: str) -> Alert:
    """An alert with the five standard labels (plus ``extra``)."""
    return Alert(
        labels={"alertname": name, "pool": pool, "slo": slo, "severity": severity,
                "model": model, **extra},
        annotations={"summary": f"{name} on {pool}/{slo}",
                     "description": f"{slo}: burn rate 14.4 over 1h and 5m",
                     "dashboard_url": f"http://127.0.0.1:8501/?pool={pool}"},
        starts_at=starts_at, ends_at=ends_at,
        generator_url=f"http://127.0.0.1:8501/slo?pool={pool}&slo={slo}",
    )


def config(*routes: dict[str, Any], **alerts: Any) -> Config:
    """A Config with these ``[[alerts.routes]]`` tables and ``[alerts]`` keys."""
    return parse_config({"alerts": {**alerts, "routes": list(routes)}})


def route(url: str, name: str = "hook", **kw: Any) -> dict[str, Any]:
    """A route table with short timers (seconds) unless overridden."""
    base: dict[str, Any] = {"name": name, "url": url, "group_wait": 30, "group_interval": 300,
                            "repeat_interval": 3600, "timeout": 5}
    return {**base, **kw}
