"""SLIs: the error ratio (bad / total, a ratio 0-1) of one SLO over one window.

``error_ratio(spec, source, at_s, window_s)`` answers from vLLM's own metrics through a
``Source`` (PromQL equivalents in ``docs/slo-engine.md``):

* ``ttft`` / ``e2e``: ``1 - histogram_fraction(-Inf, threshold, sum(increase(x_bucket[w])))``
  over the pool's vLLM series of the SLO's model. A threshold that is not a bucket bound (the
  default 0.8 s TTFT and 8 s e2e are not) is interpolated inside its bucket: ``interpolated``
  says so, because such an SLI is an estimate, not a count.
* ``error_rate``: requests that failed on the server over requests served. Failed: vLLM's
  ``vllm:request_success_total{finished_reason="error"}`` and its API server's 5xx answers
  (``http_requests_total{method="POST", status=~"5.."}``), without counting one request twice
  (below). ``abort`` (aborted by the server) is a finished, non-error request and stays in the
  denominator; client disconnects are not counted by vLLM at all. Without
  ``http_requests_total`` (older vLLM, other servers) it is the finished-requests ratio alone.
* ``availability``: the share of requests answered with a server error (5xx, refused or reset
  connection, timeout; the SLO's good events are the others): from the gateway's records
  (``request_log``) when they hold the pool's requests, else
  ``sum(increase(http_requests_total{status=~"5.."}))`` over all POSTs.
  With neither it is ``None`` with ``REASON_NO_REQUEST_DATA``: scrapes are not requests.
* ``replica_up``: ``1 - avg(avg_over_time(up{pool, kind="vllm"}[w]))``: the share of scrape
  time the pool's vLLM targets were down (what ``availability`` measured before).

"The pool's vLLM series" are ``{pool="<name>", kind="vllm"}`` in Vigil's store and, in a
Prometheus that scrapes the replicas itself, the pool's ``selector`` when it has one
(``pool_series``); the model is ``model_name="<model>"`` ANDed onto either.

**No request counted twice.** vLLM turns a request that finishes with reason ``error`` into an
HTTP 500 when it is not streamed (``OpenAIServing._raise_if_error`` raises ``GenerationError``,
status 500), so that request is in both counters; a streamed one has sent its 200 already and
reports the error inside the stream (2xx, counted once, as ``error``); a 5xx with no finished
request (engine dead, an exception before generation) is in ``http_requests_total`` only.
Neither counter says which finished errors were streamed, so the engine assumes as many as
possible were answered with that 500: bad = ``max(errors, 5xx)`` and the denominator gains the
5xx answers beyond the finished errors, ``max(5xx - errors, 0)``. Exact when the window's
failures are of one kind; when streamed errors and engine-less 5xx meet in one window it
counts the smaller of the two once fewer (a lower bound, never a double count). The gateway's
records have no such ambiguity.

No data is ``None`` (with a ``reason``), never 0: an idle pool has no error ratio, it does not
have a perfect one.

vLLM's metrics carry no endpoint label (chat vs completions), so an SLO for one endpoint needs
the gateway's per-request log: ``RequestLog`` is that seam. Without a log such an SLI is
``None``; it never falls back to the all-endpoints numbers. ``http_requests_total`` has no
``model_name`` either: a pool's 5xx answers count toward the SLO of each model it serves.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import NamedTuple

from slo.objectives.spec import SloSpec
from slo.promql.quantile import Bucket, bucket_fraction_below
from slo.sources.embedded import avg_aggregate
from slo.sources.protocol import (
    Matchers,
    RequestLog,
    Source,
    is_external,
    matchers_of,
    with_equal,
)
from vigil.config import PoolConfig
from vigil.conventions import (
    ENDPOINT_ALL,
    ERROR_CLIENT_CANCEL,
    FINISHED_REASON_ERROR,
    HTTP_METHOD_POST,
    HTTP_STATUS_5XX_REGEX,
    INDICATOR_REPLICA_UP,
    KIND_VLLM,
    LABEL_FINISHED_REASON,
    LABEL_HTTP_METHOD,
    LABEL_HTTP_STATUS,
    LABEL_INSTANCE,
    LABEL_MODEL_NAME,
    SERIES_UP,
    VLLM_E2E,
    VLLM_HTTP_REQUESTS,
    VLLM_REQUEST_SUCCESS,
    VLLM_TTFT,
)
from vigil.model import Labels, RequestRecord
from vigil.selectors import default_pool_selector

__all__ = [
    "REASON_ENDPOINT",
    "REASON_ENDPOINT_REPLICA_UP",
    "REASON_NO_DATA",
    "REASON_NO_REQUESTS",
    "REASON_NO_REQUEST_DATA",
    "HttpCounts",
    "RequestLog",
    "SliResult",
    "error_ratio",
    "http_counts",
    "inf_bucket_count",
    "pool_series",
    "replica_label",
    "replica_of",
    "request_met_slos",
    "vllm_matchers",
]

REASON_NO_DATA = "no data in the window"
REASON_NO_REQUESTS = "no requests in the window"
REASON_ENDPOINT = "per-endpoint SLIs need the gateway's request log"
REASON_ENDPOINT_REPLICA_UP = "replica_up is measured per replica (up), which has no endpoint"
REASON_NO_REQUEST_DATA = ("no request data: no gateway records for this pool and its replicas "
                          "expose no http_requests_total (use replica_up for scrape health)")
_5XX = re.compile(HTTP_STATUS_5XX_REGEX)


class SliResult(NamedTuple):
    """One SLI evaluation.

    ``error_ratio``: bad / total as a ratio 0-1 (bad time / time for replica_up), ``None``
    when there is no data; ``total``: the number of events (requests) it is based on, ``None``
    for replica_up and when unknown; ``interpolated``: the latency threshold fell inside a
    histogram bucket, so the ratio is an estimate; ``reason``: why ``error_ratio`` is ``None``
    ("" otherwise).
    """

    error_ratio: float | None
    total: float | None = None
    interpolated: bool = False
    reason: str = ""


def pool_series(pool: PoolConfig | SloSpec | str, source: Source | None = None,
                kind: str = KIND_VLLM) -> Matchers:
    """The matchers of a pool's ``kind`` ("vllm" or "dcgm") series as ``source`` holds them:
    in a Prometheus (``source.external``) the pool's ``selector`` / ``dcgm_selector`` when set,
    else (and always in Vigil's store) ``{pool="<name>", kind="<kind>"}``. A pool given by
    name, or an SLO spec without its ``pool_config``, is read by Vigil's labels."""
    if isinstance(source, str):
        raise TypeError("pool_series(pool, source, kind): the second argument is the Source")
    if isinstance(pool, SloSpec):
        pool = pool.pool_config if pool.pool_config is not None else pool.pool
    if isinstance(pool, str):
        return matchers_of(default_pool_selector(pool, kind))
    return matchers_of(pool.series(kind, external=is_external(source)))


def up_matchers(pool: PoolConfig | SloSpec | str, source: Source | None = None,
                kind: str = KIND_VLLM) -> Matchers | None:
    """The matchers of a pool's ``up`` series as ``source`` holds them: ``pool_series``
    without the labels only exposed samples carry (``PoolConfig.up_series``); ``None`` when a
    selector leaves no target label (a DCGM selector on ``exported_pod`` alone)."""
    if isinstance(pool, SloSpec):
        pool = pool.pool_config if pool.pool_config is not None else pool.pool
    if isinstance(pool, str):
        return matchers_of(default_pool_selector(pool, kind))
    chosen = pool.up_series(kind, external=is_external(source))
    return None if chosen is None else matchers_of(chosen)


def vllm_up_matchers(pool: PoolConfig | SloSpec | str, source: Source | None = None
                     ) -> Matchers:
    """``up_matchers`` of the pool's vLLM targets, which always exist (a selector without a
    target label is refused when the config loads)."""
    chosen = up_matchers(pool, source)
    if chosen is None:  # pragma: no cover - PoolConfig refuses such a selector
        raise ValueError("the pool's selector chooses no target's up series")
    return chosen


def replica_label(pool: PoolConfig | str, source: Source | None = None, *,
                  external: bool | None = None) -> str:
    """The label that tells the pool's replicas apart in ``source`` (or, with ``external``, in
    a Prometheus when True: what the generated rules read): the pool's ``replica_label`` in a
    Prometheus, ``instance`` in Vigil's store (or for a pool by name). The one adapter around
    ``PoolConfig.replica_label_for``."""
    if isinstance(pool, str):
        return LABEL_INSTANCE
    return pool.replica_label_for(external=is_external(source) if external is None
                                  else external)


def replica_of(labels: Labels, label: str) -> str:
    """The replica a series belongs to: the value of the replica label ``label``
    (``replica_label``) in ``labels``, "" without it."""
    for k, v in labels:
        if k == label:
            return v
    return ""


def vllm_matchers(pool: PoolConfig | SloSpec | str, source: Source | None = None, *,
                  model: str | None = None) -> Matchers:
    """Label matchers for the vLLM series of one pool (and ``model``, as ``model_name``) as
    ``source`` holds them (``pool_series``): ``{pool, kind="vllm"[, model_name]}`` in Vigil's
    store, the pool's ``selector`` ANDed with ``model_name`` in a Prometheus."""
    m = pool_series(pool, source)
    return m if model is None else with_equal(m, (LABEL_MODEL_NAME, model))


def inf_bucket_count(buckets: Iterable[Bucket]) -> float | None:
    """The ``+Inf`` bucket's count (all observations), ``None`` without one."""
    counts = [c for le, c in buckets if math.isinf(le) and le > 0]
    return math.fsum(counts) if counts else None


def _latency(spec: SloSpec, source: Source, at_s: float, window_s: float) -> SliResult:
    metric = VLLM_TTFT if spec.indicator == "ttft" else VLLM_E2E
    threshold = float(spec.threshold_seconds or 0.0)  # checked by error_ratio
    groups = source.bucket_increase(metric, vllm_matchers(spec, source, model=spec.model), at_s,
                                    window_s)
    buckets = groups.get(())
    if not buckets:
        return SliResult(None, reason=REASON_NO_DATA)
    total = inf_bucket_count(buckets)
    good, interpolated = bucket_fraction_below(threshold, buckets)
    if total is None or math.isnan(good):
        # No +Inf bucket (PromQL gives NaN) or no observation at all.
        reason = REASON_NO_REQUESTS if total == 0 else REASON_NO_DATA
        return SliResult(None, total, reason=reason)
    return SliResult(1.0 - good, total, interpolated)


class HttpCounts(NamedTuple):
    """A pool's POST answers over a window, from ``http_requests_total`` (counts, floats as
    ``increase`` gives them): ``total`` of every status, ``server_errors`` of the 5xx."""

    total: float
    server_errors: float


def http_counts(source: Source, pool: PoolConfig | SloSpec | str, at_s: float,
                window_s: float) -> HttpCounts | None:
    """``sum(increase(http_requests_total{<pool's series>, method="POST"}[w]))`` and its
    ``status=~"5.."`` part; ``None`` when the pool's replicas expose no such series."""
    m = with_equal(vllm_matchers(pool, source), (LABEL_HTTP_METHOD, HTTP_METHOD_POST))
    total = source.increase(VLLM_HTTP_REQUESTS, m, at_s, window_s).get(())
    if total is None:
        return None
    by_status = source.increase(VLLM_HTTP_REQUESTS, m, at_s, window_s, by=(LABEL_HTTP_STATUS,))
    # vLLM creates a status's series at its first answer: no 5xx series is 0 server errors.
    errors = math.fsum(v for labels, v in by_status.items()
                       if _5XX.fullmatch(dict(labels).get(LABEL_HTTP_STATUS, "")))
    return HttpCounts(total, errors)


def _error_rate(spec: SloSpec, source: Source, at_s: float, window_s: float,
                request_log: RequestLog | None = None) -> SliResult:
    m = vllm_matchers(spec, source, model=spec.model)
    total = source.increase(VLLM_REQUEST_SUCCESS, m, at_s, window_s).get(())
    if total is None:
        return SliResult(None, reason=REASON_NO_DATA)
    bad_m = with_equal(m, (LABEL_FINISHED_REASON, FINISHED_REASON_ERROR))
    # vLLM exports every finished_reason child from startup; should the error child be missing
    # while others are present, there were no errors (PromQL: `... or vector(0)`).
    bad = source.increase(VLLM_REQUEST_SUCCESS, bad_m, at_s, window_s).get((), 0.0)
    http = http_counts(source, spec, at_s, window_s)
    if http is not None:
        # A non-streamed error is a finished error and a 500 (module docs): the 5xx beyond
        # the finished errors are the failures that never finished in the engine.
        five = http.server_errors
        total = total + (five - bad if five > bad else 0.0)
        bad = five if five > bad else bad
    if total <= 0:
        return SliResult(None, total, reason=REASON_NO_REQUESTS)
    return SliResult(bad / total, total)


def _availability(spec: SloSpec, source: Source, at_s: float, window_s: float,
                  request_log: RequestLog | None = None) -> SliResult:
    if request_log is not None:
        from_log = _availability_from_log(spec, request_log, at_s, window_s)
        if from_log is not None:
            return from_log
    http = http_counts(source, spec, at_s, window_s)
    if http is None:
        return SliResult(None, reason=REASON_NO_REQUEST_DATA)
    if http.total <= 0:
        return SliResult(None, http.total, reason=REASON_NO_REQUESTS)
    return SliResult(http.server_errors / http.total, http.total)


def _replica_up(spec: SloSpec, source: Source, at_s: float, window_s: float,
                request_log: RequestLog | None = None) -> SliResult:
    # `up` carries no model_name: a pool's targets serve its model, so the pool is the unit.
    per_target = source.avg_over_time(SERIES_UP, vllm_up_matchers(spec, source), at_s,
                                       window_s)
    mean = avg_aggregate(per_target, source.semantics)
    if mean is None or math.isnan(mean):
        return SliResult(None, reason=REASON_NO_DATA)
    return SliResult(1.0 - mean)


def _latency_from(spec: SloSpec, source: Source, at_s: float, window_s: float,
                  request_log: RequestLog | None = None) -> SliResult:
    return _latency(spec, source, at_s, window_s)


def _is_server_failure(r: RequestRecord) -> bool:
    """A 5xx answer (502 reset or refused upstream, 503 no replica, 504 timeout) or a failure
    after the answer started (the record's ``error``)."""
    return r.error or r.status >= 500


def _availability_from_log(spec: SloSpec, log: RequestLog, at_s: float,
                           window_s: float) -> SliResult | None:
    """Availability counted request by request; ``None`` when the log holds no request of
    the SLO's pool, model and endpoint (the gateway is not in front of it)."""
    records = [
        r for r in log.records(spec.pool, at_s, window_s)
        if r.model == spec.model and (spec.endpoint == ENDPOINT_ALL or r.endpoint == spec.endpoint)
    ]
    if not records:
        return None
    # A client that left before its answer got neither an answer nor a server error; every
    # other request got one, 4xx refusals included (the client's fault is an answer).
    answered = [r for r in records if r.error_class != ERROR_CLIENT_CANCEL]
    if not answered:
        return SliResult(None, 0.0, reason=REASON_NO_REQUESTS)
    bad = float(sum(1 for r in answered if _is_server_failure(r)))
    return SliResult(bad / len(answered), float(len(answered)))


def request_met_slos(record: RequestRecord, specs: Iterable[SloSpec]) -> bool:
    """Whether one request a replica served met every SLO of ``specs`` that covers it (its
    pool, model and endpoint), judged as the request-log SLIs judge it: no server failure,
    and each latency known at or under its threshold (a request never streamed has no
    TTFT to miss). A cancelled request is neither; callers leave it out."""
    if _is_server_failure(record):
        return False
    for spec in specs:
        if spec.pool != record.pool or spec.model != record.model or not (
                spec.endpoint == ENDPOINT_ALL or spec.endpoint == record.endpoint):
            continue
        if spec.is_latency and spec.threshold_seconds is not None:
            value = record.ttft_s if spec.indicator == "ttft" else record.e2e_s
            if value is not None and value > spec.threshold_seconds:
                return False
    return True


def _from_request_log(
    spec: SloSpec, log: RequestLog, at_s: float, window_s: float
) -> SliResult:
    """An SLI counted request by request (exact, never interpolated)."""
    if spec.indicator == INDICATOR_REPLICA_UP:
        return SliResult(None, reason=REASON_ENDPOINT_REPLICA_UP)
    if spec.indicator == "availability":
        from_log = _availability_from_log(spec, log, at_s, window_s)
        return from_log if from_log is not None else SliResult(None, 0.0,
                                                                reason=REASON_NO_REQUESTS)
    # Served requests only: a request refused before it reached a replica (401, 400, over
    # its cap, shed with 429) or one the client abandoned is neither good nor bad service,
    # as vLLM does not count client disconnects either. Server-side failures are bad.
    records = [
        r for r in log.records(spec.pool, at_s, window_s)
        if r.model == spec.model and (spec.endpoint == ENDPOINT_ALL or r.endpoint == spec.endpoint)
        and (r.error or not r.error_class)
    ]
    if spec.is_latency:
        threshold = spec.threshold_seconds
        # Latency of the requests that completed (a failure's latency is the error SLO's).
        latencies = [r.ttft_s if spec.indicator == "ttft" else r.e2e_s
                     for r in records if not r.error]
        observed = [v for v in latencies if v is not None]
        total = float(len(observed))
        bad = float(sum(1 for v in observed if threshold is not None and v > threshold))
    else:
        total = float(len(records))
        bad = float(sum(1 for r in records if r.error))
    if total == 0:
        return SliResult(None, total, reason=REASON_NO_REQUESTS)
    return SliResult(bad / total, total)


_FROM_METRICS = {
    "ttft": _latency_from,
    "e2e": _latency_from,
    "error_rate": _error_rate,
    "availability": _availability,
    INDICATOR_REPLICA_UP: _replica_up,
}


def error_ratio(
    spec: SloSpec,
    source: Source,
    at_s: float,
    window_s: float,
    *,
    request_log: RequestLog | None = None,
) -> SliResult:
    """The error ratio (0-1) of ``spec`` over ``(at_s - window_s, at_s]`` (Unix seconds).

    Endpoint ``"all"`` reads vLLM's metrics from ``source`` (availability reads
    ``request_log`` first when it holds the pool's requests); a single endpoint needs
    ``request_log`` and is ``None`` (with ``REASON_ENDPOINT``) without one.
    """
    if spec.indicator not in _FROM_METRICS:
        raise ValueError(f"SLO {spec.name!r}: unknown indicator {spec.indicator!r}")
    if window_s <= 0:
        raise ValueError(f"SLO {spec.name!r}: the window must be positive, not {window_s!r} s")
    if spec.is_latency and spec.threshold_seconds is None:
        # effective_slos always fills it in; a spec built by hand may not.
        raise ValueError(f"SLO {spec.name!r}: a {spec.indicator} SLO needs threshold_seconds")
    if spec.endpoint != ENDPOINT_ALL:
        if request_log is None:
            return SliResult(None, reason=REASON_ENDPOINT)
        return _from_request_log(spec, request_log, at_s, window_s)
    return _FROM_METRICS[spec.indicator](spec, source, at_s, window_s, request_log)
