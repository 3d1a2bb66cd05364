"""The Prometheus text format 0.0.4, parsed like ``prometheus_client.parser`` but strictly.

Strict beyond the library (see the package docstring for the rest): anything after the
timestamp, a non-integer millisecond timestamp, and the OpenMetrics-only types (``info``,
``stateset``, ``gaugehistogram``, ``unknown``) that prometheus_client never writes here.
"""

from __future__ import annotations

import re

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from collector.exposition.body import DEFAULT_SOURCE, parse_body
from collector.exposition.families import ADDED_TOTAL, NO_EXEMPLAR_TAIL, new_tuple
from collector.exposition.fastpath import FastPath, skip_lines
from collector.exposition.histograms import HistGroup, finish_histogram, hist_bucket
from collector.exposition.labels import label_entry, parse_label_set
from collector.exposition.problems import Bad, Slow, duplicate, q
from collector.exposition.tokens import (
    METRIC_NAME,
    WHITESPACE,
    WORD,
    check_metric_name,
    number,
    sample_name,
    skip_space,
    unescape,
)

__all__ = ["parse_text"]

# Family type -> allowed sample-name suffixes, as the library's parser uses them.
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("",),
    "gauge": ("",),
    "untyped": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
_BLANKS = re.compile(r"[ \t]+")
# A token of prometheus_client.parser._split_quoted: whitespace inside "..." does not split, a
# backslash escapes a quote or a backslash. The library's own loop is quadratic on backslashes.
_COMMENT_TOKEN = re.compile(
    r'(?:\\[\\"]|\\|"(?:\\[\\"]|\\|[^"\\])*+"?|[^ \t\n\r\x0b\x0c"\\])++'
)
_COMMENT_SPACE = re.compile(r"[ \t\n\r\x0b\x0c]*")  # string.whitespace
_HELP_ESCAPE = re.compile(r"\\[\\n]")


def parse_text(text: str, *, source: str = DEFAULT_SOURCE) -> list[Metric]:
    """Parse the Prometheus text format 0.0.4 like ``prometheus_client.parser``, but strictly.

    Returns what ``list(text_string_to_metric_families(text))`` returns for every valid input
    (timestamps are float seconds, i.e. the milliseconds on the line / 1000). Raises
    ``ParseError`` with the 1-based line for anything malformed.
    """
    return parse_body(text, source, _parse_lines, final_newline_ends=False)


def _parse_lines(lines: list[str]) -> list[Metric]:
    """The families of a text exposition; mirrors prometheus_client.parser's state machine.

    One long loop on purpose: it is the hot path, and locals are much cheaper than attributes
    or calls in CPython. The library's semantics it reproduces: a HELP or TYPE line for a new
    name closes the current family; a sample whose name is not one the current family allows
    closes it and becomes a one-sample ``unknown`` family of its own.

    A duplicate series is the same name, label set and timestamp (a backfill file may repeat a
    series at other timestamps). The label set is keyed as ``(labels without le, le)``, a form
    the bucket-run path can produce without building a frozenset per line; histogram
    label sets are validated per timestamp.
    """
    out: list[Metric] = []
    name = ""  # current family; "" = none
    doc = ""
    typ = "untyped"
    samples: list[Sample] = []
    allowed: frozenset[str] = frozenset()
    bucket_name = count_name = ""
    groups: dict[tuple, HistGroup] | None = None  # (labels without le, ts), histograms only
    helped: set[str] = set()
    typed: set[str] = set()
    sampled: set[str] = set()  # families (or lone samples) already emitted with samples
    names_ok: set[str] = set()  # metric names already validated (HELP and TYPE repeat them)
    fast = FastPath(openmetrics=False)
    seen, les = fast.seen, fast.les
    lineno = 0
    numbered = enumerate(lines, 1)
    try:
        for lineno, raw in numbered:
            line = raw.strip()
            if not line:
                continue
            if line[0] == "#":
                meta = _metadata(line, names_ok)
                if meta is None:
                    continue
                keyword, cand, arg = meta
                if keyword == "HELP":
                    if cand in helped:
                        raise Bad(f"duplicate HELP line for {q(cand)}")
                    helped.add(cand)
                    if cand != name:
                        if name:
                            _emit(out, sampled, name, doc, typ, samples, groups)
                        name, typ, samples, groups = cand, "untyped", [], None
                        allowed = frozenset((cand,))
                    doc = arg
                    continue
                if cand in typed:
                    raise Bad(f"duplicate TYPE line for {q(cand)}")
                if cand in sampled or (cand == name and samples):
                    raise Bad(f"TYPE line for {q(cand)} comes after its samples")
                typed.add(cand)
                if cand != name:
                    if name:
                        _emit(out, sampled, name, doc, typ, samples, groups)
                    name, doc, samples = cand, "", []
                typ = arg
                allowed = frozenset(map(cand.__add__, _SUFFIXES[arg]))
                groups = None
                if arg == "histogram":  # the names below are read only while groups is set
                    groups = {}
                    bucket_name, count_name = cand + "_bucket", cand + "_count"
                continue

            # A sample. Fast path: `name value [ts]` or `name{k="v",...} value [ts]`, no escapes.
            try:
                sname, labels, label_info, value, ts_tok = fast.sample(line)
                fast_line = True
                ts = None
                if ts_tok is not None:
                    if not ts_tok.isdecimal():
                        raise Slow
                    ts = int(ts_tok) / 1000
                if sname not in allowed and not METRIC_NAME.fullmatch(sname):
                    raise Slow
            except (Slow, ValueError):
                sname, labels, value, ts = _sample_slow(line)
                label_info = label_entry(labels)
                fast_line = False  # not a candidate for a bucket run
            _, group_key, le = label_info

            first = seen.setdefault((sname, group_key, le, ts), lineno)
            if first != lineno:
                raise Bad(duplicate(sname, labels, first))
            sample = new_tuple(Sample, (sname, labels, value, ts) + NO_EXEMPLAR_TAIL)  # noqa: RUF005 (see SAMPLE_TAIL)
            if sname in allowed:
                samples.append(sample)
                if groups is None:
                    continue
                group = groups.get((group_key, ts))
                if group is None:
                    group = groups[(group_key, ts)] = HistGroup(lineno, labels)
                if sname == bucket_name:
                    if le is None:
                        raise Bad(f"histogram bucket {q(sname)} without an 'le' label")
                    hist_bucket(name, group, le, value, lineno, les)
                    if fast_line and ts is None:
                        taken = fast.bucket_run(lines, lineno, line, le, sname, name, labels,
                                                group_key, group, samples)
                        if taken:
                            lineno, _ = skip_lines(numbered, taken)
                elif sname == count_name:
                    group.count, group.count_line = value, lineno
                continue
            if sname in typed or sname in helped:
                raise Bad(f"sample {q(sname)} is separated from its family's HELP/TYPE lines")
            if name:
                _emit(out, sampled, name, doc, typ, samples, groups)
            name, doc, typ, samples, groups = "", "", "untyped", [], None
            allowed = frozenset()
            lone = Metric(sname, "", "untyped")
            lone.samples = [sample]
            out.append(lone)
            sampled.add(sname)
        if name:
            _emit(out, sampled, name, doc, typ, samples, groups)
    except Bad as bad:
        bad.line = bad.line or lineno
        raise
    return out


def _emit(out: list[Metric], sampled: set[str], name: str, doc: str, typ: str,
          samples: list[Sample], groups: dict | None) -> None:
    """Close a text-format family: finish histogram checks, munge a counter, append it."""
    if samples:
        sampled.add(name)
    if groups:
        finish_histogram(name, groups, openmetrics=False)
    if typ == "counter":
        # The library's OpenMetrics-style munging: the family loses `_total`, samples keep it.
        if name.endswith("_total"):
            name = name[:-6]
        else:
            samples = [new_tuple(Sample, (s[0] + "_total", *s[1:])) for s in samples]
            metric = Metric(name, doc, typ)
            metric.samples = samples
            # Remember that `_total` is not on the wire: Prometheus stores the name as exposed
            # (dcgm-exporter's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION has no `_total`).
            setattr(metric, ADDED_TOTAL, True)
            out.append(metric)
            return
    metric = Metric(name, doc, typ)
    metric.samples = samples
    out.append(metric)


def _metadata(line: str, names_ok: set[str]) -> tuple[str, str, str] | None:
    """``(keyword, name, argument)`` of a HELP/TYPE line; None for any other comment."""
    keyword = ""
    head = line[:7]
    if head == "# HELP " or head == "# TYPE ":
        cand, _, arg = line[7:].partition(" ")
        if cand in names_ok or METRIC_NAME.fullmatch(cand):
            names_ok.add(cand)
            keyword = head[2:6]
            arg = arg.lstrip(WHITESPACE)
    if not keyword:
        # Odd spacing or an ordinary comment: tokenise exactly like the library.
        parts = _split_comment(line)
        if len(parts) < 2 or parts[1] not in ("HELP", "TYPE"):
            return None
        keyword = parts[1]
        if len(parts) == 2:
            raise Bad(f"truncated line: {keyword} without a metric name")
        cand = parts[2]
        check_metric_name(cand)
        arg = parts[3] if len(parts) == 4 else ""
    if keyword == "HELP":
        if "\\" in arg:
            arg = _HELP_ESCAPE.sub(unescape, arg)
        return keyword, cand, arg
    if not arg:
        raise Bad(f"truncated line: TYPE for {q(cand)} without a type")
    if arg not in _SUFFIXES:
        known = ", ".join(sorted(_SUFFIXES))
        raise Bad(f"unknown metric type {q(arg)} for {q(cand)} (text format allows {known})")
    return keyword, cand, arg


def _split_comment(line: str) -> list[str]:
    """prometheus_client.parser._split_quoted(line, None, 3), in linear time."""
    parts: list[str] = []
    pos = 0
    end = len(line)
    while True:
        pos = _COMMENT_SPACE.match(line, pos).end()  # type: ignore[union-attr]
        if pos >= end:
            return parts
        if len(parts) == 3:
            parts.append(line[pos:])
            return parts
        # Any non-blank character starts a token, so this always matches.
        match = _COMMENT_TOKEN.match(line, pos)
        parts.append(match.group())  # type: ignore[union-attr]
        pos = match.end()  # type: ignore[union-attr]


def _sample_slow(line: str) -> tuple[str, dict[str, str], int | float, float | None]:
    """Parse a text-format sample line the fast path declined; ``Bad`` says what is wrong."""
    name, pos = sample_name(line)
    end = len(line)
    after = skip_space(line, pos)
    if after < end and line[after] == "{":
        labels, pos = parse_label_set(line, after + 1, text_format=True)
    elif after == pos and pos < end:
        raise Bad(f"invalid metric name {q(WORD.match(line).group())}")  # type: ignore
    else:
        labels = {}
    toks = _BLANKS.split(line[pos:].strip(" \t"))
    if not toks[0]:
        raise Bad(f"truncated line: sample {q(name)} has no value")
    value = number(toks[0])
    if value is None:
        if not labels and "{" in line:  # e.g. `my metric{...}`: the name is what is wrong
            bad_name = line[:line.index("{")].strip()
            raise Bad(f"invalid metric name {q(bad_name)}")
        raise Bad(f"invalid sample value {q(toks[0])}")
    if len(toks) > 2:
        raise Bad(f"unexpected text after the value and timestamp: {q(' '.join(toks[2:]))}")
    ts = None
    if len(toks) == 2:
        ts = _timestamp(toks[1])
    return name, labels, value, ts


def _timestamp(tok: str) -> float:
    """Seconds from a text-format timestamp token (integer milliseconds), as the library does."""
    digits = tok[1:] if tok[:1] in ("+", "-") else tok
    if digits.isdecimal():
        try:
            return int(tok) / 1000
        except ValueError:
            pass  # more digits than int() accepts
    raise Bad(f"invalid timestamp {q(tok)} (expected integer milliseconds)")
