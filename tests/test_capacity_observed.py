"""Observed capacity from a store's history, hand-computed.

Two replicas are scraped every minute; each quarter hour (the plan step) carries one load level
per replica, with a known share of requests over the TTFT (0.5 s) and e2e (10 s) thresholds,
both bucket bounds so that attainment is read off the buckets exactly. Counters grow by the same
amount every scrape of a step, so ``increase`` over a step is exactly that step's load.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest
from support.fleet import AT, LATENCY_LE, MODEL, TTFT_LE, target_labels, vllm_labels

from collector.store import Store
from slo.planning.capacity_observed import (
    REASON_NEVER_FAILED,
    REASON_NO_LATENCY_SLO,
    REASON_NOT_LOAD_BOUND,
    _verdict,
    assess_observed,
    latency_targets,
    observed_capacity,
    rate_latency_curve,
)
from slo.sources.embedded import EmbeddedSource
from vigil.config import Config, parse_config
from vigil.model import SeriesKey, labels_of

SCRAPE_S = 60.0
STEP_S = 900.0
INSTANCES = ("chat-0", "chat-1")
#: Fast / slow latencies (seconds) either side of the thresholds.
TTFT_FAST, TTFT_SLOW, E2E_FAST, E2E_SLOW = 0.1, 1.0, 5.0, 12.0
PROMPT_TOKENS, OUTPUT_TOKENS = 500, 100


def _config(*, slos: bool = True) -> Config:
    return parse_config({
        "pools": [{"name": "chat", "model": MODEL, "gpu": "H100"}],
        "targets": [{"name": n, "url": f"http://127.0.0.1:{9 + i}/metrics", "pool": "chat",
                     "scrape_interval": SCRAPE_S} for i, n in enumerate(INSTANCES)],
        "slos": [
            {"name": "chat-ttft", "pool": "chat", "indicator": "ttft",
             "threshold_seconds": 0.5, "objective": 0.95},
            {"name": "chat-e2e", "pool": "chat", "indicator": "e2e",
             "threshold_seconds": 10.0, "objective": 0.9},
        ] if slos else [
            {"name": "chat-errors", "pool": "chat", "indicator": "error_rate"},
        ],
    })


class Level(NamedTuple):
    """One step's load per replica and scrape: ``n`` requests, of which ``slow_ttft`` over the
    TTFT threshold and ``slow_e2e`` over the e2e one; ``running`` requests in flight."""

    n: int
    slow_ttft: int = 0
    slow_e2e: int = 0
    running: float = 0.0

    @property
    def rps(self) -> float:
        return self.n / SCRAPE_S


def _write(store: Store, levels: Sequence[Level]) -> float:
    """The levels, oldest first, as quarter hours ending at ``AT``; returns the span (s)."""
    span = len(levels) * STEP_S
    start = AT - span
    per_step = round(STEP_S / SCRAPE_S)
    rows: list[tuple[SeriesKey, str, int, float | None]] = []

    def scrapes() -> Iterator[tuple[int, Level]]:
        # Two scrapes before the span so that the first step's window has its own increase.
        for j in range(-2, len(levels) * per_step + 1):
            yield j, levels[min(max(math.ceil(j / per_step) - 1, 0), len(levels) - 1)]

    for inst in INSTANCES:
        labels = vllm_labels(inst)
        totals: dict[tuple[str, str], float] = {}

        def add(name: str, extra: dict[str, str], family: str, inc: float, ts: int,
                _labels: dict[str, str] = labels, _totals: dict = totals) -> None:
            key = (name, ",".join(f"{k}={v}" for k, v in sorted(extra.items())))
            # Counters start well above 0, as after a day of serving.
            _totals[key] = _totals.get(key, 1_000_000.0) + inc
            rows.append((SeriesKey(name, labels_of({**_labels, **extra})), family, ts,
                         _totals[key]))

        for j, lv in scrapes():
            ts = round((start + j * SCRAPE_S) * 1000)
            rows.append((SeriesKey("up", labels_of(target_labels(inst))), "gauge", ts, 1.0))
            rows.append((SeriesKey("vllm:num_requests_running", labels_of(labels)), "gauge", ts,
                         lv.running))
            add("vllm:request_success_total", {"finished_reason": "stop"}, "counter", lv.n, ts)
            add("vllm:request_success_total", {"finished_reason": "error"}, "counter", 0, ts)
            add("vllm:generation_tokens_total", {}, "counter", lv.n * OUTPUT_TOKENS, ts)
            for base, bounds, fast, slow, n_slow in (
                ("vllm:time_to_first_token_seconds", TTFT_LE, TTFT_FAST, TTFT_SLOW,
                 lv.slow_ttft),
                ("vllm:e2e_request_latency_seconds", LATENCY_LE, E2E_FAST, E2E_SLOW,
                 lv.slow_e2e),
            ):
                for le in bounds:
                    within = (lv.n - n_slow) * (fast <= float(le)) + n_slow * (slow <= float(le))
                    add(base + "_bucket", {"le": le}, "histogram", within, ts)
                add(base + "_count", {}, "histogram", lv.n, ts)
                add(base + "_sum", {}, "histogram", (lv.n - n_slow) * fast + n_slow * slow, ts)
            for base, tokens in (("vllm:request_prompt_tokens", PROMPT_TOKENS),
                                 ("vllm:request_generation_tokens", OUTPUT_TOKENS)):
                add(base + "_count", {}, "histogram", lv.n, ts)
                add(base + "_sum", {}, "histogram", lv.n * tokens, ts)
    store.write(rows)
    return span


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


# Per replica and scrape (60 s). Two replicas, 15 scrapes a step: a step judges 30 x n requests.
KNEE = [
    Level(3, slow_ttft=3, running=0.1),         # 0.05 rps: 90 requests, too light to judge
    Level(60, running=2.0),                     # 1 rps: pass
    Level(300, slow_ttft=30, running=10.0),     # 5 rps: TTFT 0.90 < 0.95, fail
    Level(120, slow_ttft=1, running=4.0),       # 2 rps: pass
    Level(420, running=14.0),                   # 7 rps, all fast (cheap requests): pass
    Level(180, slow_ttft=3, running=6.0),       # 3 rps: pass
    Level(270, slow_ttft=13, running=9.0),      # 4.5 rps: 0.9519 +- 0.005, unresolved
    Level(240, slow_ttft=6, running=8.0),       # 4 rps: TTFT 0.975, the capacity
    Level(360, slow_e2e=72, running=12.0),      # 6 rps: e2e 0.80 < 0.90, fail
]


def test_the_curve_has_each_steps_rate_latency_and_verdict(store: Store) -> None:
    span = _write(store, KNEE)
    curve = rate_latency_curve(EmbeddedSource(store), _config(), _config().pools[0], AT, span,
                               STEP_S)
    assert [p.t_s for p in curve] == [AT - span + (k + 1) * STEP_S for k in range(len(KNEE))]
    assert [p.replicas for p in curve] == pytest.approx([2.0] * len(KNEE))
    assert [p.rps_per_replica for p in curve] == pytest.approx([lv.rps for lv in KNEE])
    assert [p.verdict for p in curve] == ["light", "pass", "fail", "pass", "pass", "pass",
                                          "unresolved", "pass", "fail"]
    assert [p.met for p in curve] == [p.verdict == "pass" for p in curve]
    knee = curve[7]
    assert knee.attainment_by_slo == pytest.approx({"chat-ttft": 234 / 240, "chat-e2e": 1.0})
    assert knee.requests == pytest.approx(240 * 15 * 2)
    assert knee.running_per_replica == pytest.approx(8.0)
    assert knee.output_tokens_per_s_per_replica == pytest.approx(4.0 * OUTPUT_TOKENS)
    # Every TTFT of step 1 is 0.1 s, in the (0.08, 0.1] bucket: 0.08 + 0.02 x 0.95.
    assert curve[1].ttft_p95_s == pytest.approx(0.099)
    assert curve[1].e2e_p95_s == pytest.approx(2.5 + 2.5 * 0.95)  # (2.5, 5.0] bucket
    # 10 % of step 2 over 1.0 s: the p95 is in the (0.75, 1.0] bucket.
    assert 0.75 < curve[2].ttft_p95_s <= 1.0


def test_observed_capacity_is_the_highest_pass_below_the_lightest_failure(
        store: Store) -> None:
    span = _write(store, KNEE)
    config = _config()
    found = assess_observed(EmbeddedSource(store), config, config.pools[0], AT, span)
    profile = found.profile
    assert profile is not None and found.reason == ""
    assert profile.basis == "observed" and profile.pool == "chat" and profile.source == "store"
    # The 7 rps pass is above the 5 rps failure and left out; the 4.5 rps step is undecided.
    best = profile.probes[0]
    assert best.throughput_rps == pytest.approx(4.0)
    assert profile.max_goodput_rps == pytest.approx(4.0 * 234 / 240)
    assert profile.max_concurrency == 8
    assert profile.max_output_tokens_per_s == pytest.approx(400.0)
    assert profile.probes[1].throughput_rps == pytest.approx(5.0)
    assert not profile.probes[1].passed and best.passed
    assert profile.precision == pytest.approx(0.25)
    assert profile.identity.model == MODEL and profile.identity.gpu == "H100"
    assert (profile.identity.prompt_tokens, profile.identity.output_tokens) == (500, 100)
    assert [s.name for s in profile.slos] == ["chat-ttft", "chat-e2e"]
    notes = " ".join(profile.notes)
    assert "2h15m" in notes and "9 steps" in notes and "1 passing step(s) above" in notes
    assert observed_capacity(EmbeddedSource(store), config, config.pools[0], AT,
                             span) == profile


def test_a_history_that_never_fails_gives_only_a_lower_bound(store: Store) -> None:
    span = _write(store, [Level(60), Level(180, slow_ttft=2), Level(120)])
    config = _config()
    found = assess_observed(EmbeddedSource(store), config, config.pools[0], AT, span)
    assert found.profile is None
    assert found.reason.startswith(REASON_NEVER_FAILED)
    assert found.lower_bound_rps == pytest.approx(3.0)
    assert "at least 3 requests/s per replica" in found.reason


def test_light_steps_are_not_judged_even_when_slow(store: Store) -> None:
    # 90 requests a step, all over the TTFT threshold: under min_probe_requests (100).
    span = _write(store, [Level(3, slow_ttft=3), Level(60)])
    config = _config()
    found = assess_observed(EmbeddedSource(store), config, config.pools[0], AT, span)
    assert [p.verdict for p in found.curve] == ["light", "pass"]
    assert found.profile is None and found.reason.startswith(REASON_NEVER_FAILED)


def test_failures_at_the_lightest_load_mean_latency_is_not_load_bound(store: Store) -> None:
    span = _write(store, [Level(60, slow_ttft=30), Level(240)])
    config = _config()
    found = assess_observed(EmbeddedSource(store), config, config.pools[0], AT, span)
    assert found.profile is None and found.reason == REASON_NOT_LOAD_BOUND


def test_a_pool_without_latency_slos_has_no_observed_capacity(store: Store) -> None:
    span = _write(store, KNEE)
    config = _config(slos=False)
    found = assess_observed(EmbeddedSource(store), config, config.pools[0], AT, span)
    assert found.profile is None and found.reason == REASON_NO_LATENCY_SLO


def test_an_empty_history_has_no_curve(store: Store) -> None:
    config = _config()
    assert rate_latency_curve(EmbeddedSource(store), config, config.pools[0], AT, 3600.0,
                              STEP_S) == []
    assert observed_capacity(EmbeddedSource(store), config, config.pools[0], AT,
                             3600.0) is None


def test_a_share_above_one_does_not_break_the_verdict() -> None:
    # Non-monotonic buckets can count more below a threshold than the +Inf bucket holds.
    config = _config()
    targets = latency_targets(config, config.pools[0])
    shares = {"chat-ttft": (1.02, 3000.0), "chat-e2e": (-0.01, 3000.0)}
    verdict, intervals = _verdict(3000.0, shares, targets, 100, 0.95)
    assert intervals["chat-ttft"][1] == 1.0 and intervals["chat-e2e"][0] == 0.0
    assert verdict == "fail"
