"""The status JSON (``slo.status.evaluate``) shaped for the Overview's tiles, and the filters.

Pure functions over the dict the engine returned: no number is recomputed here, only picked,
labelled and filtered. ``target_states`` is the one function that asks the source (the ``up``
series of every configured target).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.format import duration, percent, seconds
from slo.source import Source
from vigil.config import Config
from vigil.conventions import (
    ENDPOINT_ALL,
    INDICATOR_REPLICA_UP,
    LABEL_INSTANCE,
    SERIES_UP,
    SEVERITY_PAGE,
    SEVERITY_TICKET,
)

__all__ = [
    "STATE_NO_DATA",
    "STATE_OK",
    "ScalingView",
    "TargetState",
    "filter_slos",
    "scaling_view",
    "slo_goal",
    "slo_state",
    "target_states",
]

STATE_OK = "ok"
STATE_NO_DATA = "no data"
#: Badge colour of each SLO state (Streamlit's palette names).
STATE_COLORS = {SEVERITY_PAGE: "red", SEVERITY_TICKET: "orange", STATE_OK: "green",
                STATE_NO_DATA: "gray"}
#: Badge colour of each scaling action.
ACTION_COLORS = {"scale_out": "orange", "scale_in": "blue", "hold": "green"}


def slo_state(slo: Mapping[str, Any]) -> str:
    """``"page"`` or ``"ticket"`` when a burn-rate alert of that severity fires (page wins),
    else ``"ok"`` when any window has data, else ``"no data"``."""
    alerts = slo.get("alerts") or []
    if SEVERITY_PAGE in alerts:
        return SEVERITY_PAGE
    if SEVERITY_TICKET in alerts:
        return SEVERITY_TICKET
    windows = slo.get("windows") or {}
    has_data = slo.get("sli") is not None or any(
        (w or {}).get("error_ratio") is not None for w in windows.values())
    return STATE_OK if has_data else STATE_NO_DATA


def filter_slos(slos: Iterable[Mapping[str, Any]], *, pools: Sequence[str] = (),
                models: Sequence[str] = (), endpoint: str = "") -> list[Mapping[str, Any]]:
    """The status JSON's ``slos[]`` kept by pool, model and endpoint (an empty filter keeps
    everything; ``endpoint`` ``"all"`` or ``""`` keeps every endpoint)."""
    out = []
    for s in slos:
        if pools and s.get("pool") not in pools:
            continue
        if models and s.get("model") not in models:
            continue
        if endpoint and endpoint != ENDPOINT_ALL and s.get("endpoint") != endpoint:
            continue
        out.append(s)
    return out


@dataclass(frozen=True)
class ScalingView:
    """A pool's scaling recommendation, ready to print: ``action`` (``scale_out`` /
    ``scale_in`` / ``hold``), ``current`` and ``desired`` replicas, ``reasons`` (the engine's
    texts, values included), ``next_decision`` ("now" or "in 2m50s") and its time."""

    action: str
    current: int | None
    desired: int | None
    reasons: list[str]
    next_decision: str
    next_decision_at: float | None

    @property
    def change(self) -> int | None:
        """Replicas to add (positive) or remove (negative); ``None`` when unknown."""
        if self.current is None or self.desired is None:
            return None
        return self.desired - self.current


def scaling_view(scaling: Mapping[str, Any] | None, now_s: float) -> ScalingView | None:
    """The ``pools.<pool>.scaling`` block as a ``ScalingView``; ``None`` when the engine gave
    none (``slo.signals`` absent)."""
    if not scaling:
        return None
    at = scaling.get("next_decision_at")
    if at is None:
        nxt = "unknown"
    elif at <= now_s + 0.5:  # half a second: the engine says "now" as the evaluation time
        nxt = "now"
    else:
        nxt = f"in {duration(at - now_s)}"
    return ScalingView(
        action=str(scaling.get("action", "hold")),
        current=scaling.get("current"),
        desired=scaling.get("desired"),
        reasons=[str(r) for r in scaling.get("reasons") or []],
        next_decision=nxt,
        next_decision_at=at,
    )


@dataclass(frozen=True)
class TargetState:
    """One configured target at the evaluation time: ``state`` is ``"up"``, ``"down"`` (its
    latest ``up`` sample is 0) or ``"no data"`` (no ``up`` sample within the lookback: never
    scraped, or the collector is not running)."""

    name: str
    pool: str
    kind: str
    url: str
    state: str


def target_states(config: Config, source: Source, at_s: float) -> list[TargetState]:
    """Every configured target's state from the ``up`` series (one instant query)."""
    latest: dict[str, float] = {}
    for labels, value in source.instant(SERIES_UP, {}, at_s).items():
        name = dict(labels).get(LABEL_INSTANCE, "")
        if name and not math.isnan(value):
            latest[name] = min(value, latest.get(name, value))
    out = []
    for t in config.targets:
        v = latest.get(t.name)
        state = STATE_NO_DATA if v is None else ("up" if v == 1.0 else "down")
        out.append(TargetState(t.name, t.pool, t.kind, t.url, state))
    return out


def slo_goal(slo: Mapping[str, Any]) -> str:
    """The SLO in words: ``"TTFT ≤ 800 ms for 95.00% of requests"``."""
    objective = slo.get("objective")
    threshold = slo.get("threshold_seconds")
    endpoint = slo.get("endpoint")
    where = "" if endpoint in (None, ENDPOINT_ALL) else f" ({endpoint})"
    indicator = slo.get("indicator")
    if indicator == "ttft":
        text = f"TTFT ≤ {seconds(threshold)} for {percent(objective, 2)} of requests"
    elif indicator == "e2e":
        text = f"end-to-end ≤ {seconds(threshold)} for {percent(objective, 2)} of requests"
    elif indicator == "error_rate":
        budget = None if objective is None else 1.0 - objective
        text = f"errors ≤ {percent(budget, 2)} of requests"
    elif indicator == "availability":
        text = f"no server error for {percent(objective, 2)} of requests"
    elif indicator == INDICATOR_REPLICA_UP:
        text = f"replicas up {percent(objective, 2)} of the time"
    else:
        text = str(indicator)
    return text + where
