"""Request outcomes for the capacity search's tests: one that met the SLOs, one that failed."""

from __future__ import annotations

from slo.planning.capacity_search import (
    RequestOutcome,
)


def ok(e2e: float = 0.5, ttft: float | None = 0.1, tokens: int = 10) -> RequestOutcome:
    return RequestOutcome(True, ttft, e2e, 0.02, tokens)


FAILED = RequestOutcome(False, None, None, None, 0)
