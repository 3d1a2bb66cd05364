"""The result model: prometheus_client ``Metric`` families of ``Sample``s, as the library returns.

Plus one mark of our own: a counter family whose samples got a ``_total`` the exposition did not
have (``wire_name`` undoes it for storage), and the ``vllm_`` -> ``vllm:`` rename.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from vigil.conventions import VLLM_ESCAPED_PREFIX, VLLM_PREFIX

__all__ = [
    "ADDED_TOTAL",
    "NO_EXEMPLAR_TAIL",
    "NO_TS_TAIL",
    "SAMPLE_TAIL",
    "new_tuple",
    "normalise_vllm_names",
    "wire_name",
]

#: Builds a Sample as ``new_tuple(Sample, fields)`` without NamedTuple.__new__'s Python frame.
new_tuple = tuple.__new__

#: The fields of ``Sample`` after (name, labels, value, timestamp, exemplar), all None:
#: prometheus_client 0.22 added ``native_histogram``; 0.21 has none. A sample is built as
#: ``(name, labels, value, ts, exemplar) + SAMPLE_TAIL`` so both versions get their own shape.
#: Concatenation, not ``*SAMPLE_TAIL`` inside the literal: on the per-sample path it costs
#: about half as much (one tuple add instead of an unpacking build).
SAMPLE_TAIL: tuple[None, ...] = (None,) * (len(Sample._fields) - 5)
#: exemplar and the tail, for a sample without an exemplar (the text format).
NO_EXEMPLAR_TAIL: tuple[None, ...] = (None, *SAMPLE_TAIL)
#: timestamp, exemplar and the tail, for the common sample with neither.
NO_TS_TAIL: tuple[None, ...] = (None, None, *SAMPLE_TAIL)

#: Attribute set on a counter family whose samples got a `_total` the exposition did not have.
ADDED_TOTAL = "_vigil_added_total"


def wire_name(family: Metric, sample_name: str) -> str:
    """The sample's name as it was exposed, which is the name Prometheus stores.

    prometheus_client's text parser (and so ours, which must equal it) appends ``_total`` to the
    samples of a counter whose TYPE line lacks it; this undoes that for storage.
    """
    if getattr(family, ADDED_TOTAL, False) and sample_name.endswith("_total"):
        return sample_name[:-6]
    return sample_name


def normalise_vllm_names(families: Iterable[Metric]) -> list[Metric]:
    """Rewrite the ``vllm_`` prefix of family and sample names to ``vllm:``.

    Makes the OpenMetrics-escaped spelling (client_python#1177) and the text-format spelling
    store as one series. Families that need no change are returned as they are.
    """
    out: list[Metric] = []
    for family in families:
        name = _vllm_name(family.name)
        samples = [
            s._replace(name=_vllm_name(s.name)) if s.name.startswith(VLLM_ESCAPED_PREFIX) else s
            for s in family.samples
        ]
        unchanged = all(a is b for a, b in zip(samples, family.samples, strict=True))
        if name == family.name and unchanged:
            out.append(family)
            continue
        renamed = Metric(name, family.documentation, family.type, family.unit)
        renamed.samples = samples
        if getattr(family, ADDED_TOTAL, False):
            setattr(renamed, ADDED_TOTAL, True)
        out.append(renamed)
    return out


def _vllm_name(name: str) -> str:
    if name.startswith(VLLM_ESCAPED_PREFIX):
        return VLLM_PREFIX + name[len(VLLM_ESCAPED_PREFIX):]
    return name
