"""A store history with a known daily traffic shape, for the forecast and plan tests."""

from __future__ import annotations

from collections.abc import Callable

from collector.store import Store
from slo.planning.forecast import (
    SECONDS_PER_DAY,
)
from vigil.model import SeriesKey, labels_of

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
    key = SeriesKey("vllm:request_success_total", labels_of({
        "pool": "chat", "kind": "vllm", "instance": "chat-0", "model_name": MODEL,
        "finished_reason": "stop"}))
    start = AT - days * SECONDS_PER_DAY
    value = 1e6  # far from 0: no extrapolation towards a counter start
    rows = []
    n = int(days * SECONDS_PER_DAY // SAMPLE_S)
    for k in range(n + 1):
        t = start + k * SAMPLE_S
        if k:
            # The increment since the previous sample belongs to the step it ends in.
            t0 = t - SAMPLE_S
            day = int((t0 - start) // SECONDS_PER_DAY)
            hour = int((t0 % SECONDS_PER_DAY) // 3600)
            value += rate(day, hour) * SAMPLE_S
        if not skip(t):
            rows.append((key, "counter", round(t * 1000), value))
    store.write(rows)
