"""Run an ``Engine`` in real time on the asyncio event loop, for the HTTP layer.

One task per replica loops: schedule a step, sleep for the step's modelled duration, apply its
results. HTTP handlers hold a ``RequestHandle``; the runner wakes a handle once per engine step
for streaming requests and only when it finishes for non-streaming ones, so a replica costs one
wake-up per step plus one per streaming request and step, never one per token or per thread.
When nothing is queued the task sleeps on an event until a request arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from slo.planning.replica.engine import Engine, StepPlan
from slo.planning.replica.request import EngineRequest, FinishReason
from slo.planning.replica.text import Prompt
from vigil.clock import Clock, system_clock

__all__ = ["Delta", "EngineRunner", "EngineStopped", "RequestHandle"]

log = logging.getLogger(__name__)

#: A step that starts within this many seconds of the previous one's end is back to back: the
#: GPU would have started it right at that end, so the event loop's own latency is not added.
_BACK_TO_BACK_S = 0.05


class EngineStopped(Exception):
    """The engine stopped (replica restart or shutdown) before the request finished."""


@dataclass(frozen=True, slots=True)
class Delta:
    """Tokens ``start`` to ``stop`` (exclusive) of a request's output, delivered together."""

    start: int
    stop: int
    finished: bool
    finish_reason: FinishReason | None


class RequestHandle:
    """An HTTP handler's view of one engine request."""

    def __init__(self, req: EngineRequest, *, stream: bool) -> None:
        self.req = req
        self.stream = stream
        self._event = asyncio.Event()
        self._sent = 0
        self._error: str | None = None

    @property
    def request_id(self) -> str:
        return self.req.request_id

    def notify(self) -> None:
        self._event.set()

    def fail(self, message: str) -> None:
        self._error = message
        self._event.set()

    async def deltas(self) -> AsyncIterator[Delta]:
        """New output as steps produce it (several tokens per delta if the consumer lags)."""
        while True:
            await self._event.wait()
            self._event.clear()
            if self._error is not None:
                raise EngineStopped(self._error)
            n = self.req.num_generated
            done = self.req.finished
            if n > self._sent or done:
                delta = Delta(self._sent, n, done, self.req.finish_reason if done else None)
                self._sent = n
                yield delta
                if done:
                    return

    async def wait(self) -> EngineRequest:
        """Wait until the request finishes; returns its final state."""
        while not self.req.finished:
            await self._event.wait()
            self._event.clear()
            if self._error is not None:
                raise EngineStopped(self._error)
        return self.req


class EngineRunner:
    """Drives one ``Engine`` in real time. ``on_step(plan, end)`` sees every completed step."""

    def __init__(self, engine: Engine, *, clock: Clock = system_clock,
                 on_step: Callable[[StepPlan, float], None] | None = None) -> None:
        self.engine = engine
        self._clock = clock
        self._on_step = on_step
        self._handles: dict[str, RequestHandle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_end: float | None = None  # modelled end of the previous step (seconds)
        self._last_add = float("-inf")  # arrival time of the newest request (seconds)

    @property
    def num_unfinished(self) -> int:
        return len(self.engine.requests)

    def add(self, request_id: str, prompt: Prompt, *, stream: bool, max_tokens: int,
            min_tokens: int = 0, ignore_eos: bool = False, seed: int | None = None,
            priority: int = 0, lora_name: str | None = None) -> RequestHandle:
        """Queue a request now; the handle reports its output."""
        now = self._clock()
        self._last_add = max(self._last_add, now)
        req = self.engine.add_request(request_id, prompt, max_tokens=max_tokens,
                                      now=now, min_tokens=min_tokens,
                                      ignore_eos=ignore_eos, seed=seed, priority=priority,
                                      lora_name=lora_name)
        handle = RequestHandle(req, stream=stream)
        self._handles[request_id] = handle
        self._wake.set()
        return handle

    def abort(self, request_id: str) -> bool:
        """Abort at once (client gone): frees its KV blocks and its place in the batch."""
        self._handles.pop(request_id, None)
        return self.engine.abort(request_id)

    def fail(self, request_id: str) -> bool:
        """Finish a request with reason ``error`` now (``Engine.fail``); its handler answers
        as vLLM does: a 500, or an error event inside a stream that has sent its 200."""
        if not self.engine.fail(request_id, self._clock()):
            return False
        handle = self._handles.pop(request_id, None)
        if handle is not None:
            handle.notify()
        return True

    def start(self) -> None:
        """Start the engine loop on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(),
                                                                 name="sim-engine-loop")

    async def stop(self, reason: str = "the engine was stopped") -> None:
        """Stop the loop; unfinished requests are aborted and their handlers get ``reason``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        for handle in self._handles.values():
            handle.fail(reason)
        self._handles.clear()
        self.engine.abort_all()

    async def _loop(self) -> None:
        while True:
            if not self.engine.has_unfinished:
                self._last_end = None
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not leave every client hanging
                log.exception("simulated engine step failed; aborting in-flight requests")
                self._fail_all("internal error in the simulated engine")

    async def _step(self) -> None:
        now = self._clock()
        start = now
        if self._last_end is not None and now - self._last_end < _BACK_TO_BACK_S:
            # Keep the modelled GPU timeline: this step began when the last one ended (or when
            # the newest request arrived, if later), not after the loop's wake-up latency.
            start = max(self._last_end, self._last_add)
        plan = self.engine.schedule(start)
        if plan is None:  # nothing runnable right now: wait for a change, briefly
            self._last_end = None
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.05)
            return
        end = start + plan.duration
        try:
            await asyncio.sleep(max(0.0, end - self._clock()))
        finally:
            # Even when cancelled mid-step, leave the engine consistent for abort_all().
            outputs = self.engine.complete(plan, end)
            self._last_end = end
        if self._on_step is not None:
            self._on_step(plan, end)
        for out in outputs:
            handle = self._handles.get(out.req.request_id)
            if handle is None:
                continue
            if out.finished:
                del self._handles[out.req.request_id]
                handle.notify()
            elif handle.stream:
                handle.notify()
