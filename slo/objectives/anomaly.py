"""Token cost anomalies: requests with more than ``token_multiplier`` × the mean tokens.

The rule: a request whose token count exceeds ``token_multiplier`` (10 by default) × the
average per request raises an alarm. vLLM's metrics have no per-request data, only histograms
of prompt and generated tokens per finished request, so from them alone we can give a **lower
bound** (``"kind": "histogram_lower_bound"``), per pool and model over ``[anomaly] window`` (1 h):

* mean tokens per request (prompt + generated)::

      (increase(vllm:request_prompt_tokens_sum[w])
       + increase(vllm:request_generation_tokens_sum[w]))
      / increase(vllm:request_generation_tokens_count[w])

* threshold = ``token_multiplier × mean``;
* a request whose prompt alone, or whose generation alone, exceeds the threshold certainly
  exceeds it in total. In each histogram we count the observations in buckets ``(lower, upper]``
  that lie wholly above the threshold (``lower ≥ threshold``); the bucket that contains the
  threshold is not counted, since we cannot tell which of its requests are above. One request
  can be in both histograms, so the bound is the larger of the two counts, not their sum.
* counts use the raw change of the bucket counters between the window's first and last samples
  (resets handled, no extrapolation): every counted observation really happened in the
  window, which keeps the result a lower bound (``increase`` would extrapolate to the edges).

With the gateway's per-request log (``slo.sources.protocol.RequestLog``) the check is exact:
each record above the threshold is reported (``"kind": "request"``) with its id.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from slo.objectives.quantiles import finite_or_none
from slo.objectives.sli import vllm_matchers
from slo.promql.quantile import parse_le
from slo.sources.protocol import Matchers, OwnSamples, RequestLog, Source
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    ANOMALY_HISTOGRAM_LOWER_BOUND,
    ANOMALY_REQUEST,
    LABEL_LE,
    LABEL_MODEL_NAME,
    SUFFIX_BUCKET,
    SUFFIX_COUNT,
    SUFFIX_SUM,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_PROMPT_TOKENS_HIST,
)
from vigil.durations import format_duration
from vigil.model import Labels, Point

if TYPE_CHECKING:
    from collector.store.windows import CounterWindow

__all__ = ["histogram_count_above", "pool_anomalies", "raw_increase"]

#: JSON key -> token histogram whose buckets bound the per-request total from below.
_HISTOGRAMS = {"prompt": VLLM_PROMPT_TOKENS_HIST, "generated": VLLM_GENERATION_TOKENS_HIST}
_TOKENS_BASIS = "prompt+generated"


def raw_increase(points: list[Point]) -> float | None:
    """A counter's change from the first to the last sample, counter resets handled (a drop
    adds the value before it, as in PromQL), without extrapolation; ``None`` for < 2 samples."""
    values = [p.value for p in points if p.value is not None]
    if len(values) < 2:
        return None
    change = values[-1] - values[0]
    for before, after in pairwise(values):
        if after < before:
            change += before
    return change


def _window_increase(w: CounterWindow) -> float | None:
    """``raw_increase`` of the samples ``w`` summarises: the same operations in the same order
    (the last value minus the first, then each drop's previous value), so the same float."""
    if w.n < 2:
        return None
    change = w.last_value - w.first_value
    for before in w.resets:
        change += before
    return change


def _raw_increases(
    source: Source, metric: str, matchers: Matchers, at_s: float, window_s: float
) -> dict[Labels, float]:
    """Per series of ``metric{matchers}``, ``raw_increase`` over the window ending at
    ``at_s`` (Unix seconds), in label order; series with fewer than two samples absent.

    From Vigil's store, its counter rollup (``OwnSamples.counter_windows``) gives each
    series' first and last sample and drops in the window — all ``raw_increase`` reads — without
    decoding every sample: a week of a histogram's buckets is millions of them. The window
    is the one ``samples`` reads (``select_range``'s edges). A Prometheus, or a store without
    a rollup yet, is read sample by sample."""
    windows = (source.counter_windows(metric, matchers, at_s, window_s)
               if isinstance(source, OwnSamples) else None)
    if windows is not None:
        return {key.labels: change for key, w in windows.items()
                if (change := _window_increase(w)) is not None}
    return {labels: change
            for labels, pts in source.samples(metric, matchers, at_s, window_s).items()
            if (change := raw_increase(pts)) is not None}


def _raw_buckets(
    source: Source, metric: str, matchers: Matchers, at_s: float, window_s: float
) -> dict[str, dict[float, float]]:
    """Per model: ``le`` -> raw increase of ``metric_bucket`` summed over the model's series."""
    out: dict[str, dict[float, float]] = {}
    changes = _raw_increases(source, metric + SUFFIX_BUCKET, matchers, at_s, window_s)
    for labels, change in changes.items():
        d = dict(labels)
        le = parse_le(d.get(LABEL_LE, ""))
        model = d.get(LABEL_MODEL_NAME, "")
        if le is None or not model:
            continue
        per_le = out.setdefault(model, {})
        per_le[le] = per_le.get(le, 0.0) + change
    return out


def histogram_count_above(
    buckets: Mapping[float, float], threshold: float
) -> tuple[int, float | None]:
    """Observations in the buckets wholly above ``threshold`` and the lower bound they start at.

    ``buckets`` maps each upper bound (``le``, ``+Inf`` included) to its cumulative count. The
    count is ``count(+Inf) - count(L)`` with ``L`` the smallest finite bound ``≥ threshold``;
    ``(0, None)`` when no bound is that high or there is no ``+Inf`` bucket.
    """
    total = buckets.get(math.inf)
    candidates = [le for le in buckets if math.isfinite(le) and le >= threshold]
    if total is None or not candidates:
        return 0, None
    lower = min(candidates)
    return max(0, round(total - buckets[lower])), lower


def _histogram_anomalies(
    source: Source, config: Config, pool: PoolConfig, at_s: float, window_s: float
) -> list[dict[str, Any]]:
    m = vllm_matchers(pool, source)
    by = (LABEL_MODEL_NAME,)

    def per_model(metric: str) -> dict[str, float]:
        result = source.increase(metric, m, at_s, window_s, by)
        return {dict(k).get(LABEL_MODEL_NAME, ""): v for k, v in result.items()}

    prompt_sum = per_model(VLLM_PROMPT_TOKENS_HIST + SUFFIX_SUM)
    gen_sum = per_model(VLLM_GENERATION_TOKENS_HIST + SUFFIX_SUM)
    count = per_model(VLLM_GENERATION_TOKENS_HIST + SUFFIX_COUNT)
    raw = {key: _raw_buckets(source, metric, m, at_s, window_s)
           for key, metric in _HISTOGRAMS.items()}
    multiplier = config.anomaly.token_multiplier
    out: list[dict[str, Any]] = []
    for model in sorted(k for k in count if k):
        n = count[model]
        if model not in prompt_sum or model not in gen_sum or not n > 0:
            continue
        mean = finite_or_none((prompt_sum[model] + gen_sum[model]) / n)
        if mean is None:
            continue
        threshold = multiplier * mean
        by_hist: dict[str, dict[str, Any]] = {}
        for key in _HISTOGRAMS:
            above, lower = histogram_count_above(raw[key].get(model, {}), threshold)
            by_hist[key] = {"requests_above": above, "bucket_lower_bound_tokens": lower}
        at_least = max(h["requests_above"] for h in by_hist.values())
        if at_least < 1:
            continue
        out.append({
            "kind": ANOMALY_HISTOGRAM_LOWER_BOUND,
            "pool": pool.name,
            "model": model,
            "window": format_duration(window_s),
            "tokens": _TOKENS_BASIS,
            "mean_tokens_per_request": mean,
            "token_multiplier": multiplier,
            "threshold_tokens": threshold,
            "requests": n,
            "requests_above": at_least,
            "by_histogram": by_hist,
            "note": (
                f"at least {at_least} request(s) had more than {threshold:.0f} tokens "
                f"({multiplier:g}x the mean of {mean:.1f}); a lower bound from histogram "
                "buckets wholly above the threshold"
            ),
        })
    return out


def _request_anomalies(
    log: RequestLog, config: Config, pool: PoolConfig, at_s: float, window_s: float
) -> list[dict[str, Any]]:
    """Exact per-request anomalies from the gateway's log, per model and endpoint (a chat
    turn and a long completion have different normal sizes)."""
    by_model: dict[tuple[str, str], list[Any]] = {}
    for r in log.records(pool.name, at_s, window_s):
        by_model.setdefault((r.model, r.endpoint), []).append(r)
    multiplier = config.anomaly.token_multiplier
    out: list[dict[str, Any]] = []
    for (model, _endpoint), records in sorted(by_model.items()):
        mean = sum(r.prompt_tokens + r.generated_tokens for r in records) / len(records)
        threshold = multiplier * mean
        for r in records:
            tokens = r.prompt_tokens + r.generated_tokens
            if tokens > threshold:
                out.append({
                    "kind": ANOMALY_REQUEST,
                    "pool": pool.name,
                    "model": model,
                    "window": format_duration(window_s),
                    "tokens": _TOKENS_BASIS,
                    "id": r.id,
                    "ts": r.ts_s,
                    "endpoint": r.endpoint,
                    "tenant": r.tenant or None,
                    "tier": r.tier or None,
                    "cost_usd": r.cost_usd,
                    "request_tokens": tokens,
                    "mean_tokens_per_request": mean,
                    "token_multiplier": multiplier,
                    "threshold_tokens": threshold,
                })
    return out


def pool_anomalies(
    source: Source,
    config: Config,
    pool: PoolConfig,
    at_s: float,
    *,
    window_s: float | None = None,
    request_log: RequestLog | None = None,
) -> list[dict[str, Any]]:
    """The token anomalies of one pool over ``window_s`` (default ``[anomaly] window``): exact
    per-request entries with a request log, else histogram lower bounds (only entries with at
    least one request above the threshold)."""
    w = config.anomaly.window if window_s is None else window_s
    if request_log is not None:
        return _request_anomalies(request_log, config, pool, at_s, w)
    return _histogram_anomalies(source, config, pool, at_s, w)
