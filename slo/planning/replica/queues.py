"""The engine's waiting queue under vLLM's two scheduling policies.

- ``fcfs``: arrival order; a preempted request goes back to the *front* (vLLM's
  ``prepend_request``), so it is resumed first.
- ``priority``: a heap ordered like vLLM's ``Request.__lt__``: lower ``priority`` value first,
  ties by arrival time, then request id. A preempted request simply re-enters the heap.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Literal

from slo.planning.replica.request import EngineRequest, RequestStatus

__all__ = ["SchedulingPolicy", "WaitingQueue"]

SchedulingPolicy = Literal["fcfs", "priority"]


class WaitingQueue:
    """Requests waiting for a place in the running batch."""

    def __init__(self, policy: SchedulingPolicy) -> None:
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"unknown scheduling policy {policy!r}")
        self.policy = policy
        self._fifo: deque[EngineRequest] = deque()
        # Heap entries are (priority, arrival, id, request); aborted requests are dropped lazily
        # when they reach the top, so _len is the true count.
        self._heap: list[tuple[int, float, str, EngineRequest]] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[EngineRequest]:
        if self.policy == "fcfs":
            return iter(self._fifo)
        return (e[3] for e in self._heap if e[3].status is RequestStatus.WAITING)

    def add(self, req: EngineRequest) -> None:
        """A new request joins the queue."""
        if self.policy == "fcfs":
            self._fifo.append(req)
        else:
            heapq.heappush(self._heap, (*req.sort_key(), req))
        self._len += 1

    def add_preempted(self, req: EngineRequest) -> None:
        """A preempted request returns: to the front under fcfs, by its key under priority."""
        if self.policy == "fcfs":
            self._fifo.appendleft(req)
            self._len += 1
        else:
            self.add(req)

    def put_back(self, reqs: list[EngineRequest]) -> None:
        """Requests taken out but not scheduled return to where they were (in order)."""
        if self.policy == "fcfs":
            self._fifo.extendleft(reversed(reqs))
            self._len += len(reqs)
        else:
            for r in reqs:
                self.add(r)

    def peek(self) -> EngineRequest | None:
        """The next request to schedule, or None."""
        if self.policy == "fcfs":
            return self._fifo[0] if self._fifo else None
        while self._heap and self._heap[0][3].status is not RequestStatus.WAITING:
            heapq.heappop(self._heap)  # aborted while waiting
        return self._heap[0][3] if self._heap else None

    def pop(self) -> EngineRequest:
        """Remove and return the next request (``peek`` must have returned one)."""
        if self.policy == "fcfs":
            req = self._fifo.popleft()
        else:
            if self.peek() is None:
                raise IndexError("pop from an empty waiting queue")
            req = heapq.heappop(self._heap)[3]
        self._len -= 1
        return req

    def remove(self, req: EngineRequest) -> None:
        """Take out a waiting request (abort). Under priority the caller marks it finished."""
        if self.policy == "fcfs":
            self._fifo.remove(req)
        self._len -= 1
