"""Pipeline step 7 of ``alerts.rules.pipeline``: ``promtool test rules`` unit tests for the rules.

For every pool the test feeds a small synthetic fleet (one input series per vLLM series the
rules read) and states what every recording rule must record and which alerts must fire. The
expected values are not typed in by hand: they are the embedded engine's own answers
(``slo.objectives.sli.error_ratio``, ``slo.objectives.burn_rate.evaluate_slo``,
``slo.objectives.quantiles.model_quantiles``, ``slo.scaling.signals``, ``slo.cost.pool.pool_cost``)
computed over the same samples with Prometheus 2.42's rules (``semantics="2"``), through
``slo.sources.memory.MemorySource``, an in-memory ``Source``. So ``promtool test rules`` passing
means: Prometheus, running these rules, records the numbers ``vigil slo status`` reports. promtool
compares floats exactly, and it does agree bit for bit.

The fleet of pool ``p``: replica ``R0`` (the pool's first vLLM target, else ``p-0``) serves
every model of the pool's SLOs for two hours, one sample a minute, with fixed traffic per
minute (``TRAFFIC``): 2 % errors, a TTFT and an e2e mix around the default thresholds, KV-cache
usage 0.95, 7 requests waiting; its API server answers 49 POSTs with a 2xx and the
unstreamed error with a 500 (``http_requests_total``), so that request is one finished error
and one 5xx, counted once. Replica ``R1`` (the second target, else ``p-1``) is down all along
(``up`` 0, no vLLM series). With the default SLOs this files tickets on availability (2 % of
the answers are 5xx), the error rate and TTFT, leaves e2e alone, and raises
``KvCacheUsageHigh``, ``TargetDown`` and ``ErrorBudgetLow``.

**A pool with a selector** (``[[pools]] selector``) has its series in a Prometheus with the
team's labels only, so its input series carry labels that satisfy the selector
(``selector_labels``: an ``=`` matcher's value, a string a ``=~`` regex fully matches, a value
``!=`` / ``!~`` reject) and the replica's name under its ``replica_label``, and nothing of
Vigil's own (no ``pool``, ``kind``, ``instance``). The engine's expectations are computed over
the same samples labelled as Vigil's store holds them (``{instance, pool, kind}``, the same
replica as ``instance``), since the numbers do not depend on the labels; an alert's expected
labels are then the selector's series' own.

Counters start at 0 and grow by whole numbers, and the evaluation time sits between two
samples: then a range's left edge never falls on a sample, and Prometheus 3.x (left-open
ranges) sees the same samples as 2.42. With these inputs the 3.x rules (Kahan sums, its
``avg_over_time``) give the very same floats too (``tests/test_rules_pipeline.py`` checks it).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from alerts.rules.engine_value import engine_value
from alerts.rules.model import Rule, RuleGroup, prom_duration
from alerts.rules.promql import le_label, number, promql_string
from slo.objectives.burn_rate import evaluate_slo
from slo.objectives.spec import SloSpec
from slo.promql.lookup import SemanticsLike
from slo.sources.memory import MemorySource
from vigil.config import Config, PoolConfig, TargetConfig
from vigil.conventions import (
    FILE_ALERT_RULES,
    FILE_SLO_RULES,
    FINISHED_REASON_ERROR,
    GROUP_META_ALERTS,
    HTTP_METHOD_POST,
    KIND_VLLM,
    LABEL_FINISHED_REASON,
    LABEL_HTTP_METHOD,
    LABEL_HTTP_STATUS,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_LE,
    LABEL_MODEL_NAME,
    LABEL_POOL,
    LABEL_SLO,
    METRIC_LAST_EVALUATION,
    SERIES_UP,
    SUFFIX_BUCKET,
    VLLM_E2E,
    VLLM_HTTP_REQUESTS,
    VLLM_KV_CACHE_USAGE,
    VLLM_REQUEST_LATENCY_BUCKETS,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_WAITING,
    VLLM_TTFT,
    VLLM_TTFT_BUCKETS,
)
from vigil.errors import ConfigError
from vigil.model import Labels, Point, labels_of
from vigil.selectors import LabelMatcher, Selector

__all__ = [
    "INPUT_INTERVAL_S",
    "INPUT_STEPS",
    "TRAFFIC",
    "EngineExpectations",
    "InputSeries",
    "PoolLabels",
    "eval_time_for",
    "pool_inputs",
    "pool_labels",
    "promtool_test_document",
    "render_template",
    "selector_labels",
    "series_source",
]

#: One input sample a minute for two hours (121 samples, at 0, 1m, ..., 120m).
INPUT_INTERVAL_S = 60.0
INPUT_STEPS = 120
_ENGINE_LABEL = "engine"


@dataclass(frozen=True)
class Traffic:
    """What the serving replica does every minute, per model (counts per minute, seconds)."""

    finished: Mapping[str, int]
    ttft_s: Sequence[float]
    e2e_s: Sequence[float]
    kv_cache_usage: float
    waiting: int
    #: POST answers by status (``http_requests_total``), per minute, for the whole replica.
    http: Mapping[str, int] = field(default_factory=dict)


TRAFFIC = Traffic(
    finished={"stop": 45, "length": 3, "abort": 1, FINISHED_REASON_ERROR: 1, "repetition": 0},
    ttft_s=(0.05,) * 30 + (0.3,) * 10 + (0.9,) * 6 + (1.5,) * 4,
    e2e_s=(2.0,) * 45 + (6.0,) * 5,
    kv_cache_usage=0.95,
    waiting=7,
    http={"2xx": 49, "5xx": 1},
)
_HANDLER = "/v1/chat/completions"


@dataclass(frozen=True)
class InputSeries:
    """One promtool input series: ``start + step × i`` for i = 0..``INPUT_STEPS`` (minutes)."""

    name: str
    labels: Mapping[str, str]
    start: float
    step: float

    def series(self) -> str:
        inner = ", ".join(f"{k}={promql_string(v)}" for k, v in self.labels.items())
        return f"{self.name}{{{inner}}}"

    def values(self) -> str:
        return f"{_num(self.start)}+{_num(self.step)}x{INPUT_STEPS}"

    def points(self) -> list[Point]:
        # promtool expands "a+bxn" by repeated addition; whole numbers keep that exact.
        out, value = [], float(self.start)
        for i in range(INPUT_STEPS + 1):
            out.append(Point(round(i * INPUT_INTERVAL_S * 1000), value))
            value += self.step
        return out


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _histogram(base: str, labels: Mapping[str, str], bounds: Sequence[float],
               observations: Sequence[float]) -> list[InputSeries]:
    out = []
    for bound in (*bounds, math.inf):
        per_minute = sum(1 for v in observations if v <= bound)
        out.append(InputSeries(base + SUFFIX_BUCKET, {**labels, LABEL_LE: le_label(bound)},
                               0, per_minute))
    return out


def _replica_names(config: Config, pool: PoolConfig) -> tuple[str, str]:
    names = [t.name for t in config.targets if t.pool == pool.name and t.kind == KIND_VLLM]
    serving = names[0] if names else f"{pool.name}-0"
    down = names[1] if len(names) > 1 else f"{pool.name}-1"
    if down == serving:  # pragma: no cover - target names are unique
        down += "-down"
    return serving, down


def _vigil_inputs(config: Config, pool: PoolConfig, specs: Sequence[SloSpec],
                  traffic: Traffic = TRAFFIC) -> list[InputSeries]:
    """The synthetic series of one pool as Vigil's store labels them (``instance``, ``pool``,
    ``kind``)."""
    serving, down = _replica_names(config, pool)
    others = {s.model for s in specs if s.pool == pool.name} - {pool.model}
    models = [pool.model, *sorted(others)]
    series: list[InputSeries] = []
    for instance, up in ((serving, 1.0), (down, 0.0)):
        target = {LABEL_INSTANCE: instance, LABEL_POOL: pool.name, LABEL_KIND: KIND_VLLM}
        series.append(InputSeries(SERIES_UP, target, up, 0))
    target = {LABEL_INSTANCE: serving, LABEL_POOL: pool.name, LABEL_KIND: KIND_VLLM}
    for status, count in traffic.http.items():
        series.append(InputSeries(VLLM_HTTP_REQUESTS, {
            **target, "handler": _HANDLER, LABEL_HTTP_METHOD: HTTP_METHOD_POST,
            LABEL_HTTP_STATUS: status}, 0, count))
    for model in models:
        labels = {**target, _ENGINE_LABEL: "0", LABEL_MODEL_NAME: model}
        series.append(InputSeries(VLLM_KV_CACHE_USAGE, labels, traffic.kv_cache_usage, 0))
        series.append(InputSeries(VLLM_REQUESTS_WAITING, labels, traffic.waiting, 0))
        for reason, count in traffic.finished.items():
            series.append(InputSeries(VLLM_REQUEST_SUCCESS,
                                      {**labels, LABEL_FINISHED_REASON: reason}, 0, count))
        series += _histogram(VLLM_TTFT, labels, VLLM_TTFT_BUCKETS, traffic.ttft_s)
        series += _histogram(VLLM_E2E, labels, VLLM_REQUEST_LATENCY_BUCKETS, traffic.e2e_s)
    return series


# Candidates for a label only `!=` / `!~` constrain, tried in order.
_OTHER_VALUES = ("other", "x", "0", "vigil-test")


# --- strings a regex matches ---------------------------------------------------------------
# Python's ``re`` has no public parser, so ``_RegexReader`` reads a pattern itself, as far as
# spelling strings it matches needs, into the structure ``re``'s own parser gives it (which
# decides the alternatives ``_regex_candidates`` tries one by one): characters, sets, repeats,
# groups and alternations. The pattern is valid (``re.compile`` accepted it), so the reader
# checks nothing. (Before, this module walked the tree of the private ``re._parser``; the two
# gave the same candidates for every one of ~400,000 generated patterns, look-arounds,
# back-references, verbose mode and escapes included.)

#: What a shorthand class spells (``\d`` -> "0"), also inside a set.
_SHORTHANDS = {"d": "0", "D": "a", "w": "a", "W": "-", "s": " ", "S": "a"}
#: One-letter escapes of control characters (``\b`` only inside a set: outside, an anchor).
_CONTROLS = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_OCTAL = "01234567"
_DIGITS = "0123456789"
_SPECIAL = ".\\[{()*+?^$|"
_VERBOSE_SPACE = " \t\n\r\v\f"

#: An atom of a read pattern: a tuple ``("char", code point)``, ``("not", code point)`` (a set
#: of all but one), ``("any",)``, ``("at", anchor)`` or ``("set", members)`` (``("char", c)``,
#: ``("range", lo, hi)``, ``("class", letter)``, led by ``("negate",)`` for ``[^...]``), equal
#: when they are spelled alike in the pattern; or one of the classes below, equal only to
#: itself.
_Atom = Any


@dataclass(eq=False)
class _Repeat:
    low: int  # the fewest repetitions
    body: list[_Atom]


@dataclass(eq=False)
class _Group:
    """A group that stays one atom: capturing, atomic or with flags (``(?:...)`` does not:
    its atoms join the sequence around it, as ``re`` reads it)."""

    atoms: list[_Atom]
    inline: bool = False


@dataclass(eq=False)
class _Branch:
    """Alternatives that ``_alternation`` could not merge."""

    alternatives: list[list[_Atom]]


class _Unspellable:
    """A look-around, a back-reference or a conditional: nothing is spelled past it."""


#: What ``_RegexReader._group`` reads for leading flags (``(?i)``), which make no atom.
_LEADING_FLAGS = ("flags",)


def _alternation(alternatives: list[list[_Atom]]) -> list[_Atom]:
    """``a|b|...`` as ``re`` reads it: an atom that begins every alternative is taken out in
    front (``ab|ac`` -> ``a(?:b|c)``), alternatives that are each one character or set become
    one set (``a|[bc]`` -> ``[abc]``), the rest is a ``_Branch``."""
    if len(alternatives) == 1:
        return alternatives[0]
    rest = [list(a) for a in alternatives]
    out: list[_Atom] = []
    while all(rest) and all(a[0] == rest[0][0] for a in rest):
        out.append(rest[0][0])
        for a in rest:
            del a[0]
    if all(len(a) == 1 and isinstance(a[0], tuple) and (
            a[0][0] == "char" or (a[0][0] == "set" and a[0][1][0] != ("negate",)))
           for a in rest):
        members = [m for a in rest for m in ((a[0],) if a[0][0] == "char" else a[0][1])]
        return [*out, ("set", tuple(dict.fromkeys(members)))]
    return [*out, _Branch(rest)]


class _RegexReader:
    """A valid Python regular expression as atoms (``_Atom``)."""

    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.i = 0
        self.verbose = False  # a leading (?x)

    def read(self) -> list[_Atom]:
        return self._alternation(False, top=True)

    def _peek(self) -> str:
        """The next token: a character, a backslash with the character after it, "" at the end."""
        t, i = self.text, self.i
        return t[i:i + 2] if t[i:i + 1] == "\\" else t[i:i + 1]

    def _take(self) -> str:
        token = self._peek()
        self.i += len(token)
        return token

    def _take_while(self, chars: str, most: int = 1 << 30) -> str:
        start = self.i
        while self.i < len(self.text) and self.i - start < most and self.text[self.i] in chars:
            self.i += 1
        return self.text[start:self.i]

    def _take_until(self, end: str) -> str:
        j = self.text.index(end, self.i)
        text, self.i = self.text[self.i:j], j + 1
        return text

    def _alternation(self, verbose: bool, top: bool = False) -> list[_Atom]:
        alternatives = [self._sequence(verbose)]
        while self._peek() == "|":
            self._take()
            alternatives.append(self._sequence(self.verbose if top else verbose))
        return _alternation(alternatives)

    def _inner(self, verbose: bool) -> list[_Atom]:
        atoms = self._alternation(verbose)
        self._take()  # ")"
        return atoms

    def _sequence(self, verbose: bool) -> list[_Atom]:
        items: list[_Atom] = []
        while (token := self._peek()) and token not in ("|", ")"):
            self._take()
            if verbose and token in _VERBOSE_SPACE:
                continue
            if verbose and token == "#":
                # A verbose pattern's comment runs to the end of its line: skipped whole.
                while self._take() not in ("", "\n"):
                    continue
                continue
            if token[0] == "\\":
                items.append(self._escape(token[1]))
            elif token not in _SPECIAL:
                items.append(("char", ord(token)))
            elif token == "[":
                items.append(self._set())
            elif token in "*+?{":
                low = self._quantifier(token)
                if low is None:  # a "{" that starts no {m,n}
                    items.append(("char", ord("{")))
                    continue
                if self._peek() in ("?", "+"):  # lazy, possessive
                    self._take()
                items[-1] = _Repeat(low, [items[-1]])
            elif token == ".":
                items.append(("any",))
            elif token in "^$":
                items.append(("at", token))
            else:  # "("
                group = self._group(verbose)
                if group is _LEADING_FLAGS:
                    verbose = self.verbose
                elif group is not None:
                    items.append(group)
        return [a for item in items
                for a in (item.atoms if isinstance(item, _Group) and item.inline else (item,))]

    def _quantifier(self, token: str) -> int | None:
        if token != "{":
            return 1 if token == "+" else 0
        if self._peek() == "}":
            return None
        here = self.i
        low = self._take_while(_DIGITS)
        if self._peek() == ",":
            self._take()
            self._take_while(_DIGITS)
        if self._peek() != "}":
            self.i = here
            return None
        self._take()
        return int(low) if low else 0

    def _escape(self, c: str) -> _Atom:
        if c in _SHORTHANDS:
            return ("set", (("class", c),))
        if c in "AbBZ":
            return ("at", c)
        if c == "0":
            return ("char", int(c + self._take_while(_OCTAL, 2), 8))
        if c in _DIGITS:
            if self._peek() and self._peek() in _DIGITS:
                second = self._take()
                if c in _OCTAL and second in _OCTAL and self._peek() and self._peek() in _OCTAL:
                    return ("char", int(c + second + self._take(), 8))
            return _Unspellable()  # a back-reference
        return self._char(c)

    def _char(self, c: str) -> _Atom:
        """The character an escape ``\\c`` (and what follows it) stands for."""
        if c in _CONTROLS:
            return ("char", ord(_CONTROLS[c]))
        if c in _HEX_DIGITS:
            return ("char", int(self._take_while("0123456789abcdefABCDEF", _HEX_DIGITS[c]), 16))
        if c == "N":
            self._take()  # "{"
            return ("char", ord(unicodedata.lookup(self._take_until("}"))))
        return ("char", ord(c))

    def _set(self) -> _Atom:
        negate = self._peek() == "^"
        if negate:
            self._take()
        members: list[_Atom] = []
        while True:
            token = self._take()
            if token == "]" and members:
                break
            first = self._set_member(token)
            if self._peek() != "-":
                members.append(first)
                continue
            self._take()
            token = self._take()
            if token == "]":
                members += [first, ("char", ord("-"))]
                break
            members.append(("range", first[1], self._set_member(token)[1]))
        members = list(dict.fromkeys(members))
        if len(members) == 1 and members[0][0] == "char":
            return ("not", members[0][1]) if negate else members[0]
        return ("set", (("negate",),) * negate + tuple(members))

    def _set_member(self, token: str) -> _Atom:
        if token[0] != "\\":
            return ("char", ord(token))
        c = token[1]
        if c in _SHORTHANDS:
            return ("class", c)
        if c in _OCTAL:
            return ("char", int(c + self._take_while(_OCTAL, 2), 8))
        return self._char(c)

    def _group(self, verbose: bool) -> _Atom | None:
        """What follows a "(": the group, None for a comment, ``_LEADING_FLAGS`` for flags
        that apply to the whole pattern."""
        if self._peek() != "?":
            return _Group(self._inner(verbose))
        self._take()
        kind = self._take()
        if kind == "P":
            if self._take() == "<":
                self._take_until(">")
                return _Group(self._inner(verbose))
            self._take_until(")")  # (?P=name)
            return _Unspellable()
        if kind in (":", ">"):  # non-capturing, atomic
            return _Group(self._inner(verbose), inline=kind == ":")
        if kind == "#":
            # An inline comment, (?#...), matches nothing: skipped to its parenthesis.
            while self._take() != ")":
                continue
            return None
        if kind in ("=", "!", "<"):  # look-ahead, look-behind
            if kind == "<":
                self._take()
            self._inner(verbose)
            return _Unspellable()
        if kind == "(":  # (?(group)yes|no)
            self._take_until(")")
            self._inner(verbose)
            return _Unspellable()
        flags = kind
        while self._peek() not in (":", ")"):
            flags += self._take()
        on, _, off = flags.partition("-")
        if self._take() == ")":  # leading flags, for the whole pattern
            self.verbose = self.verbose or "x" in on
            return _LEADING_FLAGS
        return _Group(self._inner((verbose or "x" in on) and "x" not in off))


def _spell(atoms: Iterable[_Atom]) -> str | None:
    """The shortest string ``atoms`` match, taking the first alternative of each alternation
    and the fewest repetitions of each repeat (an arbitrary character for ``.`` and the
    like); ``None`` past a look-around, back-reference or conditional, or a negated set of
    several characters."""
    out: list[str] = []
    for atom in atoms:
        if isinstance(atom, _Repeat):
            text = _spell(atom.body) if atom.low else ""
        elif isinstance(atom, _Group):
            text = _spell(atom.atoms)
        elif isinstance(atom, _Branch):
            text = _spell(atom.alternatives[0])
        elif isinstance(atom, _Unspellable):
            return None
        elif atom[0] == "char":
            text = chr(atom[1])
        elif atom[0] == "not":
            text = "y" if atom[1] == ord("x") else "x"
        elif atom[0] == "any":
            text = "x"
        elif atom[0] == "set":
            first = atom[1][0]
            if first[0] == "negate":
                return None  # left to the full-match check over _OTHER_VALUES characters
            text = chr(first[1]) if first[0] in ("char", "range") else _SHORTHANDS[first[1]]
        else:  # an anchor spells nothing; a regex matcher is anchored anyway
            text = ""
        if text is None:
            return None
        out.append(text * atom.low if isinstance(atom, _Repeat) else text)
    return "".join(out)


def _regex_candidates(pattern: str) -> list[str]:
    """Strings worth trying against ``pattern``: the shortest string it matches (``_spell``),
    that of each alternative when the pattern is one alternation (as ``re`` reads it:
    ``chat|code``, not ``chat-a|chat-b``, which is ``chat-[ab]``), and the pattern itself with
    its escapes undone (``chat\\.vllm`` -> ``chat.vllm``, ``chat-.*`` -> ``chat-``,
    ``(a|b)-[0-9]+`` -> ``a-0``)."""
    literal = re.sub(r"\\(.)", r"\1", pattern)
    try:
        re.compile(pattern)
    except re.error:
        return [literal]
    atoms = _RegexReader(pattern).read()
    spelled = [_spell(atoms)]
    if len(atoms) == 1 and isinstance(atoms[0], _Branch):
        spelled += [_spell(a) for a in atoms[0].alternatives]
    return [*(s for s in spelled if s is not None), literal]


def _label_value(name: str, matchers: Sequence[LabelMatcher], prefer: Sequence[str] = (),
                 exclude: Sequence[str] = ()) -> str:
    """A non-empty value of label ``name`` that every matcher in ``matchers`` accepts (tried:
    ``prefer``, the ``=`` values, strings of the ``=~`` patterns, other values), not one of
    ``exclude``."""
    candidates: list[str] = [*prefer, *(m.value for m in matchers if m.op == "=")]
    for m in matchers:
        if m.op == "=~":
            candidates += _regex_candidates(m.value)
    candidates += [*(f"{m.value}-other" for m in matchers if m.op == "!="), *_OTHER_VALUES]
    for value in dict.fromkeys(candidates):
        if value and value not in exclude and all(m.matches(value) for m in matchers):
            return value
    rejecting = [m.promql() for m in matchers]
    raise ValueError(f"no label value found for {' and '.join(rejecting)} (tried "
                     f"{', '.join(repr(c) for c in dict.fromkeys(candidates))}); write the "
                     "matcher so that its pattern spelled out literally, or its first "
                     "alternative, matches")


def selector_labels(selector: Selector, skip: Iterable[str] = ()) -> dict[str, str]:
    """Labels (name -> non-empty value) that satisfy every matcher of ``selector``, one per
    label it matches on, except those in ``skip``. ``ValueError`` naming the matcher when no
    value is found (see ``_label_value``)."""
    skipped = set(skip)
    return {name: _label_value(name, [m for m in selector if m.name == name])
            for name in selector.names() if name not in skipped}


@dataclass(frozen=True)
class PoolLabels:
    """How the synthetic series of one pool are labelled in the promtool test.

    Without a selector: as Vigil's store holds them (``relabel`` is the identity). With one:
    ``base`` (labels satisfying the selector) and the replica's name under ``replica_label``,
    instead of ``instance``, ``pool`` and ``kind``."""

    selector: Selector | None = None
    base: Mapping[str, str] = field(default_factory=dict)
    replica_label: str = LABEL_INSTANCE
    #: Vigil's ``instance`` -> the replica's value of ``replica_label``.
    replicas: Mapping[str, str] = field(default_factory=dict)

    def relabel(self, labels: Mapping[str, str]) -> dict[str, str]:
        """``labels`` of a Vigil-labelled series as the test's input series carries them."""
        if self.selector is None:
            return dict(labels)
        own = {k: v for k, v in labels.items() if k not in (LABEL_INSTANCE, LABEL_POOL,
                                                              LABEL_KIND)}
        out = {**self.base, **own}
        instance = labels.get(LABEL_INSTANCE)
        if instance is not None:
            out[self.replica_label] = self.replicas.get(instance, instance)
        return out

    def keeps(self, labels: Mapping[str, str]) -> bool:
        """Whether the relabelled series is one the selector chooses (a selector on a label
        the fleet sets itself, such as ``model_name``, may leave some out)."""
        return self.selector is None or self.selector.matches(labels)


def pool_labels(config: Config, pool: PoolConfig) -> PoolLabels:
    """The ``PoolLabels`` of ``pool``; ``ConfigError`` naming the pool's selector when no
    label set satisfies it."""
    if not pool.has_selector:
        return PoolLabels()
    selector = pool.series(KIND_VLLM, external=True)
    replica = pool.replica_label_for(external=True)
    index = config.pools.index(pool) if pool in config.pools else None
    key = "pools.selector" if index is None else f"pools[{index}].selector"
    try:
        base = selector_labels(selector, skip=(replica,))
        serving, down = _replica_names(config, pool)
        on_replica = [m for m in selector if m.name == replica]
        if on_replica:
            first = _label_value(replica, on_replica, (serving,))
            second = _label_value(replica, on_replica,
                                  (down, *(f"{first}{s}" for s in ("-1", "1", "-b", "b"))),
                                  exclude=(first,))
        else:
            first, second = serving, down
    except ValueError as exc:
        raise ConfigError(f"pool {pool.name!r}: cannot write promtool test series for its "
                          f"selector: {exc}", file=config.source or None, key=key) from None
    return PoolLabels(selector, base, replica, {serving: first, down: second})


def pool_inputs(config: Config, pool: PoolConfig, specs: Sequence[SloSpec],
                traffic: Traffic = TRAFFIC) -> list[InputSeries]:
    """The synthetic series of one pool (see the module docs), labelled as the test feeds
    them to promtool (``pool_labels``)."""
    return _inputs(config, pool, specs, traffic)[0]


def _inputs(config: Config, pool: PoolConfig, specs: Sequence[SloSpec],
            traffic: Traffic = TRAFFIC) -> tuple[list[InputSeries], list[InputSeries],
                                                 PoolLabels]:
    """``(promtool's series, the same as Vigil's store labels them, the labelling)``."""
    labels = pool_labels(config, pool)
    given, vigil = [], []
    for s in _vigil_inputs(config, pool, specs, traffic):
        relabelled = labels.relabel(s.labels)
        if labels.keeps(relabelled):
            given.append(InputSeries(s.name, relabelled, s.start, s.step))
            vigil.append(s)
    return given, vigil, labels


def series_source(series: Iterable[InputSeries], *, semantics: SemanticsLike = "2",
                  lookback_s: float = 300.0) -> MemorySource:
    """The test's input series as a ``Source`` (``slo.sources.memory.MemorySource``): what the
    embedded engine would compute from them."""
    data: dict[str, dict[Labels, list[Point]]] = {}
    for s in series:
        data.setdefault(s.name, {})[labels_of(s.labels)] = s.points()
    return MemorySource(data, semantics=semantics, lookback_s=lookback_s)


def eval_time_for(interval_s: float) -> float:
    """The test's evaluation time (seconds): a multiple of the rule interval (promtool
    evaluates the rules every ``interval_s``), shortly before the last input sample, off the
    one-minute sample grid when the interval allows it."""
    last = INPUT_STEPS * INPUT_INTERVAL_S - INPUT_INTERVAL_S / 2  # 119m30s
    k = math.floor(last / interval_s)
    for candidate in range(k, max(k - 120, 0), -1):
        t = candidate * interval_s
        if t % INPUT_INTERVAL_S and t >= INPUT_INTERVAL_S * 10:
            return t
    return k * interval_s


_TEMPLATE_LABEL = re.compile(r"\{\{ \$labels\.([A-Za-z_][A-Za-z0-9_]*) \}\}")


def render_template(template: str, labels: Mapping[str, str]) -> str:
    """An annotation as Prometheus renders it, for the ``{{ $labels.x }}`` templates the
    rules use (a missing label renders as the empty string, as Go's templates do)."""
    return _TEMPLATE_LABEL.sub(lambda m: labels.get(m.group(1), ""), template)


def _series_text(name: str, labels: Mapping[str, str]) -> str:
    inner = ", ".join(f"{k}={promql_string(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


@dataclass
class EngineExpectations:
    """The embedded engine's answer to each rule of one pool, at one time, from ``source``:
    what a recording rule must record, which alerts an alerting rule must fire. ``labels``:
    how the pool's series are labelled in the test (an alert names the replica as they do)."""

    config: Config
    pool: PoolConfig
    specs: Sequence[SloSpec]
    source: MemorySource
    at_s: float
    labels: PoolLabels = field(default_factory=PoolLabels)

    def recorded(self, rule: Rule) -> list[tuple[dict[str, str], float]]:
        """The samples (labels without the name, value) ``rule`` must record at the
        evaluation time; none where the engine has no number (``None``)."""
        return [(labels, float(v)) for labels, v in self._recorded(rule)
                if v is not None and math.isfinite(v)]

    def _recorded(self, rule: Rule) -> list[tuple[dict[str, str], float | None]]:
        o = rule.origin
        values = engine_value(o, self.config, self.specs, self.source, self.at_s)
        if o.slo:
            return [(dict(rule.labels), values[""])]
        labels = {LABEL_POOL: self.pool.name}
        if o.kind == "quantile":
            return [({**labels, LABEL_MODEL_NAME: model}, value)
                    for model, value in values.items()]
        return [(labels, values[""])]

    def alerts(self, rule: Rule) -> list[dict[str, str]]:
        """The label sets of the alerts ``rule`` must have firing."""
        o = rule.origin
        at, src = self.at_s, self.source
        if o.slo:
            spec = next(s for s in self.specs if s.name == o.slo)
            report = evaluate_slo(spec, src, at, self.config.engine.burn_rate_alerts)
            series = {LABEL_SLO: spec.name, LABEL_POOL: spec.pool, LABEL_MODEL_NAME: spec.model}
            if o.kind == "burn_alert":
                fires = o.severity in report.alerts
            elif o.kind == "budget_low":
                remaining = report.budget_remaining
                fires = remaining is not None and remaining < self.config.alerts.budget_low_ratio
            else:
                raise ValueError(f"no expectation for {o.kind!r}")
            return [{**series, **rule.labels}] if fires else []
        held = at >= rule.for_s  # the fleet's values are constant from time 0
        out = []
        if o.kind == "kv_high":
            matchers = {LABEL_POOL: self.pool.name, LABEL_KIND: KIND_VLLM}
            per_instance: dict[str, list[float]] = {}
            for labels, value in src.instant(VLLM_KV_CACHE_USAGE, matchers, at).items():
                per_instance.setdefault(dict(labels)[LABEL_INSTANCE], []).append(value)
            for instance, values in sorted(per_instance.items()):
                mean = math.fsum(values) / len(values)
                if held and mean > self.config.alerts.kv_usage_high:
                    replica = self.labels.relabel({LABEL_INSTANCE: instance})
                    if self.labels.selector is not None:  # only the replica is kept
                        replica = {self.labels.replica_label: replica[self.labels.replica_label]}
                    out.append({LABEL_POOL: self.pool.name, **replica, **rule.labels})
            return out
        if o.kind == "target_down":
            matchers = {LABEL_POOL: self.pool.name}
            if o.instance:
                matchers[LABEL_INSTANCE] = o.instance
            for labels, value in sorted(src.instant(SERIES_UP, matchers, at).items()):
                if held and value == 0:
                    out.append({**self.labels.relabel(dict(labels)), **rule.labels})
            return out
        raise ValueError(f"no expectation for {o.kind!r}")


def _expectation_config(config: Config, pool: PoolConfig, labels: PoolLabels) -> Config:
    """``config`` as the engine takes it for the test's fleet. Replicas no ``[[targets]]``
    entry lists (a selector's, or those of a pool without targets) are billed by the rules for
    ``Config.unlisted_scrape_interval`` (else ``[collector] scrape_interval``) per sample:
    PromQL has no median spacing. The engine is told so by taking the test's replicas as
    targets scraped at that interval, not the test's one-minute sample spacing."""
    known = {t.name for t in config.targets}
    interval = config.unlisted_scrape_interval(pool)
    extra = [TargetConfig(name=name, url="http://127.0.0.1:1/metrics", pool=pool.name,
                          scrape_interval=interval)
             for name in (labels.replicas or _replica_names(config, pool)) if name not in known]
    if not extra:
        return config
    return config.model_copy(update={"targets": [*config.targets, *extra]})


def _pool_rules(groups: Sequence[RuleGroup], pool: str) -> list[Rule]:
    return [r for g in groups for r in g.rules if r.origin.pool == pool]


def _pool_test(config: Config, pool: PoolConfig, specs: Sequence[SloSpec],
               recording: Sequence[RuleGroup], alerting: Sequence[RuleGroup],
               at_s: float) -> dict[str, Any]:
    pool_specs = [s for s in specs if s.pool == pool.name]
    inputs, vigil_inputs, labels = _inputs(config, pool, pool_specs)
    expect = EngineExpectations(_expectation_config(config, pool, labels), pool, pool_specs,
                                series_source(vigil_inputs), at_s, labels)
    eval_time = prom_duration(at_s)
    expr_tests = []
    for rule in _pool_rules(recording, pool.name):
        slo = rule.origin.slo
        selector = _series_text(rule.record, {LABEL_SLO: slo} if slo else {LABEL_POOL: pool.name})
        samples = [{"labels": _series_text(rule.record, labels), "value": value}
                   for labels, value in expect.recorded(rule)]
        expr_tests.append({"expr": selector, "eval_time": eval_time, "exp_samples": samples})
    by_name: dict[str, list[dict[str, Any]]] = {}
    for rule in _pool_rules(alerting, pool.name):
        bucket = by_name.setdefault(rule.alert, [])
        for labels in expect.alerts(rule):
            bucket.append({
                "exp_labels": dict(sorted(labels.items())),
                "exp_annotations": {k: render_template(v, labels)
                                    for k, v in rule.annotations.items()},
            })
    alert_tests = [{"eval_time": eval_time, "alertname": name, "exp_alerts": alerts}
                   for name, alerts in by_name.items()]
    return {
        "name": f"pool {pool.name}",
        "interval": prom_duration(INPUT_INTERVAL_S),
        "input_series": [{"series": s.series(), "values": s.values()} for s in inputs],
        "promql_expr_test": expr_tests,
        "alert_rule_test": alert_tests,
    }


#: The ``instance`` of the `vigil serve` copies in the dead-man's switch tests.
_SERVE_COPIES = ("vigil-serve-0", "vigil-serve-1")


def _meta_tests(alerting: Sequence[RuleGroup], at_s: float) -> list[dict[str, Any]]:
    """The dead-man's switch, twice: one copy of `vigil serve` stuck beside a live one (no
    page: the live one evaluates), and every copy stuck (a page). The watchdog fires in
    both. A live copy's last evaluation time follows the clock (its value is the sample's
    time); a stuck one's stopped at 0."""
    rules = [r for g in alerting if g.name == GROUP_META_ALERTS for r in g.rules]
    live = f"0+{number(INPUT_INTERVAL_S)}x{INPUT_STEPS - 1}"
    stuck = f"0+0x{INPUT_STEPS - 1}"
    cases = (("one copy of vigil serve stuck, another live", (live, stuck), False),
             ("every copy of vigil serve stuck", (stuck, stuck), True))
    out = []
    for name, values, pages in cases:
        alert_tests = []
        for rule in rules:
            fires = rule.origin.kind == "watchdog" or pages
            alert_tests.append({
                "eval_time": prom_duration(at_s), "alertname": rule.alert,
                "exp_alerts": [{"exp_labels": dict(sorted(rule.labels.items())),
                                "exp_annotations": dict(rule.annotations)}] if fires else [],
            })
        out.append({
            "name": name,
            "interval": prom_duration(INPUT_INTERVAL_S),
            "input_series": [
                {"series": _series_text(METRIC_LAST_EVALUATION, {LABEL_INSTANCE: copy}),
                 "values": v} for copy, v in zip(_SERVE_COPIES, values, strict=True)],
            "alert_rule_test": alert_tests,
        })
    return out


def promtool_test_document(config: Config, specs: Sequence[SloSpec],
                           recording: Sequence[RuleGroup], alerting: Sequence[RuleGroup],
                           interval_s: float) -> dict[str, Any]:
    """The ``promtool test rules`` file: one test group per pool, then the dead-man's
    switch, reading the two rule files from its own folder."""
    at_s = eval_time_for(interval_s)
    return {
        "rule_files": [FILE_SLO_RULES, FILE_ALERT_RULES],
        "evaluation_interval": prom_duration(interval_s),
        "tests": [*(_pool_test(config, pool, specs, recording, alerting, at_s)
                    for pool in config.pools), *_meta_tests(alerting, at_s)],
    }
