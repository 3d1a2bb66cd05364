"""From burn-rate tracks to what an on-call engineer would have lived through: when each
severity of ``ErrorBudgetBurn`` fired, and the stretches of fast burn that nothing caught.

Pure functions over numpy arrays; times are indices into the backtest's ``Grid`` here and are
turned into seconds by ``slo.backtest.run``.

* **Firing** (``firing``): at an instant, a row of the alert table fires when the burn rate
  over its long AND its short window is strictly above the row's factor, a window without
  data never firing — ``slo.objectives.burn_rate.firing_alerts`` at every instant, which is
  what the generated rule (no ``for``) evaluates to there.
* **Spans** (``runs``): maximal runs of consecutive firing instants; an alert starts at the
  first and resolves at the first instant after the run (Prometheus's resolved time).
* **Onset** (``onset``): the first instant of the latest run, at or before the alert's start,
  in which the burn rate over the table's shortest window stayed above the factor of the row
  that fired: when the budget began to burn faster than that alert's threshold. The
  detection delay is the alert's start minus it.
* **Fast burns** (``burn_runs``): runs of instants where the shortest window burned faster
  than 1 (the whole budget spent over the period) with no severity firing, runs closer than
  ``merge`` instants joined into one.
"""

from __future__ import annotations

import numpy as np

from slo.promql.lookup import BoolArray, FloatArray

__all__ = ["burn_runs", "onset", "row_firing", "runs"]


def row_firing(long_burn: FloatArray, short_burn: FloatArray, factor: float) -> BoolArray:
    """Where a row fires: both burn rates strictly above ``factor`` (NaN, i.e. no data,
    never fires)."""
    with np.errstate(invalid="ignore"):
        return (long_burn > factor) & (short_burn > factor)


def runs(mask: BoolArray) -> list[tuple[int, int]]:
    """``(first, stop)`` index pairs of the maximal runs of True (``stop`` exclusive)."""
    padded = np.concatenate(([False], mask.astype(np.bool_), [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def onset(base_burn: FloatArray, factor: float, start: int, earliest: int) -> int | None:
    """The first index of the latest run of ``base_burn > factor`` that begins at or after
    ``earliest`` and at or before ``start``; ``None`` when there is none (the alert fired on
    a burn its shortest window never saw above the factor)."""
    with np.errstate(invalid="ignore"):
        above = base_burn[earliest:start + 1] > factor
    if not above.any():
        return None
    last = int(np.flatnonzero(above)[-1])
    before = np.flatnonzero(~above[:last])
    first = int(before[-1]) + 1 if before.size else 0
    return earliest + first


def burn_runs(base_burn: FloatArray, quiet: BoolArray, merge: int) -> list[tuple[int, int]]:
    """Runs where the budget burned faster than the period allows (``base_burn > 1``) while
    ``quiet`` (no alert firing), runs separated by fewer than ``merge`` quiet instants
    joined."""
    with np.errstate(invalid="ignore"):
        fast = (base_burn > 1.0) & quiet
    joined: list[tuple[int, int]] = []
    for a, b in runs(fast):
        if joined and a - joined[-1][1] < merge and quiet[joined[-1][1]:a].all():
            joined[-1] = (joined[-1][0], b)
        else:
            joined.append((a, b))
    return joined
