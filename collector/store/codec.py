"""How series and sample values are spelled in the store's tables.

Values: a float; SQL NULL is a staleness marker (``STALE``); a NaN sample is the TEXT ``'NaN'``
(SQLite would turn a bound NaN into NULL, indistinguishable from a marker); ±Inf are REALs.
Series labels: canonical JSON of the sorted ``[name, value]`` pairs (``series.labels``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from vigil.model import Labels

__all__ = [
    "JSON",
    "NAN_TEXT",
    "TS_MAX",
    "TS_MIN",
    "counter_like",
    "decode_value",
    "encode_labels",
    "floor_to",
    "stored_float",
]

#: A NaN sample value as stored (see the module docstring).
NAN_TEXT = "NaN"
#: The widest timestamp bounds (Unix ms): an open end of a range.
TS_MIN = -(2**63)
TS_MAX = 2**63 - 1

#: Compact, UTF-8-preserving JSON (one encoder object: ``json.dumps`` with options builds one
#: per call).
JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
#: The string escaper that encoder uses; called directly it is ~5x faster for label pairs.
_json_str = json.encoder.encode_basestring


def counter_like(family_type: str, sample_name: str) -> bool:
    """True when a sample only goes up between resets, so downsampling must keep its resets.

    ``family_type`` is the metric family's type as prometheus_client names it (``counter``,
    ``gauge``, ``histogram``, ``gaugehistogram``, ``summary``, ``info``, ``stateset``,
    ``unknown``/``untyped``); ``sample_name`` the full sample name (``x_bucket``, ``x_total``).
    Counters are counter-like, and the ``_bucket``/``_count``/``_sum`` samples of histograms
    and summaries; ``_created`` timestamps, summary quantiles, gauge histograms and everything
    else are not.
    """
    t = family_type.lower()
    if t == "counter":
        return not sample_name.endswith("_created")
    if t in ("histogram", "summary"):
        return sample_name.endswith(("_bucket", "_count", "_sum"))
    return False


def encode_labels(labels: Labels) -> str:
    """Canonical JSON of sorted ``[name, value]`` pairs (the ``series.labels`` column).

    Byte-identical to ``JSON.encode(sorted(labels))``, which a test checks.
    """
    return "[" + ",".join(f"[{_json_str(k)},{_json_str(v)}]" for k, v in sorted(labels)) + "]"


def decode_value(v: Any) -> float | None:
    """A stored ``value`` as a sample value: a float, or None for a staleness marker."""
    # REAL comes back as float, a marker as None; the only TEXT we ever store is NaN.
    if v is None or type(v) is float:
        return v
    if isinstance(v, str):
        return math.nan
    return float(v)


def stored_float(v: object) -> float:
    """A stored ``value`` that is a sample (markers, SQL NULL, are left out before this) as a
    float: REAL as is, the TEXT ``'NaN'`` as NaN."""
    if type(v) is float:
        return v
    return math.nan if isinstance(v, str) else float(v)  # type: ignore[arg-type]


def floor_to(ms: int, step: int) -> int:
    """``ms`` rounded down to a multiple of ``step`` (both in the same unit, ms)."""
    return ms // step * step
