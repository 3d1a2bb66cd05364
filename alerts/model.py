"""Alerts and notifications: the values that grouping produces and the outbox stores.

An ``Alert`` is identified by its label set; its ``fingerprint`` is the one Alertmanager
computes (``model.LabelSet.Fingerprint`` in prometheus/common: FNV-1a 64 over the labels
sorted by name, each name and value followed by the byte 0xff, printed as 16 hex digits), so
the fingerprints Vigil sends equal the ones Alertmanager shows for the same alert.

Times are Unix seconds (float) everywhere; renderers turn them into RFC 3339.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from vigil.conventions import ALERT_FIRING, ALERT_RESOLVED, LABEL_ALERTNAME

__all__ = [
    "Alert",
    "Notification",
    "alert_sort_key",
    "common_items",
    "fingerprint",
    "fingerprint_int",
    "labelset_string",
]

# FNV-1a 64 parameters (hash/fnv in Go) and Prometheus's separator byte.
_FNV_OFFSET64 = 14695981039346656037
_FNV_PRIME64 = 1099511628211
_MASK64 = (1 << 64) - 1
_SEPARATOR = 0xFF

#: Alertmanager 0.25 (like Prometheus before 3.0) accepts only these label names.
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def fingerprint_int(labels: Mapping[str, str]) -> int:
    """Alertmanager's fingerprint of a label set as an unsigned 64-bit integer."""
    h = _FNV_OFFSET64
    # Go sorts label names byte-wise; for valid UTF-8 str that equals code-point order.
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode("utf-8"):
                h = ((h ^ byte) * _FNV_PRIME64) & _MASK64
            h = ((h ^ _SEPARATOR) * _FNV_PRIME64) & _MASK64
    return h


def fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's fingerprint of a label set: 16 lower-case hex digits."""
    return f"{fingerprint_int(labels):016x}"


def _go_quote(value: str) -> str:
    # Go's %q for the printable strings labels hold: backslash, quote and newline escaped.
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def labelset_string(labels: Mapping[str, str]) -> str:
    """``model.LabelSet.String()``: ``{a="1", b="2"}``, names sorted, ", " between pairs."""
    return "{" + ", ".join(f"{k}={_go_quote(labels[k])}" for k in sorted(labels)) + "}"


def _frozen(mapping: Mapping[str, str] | Iterable[tuple[str, str]]) -> Mapping[str, str]:
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    # An empty value means "no such label" in Prometheus and Alertmanager.
    return MappingProxyType({str(k): str(v) for k, v in sorted(items) if v != ""})


@dataclass(frozen=True)
class Alert:
    """One alert: identity (labels), human text (annotations) and its active interval.

    ``starts_at`` and ``ends_at`` are Unix seconds; ``ends_at`` is None while the alert
    fires. The mappings are copied and made read-only, so an ``Alert`` can be shared.
    """

    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    starts_at: float = 0.0
    ends_at: float | None = None
    generator_url: str = ""

    def __post_init__(self) -> None:
        labels = _frozen(self.labels)
        if not labels:
            raise ValueError("an alert needs at least one label (alertname)")
        for name in labels:
            if not _LABEL_NAME.match(name):
                raise ValueError(f"invalid label name {name!r} (Alertmanager rejects it)")
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "annotations", _frozen(self.annotations))
        object.__setattr__(self, "starts_at", float(self.starts_at))
        if self.ends_at is not None:
            object.__setattr__(self, "ends_at", float(self.ends_at))

    def __hash__(self) -> int:
        return hash((self.fingerprint, self.starts_at, self.ends_at))

    # Immutable: copies are the object itself (and read-only mappings cannot be deep-copied).
    def __copy__(self) -> Alert:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Alert:
        return self

    @functools.cached_property
    def fingerprint(self) -> str:
        """Alertmanager's fingerprint of the labels (16 hex digits)."""
        return fingerprint(self.labels)

    @property
    def name(self) -> str:
        """The ``alertname`` label ("" when absent)."""
        return self.labels.get(LABEL_ALERTNAME, "")

    @property
    def status(self) -> str:
        """``"firing"`` while ``ends_at`` is None, else ``"resolved"``."""
        return ALERT_FIRING if self.ends_at is None else ALERT_RESOLVED

    @property
    def firing(self) -> bool:
        return self.ends_at is None

    def resolved_at(self, when: float) -> Alert:
        """This alert, resolved at ``when`` (Unix seconds); never before it started."""
        return replace(self, ends_at=max(float(when), self.starts_at))

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dict (times as Unix seconds) for listings such as ``vigil alerts``."""
        return {
            "fingerprint": self.fingerprint,
            "status": self.status,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "generator_url": self.generator_url,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Alert:
        """The inverse of ``as_dict``."""
        ends = data.get("ends_at")
        return cls(
            labels=dict(data["labels"]),  # type: ignore[call-overload]
            annotations=dict(data.get("annotations") or {}),  # type: ignore[call-overload]
            starts_at=float(data.get("starts_at") or 0.0),  # type: ignore[arg-type]
            ends_at=None if ends is None else float(ends),  # type: ignore[arg-type]
            generator_url=str(data.get("generator_url") or ""),
        )


def _labels_before(a: Mapping[str, str], b: Mapping[str, str]) -> int:
    # prometheus/common model.LabelSet.Before as a cmp function: fewer labels first, then the
    # first differing label (in name order) decides; a missing name sorts first.
    if len(a) != len(b):
        return -1 if len(a) < len(b) else 1
    for name in sorted(set(a) | set(b)):
        if name not in a:
            return -1
        if name not in b:
            return 1
        if a[name] != b[name]:
            return -1 if a[name] < b[name] else 1
    return 0


def _alert_cmp(x: Alert, y: Alert) -> int:
    # types.AlertSlice.Less in Alertmanager: `job`, then `instance`, then the label sets.
    for key in ("job", "instance"):
        xv, yv = x.labels.get(key), y.labels.get(key)
        if xv is None and yv is None:
            continue
        if xv is None:
            return 1
        if yv is None:
            return -1
        if xv != yv:
            return -1 if xv < yv else 1
    return _labels_before(x.labels, y.labels)


#: Sort alerts in the order Alertmanager lists them in a notification.
alert_sort_key = functools.cmp_to_key(_alert_cmp)


def common_items(maps: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The pairs present with the same value in every mapping (Alertmanager's commonLabels)."""
    maps = list(maps)
    if not maps:
        return {}
    first = maps[0]
    return {
        k: v for k, v in sorted(first.items()) if all(m.get(k) == v for m in maps[1:])
    }


@dataclass(frozen=True)
class Notification:
    """One message to one route: the state of one aggregation group at ``created_at``.

    ``route`` is the route's name (Alertmanager's receiver), ``group_key`` the aggregation
    group's key (``{}/{severity="page"}:{alertname="X", pool="p"}``), ``reason`` why it was
    sent: ``first``, ``new_alerts``, ``resolved``, ``all_resolved``, ``repeat`` or
    ``snapshot``. A ``snapshot`` notification carries the whole state of its stream, so a
    newer one makes older undelivered ones useless (the ``alertmanager_api`` format).
    """

    route: str
    group_key: str
    group_labels: Mapping[str, str]
    alerts: tuple[Alert, ...]
    created_at: float
    reason: str
    snapshot: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "group_labels", MappingProxyType(dict(self.group_labels)))
        object.__setattr__(self, "alerts", tuple(sorted(self.alerts, key=alert_sort_key)))

    @property
    def status(self) -> str:
        """``"firing"`` when at least one alert fires, else ``"resolved"``."""
        return ALERT_FIRING if any(a.firing for a in self.alerts) else ALERT_RESOLVED

    @property
    def firing(self) -> tuple[Alert, ...]:
        return tuple(a for a in self.alerts if a.firing)

    @property
    def resolved(self) -> tuple[Alert, ...]:
        return tuple(a for a in self.alerts if not a.firing)

    @property
    def common_labels(self) -> dict[str, str]:
        return common_items(a.labels for a in self.alerts)

    @property
    def common_annotations(self) -> dict[str, str]:
        return common_items(a.annotations for a in self.alerts)
