"""The scaling policy (``slo.scaling.policy.decide``) on synthetic timelines, and
``slo.scaling.signals.recommend_for_pool`` over a real SQLite store read through
``EmbeddedSource``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.store import Store
from slo.scaling.policy import (
    SIGNAL_COOLDOWN,
    SIGNAL_KV,
    SIGNAL_MAX_REPLICAS,
    SIGNAL_MIN_REPLICAS,
    SIGNAL_QUEUE,
    SIGNAL_SCALE_IN_HOLD,
    SIGNAL_TTFT,
    Reason,
    Recommendation,
    Timeline,
    decide,
    fit_window_for,
    latest,
    trend,
)
from slo.scaling.signals import (
    current_replicas,
    last_scale_in_at,
    last_scale_out_at,
    pool_signals,
    recommend_for_pool,
    sample_times,
    ttft_threshold_for,
)
from slo.sources.embedded import EmbeddedSource
from vigil.config import Config, PoolConfig, ScalingConfig, SloConfig
from vigil.model import SeriesKey

NOW = 1_795_000_000.0
MIN = 60.0
STEP = 15.0
POOL = PoolConfig(name="chat", model="llama", min_replicas=1, max_replicas=8)
SCALING = ScalingConfig()
TTFT_SLO = 0.8  # seconds; scale-out above 0.8 × 0.8 = 0.64 s


def flat(value: float, minutes: float = 10, now: float = NOW) -> Timeline:
    """A constant signal sampled every 15 s over the last ``minutes``, ending at ``now``."""
    return [(t, value) for t in sample_times(now, minutes * MIN, STEP)]


def ramp(v0: float, v1: float, minutes: float = 5, now: float = NOW) -> Timeline:
    """A straight line from ``v0`` (``minutes`` ago) to ``v1`` (now), every 15 s."""
    span = minutes * MIN
    return [(t, v0 + (v1 - v0) * (t - (now - span)) / span)
            for t in sample_times(now, span, STEP)]


def run(
    kv: Timeline | None = None,
    queue: Timeline | None = None,
    ttft: Timeline | None = None,
    *,
    current: int = 4,
    pool: PoolConfig = POOL,
    scaling: ScalingConfig = SCALING,
    last_out: float | None = None,
    last_in: float | None = None,
    now: float = NOW,
) -> Recommendation:
    return decide(
        kv, queue, ttft, now=now, current=current, pool=pool, scaling=scaling,
        ttft_threshold_s=TTFT_SLO, last_scale_out_at=last_out, last_scale_in_at=last_in,
    )


def calm() -> dict[str, Timeline]:
    """Signals in the dead band: no trigger, no scale-in."""
    return {"kv": flat(0.5), "queue": flat(3), "ttft": flat(0.2)}


# --- each scale-out trigger alone ---------------------------------------------------------


def test_kv_over_threshold_alone_scales_out() -> None:
    rec = run(**{**calm(), "kv": flat(0.81)})
    assert rec.action == "scale_out"
    assert [r.signal for r in rec.reasons] == [SIGNAL_KV]
    assert rec.reasons[0].text == "KV-cache usage 0.81 > 0.80"
    assert rec.desired == 5  # max(4 + 1, ceil(4 × 0.81 / 0.80) = 5)
    assert rec.next_decision_at == NOW


def test_queue_over_threshold_alone_scales_out() -> None:
    rec = run(**{**calm(), "queue": flat(51)})
    assert rec.action == "scale_out"
    assert [r.signal for r in rec.reasons] == [SIGNAL_QUEUE]
    assert rec.reasons[0].text == "queue length 51 > 50"
    assert rec.desired == 5  # ceil(4 × 1.02) = 5


def test_ttft_over_80_percent_of_slo_alone_scales_out() -> None:
    # 0.65 s / 0.8 s = 0.8125 > 0.8
    rec = run(**{**calm(), "ttft": flat(0.65)})
    assert rec.action == "scale_out"
    (reason,) = rec.reasons
    assert reason.signal == SIGNAL_TTFT
    assert reason.threshold == pytest.approx(0.64)
    assert reason.text == "TTFT p95 0.650 s > 0.640 s"


def test_the_ttft_reason_names_the_configured_quantile() -> None:
    rec = run(**{**calm(), "ttft": flat(0.65)},
              scaling=ScalingConfig(scale_out_ttft_quantile=0.9))
    (reason,) = rec.reasons
    assert reason.quantile == 0.9
    assert reason.text == "TTFT p90 0.650 s > 0.640 s"


@pytest.mark.parametrize("signal, value", [("kv", 0.80), ("queue", 50), ("ttft", 0.64)])
def test_exactly_at_a_threshold_is_not_over_it(signal: str, value: float) -> None:
    rec = run(**{**calm(), signal: flat(value)})
    assert rec.action == "hold"
    assert rec.reasons == []


def test_every_trigger_is_reported_and_the_worst_sizes_the_step() -> None:
    rec = run(kv=flat(0.9), queue=flat(75), ttft=flat(0.7))
    assert {r.signal for r in rec.reasons} == {SIGNAL_KV, SIGNAL_QUEUE, SIGNAL_TTFT}
    assert rec.desired == 6  # queue 75 / 50 = 1.5 is the worst: ceil(4 × 1.5) = 6


# --- proportional desired count, bounds -----------------------------------------------------


@pytest.mark.parametrize(
    "kv, queue, current, max_replicas, desired",
    [
        (0.96, 0, 4, 8, 5),  # KV 1.2 × threshold: ceil(4.8) = 5
        (0.5, 100, 4, 8, 8),  # queue 2 × threshold: 8
        (0.5, 100, 4, 6, 6),  # ... clamped to max_replicas
        (0.81, 0, 1, 8, 2),  # at least +1
        (0.5, 51, 0, 8, 1),  # from zero: +1 (a queue with no ready replica is possible)
    ],
)
def test_desired_is_proportional_to_the_worst_signal(
    kv: float, queue: float, current: int, max_replicas: int, desired: int
) -> None:
    pool = PoolConfig(name="chat", model="llama", min_replicas=0, max_replicas=max_replicas)
    rec = run(kv=flat(kv), queue=flat(queue), ttft=flat(0.1), current=current, pool=pool)
    assert (rec.action, rec.desired) == ("scale_out", desired)


def test_ttft_twice_its_trigger_doubles_the_pool() -> None:
    # 1.28 s / 0.64 s = 2 (0.8 × 0.8 is 0.6400000000000001; float noise must not add one)
    rec = run(kv=flat(0.5), queue=flat(0), ttft=flat(1.28), current=4)
    assert rec.desired == 8


def test_at_max_replicas_a_trigger_holds() -> None:
    rec = run(**{**calm(), "kv": flat(0.95)}, current=8)
    assert (rec.action, rec.desired, rec.current) == ("hold", 8, 8)
    assert rec.reasons[0].signal == SIGNAL_KV
    assert rec.reasons[-1].signal == SIGNAL_MAX_REPLICAS
    assert rec.reasons[-1].text == "at max_replicas: 8 replicas >= 8"


def test_below_min_replicas_is_restored_even_in_cooldown() -> None:
    pool = PoolConfig(name="chat", model="llama", min_replicas=2, max_replicas=8)
    rec = run(**calm(), current=1, pool=pool, last_out=NOW - 60)
    assert (rec.action, rec.desired) == ("scale_out", 2)
    assert rec.reasons[0].text == "below min_replicas: 1 replicas < 2"


def test_above_max_replicas_is_brought_down_to_max() -> None:
    rec = run(**{**calm(), "kv": flat(0.9)}, current=10)
    assert (rec.action, rec.desired) == ("scale_in", 8)
    assert [r.signal for r in rec.reasons] == [SIGNAL_MAX_REPLICAS]


# --- scale-in -------------------------------------------------------------------------------


def test_scale_in_after_the_10_minute_hold() -> None:
    rec = run(kv=flat(0.2, 10), queue=flat(0, 10), ttft=flat(0.1, 5), current=4)
    assert (rec.action, rec.desired) == ("scale_in", 3)  # one step at a time
    assert [r.text for r in rec.reasons] == [
        "KV-cache usage max 0.20 < 0.30 over 10m",
        "queue length max 0 <= 0 over 10m",
    ]


def test_no_scale_in_with_only_9_minutes_of_data() -> None:
    rec = run(kv=flat(0.2, 9), queue=flat(0, 9), ttft=flat(0.1, 5), current=4)
    assert (rec.action, rec.desired) == ("hold", 4)
    (reason,) = rec.reasons
    assert reason.signal == SIGNAL_SCALE_IN_HOLD
    assert reason.text == "scale-in conditions held for 9m < 10m"


def test_the_hold_needs_both_kv_and_queue_for_the_whole_span() -> None:
    rec = run(kv=flat(0.2, 20), queue=flat(0, 9), current=4)
    assert rec.action == "hold"
    assert rec.reasons[0].value == pytest.approx(9 * MIN)


@pytest.mark.parametrize(
    "signal, high", [("kv", 0.30), ("kv", 0.5), ("queue", 1)]
)
def test_one_high_sample_within_the_hold_prevents_scale_in(signal: str, high: float) -> None:
    timelines = {"kv": flat(0.1, 15), "queue": flat(0, 15)}
    # One sample 5 minutes ago (well inside the 10-minute hold) is not low.
    timelines[signal] = [(t, high if t == NOW - 5 * MIN else v) for t, v in timelines[signal]]
    rec = run(**timelines, current=4)
    assert rec.action == "hold"
    assert rec.reasons[0].signal == SIGNAL_SCALE_IN_HOLD
    assert rec.reasons[0].value == pytest.approx(5 * MIN - STEP)


def test_a_high_sample_before_the_hold_does_not_matter() -> None:
    kv = [(t, 0.9 if t == NOW - 11 * MIN else v) for t, v in flat(0.1, 15)]
    rec = run(kv=kv, queue=flat(0, 15), current=4)
    assert rec.action == "scale_in"


def test_a_gap_longer_than_the_lookback_breaks_the_hold() -> None:
    kv = [(t, v) for t, v in flat(0.1, 15) if not NOW - 8 * MIN < t < NOW - 2 * MIN]
    rec = run(kv=kv, queue=flat(0, 15), current=4)
    assert rec.action == "hold"


def test_min_replicas_is_respected_on_scale_in() -> None:
    pool = PoolConfig(name="chat", model="llama", min_replicas=2, max_replicas=8)
    low = {"kv": flat(0.05, 15), "queue": flat(0, 15)}
    assert run(**low, current=3, pool=pool).desired == 2
    rec = run(**low, current=2, pool=pool)
    assert (rec.action, rec.desired) == ("hold", 2)
    assert rec.reasons[-1].signal == SIGNAL_MIN_REPLICAS
    assert rec.reasons[-1].text == "at min_replicas: 2 replicas <= 2"


def test_a_scale_in_restarts_the_hold() -> None:
    low = {"kv": flat(0.05, 30), "queue": flat(0, 30)}
    rec = run(**low, current=3, last_in=NOW - 6 * MIN)
    assert rec.action == "hold"
    assert rec.reasons[0].value == pytest.approx(6 * MIN)
    assert run(**low, current=3, last_in=NOW - 10 * MIN).action == "scale_in"


# --- cooldown -------------------------------------------------------------------------------


def test_cooldown_holds_for_5_minutes_after_a_scale_out() -> None:
    hot = {**calm(), "kv": flat(0.95)}
    last = NOW - (4 * MIN + 59)
    rec = run(**hot, last_out=last)
    assert (rec.action, rec.desired) == ("hold", 4)
    assert rec.next_decision_at == last + 300
    assert rec.reasons[0].signal == SIGNAL_COOLDOWN
    assert rec.reasons[0].text == "cooldown: last scale-out 4m59s ago < 5m, next decision in 1s"
    # The pressure stays visible while the cooldown holds it back.
    assert rec.reasons[1].signal == SIGNAL_KV


def test_cooldown_also_blocks_scale_in() -> None:
    rec = run(kv=flat(0.05, 30), queue=flat(0, 30), current=4, last_out=NOW - 2 * MIN)
    assert rec.action == "hold"
    assert [r.signal for r in rec.reasons] == [SIGNAL_COOLDOWN]


@pytest.mark.parametrize("ago", [5 * MIN, 5 * MIN + 1])
def test_decisions_resume_when_the_cooldown_is_over(ago: float) -> None:
    rec = run(**{**calm(), "kv": flat(0.95)}, last_out=NOW - ago)
    assert rec.action == "scale_out"
    assert rec.next_decision_at == NOW


def test_a_scale_out_in_the_future_counts_as_just_now() -> None:
    rec = run(**calm(), last_out=NOW + 30)
    assert rec.action == "hold"
    assert rec.reasons[0].value == 0.0
    assert rec.next_decision_at == NOW + 330


# --- prediction -----------------------------------------------------------------------------


def test_a_rising_trend_scales_out_before_the_threshold_is_crossed() -> None:
    # 0.60 -> 0.75 in 5 min is +0.03/min; in 3 min of spin-up: 0.75 + 0.09 = 0.84 > 0.80.
    rec = run(kv=ramp(0.60, 0.75), queue=flat(0), ttft=flat(0.1))
    assert rec.action == "scale_out"
    (reason,) = rec.reasons
    assert reason.value == pytest.approx(0.75)
    assert reason.projected == pytest.approx(0.84)
    assert reason.trend_per_s == pytest.approx(0.15 / 300)
    assert reason.text == "KV-cache usage projected 0.84 > 0.80 in 3m (trend +0.030/min; now 0.75)"
    assert rec.desired == 5  # ceil(4 × 0.84 / 0.80 = 4.2)


def test_a_projection_sizes_a_trigger_that_is_already_over() -> None:
    rec = run(kv=flat(0.5), queue=ramp(40, 60), ttft=flat(0.1))
    (reason,) = rec.reasons
    assert reason.projected == pytest.approx(60 + 20 / 5 * 3)
    assert reason.text == "queue length 60 > 50 (projected 72 in 3m, trend +4.0/min)"
    assert rec.desired == 6  # ceil(4 × 72 / 50 = 5.76)


def test_a_kv_projection_is_capped_at_a_full_cache() -> None:
    rec = run(kv=ramp(0.5, 0.95), queue=flat(0), ttft=flat(0.1))
    assert rec.reasons[0].projected == 1.0
    assert rec.desired == 5  # ceil(4 × 1.0 / 0.8)


def test_the_projection_horizon_is_the_spinup() -> None:
    slow = ScalingConfig(spinup=60)  # 0.75 + 0.03 = 0.78: not over
    assert run(kv=ramp(0.60, 0.75), queue=flat(0), scaling=slow).action == "hold"


def test_a_falling_trend_never_scales_in_by_itself() -> None:
    # Projected to 0.25 in 3 min, but the samples are not below 0.30.
    rec = run(kv=ramp(0.45, 0.31, 10), queue=flat(0), ttft=flat(0.1))
    assert (rec.action, rec.reasons) == ("hold", [])


def test_a_falling_line_still_over_the_threshold_does_not_trigger() -> None:
    # The latest sample is under 0.8; the fitted line is still over it but falling.
    kv = [*ramp(0.99, 0.85, 5)[:-1], (NOW, 0.5)]
    rec = run(kv=kv, queue=flat(0), ttft=flat(0.1))
    assert rec.action == "hold"


def test_too_few_points_give_no_projection() -> None:
    kv = [(NOW - 30, 0.2), (NOW, 0.7)]  # a steep "trend" from two points
    assert run(kv=kv, queue=flat(0)).action == "hold"


# --- missing signals ------------------------------------------------------------------------


def test_missing_signals_are_null_and_trigger_nothing() -> None:
    rec = run(kv=None, queue=[], ttft=None)
    assert (rec.action, rec.desired, rec.reasons) == ("hold", 4, [])
    assert rec.signals == {SIGNAL_KV: None, SIGNAL_QUEUE: None, SIGNAL_TTFT: None}
    d = rec.to_dict()
    assert d["signals"] == {"kv_cache_usage": None, "queue_length": None,
                            "ttft_p95_seconds": None}


def test_one_missing_signal_does_not_hide_the_others() -> None:
    rec = run(kv=None, queue=flat(80), ttft=None)
    assert rec.action == "scale_out"
    assert rec.signals[SIGNAL_KV] is None
    assert rec.signals[SIGNAL_QUEUE] == 80


def test_a_signal_older_than_the_lookback_is_missing() -> None:
    old = flat(0.95, 10, now=NOW - 6 * MIN)
    rec = run(kv=old, queue=flat(0))
    assert rec.signals[SIGNAL_KV] is None
    assert rec.action == "hold"


def test_missing_queue_prevents_scale_in() -> None:
    assert run(kv=flat(0.05, 20), queue=None).action == "hold"


def test_nan_and_future_samples_are_ignored() -> None:
    kv = [*flat(0.5), (NOW - 1, math.nan), (NOW + 60, 0.99)]
    rec = run(kv=kv, queue=flat(0))
    assert rec.signals[SIGNAL_KV] == 0.5
    assert rec.action == "hold"


# --- output ---------------------------------------------------------------------------------


def test_to_dict_is_json_ready() -> None:
    rec = run(kv=ramp(0.60, 0.75), queue=flat(0), ttft=flat(0.3), last_out=NOW - 10 * MIN)
    d = json.loads(json.dumps(rec.to_dict()))
    assert d["current"] == 4
    assert d["desired"] == 5
    assert d["action"] == "scale_out"
    assert d["next_decision_at"] == NOW
    assert d["reasons"] == [rec.reasons[0].text]
    detail = d["reason_details"][0]
    assert detail["signal"] == "kv_cache_usage"
    assert detail["threshold"] == 0.8
    assert detail["projected"] == pytest.approx(0.84)
    assert detail["comparison"] == ">"
    assert d["signals"]["ttft_p95_seconds"] == 0.3


def test_reason_text_of_a_queue_projection() -> None:
    r = Reason(SIGNAL_QUEUE, 44, 50, 62.3, ">", trend_per_s=4.1 / 60, horizon_s=180)
    assert r.text == "queue length projected 62 > 50 in 3m (trend +4.1/min; now 44)"


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="current"):
        run(current=-1)
    with pytest.raises(ValueError, match="ttft_threshold_s"):
        decide(None, None, None, now=NOW, current=1, pool=POOL, scaling=SCALING,
               ttft_threshold_s=0, last_scale_out_at=None)
    with pytest.raises(ValueError, match="now"):
        run(now=math.nan)
    with pytest.raises(ValueError, match="step_s"):
        sample_times(NOW, 600, 0)


# --- trend ----------------------------------------------------------------------------------


def test_trend_is_least_squares_over_the_fit_window() -> None:
    line = [(NOW - 300 + 15 * i, 2.0 + 0.01 * (15 * i - 300)) for i in range(21)]
    fitted = trend(line, NOW, 300)
    assert fitted is not None
    assert fitted.slope_per_s == pytest.approx(0.01)
    assert fitted.at_now == pytest.approx(2.0)
    # Noise symmetric around the line leaves the fit on it.
    noisy = [(t, v + (0.1 if i % 2 else -0.1)) for i, (t, v) in enumerate(line[1:])]
    assert trend(noisy, NOW, 300).slope_per_s == pytest.approx(0.01, abs=2e-4)  # type: ignore[union-attr]


def test_trend_ignores_samples_outside_the_window_and_needs_three() -> None:
    far_past = [(NOW - 3600, 100.0), (NOW - 3000, -100.0)]
    assert trend([*far_past, (NOW - 60, 1.0), (NOW, 2.0)], NOW, 300) is None
    fitted = trend([*far_past, (NOW - 120, 0.0), (NOW - 60, 1.0), (NOW, 2.0)], NOW, 300)
    assert fitted is not None
    assert fitted.slope_per_s == pytest.approx(1 / 60)
    assert trend([(NOW, 1.0)] * 3, NOW, 300) is None  # one timestamp: no slope


def test_latest_and_fit_window() -> None:
    assert latest([(NOW - 10, 1.0), (NOW - 20, 2.0)], NOW) == 1.0
    assert latest([(NOW - 300, 1.0)], NOW) is None
    assert fit_window_for(ScalingConfig()) == 300
    assert fit_window_for(ScalingConfig(spinup=600)) == 600


# --- properties -----------------------------------------------------------------------------

_timeline = st.one_of(
    st.none(),
    st.lists(st.floats(0, 1.2), min_size=0, max_size=50).map(
        lambda vs: [(NOW - STEP * (len(vs) - 1 - i), v) for i, v in enumerate(vs)]
    ),
)
_queue = st.one_of(
    st.none(),
    st.lists(st.sampled_from([0.0, 0.0, 0.0, 1.0, 10.0, 49.0, 51.0, 200.0]), max_size=50).map(
        lambda vs: [(NOW - STEP * (len(vs) - 1 - i), v) for i, v in enumerate(vs)]
    ),
)


@settings(max_examples=300, deadline=None, database=None)
@given(
    kv=_timeline,
    queue=_queue,
    ttft=_timeline,
    current=st.integers(0, 12),
    bounds=st.tuples(st.integers(0, 6), st.integers(1, 10)).filter(lambda b: b[0] <= b[1]),
    last_out=st.one_of(st.none(), st.floats(-900, 60).map(lambda d: NOW + d)),
    last_in=st.one_of(st.none(), st.floats(-900, 0).map(lambda d: NOW + d)),
)
def test_properties(
    kv: Timeline | None, queue: Timeline | None, ttft: Timeline | None, current: int,
    bounds: tuple[int, int], last_out: float | None, last_in: float | None,
) -> None:
    lo, hi = bounds
    pool = PoolConfig(name="p", model="m", min_replicas=lo, max_replicas=hi)
    rec = run(kv, queue, ttft, current=current, pool=pool, last_out=last_out, last_in=last_in)
    assert lo <= rec.desired <= hi
    expected = ("scale_out" if rec.desired > rec.current
                else "scale_in" if rec.desired < rec.current else "hold")
    assert rec.action == expected
    in_cooldown = last_out is not None and NOW - last_out < SCALING.cooldown
    assert rec.next_decision_at == (last_out + SCALING.cooldown if in_cooldown else NOW)
    if lo <= current <= hi:
        if in_cooldown:
            assert rec.action == "hold"
        if rec.action == "scale_in":
            # One step, and only on samples that were all low for the whole hold.
            assert rec.desired == current - 1
            hold_start = NOW - SCALING.scale_in_hold
            assert kv is not None and queue is not None
            assert min(t for t, _ in kv) <= hold_start
            assert all(v < 0.3 for t, v in kv if t >= hold_start)
            assert all(v <= 0 for t, v in queue if t >= hold_start)
    json.dumps(rec.to_dict())


# --- signals from a real store --------------------------------------------------------------

AT = 1_795_000_200.0  # evaluation time, Unix seconds (on a 15 s scrape boundary)
LES = ("0.1", "0.25", "0.5", "1.0", "+Inf")
#: Cumulative bucket increments per replica per scrape: 10 requests per scrape.
SLOW_TTFT = (2, 6, 9, 10, 10)  # p95: rank 9.5 in (0.5, 1.0] -> 0.75 s
FAST_TTFT = (9, 10, 10, 10, 10)  # p95: rank 9.5 in (0.1, 0.25] -> 0.175 s


def key(name: str, instance: str, pool: str = "chat", kind: str = "vllm",
        **extra: str) -> SeriesKey:
    labels = {"instance": instance, "pool": pool, "kind": kind, **extra}
    return SeriesKey(name, tuple(sorted(labels.items())))


def write_replica(
    store: Store, instance: str, *, kv: float, queue: float, ttft: tuple[int, ...],
    up_from: float = AT - 20 * MIN, down_from: float | None = None,
    start: float = AT - 20 * MIN, pool: str = "chat",
) -> None:
    """One vLLM replica scraped every 15 s from ``start`` to ``AT``: ``up`` is 1 from
    ``up_from`` (0 before, like a configured target whose server is not running yet) until
    ``down_from``; metrics exist while up."""
    rows = []
    vllm = {"engine": "0", "model_name": "llama"}
    scrapes = 0
    for t in sample_times(AT, AT - start, STEP):
        ms = round(t * 1000)
        up = t >= up_from and (down_from is None or t < down_from)
        rows.append((key("up", instance, pool), "gauge", ms, 1.0 if up else 0.0))
        if not up:
            continue
        scrapes += 1
        rows.append((key("vllm:kv_cache_usage_perc", instance, pool, **vllm), "gauge", ms, kv))
        rows.append((key("vllm:num_requests_waiting", instance, pool, **vllm), "gauge", ms,
                     queue))
        for le, inc in zip(LES, ttft, strict=True):
            rows.append((key("vllm:time_to_first_token_seconds_bucket", instance, pool,
                             le=le, **vllm), "histogram", ms, float(inc * scrapes)))
    store.write(rows)


def config(*slos: SloConfig) -> Config:
    return Config(pools=[POOL, PoolConfig(name="batch", model="llama")], slos=list(slos))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


def noise(store: Store) -> None:
    """Series that must not count: another pool, and the pool's DCGM exporter target."""
    write_replica(store, "b1", kv=0.99, queue=500, ttft=SLOW_TTFT, pool="batch")
    store.write([(key("up", "dcgm-1", kind="dcgm"), "gauge", round(t * 1000), 1.0)
                 for t in sample_times(AT, 20 * MIN, STEP)])


def test_recommend_for_pool_scales_out_a_hot_pool(store: Store) -> None:
    write_replica(store, "r1", kv=0.90, queue=10, ttft=SLOW_TTFT)
    write_replica(store, "r2", kv=0.80, queue=5, ttft=SLOW_TTFT)
    write_replica(store, "r3", kv=0.85, queue=0, ttft=SLOW_TTFT)
    noise(store)
    source = EmbeddedSource(store)
    rec = recommend_for_pool(source, config(), POOL, AT)
    assert rec.signals["kv_cache_usage"] == pytest.approx(0.85)  # mean over replicas
    assert rec.signals["kv_cache_usage_max"] == pytest.approx(0.90)
    assert rec.signals["queue_length"] == 15  # sum over replicas
    assert rec.signals["ttft_p95_seconds"] == pytest.approx(0.75)
    assert rec.current == 3
    assert rec.action == "scale_out"
    assert {r.signal for r in rec.reasons} == {SIGNAL_KV, SIGNAL_TTFT}
    # worst: TTFT 0.75 / 0.64 = 1.17 -> ceil(3 × 1.17) = 4
    assert rec.desired == 4
    assert rec.next_decision_at == AT
    assert last_scale_out_at(source, POOL, AT, 600) is None


def test_recommend_for_pool_uses_the_pools_ttft_slo(store: Store) -> None:
    for r in ("r1", "r2"):
        write_replica(store, r, kv=0.5, queue=0, ttft=SLOW_TTFT)
    lax = SloConfig(name="ttft", pool="chat", indicator="ttft", threshold_seconds=1.0)
    assert ttft_threshold_for(config(lax), POOL) == 1.0
    assert recommend_for_pool(EmbeddedSource(store), config(lax), POOL, AT).action == "hold"
    strict = SloConfig(name="ttft-chat", pool="chat", indicator="ttft", endpoint="chat")
    assert ttft_threshold_for(config(lax, strict), POOL) == 0.8  # the strictest wins
    assert ttft_threshold_for(config(), POOL) == 0.8


def test_recommend_for_pool_follows_a_real_scale_out_into_cooldown(store: Store) -> None:
    for r in ("r1", "r2", "r3"):
        write_replica(store, r, kv=0.85, queue=0, ttft=FAST_TTFT)
    write_replica(store, "r4", kv=0.85, queue=0, ttft=FAST_TTFT, up_from=AT - 2 * MIN)
    noise(store)
    source = EmbeddedSource(store)
    assert current_replicas(source, POOL, AT) == 4
    assert current_replicas(source, POOL, AT - 3 * MIN) == 3
    assert last_scale_out_at(source, POOL, AT, 300) == AT - 2 * MIN
    rec = recommend_for_pool(source, config(), POOL, AT)
    assert (rec.action, rec.current, rec.desired) == ("hold", 4, 4)
    assert rec.next_decision_at == AT - 2 * MIN + 300
    assert rec.reasons[0].signal == SIGNAL_COOLDOWN
    assert rec.reasons[1].signal == SIGNAL_KV  # still hot, held back by the cooldown
    # Three minutes later the cooldown is over (no new data: the signals are still fresh
    # enough for the lookback, the trigger fires again).
    later = recommend_for_pool(source, config(), POOL, AT - 2 * MIN + 300)
    assert later.action == "scale_out"


def test_recommend_for_pool_scales_in_an_idle_pool_one_step(store: Store) -> None:
    for r in ("r1", "r2", "r3"):
        write_replica(store, r, kv=0.10, queue=0, ttft=FAST_TTFT)
    noise(store)
    rec = recommend_for_pool(EmbeddedSource(store), config(), POOL, AT)
    assert rec.signals["ttft_p95_seconds"] == pytest.approx(0.175)
    assert (rec.action, rec.current, rec.desired) == ("scale_in", 3, 2)


def test_recommend_for_pool_restarts_the_hold_after_a_scale_in(store: Store) -> None:
    for r in ("r1", "r2"):
        write_replica(store, r, kv=0.10, queue=0, ttft=FAST_TTFT)
    write_replica(store, "r3", kv=0.10, queue=0, ttft=FAST_TTFT, down_from=AT - 6 * MIN)
    source = EmbeddedSource(store)
    assert last_scale_in_at(source, POOL, AT, 600) == AT - 6 * MIN
    rec = recommend_for_pool(source, config(), POOL, AT)
    assert (rec.action, rec.current) == ("hold", 2)
    assert rec.reasons[0].signal == SIGNAL_SCALE_IN_HOLD
    assert rec.reasons[0].value == pytest.approx(6 * MIN)


def test_a_pool_vigil_just_started_watching_is_not_in_a_scale_out_cooldown(
    store: Store,
) -> None:
    # The collector found both replicas (its first scrapes, 15 s apart): that is discovery,
    # not a scale-out, so a full KV cache is acted on at once.
    write_replica(store, "r1", kv=0.95, queue=0, ttft=FAST_TTFT, start=AT - 3 * MIN,
                  up_from=AT - 3 * MIN)
    write_replica(store, "r2", kv=0.95, queue=0, ttft=FAST_TTFT, start=AT - 3 * MIN + 15,
                  up_from=AT - 3 * MIN + 15)
    source = EmbeddedSource(store)
    assert last_scale_out_at(source, POOL, AT, 600) is None
    rec = recommend_for_pool(source, config(), POOL, AT)
    assert (rec.action, rec.current) == ("scale_out", 2)


def test_a_replica_added_after_discovery_is_a_scale_out(store: Store) -> None:
    write_replica(store, "r1", kv=0.95, queue=0, ttft=FAST_TTFT, start=AT - 4 * MIN,
                  up_from=AT - 4 * MIN)
    write_replica(store, "r2", kv=0.95, queue=0, ttft=FAST_TTFT, start=AT - 2 * MIN,
                  up_from=AT - 2 * MIN)
    source = EmbeddedSource(store)
    assert last_scale_out_at(source, POOL, AT, 600) == AT - 2 * MIN
    rec = recommend_for_pool(source, config(), POOL, AT)
    assert rec.action == "hold"
    assert rec.next_decision_at == AT - 2 * MIN + 300


def test_the_ttft_signal_is_the_configured_quantile(store: Store) -> None:
    write_replica(store, "r1", kv=0.5, queue=0, ttft=SLOW_TTFT)
    source = EmbeddedSource(store)
    median = Config(pools=[POOL], scaling=ScalingConfig(scale_out_ttft_quantile=0.5))
    # p50: rank 5 of 10 in (0.1, 0.25], 3 of its 4 -> 0.1 + 0.15 × 3/4
    assert recommend_for_pool(source, median, POOL, AT).signals["ttft_p95_seconds"] == (
        pytest.approx(0.2125))
    assert recommend_for_pool(source, config(), POOL, AT).signals["ttft_p95_seconds"] == (
        pytest.approx(0.75))


def test_pool_signals_timelines_and_empty_pool(store: Store) -> None:
    write_replica(store, "r1", kv=0.4, queue=2, ttft=FAST_TTFT, start=AT - 7 * MIN,
                  up_from=AT - 7 * MIN)
    source = EmbeddedSource(store)
    sig = pool_signals(source, POOL, AT, scaling=SCALING)
    # 10 minutes of 15 s steps, but data only for the last 7 (and the lookback reaches no
    # further back than the first sample).
    assert [t for t, _ in sig.kv_mean] == sample_times(AT, 7 * MIN, STEP)
    assert sig.queue[-1] == (AT, 2.0)
    assert all(t >= AT - 5 * MIN for t, _ in sig.ttft_p95)
    empty = recommend_for_pool(source, config(), PoolConfig(name="nobody", model="m"), AT)
    assert (empty.action, empty.current, empty.desired) == ("scale_out", 0, 1)
    assert empty.signals == {"kv_cache_usage": None, "queue_length": None,
                             "ttft_p95_seconds": None, "kv_cache_usage_max": None}
