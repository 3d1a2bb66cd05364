"""Parse Prometheus text (0.0.4) and OpenMetrics 1.0 expositions: fast, strict, library-identical.

Why not ``prometheus_client.parser``: since 0.22 the library parser runs about 4x slower than
0.21 (client_python#1114) -- a few tens of thousands of samples/s on the vLLM fixture -- and
the collector must parse 1,000 vLLM replicas every 15 s on one core. This package is a
re-implementation that returns the *same* objects -- ``prometheus_client`` ``Metric`` and
``Sample``, the same family splitting, counter munging, label dicts (and label order), int-or-float
values and timestamps -- for every valid exposition. ``tests/test_exposition.py`` pins that
identity against prometheus_client 0.26.0 on every fixture, on hand-written edge cases and on
random expositions; ``bench/parse_bench.py`` measures the speed-up.

How it is fast: the shared fast paths of ``fastpath`` (bucket runs, a label-set cache, a
``str.find``/``split`` splitter), then a careful slow path per format (linear-time regexes, no
backtracking) for anything else -- escapes, odd spacing, tabs, OpenMetrics timestamps and
exemplars -- which accepts what the library accepts on valid input and explains everything else.

How it is strict (the library is lax about most of these): a ``ParseError`` naming the source,
the 1-based line and the offending text for a truncated line, a bad number, a duplicate series
(same name, label set and timestamp; a backfill may repeat a series at other timestamps), a
histogram label set without its ``+Inf`` bucket, with non-increasing ``le`` or non-cumulative
counts, or whose ``_count`` differs from ``+Inf``, an HTML error page, an empty body, invalid
UTF-8, an invalid metric or label name, an unknown TYPE, duplicate or late HELP/TYPE lines, a
family's samples split around other families, and (text format) anything after the timestamp or a
non-integer millisecond timestamp. Deliberately unsupported: quoted UTF-8 metric and label names
(``{"my.metric"}``), native histograms, and in the text format the OpenMetrics-only types
(``info``, ``stateset``, ``gaugehistogram``, ``unknown``) that prometheus_client never writes there.

The modules: ``formats`` (``parse``: which format a body is in), ``text`` and ``openmetrics``
(one parser each), ``fastpath`` (what both parsers' hot loops share), ``labels``, ``tokens``
and ``histograms`` (the pieces of a line and the histogram rules, both formats), ``body``
(whole-body checks and error locations), ``families`` (the result model) and ``problems``
(internal exceptions and message formatting). Only the names below are public.
"""

from __future__ import annotations

from collector.exposition.families import normalise_vllm_names, wire_name
from collector.exposition.formats import parse
from collector.exposition.openmetrics import parse_openmetrics
from collector.exposition.text import parse_text
from collector.exposition.tokens import sample_value

__all__ = [
    "normalise_vllm_names",
    "parse",
    "parse_openmetrics",
    "parse_text",
    "sample_value",
    "wire_name",
]
