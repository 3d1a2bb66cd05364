"""The PromQL-exact primitives in one import: ``from slo.promql import rate, sum_by, ...``.

The code lives in small modules named for what they hold:

* ``slo.promql.lookup`` — ``Semantics``, time conversion, ``select_range``, ``instant_value``;
* ``slo.promql.rate`` — ``rate``, ``increase``, ``delta`` (``extrapolatedRate``);
* ``slo.promql.quantile`` — ``histogram_quantile``, ``bucket_fraction_below``,
  ``histogram_quantile_over``;
* ``slo.promql.aggregate`` — ``per_series``, ``instant_vector``, ``sum_by``, ``divide_vectors``.

``docs/promql-semantics.md`` documents every rule with its Prometheus source, and
``tests/test_promql_vs_prometheus.py`` checks the results against a real Prometheus.
"""

from __future__ import annotations

from slo.promql.aggregate import divide, divide_vectors, instant_vector, per_series, sum_by
from slo.promql.lookup import (
    DEFAULT_SEMANTICS,
    LOOKBACK_DELTA_S,
    Semantics,
    SemanticsLike,
    Window,
    eval_time_ms,
    instant_value,
    prepare,
    select_range,
)
from slo.promql.quantile import (
    Bucket,
    bucket_fraction_below,
    histogram_quantile,
    histogram_quantile_over,
    parse_le,
)
from slo.promql.rate import delta, extrapolated_rate, increase, rate

__all__ = [
    "DEFAULT_SEMANTICS",
    "LOOKBACK_DELTA_S",
    "Bucket",
    "Semantics",
    "SemanticsLike",
    "Window",
    "bucket_fraction_below",
    "delta",
    "divide",
    "divide_vectors",
    "eval_time_ms",
    "extrapolated_rate",
    "histogram_quantile",
    "histogram_quantile_over",
    "increase",
    "instant_value",
    "instant_vector",
    "parse_le",
    "per_series",
    "prepare",
    "rate",
    "select_range",
    "sum_by",
]
