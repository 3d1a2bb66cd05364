"""Latency quantiles and tokens per request, per pool and model, over one window.

For each latency histogram (TTFT, end-to-end, queue time, inter-token latency) and each model
of a pool::

    histogram_quantile(q, sum by (model_name, le) (rate(<x>_bucket{pool, kind="vllm"}[w])))

for q = 0.5, 0.95, 0.99. We sum ``increase`` rather than ``rate``: the two differ by the
constant factor ``w``, which cancels in the quantile (to the last bit or so of a float).

Tokens per request (generated and prompt), per model::

    mean = increase(<x>_sum[w]) / increase(<x>_count[w])
    p95  = histogram_quantile(0.95, sum by (model_name, le) (rate(<x>_bucket[w])))

vLLM's token histograms have 1-2-5 buckets, so the p95 is coarse (interpolated linearly
inside a bucket, like every ``histogram_quantile``).

With the gateway's records, the e2e SLO's reference length (``[slo_defaults]
e2e_reference_output_tokens``, 512 by default) also gets quantiles: each request's latency
rescaled to that many output tokens (``normalised_e2e``).

A quantile PromQL answers with NaN (no observations, no ``+Inf`` bucket) is ``None``.
Units: latency quantiles in seconds, tokens in tokens, windows in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from slo.lookup import SemanticsLike
from slo.quantile import Bucket, histogram_quantile
from slo.sli import RequestLog, vllm_matchers
from slo.source import Source
from vigil.config import SloDefaults
from vigil.conventions import (
    LABEL_MODEL_NAME,
    SUFFIX_COUNT,
    SUFFIX_SUM,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_ITL,
    VLLM_PROMPT_TOKENS_HIST,
    VLLM_QUEUE_TIME,
    VLLM_TTFT,
)
from vigil.durations import format_duration
from vigil.model import Labels, RequestRecord

__all__ = [
    "E2E_NORMALISED",
    "E2E_PER_512_TOKENS",
    "LATENCY_HISTOGRAMS",
    "NORMALISED_OUTPUT_TOKENS_KEY",
    "QUANTILES",
    "TOKEN_HISTOGRAMS",
    "TOKEN_QUANTILE",
    "finite_or_none",
    "model_quantiles",
    "normalised_e2e",
    "quantile_key",
    "sample_quantile",
]

#: The quantiles reported for every latency histogram (ratios 0-1).
QUANTILES = (0.5, 0.95, 0.99)
#: The quantile reported for tokens per request.
TOKEN_QUANTILE = 0.95
#: JSON key -> vLLM histogram (seconds).
LATENCY_HISTOGRAMS = {
    "ttft_seconds": VLLM_TTFT,
    "e2e_seconds": VLLM_E2E,
    "queue_seconds": VLLM_QUEUE_TIME,
    "itl_seconds": VLLM_ITL,
}
#: JSON key -> vLLM histogram (tokens per finished request).
TOKEN_HISTOGRAMS = {
    "generated": VLLM_GENERATION_TOKENS_HIST,
    "prompt": VLLM_PROMPT_TOKENS_HIST,
}
#: JSON keys of the normalised e2e: its quantiles (seconds) and the output length they are
#: normalised to (tokens, ``[slo_defaults] e2e_reference_output_tokens``).
E2E_NORMALISED = "e2e_seconds_normalised"
NORMALISED_OUTPUT_TOKENS_KEY = "normalised_output_tokens"
#: The older name of ``E2E_NORMALISED``, still written while the length is 512 (its name says so).
E2E_PER_512_TOKENS = "e2e_seconds_per_512_tokens"


def quantile_key(q: float) -> str:
    """``0.95`` -> ``"p95"``, ``0.5`` -> ``"p50"``, ``0.999`` -> ``"p99.9"``."""
    return f"p{q * 100:g}"


def finite_or_none(value: float | None) -> float | None:
    """``value`` unless it is ``None``, NaN or ±Inf (JSON has no NaN; PromQL's NaN means
    "cannot be computed", which the status JSON spells ``null``)."""
    if value is None or not math.isfinite(value):
        return None
    return value


def _by_model(groups: Mapping[Labels, Any]) -> dict[str, Any]:
    """Re-key ``by (model_name)`` results by the model name; series without one are left out
    (every vLLM series has it)."""
    out: dict[str, Any] = {}
    for labels, value in groups.items():
        model = dict(labels).get(LABEL_MODEL_NAME, "")
        if model:
            out[model] = value
    return out


def _quantiles(
    buckets: list[Bucket] | None, qs: Iterable[float], semantics: SemanticsLike
) -> dict[str, float | None]:
    return {
        quantile_key(q): None if buckets is None
        else finite_or_none(histogram_quantile(q, buckets, semantics))
        for q in qs
    }


def sample_quantile(q: float, values: Iterable[float]) -> float | None:
    """PromQL's ``quantile`` aggregation of plain values (promql/quantile.go ``quantile``):
    rank ``q·(n-1)``, linear interpolation between the neighbours; ``q`` outside [0, 1] gives
    ∓Inf as in PromQL. ``None`` for no values."""
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    rank = q * (len(ordered) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def normalised_e2e(r: RequestRecord, tokens: int | None = None) -> float | None:
    """The request's end-to-end latency (seconds) scaled to ``tokens`` output tokens (default
    ``[slo_defaults] e2e_reference_output_tokens``'s default): its time to first token plus its
    decode time per token × (``tokens`` - 1). ``None`` without a first token, an e2e, or at
    least two generated tokens (no decode rate to scale)."""
    if tokens is None:
        tokens = SloDefaults().e2e_reference_output_tokens
    if r.ttft_s is None or r.e2e_s is None or r.generated_tokens < 2 or r.error:
        return None
    per_token = (r.e2e_s - r.ttft_s) / (r.generated_tokens - 1)
    return r.ttft_s + per_token * (tokens - 1)


def model_quantiles(
    source: Source,
    pool: str,
    at_s: float,
    window_s: float,
    *,
    models: Iterable[str] = (),
    request_log: RequestLog | None = None,
    normalised_output_tokens: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Per model of ``pool``: ``{"quantiles": {...}, "tokens_per_request": {...}}``.

    The models are those with data in the window plus ``models`` (e.g. the pool's configured
    model, which then appears with ``None`` values when idle), sorted by name. With the
    gateway's ``request_log``, ``quantiles`` also has ``e2e_seconds_normalised``: the quantiles
    of each request's e2e scaled to ``normalised_output_tokens`` output tokens
    (``normalised_e2e``; default: ``[slo_defaults] e2e_reference_output_tokens``'s default),
    and that length as ``normalised_output_tokens``; while it is 512 the same quantiles are
    also under their older name ``e2e_seconds_per_512_tokens``.
    """
    length = (SloDefaults().e2e_reference_output_tokens if normalised_output_tokens is None
              else normalised_output_tokens)
    matchers = vllm_matchers(pool)
    by = (LABEL_MODEL_NAME,)
    latency = {
        key: _by_model(source.bucket_increase(metric, matchers, at_s, window_s, by))
        for key, metric in LATENCY_HISTOGRAMS.items()
    }
    token_buckets = {
        key: _by_model(source.bucket_increase(metric, matchers, at_s, window_s, by))
        for key, metric in TOKEN_HISTOGRAMS.items()
    }
    token_sums = {
        key: _by_model(source.increase(metric + SUFFIX_SUM, matchers, at_s, window_s, by))
        for key, metric in TOKEN_HISTOGRAMS.items()
    }
    token_counts = {
        key: _by_model(source.increase(metric + SUFFIX_COUNT, matchers, at_s, window_s, by))
        for key, metric in TOKEN_HISTOGRAMS.items()
    }
    names = set(models)
    for table in (latency, token_buckets, token_sums, token_counts):
        for per_model in table.values():
            names.update(per_model)

    normalised: dict[str, list[float]] = {}
    if request_log is not None:
        for r in request_log.records(pool, at_s, window_s):
            v = normalised_e2e(r, length)
            if v is not None:
                normalised.setdefault(r.model, []).append(v)

    sem = source.semantics
    out: dict[str, dict[str, Any]] = {}
    for model in sorted(names):
        quantiles: dict[str, Any] = {"window": format_duration(window_s)}
        for key in LATENCY_HISTOGRAMS:
            quantiles[key] = _quantiles(latency[key].get(model), QUANTILES, sem)
        if request_log is not None:
            values = normalised.get(model, [])
            quantiles[E2E_NORMALISED] = {
                quantile_key(q): sample_quantile(q, values) for q in QUANTILES
            }
            quantiles[NORMALISED_OUTPUT_TOKENS_KEY] = length
            if length == 512:
                quantiles[E2E_PER_512_TOKENS] = dict(quantiles[E2E_NORMALISED])
        tokens: dict[str, Any] = {}
        for key in TOKEN_HISTOGRAMS:
            total = token_sums[key].get(model)
            count = token_counts[key].get(model)
            mean = None if total is None or not count else finite_or_none(total / count)
            tokens[key] = {
                "mean": mean,
                **_quantiles(token_buckets[key].get(model), (TOKEN_QUANTILE,), sem),
            }
        out[model] = {"quantiles": quantiles, "tokens_per_request": tokens}
    return out
