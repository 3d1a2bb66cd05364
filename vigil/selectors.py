"""PromQL label matchers: parsed from a pool's ``selector``, rendered back as PromQL, and
applied to label sets the way Prometheus applies them.

A pool's ``selector`` is the inside of a PromQL vector selector's braces, e.g.
``namespace="llm", service=~"chat-.*"``: the series a team's Prometheus already stores (the
labels kube-prometheus-stack's PodMonitors and ServiceMonitors attach), not the labels Vigil's
own scrape jobs add. Parsing follows PromQL's lexer: the four operators ``=``, ``!=``, ``=~``,
``!~``; values as double-, single- or back-quoted strings with Go's escapes; a trailing comma.

Matching follows Prometheus (``docs/promql-semantics.md``): a missing label has the value
``""``, and a regular expression is fully anchored (``=~"chat-.*"`` is ``^(?:chat-.*)$``).
Prometheus's regexes are RE2; Python's ``re`` accepts RE2's syntax except a few rarely used
classes (``\\pN`` forms), which fail validation here with the offending pattern named.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Literal, NamedTuple

from vigil.conventions import KIND_DCGM, KIND_VLLM, LABEL_INSTANCE, LABEL_KIND, LABEL_POOL
from vigil.errors import ArgumentError

__all__ = [
    "OPERATORS",
    "LabelMatcher",
    "Selector",
    "SelectorError",
    "as_selector",
    "check_label_name",
    "default_pool_selector",
    "is_series_only_label",
    "parse_selector",
    "promql_string",
]

Operator = Literal["=", "!=", "=~", "!~"]
#: The label matching operators of PromQL.
OPERATORS: tuple[Operator, ...] = ("=", "!=", "=~", "!~")

_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NAME = "__name__"


class SelectorError(ArgumentError):
    """A selector that PromQL would not parse, with the column (1-based) where it went wrong."""

    def __init__(self, message: str, column: int | None = None) -> None:
        super().__init__(message if column is None else f"{message} (at column {column})")
        self.column = column


def check_label_name(name: str) -> str:
    """``name`` if it is a valid Prometheus label name, else ``SelectorError``."""
    if not _LABEL_RE.fullmatch(name):
        raise SelectorError(f"{name!r} is not a valid Prometheus label name "
                            "([a-zA-Z_][a-zA-Z0-9_]*)")
    return name


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal (Go escapes)."""
    out = ['"']
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


#: RE2's leading flag group, ``(?i)``: Python allows global flags only at the very start, so
#: wrapping the pattern in a group would reject it; it becomes a scoped group ``(?i:...)``.
_LEADING_FLAGS = re.compile(r"\(\?([imsU]+)\)")


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    # Prometheus anchors every regex matcher and, since 3.0, lets "." match a newline too.
    m = _LEADING_FLAGS.match(pattern)
    if m:
        if "U" in m.group(1):
            raise re.error("RE2's ungreedy flag U has no Python equivalent; write lazy "
                           "quantifiers (*?, +?) instead")
        return re.compile(f"(?{m.group(1)}:{pattern[m.end():]})", re.DOTALL)
    return re.compile(f"(?:{pattern})", re.DOTALL)


class LabelMatcher(NamedTuple):
    """One label matcher: ``name op "value"``."""

    name: str
    op: Operator
    value: str

    def matches(self, value: str) -> bool:
        """Whether a series whose label ``name`` is ``value`` ("" when missing) matches."""
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        hit = _compiled(self.value).fullmatch(value) is not None
        return hit if self.op == "=~" else not hit

    def promql(self) -> str:
        """``name op "value"`` as PromQL."""
        return f"{self.name}{self.op}{promql_string(self.value)}"


class Selector(tuple[LabelMatcher, ...]):
    """A conjunction of label matchers, in the order written (immutable, hashable)."""

    __slots__ = ()

    def __new__(cls, matchers: Iterable[LabelMatcher] = ()) -> Selector:
        return super().__new__(cls, tuple(matchers))

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a series with ``labels`` (``__name__`` included if matched on) matches."""
        return all(m.matches(labels.get(m.name, "")) for m in self)

    def names(self) -> tuple[str, ...]:
        """The label names matched on, first occurrence order."""
        return tuple(dict.fromkeys(m.name for m in self))

    def equal(self, name: str) -> str | None:
        """The value of the first ``name="value"`` matcher, ``None`` without one."""
        for m in self:
            if m.name == name and m.op == "=":
                return m.value
        return None

    def and_equal(self, *pairs: tuple[str, str], **labels: str) -> Selector:
        """This selector with equality matchers added (an existing one on the same label with
        ``=`` is replaced, as a dict update would; other operators are kept and ANDed)."""
        add = [*pairs, *labels.items()]
        names = {k for k, _ in add}
        kept = [m for m in self if not (m.op == "=" and m.name in names)]
        return Selector([*kept, *(LabelMatcher(check_label_name(k), "=", v) for k, v in add)])

    def inner(self) -> str:
        """The matchers as PromQL, comma separated, without braces."""
        return ", ".join(m.promql() for m in self)

    def promql(self, metric: str) -> str:
        """``metric{matchers}`` (just ``metric`` without matchers)."""
        inner = self.inner()
        return f"{metric}{{{inner}}}" if inner else metric

    def __repr__(self) -> str:
        return f"Selector({{{self.inner()}}})"


def as_selector(matchers: Mapping[str, str] | Selector | None) -> Selector:
    """Equality matchers (a mapping) or a ``Selector`` as a ``Selector``."""
    if matchers is None:
        return Selector()
    if isinstance(matchers, Selector):
        return matchers
    return Selector(LabelMatcher(k, "=", v) for k, v in matchers.items())


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", "'": "'", '"': '"'}


def _string(text: str, i: int) -> tuple[str, int]:
    """The string literal starting at ``text[i]`` and the index after it (PromQL's lexer:
    Go's escapes in '...' and "...", none in `...`)."""
    quote = text[i]
    j = i + 1
    if quote == "`":
        end = text.find("`", j)
        if end < 0:
            raise SelectorError("unterminated raw string", i + 1)
        return text[j:end], end + 1
    out: list[str] = []
    while j < len(text):
        ch = text[j]
        if ch == quote:
            return "".join(out), j + 1
        if ch == "\n":
            raise SelectorError("unterminated quoted string (newline)", j + 1)
        if ch != "\\":
            out.append(ch)
            j += 1
            continue
        if j + 1 >= len(text):
            break
        esc = text[j + 1]
        if esc in _ESCAPES:
            out.append(_ESCAPES[esc])
            j += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}.get(esc)
        digits, base, start = (text[j + 2:j + 2 + width], 16, j + 2) if width else \
            (text[j + 1:j + 4], 8, j + 1)
        if width is None and not esc.isdigit():
            raise SelectorError(f"unknown escape sequence \\{esc}", j + 1)
        try:
            code = int(digits, base)
            if len(digits) != (width or 3):
                raise ValueError
            out.append(chr(code))
        except ValueError:
            raise SelectorError(f"invalid escape sequence \\{text[j + 1:start + (width or 3)]}",
                                j + 1) from None
        j = start + (width or 3)
    raise SelectorError("unterminated quoted string", i + 1)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


@lru_cache(maxsize=512)
def parse_selector(text: str) -> Selector:
    """The matchers of ``text``: ``a="x", b!~"y.*"``, optionally inside ``{...}``.

    Raises ``SelectorError`` for a syntax error, an invalid label name, a regular expression
    that does not compile, a ``__name__`` matcher (the metric is Vigil's to choose) or a
    selector without any matcher. Every matcher may match the empty string: the metric name
    that Vigil adds is what makes a query's selector non-empty, as PromQL requires.
    """
    body = text.strip()
    offset = len(text) - len(text.lstrip())
    if body.startswith("{"):
        if not body.endswith("}"):
            raise SelectorError("'{' without a closing '}'", offset + 1)
        body, offset = body[1:-1], offset + 1
    matchers: list[LabelMatcher] = []
    i = _skip_space(body, 0)
    while i < len(body):
        m = _LABEL_RE.match(body, i)
        if not m:
            raise SelectorError(f"expected a label name, found {body[i]!r}", offset + i + 1)
        name = m.group()
        i = _skip_space(body, m.end())
        op = next((o for o in ("=~", "!~", "!=", "=") if body.startswith(o, i)), None)
        if op is None:
            found = body[i] if i < len(body) else "the end"
            raise SelectorError(f"expected one of = != =~ !~ after {name!r}, found {found!r}",
                                offset + i + 1)
        i = _skip_space(body, i + len(op))
        if i >= len(body) or body[i] not in "\"'`":
            raise SelectorError(f"expected a quoted value after {name}{op}", offset + i + 1)
        try:
            value, i = _string(body, i)
        except SelectorError as exc:
            raise SelectorError(str(exc).rsplit(" (at column", 1)[0],
                                offset + (exc.column or 1)) from None
        if name == _NAME:
            raise SelectorError("a selector may not match __name__: the metric is chosen "
                                "by what reads the pool")
        if op in ("=~", "!~"):
            try:
                _compiled(value)
            except re.error as exc:
                raise SelectorError(f"invalid regular expression {value!r} for {name}: "
                                    f"{exc}") from None
        # ignore: op is one of the four operators (the scan above matched it), which mypy
        # cannot narrow a str slice to.
        matchers.append(LabelMatcher(name, op, value))  # type: ignore[arg-type]
        i = _skip_space(body, i)
        if i < len(body):
            if body[i] != ",":
                raise SelectorError(f"expected ',' between matchers, found {body[i]!r}",
                                    offset + i + 1)
            i = _skip_space(body, i + 1)
    if not matchers:
        raise SelectorError("an empty selector selects every series; give label matchers "
                            "such as namespace=\"llm\", service=\"chat-vllm\"")
    return Selector(matchers)


def default_pool_selector(pool: str, kind: str = KIND_VLLM) -> Selector:
    """The series of a pool as Vigil's own scrape jobs label them: ``{pool, kind}``."""
    if kind not in (KIND_VLLM, KIND_DCGM):
        raise ValueError(f"unknown target kind {kind!r}")
    return Selector([LabelMatcher(LABEL_POOL, "=", pool), LabelMatcher(LABEL_KIND, "=", kind)])


#: Labels the exposed samples carry but a target's ``up`` never does: vLLM's per-engine
#: labels and DCGM exporter's per-GPU ones (``exported_*``: the pod using the GPU, renamed by
#: Prometheus where the target has a label of that name).
SERIES_ONLY_LABELS = frozenset({
    "model_name", "engine", "finished_reason", "le", "gpu", "UUID", "device", "modelName",
    "Hostname", "pci_bus_id", "DCGM_FI_DRIVER_VERSION", "GPU_I_ID", "GPU_I_PROFILE",
})


def is_series_only_label(name: str) -> bool:
    """Whether ``name`` is a label of exposed samples that a target's ``up`` never has."""
    return name in SERIES_ONLY_LABELS or name.startswith("exported_")


#: The label that tells replicas apart in series Vigil scraped itself (its target's name).
DEFAULT_REPLICA_LABEL = LABEL_INSTANCE
