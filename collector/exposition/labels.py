"""Label sets: the careful parser, the escape-free fast one, and their hashable keys."""

from __future__ import annotations

import re

from collector.exposition.problems import Bad, Slow, q
from collector.exposition.tokens import LABEL_ESCAPE, skip_space, unescape

__all__ = ["NO_LABELS", "LabelEntry", "fast_labels", "label_entry", "parse_label_set"]

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Up to the next blank, '=', ',', brace or quote: what we quote back in "invalid name" errors.
_NAME_TOKEN = re.compile(r'[^\s=,{}"]*')
# The rest of a quoted label value after its opening quote. Possessive: linear on any input.
_QUOTED_REST = re.compile(r'[^"\\]*+(?:\\.[^"\\]*+)*+"')

NO_LABELS: frozenset[tuple[str, str]] = frozenset()

#: ``(label set, label set without le, le)`` of one sample's labels; see ``label_entry``.
LabelEntry = tuple[frozenset[tuple[str, str]], frozenset[tuple[str, str]], str | None]


def label_entry(labels: dict[str, str]) -> LabelEntry:
    """The labels as ``(label set, label set without le, le)``: hashable and order-free.

    A series is keyed on the last two, a form the bucket-run path can produce without hashing
    a whole label set per line.
    """
    if not labels:
        return NO_LABELS, NO_LABELS, None
    frozen = frozenset(labels.items())
    le = labels.get("le")
    return (frozen, frozen, None) if le is None else (frozen, frozen - {("le", le)}, le)


def fast_labels(body: str, label_keys: dict[str, str]) -> dict[str, str]:
    """Labels of a ``k="v",...`` body without backslashes; raises ``Slow`` if it is unusual.

    Split on quotes, ``,k1="v1",k2="v2"`` alternates key parts (``,k1=``) and values, and ends
    with an empty part. Values cannot hold a quote (it would need a backslash), so if every key
    part is a validated ``,name=`` the body is well-formed and the split is the parse.
    ``label_keys`` maps key parts already validated to their names (``',name='`` -> ``'name'``).
    """
    if not body:
        return {}
    if "\\" in body:
        raise Slow
    parts = ("," + body).split('"')
    if parts.pop() or len(parts) & 1:
        raise Slow
    pairs = iter(parts)
    try:
        labels = dict(zip(map(label_keys.__getitem__, pairs), pairs))  # noqa: B905 - pairwise
    except KeyError:
        if not _learn_label_keys(parts[0::2], label_keys):
            raise Slow from None
        pairs = iter(parts)
        labels = dict(zip(map(label_keys.__getitem__, pairs), pairs))  # noqa: B905 - pairwise
    if len(labels) * 2 != len(parts):
        raise Slow  # a label name given twice
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


def parse_label_set(line: str, pos: int, *, text_format: bool) -> tuple[dict[str, str], int]:
    """Parse ``k="v",...}`` from just after the ``{``; returns the labels and the end offset.

    The text format allows blanks around tokens and a trailing comma (as the library does);
    OpenMetrics allows neither.
    """
    labels: dict[str, str] = {}
    end = len(line)
    skip = text_format
    if skip:
        pos = skip_space(line, pos)
    if line.startswith("}", pos):
        return labels, pos + 1
    while True:
        token = _NAME_TOKEN.match(line, pos).group()  # type: ignore[union-attr]  # * matches
        if not token:
            if pos >= end:
                raise Bad("truncated line: unterminated label set")
            raise Bad(f"expected a label name at column {pos + 1}")
        if not _valid_label_name(token):
            if token.startswith("__") and _LABEL_NAME.fullmatch(token):
                raise Bad(f"reserved label name {q(token)}")
            raise Bad(f"invalid label name {q(token)}")
        pos = _next_token(line, pos + len(token), skip)
        if line[pos] != "=":
            raise Bad(f"expected '=' after label name {q(token)}")
        pos = _next_token(line, pos + 1, skip)
        if line[pos] != '"':
            raise Bad(f"value of label {q(token)} is not a quoted string")
        match = _QUOTED_REST.match(line, pos + 1)
        if not match:
            raise Bad(f"truncated line: unterminated quoted value of label {q(token)}")
        value = line[pos + 1:match.end() - 1]
        if "\\" in value:
            value = LABEL_ESCAPE.sub(unescape, value)
        if token in labels:
            raise Bad(f"duplicate label name {q(token)}")
        labels[token] = value
        pos = _next_token(line, match.end(), skip)
        if line[pos] == "}":
            return labels, pos + 1
        if line[pos] != ",":
            if line.find("}", pos) < 0:
                raise Bad("truncated line: unterminated label set")
            raise Bad(f"expected ',' or '}}' after the value of label {q(token)}")
        pos += 1
        if skip:
            pos = skip_space(line, pos)
            if line.startswith("}", pos):
                return labels, pos + 1


def _next_token(line: str, pos: int, skip: bool) -> int:
    """``pos``, or past blanks there if ``skip``; ``Bad`` if the label set ends first."""
    if skip:
        pos = skip_space(line, pos)
    if pos >= len(line):
        raise Bad("truncated line: unterminated label set")
    return pos
