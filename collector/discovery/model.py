"""The data model of target discovery: target groups as Prometheus's discovery formats write
them, the targets they become, and the changes between two reads.

A *target group* is Prometheus's ``static_config`` shape, shared by file_sd and http_sd (and
built by the DNS source): ``{"targets": ["host:port", ...], "labels": {"name": "value"}}``.
``parse_groups`` validates a decoded JSON or YAML document into groups and says which group of
which source broke, so that one bad group does not hide the others' problem.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Protocol

from vigil.config import DiscoveryConfig, TargetConfig
from vigil.errors import VigilError

__all__ = [
    "ORIGIN_STATIC",
    "DiscoveredTarget",
    "DiscoveryError",
    "Source",
    "TargetChanges",
    "TargetGroup",
    "parse_groups",
]

#: The origin of a ``[[targets]]`` entry.
ORIGIN_STATIC = "static"

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class DiscoveryError(VigilError):
    """A discovery source could not be read (the previous targets of that source are kept).

    ``source`` names the source as ``vigil targets`` shows it: ``file_sd chat-k8s (a.json)``.
    """

    def __init__(self, message: str, *, source: str):
        self.source = source
        self.reason = message
        super().__init__(f"{source}: {message}")


class TargetGroup(NamedTuple):
    """One group: addresses (``host:port``) sharing a label set (sorted name/value pairs,
    ``__``-prefixed ones included: they are the source's internal metadata)."""

    targets: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()

    def label(self, name: str) -> str | None:
        """The value of label ``name``, or None when the group does not set it."""
        for k, v in self.labels:
            if k == name:
                return v
        return None


class DiscoveredTarget(NamedTuple):
    """A target to scrape and where it came from.

    ``target.name`` is unique and stable: the address (``host:port``, Prometheus's
    ``instance``) or the group's ``instance`` label, disambiguated only on a clash;
    ``target.labels`` are the group's labels minus the ``__``-prefixed ones, the pool label
    and ``kind``. ``origin`` is ``"static"`` for a ``[[targets]]`` entry, else the mechanism,
    the ``[[discovery]]`` name and the file, URL or DNS query: ``file_sd chat-k8s (a.json)``.
    """

    target: TargetConfig
    origin: str

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def static(self) -> bool:
        return self.origin == ORIGIN_STATIC


class TargetChanges(NamedTuple):
    """What one refresh changed. ``changed`` holds targets whose name stayed but whose URL,
    pool, kind, labels or intervals did not (their new version): for their series that is
    an end and a start, for a load balancer an update."""

    added: tuple[DiscoveredTarget, ...] = ()
    removed: tuple[DiscoveredTarget, ...] = ()
    changed: tuple[DiscoveredTarget, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


class Source(Protocol):
    """One ``[[discovery]]`` entry being read: file_sd, http_sd or DNS.

    ``groups`` maps what was read (a file as the config spells it, the URL, a DNS query) to
    its groups; ``read`` replaces an entry only when it read it successfully, so a failed
    read keeps the previous targets. ``problems`` are the last read's errors ([] = ok).
    """

    config: DiscoveryConfig
    groups: dict[str, list[TargetGroup]]
    problems: list[str]

    async def read(self) -> None:
        """Read the source once, updating ``groups`` and ``problems``; never raises."""
        ...


def parse_groups(doc: Any, *, where: str) -> list[TargetGroup]:
    """Validate a decoded document as a list of target groups.

    ``where`` names the source in messages. Raises ``DiscoveryError`` for the first problem:
    a document that is not a list, a group that is not an object or has unknown keys,
    ``targets`` that are not strings, label names that are not valid or values that are not
    strings. An empty list is valid (no targets), as in Prometheus.
    """
    if not isinstance(doc, list):
        raise DiscoveryError(
            f"expected a list of target groups ([{{\"targets\": [...], \"labels\": {{...}}}}]), "
            f"got {_kind(doc)}", source=where)
    groups: list[TargetGroup] = []
    for i, g in enumerate(doc):
        at = f"group {i + 1}"
        if not isinstance(g, dict):
            raise DiscoveryError(f"{at}: expected an object with targets and labels, "
                                 f"got {_kind(g)}", source=where)
        unknown = sorted(set(g) - {"targets", "labels"})
        if unknown:
            raise DiscoveryError(f"{at}: unknown key {unknown[0]!r} (a group has targets "
                                 "and labels)", source=where)
        targets = g.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise DiscoveryError(f"{at}: 'targets' must be a list of \"host:port\" strings, "
                                 f"got {_kind(targets)}", source=where)
        labels = g.get("labels") or {}
        if not isinstance(labels, dict):
            raise DiscoveryError(f"{at}: 'labels' must be an object of strings, "
                                 f"got {_kind(labels)}", source=where)
        for k, v in labels.items():
            if not isinstance(k, str) or not _LABEL_NAME.fullmatch(k):
                raise DiscoveryError(f"{at}: {k!r} is not a valid label name", source=where)
            if not isinstance(v, str):
                raise DiscoveryError(f"{at}: label {k!r} must be a string, got {_kind(v)}",
                                     source=where)
        groups.append(TargetGroup(tuple(targets), tuple(sorted(labels.items()))))
    return groups


def _kind(v: Any) -> str:
    if v is None:
        return "nothing"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(v), type(v).__name__)
