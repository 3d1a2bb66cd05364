"""Go's float64 arithmetic where Python's differs: division by zero and rounding.

Python raises ``ZeroDivisionError`` on ``x / 0.0``; Go (IEEE-754) answers ±Inf or NaN, and
PromQL results depend on that (e.g. ``histogram_quantile(0, ...)`` with an empty lowest bucket
is ``0/0 = NaN``). Python's ``round`` is half-to-even; Go's ``math.Round`` is half away from
zero. Everything else (``+ - * /`` on finite non-zero operands) is the same IEEE operation in
both languages, which is why we can be bit-exact.
"""

from __future__ import annotations

import math

__all__ = ["go_div", "go_round"]


def go_div(a: float, b: float) -> float:
    """``a / b`` with IEEE-754 results for a zero divisor: ±Inf, or NaN for 0/0 and NaN/0."""
    try:
        return a / b
    except ZeroDivisionError:
        if math.isnan(a) or a == 0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def go_round(x: float) -> float:
    """Go's ``math.Round``: half away from zero (Python's ``round`` is half to even)."""
    if math.isnan(x) or math.isinf(x):
        return x
    a = abs(x)
    r = float(math.floor(a))
    # a - floor(a) is exact for every float, so the tie test is exact too.
    if a - r >= 0.5:
        r += 1.0
    return math.copysign(r, x)
