"""A small, byte-stable YAML emitter for the files ``vigil rules`` generates.

Why not a YAML library: the generated files are golden-tested byte for byte, so their text must
not depend on a library version's quoting or line-wrapping choices, and Vigil needs no YAML
library at run time. The subset is what rule files, promtool tests, scrape configs and
Kubernetes objects need: mappings (in insertion order), lists, strings, ints, floats and bools.

Style (that of Prometheus's and Kubernetes' documentation):

* block mappings and lists; a list item's mapping starts on the dash line (``- name: x``);
* a string is written plain when no YAML 1.1 or 1.2 reader can take it for anything else
  (``slo:sli_error:ratio_rate5m``, ``30s``, ``keda.sh/v1alpha1``), else single-quoted when it
  is printable ASCII (PromQL's double quotes stay readable), else double-quoted in ASCII
  with escapes; a multi-line string (a PromQL expression) is a literal block ``|-``;
* floats use Python's shortest round-trip ``repr`` with a ``.0`` mantissa when it has no dot
  (``1.0e-05``: PyYAML reads ``1e-05`` as a string); NaN and ±Inf are refused.

``tests/test_rules_yaml.py`` parses every emitted document back with PyYAML and compares.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["dump", "dump_all", "scalar"]

_INDENT = "  "
# Plain scalars: a conservative alphabet that never starts an indicator, comment or flow
# collection, and never contains ": " or " #".
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_.:/+@-]*")
# "30s", "1h30m", "500ms": durations start with a digit but no YAML resolver reads them as a
# number, a date or a sexagesimal int (those need ':' or '-' or only digits).
_DURATION = re.compile(r"(?:[0-9]+(?:ms|[smhdwy]))+")
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")
# YAML 1.1 booleans and nulls (any case), which a plain scalar must not spell.
_RESERVED = frozenset(["y", "n", "yes", "no", "on", "off", "true", "false", "null"])
# A literal block ``|-`` keeps a string exactly when no line has trailing blanks, it has no
# tab, carriage return or other non-printable character, it does not start with a blank or an empty
# line (the block's indentation is detected from its first line) and it does not end with a
# newline (``-`` strips it).
_BLOCK_UNSAFE = re.compile(
    r"[ \t]\n|[ \t]\Z|\n\Z|\A[ \n]|[\u2028\u2029]"
    # Anything outside YAML's printable set (tabs and carriage returns included).
    r"|[^\n\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)


def _string(value: str) -> str:
    if (_PLAIN.fullmatch(value) or _DURATION.fullmatch(value)) and (
        value.lower() not in _RESERVED and not value.endswith(":")
    ):
        return value
    if _PRINTABLE_ASCII.fullmatch(value):
        # Single quotes take any printable character as is ('' is the one escape), which
        # keeps PromQL's double quotes readable.
        return "'" + value.replace("'", "''") + "'"
    return _double_quoted(value)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _double_quoted(value: str) -> str:
    """A YAML double-quoted scalar in ASCII: anything else escaped, ``\\U`` beyond the BMP
    (YAML has no surrogate pairs), so U+2028 and friends cannot be read as line breaks."""
    out = []
    for ch in value:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _float(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"YAML output refuses non-finite floats, got {value!r}")
    text = repr(value)
    if "e" in text:
        mantissa, exponent = text.split("e")
        if "." not in mantissa:
            mantissa += ".0"
        text = f"{mantissa}e{exponent}"
    return text


def scalar(value: Any) -> str:
    """One scalar as it appears after ``key: `` (strings without newlines only)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return _string(value)
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as a YAML scalar")


def _is_block_string(value: Any) -> bool:
    return isinstance(value, str) and "\n" in value and not _BLOCK_UNSAFE.search(value)


def _value_lines(value: Any, indent: str) -> tuple[str, list[str]]:
    """What follows ``key:`` on its own line, and the lines below it (already indented)."""
    if isinstance(value, Mapping):
        if not value:
            return " {}", []
        return "", _mapping_lines(value, indent + _INDENT)
    if isinstance(value, list | tuple):
        if not value:
            return " []", []
        # Lists sit at their key's indentation, as in Prometheus's and Kubernetes' docs.
        return "", _sequence_lines(value, indent)
    if _is_block_string(value):
        body = [f"{indent}{_INDENT}{line}" if line else "" for line in value.split("\n")]
        return " |-", body
    return f" {scalar(value)}", []


def _mapping_lines(mapping: Mapping[str, Any], indent: str) -> list[str]:
    lines: list[str] = []
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise TypeError(f"mapping keys must be strings, got {key!r}")
        head, body = _value_lines(value, indent)
        lines.append(f"{indent}{_string(key)}:{head}")
        lines.extend(body)
    return lines


def _sequence_lines(items: Sequence[Any], indent: str) -> list[str]:
    lines: list[str] = []
    for item in items:
        if isinstance(item, Mapping) and item:
            inner = _mapping_lines(item, indent + _INDENT)
            # The first key moves onto the dash line: "- name: x".
            lines.append(f"{indent}- {inner[0][len(indent) + len(_INDENT):]}")
            lines.extend(inner[1:])
        elif isinstance(item, list | tuple) and item:
            inner = _sequence_lines(item, indent + _INDENT)
            lines.append(f"{indent}- {inner[0][len(indent) + len(_INDENT):]}")
            lines.extend(inner[1:])
        else:
            head, body = _value_lines(item, indent)
            lines.append(f"{indent}-{head}")
            lines.extend(body)
    return lines


def _comment_lines(comment: str) -> list[str]:
    return [f"# {line}".rstrip() for line in comment.splitlines()]


def dump(document: Mapping[str, Any], *, comment: str = "") -> str:
    """One YAML document (a mapping), optionally preceded by ``# comment`` lines; ends with a
    newline. The same input always gives the same bytes."""
    lines = _comment_lines(comment) if comment else []
    lines.extend(_mapping_lines(document, ""))
    return "\n".join(lines) + "\n"


def dump_all(documents: Iterable[Mapping[str, Any]], *, comment: str = "") -> str:
    """Several documents, each starting with ``---`` (as ``kubectl apply -f`` takes them)."""
    parts = _comment_lines(comment) if comment else []
    for document in documents:
        parts.append("---")
        parts.extend(_mapping_lines(document, ""))
    return "\n".join(parts) + "\n"
