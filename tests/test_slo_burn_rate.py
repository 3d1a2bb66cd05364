"""Burn rates, multiwindow alerts (factors per SLO period), error budget and time to
exhaustion."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from alerts.conditions import ConditionState, evaluate_conditions
from alerts.rules.pipeline import generate
from alerts.rules.promql import number
from slo.objectives.burn_rate import (
    SloBurnAlert,
    alert_factor,
    budget_remaining,
    burn_rate,
    burn_windows,
    evaluate_slo,
    firing_alerts,
    slo_burn_alerts,
    status_burn_alerts,
    time_to_exhaustion,
)
from slo.objectives.sli import error_ratio
from slo.objectives.spec import SloSpec
from slo.promql.lookup import Semantics
from vigil.config import BurnRateAlert, EngineConfig, parse_config
from vigil.errors import ConfigError
from vigil.model import Labels

ALERTS = EngineConfig().burn_rate_alerts  # the shipped SRE-workbook table
M, H, D = 60.0, 3600.0, 86400.0
PERIOD = 30 * D
ROWS = slo_burn_alerts(ALERTS, PERIOD)  # the table for a 30-day SLO
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
    assert firing_alerts(ROWS, _burns(h1=15.0, m5=20.0)) == ["page"]


def test_page_does_not_fire_when_only_the_long_window_burns() -> None:
    # The burn has stopped: the 5-minute window is back to normal.
    assert firing_alerts(ROWS, _burns(h1=15.0, m5=1.0)) == []


def test_page_does_not_fire_when_only_the_short_window_burns() -> None:
    # A short spike: not yet significant over the hour.
    assert firing_alerts(ROWS, _burns(h1=2.0, m5=100.0)) == []


def test_exactly_the_factor_does_not_fire() -> None:
    assert firing_alerts(ROWS, _burns(h1=14.4, m5=14.4)) == []


def test_slower_burn_fires_the_6h_page_and_the_tickets() -> None:
    burns = _burns(m5=7, m30=7, h1=7, h2=7, h6=7, d1=7, d3=7)
    assert firing_alerts(ROWS, burns) == ["page", "ticket"]
    assert firing_alerts(ROWS, _burns(d3=1.5, h6=1.5)) == ["ticket"]


def test_a_window_without_data_never_fires() -> None:
    assert firing_alerts(ROWS, {H: 20.0, 5 * M: None}) == []


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
    # each distinct window is evaluated once: as many queries each as one error_ratio makes
    one = RatioSource({})
    error_ratio(spec, one, AT, H)
    assert len(src.calls) == len(one.calls) * len(set(src.calls))


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


# --- factors per SLO period -------------------------------------------------------------------


def _factors(period_s: float, alerts: list[BurnRateAlert] = ALERTS) -> list[float]:
    return [r.factor for r in slo_burn_alerts(alerts, period_s)]


def test_the_shipped_table_is_the_workbooks_budget_shares() -> None:
    assert [(a.severity, a.budget_share, a.factor) for a in ALERTS] == [
        ("page", 0.02, None), ("page", 0.05, None), ("ticket", 0.1, None),
        ("ticket", 0.1, None)]


def test_a_30_day_slo_keeps_the_workbooks_factors_exactly() -> None:
    # Equal, not approximately: 14.4 here and 14.4 in a hand-written rule are the same float.
    assert _factors(30 * D) == [14.4, 6.0, 3.0, 1.0]


def test_a_7_day_slo_pages_at_2_percent_of_its_own_budget_in_an_hour() -> None:
    # 0.02 × 168 h / 1 h = 3.36; 0.05 × 168 / 6 = 1.4; 0.1 × 7 / 1 = 0.7; 0.1 × 7 / 3.
    assert _factors(7 * D) == [3.36, 1.4, 0.7, 0.233333333333]


def test_a_28_day_slo() -> None:
    # 0.02 × 672 h = 13.44; 0.05 × 672 / 6 = 5.6; 0.1 × 28 = 2.8; 0.1 × 28 / 3.
    assert _factors(28 * D) == [13.44, 5.6, 2.8, 0.933333333333]


def test_derived_factors_drop_the_float_error_of_the_product() -> None:
    # 0.07 × 604800 s / 3600 s is 11.760000000000002 in floats; the rule must say 0.07 × 168.
    row = BurnRateAlert(severity="page", budget_share=0.07, long_window=H, short_window=5 * M)
    assert 0.07 * (7 * D) / H != 11.76
    assert alert_factor(row, 7 * D) == 11.76
    assert number(alert_factor(row, 7 * D)) == "11.76"


def test_explicit_factors_are_kept_for_every_period() -> None:
    fixed = [BurnRateAlert(severity="page", factor=14.4, long_window=H, short_window=5 * M),
             BurnRateAlert(severity="ticket", factor=1.0, long_window=3 * D,
                           short_window=6 * H)]
    for period in (7 * D, 28 * D, 30 * D):
        assert _factors(period, fixed) == [14.4, 1.0]
    assert slo_burn_alerts(fixed, 7 * D)[0].budget_share is None


def test_a_row_gives_budget_share_or_factor_not_both() -> None:
    row = {"severity": "page", "long_window": "1h", "short_window": "5m"}
    with pytest.raises(ConfigError, match=r"engine\.burn_rate_alerts\[0\]: budget_share and "
                                          r"factor are both given"):
        parse_config({"engine": {"burn_rate_alerts": [
            {**row, "budget_share": 0.02, "factor": 14.4}]}})
    with pytest.raises(ConfigError, match=r"engine\.burn_rate_alerts\[0\]: give budget_share"):
        parse_config({"engine": {"burn_rate_alerts": [row]}})
    with pytest.raises(ConfigError, match=r"budget_share"):
        parse_config({"engine": {"burn_rate_alerts": [{**row, "budget_share": 1.5}]}})


def _steady(ratio: float, period_s: float) -> RatioSource:
    """The same error ratio over every window of the table and the period: a steady burn."""
    return RatioSource(dict.fromkeys([*burn_windows(ALERTS), period_s], ratio))


def test_a_7_day_slo_spending_3_percent_an_hour_pages() -> None:
    # 3 % of a 7-day budget per hour is a burn rate of 0.03 × 168 = 5.04: above the 7-day
    # page factor 3.36 (and 1.4), below the 30-day one, 14.4 (and 6), so the workbook's 30-day
    # factors would only file a ticket (5.04 > 3 and > 1).
    spec = SloSpec("chat-error-rate", "chat", "m", "all", "error_rate", 0.995, None, 7 * D)
    src = _steady(5.04 * 0.005, 7 * D)
    report = evaluate_slo(spec, src, AT, ALERTS)
    assert report.burn_rates[H] == pytest.approx(5.04)
    assert report.alerts == ["page", "ticket"]
    thirty_day = [BurnRateAlert(severity=a.severity, factor=f, long_window=a.long_window,
                                short_window=a.short_window)
                  for a, f in zip(ALERTS, _factors(30 * D), strict=True)]
    assert evaluate_slo(spec, src, AT, thirty_day).alerts == ["ticket"]


def test_a_28_day_slo_pages_below_the_30_day_factor() -> None:
    # Burn 14 everywhere: 14 > 13.44 pages a 28-day SLO, 14 < 14.4 does not page a 30-day one
    # (both still page on the 6h row: 14 > 5.6 and 14 > 6).
    src = _steady(14.0 * 0.01, 28 * D)
    spec28 = SloSpec("x", "chat", "m", "all", "error_rate", 0.99, None, 28 * D)
    rows28 = slo_burn_alerts(ALERTS, 28 * D)
    burns = {H: 14.0, 5 * M: 14.0}
    assert firing_alerts(rows28, burns) == ["page"]
    assert firing_alerts(ROWS, burns) == []
    assert evaluate_slo(spec28, src, AT, ALERTS).alerts == ["page", "ticket"]


def test_the_status_entry_carries_the_slos_factors() -> None:
    spec = SloSpec("chat-error-rate", "chat", "m", "all", "error_rate", 0.995, None, 7 * D)
    out = evaluate_slo(spec, _steady(0.001, 7 * D), AT, ALERTS).to_dict()
    assert out["burn_rate_alerts"][0] == {"severity": "page", "factor": 3.36,
                                          "budget_share": 0.02, "long_window": "1h",
                                          "short_window": "5m"}
    assert [r["factor"] for r in out["burn_rate_alerts"]] == _factors(7 * D)
    rows = slo_burn_alerts(ALERTS, 7 * D)
    assert [SloBurnAlert.from_dict(r) for r in out["burn_rate_alerts"]] == rows
    assert status_burn_alerts(out, ALERTS) == rows
    # An entry without the rows (written by hand, or before they existed): from its period.
    del out["burn_rate_alerts"]
    assert status_burn_alerts(out, ALERTS) == rows


CONFIG = parse_config({
    "pools": [{"name": "chat", "model": "m"}],
    "targets": [{"name": "chat-0", "url": "http://127.0.0.1:9/metrics", "pool": "chat"}],
    "slos": [
        {"name": "week", "pool": "chat", "indicator": "error_rate", "period": "7d"},
        {"name": "four-weeks", "pool": "chat", "indicator": "error_rate", "period": "28d"},
        {"name": "month", "pool": "chat", "indicator": "error_rate"},
    ],
})


def _burn_rule(config: Any, slo: str, severity: str) -> Any:
    return next(r for r in generate(config).rules() if r.alert == "ErrorBudgetBurn"
                and r.labels["slo"] == slo and r.labels["severity"] == severity)


def test_generated_rules_use_each_slos_factors() -> None:
    for slo, page, ticket in (("week", (3.36, 1.4), (0.7, 0.233333333333)),
                              ("four-weeks", (13.44, 5.6), (2.8, 0.933333333333)),
                              ("month", (14.4, 6), (3, 1))):
        for severity, factors in (("page", page), ("ticket", ticket)):
            rule = _burn_rule(CONFIG, slo, severity)
            got = re.findall(r"\) > ([0-9.]+)", rule.expr)
            assert [float(x) for x in got] == [f for f in factors for _ in range(2)], rule.expr
            assert [float(x) for x in re.findall(r"\) > ([0-9.]+)", rule.standalone)] == \
                [float(x) for x in got]
            assert all(f"above {number(f)}x" in rule.annotations["description"]
                       for f in factors)


def test_generated_rules_keep_a_fixed_factor() -> None:
    table = [{"severity": "page", "factor": 10.0, "long_window": "1h", "short_window": "5m"}]
    config = parse_config({**CONFIG.model_dump(exclude={"source", "engine"}),
                           "engine": {"burn_rate_alerts": table}})
    for slo in ("week", "four-weeks", "month"):
        assert re.findall(r"\) > ([0-9.]+)", _burn_rule(config, slo, "page").expr) == \
            ["10", "10"]


def test_vigil_serve_describes_the_7_day_factor() -> None:
    spec = SloSpec("week", "chat", "m", "all", "error_rate", 0.995, None, 7 * D)
    entry = evaluate_slo(spec, _steady(5.04 * 0.005, 7 * D), AT, ALERTS).to_dict()
    alerts, _ = evaluate_conditions(CONFIG, {"pools": {}, "slos": [entry], "anomalies": []},
                                    [], ConditionState(), AT)
    page = next(a for a in alerts if a.labels["severity"] == "page")
    assert "burn rate 5.04 over 1h and 5.04 over 5m > 3.36" in page.annotations["description"]
