"""PromQL's ``increase`` and ``rate`` written in MetricsQL: what Vigil sends to VictoriaMetrics
(``[engine] dialect = "metricsql"``), and what the rules vmalert evaluates there compute.

MetricsQL's own ``increase(x[w])`` is not PromQL's: it takes the last sample *before* the
window as its starting point and never extrapolates (app/vmselect/promql/rollup.go
``rollupDelta``), so on the same samples it answers another number (tens of percent on
these tests' counters: docs/prometheus-rules.md, "VictoriaMetrics: how far MetricsQL lands
from PromQL"). ``increase_prometheus(x[w])``
(``rollupDeltaPrometheus``) is closer, ``last - first`` of the counter-reset-corrected
samples inside the window, but it does not extrapolate either.

PromQL's value is ``extrapolatedRate`` (Prometheus promql/functions.go; Vigil's bit-exact copy
is ``slo.promql.rate``). For the samples ``(t_i, v_i)``, ``i = 1..n``, ``n >= 2``, that the
range selector sees at evaluation time ``T`` with range ``w`` (seconds)::

    R        = v_n - v_1 + sum of v_{i-1} over the drops v_i < v_{i-1}   (counter resets)
    sampled  = t_n - t_1
    avg      = sampled / (n - 1)                 (the mean spacing)
    dStart   = t_1 - (T - w),  dEnd = T - t_n    (gaps to the window's edges)
    dZero    = sampled * (v_1 / R)               (back to where the counter was 0;
                                                  only when R > 0 and v_1 >= 0)
    a gap under 1.1 * avg is extrapolated over in full, a longer one by avg / 2
    increase = R * (sampled + dStart' + dEnd') / sampled;  rate = increase / w

Prometheus 2.42 caps ``dStart`` at ``dZero`` *before* the 1.1 test, Prometheus 3 after it
(prometheus#13725), and 2.42's range is left-closed ``[T - w, T]`` where 3's (and MetricsQL's)
is left-open ``(T - w, T]``; ``semantics`` picks one. Every term exists in MetricsQL over the
same window: ``R`` is ``increase_prometheus``, ``n`` ``count_over_time``, ``t_1``/``t_n``
``tfirst_over_time``/``tlast_over_time`` (seconds), ``v_1`` ``first_over_time``, ``T``
``time()``. A choice "a if a < b else c" between vectors with the same labels is
``(a < b) or c``. 2.42's closed left edge is a window one millisecond longer (timestamps are
whole milliseconds) with ``T - w`` still taken from ``w``.

What cannot be reproduced: VictoriaMetrics' ``removeCounterResets`` corrects a counter drop
of less than 1/8 of the value before it as a *partial reset* (it adds the drop back, in
app/vmselect/promql/rollup.go) where PromQL adds the whole value before the drop, so ``R`` over
a window holding such a drop is short by the value after it; releases after 1.79 also restart
the correction after a gap longer than the staleness interval. Timestamps reach MetricsQL as float
seconds (about 1e-7 s of rounding at today's epoch), so the factor agrees to ~1e-9 relative,
not to the bit.
"""

from __future__ import annotations

import re

from slo.promql.lookup import Semantics, SemanticsLike, semantics_of

__all__ = ["increase_template", "metricsql_increase", "metricsql_rate", "with_templates"]


def _num(value: float) -> str:
    """A MetricsQL number literal that parses back to ``value`` (shortest round-trip)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _pick_below(value: str, bound: str, otherwise: str) -> str:
    """``value`` where ``value < bound``, else ``otherwise`` (vectors with equal labels)."""
    return f"(({value}) < ({bound}) or ({otherwise}))"


def _cap_at_zero_point(start: str, zero: str) -> str:
    """``min(start, zero)`` where ``zero`` is a valid zero point (``>= 0``; NaN and +Inf, from
    ``R == 0``, are not below anything), else ``start``."""
    return f"((({zero}) >= 0) < ({start}) or ({start}))"


def metricsql_increase(selector: str, window_s: float,
                       semantics: SemanticsLike = Semantics.V3) -> str:
    """A MetricsQL expression equal to PromQL's ``increase(<selector>[window_s])``.

    ``selector``: a series selector (``metric{label="value"}``), inserted as written;
    ``window_s``: the range in seconds (whole milliseconds); ``semantics``: ``"3"`` for
    Prometheus 3.x, ``"2"`` for 2.42. The result is per series, without ``__name__``, in the
    counter's unit; series with fewer than two samples in the window are absent, as in PromQL.
    See the module docstring for the formula and what stays different.
    """
    sem = semantics_of(semantics)
    window_ms = round(window_s * 1000)
    if window_ms <= 0 or abs(window_ms - window_s * 1000) > 1e-6:
        raise ValueError(f"window must be a positive whole number of ms, not {window_s!r} s")
    # Prometheus 2.42 selects [T - w, T]; MetricsQL (T - w', T]. Timestamps are whole ms, so
    # one more millisecond of window is the closed left edge.
    selected = f"{selector}[{window_ms + (1 if sem is Semantics.V2 else 0)}ms]"
    w = _num(window_ms / 1000)

    increase = f"increase_prometheus({selected})"
    first_t = f"tfirst_over_time({selected})"
    last_t = f"tlast_over_time({selected})"
    sampled = f"({last_t} - {first_t})"
    average = f"({sampled} / (count_over_time({selected}) - 1))"
    threshold = f"({average} * 1.1)"
    half = f"({average} / 2)"
    to_start = f"({first_t} - (time() - {w}))"
    to_end = f"(time() - {last_t})"
    # sampledInterval * (first / result): the same order of operations as Prometheus.
    to_zero = f"({sampled} * (first_over_time({selected}) / {increase}))"

    if sem is Semantics.V2:
        start = _pick_below(_cap_at_zero_point(to_start, to_zero), threshold, half)
    else:
        start = _cap_at_zero_point(_pick_below(to_start, threshold, half), to_zero)
    end = _pick_below(to_end, threshold, half)
    factor = f"(({sampled} + {start} + {end}) / {sampled})"
    return f"({increase} * {factor})"


def metricsql_rate(selector: str, window_s: float,
                   semantics: SemanticsLike = Semantics.V3) -> str:
    """A MetricsQL expression equal to PromQL's ``rate(<selector>[window_s])``: the increase
    of ``metricsql_increase`` per second of the range (per second, the counter's unit / s)."""
    return f"({metricsql_increase(selector, window_s, semantics)} / {_num(window_s)})"


#: A call of an ``increase_template``: its name carries the window (ms) and the rules.
_TEMPLATE_CALL = re.compile(r"\bpromql_increase_(\d+)ms(_v2)?\(")


def increase_template(window_s: float, semantics: SemanticsLike = Semantics.V3) -> str:
    """The name of the MetricsQL ``WITH`` template ``name(series)`` that equals PromQL's
    ``increase(series[window_s])`` (``with_templates`` defines it): a rule that sums a dozen
    increases over one window then spells the long expression once, and stays under
    VictoriaMetrics' default ``-search.maxQueryLen`` (16 KiB)."""
    sem = semantics_of(semantics)
    window_ms = round(window_s * 1000)
    return f"promql_increase_{window_ms}ms{'_v2' if sem is Semantics.V2 else ''}"


def with_templates(expr: str) -> str:
    """``expr`` preceded by a ``WITH`` clause defining every ``increase_template`` it calls
    (unchanged when it calls none)."""
    used = sorted({(int(ms), bool(v2)) for ms, v2 in _TEMPLATE_CALL.findall(expr)})
    if not used:
        return expr
    definitions = []
    for ms, v2 in used:
        sem = Semantics.V2 if v2 else Semantics.V3
        name = increase_template(ms / 1000, sem)
        definitions.append(f"  {name}(series) = {metricsql_increase('series', ms / 1000, sem)}")
    return "WITH (\n" + ",\n".join(definitions) + "\n)\n" + expr
