"""Comparing two parses of an exposition sample for sample: our parser against
prometheus_client's, numbers compared as the library's text would show them."""

from __future__ import annotations

import math

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families as library_text
from prometheus_client.samples import Sample

#: prometheus_client's text parser reads "1" as int from 0.22 on and as float before; ours reads
#: it as the newer library does, on every version. Where the installed library is older, an int
#: of ours beside its float of the same value is the same number.
LIBRARY_TEXT_INTS = type(next(library_text("g 1\n")).samples[0].value) is int


def same_number(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if not LIBRARY_TEXT_INTS and type(a) is int and type(b) is float:
        return float(a) == b
    return type(a) is type(b) and a == b


def assert_identical(ours: list[Metric], theirs: list[Metric]) -> None:
    """Equal as Metric.__eq__ sees it, and sample by sample down to label order and types.

    NaN != NaN, so a NaN sample makes Metric.__eq__ false even between two library parses;
    the sample-by-sample check treats two NaNs as equal instead.
    """
    assert [(type(m), m.name, m.documentation, m.type, m.unit) for m in ours] == [
        (type(m), m.name, m.documentation, m.type, m.unit) for m in theirs
    ]
    for mine, lib in zip(ours, theirs, strict=True):
        assert len(mine.samples) == len(lib.samples), mine.name
        for s, t in zip(mine.samples, lib.samples, strict=True):
            assert type(s) is Sample
            assert s.name == t.name
            assert list(s.labels.items()) == list(t.labels.items())
            assert same_number(s.value, t.value), (s, t)
            assert type(s.timestamp) is type(t.timestamp) and (
                s.timestamp == t.timestamp or same_number(s.timestamp, t.timestamp)
            ), (s, t)
            assert s.exemplar == t.exemplar or (
                s.exemplar.labels == t.exemplar.labels
                and same_number(s.exemplar.value, t.exemplar.value)
            )
            assert s[5:] == t[5:] == (None,) * (len(Sample._fields) - 5)  # native_histogram
    if not any(math.isnan(s.value) for m in theirs for s in m.samples):
        assert ours == theirs
