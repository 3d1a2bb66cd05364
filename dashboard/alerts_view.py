"""Firing alerts for the Overview, from the alerting code itself.

Two sources, in this order:

* **`vigil serve`'s last evaluation** (``alerts.notifier.read_status``, what `vigil alerts`
  prints): the alerts that really fire and are being delivered, with when they started and
  their routes. Used when the dashboard shows "now" and the outbox file exists.
* **The conditions evaluated here** (``alerts.conditions.evaluate_conditions`` over the same
  status JSON the page shows): for a pinned time (history, an incident link) or when `vigil
  serve` is not running. These have no start time (one evaluation has no history) and no
  ``TargetDown`` (that needs consecutive scrapes; the Overview lists down targets itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alerts.conditions import ConditionState, evaluate_conditions
from alerts.notifier import read_status
from slo.scaling.signals import kv_usage_of_fleet
from slo.sources.protocol import Source
from vigil.config import Config
from vigil.conventions import (
    ANNOTATION_SUMMARY,
    LABEL_ALERTNAME,
    LABEL_INSTANCE,
    LABEL_MODEL,
    LABEL_POOL,
    LABEL_SEVERITY,
    LABEL_SLO,
    SEVERITY_PAGE,
)

__all__ = ["FROM_CONDITIONS", "FROM_SERVE", "alert_rows", "evaluated_alerts", "served_alerts"]

FROM_SERVE = "vigil serve"
FROM_CONDITIONS = "evaluated here"


def _row(alert: Mapping[str, Any], origin: str) -> dict[str, Any]:
    labels = alert.get("labels") or {}
    annotations = alert.get("annotations") or {}
    subject = labels.get(LABEL_SLO) or labels.get(LABEL_INSTANCE) or labels.get(LABEL_MODEL, "")
    return {
        "severity": labels.get(LABEL_SEVERITY, ""),
        "alert": labels.get(LABEL_ALERTNAME, ""),
        "pool": labels.get(LABEL_POOL, ""),
        "subject": subject,
        "summary": annotations.get(ANNOTATION_SUMMARY, ""),
        "since": alert.get("starts_at") if origin == FROM_SERVE else None,
        "routes": ", ".join(alert.get("routes") or []),
        "origin": origin,
    }


def alert_rows(alerts: list[Mapping[str, Any]], origin: str) -> list[dict[str, Any]]:
    """One table row per firing alert (``Alert.as_dict()`` shape), pages first."""
    rows = [_row(a, origin) for a in alerts if a.get("ends_at") is None]
    return sorted(rows, key=lambda r: (r["severity"] != SEVERITY_PAGE, r["pool"], r["alert"],
                                       r["subject"]))


def served_alerts(outbox_path: Path, now_s: float) -> list[dict[str, Any]] | None:
    """The alerts of `vigil serve`'s last evaluation, or ``None`` when it never ran here (no
    outbox file: nothing is created)."""
    if not outbox_path.exists():
        return None
    return alert_rows(read_status(outbox_path, now_s)["firing"], FROM_SERVE)


def evaluated_alerts(config: Config, status: Mapping[str, Any], source: Source, at_s: float
                     ) -> list[dict[str, Any]]:
    """The alert conditions of `vigil serve` evaluated once over ``status`` at ``at_s``, with
    each replica's KV-cache usage read as `vigil serve` reads it (through the pool's selector
    in a Prometheus, ``slo.scaling.signals.kv_usage_of_fleet``)."""
    kv = kv_usage_of_fleet(config, source, at_s)
    alerts, _ = evaluate_conditions(config, status, [], ConditionState(), at_s, kv_usage=kv,
                                    down_streaks={})
    return alert_rows([a.as_dict() for a in alerts], FROM_CONDITIONS)
