"""A store history with a known daily traffic shape, for the forecast and plan tests."""

from __future__ import annotations

from collections.abc import Callable

from collector.store import Store
from slo.planning.forecast import (
    SECONDS_PER_DAY,
)
from support.fleet import Fleet

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


#: Midnight UTC, so that the 24-hour periods before it are calendar days.
AT = 20776 * SECONDS_PER_DAY


SAMPLE_S = 300


def base_rate(hour: int) -> float:
    """Requests/s at each hour of the day: a night trough, a morning ramp, an afternoon peak."""
    return 2.0 if hour < 6 else 4.0 + hour if hour < 18 else 6.0


def write_history(store: Store, days: int, rate: Callable[[int, int], float],
                  skip: Callable[[float], bool] = lambda _t: False) -> None:
    """``vllm:request_success_total`` of one replica every ``SAMPLE_S`` over ``days`` days
    before ``AT``, growing at ``rate(day, hour)`` requests/s."""
    fleet = Fleet(store, span_s=days * SECONDS_PER_DAY, step_s=SAMPLE_S, at=AT)
    start = AT - days * SECONDS_PER_DAY
    times = [start + k * SAMPLE_S for k in range(fleet.steps)]
    # The increment since the previous sample belongs to the step it ends in.
    increments = [0.0] + [
        rate(int((t0 - start) // SECONDS_PER_DAY), int((t0 % SECONDS_PER_DAY) // 3600))
        * SAMPLE_S for t0 in times[:-1]]
    labels = {"pool": "chat", "kind": "vllm", "instance": "chat-0", "model_name": MODEL,
              "finished_reason": "stop"}
    # Far from 0: no extrapolation towards a counter start.
    fleet.running_total("vllm:request_success_total", labels, increments, start=1e6,
                        steps=[k for k, t in enumerate(times) if not skip(t)])
    fleet.flush()
