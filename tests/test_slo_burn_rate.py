"""Burn rates, multiwindow alerts, error budget and time to exhaustion."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from slo.burn_rate import (
    budget_remaining,
    burn_rate,
    burn_windows,
    evaluate_slo,
    firing_alerts,
    time_to_exhaustion,
)
from slo.lookup import Semantics
from slo.spec import SloSpec
from vigil.config import EngineConfig
from vigil.model import Labels

ALERTS = EngineConfig().burn_rate_alerts  # the shipped SRE-workbook table
M, H, D = 60.0, 3600.0, 86400.0
PERIOD = 30 * D
AT = 1_795_000_000.0


def test_windows_are_the_union_of_the_alert_table() -> None:
    assert burn_windows(ALERTS) == [5 * M, 30 * M, H, 2 * H, 6 * H, D, 3 * D]


def test_burn_rate_is_error_ratio_over_the_budget() -> None:
    assert burn_rate(0.02, 0.995) == pytest.approx(4.0)
    assert burn_rate(None, 0.995) is None
    assert burn_rate(0.0, 0.995) == 0.0


def test_burn_rate_without_any_budget_is_none() -> None:
    assert burn_rate(0.01, 1.0) is None


def _burns(**by_label: float) -> dict[float, float]:
    seconds = {"m5": 5 * M, "m30": 30 * M, "h1": H, "h2": 2 * H, "h6": 6 * H, "d1": D,
               "d3": 3 * D}
    return {seconds[k]: v for k, v in by_label.items()}


def test_page_fires_when_both_windows_burn_faster_than_14_4() -> None:
    assert firing_alerts(ALERTS, _burns(h1=15.0, m5=20.0)) == ["page"]


def test_page_does_not_fire_when_only_the_long_window_burns() -> None:
    # The burn has stopped: the 5-minute window is back to normal.
    assert firing_alerts(ALERTS, _burns(h1=15.0, m5=1.0)) == []


def test_page_does_not_fire_when_only_the_short_window_burns() -> None:
    # A short spike: not yet significant over the hour.
    assert firing_alerts(ALERTS, _burns(h1=2.0, m5=100.0)) == []


def test_exactly_the_factor_does_not_fire() -> None:
    assert firing_alerts(ALERTS, _burns(h1=14.4, m5=14.4)) == []


def test_slower_burn_fires_the_6h_page_and_the_tickets() -> None:
    burns = _burns(m5=7, m30=7, h1=7, h2=7, h6=7, d1=7, d3=7)
    assert firing_alerts(ALERTS, burns) == ["page", "ticket"]
    assert firing_alerts(ALERTS, _burns(d3=1.5, h6=1.5)) == ["ticket"]


def test_a_window_without_data_never_fires() -> None:
    assert firing_alerts(ALERTS, {H: 20.0, 5 * M: None}) == []


def test_budget_remaining_goes_negative_when_overspent() -> None:
    # 1 % errors against a 0.5 % budget: twice the budget spent.
    assert budget_remaining(0.01, 0.995) == pytest.approx(-1.0)
    assert budget_remaining(0.0, 0.995) == 1.0
    assert budget_remaining(0.0025, 0.995) == pytest.approx(0.5)
    assert budget_remaining(None, 0.995) is None


def test_time_to_exhaustion_at_the_last_hours_burn() -> None:
    # Half the budget left, burning at 2x: the half lasts a quarter of the period.
    assert time_to_exhaustion(0.5, PERIOD, 2.0) == pytest.approx(PERIOD / 4)
    assert time_to_exhaustion(0.5, PERIOD, 0.0) is None
    assert time_to_exhaustion(-0.2, PERIOD, 3.0) is None
    assert time_to_exhaustion(0.5, PERIOD, None) is None


class RatioSource:
    """A ``Source`` whose error_rate SLI over each window is given: total 1000 requests, of
    which ``ratio × 1000`` failed."""

    semantics = Semantics.V3

    def __init__(self, ratios: Mapping[float, float]) -> None:
        self.ratios = ratios
        self.calls: list[float] = []

    def increase(self, metric: str, matchers: Mapping[str, str], at_s: float, window_s: float,
                 by: Sequence[str] = ()) -> dict[Labels, float]:
        self.calls.append(window_s)
        ratio = self.ratios.get(window_s, 0.001)
        errors_only = matchers.get("finished_reason") == "error"
        return {(): ratio * 1000 if errors_only else 1000.0}


def test_evaluate_slo_pages_and_reports_an_overspent_budget() -> None:
    spec = SloSpec("chat-error-rate", "chat", "m", "all", "error_rate", 0.995, None, PERIOD)
    src = RatioSource({5 * M: 0.1, H: 0.08, PERIOD: 0.01})
    report = evaluate_slo(spec, src, AT, ALERTS, current_window_s=5 * M)
    out = report.to_dict()
    assert list(out["windows"]) == ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]
    assert out["windows"]["5m"]["burn_rate"] == pytest.approx(20.0)
    assert out["windows"]["1h"]["burn_rate"] == pytest.approx(16.0)
    assert out["windows"]["1d"]["error_ratio"] == pytest.approx(0.001)
    assert out["alerts"] == ["page"]
    assert out["period"] == "30d"
    assert out["sli"] == pytest.approx(0.99)
    assert out["budget_remaining"] == pytest.approx(-1.0)
    assert out["time_to_exhaustion_seconds"] is None
    assert out["current"] == {"window": "5m", "error_ratio": pytest.approx(0.1),
                              "sli": pytest.approx(0.9)}
    assert out["interpolated"] is False
    # each distinct window is evaluated once (2 queries each: total and errors)
    assert len(src.calls) == 2 * len(set(src.calls))


def test_evaluate_slo_time_to_exhaustion_uses_the_1h_burn() -> None:
    spec = SloSpec("chat-error-rate", "chat", "m", "all", "error_rate", 0.995, None, PERIOD)
    report = evaluate_slo(spec, RatioSource({H: 0.01, PERIOD: 0.0025}), AT, ALERTS)
    # budget 0.5 left, 1h burn 2 -> 0.5 × 30 d / 2
    assert report.time_to_exhaustion_s == pytest.approx(0.5 * PERIOD / 2)
    assert "current" not in report.to_dict()


def test_evaluate_slo_computes_the_1h_burn_even_if_no_alert_uses_it() -> None:
    alerts = [a for a in ALERTS if a.severity == "ticket"]  # windows 2h, 1d, 6h, 3d
    spec = SloSpec("x", "chat", "m", "all", "error_rate", 0.995, None, PERIOD)
    report = evaluate_slo(spec, RatioSource({H: 0.01, PERIOD: 0.0025}), AT, alerts)
    assert "1h" not in report.to_dict()["windows"]
    assert report.time_to_exhaustion_s == pytest.approx(0.5 * PERIOD / 2)
