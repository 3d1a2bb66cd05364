"""Where the SLO engine reads samples: the embedded store or a Prometheus-compatible API.

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

A source that thins old samples out (the embedded store's downsampling) also implements
``Downsampled``, so that what counts samples (``slo.cost``) knows how long each one stands for.

Times are Unix seconds (float), windows seconds. Results are keyed by ``Labels`` (sorted label
pairs): the ``by`` labels for aggregations, the full label set for per-series results. A series or
group that PromQL would leave out of the result (fewer than two samples in the window, no sample
within the lookback) is absent from the dict, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from slo.lookup import Semantics
from slo.quantile import Bucket
from vigil.model import Labels, Point

__all__ = ["Downsampled", "Matchers", "Source"]

#: Equality label matchers, ``{"pool": "chat", "kind": "vllm"}``. An empty value matches series
#: without that label, as in PromQL.
Matchers = Mapping[str, str]


@runtime_checkable
class Source(Protocol):
    """A read-only view of the fleet's samples that answers in PromQL terms."""

    #: The PromQL rules this source follows ("3" default; "2" for Prometheus 2.x).
    semantics: Semantics

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


@runtime_checkable
class Downsampled(Protocol):
    """A source whose older samples are one per bucket (the embedded store after
    ``compact()``); a Prometheus keeps every scrape and does not implement this."""

    def downsampled(self) -> tuple[int, float] | None:
        """``(before_ms, resolution_s)``: samples older than ``before_ms`` (Unix ms) are the
        last of their ``resolution_s`` bucket; ``None`` while none is."""
        ...
