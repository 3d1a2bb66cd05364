"""OpenMetrics 1.0, parsed like ``prometheus_client.openmetrics.parser`` but strictly.

Besides the library's own checks, the parser accepts the client_python#1177 quirk (HELP/TYPE
say ``vllm:x`` while samples say ``vllm_x``) and reports such samples under the family's
``vllm:`` spelling; the library instead raises on the vLLM fixture (or, on smaller inputs,
splits them into empty typed families plus ``unknown`` ones).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar, Sample, Timestamp

from collector.exposition.body import DEFAULT_SOURCE, parse_body
from collector.exposition.families import SAMPLE_TAIL, new_tuple
from collector.exposition.fastpath import FastPath, skip_lines
from collector.exposition.histograms import INF, HistGroup, finish_histogram, hist_bucket, le_value
from collector.exposition.labels import NO_LABELS, label_entry, parse_label_set
from collector.exposition.problems import Bad, Slow, duplicate, q
from collector.exposition.tokens import (
    LABEL_ESCAPE,
    METRIC_NAME,
    check_metric_name,
    number,
    sample_name,
    unescape,
)

__all__ = ["EXEMPLAR_MAX_RUNES", "parse_openmetrics"]

#: OpenMetrics caps the label names plus values of one exemplar at this many characters.
EXEMPLAR_MAX_RUNES = 128

# Family type -> allowed sample-name suffixes, as the library's parser uses them.
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "histogram": ("_count", "_sum", "_bucket", "_created"),
    "gaugehistogram": ("_gcount", "_gsum", "_bucket"),
    "info": ("_info",),
}
_TYPES = frozenset(
    ("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset")
)
_HISTOGRAM_TYPES = frozenset(("histogram", "gaugehistogram"))
_COUNTER_LIKE = frozenset(("_total", "_sum", "_count", "_bucket", "_gcount", "_gsum"))
_HELP_ESCAPE: re.Pattern[str] = LABEL_ESCAPE  # HELP text escapes what a label value escapes


def parse_openmetrics(text: str, *, source: str = DEFAULT_SOURCE) -> list[Metric]:
    """Parse OpenMetrics 1.0 like ``prometheus_client.openmetrics.parser``, but strictly.

    Timestamps are ``Timestamp`` objects (or float seconds), as in the library. Also accepts the
    client_python#1177 escaping quirk: a family declared as ``a:b`` whose samples are spelled
    ``a_b...`` keeps its samples, under the ``a:b`` spelling.
    """
    return parse_body(text, source, _parse_lines, final_newline_ends=True)


@dataclass(slots=True)
class _Family:
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
    groups: dict | None = None  # (label set without le, timestamp) -> HistGroup, histograms


def _parse_lines(lines: list[str]) -> list[Metric]:
    """The families of an OpenMetrics exposition; mirrors the library's parser and checks.

    Same structure and fast paths as the text format's parser.
    """
    out: list[Metric] = []
    fam: _Family | None = None
    seen_names: set[str] = set()  # every name a family claimed, for the library's clash check
    fast = FastPath(openmetrics=True, bucket_check=_check_bucket)
    seen, les = fast.seen, fast.les
    eof = False
    lineno = 0
    numbered = enumerate(lines, 1)
    try:
        for lineno, line in numbered:
            if eof:
                raise Bad("text after '# EOF'")
            if not line:
                raise Bad("blank line (not allowed in OpenMetrics)")
            if line[0] == "#":
                if line == "# EOF":
                    eof = True
                    continue
                keyword, cand, arg = _metadata(line)
                if fam is not None and cand == fam.name:
                    if fam.samples:
                        raise Bad(f"{keyword} line for {q(cand)} comes after its samples")
                else:
                    if fam is not None:
                        _emit(out, seen_names, fam)
                    fam = _Family(cand, lineno, allowed={cand: (cand, "")})
                _apply_metadata(fam, keyword, arg)
                continue

            # A sample. Fast path: no timestamp, no exemplar, no escapes.
            try:
                sname, labels, label_info, value, _ = fast.sample(line)
                fast_line = True
                ts = exemplar = None
                if (fam is None or sname not in fam.allowed) and not METRIC_NAME.fullmatch(sname):
                    raise Slow
            except Slow:
                sname, labels, value, ts, exemplar = _sample_slow(line)
                label_info = label_entry(labels)
                fast_line = False  # not a candidate for a bucket run
            label_set, key, le = label_info

            entry = fam.allowed.get(sname) if fam is not None else None
            if entry is None or fam is None:
                # Like the library: a sample the family does not allow starts an unknown family.
                if fam is not None:
                    _emit(out, seen_names, fam)
                fam = _Family(sname, lineno, typ="unknown", allowed={sname: (sname, "")})
                entry = (sname, "")
            sname, suffix = entry
            _check_sample(fam, sname, suffix, labels, value, exemplar, les)
            group = _group(fam, suffix, labels, label_set)
            _check_group(fam, group, ts)
            ts_key = None if ts is None else (ts.sec, ts.nsec) if isinstance(ts, Timestamp) \
                else ts
            first = seen.setdefault((sname, key, le, ts_key), lineno)
            if first != lineno:
                raise Bad(duplicate(sname, labels, first))
            fam.samples.append(
                new_tuple(Sample, (sname, labels, value, ts, exemplar) + SAMPLE_TAIL))  # noqa: RUF005 (see SAMPLE_TAIL)
            if fam.groups is None:
                continue
            hist = fam.groups.get((group, ts_key))
            if hist is None:
                hist = fam.groups[(group, ts_key)] = HistGroup(lineno, labels)
            if suffix == "_bucket":
                hist_bucket(fam.name, hist, labels["le"], value, lineno, les)
                if fast_line and ts is None and exemplar is None:
                    taken = fast.bucket_run(lines, lineno, line, labels["le"], sname, fam.name,
                                            labels, key, hist, fam.samples)
                    if taken:
                        lineno, _ = skip_lines(numbered, taken)
            elif suffix in ("_count", "_gcount"):
                hist.count, hist.count_line = value, lineno
            elif suffix == "_sum":
                hist.has_sum = True
            elif suffix == "_gsum":
                hist.has_gsum = True
                hist.negative_gsum = hist.negative_gsum or value < 0
        if fam is not None:
            _emit(out, seen_names, fam)
        if not eof:
            raise Bad("truncated exposition: missing '# EOF' at the end")
    except Bad as bad:
        bad.line = bad.line or lineno
        raise
    return out


def _metadata(line: str) -> tuple[str, str, str]:
    """``(keyword, name, argument)`` of a ``# HELP|TYPE|UNIT name arg`` line."""
    keyword = line[2:6]
    if not line.startswith("# ") or keyword not in ("HELP", "TYPE", "UNIT") or line[6:7] != " ":
        raise Bad("invalid comment: OpenMetrics allows only # HELP, # TYPE, # UNIT and # EOF")
    cand, space, arg = line[7:].partition(" ")
    check_metric_name(cand)
    if not space:
        raise Bad(f"truncated line: {keyword} for {q(cand)} without a value")
    arg = arg.lstrip(" ")
    if keyword == "HELP":
        if "\\" in arg:
            arg = _HELP_ESCAPE.sub(unescape, arg)
    elif keyword == "TYPE" and arg not in _TYPES:
        known = ", ".join(sorted(_TYPES))
        raise Bad(f"unknown metric type {q(arg)} for {q(cand)} (OpenMetrics allows {known})")
    return keyword, cand, arg


def _apply_metadata(fam: _Family, keyword: str, arg: str) -> None:
    if keyword == "HELP":
        if fam.doc is not None:
            raise Bad(f"duplicate HELP line for {q(fam.name)}")
        fam.doc = arg
    elif keyword == "TYPE":
        if fam.typ is not None:
            raise Bad(f"duplicate TYPE line for {q(fam.name)}")
        fam.typ = arg
        fam.allowed = _allowed(fam.name, arg)
        fam.groups = {} if arg in _HISTOGRAM_TYPES else None
    else:
        if fam.unit is not None:
            raise Bad(f"duplicate UNIT line for {q(fam.name)}")
        fam.unit = arg


def _allowed(name: str, typ: str) -> dict[str, tuple[str, str]]:
    """Sample names a family of ``typ`` allows, each mapped to ``(reported name, suffix)``.

    A name with ':' is also allowed in its client_python#1177 spelling (':' escaped to '_').
    """
    allowed: dict[str, tuple[str, str]] = {}
    for suffix in _SUFFIXES.get(typ, ("",)):
        allowed[name + suffix] = (name + suffix, suffix)
    if ":" in name:
        for suffix in _SUFFIXES.get(typ, ("",)):
            allowed.setdefault((name + suffix).replace(":", "_"), (name + suffix, suffix))
    return allowed


def _sample_slow(
    line: str,
) -> tuple[str, dict[str, str], int | float, Timestamp | float | None, Exemplar | None]:
    """Parse an OpenMetrics sample line the fast path declined (timestamps, exemplars, ...)."""
    name, pos = sample_name(line)
    end = len(line)
    if pos < end and line[pos] == "{":
        labels, pos = parse_label_set(line, pos + 1, text_format=False)
    else:
        labels = {}
    if pos >= end:
        raise Bad(f"truncated line: sample {q(name)} has no value")
    if line[pos] != " ":
        raise Bad(f"expected a space after {q(line[:pos])}")
    main, hashed, exemplar_text = line[pos:].partition(" # ")
    value, ts = _value_and_timestamp(main)
    exemplar = _exemplar(exemplar_text) if hashed else None
    return name, labels, value, ts, exemplar


def _value_and_timestamp(text: str) -> tuple[int | float, Timestamp | float | None]:
    """`` value [timestamp]`` (each preceded by exactly one space)."""
    toks = text.split(" ")
    if len(toks) < 2 or toks[0] or not toks[1]:
        raise Bad("expected exactly one space before the value")
    if len(toks) > 3 or (len(toks) == 3 and not toks[2]):
        raise Bad(f"unexpected text after the value: {q(text)}")
    value = number(toks[1])
    if value is None:
        raise Bad(f"invalid sample value {q(toks[1])}")
    return value, (_timestamp(toks[2]) if len(toks) == 3 else None)


def _exemplar(text: str) -> Exemplar:
    """An exemplar ``{labels} value [timestamp]`` (the part after `` # ``)."""
    if not text.startswith("{"):
        raise Bad("exemplar must start with a label set")
    labels, pos = parse_label_set(text, 1, text_format=False)
    value, ts = _value_and_timestamp(text[pos:])
    if sum(len(k) + len(v) for k, v in labels.items()) > EXEMPLAR_MAX_RUNES:
        raise Bad(f"exemplar labels longer than {EXEMPLAR_MAX_RUNES} characters")
    return Exemplar(labels, value, ts)


def _timestamp(tok: str) -> Timestamp | float:
    """The library's ``_parse_timestamp``: a ``Timestamp`` for ``s`` and ``s.frac``, else float."""
    if tok != tok.strip() or "_" in tok:
        raise Bad(f"invalid timestamp {q(tok)}")
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
        raise Bad(f"invalid timestamp {q(tok)}")
    return ts


def _check_sample(fam: _Family, sname: str, suffix: str, labels: dict[str, str],
                  value: int | float, exemplar: Exemplar | None,
                  les: dict[str, float]) -> None:
    """The library's per-sample OpenMetrics rules (it raises on all of these)."""
    typ = fam.typ
    if typ in _HISTOGRAM_TYPES:
        if suffix == "_bucket":
            le = labels.get("le")
            if le is None:
                raise Bad(f"histogram bucket {q(sname)} without an 'le' label")
            _check_bucket(le, value, les, 0)
        elif suffix in ("_count", "_gcount") and not _is_integral(value):
            raise Bad(f"count value {value} is not an integer")
    elif typ == "summary":
        if suffix == "_count" and not _is_integral(value):
            raise Bad(f"count value {value} is not an integer")
        if suffix == "":
            _check_quantile(labels.get("quantile"), value)
    elif typ == "stateset":
        if fam.name not in labels:
            raise Bad(f"stateset sample without its {q(fam.name)} label")
        if value not in (0, 1):
            raise Bad("stateset values must be 0 or 1")
    elif typ == "info" and value != 1:
        raise Bad("info values must be 1")
    if suffix in _COUNTER_LIKE:
        if math.isnan(value):
            raise Bad(f"{suffix} samples cannot be NaN")
        if value < 0 and suffix != "_gsum":
            raise Bad(f"{suffix} samples cannot be negative")
    if exemplar is not None and not (
        (typ in _HISTOGRAM_TYPES and suffix == "_bucket")
        or (typ == "counter" and suffix == "_total")
    ):
        raise Bad("only histogram buckets and counter totals can have exemplars")


def _check_bucket(le_text: str, value: int | float, les: dict[str, float], line: int) -> None:
    """OpenMetrics bucket rules: a float le spelled ``+Inf`` at the top, integer counts >= 0."""
    le = les.get(le_text)
    if le is None:
        le = les[le_text] = le_value(le_text, line)
    if le == INF and le_text != "+Inf":
        raise Bad(f"non-canonical le {q(le_text)} (OpenMetrics spells it +Inf)")
    if not _is_integral(value):
        raise Bad(f"bucket value {value} is not an integer")
    if value < 0:
        raise Bad("_bucket samples cannot be negative")


def _check_quantile(quantile: str | None, value: int | float) -> None:
    if quantile is None:
        raise Bad("summary sample without a 'quantile' label")
    try:
        qv = float(quantile)
    except ValueError:
        qv = -1.0
    if not 0 <= qv <= 1 or "_" in quantile:
        raise Bad(f"invalid quantile label {q(quantile)}")
    if value < 0:
        raise Bad("quantile values cannot be negative")


def _is_integral(value: int | float) -> bool:
    return isinstance(value, int) or value.is_integer()


def _group(fam: _Family, suffix: str, labels: dict[str, str],
           label_set: frozenset[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    """The library's ``_group_for_sample``, as a frozenset."""
    typ = fam.typ
    if typ == "info":
        return NO_LABELS
    if typ == "summary" and suffix == "":
        return label_set - {("quantile", labels["quantile"])}
    if typ == "stateset":
        return label_set - {(fam.name, labels[fam.name])}
    if suffix == "_bucket" and typ in _HISTOGRAM_TYPES:
        return label_set - {("le", labels["le"])}
    return label_set


def _check_group(fam: _Family, group: frozenset, ts: Timestamp | float | None) -> None:
    """The library's grouping rules: a label set's samples are contiguous, timestamps sane."""
    if fam.group is not None:
        if group != fam.group:
            if group in fam.seen_groups:
                raise Bad("samples of one label set are not grouped together")
        else:
            if (ts is None) != (fam.group_ts is None):
                raise Bad("some samples of a label set have timestamps and some not")
            if fam.group_ts is not None and fam.typ != "info" and _ts_after(fam.group_ts, ts):
                raise Bad("timestamps went backwards within a label set")
    fam.group = group
    fam.group_ts = ts
    fam.seen_groups.add(group)


def _ts_after(a: Timestamp | float, b: Timestamp | float | None) -> bool:
    if isinstance(a, Timestamp) and isinstance(b, Timestamp):
        return a > b
    return float(a) > float(b)  # type: ignore[arg-type]


def _emit(out: list[Metric], seen_names: set[str], fam: _Family) -> None:
    """Close an OpenMetrics family with the library's family-level checks."""
    typ = fam.typ or "unknown"
    name = fam.name
    for suffix in set((*_SUFFIXES.get(typ, ()), "")):
        if name + suffix in seen_names:
            raise Bad(f"clashing name: {q(name + suffix)} belongs to an earlier family", fam.line)
        seen_names.add(name + suffix)
    unit = fam.unit or ""
    if unit and not name.endswith("_" + unit):
        raise Bad(f"unit {q(unit)} does not match metric name {q(name)}", fam.line)
    if unit and typ in ("info", "stateset"):
        raise Bad(f"units are not allowed for {typ} {q(name)}", fam.line)
    if fam.groups:
        finish_histogram(name, fam.groups, openmetrics=True)
    metric = Metric(name, fam.doc or "", typ, unit)
    metric.samples = fam.samples
    out.append(metric)
