"""The scaling-advice scorecard: every scale-out and scale-in the policy recommended over a
history, judged against what the pool's SLOs then did.

Decisions are ``vigil serve``'s where the history kept them (``vigil_scaling_desired_replicas``
and ``vigil_scaling_current_replicas{pool}``, in a Prometheus that scraped serve), else the
policy's replay on the same history (``slo.backtest.decisions``); the triggers that were over
their thresholds at each instant always come from the replay, which has the reasons. The pool
*burns* at an instant when any of its SLOs burns its budget faster than the period allows over
the alert table's shortest window (burn rate > 1, as the backtest's missed burns count it).

* **Scale-out** (a run of consecutive ``scale_out`` decisions counts once, at its first): did
  the burn stop within ``[scaling] spinup + cooldown`` (the time the new replicas need to load
  and the policy waits before judging again)? ``outcome``: ``burn stopped`` (burning at the
  decision, not at some instant before the deadline), ``still burning`` (burning throughout),
  ``burn followed`` (not burning at the decision, burning before the deadline), ``no burn``.
  ``replicas_added``: how many more replicas were up by the deadline (0: the advice was not
  followed, and the outcome says what not following it cost).
* **Scale-in**: the pool's lower bound (``slo.cost.waste``: ``ceil(λ / μ)`` replicas, λ the
  finished-request rate averaged over ``[scaling] scale_in_hold``, μ the capacity profile's
  requests/s per replica) had allowed the new count since ``lower_bound_since``; a scale-in
  later than that plus the hold (the policy's own deliberate wait) is ``too_late``, and
  ``gpu_hours_above_lower_bound`` is what the replicas above the bound cost while the pool
  waited, from ``lower_bound_since`` to the decision. Without a capacity profile there is no
  bound, and these are ``None``.
* **Triggers** (KV-cache usage, queue length, TTFT): each stretch in which a trigger was over
  its threshold (or projected over it) is an ``early warning`` when a burn began within
  ``spinup + cooldown`` after it started, ``late`` when the pool was already burning, else
  ``noise``. Per burn: which trigger fired first (from ``spinup + cooldown`` before the burn
  began to its end), and each one's lead (seconds before the burn began; negative: after).
  A trigger that warns early and rarely cries wolf is worth scaling on; one that is late or
  noisy for this traffic is not (KV-cache usage can stay low while the queue grows).

Units: Unix seconds, seconds, GPU-hours, replicas.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slo.backtest.decisions import SignalTracks, replay_fast
from slo.backtest.episodes import burn_runs, runs
from slo.backtest.run import Backtest
from slo.cost.pool import gpu_hours_of
from slo.promql.lookup import BoolArray, FloatArray
from slo.promql.tracks import Grid
from slo.scaling.policy import (
    SIGNAL_KV,
    SIGNAL_QUEUE,
    SIGNAL_TTFT,
    CapacitySizing,
    Recommendation,
    action_of,
)
from slo.scaling.signals import ttft_threshold_for
from slo.sources.protocol import RangeSource
from vigil.capacity import CEIL_DECIMALS
from vigil.config import Config, PoolConfig
from vigil.conventions import LABEL_POOL, METRIC_CURRENT_REPLICAS, METRIC_DESIRED_REPLICAS

__all__ = ["TRIGGERS", "Decision", "PoolScorecard", "kept_decisions", "scorecard",
           "scorecards"]

#: The scale-out triggers, in the policy's order.
TRIGGERS = (SIGNAL_KV, SIGNAL_QUEUE, SIGNAL_TTFT)


@dataclass(frozen=True)
class Decision:
    """One evaluation: the replica counts and action (serve's where kept, else the
    replay's), the triggers over their thresholds there (the replay's), and whether serve
    kept it."""

    at: float
    current: int
    desired: int
    triggers: frozenset[str]
    kept: bool

    @property
    def action(self) -> str:
        return action_of(self.current, self.desired)


def _triggers(rec: Recommendation) -> frozenset[str]:
    # A scale-out trigger's reason compares with ">" (scale-in reasons use "<" and "<=").
    return frozenset(r.signal for r in rec.reasons
                     if r.signal in TRIGGERS and r.comparison == ">")


def kept_decisions(source: RangeSource, pool: PoolConfig, grid: Grid
                   ) -> dict[int, tuple[int, int]]:
    """``{grid index: (current, desired)}`` where serve's exported decision for the pool is in
    the history (``vigil_scaling_*_replicas{pool="<name>"}``; with several series, e.g. two
    serve instances scraped, the first in label order)."""
    matchers = {LABEL_POOL: pool.name}
    tracks = []
    for metric in (METRIC_CURRENT_REPLICAS, METRIC_DESIRED_REPLICAS):
        found = source.instant_range(metric, matchers, grid)
        tracks.append(found[min(found)] if found else None)
    current, desired = tracks
    if current is None or desired is None:
        return {}
    both = current.present & desired.present
    with np.errstate(invalid="ignore"):
        both &= np.isfinite(current.values) & np.isfinite(desired.values)
    return {int(i): (int(current.values[i]), int(desired.values[i]))
            for i in np.flatnonzero(both)}


@dataclass(frozen=True)
class PoolScorecard:
    """One pool's scorecard (see the module docstring); ``to_dict`` is its JSON."""

    pool: str
    decisions: list[Decision]
    interval_s: float
    scale_outs: list[dict[str, Any]]
    scale_ins: list[dict[str, Any]]
    burns: list[dict[str, Any]]
    triggers: dict[str, dict[str, Any]]
    slos: list[str]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        kept = sum(1 for d in self.decisions if d.kept)
        return {
            "decisions": ("kept" if kept == len(self.decisions) and kept
                          else "replay" if not kept else "kept+replay"),
            "kept_evaluations": kept,
            "evaluations": len(self.decisions),
            "interval_seconds": self.interval_s,
            "slos": self.slos,
            "scale_outs": self.scale_outs,
            "scale_ins": self.scale_ins,
            "burns": self.burns,
            "triggers": self.triggers,
            "notes": self.notes,
        }


def _burning(backtest: Backtest, pool: PoolConfig) -> tuple[BoolArray, list[str], float]:
    """Where any of the pool's SLOs burned faster than 1 over its shortest window, on the
    backtest's grid; their names; the shortest long window of their alert tables."""
    mine = [s for s in backtest.slos if s.spec.pool == pool.name]
    mask = np.zeros(backtest.grid.n, dtype=np.bool_)
    with np.errstate(invalid="ignore"):
        for s in mine:
            mask |= s.burn > 1.0
    merge = min((min(r.long_window for r in s.rows) for s in mine if s.rows), default=3600.0)
    return mask, [s.spec.name for s in mine], merge


def _mean_over(values: FloatArray, width: int) -> FloatArray:
    """The mean of the finite values among the last ``width`` samples at each index (NaN
    where there are none)."""
    finite = np.isfinite(values)
    sums = np.concatenate(([0.0], np.cumsum(np.where(finite, values, 0.0))))
    counts = np.concatenate(([0], np.cumsum(finite)))
    idx = np.arange(values.size)
    lo = np.maximum(0, idx + 1 - width)
    n = counts[idx + 1] - counts[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (sums[idx + 1] - sums[lo]) / n, np.nan)


def scorecard(backtest: Backtest, source: RangeSource, config: Config, pool: PoolConfig, *,
              every_s: float | None = None,
              replayed: tuple[list[tuple[float, Recommendation]], SignalTracks] | None = None
              ) -> PoolScorecard:
    """The pool's scorecard over the backtest's history. ``every_s``: the decision interval
    (default ``[collector] scrape_interval``, as serve decides); ``replayed``: the replay
    when already run."""
    scaling = config.scaling
    decisions_rec, tracks = replayed if replayed is not None else replay_fast(
        source, config, pool, backtest.start, backtest.end, every_s=every_s)
    notes: list[str] = []
    times = np.array([t for t, _ in decisions_rec], dtype=np.float64)
    if not decisions_rec:
        return PoolScorecard(pool.name, [], every_s or 0.0, [], [], [], {}, [], notes)
    interval = float(times[1] - times[0]) if times.size > 1 else float(
        every_s or config.collector.scrape_interval)
    eval_grid = Grid(round(times[0] * 1000), round(interval * 1000), times.size)
    kept = kept_decisions(source, pool, eval_grid)
    decisions = []
    for i, (t, rec) in enumerate(decisions_rec):
        cur, want = kept.get(i, (rec.current, rec.desired))
        decisions.append(Decision(t, cur, want, _triggers(rec), i in kept))

    horizon = float(scaling.spinup) + float(scaling.cooldown)
    hold = float(scaling.scale_in_hold)
    burning, slo_names, merge_s = _burning(backtest, pool)
    grid_t = backtest.grid.instants_ms() / 1000
    step_s = backtest.grid.step_ms / 1000

    def burning_at(t: float) -> bool:
        # The newest evaluation of the SLO rules at or before t.
        i = int(np.searchsorted(grid_t, t, side="right")) - 1
        return bool(burning[i]) if i >= 0 else False

    def first_time(state: bool, t0: float, t1: float) -> float | None:
        # The first evaluation in (t0, t1] at which the pool's burning is `state`.
        lo = int(np.searchsorted(grid_t, t0, side="right"))
        hi = int(np.searchsorted(grid_t, t1, side="right"))
        found = np.flatnonzero(burning[lo:hi] == state)
        return float(grid_t[lo + found[0]]) if found.size else None

    current = np.array([d.current for d in decisions])
    flags = {sig: np.array([sig in d.triggers for d in decisions], dtype=np.bool_)
             for sig in TRIGGERS}
    starts = {sig: [a for a, _ in runs(f)] for sig, f in flags.items()}

    def run_start(sig: str, i: int) -> float:
        # The first decision of the run of `sig` that holds index i.
        return float(times[starts[sig][bisect.bisect_right(starts[sig], i) - 1]])

    scale_outs: list[dict[str, Any]] = []
    actions = np.array([d.action for d in decisions])
    # A scale-out no load signal asked for brings the count up to min_replicas (a pool with
    # no replica up yet, or all lost): a bound, not advice to judge.
    bounds = 0
    for a, b in runs(actions == "scale_out"):
        d = decisions[a]
        if not any(x.triggers for x in decisions[a:b]):
            bounds += 1
            continue
        deadline = d.at + horizon
        hot = burning_at(d.at)
        if hot:
            calm = first_time(False, d.at, deadline)
            outcome = "burn stopped" if calm is not None else "still burning"
            after = None if calm is None else calm - d.at
        else:
            began = first_time(True, d.at, deadline)
            outcome = "burn followed" if began is not None else "no burn"
            after = None if began is None else began - d.at
        later = (times > d.at) & (times <= deadline)
        added = int(current[later].max()) - d.current if later.any() else 0
        fired = sorted(d.triggers, key=lambda s: (run_start(s, a), TRIGGERS.index(s)))
        scale_outs.append({
            "at": d.at, "current": d.current,
            "desired": max(x.desired for x in decisions[a:b]),
            "kept": d.kept, "triggers": fired, "first_trigger": fired[0] if fired else None,
            "burning": hot, "outcome": outcome,
            "burn_stopped_after_seconds": after if outcome == "burn stopped" else None,
            "burn_began_after_seconds": after if outcome == "burn followed" else None,
            "replicas_added": max(0, added), "deadline": deadline,
        })

    # The capacity the replay sized with (serve's saved profile), for the lower bound.
    sizing = decisions_rec[0][1].capacity
    scale_ins = _scale_ins(decisions, actions, times, tracks, sizing, pool, hold, notes)

    # Burns: stretches of burning joined across calm gaps shorter than the shortest long
    # window (as missed burns are), each judged by the triggers around it.
    merge = max(1, int(merge_s // step_s))
    burns: list[dict[str, Any]] = []
    burn_spans: list[tuple[float, float]] = []
    for a, b in burn_runs(np.where(burning, 2.0, 0.0), np.ones(burning.size, np.bool_), merge):
        b0, b1 = float(grid_t[a]), float(grid_t[b - 1])
        burn_spans.append((b0, b1))
        lead: dict[str, float | None] = {}
        for sig in TRIGGERS:
            near = (times >= b0 - horizon) & (times <= b1) & flags[sig]
            idx = np.flatnonzero(near)
            lead[sig] = None if not idx.size else b0 - run_start(sig, int(idx[0]))
        fired = [s for s in TRIGGERS if lead[s] is not None]
        first = max(fired, key=lambda s: (lead[s], -TRIGGERS.index(s))) if fired else None
        burns.append({"start": b0, "end": b1, "first_trigger": first,
                      "trigger_lead_seconds": lead})

    triggers: dict[str, dict[str, Any]] = {}
    # What each trigger compares with: a ratio, requests, seconds.
    thresholds = {SIGNAL_KV: float(scaling.scale_out_kv_usage),
                  SIGNAL_QUEUE: float(scaling.scale_out_queue_length),
                  SIGNAL_TTFT: float(scaling.scale_out_ttft_ratio)
                  * ttft_threshold_for(config, pool)}
    for sig in TRIGGERS:
        early = late = noise = 0
        leads: list[float] = []
        for a, _ in runs(flags[sig]):
            t = float(times[a])
            if any(b0 <= t <= b1 for b0, b1 in burn_spans):
                late += 1
                continue
            nxt = [b0 for b0, _ in burn_spans if t < b0 <= t + horizon]
            if nxt:
                early += 1
                leads.append(nxt[0] - t)
            else:
                noise += 1
        warned = sum(1 for b in burns if b["trigger_lead_seconds"][sig] is not None)
        triggers[sig] = {
            "threshold": thresholds[sig],
            "firings": early + late + noise, "early_warnings": early, "late": late,
            "noise": noise, "burns_warned": warned, "burns_missed": len(burns) - warned,
            "first": sum(1 for b in burns if b["first_trigger"] == sig),
            "median_lead_seconds": statistics.median(leads) if leads else None,
        }
    if not slo_names:
        notes.append(f"pool {pool.name!r} has no SLO: no burn to judge the advice by")
    if bounds:
        notes.append(f"{bounds} scale-out{'s' if bounds > 1 else ''} to min_replicas "
                     f"({pool.min_replicas}) with no load trigger not scored")
    return PoolScorecard(pool.name, decisions, interval, scale_outs, scale_ins, burns,
                         triggers, slo_names, notes)


def _scale_ins(decisions: Sequence[Decision], actions: np.ndarray, times: FloatArray,
               tracks: SignalTracks, sizing: CapacitySizing | None, pool: PoolConfig,
               hold: float, notes: list[str]) -> list[dict[str, Any]]:
    """Each scale-in, with how long the lower bound had allowed it and what waiting cost."""
    lower: FloatArray | None = None
    if sizing is None or tracks.rate is None:
        notes.append("no capacity profile for the pool: scale-ins are not judged against "
                     "the lower bound (save one with `vigil capacity --save`)")
    else:
        # λ averaged over the scale-in hold, on the decision instants.
        sample_step = tracks.grid.step_ms / 1000
        mean = _mean_over(tracks.rate, max(1, round(hold / sample_step)))
        idx = [tracks.index(t) for t in times.tolist()]
        lam = mean[idx]
        with np.errstate(invalid="ignore"):
            lower = np.where(np.isfinite(lam),
                             np.ceil(np.round(lam / sizing.rps_per_replica, CEIL_DECIMALS)), np.nan)
    interval = float(times[1] - times[0]) if times.size > 1 else 0.0
    out: list[dict[str, Any]] = []
    for a, _ in runs(actions == "scale_in"):
        d = decisions[a]
        entry: dict[str, Any] = {"at": d.at, "current": d.current, "desired": d.desired,
                                 "kept": d.kept, "lower_bound_since": None,
                                 "late_by_seconds": None, "too_late": None,
                                 "gpu_hours_above_lower_bound": None}
        if lower is not None:
            floor = np.maximum(lower[:a + 1], pool.min_replicas)
            with np.errstate(invalid="ignore"):
                allowed = floor <= d.desired
            # The latest stretch, ending at the decision, in which the bound allowed it.
            if allowed[a]:
                before = np.flatnonzero(~allowed[:a])
                since_i = int(before[-1]) + 1 if before.size else 0
                since = float(times[since_i])
                late = max(0.0, d.at - since - hold)
                current = np.array([x.current for x in decisions[since_i:a]], dtype=float)
                excess = np.maximum(0.0, current - floor[since_i:a])
                entry.update({
                    "lower_bound_since": since, "late_by_seconds": late,
                    "too_late": late > interval,
                    "gpu_hours_above_lower_bound": gpu_hours_of(float(excess.sum()) * interval,
                                                                pool.gpus_per_replica),
                })
        out.append(entry)
    return out


def scorecards(backtest: Backtest, source: RangeSource, config: Config, *,
               every_s: float | None = None) -> dict[str, PoolScorecard]:
    """Every pool's scorecard over the backtest's history."""
    return {pool.name: scorecard(backtest, source, config, pool, every_s=every_s)
            for pool in config.pools}
