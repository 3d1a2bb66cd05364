"""A backfill file in any layout ``promtool tsdb create-blocks-from openmetrics`` accepts.

A scrape writes each family once, every label set of it together, at one timestamp: the layout
the strict parser (``collector.exposition``) checks. A backfill holds many scrapes, and promtool
reads its samples one by one, in any order (``cmd/promtool/backfill.go`` appends every sample to
a TSDB block writer, whatever came before it): each series' samples together, histogram bucket
series one after another, the same family declared again further down, families in any order.

``parse_backfill`` puts such a file's lines into the layout of a scrape -- each family once with
its metadata, then its label sets in the order they first appear, each over time, histogram
buckets by ``le`` -- and hands that to the strict parser, so every rule on the content stays:
a bad value or timestamp, a series repeated at the same timestamp, buckets that do not add up
at one timestamp, a family declared with two different types. Errors name the line of the file
as given. Only the arrangement is free; the samples, and so the stored points, are the same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

from prometheus_client.metrics_core import Metric

from collector.exposition import parse_openmetrics, parse_text
from collector.exposition.histograms import le_value
from collector.exposition.labels import parse_label_set
from collector.exposition.problems import Bad, q
from collector.exposition.tokens import number, sample_name, skip_space
from vigil.errors import ParseError

__all__ = ["is_openmetrics", "parse_backfill"]

# Sample-name suffixes a family of each type claims, as the strict parsers assign samples.
_OM_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "histogram": ("_count", "_sum", "_bucket", "_created"),
    "gaugehistogram": ("_gcount", "_gsum", "_bucket"),
    "info": ("_info",),
}
_TEXT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
_HISTOGRAMS = frozenset(("histogram", "gaugehistogram"))
_BLANKS = re.compile(r"[ \t]+")
_FIRST_ON_LINE = re.compile(r"\(first on line (\d+)\)")


def is_openmetrics(text: str) -> bool:
    """Whether ``parse`` reads ``text`` as OpenMetrics: its last line is ``# EOF``."""
    tail = text[-4096:].rstrip()
    return tail == "# EOF" or tail.endswith("\n# EOF")


class _Line:
    """One sample line: where it was, its family, sort key parts and the text to parse."""

    __slots__ = ("family", "group", "index", "le", "line", "text", "ts")

    def __init__(self, line: int, text: str, family: str, group: frozenset,
                 ts: Decimal | None, le: float | None) -> None:
        self.line, self.text, self.family, self.group = line, text, family, group
        self.ts, self.le, self.index = ts, le, line


def parse_backfill(text: str, *, source: str) -> list[Metric] | None:
    """The families of a backfill ``text`` laid out in any order promtool accepts.

    Returns None when no sample carries a timestamp (not a backfill: the caller's own parse
    error stands). Raises ``ParseError`` naming ``source`` and the 1-based line of ``text``:
    the strict parser's rules on content, a family given two types or units, and a file that
    mixes samples with and without timestamps.
    """
    openmetrics = is_openmetrics(text)
    lines = text.split("\n")
    if openmetrics and lines[-1] == "":
        lines.pop()
    try:
        layout = _layout(lines, openmetrics)
    except Bad as bad:
        line = min(bad.line, len(lines))
        raise ParseError(bad.reason, source=source, line=line,
                         text=lines[line - 1] if line else None) from None
    if layout is None:
        return None
    body, where = layout
    parser = parse_openmetrics if openmetrics else parse_text
    try:
        return parser("\n".join(body) + "\n", source=source)
    except ParseError as exc:
        line = where[exc.line - 1] if 0 < exc.line <= len(where) else exc.line
        reason = _FIRST_ON_LINE.sub(
            lambda m: f"(first on line {where[int(m.group(1)) - 1]})", exc.reason)
        raise ParseError(reason, source=source, line=line, text=exc.text) from None


def _layout(lines: Sequence[str], openmetrics: bool) -> tuple[list[str], list[int]] | None:
    """``(lines, their 1-based lines in the input)`` in the layout of one scrape, or None.

    None when no sample has a timestamp. Raises ``Bad`` (with its line) for what the layout
    itself cannot hold: a family typed twice differently, text after ``# EOF``, a mix of
    samples with and without timestamps.
    """
    meta: dict[str, dict[str, tuple[int, str, str]]] = {}  # family -> keyword -> (line, text, arg)
    order: dict[str, None] = {}  # families in the order they first appear
    raw: list[tuple[int, str]] = []  # sample lines
    eof = 0
    for lineno, line in enumerate(lines, 1):
        if eof:
            raise Bad("text after '# EOF'", lineno)
        stripped = line if openmetrics else line.strip()
        if not stripped:
            if openmetrics:
                raise Bad("blank line (not allowed in OpenMetrics)", lineno)
            continue
        if stripped[0] != "#":
            raw.append((lineno, stripped))
            continue
        if openmetrics and stripped == "# EOF":
            eof = lineno
            continue
        parsed = _metadata(stripped, openmetrics, lineno)
        if parsed is None:
            continue  # an ordinary comment (text format)
        keyword, family, arg = parsed
        order.setdefault(family)
        known = meta.setdefault(family, {})
        first = known.get(keyword)
        if first is None:
            known[keyword] = (lineno, stripped, arg)
        elif keyword != "HELP" and first[2] != arg:
            # A type decides which samples belong to the family: two of them is not a layout.
            raise Bad(f"{keyword} {q(arg)} for {q(family)} differs from {q(first[2])} on line "
                      f"{first[0]}", lineno)
    claims = _claims(meta, openmetrics)
    samples: list[_Line] = []
    timed = untimed = 0
    for lineno, line in raw:
        name, labels, ts = _sample(line, openmetrics, lineno)
        family, suffix = claims.get(name, (name, ""))
        typ = meta.get(family, {}).get("TYPE", (0, "", ""))[2]
        group, le = _group(family, typ, suffix, labels, lineno)
        order.setdefault(family)
        samples.append(_Line(lineno, line, family, group, ts, le))
        if ts is None:
            untimed = untimed or lineno
        else:
            timed += 1
    if not timed:
        return None
    if untimed:
        name = sample_name(lines[untimed - 1].strip())[0]
        raise Bad(f"mixes samples with and without timestamps (first without: {name}); a "
                  "backfill needs a timestamp on every sample", untimed)
    return _assemble(order, meta, samples, eof)


def _assemble(order: dict[str, None], meta: dict[str, dict[str, tuple[int, str, str]]],
              samples: list[_Line], eof: int) -> tuple[list[str], list[int]]:
    """Each family once: its metadata, then its label sets in first-seen order, each over time."""
    by_family: dict[str, list[_Line]] = {f: [] for f in order}
    groups: dict[tuple[str, frozenset], int] = {}
    for s in samples:
        by_family[s.family].append(s)
        groups.setdefault((s.family, s.group), len(groups))
    body: list[str] = []
    where: list[int] = []
    for family, members in by_family.items():
        for keyword in ("HELP", "TYPE", "UNIT"):
            entry = meta.get(family, {}).get(keyword)
            if entry is not None:
                body.append(entry[1])
                where.append(entry[0])
        # Within one label set and timestamp: buckets by le (a scrape's order), then the rest
        # (_count, _sum, ...) as they came.
        members.sort(key=lambda s: (groups[(family, s.group)], s.ts,
                                    0 if s.le is not None else 1,
                                    s.le if s.le is not None else s.index))
        for s in members:
            body.append(s.text)
            where.append(s.line)
    if eof:
        body.append("# EOF")
        where.append(eof)
    return body, where


def _metadata(line: str, openmetrics: bool, lineno: int) -> tuple[str, str, str] | None:
    """``(keyword, family, argument)`` of a HELP/TYPE/UNIT line; None for other comments."""
    parts = line.split(None, 3) if not openmetrics else line.split(" ", 3)
    keyword = parts[1] if len(parts) > 1 else ""
    if keyword not in ("HELP", "TYPE", "UNIT") or (keyword == "UNIT" and not openmetrics):
        if openmetrics:
            raise Bad("invalid comment: OpenMetrics allows only # HELP, # TYPE, # UNIT and "
                      "# EOF", lineno)
        return None
    if len(parts) < 3:
        raise Bad(f"truncated line: {keyword} without a metric name", lineno)
    arg = parts[3].strip() if len(parts) > 3 else ""
    return keyword, parts[2], arg if keyword != "HELP" else ""


def _claims(meta: dict[str, dict[str, tuple[int, str, str]]],
            openmetrics: bool) -> dict[str, tuple[str, str]]:
    """Sample name -> ``(family, suffix)`` for every declared family, as the parsers assign."""
    claims: dict[str, tuple[str, str]] = {}
    table = _OM_SUFFIXES if openmetrics else _TEXT_SUFFIXES
    for family, known in meta.items():
        typ = known.get("TYPE", (0, "", ""))[2]
        for suffix in table.get(typ, ("",)):
            claims.setdefault(family + suffix, (family, suffix))
            if openmetrics and ":" in family:
                # client_python#1177: `vllm:x` declared, `vllm_x...` on the samples.
                claims.setdefault((family + suffix).replace(":", "_"), (family, suffix))
    return claims


def _sample(line: str, openmetrics: bool,
            lineno: int) -> tuple[str, dict[str, str], Decimal | None]:
    """Name, labels and timestamp of a sample line (seconds for OpenMetrics, else ms)."""
    try:
        name, pos = sample_name(line)
        if not openmetrics:
            after = skip_space(line, pos)
            if after < len(line) and line[after] == "{":
                pos = after
        labels: dict[str, str] = {}
        if pos < len(line) and line[pos] == "{":
            labels, pos = parse_label_set(line, pos + 1, text_format=not openmetrics)
    except Bad as bad:
        bad.line = lineno
        raise
    if openmetrics:
        toks = line[pos:].partition(" # ")[0].split(" ")[1:]
    else:
        toks = _BLANKS.split(line[pos:].strip(" \t"))
    if not toks or not toks[0]:
        raise Bad(f"truncated line: sample {q(name)} has no value", lineno)
    if number(toks[0]) is None:
        raise Bad(f"invalid sample value {q(toks[0])}", lineno)
    if len(toks) < 2:
        return name, labels, None
    return name, labels, _timestamp(toks[1], openmetrics, lineno)


def _timestamp(tok: str, openmetrics: bool, lineno: int) -> Decimal:
    """A timestamp token as an exact number, for ordering samples in time."""
    if not openmetrics and not tok.lstrip("+-").isdecimal():
        raise Bad(f"invalid timestamp {q(tok)} (expected integer milliseconds)", lineno)
    try:
        ts = Decimal(tok)
    except InvalidOperation:
        ts = Decimal("NaN")
    if not ts.is_finite() or "_" in tok:
        raise Bad(f"invalid timestamp {q(tok)}", lineno)
    return ts


def _group(family: str, typ: str, suffix: str, labels: dict[str, str],
           lineno: int) -> tuple[frozenset, float | None]:
    """The label set a sample is grouped under (as the parsers group it), and a bucket's le."""
    if typ == "info":
        return frozenset(), None
    if suffix == "_bucket" and typ in _HISTOGRAMS and "le" in labels:
        le_text = labels["le"]
        return frozenset(labels.items()) - {("le", le_text)}, le_value(le_text, lineno)
    if typ == "summary" and suffix == "" and "quantile" in labels:
        return frozenset(labels.items()) - {("quantile", labels["quantile"])}, None
    if typ == "stateset" and family in labels:
        return frozenset(labels.items()) - {(family, labels[family])}, None
    return frozenset(labels.items()), None
