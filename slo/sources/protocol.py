"""What the SLO engine reads: samples (``Source``: the embedded store or a Prometheus-compatible
API) and the gateway's per-request records (``RequestLog``).

Both implement ``Source`` and must give the same answers on the same data (Prometheus is the
reference). Every query is one PromQL expression's worth of work, named after it, so the
Prometheus implementation runs the aggregation on the server and the embedded one computes the
same thing with ``slo.promql``:

=====================  =====================================================================
method                 PromQL
=====================  =====================================================================
``increase``           ``sum by (<by>) (increase(<metric>{<m>}[<window>]))``
``bucket_increase``    ``sum by (<by>, le) (increase(<metric>_bucket{<m>}[<window>]))``
``instant``            ``<metric>{<m>}`` (lookback and staleness as configured)
``avg_over_time``      ``avg_over_time(<metric>{<m>}[<window>])`` (per series)
``samples``            ``<metric>{<m>}[<range>]`` (raw samples, per series)
=====================  =====================================================================

``<m>`` is equality matchers (a mapping) or a ``vigil.selectors.Selector`` with any of PromQL's
four operators. A source says with ``external`` whose labels its series carry: a Prometheus
(``True``) stores the series as it scraped them, with a pool's own labels (a pool's
``selector``, its ``replica_label``); the embedded store (``False``) holds what Vigil's collector
labelled itself (``pool``, ``kind``, ``instance``). What builds a pool's matchers asks
``PoolConfig.series(kind, external=is_external(source))``.

A source that thins old samples out (the embedded store's downsampling) also implements
``Downsampled``, so that what counts samples (``slo.cost.pool``) knows how long each one stands for.

Times are Unix seconds (float), windows seconds. Results are keyed by ``Labels`` (sorted label
pairs): the ``by`` labels for aggregations, the full label set for per-series results. A series or
group that PromQL would leave out of the result (fewer than two samples in the window, no sample
within the lookback) is absent from the dict, never 0.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

from slo.promql.lookup import FloatArray, IntArray, Semantics
from slo.promql.quantile import Bucket
from slo.promql.tracks import Grid, Track
from vigil.model import Labels, Point, RequestRecord, SeriesKey
from vigil.selectors import Selector

if TYPE_CHECKING:
    from collector.store import CounterWindow

__all__ = [
    "Downsampled",
    "LeChoice",
    "Matchers",
    "OwnSamples",
    "RangeSource",
    "RequestLog",
    "Source",
    "is_external",
    "matchers_of",
    "source_kind",
    "with_equal",
]

#: Label matchers: equality as a mapping, ``{"pool": "chat", "kind": "vllm"}``, or a
#: ``Selector`` with any operator (``namespace="llm", pod=~"chat-.*"``). An empty value matches
#: series without that label, as in PromQL.
Matchers: TypeAlias = Mapping[str, str] | Selector


def source_kind(source: object) -> str:
    """What a source is (``"embedded"``, ``"prometheus"``): its ``kind`` attribute, which both
    sources define; a test double without one is named by its class."""
    kind = getattr(source, "kind", None)
    return kind if isinstance(kind, str) and kind else type(source).__name__


def matchers_of(selector: Selector) -> Matchers:
    """``selector`` as a plain mapping when it is equality matchers on distinct labels (the
    form every source and test double reads fastest), else the ``Selector`` itself."""
    if all(m.op == "=" for m in selector) and len(selector.names()) == len(selector):
        return {m.name: m.value for m in selector}
    return selector


def with_equal(matchers: Matchers, *pairs: tuple[str, str]) -> Matchers:
    """``matchers`` ANDed with ``name="value"`` matchers (replacing an equality matcher on the
    same label, as a dict update does)."""
    if isinstance(matchers, Selector):
        return matchers_of(matchers.and_equal(*pairs))
    return {**matchers, **dict(pairs)}


def is_external(source: object) -> bool:
    """``source.external`` (``Source``); ``False`` for a source that does not say (a test
    double over Vigil-labelled series)."""
    return bool(getattr(source, "external", False))


@runtime_checkable
class Source(Protocol):
    """A read-only view of the fleet's samples that answers in PromQL terms."""

    #: The PromQL rules this source follows ("3" default; "2" for Prometheus 2.x).
    semantics: Semantics
    #: True for a Prometheus that scraped the replicas itself (series carry the pool's own
    #: labels, chosen by its ``selector``); False for Vigil's store (``pool``/``kind``/
    #: ``instance`` labels set by its collector).
    external: bool

    def increase(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float,
        by: Sequence[str] = (),
    ) -> dict[Labels, float]:
        """``sum by (by) (increase(metric{matchers}[window]))`` evaluated at ``at_s``."""
        ...

    def bucket_increase(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float,
        by: Sequence[str] = (),
    ) -> dict[Labels, list[Bucket]]:
        """Per ``by`` group, the buckets of ``sum by (by, le)(increase(metric_bucket[w]))``.

        ``metric`` is the histogram's base name (without ``_bucket``); buckets are
        ``(upper bound, count)`` pairs in any order, ``+Inf`` included when present.
        """
        ...

    def instant(self, metric: str, matchers: Matchers, at_s: float) -> dict[Labels, float]:
        """``metric{matchers}`` at ``at_s``: each series' latest value within the lookback."""
        ...

    def avg_over_time(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float
    ) -> dict[Labels, float]:
        """``avg_over_time(metric{matchers}[window])`` per series."""
        ...

    def samples(
        self, metric: str, matchers: Matchers, at_s: float, range_s: float
    ) -> dict[Labels, list[Point]]:
        """The raw samples of ``metric{matchers}[range]`` at ``at_s`` (stale markers dropped)."""
        ...


#: Per window (seconds), per group or series, a track over a ``Grid``.
Tracks: TypeAlias = dict[float, dict[Labels, Track]]
#: Given every bucket bound a histogram's series have (ascending), the bounds worth reading.
LeChoice: TypeAlias = Callable[[Sequence[float]], Collection[float]]
#: Per window, per ``by`` group, ``(le, track)`` buckets.
BucketTracks: TypeAlias = dict[float, dict[Labels, list[tuple[float, Track]]]]


@runtime_checkable
class RangeSource(Source, Protocol):
    """A ``Source`` that also answers its queries at every instant of a ``Grid`` at once, as a
    range query (``/api/v1/query_range``) or a rule evaluated every step would: the backtest
    reads a month at the rules' interval this way. Each instant's value is the one the
    instant query gives there; several windows are asked at once so that a source reading
    samples itself reads them once."""

    semantics: Semantics
    external: bool

    def increase_range(
        self, metric: str, matchers: Matchers, grid: Grid, windows_s: Sequence[float],
        by: Sequence[str] = (),
    ) -> Tracks:
        """``sum by (by) (increase(metric{matchers}[w]))`` at every instant, per window."""
        ...

    def bucket_increase_range(
        self, metric: str, matchers: Matchers, grid: Grid, windows_s: Sequence[float],
        by: Sequence[str] = (), *, les: LeChoice | None = None,
    ) -> BucketTracks:
        """``sum by (by, le) (increase(metric_bucket{matchers}[w]))`` at every instant; only
        the bounds ``les`` chooses, when given."""
        ...

    def avg_over_time_range(
        self, metric: str, matchers: Matchers, grid: Grid, windows_s: Sequence[float],
    ) -> Tracks:
        """``avg_over_time(metric{matchers}[w])`` per series at every instant."""
        ...

    def instant_range(self, metric: str, matchers: Matchers, grid: Grid) -> dict[Labels, Track]:
        """``metric{matchers}`` per series at every instant (each series' latest value
        within the lookback, as ``instant`` gives it)."""
        ...


@runtime_checkable
class OwnSamples(Protocol):
    """A source that reads its own samples (the embedded store; a Prometheus answers queries
    only) and hands readers of many samples what they need without a ``Point`` per sample:
    each series' counter window from the rollup, or its samples as arrays. Both cover the
    window ``samples(metric, matchers, at_s, range_s)`` reads."""

    def counter_windows(self, metric: str, matchers: Matchers, at_s: float, window_s: float
                        ) -> Mapping[SeriesKey, CounterWindow] | None:
        """Per series, count, first and last sample and the value before each drop; None
        while there is no rollup."""
        ...

    def window_arrays(self, metric: str, matchers: Matchers, at_s: float, range_s: float
                      ) -> Mapping[Labels, tuple[IntArray, FloatArray]] | None:
        """Per series, times (Unix ms) and values, staleness markers left out; None when
        this source cannot say (a wrapper over a source that reads no samples itself)."""
        ...


@runtime_checkable
class Downsampled(Protocol):
    """A source whose older samples are one per bucket (the embedded store after
    ``compact()``); a Prometheus keeps every scrape and does not implement this."""

    def downsampled(self) -> tuple[int, float] | None:
        """``(before_ms, resolution_s)``: samples older than ``before_ms`` (Unix ms) are the
        last of their ``resolution_s`` bucket; ``None`` while none is."""
        ...


@runtime_checkable
class RequestLog(Protocol):
    """The gateway's per-request log, read over a window (over the gateway's file:
    ``slo.sources.request_log.GatewayRecords``)."""

    def records(self, pool: str, at_s: float, window_s: float) -> Iterable[RequestRecord]:
        """The pool's requests that finished in ``(at_s - window_s, at_s]``."""
        ...
