"""Shared helpers of the alert tests (no tests here): a recording webhook receiver on
127.0.0.1, alert and config builders."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from alerts.model import Alert
from vigil.config import Config, parse_config

T0 = 1_795_000_000.0


@dataclass
class Request:
    """One request the receiver got, and what it answered (headers keyed lower-case)."""

    path: str
    headers: dict[str, str]
    body: bytes
    status: int = 0

    @property
    def key(self) -> str:
        return self.headers.get("idempotency-key", "")

    @property
    def attempt(self) -> int:
        return int(self.headers.get("x-vigil-attempt", "0"))

    def json(self) -> Any:
        return json.loads(self.body)


#: Decides the answer to a request: (status, body). Runs on the server's thread; may block.
Behaviour = Callable[[Request], tuple[int, bytes]]


def ok(_: Request) -> tuple[int, bytes]:
    return 200, b"ok"


@dataclass
class Receiver:
    """Records every POST; ``behaviour`` answers it (200 by default)."""

    url: str
    behaviour: Behaviour = ok
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def accepted(self) -> list[Request]:
        """The requests answered 2xx, in arrival order."""
        with self.lock:
            return [r for r in self.requests if 200 <= r.status < 300]

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
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            rec = state["r"]
            req = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            with rec.lock:
                rec.requests.append(req)
            status, answer = rec.behaviour(req)
            req.status = status
            try:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state["r"] = Receiver(f"http://127.0.0.1:{server.server_address[1]}/hook", behaviour)
    # A short poll interval: shutdown() waits for it.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield state["r"]
    finally:
        server.shutdown()
        server.server_close()


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
