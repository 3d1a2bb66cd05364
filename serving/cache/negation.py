"""The negation guard: two texts whose polarity differs must never share an answer.

Sentence embeddings barely see polarity: all-MiniLM-L6-v2 gives "turn on the light" / "turn
off the light" 0.86, "Is it safe to drink?" / "Is it not safe to drink?" 0.975 and "before
meals" / "after meals" 0.953, so a 0.95 threshold alone serves the opposite answer. Before a
semantic hit is served, the query and the candidate must have the same *polarity signature*:

* the number of negation cues (not, no, never, n't, without, except, ...);
* the same set of polar words, each mapped to an (axis, sign): on/enable/start are
  ``(active, +)``, off/disable/stop ``(active, -)``; before/after, increase/decrease,
  open/close, add/remove, allow/deny, login/logout, ...;
* the same numbers in the same order ("2+2" vs "2+3", "3 < 5" vs "5 < 3"; number words
  two..ninety count as digits);
* no word of one text that is the other's word with a negating prefix (lock/unlock,
  install/uninstall, legal/illegal, able/unable, ...).

The check is deliberately strict: any difference is a miss. A false miss costs one GPU request;
a false hit serves the wrong answer. Known limits: word order is not compared ("open the door
and close the window" vs the reverse), nor are antonyms outside the table.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Polarity", "conflict", "polarity"]

#: Negation cues (after contractions are split: "don't" -> "do", "not").
_NEGATIONS = frozenset({
    "not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor",
    "without", "except", "excluding", "cannot",
})
#: Contractions typed without the apostrophe ("dont", "isnt").
_BARE_NEGATED = frozenset({
    "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "cant", "couldnt",
    "wouldnt", "shouldnt", "wont", "havent", "hasnt", "hadnt", "aint", "mustnt", "neednt",
    "shant",
})

# Axis -> (positive words, negative words). A trailing "*" adds verb inflections (enables,
# enabled, enabling). Each word belongs to one axis only; the sign is arbitrary but fixed.
_AXES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "active": (("on", "enable*", "activate*", "start*", "begin", "begins", "beginning",
                "launch*", "boot*"),
               ("off", "disable*", "deactivate*", "stop*", "end*", "halt*", "terminate*",
                "finish*", "quit*", "shutdown")),
    "open": (("open*", "unlock*", "unblock*"), ("close*", "shut", "shuts", "lock*", "block*")),
    "amount": (("increase*", "raise*", "grow*", "grew", "grown", "more", "higher", "highest",
                "greater", "greatest", "larger", "largest", "bigger", "biggest", "maximum",
                "max", "maximize*", "maximise*", "most", "above", "over", "up", "upgrade*",
                "expand*", "extend*", "boost*", "faster", "fastest"),
               ("decrease*", "reduce*", "shrink*", "shrank", "lower*", "less", "fewer",
                "smaller", "smallest", "minimum", "min", "minimize*", "minimise*", "least",
                "below", "under", "down", "downgrade*", "slower", "slowest", "shorten*")),
    "membership": (("add*", "include*", "insert*", "attach*", "append*", "create*",
                    "install*", "subscribe*", "join*"),
                   ("remove*", "exclude*", "delete*", "detach*", "drop*", "uninstall*",
                    "unsubscribe*", "leave", "leaves", "leaving", "destroy*")),
    "time": (("before", "earlier", "earliest", "prior", "previous"),
             ("after", "later", "latest", "next", "afterwards")),
    "order": (("first",), ("last", "final")),
    "permission": (("allow*", "permit*", "accept*", "approve*", "grant*", "unban*"),
                   ("deny*", "forbid", "forbids", "forbidden", "prohibit*", "reject*",
                    "refuse*", "decline*", "ban*", "revoke*")),
    "session": (("login", "signin", "logon", "checkin", "optin"),
                ("logout", "signout", "logoff", "checkout", "optout")),
    "direction": (("import*", "upload*", "push*", "send*", "sent", "input*", "inbound",
                   "buy*", "bought", "purchase*", "encrypt*", "compress*", "connect*",
                   "mount*", "mute*", "pin*", "archive*", "zip*"),
                  ("export*", "download*", "pull*", "receive*", "output*", "outbound",
                   "sell*", "sold", "decrypt*", "decompress*", "disconnect*", "unmount*",
                   "unmute*", "unpin*", "unarchive*", "unzip*")),
    # Not "show"/"display": "show me how to ..." is a common way to ask anything.
    "visible": (("visible", "reveal*", "unhide*"),
                ("hide*", "hid", "hidden", "invisible", "conceal*")),
    "truth": (("true", "correct", "right", "valid", "accurate"),
              ("false", "incorrect", "wrong", "invalid", "inaccurate")),
    "possible": (("possible", "able", "available", "legal", "safe", "safely"),
                 ("impossible", "unable", "unavailable", "illegal", "unsafe", "dangerous",
                  "harmful")),
    "outcome": (("succeed*", "success", "successful", "successfully", "pass*", "win*", "won"),
                ("fail*", "failure", "lose", "loses", "losing", "lost", "loss")),
    "quality": (("good", "better", "best", "positive", "pro", "pros", "advantage",
                 "advantages", "benefit", "benefits"),
                ("bad", "worse", "worst", "negative", "con", "cons", "disadvantage",
                 "disadvantages", "drawback", "drawbacks")),
    "sameness": (("same", "similar", "identical", "equal"),
                 ("different", "differ", "differs", "distinct", "unequal")),
    "price": (("cheap", "cheaper", "cheapest", "free"),
              ("expensive", "costly", "paid")),
    "temperature": (("hot", "hotter", "warm", "warmer", "heat*"),
                    ("cold", "colder", "cool", "cooler", "freeze*", "frozen")),
    "undo": (("undo*",), ("redo*",)),
}

#: "log in", "sign out", "opt in", "check out", "shut down", "start up": one polar token.
_PARTICLE_VERBS = {
    "log": "log", "logs": "log", "logged": "log", "logging": "log",
    "sign": "sign", "signs": "sign", "signed": "sign", "signing": "sign",
    "opt": "opt", "opts": "opt", "opted": "opt", "opting": "opt",
    "check": "check", "checks": "check", "checked": "check", "checking": "check",
}
_PARTICLES = {"in": "in", "on": "in", "out": "out", "off": "out"}
_SESSION_TOKENS = {("log", "in"): "login", ("log", "out"): "logout", ("sign", "in"): "signin",
                   ("sign", "out"): "signout", ("opt", "in"): "optin", ("opt", "out"): "optout",
                   ("check", "in"): "checkin", ("check", "out"): "checkout"}
_SHUT_DOWN = {("shut", "down"), ("shuts", "down"), ("shutting", "down")}

#: Prefixes that negate a word: w in one text, prefix+w in the other is a conflict.
_NEGATING_PREFIXES = ("un", "dis", "non", "in", "im", "il", "ir", "de", "anti", "mis")

_NUMBER_WORDS = {
    "zero": "0", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "thirteen": "13", "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17",
    "eighteen": "18", "nineteen": "19", "twenty": "20", "thirty": "30", "forty": "40",
    "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90",
}  # "one" is left out: it is a pronoun far more often than a number ("which one ...").

_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+(?:[.,]\d+)*")
_THOUSANDS = re.compile(r"^\d{1,3}(?:,\d{3})+$")
_IRREGULAR_NT = {"can't": "can", "won't": "will", "shan't": "shall", "ain't": "am"}


def _inflections(word: str) -> Iterable[str]:
    """Regular verb forms of ``word``; over-generation is harmless (non-words never occur)."""
    yield word
    yield word + "s"
    yield word + "es"
    if word.endswith("e"):
        yield word + "d"
        yield word[:-1] + "ing"
    else:
        yield word + "ed"
        yield word + "ing"
        yield word + word[-1] + "ed"  # stop -> stopped
        yield word + word[-1] + "ing"
    if word.endswith("y"):
        yield word[:-1] + "ies"
        yield word[:-1] + "ied"


def _build_polar_words() -> dict[str, tuple[str, int]]:
    table: dict[str, tuple[str, int]] = {}
    for axis, (positive, negative) in _AXES.items():
        for sign, words in ((1, positive), (-1, negative)):
            for entry in words:
                forms = _inflections(entry[:-1]) if entry.endswith("*") else (entry,)
                for form in forms:
                    # First writer wins: an explicit word keeps its axis over a generated form.
                    table.setdefault(form, (axis, sign))
    return table


_POLAR_WORDS = _build_polar_words()


@dataclass(frozen=True, slots=True)
class Polarity:
    """The polarity signature of a text (see the module docstring)."""

    negations: int
    #: (axis, +1 | -1) of every polar word present.
    polar: frozenset[tuple[str, int]]
    #: Numbers in order of appearance, as digit strings.
    numbers: tuple[str, ...]
    #: Every word, for the negating-prefix check.
    words: frozenset[str]


def _tokens(text: str) -> list[str]:
    """Lower-case words with contractions split ("don't" -> "do", "not")."""
    text = unicodedata.normalize("NFKC", text).casefold().replace("\u2019", "'")
    out: list[str] = []
    for tok in _TOKEN.findall(text):
        if "'" in tok:
            if tok in _IRREGULAR_NT:
                out += [_IRREGULAR_NT[tok], "not"]
            elif tok.endswith("n't"):
                out += [tok[:-3], "not"]
            else:  # user's, we're, it'll: the clitic carries no polarity
                out.append(tok.split("'", 1)[0])
        elif tok == "cannot":
            out += ["can", "not"]
        elif tok in _BARE_NEGATED:
            out += [tok[:-2] if tok != "cant" else "can", "not"]
        else:
            out.append(tok)
    return out


def polarity(text: str) -> Polarity:
    """The polarity signature of ``text``."""
    tokens = _tokens(text)
    negations = 0
    polar: set[tuple[str, int]] = set()
    numbers: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if tok in _PARTICLE_VERBS and nxt in _PARTICLES:
            # "log in" is one polar token; its particle must not also count as "on"/"off".
            polar.add(_POLAR_WORDS[_SESSION_TOKENS[(_PARTICLE_VERBS[tok], _PARTICLES[nxt])]])
            i += 2
            continue
        if (tok, nxt) in _SHUT_DOWN:
            polar.add(("active", -1))
            i += 2
            continue
        if tok in _NEGATIONS:
            negations += 1
        elif tok[0].isdigit():
            numbers.append(tok.replace(",", "") if _THOUSANDS.match(tok) else tok)
        elif tok in _NUMBER_WORDS:
            numbers.append(_NUMBER_WORDS[tok])
        elif tok in _POLAR_WORDS:
            polar.add(_POLAR_WORDS[tok])
        i += 1
    return Polarity(negations=negations, polar=frozenset(polar), numbers=tuple(numbers),
                    words=frozenset(tokens))


def _prefixed(a: frozenset[str], b: frozenset[str]) -> str | None:
    for word in a:
        if len(word) < 3:
            continue
        for prefix in _NEGATING_PREFIXES:
            if prefix + word in b:
                return f"{word}/{prefix}{word}"
    return None


def conflict(a: Polarity, b: Polarity) -> str | None:
    """Why ``a`` and ``b`` may not share an answer (``negation``, ``antonym``, ``number``,
    ``prefix: lock/unlock``), or None when their polarity agrees."""
    if a.negations != b.negations:
        return "negation"
    if a.numbers != b.numbers:
        return "number"
    if a.polar != b.polar:
        return "antonym"
    pair = _prefixed(a.words, b.words) or _prefixed(b.words, a.words)
    return f"prefix: {pair}" if pair else None
