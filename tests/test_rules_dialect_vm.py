"""``slo.promql.metricsql``: PromQL's ``increase``/``rate`` rebuilt in MetricsQL, measured on real
servers. The same counters (a reset, a gap, a series that starts mid-window, irregular spacing
with millisecond jitter) are loaded into a real Prometheus and a real VictoriaMetrics, and
``sum(increase(x[w]))`` from Prometheus is compared, at many evaluation times, with MetricsQL's
``increase``, its ``increase_prometheus`` and ``metricsql_increase``.

The installed Prometheus is 2.42, so semantics "2" is checked against it; semantics "3" is
checked against ``slo.promql.rate`` (the bit-exact copy of Prometheus 3's ``extrapolatedRate``
that tests/test_promql_vs_prometheus.py holds to a real Prometheus 3 where one is installed).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from support.prometheus import PrometheusServer, PromSeries, require_prometheus, run_prometheus
from support.victoria import VictoriaServer, require_victoria, run_victoria

from slo.promql.metricsql import metricsql_increase, metricsql_rate
from slo.promql.rate import increase as reference_increase

#: The data's first sample (Unix ms) and its span (ms): two hours.
T0_MS = 1_700_000_000_000
SPAN_MS = 2 * 3600 * 1000
METRIC = "vigil_dialect_requests_total"

#: The goal: MetricsQL within this relative distance of PromQL wherever VictoriaMetrics allows.
TOLERANCE = 1e-6


def _regular(step_ms: int, start_ms: int = 0, end_ms: int = SPAN_MS,
             first: float = 0.0, inc: float = 3.0) -> list[tuple[int, float]]:
    return [(T0_MS + t, first + inc * k) for k, t in enumerate(range(start_ms, end_ms, step_ms))]


def _series() -> list[PromSeries]:
    """The counters; values keep at most 12 significant digits (VictoriaMetrics stores no more)."""
    rng = random.Random(20261206)
    reset = _regular(15_000, inc=7.0)
    cut = len(reset) // 2
    # A restart: the counter comes back at 2 and grows from there.
    reset = reset[:cut] + [(t, 2.0 + 7.0 * k) for k, (t, _) in enumerate(reset[cut:])]
    gap = [(t, v) for t, v in _regular(30_000, inc=1.5)
           if not 40 * 60_000 <= t - T0_MS < 60 * 60_000]
    irregular: list[tuple[int, float]] = []
    t, v = 0, 1000.0
    while t < SPAN_MS:
        irregular.append((T0_MS + t, round(v, 3)))
        t += rng.randint(5_000, 40_000) + rng.randint(0, 999)
        v += rng.randint(0, 5000) / 1000
    return [
        PromSeries(METRIC, {"case": "regular"}, _regular(15_000)),
        PromSeries(METRIC, {"case": "reset"}, reset),
        PromSeries(METRIC, {"case": "gap"}, gap),
        # Starts mid-window from near zero: the zero-point cap applies.
        PromSeries(METRIC, {"case": "late-small"}, _regular(20_000, start_ms=50 * 60_000,
                                                           first=4.0, inc=2.0)),
        # Starts mid-window high: no cap, half a spacing.
        PromSeries(METRIC, {"case": "late-high"}, _regular(20_000, start_ms=50 * 60_000 + 7_321,
                                                          first=90_000.0, inc=2.5)),
        PromSeries(METRIC, {"case": "irregular"}, irregular),
    ]


def _partial_reset() -> PromSeries:
    """A drop of less than 1/8 of the value (100 -> 95): VictoriaMetrics calls it a partial
    reset and adds the 5 back; PromQL calls it a reset and adds the 100."""
    samples = _regular(15_000, end_ms=20 * 60_000, first=100.0, inc=0.0)
    samples = [(t, 100.0 if i < 40 else 95.0 + (i - 40)) for i, (t, _) in enumerate(samples)]
    return PromSeries(METRIC, {"case": "partial"}, samples)


SERIES = _series()
PARTIAL = _partial_reset()
ALL = [*SERIES, PARTIAL]
SELECTOR = f'{METRIC}{{case!="partial"}}'

#: Windows (seconds) and evaluation times (Unix seconds): on the 15 s grid of the samples
#: (left edges on a sample, which 2.42 includes and 3.x does not), off it by odd
#: milliseconds, and late enough for the 1 h window to be full.
WINDOWS = (300.0, 3600.0)
TIMES = tuple(sorted({(T0_MS + k * 225_000 + off) / 1000
                      for k in range(1, 32) for off in (0, 1_234 * (k % 3))}))


@dataclass
class Distance:
    """The largest relative distance from the reference, and how many answers were absent on
    one side only."""

    worst: float = 0.0
    presence: int = 0

    def add(self, got: float | None, want: float | None) -> None:
        if (got is None) != (want is None):
            self.presence += 1
            return
        if got is None or want is None:
            return
        self.worst = max(self.worst, abs(got - want) / max(abs(want), 1e-300))


Answer = dict[tuple[tuple[str, str], ...], float]


def _by_case(answer: Answer) -> dict[str, float]:
    """``{case label: value}``; NaN is no answer (VictoriaMetrics leaves NaN out)."""
    return {dict(k)["case"]: v for k, v in answer.items() if not math.isnan(v)}


def _named_sum(answer: Answer) -> Answer:
    """A sum's one answer (or none) under a ``case`` label, alike on both sides."""
    values = list(answer.values())
    return {(("case", "sum"),): values[0]} if values else {}


def _compare(distance: Distance, got: Answer, want: Answer) -> None:
    have, expect = _by_case(got), _by_case(want)
    for case in sorted(set(have) | set(expect)):
        distance.add(have.get(case), expect.get(case))


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[PrometheusServer, VictoriaServer]]:
    binaries = require_prometheus()
    vm_binary = require_victoria()
    with run_prometheus(ALL, binaries=binaries) as prom, \
            run_victoria(ALL, binary=vm_binary) as vm:
        yield prom, vm


def _measure(prom: PrometheusServer, vm: VictoriaServer, selector: str,
             aggregate: bool) -> dict[str, Distance]:
    """PromQL's ``increase``/``rate`` of ``selector`` from Prometheus against MetricsQL's
    spellings on VictoriaMetrics, per series or (``aggregate``) summed, at every time and
    window: the largest relative distance of each spelling."""
    out = {name: Distance() for name in
           ("increase", "increase_prometheus", "metricsql_increase", "metricsql_rate")}

    def wrap(expr: str) -> str:
        return f"sum({expr})" if aggregate else expr

    for w in WINDOWS:
        rng = f"[{int(w)}s]"
        for at in TIMES:
            want = prom.query(wrap(f"increase({selector}{rng})"), at)
            want_rate = prom.query(wrap(f"rate({selector}{rng})"), at)
            spellings = {
                "increase": (f"increase({selector}{rng})", want),
                "increase_prometheus": (f"increase_prometheus({selector}{rng})", want),
                "metricsql_increase": (metricsql_increase(selector, w, "2"), want),
                "metricsql_rate": (metricsql_rate(selector, w, "2"), want_rate),
            }
            for name, (expr, reference) in spellings.items():
                got = vm.query(wrap(expr), at)
                if aggregate:
                    got, reference = _named_sum(got), _named_sum(reference)
                _compare(out[name], got, reference)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("aggregate", [False, True], ids=["per-series", "sum"])
def test_metricsql_increase_equals_prometheus_242(
        servers: tuple[PrometheusServer, VictoriaServer], aggregate: bool) -> None:
    prom, vm = servers
    assert prom.semantics() == "2"
    got = _measure(prom, vm, SELECTOR, aggregate)
    for name in ("metricsql_increase", "metricsql_rate"):
        assert got[name].presence == 0, name
        assert got[name].worst <= TOLERANCE, (name, got[name].worst)
    # MetricsQL's own functions really are other numbers on these samples.
    assert got["increase"].worst > 0.01
    assert got["increase_prometheus"].worst > 0.01


@pytest.mark.slow
def test_metricsql_increase_equals_prometheus_3(
        servers: tuple[PrometheusServer, VictoriaServer]) -> None:
    _, vm = servers
    distance = Distance()
    for w in WINDOWS:
        for at in TIMES:
            got = _by_case(vm.query(metricsql_increase(SELECTOR, w, "3"), at))
            for s in SERIES:
                want = reference_increase([t for t, _ in s.samples], [v for _, v in s.samples],
                                          at, w, "3")
                distance.add(got.get(s.labels["case"]), want)
    assert distance.presence == 0
    assert distance.worst <= TOLERANCE


@pytest.mark.slow
def test_a_partial_reset_stays_different(
        servers: tuple[PrometheusServer, VictoriaServer]) -> None:
    """100 -> 95: PromQL adds the 100 before the drop, VictoriaMetrics' counter-reset
    correction only the 5 (removeCounterResets' partial reset), so no MetricsQL spelling
    reaches PromQL's number over a window holding the drop."""
    prom, vm = servers
    selector = f'{METRIC}{{case="partial"}}'
    at = (PARTIAL.samples[45][0]) / 1000
    want = _scalar(prom.query(f"increase({selector}[5m])", at))
    got = _scalar(vm.query(metricsql_increase(selector, 300.0, "2"), at))
    assert want is not None and got is not None
    # The window holds 100, ..., 100, 95, 96, ..., 100 (from its left edge on). PromQL: a
    # restart from 0 to 95, then +5: 100. VictoriaMetrics: the drop is put back, then +5: 5.
    # The sample on the left edge leaves nothing to extrapolate on either side.
    assert (want, got) == (100.0, 5.0)


def _scalar(answer: Answer) -> float | None:
    values = [v for v in answer.values() if not math.isnan(v)]
    return values[0] if len(values) == 1 else None


# -- the expressions themselves (no server) ---------------------------------------------------


def test_prometheus_2_selects_one_more_millisecond() -> None:
    assert "x[300001ms]" in metricsql_increase("x", 300, "2")
    assert "x[300001ms]" not in metricsql_increase("x", 300, "3")
    assert "x[300000ms]" in metricsql_increase("x", 300, "3")
    # The window's left edge is still T - w.
    assert "(time() - 300)" in metricsql_increase("x", 300, "2")


def test_rate_divides_by_the_range() -> None:
    assert metricsql_rate("x", 90, "3") == f"({metricsql_increase('x', 90, '3')} / 90)"


@pytest.mark.parametrize("window", [0.0, -5.0, 0.0004])
def test_a_window_must_be_whole_positive_milliseconds(window: float) -> None:
    with pytest.raises(ValueError, match="window"):
        metricsql_increase("x", window)


def test_semantics_must_be_known() -> None:
    with pytest.raises(ValueError, match="semantics"):
        metricsql_increase("x", 60, "4")  # type: ignore[arg-type]
