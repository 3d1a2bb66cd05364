"""Parse Prometheus text (0.0.4) and OpenMetrics 1.0 expositions: fast, strict, library-identical.

Why not ``prometheus_client.parser``: since 0.22 the library parser runs about 4x slower than
0.21 (client_python issue 1114) -- a few tens of thousands of samples/s on the vLLM fixture --
and the collector must parse 1,000 vLLM replicas every 15 s on one core. This module is a
re-implementation that returns the *same* objects -- ``prometheus_client`` ``Metric`` and
``Sample``, the same family splitting, counter munging, label dicts (and label order), int-or-float
values and timestamps -- for every valid exposition. ``tests/test_exposition.py`` pins that
identity against prometheus_client 0.26.0 on every fixture, on hand-written edge cases and on
random expositions; ``bench/parse_bench.py`` measures the speed-up.

How it is fast, in the order a line meets them:

- bucket runs: consecutive ``_bucket`` lines of one label set differ only in ``le`` and the
  value, so a line that matches the previous bucket's text around its ``le`` reuses its labels
  and histogram state (most of a vLLM exposition is histogram buckets);
- a per-parse cache from label-set text to parsed labels, since most label sets repeat across
  families (``engine="0",model_name="..."`` in vLLM, the per-GPU set in DCGM);
- a fast path on ``str.find``/``split`` for ``name{k="v",...} value [ts]`` without escapes;
- a careful slow path (linear-time regexes, no backtracking) for anything else -- escapes, odd
  spacing, tabs, OpenMetrics timestamps and exemplars -- which accepts what the library accepts
  on valid input and explains everything else.

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

OpenMetrics: besides the library's own checks, the parser accepts the client_python#1177 quirk
(HELP/TYPE say ``vllm:x`` while samples say ``vllm_x``) and reports such samples under the
family's ``vllm:`` spelling; the library instead raises on the vLLM fixture (or, on smaller
inputs, splits them into empty typed families plus ``unknown`` ones).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar, Sample, Timestamp

from vigil.conventions import VLLM_ESCAPED_PREFIX, VLLM_PREFIX
from vigil.errors import ParseError

__all__ = [
    "normalise_vllm_names",
    "parse",
    "parse_openmetrics",
    "parse_text",
    "sample_value",
    "wire_name",
]

DEFAULT_SOURCE = "<exposition>"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text"
HTML_REASON = "looks like HTML, not a Prometheus exposition"
#: OpenMetrics caps the label names plus values of one exemplar at this many characters.
EXEMPLAR_MAX_RUNES = 128

# Family name -> allowed sample-name suffixes, as the library's parsers use them.
_TEXT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("",),
    "gauge": ("",),
    "untyped": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
_OM_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "histogram": ("_count", "_sum", "_bucket", "_created"),
    "gaugehistogram": ("_gcount", "_gsum", "_bucket"),
    "info": ("_info",),
}
_OM_TYPES = frozenset(
    ("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset")
)
_HISTOGRAM_TYPES = frozenset(("histogram", "gaugehistogram"))
_COUNTER_LIKE = frozenset(("_total", "_sum", "_count", "_bucket", "_gcount", "_gsum"))
_INF = math.inf

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Up to the next blank, '=', ',', brace or quote: what we quote back in "invalid name" errors.
_NAME_TOKEN = re.compile(r'[^\s=,{}"]*')
_WORD = re.compile(r"[^\s{]*")  # up to a blank or '{': a bad metric name, for messages
_ANY_SPACE = re.compile(r"\s*")  # str.strip()'s whitespace, which the library strips
_BLANKS = re.compile(r"[ \t]+")
# The rest of a quoted label value after its opening quote. Possessive: linear on any input.
_QUOTED_REST = re.compile(r'[^"\\]*+(?:\\.[^"\\]*+)*+"')
# A token of prometheus_client.parser._split_quoted: whitespace inside "..." does not split, a
# backslash escapes a quote or a backslash. The library's own loop is quadratic on backslashes.
_COMMENT_TOKEN = re.compile(
    r'(?:\\[\\"]|\\|"(?:\\[\\"]|\\|[^"\\])*+"?|[^ \t\n\r\x0b\x0c"\\])++'
)
_COMMENT_SPACE = re.compile(r"[ \t\n\r\x0b\x0c]*")  # string.whitespace
_WHITESPACE = " \t\n\r\x0b\x0c"
_LEADING_LT = re.compile(r"\s*<")
_HTML_TAG = re.compile(r"<(?:html|!doctype\s+html)\b", re.IGNORECASE)

_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_LABEL_ESCAPE = re.compile(r'\\[\\n"]')
_TEXT_HELP_ESCAPE = re.compile(r"\\[\\n]")
_OM_HELP_ESCAPE = re.compile(r'\\[\\n"]')

_new_tuple = tuple.__new__  # builds a Sample without NamedTuple.__new__'s Python-level frame
_NO_LABELS: frozenset[tuple[str, str]] = frozenset()


def _unescape(match: re.Match[str]) -> str:
    return _ESCAPES[match.group(0)]


class _Bad(Exception):
    """A problem found while parsing: ``reason``, and ``line`` when it is not the current line."""

    def __init__(self, reason: str, line: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line


class _Slow(Exception):
    """The fast path declines a line; the slow path parses it or says what is wrong."""


# --- public API ---------------------------------------------------------------------------


def parse(
    body: str | bytes, *, content_type: str | None = None, source: str = DEFAULT_SOURCE
) -> list[Metric]:
    """Parse a scraped body in whichever format it is.

    OpenMetrics when ``content_type`` is ``application/openmetrics-text``; the text format when
    it is ``text/plain``; otherwise OpenMetrics if the body's last line is ``# EOF``. Bytes are
    decoded as UTF-8 (invalid UTF-8 raises ``ParseError``).
    """
    text = body if isinstance(body, str) else _decode(body, source)
    if _wants_openmetrics(content_type, text):
        return parse_openmetrics(text, source=source)
    return parse_text(text, source=source)


def parse_text(text: str, *, source: str = DEFAULT_SOURCE) -> list[Metric]:
    """Parse the Prometheus text format 0.0.4 like ``prometheus_client.parser``, but strictly.

    Returns what ``list(text_string_to_metric_families(text))`` returns for every valid input
    (timestamps are float seconds, i.e. the milliseconds on the line / 1000). Raises
    ``ParseError`` with the 1-based line for anything malformed.
    """
    _precheck(text, source)
    lines = text.split("\n")
    try:
        return _parse_text_lines(lines)
    except _Bad as bad:
        raise _located(bad, lines, text, source) from None


def parse_openmetrics(text: str, *, source: str = DEFAULT_SOURCE) -> list[Metric]:
    """Parse OpenMetrics 1.0 like ``prometheus_client.openmetrics.parser``, but strictly.

    Timestamps are ``Timestamp`` objects (or float seconds), as in the library. Also accepts the
    client_python#1177 escaping quirk: a family declared as ``a:b`` whose samples are spelled
    ``a_b...`` keeps its samples, under the ``a:b`` spelling.
    """
    _precheck(text, source)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line does not start another one
    try:
        return _parse_openmetrics_lines(lines)
    except _Bad as bad:
        raise _located(bad, lines, text, source) from None


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
        if getattr(family, _ADDED_TOTAL, False):
            setattr(renamed, _ADDED_TOTAL, True)
        out.append(renamed)
    return out


def _vllm_name(name: str) -> str:
    if name.startswith(VLLM_ESCAPED_PREFIX):
        return VLLM_PREFIX + name[len(VLLM_ESCAPED_PREFIX):]
    return name


# --- body-level checks --------------------------------------------------------------------


def _decode(body: bytes, source: str) -> str:
    """UTF-8 text of ``body``; ``ParseError`` (HTML or not-UTF-8) if it has invalid bytes."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as err:
        _check_html_start(body[:4096].decode("utf-8", errors="replace"), source)
        line = body.count(b"\n", 0, err.start) + 1
        start = body.rfind(b"\n", 0, err.start) + 1
        snippet = body[start:start + 200].split(b"\n", 1)[0].decode("utf-8", errors="replace")
        raise ParseError(
            f"not valid UTF-8 ({err.reason} at byte {err.start})",
            source=source, line=line, text=snippet,
        ) from None


def _wants_openmetrics(content_type: str | None, text: str) -> bool:
    if content_type:
        media_type = content_type.split(";", 1)[0].strip().lower()
        if media_type == OPENMETRICS_CONTENT_TYPE:
            return True
        if media_type == "text/plain":
            return False
    tail = text[-4096:].rstrip()  # only the end matters; never copy a huge body
    return tail == "# EOF" or tail.endswith("\n# EOF")


def _precheck(text: str, source: str) -> None:
    """Reject an empty body (line 0) and a body that starts like an HTML page."""
    if not text or text.isspace():
        raise ParseError("empty exposition", source=source, line=0)
    _check_html_start(text, source)


def _check_html_start(text: str, source: str) -> None:
    match = _LEADING_LT.match(text)
    if match:
        raise _html_error(text, match.end() - 1, source)


def _html_error(text: str, offset: int, source: str) -> ParseError:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    line_text = text[start:end if end >= 0 else len(text)]
    return ParseError(HTML_REASON, source=source, line=text.count("\n", 0, offset) + 1,
                      text=line_text[:200])


def _located(bad: _Bad, lines: list[str], text: str, source: str) -> ParseError:
    """The ``ParseError`` for ``bad``; an HTML page anywhere in the body explains any failure."""
    html = _HTML_TAG.search(text)
    if html:
        return _html_error(text, html.start(), source)
    line = min(bad.line, len(lines))
    return ParseError(bad.reason, source=source, line=line,
                      text=lines[line - 1] if line else None)


# --- text format 0.0.4 --------------------------------------------------------------------


def _parse_text_lines(lines: list[str]) -> list[Metric]:
    """The families of a text exposition; mirrors prometheus_client.parser's state machine.

    One long loop on purpose: it is the hot path, and locals are much cheaper than attributes
    or calls in CPython. The library's semantics it reproduces: a HELP or TYPE line for a new
    name closes the current family; a sample whose name is not one the current family allows
    closes it and becomes a one-sample ``unknown`` family of its own.

    A duplicate series is the same name, label set and timestamp (a backfill file may repeat a
    series at other timestamps). The label set is keyed as ``(labels without le, le)``, a form
    the bucket-run path below can produce without building a frozenset per line; histogram
    label sets are validated per timestamp.
    """
    out: list[Metric] = []
    name = ""  # current family; "" = none
    doc = ""
    typ = "untyped"
    samples: list[Sample] = []
    allowed: frozenset[str] = frozenset()
    bucket_name = count_name = ""
    groups: dict[tuple, _HistGroup] | None = None  # (labels without le, ts), histograms only
    seen: dict[tuple, int] = {}
    helped: set[str] = set()
    typed: set[str] = set()
    sampled: set[str] = set()  # families (or lone samples) already emitted with samples
    names_ok: set[str] = set()  # metric names already validated (HELP and TYPE repeat them)
    label_keys: dict[str, str] = {}  # ',name=' -> 'name', for label names already validated
    # label-set text -> (labels, dedup key, le): most label sets repeat across families
    bodies: dict[str, tuple[dict[str, str], frozenset[tuple[str, str]], str | None]] = {}
    values: dict[str, int | float] = {}
    les: dict[str, float] = {}
    # The bucket run: consecutive buckets of one label set differ only in le and the value, so
    # after a bucket line we keep its text up to the le value (run_prefix) and from the quote
    # after it through "} " (run_mid); a line made of those around a new le reuses the labels.
    run_plen = run_mlen = 0  # 0 = no run
    run_prefix = run_mid = ""
    run_labels: dict[str, str] = {}
    run_key: frozenset[tuple[str, str]] = _NO_LABELS
    run_group: _HistGroup | None = None
    lineno = 0
    try:
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line:
                continue
            if run_plen and line.startswith(run_prefix):
                quote = line.find('"', run_plen)
                if quote > 0 and line.startswith(run_mid, quote):
                    le = line[run_plen:quote]
                    token = line[quote + run_mlen:]
                    value = values.get(token)
                    if value is None:
                        value = _number(token)
                        if value is not None:
                            values[token] = value
                    if value is not None and "\\" not in le:
                        labels = run_labels.copy()  # keeps the library's label order
                        labels["le"] = le
                        first = seen.setdefault((bucket_name, run_key, le, None), lineno)
                        if first != lineno:
                            raise _Bad(_duplicate(bucket_name, labels, first))
                        samples.append(
                            _new_tuple(Sample, (bucket_name, labels, value, None, None, None))
                        )
                        bound = les.get(le)
                        if bound is None:
                            bound = les[le] = _le_value(le, lineno)
                        group = run_group
                        if bound <= group.le or value < group.value or bound < 0:  # type: ignore
                            _hist_bucket(name, group, le, value, lineno, les)  # type: ignore
                        else:  # _hist_bucket, inlined for the hot path
                            group.le = bound  # type: ignore[union-attr]
                            group.value = value  # type: ignore[union-attr]
                            group.line = lineno  # type: ignore[union-attr]
                            if bound == _INF:
                                group.inf = value  # type: ignore[union-attr]
                        continue
            run_plen = 0
            if line[0] == "#":
                meta = _text_metadata(line, names_ok)
                if meta is None:
                    continue
                keyword, cand, arg = meta
                if keyword == "HELP":
                    if cand in helped:
                        raise _Bad(f"duplicate HELP line for {_q(cand)}")
                    helped.add(cand)
                    if cand != name:
                        if name:
                            _emit_text(out, sampled, name, doc, typ, samples, groups)
                        name, typ, samples, groups = cand, "untyped", [], None
                        allowed = frozenset((cand,))
                    doc = arg
                    continue
                if cand in typed:
                    raise _Bad(f"duplicate TYPE line for {_q(cand)}")
                if cand in sampled or (cand == name and samples):
                    raise _Bad(f"TYPE line for {_q(cand)} comes after its samples")
                typed.add(cand)
                if cand != name:
                    if name:
                        _emit_text(out, sampled, name, doc, typ, samples, groups)
                    name, doc, samples = cand, "", []
                typ = arg
                allowed = frozenset(cand + suffix for suffix in _TEXT_SUFFIXES[arg])
                groups = {} if arg == "histogram" else None
                bucket_name, count_name = cand + "_bucket", cand + "_count"
                continue

            # A sample. Fast path: `name value`, or `name{k="v",...} value` without escapes.
            try:
                brace = line.find("{")
                if brace < 0:
                    space = line.find(" ")
                    if space < 0:
                        raise _Slow
                    sname = line[:space]
                    rest = line[space:]
                    labels, group_key, le = {}, _NO_LABELS, None
                else:
                    close = line.rfind("}")
                    if close < brace:
                        raise _Slow
                    sname = line[:brace]
                    rest = line[close + 1:]
                    body = line[brace + 1:close]
                    known = bodies.get(body)
                    if known is None:
                        labels = _fast_labels(body, label_keys)
                        known = bodies[body] = (labels, *_dedup_key(labels))
                    else:
                        labels = known[0].copy()
                    group_key, le = known[1], known[2]
                toks = rest.split(" ")
                if toks[0] or not 1 < len(toks) < 4:
                    raise _Slow
                value = values.get(toks[1])
                if value is None:
                    value = _number(toks[1])
                    if value is None:
                        raise _Slow
                    values[toks[1]] = value
                ts = None
                if len(toks) == 3:
                    if not toks[2].isdecimal():
                        raise _Slow
                    ts = int(toks[2]) / 1000
                if sname not in allowed and not _METRIC_NAME.fullmatch(sname):
                    raise _Slow
            except (_Slow, ValueError):
                sname, labels, value, ts = _text_sample_slow(line)
                group_key, le = _dedup_key(labels)
                brace = -1  # not a candidate for a bucket run

            first = seen.setdefault((sname, group_key, le, ts), lineno)
            if first != lineno:
                raise _Bad(_duplicate(sname, labels, first))
            sample = _new_tuple(Sample, (sname, labels, value, ts, None, None))
            if sname in allowed:
                samples.append(sample)
                if groups is None:
                    continue
                group = groups.get((group_key, ts))
                if group is None:
                    group = groups[(group_key, ts)] = _HistGroup(lineno, labels)
                if sname == bucket_name:
                    if le is None:
                        raise _Bad(f"histogram bucket {_q(sname)} without an 'le' label")
                    _hist_bucket(name, group, le, value, lineno, les)
                    if brace > 0 and ts is None:
                        run_plen = _bucket_run_start(line, brace, close, le)
                        if run_plen:
                            run_prefix = line[:run_plen]
                            run_mid = line[run_plen + len(le):close + 2]
                            run_mlen = len(run_mid)
                            run_labels, run_key, run_group = labels, group_key, group
                elif sname == count_name:
                    group.count, group.count_line = value, lineno
                continue
            if sname in typed or sname in helped:
                raise _Bad(f"sample {_q(sname)} is separated from its family's HELP/TYPE lines")
            if name:
                _emit_text(out, sampled, name, doc, typ, samples, groups)
            name, doc, typ, samples, groups = "", "", "untyped", [], None
            allowed = frozenset()
            lone = Metric(sname, "", "untyped")
            lone.samples = [sample]
            out.append(lone)
            sampled.add(sname)
        if name:
            _emit_text(out, sampled, name, doc, typ, samples, groups)
    except _Bad as bad:
        bad.line = bad.line or lineno
        raise
    return out


def _bucket_run_start(line: str, brace: int, close: int, le: str) -> int:
    """Offset of the le value in a fast-path bucket line (0 if the run path cannot use it).

    ``le`` parses as a float, so ``,le="<le>"`` cannot be the tail of another label's value:
    there the text after the quote would be ``,name=`` or ``}``, which is not a float.
    """
    if line[close + 1:close + 2] != " ":
        return 0
    piece = 'le="' + le + '"'
    if line.startswith(piece, brace + 1):
        return brace + 5
    at = line.find("," + piece, brace, close)
    return at + 5 if at >= 0 else 0


def _emit_text(out: list[Metric], sampled: set[str], name: str, doc: str, typ: str,
               samples: list[Sample], groups: dict | None) -> None:
    """Close a text-format family: finish histogram checks, munge a counter, append it."""
    if samples:
        sampled.add(name)
    if groups:
        _finish_histogram(name, groups, openmetrics=False)
    if typ == "counter":
        # The library's OpenMetrics-style munging: the family loses `_total`, samples keep it.
        if name.endswith("_total"):
            name = name[:-6]
        else:
            samples = [_new_tuple(Sample, (s[0] + "_total", *s[1:])) for s in samples]
            metric = Metric(name, doc, typ)
            metric.samples = samples
            # Remember that `_total` is not on the wire: Prometheus stores the name as exposed
            # (dcgm-exporter's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION has no `_total`).
            setattr(metric, _ADDED_TOTAL, True)
            out.append(metric)
            return
    metric = Metric(name, doc, typ)
    metric.samples = samples
    out.append(metric)


#: Attribute set on a counter family whose samples got a `_total` the exposition did not have.
_ADDED_TOTAL = "_vigil_added_total"


def wire_name(family: Metric, sample_name: str) -> str:
    """The sample's name as it was exposed, which is the name Prometheus stores.

    prometheus_client's text parser (and so ours, which must equal it) appends ``_total`` to the
    samples of a counter whose TYPE line lacks it; this undoes that for storage.
    """
    if getattr(family, _ADDED_TOTAL, False) and sample_name.endswith("_total"):
        return sample_name[:-6]
    return sample_name


def _text_metadata(line: str, names_ok: set[str]) -> tuple[str, str, str] | None:
    """``(keyword, name, argument)`` of a HELP/TYPE line; None for any other comment."""
    head = line[:7]
    if head == "# HELP " or head == "# TYPE ":
        cand, _, arg = line[7:].partition(" ")
        if cand in names_ok or _METRIC_NAME.fullmatch(cand):
            names_ok.add(cand)
            return _checked_text_metadata(head[2:6], cand, arg.lstrip(_WHITESPACE))
    # Odd spacing or an ordinary comment: tokenise exactly like the library.
    parts = _split_comment(line)
    if len(parts) < 2 or parts[1] not in ("HELP", "TYPE"):
        return None
    keyword = parts[1]
    if len(parts) == 2:
        raise _Bad(f"truncated line: {keyword} without a metric name")
    cand = parts[2]
    if cand.startswith('"'):
        raise _Bad(f"quoted (UTF-8) metric names are not supported: {_q(cand)}")
    if not _METRIC_NAME.fullmatch(cand):
        raise _Bad(f"invalid metric name {_q(cand)}")
    return _checked_text_metadata(keyword, cand, parts[3] if len(parts) == 4 else "")


def _checked_text_metadata(keyword: str, cand: str, arg: str) -> tuple[str, str, str]:
    if keyword == "HELP":
        if "\\" in arg:
            arg = _TEXT_HELP_ESCAPE.sub(_unescape, arg)
        return keyword, cand, arg
    if not arg:
        raise _Bad(f"truncated line: TYPE for {_q(cand)} without a type")
    if arg not in _TEXT_SUFFIXES:
        known = ", ".join(sorted(_TEXT_SUFFIXES))
        raise _Bad(f"unknown metric type {_q(arg)} for {_q(cand)} (text format allows {known})")
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


def _text_sample_slow(line: str) -> tuple[str, dict[str, str], int | float, float | None]:
    """Parse a text-format sample line the fast path declined; ``_Bad`` says what is wrong."""
    name, pos = _sample_name(line)
    end = len(line)
    after = _skip_space(line, pos)
    if after < end and line[after] == "{":
        labels, pos = _label_set(line, after + 1, text_format=True)
    elif after == pos and pos < end:
        raise _Bad(f"invalid metric name {_q(_WORD.match(line).group())}")  # type: ignore
    else:
        labels = {}
    toks = _BLANKS.split(line[pos:].strip(" \t"))
    if not toks[0]:
        raise _Bad(f"truncated line: sample {_q(name)} has no value")
    value = _number(toks[0])
    if value is None:
        if not labels and "{" in line:  # e.g. `my metric{...}`: the name is what is wrong
            bad_name = line[:line.index("{")].strip()
            raise _Bad(f"invalid metric name {_q(bad_name)}")
        raise _Bad(f"invalid sample value {_q(toks[0])}")
    if len(toks) > 2:
        raise _Bad(f"unexpected text after the value and timestamp: {_q(' '.join(toks[2:]))}")
    ts = None
    if len(toks) == 2:
        ts = _text_timestamp(toks[1])
    return name, labels, value, ts


def _text_timestamp(tok: str) -> float:
    """Seconds from a text-format timestamp token (integer milliseconds), as the library does."""
    digits = tok[1:] if tok[:1] in ("+", "-") else tok
    if digits.isdecimal():
        try:
            return int(tok) / 1000
        except ValueError:
            pass  # more digits than int() accepts
    raise _Bad(f"invalid timestamp {_q(tok)} (expected integer milliseconds)")


# --- shared sample pieces -----------------------------------------------------------------


def _number(tok: str) -> int | float | None:
    """The library's value of a number token (``int`` when it reads as one), or None if bad."""
    if tok.isdecimal():
        try:
            return int(tok)
        except ValueError:
            return float(tok)  # more digits than int() accepts; the library falls back too
    if "_" in tok or " " in tok or not tok.isprintable():
        return None  # float() would accept '1_0' and surrounding blanks; the library does not
    try:
        value = float(tok)
    except ValueError:
        return None
    if tok[0] in "+-" and tok[1:].isdecimal():
        try:
            return int(tok)
        except ValueError:
            return value
    return value


def sample_value(tok: str) -> int | float | None:
    """A text-format sample value exactly as ``parse_text`` reads it, or None if invalid."""
    return _number(tok) if tok else None


def _sample_name(line: str) -> tuple[str, int]:
    """The metric name at the start of a sample line and where it ends."""
    match = _METRIC_NAME.match(line)
    if not match:
        token = _WORD.match(line).group()  # type: ignore[union-attr]  # * always matches
        if not token:
            raise _Bad(f"sample line must start with a metric name, not {_q(line[:1])}")
        raise _Bad(f"invalid metric name {_q(token)}")
    return match.group(), match.end()


def _name_token(line: str, pos: int) -> str:
    """The would-be name at ``pos`` (up to a blank, '=', ',', brace or quote), for messages."""
    return _NAME_TOKEN.match(line, pos).group()  # type: ignore[union-attr]  # * always matches


def _fast_labels(body: str, label_keys: dict[str, str]) -> dict[str, str]:
    """Labels of a ``k="v",...`` body without backslashes; raises ``_Slow`` if it is unusual.

    Split on quotes, ``,k1="v1",k2="v2"`` alternates key parts (``,k1=``) and values, and ends
    with an empty part. Values cannot hold a quote (it would need a backslash), so if every key
    part is a validated ``,name=`` the body is well-formed and the split is the parse.
    """
    if not body:
        return {}
    if "\\" in body:
        raise _Slow
    parts = ("," + body).split('"')
    if parts.pop() or len(parts) & 1:
        raise _Slow
    pairs = iter(parts)
    try:
        labels = dict(zip(map(label_keys.__getitem__, pairs), pairs))  # noqa: B905 - pairwise
    except KeyError:
        if not _learn_label_keys(parts[0::2], label_keys):
            raise _Slow from None
        pairs = iter(parts)
        labels = dict(zip(map(label_keys.__getitem__, pairs), pairs))  # noqa: B905 - pairwise
    if len(labels) * 2 != len(parts):
        raise _Slow  # a label name given twice
    return labels


def _learn_label_keys(keys: list[str], label_keys: dict[str, str]) -> bool:
    """Validate ',name=' key parts into ``label_keys``; False if one is not a valid label name."""
    for key in keys:
        if key not in label_keys:
            name = key[1:-1]
            if key[:1] != "," or key[-1:] != "=" or not _valid_label_name(name):
                return False
            label_keys[key] = name
    return True


def _valid_label_name(name: str) -> bool:
    return bool(_LABEL_NAME.fullmatch(name)) and not name.startswith("__")


def _label_set(line: str, pos: int, *, text_format: bool) -> tuple[dict[str, str], int]:
    """Parse ``k="v",...}`` from just after the ``{``; returns the labels and the end offset.

    The text format allows blanks around tokens and a trailing comma (as the library does);
    OpenMetrics allows neither.
    """
    labels: dict[str, str] = {}
    end = len(line)
    skip = text_format
    if skip:
        pos = _skip_space(line, pos)
    if line.startswith("}", pos):
        return labels, pos + 1
    while True:
        token = _name_token(line, pos)
        if not token:
            if pos >= end:
                raise _Bad("truncated line: unterminated label set")
            raise _Bad(f"expected a label name at column {pos + 1}")
        if not _valid_label_name(token):
            if token.startswith("__") and _LABEL_NAME.fullmatch(token):
                raise _Bad(f"reserved label name {_q(token)}")
            raise _Bad(f"invalid label name {_q(token)}")
        pos += len(token)
        if skip:
            pos = _skip_space(line, pos)
        if pos >= end:
            raise _Bad("truncated line: unterminated label set")
        if line[pos] != "=":
            raise _Bad(f"expected '=' after label name {_q(token)}")
        pos += 1
        if skip:
            pos = _skip_space(line, pos)
        if pos >= end:
            raise _Bad("truncated line: unterminated label set")
        if line[pos] != '"':
            raise _Bad(f"value of label {_q(token)} is not a quoted string")
        match = _QUOTED_REST.match(line, pos + 1)
        if not match:
            raise _Bad(f"truncated line: unterminated quoted value of label {_q(token)}")
        value = line[pos + 1:match.end() - 1]
        if "\\" in value:
            value = _LABEL_ESCAPE.sub(_unescape, value)
        if token in labels:
            raise _Bad(f"duplicate label name {_q(token)}")
        labels[token] = value
        pos = match.end()
        if skip:
            pos = _skip_space(line, pos)
        if pos >= end:
            raise _Bad("truncated line: unterminated label set")
        if line[pos] == "}":
            return labels, pos + 1
        if line[pos] != ",":
            if line.find("}", pos) < 0:
                raise _Bad("truncated line: unterminated label set")
            raise _Bad(f"expected ',' or '}}' after the value of label {_q(token)}")
        pos += 1
        if skip:
            pos = _skip_space(line, pos)
            if line.startswith("}", pos):
                return labels, pos + 1


def _skip_space(line: str, pos: int) -> int:
    """The offset of the first non-whitespace character at or after ``pos``."""
    return _ANY_SPACE.match(line, pos).end()  # type: ignore[union-attr]  # \s* always matches


def _series(name: str, labels: dict[str, str]) -> str:
    """``name{k="v",...}`` as it would appear in an exposition, for messages (clipped)."""
    if not labels:
        return _clip(name)
    inner = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in labels.items())
    return _clip(f"{name}{{{inner}}}", 200)


def _q(text: str) -> str:
    """``text`` quoted for a message, clipped so a 10 MB token cannot become a 10 MB message."""
    shown = repr(text[:80])
    return shown if len(text) <= 80 and len(shown) <= 120 else shown[:120] + "..."


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _frozen(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items()) if labels else _NO_LABELS


def _dedup_key(labels: dict[str, str]) -> tuple[frozenset[tuple[str, str]], str | None]:
    """The label set as ``(labels without le, le)``: hashable, order-free, and what the
    bucket-run path can produce without hashing a whole label set per line."""
    if not labels:
        return _NO_LABELS, None
    label_set = _frozen(labels)
    le = labels.get("le")
    return (label_set, None) if le is None else (label_set - {("le", le)}, le)


def _duplicate(name: str, labels: dict[str, str], first: int) -> str:
    return f"duplicate series {_series(name, labels)} (first on line {first})"


# --- histogram validation (both formats) --------------------------------------------------


@dataclass(slots=True)
class _HistGroup:
    """One histogram label set (and timestamp, in OpenMetrics), validated as its lines stream."""

    line: int  # last bucket line; the group's first line until a bucket shows up
    labels: dict[str, str]  # a sample's labels, for messages (le is left out)
    le: float = math.nan  # NaN compares false, so any first bucket passes (even le="-Inf")
    value: float = -_INF
    inf: float | None = None
    count: float | None = None
    count_line: int = 0
    has_sum: bool = False
    has_gsum: bool = False
    negative_bucket: bool = False
    negative_gsum: bool = False


def _hist_bucket(family: str, group: _HistGroup, le_text: str, value: float, line: int,
                 les: dict[str, float]) -> None:
    """Check one bucket against the previous one of its label set: le grows, counts add up."""
    le = les.get(le_text)
    if le is None:
        le = les[le_text] = _le_value(le_text, line)
    if le <= group.le:
        raise _Bad(f"histogram {_group_name(family, group)}: le={_q(le_text)} does not increase")
    if value < group.value:
        raise _Bad(f"histogram {_group_name(family, group)}: bucket counts are not cumulative "
                   f"(le={_q(le_text)} has {value}, less than the bucket before)")
    group.le = le
    group.value = value
    group.line = line
    if le == _INF:
        group.inf = value
    elif le < 0:
        group.negative_bucket = True


def _finish_histogram(family: str, groups: dict, *, openmetrics: bool) -> None:
    """Raise ``_Bad`` unless every label set ended with ``+Inf`` and ``_count`` matches it.

    For OpenMetrics also the library's ``_sum``/``_count`` pairing and negative-bucket rules.
    """
    for group in groups.values():
        where = _group_name(family, group)
        if group.inf is None:
            raise _Bad(f"histogram {where} has no le=\"+Inf\" bucket", group.line)
        if group.count is not None and group.count != group.inf:
            raise _Bad(f"histogram {where}: _count {group.count} differs from the +Inf bucket "
                       f"{group.inf}", group.count_line)
        if not openmetrics:
            continue
        if group.has_sum and group.count is None:
            raise _Bad(f"histogram {where}: _sum without _count", group.line)
        if group.has_gsum and group.count is None:
            raise _Bad(f"histogram {where}: _gsum without _gcount", group.line)
        if not (group.has_sum or group.has_gsum) and group.count is not None:
            raise _Bad(f"histogram {where}: _count without _sum", group.count_line)
        if group.negative_bucket and group.has_sum:
            raise _Bad(f"histogram {where}: _sum not allowed with negative buckets", group.line)
        if not group.negative_bucket and group.negative_gsum:
            raise _Bad(f"histogram {where}: negative _gsum with non-negative buckets",
                       group.line)


def _group_name(family: str, group: _HistGroup) -> str:
    return _series(family, {k: v for k, v in group.labels.items() if k != "le"})


def _le_value(le_text: str, line: int) -> float:
    try:
        le = float(le_text)
    except ValueError:
        le = math.nan
    if math.isnan(le) or "_" in le_text or " " in le_text:
        raise _Bad(f"invalid le label {_q(le_text)}", line)
    return le


# --- OpenMetrics 1.0 ----------------------------------------------------------------------


@dataclass(slots=True)
class _OMFamily:
    """The family being read, with the library's per-family grouping state."""

    name: str
    line: int
    doc: str | None = None
    typ: str | None = None
    unit: str | None = None
    samples: list[Sample] = field(default_factory=list)
    # sample name (either spelling) -> (name as reported, suffix after the family name)
    allowed: dict[str, tuple[str, str]] = field(default_factory=dict)
    group: frozenset | None = None
    group_ts: Timestamp | float | None = None
    seen_groups: set[frozenset] = field(default_factory=set)
    groups: dict | None = None  # (label set without le, timestamp) -> _HistGroup, histograms


def _parse_openmetrics_lines(lines: list[str]) -> list[Metric]:
    """The families of an OpenMetrics exposition; mirrors the library's parser and checks.

    Same structure as ``_parse_text_lines``, including the bucket-run path.
    """
    out: list[Metric] = []
    fam: _OMFamily | None = None
    seen_names: set[str] = set()  # every name a family claimed, for the library's clash check
    seen: dict[tuple, int] = {}
    label_keys: dict[str, str] = {}
    bodies: dict[str, tuple] = {}  # label-set text -> (labels, label set, dedup key, le)
    values: dict[str, int | float] = {}
    les: dict[str, float] = {}
    run_plen = run_mlen = 0  # the bucket run; see _parse_text_lines
    run_prefix = run_mid = run_name = ""
    run_labels: dict[str, str] = {}
    run_key: frozenset[tuple[str, str]] = _NO_LABELS
    run_group: _HistGroup | None = None
    eof = False
    lineno = 0
    try:
        for lineno, line in enumerate(lines, 1):
            if run_plen and line.startswith(run_prefix):
                quote = line.find('"', run_plen)
                if quote > 0 and line.startswith(run_mid, quote):
                    le = line[run_plen:quote]
                    token = line[quote + run_mlen:]
                    value = values.get(token)
                    if value is None:
                        value = _number(token)
                        if value is not None:
                            values[token] = value
                    if value is not None and "\\" not in le:
                        labels = run_labels.copy()
                        labels["le"] = le
                        first = seen.setdefault((run_name, run_key, le, None), lineno)
                        if first != lineno:
                            raise _Bad(_duplicate(run_name, labels, first))
                        _om_check_bucket(le, value, les, lineno)
                        fam.samples.append(  # type: ignore[union-attr]
                            _new_tuple(Sample, (run_name, labels, value, None, None, None))
                        )
                        _hist_bucket(fam.name, run_group, le, value, lineno, les)  # type: ignore
                        continue
            run_plen = 0
            if eof:
                raise _Bad("text after '# EOF'")
            if not line:
                raise _Bad("blank line (not allowed in OpenMetrics)")
            if line[0] == "#":
                if line == "# EOF":
                    eof = True
                    continue
                keyword, cand, arg = _om_metadata(line)
                if fam is not None and cand == fam.name:
                    if fam.samples:
                        raise _Bad(f"{keyword} line for {_q(cand)} comes after its samples")
                else:
                    if fam is not None:
                        _emit_om(out, seen_names, fam)
                    fam = _OMFamily(cand, lineno, allowed={cand: (cand, "")})
                _om_apply_metadata(fam, keyword, arg)
                continue

            # A sample. Fast path: no timestamp, no exemplar, no escapes.
            try:
                brace = line.find("{")
                if brace < 0:
                    space = line.find(" ")
                    if space < 0:
                        raise _Slow
                    sname = line[:space]
                    rest = line[space:]
                    labels, label_set, key, le = {}, _NO_LABELS, _NO_LABELS, None
                else:
                    close = line.find("}", brace)
                    if close < 0:
                        raise _Slow
                    sname = line[:brace]
                    rest = line[close + 1:]
                    body = line[brace + 1:close]
                    known = bodies.get(body)
                    if known is None:
                        labels = _fast_labels(body, label_keys)
                        known = bodies[body] = (labels, _frozen(labels), *_dedup_key(labels))
                    else:
                        labels = known[0].copy()
                    label_set, key, le = known[1], known[2], known[3]
                toks = rest.split(" ")
                if toks[0] or len(toks) != 2:
                    raise _Slow
                value = values.get(toks[1])
                if value is None:
                    value = _number(toks[1])
                    if value is None:
                        raise _Slow
                    values[toks[1]] = value
                ts = exemplar = None
                if (fam is None or sname not in fam.allowed) and not _METRIC_NAME.fullmatch(sname):
                    raise _Slow
            except _Slow:
                sname, labels, value, ts, exemplar = _om_sample_slow(line)
                label_set = _frozen(labels)
                key, le = _dedup_key(labels)
                brace = -1  # not a candidate for a bucket run

            entry = fam.allowed.get(sname) if fam is not None else None
            if entry is None or fam is None:
                # Like the library: a sample the family does not allow starts an unknown family.
                if fam is not None:
                    _emit_om(out, seen_names, fam)
                fam = _OMFamily(sname, lineno, typ="unknown", allowed={sname: (sname, "")})
                entry = (sname, "")
            sname, suffix = entry
            _om_check_sample(fam, sname, suffix, labels, value, exemplar, les)
            group = _om_group(fam, suffix, labels, label_set)
            _om_check_group(fam, group, ts)
            ts_key = None if ts is None else (ts.sec, ts.nsec) if isinstance(ts, Timestamp) \
                else ts
            first = seen.setdefault((sname, key, le, ts_key), lineno)
            if first != lineno:
                raise _Bad(_duplicate(sname, labels, first))
            fam.samples.append(_new_tuple(Sample, (sname, labels, value, ts, exemplar, None)))
            if fam.groups is None:
                continue
            hist = fam.groups.get((group, ts_key))
            if hist is None:
                hist = fam.groups[(group, ts_key)] = _HistGroup(lineno, labels)
            if suffix == "_bucket":
                _hist_bucket(fam.name, hist, labels["le"], value, lineno, les)
                if brace > 0 and ts is None and exemplar is None:
                    run_plen = _bucket_run_start(line, brace, close, labels["le"])
                    if run_plen:
                        run_prefix = line[:run_plen]
                        run_mid = line[run_plen + len(labels["le"]):close + 2]
                        run_mlen = len(run_mid)
                        run_name, run_labels, run_key, run_group = sname, labels, key, hist
            elif suffix in ("_count", "_gcount"):
                hist.count, hist.count_line = value, lineno
            elif suffix == "_sum":
                hist.has_sum = True
            elif suffix == "_gsum":
                hist.has_gsum = True
                hist.negative_gsum = hist.negative_gsum or value < 0
        if fam is not None:
            _emit_om(out, seen_names, fam)
        if not eof:
            raise _Bad("truncated exposition: missing '# EOF' at the end")
    except _Bad as bad:
        bad.line = bad.line or lineno
        raise
    return out


def _om_metadata(line: str) -> tuple[str, str, str]:
    """``(keyword, name, argument)`` of a ``# HELP|TYPE|UNIT name arg`` line."""
    keyword = line[2:6]
    if not line.startswith("# ") or keyword not in ("HELP", "TYPE", "UNIT") or line[6:7] != " ":
        raise _Bad("invalid comment: OpenMetrics allows only # HELP, # TYPE, # UNIT and # EOF")
    cand, space, arg = line[7:].partition(" ")
    if cand.startswith('"'):
        raise _Bad(f"quoted (UTF-8) metric names are not supported: {_q(cand)}")
    if not _METRIC_NAME.fullmatch(cand):
        raise _Bad(f"invalid metric name {_q(cand)}")
    if not space:
        raise _Bad(f"truncated line: {keyword} for {_q(cand)} without a value")
    arg = arg.lstrip(" ")
    if keyword == "HELP":
        if "\\" in arg:
            arg = _OM_HELP_ESCAPE.sub(_unescape, arg)
    elif keyword == "TYPE" and arg not in _OM_TYPES:
        known = ", ".join(sorted(_OM_TYPES))
        raise _Bad(f"unknown metric type {_q(arg)} for {_q(cand)} (OpenMetrics allows {known})")
    return keyword, cand, arg


def _om_apply_metadata(fam: _OMFamily, keyword: str, arg: str) -> None:
    if keyword == "HELP":
        if fam.doc is not None:
            raise _Bad(f"duplicate HELP line for {_q(fam.name)}")
        fam.doc = arg
    elif keyword == "TYPE":
        if fam.typ is not None:
            raise _Bad(f"duplicate TYPE line for {_q(fam.name)}")
        fam.typ = arg
        fam.allowed = _om_allowed(fam.name, arg)
        fam.groups = {} if arg in _HISTOGRAM_TYPES else None
    else:
        if fam.unit is not None:
            raise _Bad(f"duplicate UNIT line for {_q(fam.name)}")
        fam.unit = arg


def _om_allowed(name: str, typ: str) -> dict[str, tuple[str, str]]:
    """Sample names a family of ``typ`` allows, each mapped to ``(reported name, suffix)``.

    A name with ':' is also allowed in its client_python#1177 spelling (':' escaped to '_').
    """
    allowed: dict[str, tuple[str, str]] = {}
    for suffix in _OM_SUFFIXES.get(typ, ("",)):
        allowed[name + suffix] = (name + suffix, suffix)
    if ":" in name:
        for suffix in _OM_SUFFIXES.get(typ, ("",)):
            allowed.setdefault((name + suffix).replace(":", "_"), (name + suffix, suffix))
    return allowed


def _om_sample_slow(
    line: str,
) -> tuple[str, dict[str, str], int | float, Timestamp | float | None, Exemplar | None]:
    """Parse an OpenMetrics sample line the fast path declined (timestamps, exemplars, ...)."""
    name, pos = _sample_name(line)
    end = len(line)
    if pos < end and line[pos] == "{":
        labels, pos = _label_set(line, pos + 1, text_format=False)
    else:
        labels = {}
    if pos >= end:
        raise _Bad(f"truncated line: sample {_q(name)} has no value")
    if line[pos] != " ":
        raise _Bad(f"expected a space after {_q(line[:pos])}")
    main, hashed, exemplar_text = line[pos:].partition(" # ")
    value, ts = _om_value_and_timestamp(main)
    exemplar = _om_exemplar(exemplar_text) if hashed else None
    return name, labels, value, ts, exemplar


def _om_value_and_timestamp(text: str) -> tuple[int | float, Timestamp | float | None]:
    """`` value [timestamp]`` (each preceded by exactly one space)."""
    toks = text.split(" ")
    if len(toks) < 2 or toks[0] or not toks[1]:
        raise _Bad("expected exactly one space before the value")
    if len(toks) > 3 or (len(toks) == 3 and not toks[2]):
        raise _Bad(f"unexpected text after the value: {_q(text)}")
    value = _number(toks[1])
    if value is None:
        raise _Bad(f"invalid sample value {_q(toks[1])}")
    return value, (_om_timestamp(toks[2]) if len(toks) == 3 else None)


def _om_exemplar(text: str) -> Exemplar:
    """An exemplar ``{labels} value [timestamp]`` (the part after `` # ``)."""
    if not text.startswith("{"):
        raise _Bad("exemplar must start with a label set")
    labels, pos = _label_set(text, 1, text_format=False)
    value, ts = _om_value_and_timestamp(text[pos:])
    if sum(len(k) + len(v) for k, v in labels.items()) > EXEMPLAR_MAX_RUNES:
        raise _Bad(f"exemplar labels longer than {EXEMPLAR_MAX_RUNES} characters")
    return Exemplar(labels, value, ts)


def _om_timestamp(tok: str) -> Timestamp | float:
    """The library's ``_parse_timestamp``: a ``Timestamp`` for ``s`` and ``s.frac``, else float."""
    if tok != tok.strip() or "_" in tok:
        raise _Bad(f"invalid timestamp {_q(tok)}")
    try:
        return Timestamp(int(tok), 0)
    except ValueError:
        pass
    try:
        secs, frac = tok.split(".", 1)
        return Timestamp(int(secs), int(frac[:9].ljust(9, "0")))
    except ValueError:
        pass
    try:
        ts = float(tok)
    except ValueError:
        ts = math.nan
    if math.isnan(ts) or math.isinf(ts):
        raise _Bad(f"invalid timestamp {_q(tok)}")
    return ts


def _om_check_sample(fam: _OMFamily, sname: str, suffix: str, labels: dict[str, str],
                     value: int | float, exemplar: Exemplar | None,
                     les: dict[str, float]) -> None:
    """The library's per-sample OpenMetrics rules (it raises on all of these)."""
    typ = fam.typ
    if typ in _HISTOGRAM_TYPES:
        if suffix == "_bucket":
            le = labels.get("le")
            if le is None:
                raise _Bad(f"histogram bucket {_q(sname)} without an 'le' label")
            _om_check_bucket(le, value, les, 0)
        elif suffix in ("_count", "_gcount") and not _is_integral(value):
            raise _Bad(f"count value {value} is not an integer")
    elif typ == "summary":
        if suffix == "_count" and not _is_integral(value):
            raise _Bad(f"count value {value} is not an integer")
        if suffix == "":
            _om_check_quantile(labels.get("quantile"), value)
    elif typ == "stateset":
        if fam.name not in labels:
            raise _Bad(f"stateset sample without its {_q(fam.name)} label")
        if value not in (0, 1):
            raise _Bad("stateset values must be 0 or 1")
    elif typ == "info" and value != 1:
        raise _Bad("info values must be 1")
    if suffix in _COUNTER_LIKE:
        if math.isnan(value):
            raise _Bad(f"{suffix} samples cannot be NaN")
        if value < 0 and suffix != "_gsum":
            raise _Bad(f"{suffix} samples cannot be negative")
    if exemplar is not None and not (
        (typ in _HISTOGRAM_TYPES and suffix == "_bucket")
        or (typ == "counter" and suffix == "_total")
    ):
        raise _Bad("only histogram buckets and counter totals can have exemplars")


def _om_check_bucket(le_text: str, value: int | float, les: dict[str, float], line: int) -> None:
    """OpenMetrics bucket rules: a float le spelled ``+Inf`` at the top, integer counts >= 0."""
    le = les.get(le_text)
    if le is None:
        le = les[le_text] = _le_value(le_text, line)
    if le == _INF and le_text != "+Inf":
        raise _Bad(f"non-canonical le {_q(le_text)} (OpenMetrics spells it +Inf)")
    if not _is_integral(value):
        raise _Bad(f"bucket value {value} is not an integer")
    if value < 0:
        raise _Bad("_bucket samples cannot be negative")


def _om_check_quantile(quantile: str | None, value: int | float) -> None:
    if quantile is None:
        raise _Bad("summary sample without a 'quantile' label")
    try:
        q = float(quantile)
    except ValueError:
        q = -1.0
    if not 0 <= q <= 1 or "_" in quantile:
        raise _Bad(f"invalid quantile label {_q(quantile)}")
    if value < 0:
        raise _Bad("quantile values cannot be negative")


def _is_integral(value: int | float) -> bool:
    return isinstance(value, int) or value.is_integer()


def _om_group(fam: _OMFamily, suffix: str, labels: dict[str, str],
              label_set: frozenset[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    """The library's ``_group_for_sample``, as a frozenset."""
    typ = fam.typ
    if typ == "info":
        return _NO_LABELS
    if typ == "summary" and suffix == "":
        return label_set - {("quantile", labels["quantile"])}
    if typ == "stateset":
        return label_set - {(fam.name, labels[fam.name])}
    if suffix == "_bucket" and typ in _HISTOGRAM_TYPES:
        return label_set - {("le", labels["le"])}
    return label_set


def _om_check_group(fam: _OMFamily, group: frozenset, ts: Timestamp | float | None) -> None:
    """The library's grouping rules: a label set's samples are contiguous, timestamps sane."""
    if fam.group is not None:
        if group != fam.group:
            if group in fam.seen_groups:
                raise _Bad("samples of one label set are not grouped together")
        else:
            if (ts is None) != (fam.group_ts is None):
                raise _Bad("some samples of a label set have timestamps and some not")
            if fam.group_ts is not None and fam.typ != "info" and _ts_after(fam.group_ts, ts):
                raise _Bad("timestamps went backwards within a label set")
    fam.group = group
    fam.group_ts = ts
    fam.seen_groups.add(group)


def _ts_after(a: Timestamp | float, b: Timestamp | float | None) -> bool:
    if isinstance(a, Timestamp) and isinstance(b, Timestamp):
        return a > b
    return float(a) > float(b)  # type: ignore[arg-type]


def _emit_om(out: list[Metric], seen_names: set[str], fam: _OMFamily) -> None:
    """Close an OpenMetrics family with the library's family-level checks."""
    typ = fam.typ or "unknown"
    name = fam.name
    for suffix in set((*_OM_SUFFIXES.get(typ, ()), "")):
        if name + suffix in seen_names:
            raise _Bad(f"clashing name: {_q(name + suffix)} belongs to an earlier family", fam.line)
        seen_names.add(name + suffix)
    unit = fam.unit or ""
    if unit and not name.endswith("_" + unit):
        raise _Bad(f"unit {_q(unit)} does not match metric name {_q(name)}", fam.line)
    if unit and typ in ("info", "stateset"):
        raise _Bad(f"units are not allowed for {typ} {_q(name)}", fam.line)
    if fam.groups:
        _finish_histogram(name, fam.groups, openmetrics=True)
    metric = Metric(name, fam.doc or "", typ, unit)
    metric.samples = fam.samples
    out.append(metric)
