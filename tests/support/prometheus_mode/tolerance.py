"""The tolerance of the Prometheus-mode comparison, number by number, and the comparison.

The tolerance, per number (``compare_status``; derived in ``docs/deploying.md``, "How close
the two answers are"):

* each counter series ``s`` changes by the same raw amount ``N(s)`` in the window on both
  sides (checked); each side extrapolates it to the window's edges with its own factor
  ``k(s) >= 1``, a function of its sample instants (and of ``N(s)`` and the first value, which
  are the same on both sides). ``rho(s) = k_ours(s) / k_theirs(s)``; a ``Spread`` is the range
  ``[lo, hi]`` of ``rho`` over the series a number is made of (those with ``N(s) > 0``);
* a sum of increases (requests, tokens) differs by a factor in ``[lo, hi]``;
* a ratio of two such sums (an error ratio, a mean, a bucket fraction) by a factor in
  ``[lo_num / hi_den, hi_num / lo_den]``, and a quantile lies between the quantiles of the
  other side's buckets with every bucket fraction moved to either end of its own interval
  (``histogram_quantile`` falls as any fraction rises);
* gauges read at a paused instant (KV cache, queue, ``up``) are equal, as is everything made
  from them only (replica_up, GPU-hours, the KV and queue timelines of the scaling advice);
* the idle share counts samples, so it may differ by a few samples per run of idle samples
  and by the difference of the sample counts (``idle_share_bound``);
* derived numbers (burn rates, budgets, time to exhaustion, costs per request, the TTFT trend
  of the scaling advice) carry their inputs' intervals through their formulas.

A value whose interval straddles a threshold that decides something discrete (an alert, a
scaling reason, an anomaly's bucket) is reported as ambiguous instead of compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slo.objectives.burn_rate import slo_burn_alerts
from slo.objectives.spec import SloSpec, effective_slos
from slo.scaling.policy import fit_window_for, trend
from slo.scaling.signals import sample_times, ttft_threshold_for
from support.prometheus_mode.checker import Checker, masked
from support.prometheus_mode.samples import SeriesId, Sides, idle_share_bound
from vigil.config import Config
from vigil.conventions import (
    FINISHED_REASON_ERROR,
    LABEL_FINISHED_REASON,
    LABEL_MODEL_NAME,
    SUFFIX_COUNT,
    SUFFIX_SUM,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_ITL,
    VLLM_PROMPT_TOKENS_HIST,
    VLLM_QUEUE_TIME,
    VLLM_REQUEST_SUCCESS,
    VLLM_TTFT,
)
from vigil.durations import parse_duration

__all__ = ["StatusComparison", "TtftTrend", "compare_status"]


def _scaled(x: float | None, lo: float, hi: float) -> tuple[float, float]:
    return (0.0, 0.0) if x is None else (x * lo, x * hi)


@dataclass(frozen=True)
class TtftTrend:
    """Prometheus's TTFT p95 now ``(value, lo, hi)`` and its fitted line ``(slope, slope
    tolerance, projection, projection tolerance)``; either None without data."""

    now: tuple[float, float, float] | None
    line: tuple[float, float, float, float] | None

    def undecided(self, threshold: float) -> bool:
        """Whether the tolerance leaves open if TTFT is over ``threshold`` now or projected
        over it with a rising trend."""
        if self.now is not None and self.now[1] <= threshold <= self.now[2]:
            return True
        if self.line is None:
            return False
        slope, d_slope, projected, d_proj = self.line
        return (slope - d_slope <= 0 <= slope + d_slope
                or projected - d_proj <= threshold <= projected + d_proj)


class StatusComparison:
    """Compares ``vigil slo status`` from the store (``ours``) with the one from Prometheus
    (``theirs``) at ``at_s``, number by number, with the tolerance of this module's docstring."""

    def __init__(self, config: Config, sides: Sides, at_s: float) -> None:
        self.config = config
        self.sides = sides
        self.at = at_s
        self.check = Checker()

    # -- bounds by kind of number ----------------------------------------------------------
    def sum_of_increases(self, path: str, ours: Any, theirs: Any, w: float,
                         series: Sequence[SeriesId]) -> None:
        s = self.sides.spread(self.at, w, series)
        lo, hi = _scaled(theirs, s.lo, s.hi)
        self.check.within(path, ours, theirs, lo, hi, f"a sum of increases over {w:g}s: "
                          f"extrapolation factors differ by x[{s.lo:.6f}, {s.hi:.6f}]")

    def per_increase(self, path: str, ours: Any, theirs: Any, w: float,
                     series: Sequence[SeriesId], x_scale: tuple[float, float] = (1.0, 1.0),
                     ) -> None:
        """``x / sum of increases`` (a cost per request); ``x`` within ``x_scale`` × theirs."""
        s = self.sides.spread(self.at, w, series)
        lo, hi = _scaled(theirs, x_scale[0] / s.hi, x_scale[1] / s.lo)
        self.check.within(path, ours, theirs, lo, hi, f"per increase over {w:g}s")

    def ratio_bounds(self, theirs: float, w: float, num: Sequence[SeriesId],
                     den: Sequence[SeriesId]) -> tuple[float, float]:
        """A ratio of two sums of increases: each moves within the spread of its series."""
        n, d = self.sides.spread(self.at, w, num), self.sides.spread(self.at, w, den)
        return theirs * n.lo / d.hi, theirs * n.hi / d.lo

    def ratio(self, path: str, ours: Any, theirs: Any, w: float, num: Sequence[SeriesId],
              den: Sequence[SeriesId]) -> None:
        lo, hi = (0.0, 0.0) if theirs is None else self.ratio_bounds(theirs, w, num, den)
        self.check.within(path, ours, theirs, lo, hi, f"a ratio of increases over {w:g}s")

    def error_ratio_bounds(self, spec: SloSpec, theirs: float, w: float) -> tuple[float, float]:
        """The interval of an SLO's error ratio: ``bad / total`` for the error rate; ``1 - good
        fraction`` for latency, the good count being made of the buckets around the threshold;
        replica_up exact (``up`` never changes here)."""
        if spec.indicator == "replica_up":
            return theirs, theirs
        model = {LABEL_MODEL_NAME: spec.model}
        if spec.indicator == "error_rate":
            total = self.sides.counters((VLLM_REQUEST_SUCCESS,), **model)
            bad = self.sides.counters((VLLM_REQUEST_SUCCESS,), **model,
                                      **{LABEL_FINISHED_REASON: FINISHED_REASON_ERROR})
            return self.ratio_bounds(theirs, w, bad, total)
        base = VLLM_TTFT if spec.indicator == "ttft" else VLLM_E2E
        threshold = float(spec.threshold_seconds or 0.0)
        bounds = sorted(self.sides.bucket_bounds((base,)))
        around = [max((b for b in bounds if b < threshold), default=None),
                  min((b for b in bounds if b >= threshold), default=None)]
        good = [k for le in around if le is not None
                for k in self.sides.buckets_at(base, le, **model)]
        total = self.sides.buckets_at(base, math.inf, **model)
        good_lo, good_hi = self.ratio_bounds(1.0 - theirs, w, good, total)
        return 1.0 - min(1.0, good_hi), 1.0 - good_lo

    def quantile(self, path: str, ours: Any, theirs: Any, q: float, base: str, w: float,
                 model: str | None, at_s: float | None = None) -> tuple[float, float] | None:
        at = self.at if at_s is None else at_s
        bounds = self.sides.quantile_bounds(q, base, at, w, model)
        if bounds is None:
            self.check.within(path, ours, theirs, math.nan, math.nan, "no data")
            return None
        value, lo, hi = bounds
        if theirs is not None:
            # Our recomputation from Prometheus's own samples is what Prometheus answered.
            self.check.within(path + " (recomputed from Prometheus's samples)", value, theirs,
                              theirs, theirs, "the same samples")
        self.check.within(path, ours, theirs, lo, hi,
                          f"histogram_quantile({q}), every bucket fraction within the "
                          "spread of its series over the +Inf bucket's")
        return lo, hi

    # -- the document ----------------------------------------------------------------------
    def run(self, ours: dict[str, Any], theirs: dict[str, Any]) -> Checker:
        self.check.same(".source", (ours.get("source"), theirs.get("source")),
                        ("embedded", "prometheus"))
        for key in ("at", "promql_semantics", "window"):
            self.check.same(f".{key}", ours.get(key), theirs.get(key))
        for name in sorted(set(ours["pools"]) | set(theirs["pools"])):
            self.pool(f".pools.{name}", name, ours["pools"].get(name), theirs["pools"].get(name))
        self.slos(ours["slos"], theirs["slos"])
        self.anomalies(ours["anomalies"], theirs["anomalies"])
        rest = set(ours) | set(theirs)
        rest -= {"source", "at", "promql_semantics", "window", "pools", "slos", "anomalies"}
        for key in sorted(rest):
            self.check.same(f".{key}", ours.get(key), theirs.get(key))
        return self.check

    def pool(self, path: str, name: str, ours: Any, theirs: Any) -> None:
        if not isinstance(ours, dict) or not isinstance(theirs, dict):
            self.check.same(path, ours, theirs)
            return
        w = self.config.engine.window
        for model in sorted(set(ours["models"]) | set(theirs["models"])):
            a, b = ours["models"].get(model), theirs["models"].get(model)
            mpath = f"{path}.models.{model}"
            if a is None or b is None:
                self.check.same(mpath, a, b)
                continue
            self.model(mpath, model, a, b, w)
        kv_o, kv_t = ours["kv_cache_usage"], theirs["kv_cache_usage"]
        self.check.same(f"{path}.kv_cache_usage", kv_o, kv_t)
        for key in ("queue_length", "replicas_up"):
            self.check.same(f"{path}.{key}", ours[key], theirs[key])
        self.cost(f"{path}.cost", name, ours["cost"], theirs["cost"])
        self.scaling(f"{path}.scaling", name, ours["scaling"], theirs["scaling"])
        rest = (set(ours) | set(theirs)) - {"models", "kv_cache_usage", "queue_length",
                                            "replicas_up", "cost", "scaling"}
        for key in sorted(rest):
            self.check.same(f"{path}.{key}", ours.get(key), theirs.get(key))

    def model(self, path: str, model: str, ours: dict[str, Any], theirs: dict[str, Any],
              w: float) -> None:
        bases = {"ttft_seconds": VLLM_TTFT, "e2e_seconds": VLLM_E2E,
                 "queue_seconds": VLLM_QUEUE_TIME, "itl_seconds": VLLM_ITL}
        q_o, q_t = ours["quantiles"], theirs["quantiles"]
        for key in sorted(set(q_o) | set(q_t)):
            if key in bases and isinstance(q_o.get(key), dict):
                for qk in sorted(set(q_o[key]) | set(q_t[key])):
                    if qk == "bounds":
                        continue  # the bucket of each quantile, checked with the quantile
                    if not qk.startswith("p"):
                        self.check.same(f"{path}.quantiles.{key}.{qk}", q_o[key].get(qk),
                                        q_t[key].get(qk))
                        continue
                    q = float(qk[1:]) / 100
                    self.quantile(f"{path}.quantiles.{key}.{qk}", q_o[key].get(qk),
                                  q_t[key].get(qk), q, bases[key], w, model)
            else:
                self.check.same(f"{path}.quantiles.{key}", q_o.get(key), q_t.get(key))
        tokens = {"generated": VLLM_GENERATION_TOKENS_HIST, "prompt": VLLM_PROMPT_TOKENS_HIST}
        t_o, t_t = ours["tokens_per_request"], theirs["tokens_per_request"]
        for key in sorted(set(t_o) | set(t_t)):
            a, b = t_o.get(key) or {}, t_t.get(key) or {}
            if key not in tokens:
                self.check.same(f"{path}.tokens_per_request.{key}", a, b)
                continue
            match = {LABEL_MODEL_NAME: model}
            self.ratio(f"{path}.tokens_per_request.{key}.mean", a.get("mean"), b.get("mean"), w,
                       self.sides.counters((tokens[key] + SUFFIX_SUM,), **match),
                       self.sides.counters((tokens[key] + SUFFIX_COUNT,), **match))
            self.quantile(f"{path}.tokens_per_request.{key}.p95", a.get("p95"), b.get("p95"),
                          0.95, tokens[key], w, model)
        for key in sorted((set(ours) | set(theirs)) - {"quantiles", "tokens_per_request"}):
            self.check.same(f"{path}.{key}", ours.get(key), theirs.get(key))

    def cost(self, path: str, pool: str, ours: dict[str, Any], theirs: dict[str, Any]) -> None:
        w = self.config.engine.cost_window
        # GPU time counts each target's up samples in the window: two scrapers on one schedule
        # see one more or one fewer per target, each standing for its scrape interval.
        p = self.config.pool(pool)
        slack_h = sum(self.config.scrape_interval(t) for t in self.config.targets
                      if t.pool == pool and t.kind == "vllm") / 3600 * p.gpus_per_replica
        price = self.config.prices[p.gpu]
        hours = theirs["gpu_hours"]
        h_lo, h_hi = (0.0, 0.0) if hours is None else (max(0.0, hours - slack_h), hours + slack_h)
        self.check.within(f"{path}.gpu_hours", ours["gpu_hours"], hours, h_lo, h_hi,
                          "one up sample more or fewer per target")
        self.check.within(f"{path}.cost_usd", ours["cost_usd"], theirs["cost_usd"],
                          h_lo * price, h_hi * price, "gpu_hours x price")
        c_lo, c_hi = (1.0, 1.0) if not hours else (h_lo / hours, h_hi / hours)
        metric = {"requests": VLLM_REQUEST_SUCCESS, "output_tokens": VLLM_GENERATION_TOKENS,
                  "per_1000_requests": VLLM_REQUEST_SUCCESS,
                  "per_million_output_tokens": VLLM_GENERATION_TOKENS}
        for key in ("requests", "output_tokens"):
            self.sum_of_increases(f"{path}.{key}", ours[key], theirs[key], w,
                                  self.sides.counters((metric[key],)))
        for model in sorted(set(ours["models"]) | set(theirs["models"])):
            a, b = ours["models"].get(model) or {}, theirs["models"].get(model) or {}
            for key in sorted(set(a) | set(b)):
                series = self.sides.counters((metric.get(key, ""),), **{LABEL_MODEL_NAME: model})
                self.sum_of_increases(f"{path}.models.{model}.{key}", a.get(key), b.get(key), w,
                                      series)
        for key in ("per_1000_requests", "per_million_output_tokens"):
            self.per_increase(f"{path}.{key}", ours[key], theirs[key], w,
                              self.sides.counters((metric[key],)), (c_lo, c_hi))
        interval = max(self.config.scrape_interval(t) for t in self.config.targets)
        bound = idle_share_bound(self.sides, self.at, w, interval)
        idle = theirs["idle_share"]
        lo, hi = (0.0, 0.0) if idle is None else (idle - bound, idle + bound)
        self.check.within(f"{path}.idle_share", ours["idle_share"], idle, lo, hi,
                          "idle samples counted at different instants (idle_share_bound)")
        cost = theirs["cost_usd"]
        self.check.within(f"{path}.idle_cost_usd", ours["idle_cost_usd"],
                          theirs["idle_cost_usd"], (cost or 0.0) * c_lo * lo,
                          (cost or 0.0) * c_hi * hi,
                          "cost_usd x idle_share")
        done = {"requests", "output_tokens", "models", "per_1000_requests",
                "per_million_output_tokens", "idle_share", "idle_cost_usd"}
        done |= {"gpu_hours", "cost_usd"}
        for key in sorted((set(ours) | set(theirs)) - done):
            self.check.same(f"{path}.{key}", ours.get(key), theirs.get(key))

    def ttft_trend(self) -> TtftTrend:
        """Prometheus's TTFT p95 timeline of the scaling advice, recomputed from its samples,
        and how far ours may be from it: each point within its quantile interval, carried
        through the least-squares line (linear in the points' values) with its coefficients."""
        w = self.config.engine.window
        fit = fit_window_for(self.config.scaling)
        spinup = float(self.config.scaling.spinup)
        points, pts = [], []
        for t in sample_times(self.at, fit, self.config.collector.scrape_interval):
            bounds = self.sides.quantile_bounds(0.95, VLLM_TTFT, t, w)
            if bounds is not None:
                value, lo, hi = bounds
                points.append((t, value))
                pts.append((t - self.at, max(abs(value - lo), abs(hi - value))))
        now = self.sides.quantile_bounds(0.95, VLLM_TTFT, self.at, w)
        fitted = trend(points, self.at, fit)
        if fitted is None:
            return TtftTrend(now, None)
        n = len(pts)
        mx = math.fsum(x for x, _ in pts) / n
        sxx = math.fsum((x - mx) ** 2 for x, _ in pts)
        d_slope = math.fsum(abs(x - mx) * d for x, d in pts) / sxx
        d_proj = math.fsum(abs(1 / n + (x - mx) * (spinup - mx) / sxx) * d for x, d in pts)
        projected = fitted.at_now + fitted.slope_per_s * spinup
        return TtftTrend(now, (fitted.slope_per_s, d_slope, projected, d_proj))

    def scaling(self, path: str, pool: str, ours: Any, theirs: Any) -> None:
        if not isinstance(ours, dict) or not isinstance(theirs, dict):
            self.check.same(path, ours, theirs)
            return
        w = self.config.engine.window
        ttft = "ttft_p95_seconds"
        sig_o, sig_t = ours["signals"], theirs["signals"]
        self.quantile(f"{path}.signals.{ttft}", sig_o.get(ttft), sig_t.get(ttft), 0.95,
                      VLLM_TTFT, w, None)
        for key in sorted((set(sig_o) | set(sig_t)) - {ttft}):
            self.check.same(f"{path}.signals.{key}", sig_o.get(key), sig_t.get(key))
        tt = self.ttft_trend()
        threshold = float(self.config.scaling.scale_out_ttft_ratio) * ttft_threshold_for(
            self.config, self.config.pool(pool))
        det_o = {d["signal"]: d for d in ours["reason_details"]}
        det_t = {d["signal"]: d for d in theirs["reason_details"]}
        if (ttft in det_o) != (ttft in det_t) and tt.undecided(threshold):
            # Whether TTFT is a reason at all is not decided within the tolerance.
            self.check.ambiguous.append(path)
            return
        self.check.same(f"{path}.reason_details[].signal", sorted(det_o), sorted(det_t))
        for signal in sorted(set(det_o) & set(det_t)):
            a, b = det_o[signal], det_t[signal]
            dpath = f"{path}.reason_details[{signal}]"
            if signal == ttft:
                self.ttft_reason(dpath, a, b, tt)
            else:
                self.check.same(dpath, a, b)
        texts = ([masked(t) for t in ours["reasons"]], [masked(t) for t in theirs["reasons"]])
        self.check.same(f"{path}.reasons (numbers masked)", *texts)
        for key in sorted((set(ours) | set(theirs)) - {"signals", "reason_details", "reasons"}):
            # current and the action come from up and the (equal) KV and queue timelines;
            # desired too here: any scale-out asks for max_replicas (current + 1).
            self.check.same(f"{path}.{key}", ours.get(key), theirs.get(key))

    def ttft_reason(self, path: str, a: dict[str, Any], b: dict[str, Any],
                    tt: TtftTrend) -> None:
        """The TTFT reason: its value is the p95 now, its trend and projection the line's."""
        lo, hi = (math.nan, math.nan) if tt.now is None else tt.now[1:]
        self.check.within(f"{path}.value", a["value"], b["value"], lo, hi, "the TTFT p95 now")
        if tt.line is None or b["trend_per_s"] is None:
            for key in ("trend_per_s", "projected"):
                self.check.same(f"{path}.{key}", a[key], b[key])
        else:
            slope, d_slope, projected, d_proj = tt.line
            self.check.within(f"{path}.trend_per_s (recomputed from Prometheus's samples)",
                              slope, b["trend_per_s"], b["trend_per_s"], b["trend_per_s"],
                              "the same samples")
            self.check.within(f"{path}.trend_per_s", a["trend_per_s"], b["trend_per_s"],
                              slope - d_slope, slope + d_slope, "least squares over the TTFT "
                              "timeline, each point within its quantile interval")
            self.check.within(f"{path}.projected", a["projected"], b["projected"],
                              projected - d_proj, projected + d_proj,
                              "the fitted line at now + spinup")
        for key in ("signal", "threshold", "comparison", "horizon_s", "window_s"):
            self.check.same(f"{path}.{key}", a[key], b[key])
        self.check.same(f"{path}.text (numbers masked)", masked(a["text"]), masked(b["text"]))

    def slos(self, ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
        specs = {s.name: s for s in effective_slos(self.config)}
        if [s["name"] for s in ours] != [s["name"] for s in theirs]:
            self.check.same(".slos[].name", [s["name"] for s in ours], [s["name"] for s in theirs])
            return
        table = self.config.engine.burn_rate_alerts
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            path = f".slos[{i}]"
            spec = specs[b["name"]]
            budget = 1.0 - spec.objective
            bounds: dict[float, tuple[float, float]] = {}
            for key in sorted(set(a["windows"]) | set(b["windows"])):
                w = parse_duration(key)
                wa, wb = a["windows"].get(key) or {}, b["windows"].get(key) or {}
                err = wb.get("error_ratio")
                lo, hi = (0.0, 0.0) if err is None else \
                    self.error_ratio_bounds(spec, err, w)
                bounds[w] = (lo / budget, hi / budget)
                why = f"{spec.indicator} error ratio over {key}"
                self.check.within(f"{path}.windows.{key}.error_ratio", wa.get("error_ratio"),
                                  err, lo, hi, why)
                self.check.within(f"{path}.windows.{key}.burn_rate", wa.get("burn_rate"),
                                  wb.get("burn_rate"), lo / budget, hi / budget, why)
            perr = b["period_error_ratio"]
            lo, hi = (0.0, 0.0) if perr is None else \
                self.error_ratio_bounds(spec, perr, spec.period_s)
            why = f"{spec.indicator} error ratio over the period"
            self.check.within(f"{path}.period_error_ratio", a["period_error_ratio"], perr, lo, hi,
                              why)
            self.check.within(f"{path}.sli", a["sli"], b["sli"], 1 - hi, 1 - lo, why)
            b_lo, b_hi = 1 - hi / budget, 1 - lo / budget
            self.check.within(f"{path}.budget_remaining", a["budget_remaining"],
                              b["budget_remaining"], b_lo, b_hi, why)
            self.exhaustion(path, a, b, spec.period_s, (b_lo, b_hi))
            alerts_undecided = any(
                lo_ <= row.factor <= hi_
                for row in slo_burn_alerts(table, spec.period_s)
                for w_ in (row.long_window, row.short_window)
                for lo_, hi_ in [bounds.get(w_, (math.nan, math.nan))])
            if a["alerts"] != b["alerts"] and alerts_undecided:
                self.check.ambiguous.append(f"{path}.alerts")
            else:
                self.check.same(f"{path}.alerts", a["alerts"], b["alerts"])
            cur_a, cur_b = a["current"], b["current"]
            err = cur_b["error_ratio"]
            w = self.config.engine.window
            lo, hi = (0.0, 0.0) if err is None else self.error_ratio_bounds(spec, err, w)
            self.check.within(f"{path}.current.error_ratio", cur_a["error_ratio"], err, lo, hi,
                              "the current window")
            self.check.within(f"{path}.current.sli", cur_a["sli"], cur_b["sli"], 1 - hi, 1 - lo,
                              "the current window")
            self.check.same(f"{path}.current.window", cur_a["window"], cur_b["window"])
            done = {"windows", "period_error_ratio", "sli", "budget_remaining",
                    "time_to_exhaustion_seconds", "alerts", "current"}
            for key in sorted((set(a) | set(b)) - done):
                self.check.same(f"{path}.{key}", a.get(key), b.get(key))

    def exhaustion(self, path: str, a: dict[str, Any], b: dict[str, Any], period_s: float,
                   budget: tuple[float, float]) -> None:
        """``budget_remaining x period / burn_rate(1h)``, both intervals carried through (the
        1 h burn rate is not in the JSON: it is recovered from Prometheus's own figures)."""
        key = f"{path}.time_to_exhaustion_seconds"
        ours, theirs = a["time_to_exhaustion_seconds"], b["time_to_exhaustion_seconds"]
        if theirs is None or b["budget_remaining"] is None:
            undecided = budget[0] <= 0 <= budget[1]
            if ours is not None and undecided:
                self.check.ambiguous.append(key)
            else:
                self.check.same(key, ours, theirs)
            return
        slo_budget = 1 - b["objective"]
        burn = b["budget_remaining"] * period_s / theirs
        spec = next(s for s in effective_slos(self.config) if s.name == b["name"])
        lo, hi = self.error_ratio_bounds(spec, burn * slo_budget, 3600.0)
        burn_lo, burn_hi = lo / slo_budget, hi / slo_budget
        if ours is None and (budget[0] <= 0 or burn_lo <= 0):
            self.check.ambiguous.append(key)
            return
        # A 1 h burn rate whose lower bound is 0 (the interval admits no errors at all) puts
        # no upper bound on the time to exhaustion.
        upper = budget[1] * period_s / burn_lo if burn_lo > 0 else math.inf
        self.check.within(key, ours, theirs, budget[0] * period_s / burn_hi, upper,
                          "budget_remaining x period / burn_rate(1h)")

    def anomalies(self, ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
        def key(a: dict[str, Any]) -> tuple[str, str, str]:
            return a["kind"], a["pool"], a["model"]

        by_o, by_t = {key(a): a for a in ours}, {key(a): a for a in theirs}
        w = self.config.anomaly.window
        for k in sorted(set(by_o) | set(by_t)):
            path = f".anomalies[{'/'.join(k)}]"
            a, b = by_o.get(k), by_t.get(k)
            if a is None or b is None:
                self.check.same(path, a, b)
                continue
            match = {LABEL_MODEL_NAME: b["model"]}
            sums = self.sides.counters((VLLM_PROMPT_TOKENS_HIST + SUFFIX_SUM,
                                        VLLM_GENERATION_TOKENS_HIST + SUFFIX_SUM), **match)
            counts = self.sides.counters((VLLM_GENERATION_TOKENS_HIST + SUFFIX_COUNT,), **match)
            lo, hi = self.ratio_bounds(b["threshold_tokens"], w, sums, counts)
            self.ratio(f"{path}.mean_tokens_per_request", a["mean_tokens_per_request"],
                       b["mean_tokens_per_request"], w, sums, counts)
            self.check.within(f"{path}.threshold_tokens", a["threshold_tokens"],
                              b["threshold_tokens"], lo, hi, "multiplier x mean")
            self.sum_of_increases(f"{path}.requests", a["requests"], b["requests"], w, counts)
            # Which buckets lie wholly above the threshold is discrete: decided unless a
            # bucket bound lies inside the threshold's interval.
            bounds = self.sides.bucket_bounds((VLLM_PROMPT_TOKENS_HIST,
                                               VLLM_GENERATION_TOKENS_HIST))
            if any(lo <= x <= hi for x in bounds) and a["by_histogram"] != b["by_histogram"]:
                self.check.ambiguous.append(path)
                continue
            for field_ in ("by_histogram", "requests_above", "kind", "pool", "model", "window",
                           "tokens", "token_multiplier"):
                self.check.same(f"{path}.{field_}", a[field_], b[field_])
            self.check.same(f"{path}.note (numbers masked)", masked(a["note"]),
                            masked(b["note"]))


def compare_status(config: Config, sides: Sides, at_s: float, ours: dict[str, Any],
                   theirs: dict[str, Any]) -> Checker:
    """Compare the store's and Prometheus's status at ``at_s`` (see ``StatusComparison``)."""
    return StatusComparison(config, sides, at_s).run(ours, theirs)

