"""An SLO's error ratio at every evaluation instant of a history, per window.

``sli_tracks(spec, source, grid, windows)`` is ``slo.objectives.sli.error_ratio`` evaluated at
every instant of ``grid``: the same queries (asked once as range queries, ``RangeSource``)
and the same arithmetic, element by element, so each instant's ratio is the engine's there —
and therefore what the generated recording rule ``slo:sli_error:ratio_rate<w>`` records when
Prometheus evaluates it at that instant. The few instants numpy cannot answer in bulk (a
latency histogram some of whose buckets are missing there) are asked of the engine itself,
one by one.

Per-endpoint SLOs, and availability where the gateway's records hold the SLO's requests, are
counted from those records: read once, then counted for every window at every instant from
cumulative sums over their finish times.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from slo.objectives.sli import error_ratio, vllm_matchers, vllm_up_matchers
from slo.objectives.spec import SloSpec
from slo.promql.lookup import BoolArray
from slo.promql.tracks import Grid, Track, absent, avg_tracks, fraction_below
from slo.sources.protocol import RangeSource, RequestLog, Source, with_equal
from vigil.conventions import (
    ENDPOINT_ALL,
    ERROR_CLIENT_CANCEL,
    FINISHED_REASON_ERROR,
    HTTP_METHOD_POST,
    HTTP_STATUS_5XX_REGEX,
    INDICATOR_REPLICA_UP,
    LABEL_FINISHED_REASON,
    LABEL_HTTP_METHOD,
    LABEL_HTTP_STATUS,
    SERIES_UP,
    VLLM_E2E,
    VLLM_HTTP_REQUESTS,
    VLLM_REQUEST_SUCCESS,
    VLLM_TTFT,
)
from vigil.model import RequestRecord

__all__ = ["latency_bounds", "sli_tracks"]

_5XX = re.compile(HTTP_STATUS_5XX_REGEX)


def latency_bounds(threshold: float, bounds: Sequence[float]) -> set[float]:
    """The bucket bounds ``histogram_fraction(-Inf, threshold)`` reads (``bounds``
    ascending): the highest below the threshold, the lowest at or above it, and +Inf. The
    others change neither the bucket the threshold falls in nor the count below it."""
    below = [b for b in bounds if b < threshold]
    above = [b for b in bounds if b >= threshold]
    chosen = {b for b in bounds if math.isinf(b) and b > 0}
    if below:
        chosen.add(below[-1])
    if above:
        chosen.add(above[0])
    return chosen


def _fill_one_by_one(spec: SloSpec, source: Source, grid: Grid, window_s: float,
                     where: BoolArray, track: Track,
                     request_log: RequestLog | None = None) -> Track:
    """``track`` with the instants ``where`` answered by the engine itself."""
    values, present = track.values.copy(), track.present.copy()
    instants = grid.instants_ms()
    for i in np.flatnonzero(where):
        ratio = error_ratio(spec, source, int(instants[i]) / 1000, window_s,
                            request_log=request_log).error_ratio
        present[i] = ratio is not None
        values[i] = math.nan if ratio is None else ratio
    return Track(values, present)


def _latency(spec: SloSpec, source: RangeSource, grid: Grid,
             windows: Sequence[float]) -> dict[float, Track]:
    metric = VLLM_TTFT if spec.indicator == "ttft" else VLLM_E2E
    threshold = float(spec.threshold_seconds or 0.0)
    per_window = source.bucket_increase_range(
        metric, vllm_matchers(spec, source, model=spec.model), grid, windows,
        les=lambda bounds: latency_bounds(threshold, bounds))
    out: dict[float, Track] = {}
    for w in windows:
        buckets = per_window.get(w, {}).get((), [])
        if not buckets:
            out[w] = absent(grid.n)
            continue
        good, _ = fraction_below(threshold, buckets, grid.n)
        inf = [t for le, t in buckets if math.isinf(le) and le > 0]
        has_total = inf[0].present if inf else np.zeros(grid.n, dtype=np.bool_)
        with np.errstate(all="ignore"):
            ok = good.present & has_total & ~np.isnan(good.values)
            ratio = Track(np.where(ok, 1.0 - good.values, np.nan), ok)
        # Instants where only some of the buckets read are present: the engine decides.
        stacked = np.vstack([t.present for _, t in buckets])
        partial: BoolArray = np.asarray(stacked.any(axis=0) & ~stacked.all(axis=0),
                                        dtype=np.bool_)
        if partial.any():
            ratio = _fill_one_by_one(spec, source, grid, w, partial, ratio)
        out[w] = ratio
    return out


def _five_xx(groups: dict[tuple[tuple[str, str], ...], Track], n: int) -> Track:
    """The 5xx answers: ``math.fsum`` of the 5xx status groups present at each instant, as
    ``slo.objectives.sli.http_counts`` sums them (0 where none is present)."""
    fives = [t for labels, t in groups.items()
             if _5XX.fullmatch(dict(labels).get(LABEL_HTTP_STATUS, ""))]
    values = np.zeros(n)
    if len(fives) == 1:
        values = np.where(fives[0].present, fives[0].values, 0.0)
    elif fives:
        stacked = np.vstack([t.values for t in fives])
        mask = np.vstack([t.present for t in fives])
        for i in range(n):
            values[i] = math.fsum(stacked[mask[:, i], i])
    return Track(values, np.ones(n, dtype=np.bool_))


def _http(spec: SloSpec, source: RangeSource, grid: Grid,
          windows: Sequence[float]) -> dict[float, tuple[Track, Track]]:
    """Per window, ``(all POST answers, 5xx answers)`` (``http_counts``); the first track is
    absent where the replicas expose no ``http_requests_total``."""
    m = with_equal(vllm_matchers(spec, source), (LABEL_HTTP_METHOD, HTTP_METHOD_POST))
    totals = source.increase_range(VLLM_HTTP_REQUESTS, m, grid, windows)
    by_status = source.increase_range(VLLM_HTTP_REQUESTS, m, grid, windows,
                                      by=(LABEL_HTTP_STATUS,))
    return {w: (totals.get(w, {}).get((), absent(grid.n)),
                _five_xx(by_status.get(w, {}), grid.n)) for w in windows}


def _ratio(bad: np.ndarray, total: Track) -> Track:
    """``bad / total`` where the total is present and positive (``SliResult`` otherwise
    ``None``)."""
    ok = total.present & (total.values > 0)
    with np.errstate(all="ignore"):
        return Track(np.where(ok, bad / total.values, np.nan), ok)


def _error_rate(spec: SloSpec, source: RangeSource, grid: Grid,
                windows: Sequence[float]) -> dict[float, Track]:
    m = vllm_matchers(spec, source, model=spec.model)
    bad_m = with_equal(m, (LABEL_FINISHED_REASON, FINISHED_REASON_ERROR))
    totals = source.increase_range(VLLM_REQUEST_SUCCESS, m, grid, windows)
    bads = source.increase_range(VLLM_REQUEST_SUCCESS, bad_m, grid, windows)
    http = _http(spec, source, grid, windows)
    out: dict[float, Track] = {}
    for w in windows:
        total = totals.get(w, {}).get((), absent(grid.n))
        bad_t = bads.get(w, {}).get(())
        bad = (np.where(bad_t.present, bad_t.values, 0.0) if bad_t is not None
               else np.zeros(grid.n))
        http_total, five = http[w]
        with np.errstate(all="ignore"):
            more = five.values > bad
            # The 5xx beyond the finished errors failed before finishing (error_ratio).
            widened = total.values + np.where(more, five.values - bad, 0.0)
            has_http = http_total.present
            total_v = np.where(has_http, widened, total.values)
            bad = np.where(has_http & more, five.values, bad)
        out[w] = _ratio(bad, Track(total_v, total.present))
    return out


def _availability(spec: SloSpec, source: RangeSource, grid: Grid,
                  windows: Sequence[float]) -> dict[float, Track]:
    http = _http(spec, source, grid, windows)
    return {w: _ratio(five.values, total) for w, (total, five) in http.items()}


def _replica_up(spec: SloSpec, source: RangeSource, grid: Grid,
                windows: Sequence[float]) -> dict[float, Track]:
    per_target = source.avg_over_time_range(SERIES_UP, vllm_up_matchers(spec, source), grid,
                                            windows)
    out: dict[float, Track] = {}
    for w in windows:
        series = per_target.get(w, {})
        mean = avg_tracks([series[k] for k in sorted(series)], grid.n, source.semantics)
        ok = mean.present & ~np.isnan(mean.values)
        out[w] = Track(np.where(ok, 1.0 - mean.values, np.nan), ok)
    return out


_BULK = {
    "ttft": _latency,
    "e2e": _latency,
    "error_rate": _error_rate,
    "availability": _availability,
    INDICATOR_REPLICA_UP: _replica_up,
}


class _LogCounts:
    """The gateway's records of one SLO's pool, model and endpoint over the history, counted
    for the window ``(t - w, t]`` ending at every instant ``t`` of the grid (the window
    ``RequestLog.records`` answers), from cumulative sums over their finish times."""

    def __init__(self, spec: SloSpec, log: RequestLog, grid: Grid, longest_s: float) -> None:
        end = grid.end_ms / 1000
        span = end - grid.start_ms / 1000 + longest_s
        self.records = sorted(
            (r for r in log.records(spec.pool, end, span)
             if r.model == spec.model
             and (spec.endpoint == ENDPOINT_ALL or r.endpoint == spec.endpoint)),
            key=lambda r: r.ts_s)
        self.ts = np.array([r.ts_s for r in self.records], dtype=np.float64)
        self.instants = grid.instants_ms() / 1000

    def mask(self, test: Callable[[RequestRecord], bool]) -> BoolArray:
        return np.fromiter((test(r) for r in self.records), dtype=np.bool_,
                           count=len(self.records))

    def count(self, mask: BoolArray, window_s: float) -> np.ndarray:
        """Per instant, the records of ``mask`` that finished in its window."""
        sums = np.concatenate(([0], np.cumsum(mask, dtype=np.int64)))
        lo = np.searchsorted(self.ts, self.instants - window_s, side="right")
        hi = np.searchsorted(self.ts, self.instants, side="right")
        return sums[hi] - sums[lo]


def _counted(bad: np.ndarray, total: np.ndarray) -> Track:
    """``float(bad) / float(total)`` where ``total`` is positive (the log's SLIs)."""
    ok = total > 0
    with np.errstate(all="ignore"):
        return Track(np.where(ok, bad.astype(np.float64) / total.astype(np.float64), np.nan),
                     ok)


def _from_log(spec: SloSpec, source: RangeSource, grid: Grid, windows: Sequence[float],
              log: RequestLog) -> dict[float, Track]:
    """``error_ratio`` with the request log at every instant (``slo.objectives.sli``'s
    ``_availability_from_log`` and ``_from_request_log``, counted in bulk)."""
    if spec.indicator == INDICATOR_REPLICA_UP:  # measured per replica: no endpoint
        return {w: absent(grid.n) for w in windows}
    counts = _LogCounts(spec, log, grid, max(windows))
    if spec.indicator == "availability":
        everyone = np.ones(len(counts.records), dtype=np.bool_)
        answered = counts.mask(lambda r: r.error_class != ERROR_CLIENT_CANCEL)
        failed = answered & counts.mask(lambda r: r.error or r.status >= 500)
        fallback = (_availability(spec, source, grid, windows) if spec.endpoint == ENDPOINT_ALL
                    else {w: absent(grid.n) for w in windows})
        out = {}
        for w in windows:
            seen = counts.count(everyone, w) > 0
            ratio = _counted(counts.count(failed, w), counts.count(answered, w))
            # No record of the SLO's requests in the window: the engine reads the replicas'
            # 5xx answers instead (every endpoint) or has no number (one endpoint).
            out[w] = Track(np.where(seen, ratio.values, fallback[w].values),
                           np.where(seen, ratio.present, fallback[w].present))
        return out
    served = counts.mask(lambda r: r.error or not r.error_class)
    if spec.is_latency:
        threshold = spec.threshold_seconds
        latency = [r.ttft_s if spec.indicator == "ttft" else r.e2e_s for r in counts.records]
        observed = served & counts.mask(lambda r: not r.error) & np.array(
            [v is not None for v in latency], dtype=np.bool_)
        slow = observed & np.array([v is not None and threshold is not None and v > threshold
                                    for v in latency], dtype=np.bool_)
        return {w: _counted(counts.count(slow, w), counts.count(observed, w)) for w in windows}
    failed = served & counts.mask(lambda r: r.error)
    return {w: _counted(counts.count(failed, w), counts.count(served, w)) for w in windows}


def sli_tracks(spec: SloSpec, source: RangeSource, grid: Grid, windows: Sequence[float], *,
               request_log: RequestLog | None = None) -> dict[float, Track]:
    """Per window (seconds), the SLO's error ratio (0-1) at every instant of ``grid``:
    ``error_ratio(spec, source, t, w).error_ratio`` for each instant ``t``, absent where that
    is ``None``. Availability SLOs the gateway's records cover, and per-endpoint SLOs, are
    counted from ``request_log`` as the engine counts them."""
    windows = sorted(set(windows))
    if spec.endpoint != ENDPOINT_ALL and request_log is None:
        return {w: absent(grid.n) for w in windows}  # REASON_ENDPOINT
    if spec.endpoint != ENDPOINT_ALL or (spec.indicator == "availability"
                                         and request_log is not None):
        assert request_log is not None
        return _from_log(spec, source, grid, windows, request_log)
    if spec.indicator not in _BULK:
        raise ValueError(f"SLO {spec.name!r}: unknown indicator {spec.indicator!r}")
    return _BULK[spec.indicator](spec, source, grid, windows)
