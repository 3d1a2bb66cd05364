"""Whether two computations of the same numbers agree: the engine against Prometheus, the
store's fast path against reading every sample, a replay against the original.

``same_numbers`` compares numbers anywhere inside dicts and lists (a PromQL vector keyed by
labels, a ``vigil slo status`` document): the same keys, the same lengths, numbers within a
``Tolerance`` of each other, NaN the same as NaN, everything else equal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["EXACT", "PROMETHEUS", "Tolerance", "assert_same_numbers", "number_difference",
           "same_numbers"]


class Tolerance(NamedTuple):
    """How far apart two numbers may be (``math.isclose``'s ``rel_tol`` and ``abs_tol``)."""

    rel: float
    abs: float


#: Two evaluations of the same formula in different code (Go's and ours): float rounding
#: apart, a few units in the last place.
PROMETHEUS = Tolerance(1e-9, 1e-12)
#: The same float (``==``; NaN the same as NaN).
EXACT = Tolerance(0.0, 0.0)


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def number_difference(a: Any, b: Any, tolerance: Tolerance = PROMETHEUS,
                      path: str = "") -> str | None:
    """Where ``a`` and ``b`` first differ, as ``path`` (``.key``, ``[i]``) and the two values;
    ``None`` when they agree (see the module docstring)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            return f"{path}: keys {sorted(a, key=repr)} != {sorted(b, key=repr)}"
        for k in a:
            found = number_difference(a[k], b[k], tolerance, f"{path}.{k}")
            if found is not None:
                return found
        return None
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = number_difference(x, y, tolerance, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if _number(a) and _number(b):
        if math.isnan(a) or math.isnan(b):
            same = math.isnan(a) and math.isnan(b)
        else:
            same = math.isclose(a, b, rel_tol=tolerance.rel, abs_tol=tolerance.abs)
    else:
        same = a == b
    return None if same else f"{path}: {a!r} != {b!r}"


def same_numbers(a: Any, b: Any, tolerance: Tolerance = PROMETHEUS) -> bool:
    """``a`` and ``b`` agree to ``tolerance`` (see the module docstring)."""
    return number_difference(a, b, tolerance) is None


def assert_same_numbers(ours: Any, theirs: Any, what: object = "",
                        tolerance: Tolerance = PROMETHEUS) -> None:
    """``same_numbers``, failing with ``what`` and the first difference."""
    found = number_difference(ours, theirs, tolerance)
    assert found is None, (what, found)
