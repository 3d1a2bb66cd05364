"""Checks on a whole body: empty, an HTML page, invalid UTF-8; and where a failure is reported."""

from __future__ import annotations

import re
from collections.abc import Callable

from prometheus_client.metrics_core import Metric

from collector.exposition.problems import Bad
from vigil.errors import ParseError

__all__ = ["DEFAULT_SOURCE", "HTML_REASON", "check_html_start", "decode", "parse_body"]

DEFAULT_SOURCE = "<exposition>"
HTML_REASON = "looks like HTML, not a Prometheus exposition"

_LEADING_LT = re.compile(r"\s*<")
_HTML_TAG = re.compile(r"<(?:html|!doctype\s+html)\b", re.IGNORECASE)


def parse_body(text: str, source: str, parse_lines: Callable[[list[str]], list[Metric]], *,
               final_newline_ends: bool) -> list[Metric]:
    """``parse_lines`` over the lines of ``text``, with its ``Bad`` turned into ``ParseError``.

    ``final_newline_ends``: the newline after the last line ends it rather than starting an
    empty line (OpenMetrics, which forbids blank lines).
    """
    _precheck(text, source)
    lines = text.split("\n")
    if final_newline_ends and lines[-1] == "":
        lines.pop()
    try:
        return parse_lines(lines)
    except Bad as bad:
        raise _located(bad, lines, text, source) from None


def decode(body: bytes, source: str) -> str:
    """UTF-8 text of ``body``; ``ParseError`` (HTML or not-UTF-8) if it has invalid bytes."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as err:
        check_html_start(body[:4096].decode("utf-8", errors="replace"), source)
        line = body.count(b"\n", 0, err.start) + 1
        start = body.rfind(b"\n", 0, err.start) + 1
        snippet = body[start:start + 200].split(b"\n", 1)[0].decode("utf-8", errors="replace")
        raise ParseError(
            f"not valid UTF-8 ({err.reason} at byte {err.start})",
            source=source, line=line, text=snippet,
        ) from None


def _precheck(text: str, source: str) -> None:
    """Reject an empty body (line 0) and a body that starts like an HTML page."""
    if not text or text.isspace():
        raise ParseError("empty exposition", source=source, line=0)
    check_html_start(text, source)


def check_html_start(text: str, source: str) -> None:
    """Raise ``ParseError`` if ``text`` starts (after blanks) with ``<``, like an HTML page."""
    match = _LEADING_LT.match(text)
    if match:
        raise _html_error(text, match.end() - 1, source)


def _html_error(text: str, offset: int, source: str) -> ParseError:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    line_text = text[start:end if end >= 0 else len(text)]
    return ParseError(HTML_REASON, source=source, line=text.count("\n", 0, offset) + 1,
                      text=line_text[:200])


def _located(bad: Bad, lines: list[str], text: str, source: str) -> ParseError:
    """The ``ParseError`` for ``bad``; an HTML page anywhere in the body explains any failure."""
    html = _HTML_TAG.search(text)
    if html:
        return _html_error(text, html.start(), source)
    line = min(bad.line, len(lines))
    return ParseError(bad.reason, source=source, line=line,
                      text=lines[line - 1] if line else None)
