"""What the parsers raise internally, and how a message shows a token or a series.

``Bad`` carries a reason (and a line, when it is not the line being read) up to the public
``parse_*`` functions, which turn it into a ``vigil.errors.ParseError`` naming the source, the
line and its text. ``Slow`` is how a fast path hands a line to the careful one.
"""

from __future__ import annotations

__all__ = ["Bad", "Slow", "clip", "duplicate", "q", "series"]


class Bad(Exception):
    """A problem found while parsing: ``reason``, and ``line`` when it is not the current line."""

    def __init__(self, reason: str, line: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line


class Slow(Exception):
    """The fast path declines a line; the slow path parses it or says what is wrong."""


def q(text: str) -> str:
    """``text`` quoted for a message, clipped so a 10 MB token cannot become a 10 MB message."""
    shown = repr(text[:80])
    return shown if len(text) <= 80 and len(shown) <= 120 else shown[:120] + "..."


def clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters (with ``...`` when cut), for messages."""
    return text if len(text) <= limit else text[:limit] + "..."


def series(name: str, labels: dict[str, str]) -> str:
    """``name{k="v",...}`` as it would appear in an exposition, for messages (clipped)."""
    if not labels:
        return clip(name)
    inner = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in labels.items())
    return clip(f"{name}{{{inner}}}", 200)


def duplicate(name: str, labels: dict[str, str], first: int) -> str:
    """The message for a series seen again; ``first`` is the 1-based line it was first on."""
    return f"duplicate series {series(name, labels)} (first on line {first})"


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
