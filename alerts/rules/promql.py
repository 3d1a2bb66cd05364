"""The PromQL of every number the rules record, written to equal the embedded engine's.

Each builder mirrors one function of ``slo/`` and performs the same IEEE operations in the same
order, so that Prometheus 2.42 evaluating the expression over the same samples gives the same
float64 as ``EmbeddedSource(store, semantics="2")`` (``tests/test_rules_vs_prometheus.py``
checks it to 1e-9 relative; it is in fact bit-identical):

=============================  ===========================================================
builder                        engine
=============================  ===========================================================
``latency_error_expr``         ``slo.objectives.sli`` ttft / e2e: ``1 - bucket_fraction_below(T)``
``error_rate_expr``            ``slo.objectives.sli`` error_rate (finished errors and 5xx answers)
``availability_error_expr``    ``slo.objectives.sli`` availability (from ``http_requests_total``)
``replica_up_error_expr``      ``slo.objectives.sli`` replica_up
``quantile_expr``              ``slo.objectives.quantiles.model_quantiles``
``kv_usage_expr``              ``slo.scaling.signals.kv_usage_at`` (mean and max over replicas)
``queue_length_expr``          ``slo.scaling.signals.queue_length_at``
``gpu_cost_expr``              ``slo.cost.pool.pool_cost`` ``cost_usd``
``per_requests_expr``          ``slo.cost.pool.pool_cost`` ``per_1000_requests``
=============================  ===========================================================

**Which series.** Each builder takes the pool as a ``PoolConfig`` (or just its name) and reads
its raw series through ``pool_series``: ``pool.series(kind, external=True)``, the pool's
``selector`` when it has one (a Prometheus that scrapes the replicas itself, e.g. with
kube-prometheus-stack: ``namespace="llm", service="chat-vllm"``), else the labels of Vigil's
own scrape jobs, ``{pool="<name>", kind="vllm"}``. Replicas are told apart by
``replica_label`` (``pod``, say) in a selector's series and by ``instance`` otherwise. A
selector's series carry no ``pool`` label, so for such a pool nothing is grouped by ``pool``:
the aggregation keeps the other labels and the rule's ``labels:`` add ``pool`` (and ``slo``).

"No data" is an absent series, as the engine's ``None``: a ratio whose denominator is 0 is
filtered out with ``> 0`` rather than recorded as NaN, and so is a NaN quantile (``>= 0``).

**VictoriaMetrics.** With ``[engine] dialect = "metricsql"`` (``written_in``), every
``increase`` is PromQL's rebuilt from MetricsQL functions (``slo.promql.metricsql``) and the
``*_over_time`` ranges follow the PromQL rules of ``[engine] promql_semantics``, so vmalert
records what Prometheus would (docs/prometheus-rules.md has the measured distance).

Prometheus 2.42 has no ``histogram_fraction`` for classic histograms, so a latency threshold
``T`` that is not a bucket bound is interpolated inside its bucket ``(a, b]`` in plain PromQL,
exactly as ``slo.promql.quantile.bucket_fraction_below`` does it::

    good = inc(le=a) + (inc(le=b) - inc(le=a)) * (T - a) / (b - a)      # a, b: bucket bounds
    error_ratio = 1 - good / inc(le="+Inf")

with the lowest bucket starting at 0 (``good = inc(le=b0) * T / b0``) and a threshold above the
highest finite bound counting that bound's bucket only (the ``+Inf`` bucket adds nothing below a
finite threshold). The bounds are vLLM's defaults (``vigil.conventions.VLLM_*_BUCKETS``) and the
``le`` values are spelled as vLLM's prometheus_client writes them (``"1.0"``, ``"+Inf"``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar

from prometheus_client.utils import floatToGoString

from alerts.rules.model import prom_duration
from slo.objectives.sli import replica_label
from slo.objectives.spec import SloSpec
from slo.promql.lookup import Semantics, SemanticsLike, semantics_of
from slo.promql.metricsql import increase_template
from vigil.config import PoolConfig
from vigil.conventions import (
    FINISHED_REASON_ERROR,
    HTTP_METHOD_POST,
    HTTP_STATUS_5XX_REGEX,
    INDICATOR_REPLICA_UP,
    KIND_VLLM,
    LABEL_FINISHED_REASON,
    LABEL_HTTP_METHOD,
    LABEL_HTTP_STATUS,
    LABEL_KIND,
    LABEL_LE,
    LABEL_MODEL_NAME,
    LABEL_POOL,
    SERIES_UP,
    SUFFIX_BUCKET,
    VLLM_E2E,
    VLLM_HTTP_REQUESTS,
    VLLM_KV_CACHE_USAGE,
    VLLM_REQUEST_LATENCY_BUCKETS,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_WAITING,
    VLLM_TTFT,
    VLLM_TTFT_BUCKETS,
)
from vigil.durations import parse_duration
from vigil.selectors import LabelMatcher, Selector, default_pool_selector

__all__ = [
    "LATENCY_METRICS",
    "SLO_BY",
    "PoolLike",
    "availability_error_expr",
    "bucket_bounds",
    "error_rate_expr",
    "gpu_cost_expr",
    "kv_usage_expr",
    "latency_error_expr",
    "le_label",
    "number",
    "per_requests_expr",
    "pool_by",
    "pool_matchers",
    "pool_series",
    "promql_string",
    "quantile_expr",
    "queue_length_expr",
    "replica_kv_usage_expr",
    "replica_up_error_expr",
    "selector",
    "sli_error_expr",
    "slo_series",
    "written_in",
]

#: A pool as the builders take it: its config, or only its name (Vigil's own labels).
PoolLike = PoolConfig | str

#: Latency indicator -> vLLM histogram (base name) and its default bucket bounds.
LATENCY_METRICS: dict[str, tuple[str, tuple[float, ...]]] = {
    "ttft": (VLLM_TTFT, VLLM_TTFT_BUCKETS),
    "e2e": (VLLM_E2E, VLLM_REQUEST_LATENCY_BUCKETS),
}
#: The labels an SLI keeps: one series per SLO (the rule adds ``slo``).
SLO_BY = (LABEL_POOL, LABEL_MODEL_NAME)
_POOL_BY = (LABEL_POOL,)
_INF = "+Inf"


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def number(value: float) -> str:
    """A PromQL number literal that parses back to exactly ``value`` (``0.95``, ``3600``)."""
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def le_label(bound: float) -> str:
    """The ``le`` value of a bucket bound as vLLM exposes it (prometheus_client's
    ``floatToGoString``: ``1.0`` -> ``"1.0"``, ``inf`` -> ``"+Inf"``)."""
    return str(floatToGoString(bound))


def selector(metric: str, matchers: Mapping[str, str]) -> str:
    """``metric{k="v", ...}`` with the matchers in the given order."""
    inner = ", ".join(f"{k}={promql_string(v)}" for k, v in matchers.items())
    return f"{metric}{{{inner}}}"


def pool_matchers(pool: str) -> dict[str, str]:
    """A pool's vLLM series: ``{pool="<pool>", kind="vllm"}``
    (``slo.objectives.sli.vllm_matchers``)."""
    return {LABEL_POOL: pool, LABEL_KIND: KIND_VLLM}


def _has_selector(pool: PoolLike) -> bool:
    return isinstance(pool, PoolConfig) and pool.has_selector


def pool_series(pool: PoolLike, kind: str = KIND_VLLM) -> Selector:
    """The matchers of the pool's ``kind`` series in a Prometheus: ``pool.series(kind,
    external=True)``; ``{pool="<name>", kind="<kind>"}`` for a bare name."""
    if isinstance(pool, PoolConfig):
        return pool.series(kind, external=True)
    return default_pool_selector(pool, kind)


def pool_up(pool: PoolLike, kind: str = KIND_VLLM) -> Selector | None:
    """The matchers of the pool's ``up`` series in a Prometheus (``PoolConfig.up_series``:
    the selector without labels only exposed samples carry); ``{pool, kind}`` for a name."""
    if isinstance(pool, PoolConfig):
        return pool.up_series(kind, external=True)
    return default_pool_selector(pool, kind)


def _vllm_up(pool: PoolLike) -> Selector:
    up = pool_up(pool)
    if up is None:  # pragma: no cover - PoolConfig refuses such a selector
        raise ValueError("the pool's selector chooses no target's up series")
    return up


def _spec_pool(spec: SloSpec, pool: PoolConfig | None) -> PoolLike:
    """The pool an SLO's expressions read: ``pool``, else the spec's own ``pool_config``,
    else its pool's name (Vigil's labels)."""
    return pool or getattr(spec, "pool_config", None) or spec.pool


def slo_series(spec: SloSpec, pool: PoolConfig | None = None) -> Selector:
    """The vLLM series an SLO reads: its pool's (``pool``, else the spec's), of its model."""
    return pool_series(_spec_pool(spec, pool)).and_equal((LABEL_MODEL_NAME, spec.model))


def pool_by(pool: PoolLike, by: Sequence[str]) -> tuple[str, ...]:
    """``by`` without ``pool`` for a pool chosen by a selector: its series have no ``pool``
    label (or one of the team's own meaning), the rule's ``labels:`` add it instead."""
    if _has_selector(pool):
        return tuple(b for b in by if b != LABEL_POOL)
    return tuple(by)


def _agg(op: str, by: Sequence[str]) -> str:
    """``sum by (a, b) `` or plain ``sum`` (then the parenthesis follows directly)."""
    return f"{op} by ({', '.join(by)}) " if by else op


#: The PromQL rules MetricsQL expressions rebuild while ``written_in("metricsql", ...)`` is
#: active, else ``None`` (PromQL). A context variable rather than a parameter: the language
#: is a property of one whole generation, and every builder would otherwise pass it down
#: to the three helpers below that write a range function.
_METRICSQL: ContextVar[Semantics | None] = ContextVar("vigil_rules_metricsql", default=None)


@contextlib.contextmanager
def written_in(dialect: str, semantics: SemanticsLike = "3") -> Iterator[None]:
    """Within the block, the builders write for ``dialect`` ("promql" or "metricsql");
    ``semantics``: the PromQL rules MetricsQL reproduces ("2" or "3")."""
    if dialect not in ("promql", "metricsql"):
        raise ValueError(f"dialect must be 'promql' or 'metricsql', not {dialect!r}")
    token = _METRICSQL.set(semantics_of(semantics) if dialect == "metricsql" else None)
    try:
        yield
    finally:
        _METRICSQL.reset(token)


def _increase(series: str, window: str) -> str:
    """``increase(<series>[<window>])``, in the language being written: in MetricsQL a call
    of the ``WITH`` template that rebuilds it (``alerts.rules.pipeline`` adds the clause)."""
    sem = _METRICSQL.get()
    if sem is None:
        return f"increase({series}[{window}])"
    return f"{increase_template(parse_duration(window), sem)}({series})"


def _over_time(function: str, series: str, window: str) -> str:
    """``<function>(<series>[<window>])``; in MetricsQL following 2.42's closed left edge,
    a range one millisecond longer (its ranges are left-open, as Prometheus 3's)."""
    if _METRICSQL.get() is Semantics.V2:
        window = f"{round(parse_duration(window) * 1000) + 1}ms"
    return f"{function}({series}[{window}])"


def _sum_increase(metric: str, matchers: Selector, window: str, by: Sequence[str]) -> str:
    return f"{_agg('sum', by)}({_increase(matchers.promql(metric), window)})"


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line if line else line for line in text.split("\n"))


def bucket_bounds(indicator: str) -> tuple[str, tuple[float, ...]]:
    """The vLLM histogram and its finite bucket bounds (ascending) for ``ttft`` / ``e2e``."""
    try:
        return LATENCY_METRICS[indicator]
    except KeyError:
        raise ValueError(f"{indicator!r} is not a latency indicator") from None


def latency_error_expr(spec: SloSpec, window_s: float,
                       bounds: Sequence[float] | None = None, *,
                       pool: PoolConfig | None = None) -> str:
    """``1 - bucket_fraction_below(threshold)`` of the SLO's histogram over the window;
    ``pool``: the SLO's pool (its selector), else Vigil's labels of ``spec.pool``."""
    metric, default_bounds = bucket_bounds(spec.indicator)
    les = sorted(float(b) for b in (default_bounds if bounds is None else bounds))
    threshold = spec.threshold_seconds
    if threshold is None or not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"SLO {spec.name!r}: a latency threshold must be > 0 seconds and "
                         f"finite, got {threshold!r}")
    if not les or les[0] <= 0:
        # bucket_fraction_below's lowest bucket starts at -Inf when its bound is <= 0; the
        # rules assume vLLM's positive bounds.
        raise ValueError(f"SLO {spec.name!r}: bucket bounds must be positive, got {les!r}")
    window = prom_duration(window_s)
    m = slo_series(spec, pool)
    by = pool_by(_spec_pool(spec, pool), SLO_BY)

    def bucket(le: float | str) -> str:
        text = le if isinstance(le, str) else le_label(le)
        return _sum_increase(metric + SUFFIX_BUCKET, m.and_equal((LABEL_LE, text)), window, by)

    total = f"({bucket(_INF)} > 0)"
    if threshold in les:
        good = bucket(threshold)
    elif threshold > les[-1]:
        # Inside the +Inf bucket: it adds (inc(+Inf) - rank) * finite / Inf = 0 to the rank.
        good = bucket(les[-1])
    elif threshold < les[0]:
        # The lowest bucket starts at 0: rank 0 + (inc(b0) - 0) * (T - 0) / (b0 - 0).
        good = f"{bucket(les[0])} * {le_label(threshold)} / {le_label(les[0])}"
    else:
        upper = next(b for b in les if b > threshold)
        lower = max(b for b in les if b < threshold)
        # rank + (cum - rank) * (T - lower) / (upper - lower), in that order of operations.
        good = (
            f"{bucket(lower)}\n"
            f"+ (\n"
            f"{_indent(bucket(upper))}\n"
            f"{_indent('- ' + bucket(lower))}\n"
            f") * ({le_label(threshold)} - {le_label(lower)})"
            f" / ({le_label(upper)} - {le_label(lower)})"
        )
    # 1 - good / total, as `1.0 - go_div(upper_rank - 0.0, count)` in the engine.
    return "\n".join(["1 - (", "  (", _indent(good, "    "), "  )", "  /", f"  {total}", ")"])


def _http_5xx_or_zero(pool: PoolLike, window: str) -> str:
    """The pool's 5xx POST answers, 0 while its POST series exist without a 5xx one (vLLM
    creates a status's series at its first answer); absent without ``http_requests_total``."""
    m = pool_series(pool).and_equal((LABEL_HTTP_METHOD, HTTP_METHOD_POST))
    by = pool_by(pool, _POOL_BY)
    every = _sum_increase(VLLM_HTTP_REQUESTS, m, window, by)
    five = Selector([*m, LabelMatcher(LABEL_HTTP_STATUS, "=~", HTTP_STATUS_5XX_REGEX)])
    return f"(\n  {_sum_increase(VLLM_HTTP_REQUESTS, five, window, by)}\n  or\n  0 * {every}\n)"


def error_rate_expr(spec: SloSpec, window_s: float, *,
                    pool: PoolConfig | None = None) -> str:
    """``slo.objectives.sli`` error_rate: with E the finished errors (0 when no ``error`` series
    exists while others do), F every finished request and H the 5xx answers, ``max(E, H) / (F +
    max(H - E, 0))`` (a non-streamed error is in E and H); ``E / F`` when the pool exposes no
    ``http_requests_total``. Summed per pool: ``http_requests_total`` has no ``model_name``."""
    window = prom_duration(window_s)
    m = slo_series(spec, pool)
    by = pool_by(_spec_pool(spec, pool), _POOL_BY)
    total = _sum_increase(VLLM_REQUEST_SUCCESS, m, window, by)
    errors = _sum_increase(VLLM_REQUEST_SUCCESS,
                           m.and_equal((LABEL_FINISHED_REASON, FINISHED_REASON_ERROR)), window,
                           by)
    e = f"(\n{_indent(errors)}\n  or\n  0 * {total}\n)"
    h = _http_5xx_or_zero(_spec_pool(spec, pool), window)
    bad = f"(\n{_indent(h)}\n  >\n{_indent(e)}\n)\nor\n{e}"
    extra = f"(\n  clamp_min(\n{_indent(h, '    ')}\n    -\n{_indent(e, '    ')}\n  , 0)" \
            f"\n  or\n  0 * {total}\n)"
    return f"(\n{_indent(bad)}\n)\n/\n(\n  {total}\n  +\n{_indent(extra)}\n  > 0\n)"


def availability_error_expr(spec: SloSpec, window_s: float, *,
                            pool: PoolConfig | None = None) -> str:
    """``slo.objectives.sli`` availability from vLLM's API server: the 5xx share of the pool's POST
    answers, ``sum(increase(http_requests_total{status=~"5.."}[w])) / sum(increase(...))``;
    absent without ``http_requests_total`` (the gateway's records are not in Prometheus)."""
    window = prom_duration(window_s)
    where = _spec_pool(spec, pool)
    m = pool_series(where).and_equal((LABEL_HTTP_METHOD, HTTP_METHOD_POST))
    every = _sum_increase(VLLM_HTTP_REQUESTS, m, window, pool_by(where, _POOL_BY))
    return f"{_http_5xx_or_zero(where, window)}\n/\n({every} > 0)"


def replica_up_error_expr(spec: SloSpec, window_s: float, *,
                          pool: PoolConfig | None = None) -> str:
    """``1 - avg(avg_over_time(up{pool, kind="vllm"}[w]))``: the pool, not the model (``up``
    has no ``model_name``; the rule adds it as a label)."""
    window = prom_duration(window_s)
    where = _spec_pool(spec, pool)
    up = _vllm_up(where).promql(SERIES_UP)
    return f"1 - {_agg('avg', pool_by(where, _POOL_BY))}({_over_time('avg_over_time', up, window)})"


def sli_error_expr(spec: SloSpec, window_s: float, *, pool: PoolConfig | None = None) -> str:
    """The error ratio (0-1) of ``spec`` over ``window_s`` seconds:
    ``slo.objectives.sli.error_ratio``; ``pool``: the SLO's pool, whose selector chooses the series
    (else Vigil's labels)."""
    if pool is not None and pool.name != spec.pool:
        raise ValueError(f"SLO {spec.name!r} is of pool {spec.pool!r}, not {pool.name!r}")
    if spec.is_latency:
        return latency_error_expr(spec, window_s, pool=pool)
    if spec.indicator == "error_rate":
        return error_rate_expr(spec, window_s, pool=pool)
    if spec.indicator == "availability":
        return availability_error_expr(spec, window_s, pool=pool)
    if spec.indicator == INDICATOR_REPLICA_UP:
        return replica_up_error_expr(spec, window_s, pool=pool)
    raise ValueError(f"SLO {spec.name!r}: unknown indicator {spec.indicator!r}")


def quantile_expr(q: float, metric: str, pool: PoolLike, window_s: float,
                  by: Sequence[str] = (LABEL_POOL, LABEL_MODEL_NAME)) -> str:
    """``histogram_quantile(q, sum by (<by>, le) (increase(metric_bucket[w])))``, NaN (no
    requests) filtered out. The engine sums ``increase`` too; ``rate`` would give the same
    quantile, as every bucket differs by the same factor."""
    inner = _sum_increase(metric + SUFFIX_BUCKET, pool_series(pool), prom_duration(window_s),
                          (*pool_by(pool, by), LABEL_LE))
    return f"histogram_quantile({number(q)}, {inner}) >= 0"


def replica_kv_usage_expr(pool: PoolLike, by: Sequence[str] = _POOL_BY) -> str:
    """Each replica's KV-cache usage (ratio 0-1): the mean of its data-parallel engines, one
    series per replica (``replica_label``)."""
    labels = ", ".join((*pool_by(pool, by), replica_label(pool, external=True)))
    return f"avg by ({labels}) ({pool_series(pool).promql(VLLM_KV_CACHE_USAGE)})"


def kv_usage_expr(pool: PoolLike, aggregation: str = "avg",
                  by: Sequence[str] = _POOL_BY) -> str:
    """Mean (``avg``) or ``max`` over the pool's replicas of each replica's KV-cache usage
    (``replica_kv_usage_expr``)."""
    if aggregation not in ("avg", "max"):
        raise ValueError(f"aggregation must be 'avg' or 'max', got {aggregation!r}")
    return f"{_agg(aggregation, pool_by(pool, by))}({replica_kv_usage_expr(pool, by)})"


def queue_length_expr(pool: PoolLike, by: Sequence[str] = _POOL_BY) -> str:
    """Requests waiting, summed over the pool's replicas."""
    return f"{_agg('sum', pool_by(pool, by))}({pool_series(pool).promql(VLLM_REQUESTS_WAITING)})"


def gpu_cost_expr(pool: PoolLike, window_s: float, gpus_per_replica: int,
                  usd_per_gpu_hour: float, by: Sequence[str] = _POOL_BY, *,
                  default_interval_s: float, intervals: Mapping[str, float] | None = None,
                  bill_down_time: bool = False) -> str:
    """USD the pool's replicas cost over the window, billed for the time they ran
    (``slo.cost.pool.up_seconds``): per target ``clamp_max(sum_over_time(up[w]) * interval, w)``,
    summed, ``/ 3600 × gpus × price``, in the engine's order of operations.

    ``intervals``: replica (its ``replica_label`` value: the target's name, ``instance``) ->
    seconds for the targets whose interval is not ``default_interval_s`` (every other series,
    configured or not, takes the default: PromQL has no median of sample spacings, so a series
    of no configured target, such as every series of a selector, equals the engine only when
    scraped at the default). ``bill_down_time``: ``count_over_time``, down samples too.

    A pool with a selector bills each replica once, for the most of its ``up`` series (a pod
    scraped by two jobs has two): ``max by (<replica_label>)``, as the engine reads a
    Prometheus; a series without the replica label stays on its own.
    """
    window = prom_duration(window_s)
    over_time = "count_over_time" if bill_down_time else "sum_over_time"
    up = _vllm_up(pool)
    replica = replica_label(pool, external=True)
    by = pool_by(pool, by)
    per_replica = _has_selector(pool)
    if per_replica:
        lacking = Selector([*up, LabelMatcher(replica, "=", "")])
        up = Selector([*up, LabelMatcher(replica, "!=", "")])

    def term(matchers: Selector, seconds: float) -> str:
        return (f"clamp_max({_over_time(over_time, matchers.promql(SERIES_UP), window)}"
                f" * {number(seconds)}, {number(window_s)})")

    terms = [term(up.and_equal((replica, i)), s) for i, s in sorted((intervals or {}).items())]
    # Last: `or` keeps its series only where no per-target term has the same labels.
    terms.append(term(up, default_interval_s))
    inner = terms[0] if len(terms) == 1 else "\n  or\n  ".join(terms)
    head = _agg("sum", by)
    tail = f" / 3600 * {number(gpus_per_replica)} * {number(usd_per_gpu_hour)}"
    if not per_replica:
        body = f"({inner})" if len(terms) == 1 else f"(\n  {inner}\n)"
        return f"{head}{body}{tail}"
    most = f"{_agg('max', (*by, replica))}({_indent(inner) if len(terms) > 1 else inner})"
    return f"{head}(\n  {most}\n  or\n  {term(lacking, default_interval_s)}\n){tail}"


def per_requests_expr(cost: str, pool: PoolLike, window_s: float, unit: float = 1000.0,
                      by: Sequence[str] = _POOL_BY) -> str:
    """``cost / requests × unit`` with requests = every finished request in the window;
    absent without requests. ``cost`` is an expression or a recorded series."""
    requests = _sum_increase(VLLM_REQUEST_SUCCESS, pool_series(pool), prom_duration(window_s),
                             pool_by(pool, by))
    if " " in cost:
        cost = f"(\n{_indent(cost)}\n)"
    # A recorded cost carries the rule's `pool`, a selector's requests do not.
    div = f"/ ignoring({LABEL_POOL})" if _has_selector(pool) else "/"
    return f"{cost}\n{div}\n({requests} > 0)\n* {number(unit)}"
