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

Exact figures where the gateway has them. When the gateway's records cover a pool's model
over the window (``records_cover``), the TTFT and e2e quantiles and the tokens per request come
from the records, one value per request, with PromQL's ``quantile`` definition
(``sample_quantile``: rank q·(n-1), linear interpolation between neighbours, numpy's default),
and say ``"source": "gateway"``; the histogram figures stay beside them under ``"histogram"``.
Queue time and ITL always come from the histograms: the gateway sees neither vLLM's queue nor
each token's gap. A histogram figure says ``"source": "histogram"`` and gives, per quantile,
the bucket that holds it (``"bounds"``): the interpolation inside that bucket is a guess.

A quantile PromQL answers with NaN (no observations, no ``+Inf`` bucket) is ``None``.
Units: latency quantiles in seconds, tokens in tokens, windows in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from slo.objectives.sli import inf_bucket_count, vllm_matchers
from slo.promql.lookup import SemanticsLike
from slo.promql.quantile import Bucket, histogram_quantile, quantile_bounds
from slo.sources.protocol import RequestLog, Source
from vigil.config import PoolConfig, SloDefaults
from vigil.conventions import (
    LABEL_MODEL_NAME,
    SUFFIX_COUNT,
    SUFFIX_SUM,
    TOKENS_CHUNKS,
    TOKENS_UNKNOWN,
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
    "COVERAGE_RATIO",
    "COVERAGE_SLACK",
    "E2E_NORMALISED",
    "E2E_PER_512_TOKENS",
    "LATENCY_HISTOGRAMS",
    "NORMALISED_OUTPUT_TOKENS_KEY",
    "QUANTILES",
    "QUANTILE_SOURCES",
    "RANGE_WIDTH_RATIO",
    "SOURCE_GATEWAY",
    "SOURCE_HISTOGRAM",
    "TOKEN_HISTOGRAMS",
    "TOKEN_QUANTILE",
    "finite_or_none",
    "histogram_figures",
    "model_quantiles",
    "normalised_e2e",
    "quantile_key",
    "quantile_range",
    "records_cover",
    "sample_quantile",
    "seconds_bucket_text",
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


#: Where a figure comes from (its ``"source"``): the gateway's per-request records (exact) or
#: vLLM's histogram buckets (``histogram_quantile``: interpolated inside a bucket).
SOURCE_GATEWAY = "gateway"
SOURCE_HISTOGRAM = "histogram"
#: ``quantile_source`` choices: ``"auto"`` (the records where they cover, else the
#: histograms) or ``"histogram"`` (the histogram figures, as Prometheus computes them).
QUANTILE_SOURCES = ("auto", SOURCE_HISTOGRAM)
#: The records cover a model's window when they hold at least this share of the requests
#: vLLM counted (``increase`` of the e2e histogram's ``+Inf`` bucket), less ``COVERAGE_SLACK``
#: requests: the counter's ``increase`` is extrapolated to the window's edges, the records are
#: counted exactly, so a few requests either way are the edges, not missing traffic.
COVERAGE_RATIO = 0.9
COVERAGE_SLACK = 2.0
#: A histogram quantile whose bucket is wider than this share of its value is shown as the
#: bucket ("≤ 0.3 s", "100–200 tokens") rather than as the interpolated number.
RANGE_WIDTH_RATIO = 1 / 3


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


def _bounds(
    buckets: list[Bucket] | None, qs: Iterable[float], semantics: SemanticsLike
) -> dict[str, list[float] | None]:
    """Per quantile key, ``[lo, hi]`` of the bucket holding it (``hi`` +Inf for the ``+Inf``
    bucket, which the JSON writes ``null``); ``None`` where the quantile is ``None``."""
    out: dict[str, list[float] | None] = {}
    for q in qs:
        found = None if buckets is None else quantile_bounds(q, buckets, semantics)
        out[quantile_key(q)] = None if found is None else list(found)
    return out


def _histogram_block(
    buckets: list[Bucket] | None, qs: Sequence[float], semantics: SemanticsLike,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The histogram figures: ``{p.., "source": "histogram", "bounds": {p..: [lo, hi]}}``."""
    return {**(extra or {}), **_quantiles(buckets, qs, semantics),
            "source": SOURCE_HISTOGRAM, "bounds": _bounds(buckets, qs, semantics)}


def _gateway_block(
    values: list[float], qs: Sequence[float], histogram: dict[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The records' figures, with the histogram's beside them under ``"histogram"``."""
    return {**(extra or {}), **{quantile_key(q): sample_quantile(q, values) for q in qs},
            "source": SOURCE_GATEWAY, "count": len(values),
            "histogram": {k: v for k, v in histogram.items() if k != "source"}}


def _reached_replica(r: RequestRecord) -> bool:
    """A request a replica of the pool worked on, as vLLM counts finished requests: not a
    cache hit, not refused before it went upstream (those have no e2e)."""
    return not r.cache_hit and r.e2e_s is not None


def _served(r: RequestRecord) -> bool:
    """A request that completed normally: its latency and length are the pool's service (a
    failure or a client's cancel is the error SLO's business, not a latency)."""
    return _reached_replica(r) and not r.error and not r.error_class


def records_cover(records: Iterable[RequestRecord], vllm_count: float | None) -> bool:
    """Whether one model's ``records`` over a window stand for all of its traffic: at least one
    completed request, and at least ``COVERAGE_RATIO`` × ``vllm_count`` − ``COVERAGE_SLACK``
    requests that reached a replica, ``vllm_count`` being the finished requests vLLM counted in
    the window (``None``: vLLM's histograms have no data for the model, so the records are all
    there is). Traffic that bypasses the gateway, or a gateway started during the window while
    the pool was already serving, leaves the records short of vLLM's count: the histograms
    then answer."""
    rows = list(records)
    if not any(_served(r) for r in rows):
        return False
    if vllm_count is None or not math.isfinite(vllm_count):
        return True
    reached = sum(1 for r in rows if _reached_replica(r))
    return reached >= COVERAGE_RATIO * vllm_count - COVERAGE_SLACK


def histogram_figures(block: Mapping[str, Any]) -> dict[str, float | None]:
    """The histogram quantiles of a figure block (``{"p50": s, ...}``), whatever its source:
    the block's own with ``"source": "histogram"``, those under ``"histogram"`` otherwise. These
    are what ``histogram_quantile`` gives on a Prometheus (charts, recording rules)."""
    figures = block.get("histogram", block) if block.get("source") == SOURCE_GATEWAY else block
    return {k: v for k, v in figures.items() if k.startswith("p") and k[1:2].isdigit()}


def seconds_bucket_text(lo: float, hi: float, sep: str = " ") -> str:
    """A histogram bucket of seconds as a reader sees it: ``(0, 0.3]`` -> ``"≤ 300 ms"``,
    ``(0.1, 0.25]`` -> ``"100–250 ms"``, ``(1, 2.5]`` -> ``"1–2.5 s"``, ``(60, +Inf)`` ->
    ``"> 60.00 s"``; ``sep`` goes between a sign or number and its unit (``""`` for the
    compact table of ``vigil slo status``, a space on the dashboard)."""

    def bound(v: float) -> str:
        return f"{v * 1000:.0f}{sep}ms" if abs(v) < 1 else f"{v:.2f}{sep}s"

    if math.isinf(hi):
        return f">{sep}{bound(lo)}"
    if lo <= 0:
        return f"≤{sep}{bound(hi)}"
    if hi < 1:
        return f"{lo * 1000:g}–{hi * 1000:g}{sep}ms"
    return f"{lo:g}–{hi:g}{sep}s"


def quantile_range(
    block: Mapping[str, Any] | None, key: str
) -> tuple[float, float] | None:
    """``(lo, hi)`` when the figure ``block[key]`` (e.g. ``quantiles.ttft_seconds``, ``"p95"``)
    is a histogram quantile whose bucket is wider than ``RANGE_WIDTH_RATIO`` of its value, so
    that a reader should see the bucket, not the interpolated number; ``hi`` is +Inf for the
    ``+Inf`` bucket. ``None`` for an exact (gateway) figure, a narrow bucket, or no value."""
    if not block or block.get("source") != SOURCE_HISTOGRAM:
        return None
    value = block.get(key)
    found = (block.get("bounds") or {}).get(key)
    if value is None or not found:
        return None
    lo, hi = found
    lo = 0.0 if lo is None else float(lo)
    hi = math.inf if hi is None else float(hi)
    if hi - lo > RANGE_WIDTH_RATIO * abs(float(value)):
        return lo, hi
    return None


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
    pool: PoolConfig | str,
    at_s: float,
    window_s: float,
    *,
    models: Iterable[str] = (),
    request_log: RequestLog | None = None,
    normalised_output_tokens: int | None = None,
    quantile_source: str = "auto",
) -> dict[str, dict[str, Any]]:
    """Per model of ``pool``: ``{"quantiles": {...}, "tokens_per_request": {...}}``.

    ``pool``: its configuration (series chosen as ``slo.objectives.sli.vllm_matchers`` chooses them:
    the pool's ``selector`` in a Prometheus) or its name (Vigil's own labels).

    Each latency block holds ``p50``/``p95``/``p99`` (seconds) and its ``source``. With the
    gateway's ``request_log`` covering the model (``records_cover``) and ``quantile_source``
    ``"auto"``, TTFT (when every completed request streamed, so has a first token), e2e and
    tokens per request (when every count is the server's ``usage``) come from the records
    (``"source": "gateway"``, ``"count"``, and the histogram figures under ``"histogram"``);
    otherwise from the histograms (``"source": "histogram"``, ``"bounds"``). ``"histogram"``
    forces the histogram figures.

    The models are those with data in the window plus ``models`` (e.g. the pool's configured
    model, which then appears with ``None`` values when idle), sorted by name. With the
    gateway's ``request_log``, ``quantiles`` also has ``e2e_seconds_normalised``: the quantiles
    of each request's e2e scaled to ``normalised_output_tokens`` output tokens
    (``normalised_e2e``; default: ``[slo_defaults] e2e_reference_output_tokens``'s default),
    and that length as ``normalised_output_tokens``; while it is 512 the same quantiles are
    also under their older name ``e2e_seconds_per_512_tokens``.
    """
    if quantile_source not in QUANTILE_SOURCES:
        raise ValueError(f"quantile_source must be one of {', '.join(QUANTILE_SOURCES)}, "
                         f"not {quantile_source!r}")
    length = (SloDefaults().e2e_reference_output_tokens if normalised_output_tokens is None
              else normalised_output_tokens)
    matchers = vllm_matchers(pool, source)
    name = pool if isinstance(pool, str) else pool.name
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
    by_model: dict[str, list[RequestRecord]] = {}
    if request_log is not None:
        for r in request_log.records(name, at_s, window_s):
            by_model.setdefault(r.model, []).append(r)
            v = normalised_e2e(r, length)
            if v is not None:
                normalised.setdefault(r.model, []).append(v)
    if quantile_source == "auto":
        names.update(m for m, rows in by_model.items() if any(_served(r) for r in rows))

    sem = source.semantics
    out: dict[str, dict[str, Any]] = {}
    for model in sorted(names):
        rows = by_model.get(model, [])
        e2e_buckets = latency["e2e_seconds"].get(model)
        covered = quantile_source == "auto" and records_cover(
            rows, None if e2e_buckets is None else inf_bucket_count(e2e_buckets))
        served = [r for r in rows if _served(r)] if covered else []
        exact = _exact_values(served)
        quantiles: dict[str, Any] = {"window": format_duration(window_s)}
        for key in LATENCY_HISTOGRAMS:
            block = _histogram_block(latency[key].get(model), QUANTILES, sem)
            values = exact.get(key)
            quantiles[key] = block if values is None else _gateway_block(values, QUANTILES, block)
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
            block = _histogram_block(token_buckets[key].get(model), (TOKEN_QUANTILE,), sem,
                                     {"mean": mean})
            values = exact.get(key)
            tokens[key] = block if values is None else _gateway_block(
                values, (TOKEN_QUANTILE,), block, {"mean": math.fsum(values) / len(values)})
        out[model] = {"quantiles": quantiles, "tokens_per_request": tokens}
    return out


#: Record field of each figure the records can give exactly (JSON key -> value of a record).
_EXACT: dict[str, Callable[[RequestRecord], float | None]] = {
    "ttft_seconds": lambda r: r.ttft_s,
    "e2e_seconds": lambda r: r.e2e_s,
    "generated": lambda r: (None if r.tokens_source in (TOKENS_CHUNKS, TOKENS_UNKNOWN)
                            else float(r.generated_tokens)),
    "prompt": lambda r: (None if r.tokens_source in (TOKENS_CHUNKS, TOKENS_UNKNOWN)
                         else float(r.prompt_tokens)),
}


def _exact_values(served: list[RequestRecord]) -> dict[str, list[float]]:
    """Per figure, one value per completed request, when every one of them has it: a TTFT
    known for some requests only (a non-streamed request shows the gateway no first token) or
    a token count that is a lower bound would be a biased sample, so that figure stays with the
    histograms."""
    out: dict[str, list[float]] = {}
    if not served:
        return out
    for key, field in _EXACT.items():
        values = [field(r) for r in served]
        if all(v is not None for v in values):
            out[key] = [float(v) for v in values if v is not None]
    return out
