"""The tokens of an exposition line both formats share: names, numbers, escapes, blanks."""

from __future__ import annotations

import re

from collector.exposition.problems import Bad, q

__all__ = [
    "LABEL_ESCAPE",
    "METRIC_NAME",
    "WHITESPACE",
    "WORD",
    "check_metric_name",
    "number",
    "sample_name",
    "sample_value",
    "skip_space",
    "unescape",
]

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
WORD = re.compile(r"[^\s{]*")  # up to a blank or '{': a bad metric name, for messages
WHITESPACE = " \t\n\r\x0b\x0c"  # string.whitespace
_ANY_SPACE = re.compile(r"\s*")  # str.strip()'s whitespace, which the library strips

_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
#: The escapes of a label value (and of an OpenMetrics HELP text): ``\\``, ``\n``, ``\"``.
LABEL_ESCAPE = re.compile(r'\\[\\n"]')


def unescape(match: re.Match[str]) -> str:
    """The character an escape matched by ``LABEL_ESCAPE`` (or a subset of it) stands for."""
    return _ESCAPES[match.group(0)]


def number(tok: str) -> int | float | None:
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
    return number(tok) if tok else None


def sample_name(line: str) -> tuple[str, int]:
    """The metric name at the start of a sample line and the offset where it ends."""
    match = METRIC_NAME.match(line)
    if not match:
        token = WORD.match(line).group()  # type: ignore[union-attr]  # * always matches
        if not token:
            raise Bad(f"sample line must start with a metric name, not {q(line[:1])}")
        raise Bad(f"invalid metric name {q(token)}")
    return match.group(), match.end()


def check_metric_name(cand: str) -> None:
    """Raise ``Bad`` unless ``cand``, the name on a HELP/TYPE/UNIT line, is a valid one."""
    if cand.startswith('"'):
        raise Bad(f"quoted (UTF-8) metric names are not supported: {q(cand)}")
    if not METRIC_NAME.fullmatch(cand):
        raise Bad(f"invalid metric name {q(cand)}")


def skip_space(line: str, pos: int) -> int:
    """The offset of the first non-whitespace character at or after ``pos``."""
    return _ANY_SPACE.match(line, pos).end()  # type: ignore[union-attr]  # \s* always matches
