"""The traffic forecast: a store history with a known daily shape and trend folds into that
shape, scaled to the next day's projected mean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.history import AT, MODEL, base_rate, write_history

from collector.store import Store
from slo.planning.forecast import (
    SECONDS_PER_DAY,
    TrafficForecast,
    constant_traffic,
    forecast_from_history,
)
from slo.sources.embedded import EmbeddedSource
from vigil.config import parse_config

CONFIG = parse_config({
    "pools": [{"name": "chat", "model": MODEL}],
    "capacity": {"plan_step": "1h"},
})
POOL = CONFIG.pools[0]








@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


def test_history_with_daily_shape_and_trend_projects_the_next_day(store: Store) -> None:
    # 10 % growth per day: daily means B, 1.1 B, 1.2 B -> the next day 1.3 B.
    write_history(store, 3, lambda day, hour: base_rate(hour) * (1 + 0.1 * day))
    f = forecast_from_history(EmbeddedSource(store), CONFIG, POOL, AT, days=3)
    assert f.basis == "observed"
    assert f.days == 3
    assert f.net_of_cache
    assert f.step_s == 3600
    assert len(f.profile) == 24
    for hour in range(24):
        assert f.profile[hour] == pytest.approx(base_rate(hour) * 1.3, rel=1e-6), hour
    mean = sum(base_rate(h) for h in range(24)) / 24
    assert f.trend_per_day == pytest.approx(0.1 * mean, rel=1e-6)
    assert "3 day(s)" in f.notes[0]
    assert f.rate_at(AT + 15 * 3600 + 10) == pytest.approx(base_rate(15) * 1.3, rel=1e-6)


def test_fewer_days_held_than_asked_says_so_and_one_day_has_no_trend(store: Store) -> None:
    write_history(store, 1, lambda _day, hour: base_rate(hour))
    f = forecast_from_history(EmbeddedSource(store), CONFIG, POOL, AT, days=4)
    assert f.days == 1
    assert f.trend_per_day == 0.0
    assert f.profile == pytest.approx(tuple(base_rate(h) for h in range(24)), rel=1e-6)
    assert any("no trend" in n for n in f.notes)
    assert "asked for 4" in f.notes[0]


def test_a_step_of_the_day_never_seen_is_interpolated(store: Store) -> None:
    # Two days; the hour 10:00-11:00 (and the sample closing it) missing on both.
    def gap(t: float) -> bool:
        return 10 * 3600 < t % SECONDS_PER_DAY <= 11 * 3600

    write_history(store, 2, lambda _day, _hour: 5.0, skip=gap)
    f = forecast_from_history(EmbeddedSource(store), CONFIG, POOL, AT, days=2)
    assert f.profile == pytest.approx((5.0,) * 24, rel=1e-6)
    assert any("interpolated" in n for n in f.notes)


def test_no_history_is_an_error(store: Store) -> None:
    with pytest.raises(ValueError, match="no requests of pool 'chat'"):
        forecast_from_history(EmbeddedSource(store), CONFIG, POOL, AT, days=2)


def test_constant_traffic_and_the_day_curve() -> None:
    f = constant_traffic(12.5)
    assert f.basis == "measured"
    assert f.requests_per_day() == pytest.approx(12.5 * SECONDS_PER_DAY)
    assert f.day_curve(6 * 3600) == [(h * 3600.0, 12.5) for h in (0, 6, 12, 18)]


def test_a_coarser_curve_is_the_mean_of_the_steps_it_covers() -> None:
    f = TrafficForecast(profile=(1.0, 3.0, 5.0, 7.0), step_s=6 * 3600, basis="observed")
    assert f.day_curve(12 * 3600) == [(0.0, 2.0), (43200.0, 6.0)]
    assert f.day_curve(3 * 3600)[2:4] == [(21600.0, 3.0), (32400.0, 3.0)]
    assert f.peak_rps() == 7.0
    with pytest.raises(ValueError, match="do not make a day"):
        TrafficForecast(profile=(1.0, 2.0), step_s=3600, basis="observed")


def test_a_half_covered_first_day_fakes_no_trend(store: Store) -> None:
    # The store started at noon of the first day: that day holds only the afternoon peak.
    def before_noon(t: float) -> bool:
        return t < AT - 3 * SECONDS_PER_DAY + 12 * 3600

    write_history(store, 3, lambda _day, hour: base_rate(hour), skip=before_noon)
    f = forecast_from_history(EmbeddedSource(store), CONFIG, POOL, AT, days=3)
    assert f.days == 3
    assert f.trend_per_day == pytest.approx(0.0, abs=1e-9)
    assert f.profile == pytest.approx(tuple(base_rate(h) for h in range(24)), rel=1e-6)
    assert any("1 day(s) holding under 90% of their steps" in n for n in f.notes)


def test_a_partly_covered_day_enters_the_trend_de_seasonalised(store: Store) -> None:
    # Day 1 misses one hour of its peak (23 of 24 steps held); days grow 10 % a day.
    def gap(t: float) -> bool:
        day_start = AT - 2 * SECONDS_PER_DAY
        return day_start + 16 * 3600 < t <= day_start + 17 * 3600

    write_history(store, 3, lambda day, hour: base_rate(hour) * (1 + 0.1 * day), skip=gap)
    f = forecast_from_history(EmbeddedSource(store), CONFIG, POOL, AT, days=3)
    # Raw daily means would put day 1 below the line (its peak hour is missing).
    mean = sum(base_rate(h) for h in range(24)) / 24
    assert f.trend_per_day == pytest.approx(0.1 * mean, rel=1e-6)
    assert f.profile == pytest.approx(tuple(base_rate(h) * 1.3 for h in range(24)), rel=1e-6)
    assert not any("left out of the trend" in n for n in f.notes)
