"""A ``Source`` over series held in memory: what the embedded engine computes from a handful of
samples, without a store (the generated promtool tests' expected values)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slo.promql.aggregate import instant_vector, sum_by
from slo.promql.lookup import Semantics, SemanticsLike, select_range, semantics_of
from slo.promql.quantile import Bucket, parse_le
from slo.promql.rate import increase
from slo.sources.embedded import avg_over_time_value
from slo.sources.protocol import Matchers
from vigil.conventions import LABEL_LE, SUFFIX_BUCKET
from vigil.model import Labels, Point
from vigil.selectors import as_selector

__all__ = ["MemorySource"]


class MemorySource:
    """``slo.sources.protocol.Source`` over series held in memory, ``{metric: {labels:
    points}}`` (no staleness markers), computed with the same ``slo.promql`` primitives as
    ``EmbeddedSource``: what the embedded engine would answer for a handful of samples (the
    generated promtool tests' expected values). Its series carry Vigil's own labels
    (``external`` is false); matchers may be a mapping or a ``Selector``."""

    kind = "memory"
    external = False

    def __init__(self, series: Mapping[str, Mapping[Labels, list[Point]]], *,
                 semantics: SemanticsLike = "2", lookback_s: float = 300.0) -> None:
        self.semantics: Semantics = semantics_of(semantics)
        self.lookback_s = lookback_s
        self._series = {name: dict(by) for name, by in series.items()}

    def _select(self, metric: str, matchers: Matchers) -> dict[Labels, list[Point]]:
        chosen = as_selector(matchers)
        return {
            labels: points for labels, points in self._series.get(metric, {}).items()
            if chosen.matches(dict(labels))
        }

    def _per_series_increase(self, metric: str, matchers: Matchers, at_s: float,
                             window_s: float) -> dict[Labels, float]:
        out = {}
        for labels, pts in self._select(metric, matchers).items():
            value = increase([p.ts_ms for p in pts], [p.value for p in pts], at_s, window_s,
                             self.semantics)
            if value is not None:
                out[labels] = value
        return out

    def increase(self, metric: str, matchers: Matchers, at_s: float, window_s: float,
                 by: Sequence[str] = ()) -> dict[Labels, float]:
        return sum_by(self._per_series_increase(metric, matchers, at_s, window_s), by,
                      self.semantics)

    def bucket_increase(self, metric: str, matchers: Matchers, at_s: float, window_s: float,
                        by: Sequence[str] = ()) -> dict[Labels, list[Bucket]]:
        per_series = self._per_series_increase(metric + SUFFIX_BUCKET, matchers, at_s,
                                               window_s)
        summed = sum_by(per_series, (*by, LABEL_LE), self.semantics)
        groups: dict[Labels, list[Bucket]] = {}
        for labels, value in summed.items():
            le = parse_le(dict(labels).get(LABEL_LE, ""))
            if le is None:
                continue
            key = tuple((k, v) for k, v in labels if k in by)
            groups.setdefault(key, []).append((le, value))
        return groups

    def instant(self, metric: str, matchers: Matchers, at_s: float) -> dict[Labels, float]:
        data = {labels: ([p.ts_ms for p in pts], [p.value for p in pts])
                for labels, pts in self._select(metric, matchers).items()}
        return instant_vector(data, at_s, self.lookback_s, self.semantics)

    def avg_over_time(self, metric: str, matchers: Matchers, at_s: float,
                      window_s: float) -> dict[Labels, float]:
        out = {}
        for labels, pts in self._select(metric, matchers).items():
            window = select_range([p.ts_ms for p in pts], [p.value for p in pts], at_s,
                                  window_s, self.semantics)
            value = avg_over_time_value(window.values.tolist(), self.semantics)
            if value is not None:
                out[labels] = value
        return out

    def samples(self, metric: str, matchers: Matchers, at_s: float,
                range_s: float) -> dict[Labels, list[Point]]:
        out = {}
        for labels, pts in self._select(metric, matchers).items():
            window = select_range([p.ts_ms for p in pts], [p.value for p in pts], at_s,
                                  range_s, self.semantics)
            if window.ts_ms.size:
                out[labels] = [Point(int(t), float(v)) for t, v in
                               zip(window.ts_ms.tolist(), window.values.tolist(), strict=True)]
        return out
