"""The report of one comparison of two ``vigil slo status`` documents (Prometheus mode):
``Checker`` collects a failure per key path, the ambiguous paths and how many numbers were
compared; ``structure_differences`` lists key paths or nulls found on one side only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["REL_EPS", "Checker", "key_paths", "masked", "structure_differences"]

#: Float rounding between two evaluations of the same formula (relative).
REL_EPS = 1e-9


# --- comparing two status documents ---------------------------------------------------------
def key_paths(doc: Any, prefix: str = "") -> dict[str, str]:
    """Every key path of a JSON document with the kind of its value (``null``, ``number``,
    ``string``, ``bool``, ``list[n]``, ``object``)."""
    out: dict[str, str] = {}
    if isinstance(doc, Mapping):
        out[prefix or "."] = "object"
        for k, v in doc.items():
            out.update(key_paths(v, f"{prefix}.{k}"))
    elif isinstance(doc, list):
        out[prefix] = f"list[{len(doc)}]"
        for i, v in enumerate(doc):
            out.update(key_paths(v, f"{prefix}[{i}]"))
    elif doc is None:
        out[prefix] = "null"
    elif isinstance(doc, bool):
        out[prefix] = "bool"
    elif isinstance(doc, int | float):
        out[prefix] = "number"
    else:
        out[prefix] = "string"
    return out


def structure_differences(ours: Any, theirs: Any, excused: Iterable[str] = ()) -> list[str]:
    """Key paths present on one side only, or null on one side only (``excused`` prefixes
    aside: values the tolerance found ambiguous)."""
    a, b = key_paths(ours), key_paths(theirs)
    skip = tuple(excused)
    out = []
    for path in sorted(set(a) | set(b)):
        if skip and path.startswith(skip):
            continue
        if path not in a or path not in b:
            out.append(f"{path}: only in {'the store' if path in a else 'Prometheus'}")
        elif (a[path] == "null") != (b[path] == "null") or a[path] != b[path]:
            out.append(f"{path}: {a[path]} from the store, {b[path]} from Prometheus")
    return out


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def masked(text: Any) -> Any:
    """``text`` with every number replaced by ``#`` (non-strings as they are)."""
    return _NUMBER.sub("#", text) if isinstance(text, str) else text


@dataclass
class Checker:
    """Collects the comparisons of one status pair: ``failures`` (one message per key path),
    ``ambiguous`` (paths whose discrete outcome the tolerance cannot decide), ``compared``."""

    failures: list[str] = field(default_factory=list)
    ambiguous: list[str] = field(default_factory=list)
    compared: int = 0
    exact: int = 0

    def same(self, path: str, ours: Any, theirs: Any) -> None:
        """Must be equal (numbers to the last bit)."""
        self.compared += 1
        self.exact += 1
        if ours != theirs:
            self.failures.append(f"{path}: {ours!r} from the store, {theirs!r} from Prometheus "
                                 "(must be equal)")

    def within(self, path: str, ours: Any, theirs: Any, lo: float, hi: float,
               why: str) -> None:
        """``ours`` must lie in ``[lo, hi]`` (widened by float rounding); null on both sides
        passes, null on one side fails."""
        self.compared += 1
        if ours is None or theirs is None:
            if (ours is None) != (theirs is None):
                self.failures.append(f"{path}: {ours!r} from the store, {theirs!r} from "
                                     "Prometheus (null on one side only)")
            return
        lo, hi = min(lo, hi), max(lo, hi)
        # An infinite bound (an interval open on that side) must not widen the other one.
        eps = REL_EPS * max([abs(x) for x in (lo, hi) if math.isfinite(x)] + [1e-12])
        if not lo - eps <= ours <= hi + eps:
            self.failures.append(
                f"{path}: {ours!r} from the store, {theirs!r} from Prometheus; allowed "
                f"[{lo!r}, {hi!r}] ({why})")
