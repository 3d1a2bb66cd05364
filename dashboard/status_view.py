"""The status JSON (``slo.status.evaluate``) shaped for the Overview's tiles, and the filters.

Pure functions over the dict the engine returned: no number is recomputed here, only picked,
labelled and filtered. ``target_states`` is the one function that asks the source (the ``up``
series of every target: configured, discovered, or a selector's replica).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.format import duration, percent, seconds
from slo.sources.embedded import EmbeddedSource
from slo.sources.protocol import Source, is_external, matchers_of
from vigil.config import Config
from vigil.conventions import (
    ENDPOINT_ALL,
    INDICATOR_REPLICA_UP,
    KIND_DCGM,
    KIND_VLLM,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_POOL,
    SERIES_UP,
    SEVERITY_PAGE,
    SEVERITY_TICKET,
    TARGET_KINDS,
)
from vigil.model import TargetHealth

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
    none (``slo.scaling.signals`` absent)."""
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
    """One target at the evaluation time: ``state`` is ``"up"``, ``"down"`` (its latest
    ``up`` sample is 0) or ``"no data"`` (no ``up`` sample within the lookback: never
    scraped, or the collector is not running). ``url`` is "" where the source does not know
    it (a selector's replica in a Prometheus, a discovered target there)."""

    name: str
    pool: str
    kind: str
    url: str
    state: str


def _state(value: float | None) -> str:
    return STATE_NO_DATA if value is None else ("up" if value == 1.0 else "down")


def _keep_min(into: dict[Any, float], key: Any, value: float) -> None:
    # Several series for one replica (e.g. two jobs): it is down when any says so.
    if not math.isnan(value):
        into[key] = min(value, into.get(key, value))


def _selected(config: Config) -> set[tuple[str, str]]:
    """``(pool, kind)`` whose series a Prometheus chooses by the pool's selector."""
    return {(p.name, kind) for p in config.pools
            for kind, text in ((KIND_VLLM, p.selector), (KIND_DCGM, p.dcgm_selector)) if text}


def _health(source: Source) -> list[TargetHealth]:
    """The collector's record of each target's last scrape (the embedded store only)."""
    return source.store.target_health() if isinstance(source, EmbeddedSource) else []


def target_states(config: Config, source: Source, at_s: float) -> list[TargetState]:
    """Every target's state from the ``up`` series at ``at_s`` (Unix seconds): the configured
    targets (by ``instance``, config order), then per pool (config order) by kind and name:

    * the targets ``[[discovery]]`` found: the other ``instance`` values of the pool's ``up``
      (Vigil's labels; in the embedded store also those the collector has a record of, with
      their URL, "no data" when silent);
    * in a Prometheus (``source.external``), the replicas of a pool with a ``selector`` (and
      ``dcgm_selector``), named by its ``replica_label``, from the ``up`` series the selector
      chooses; the configured targets of that kind of such a pool are left out, since
      Prometheus scrapes them under the team's labels instead.
    """
    selected = _selected(config) if is_external(source) else set()
    static = {t.name for t in config.targets}
    pools = [p.name for p in config.pools]
    latest: dict[str, float] = {}
    found: dict[tuple[str, str, str], float] = {}  # (pool, kind, name) -> latest up
    for labels, value in source.instant(SERIES_UP, {}, at_s).items():
        d = dict(labels)
        name = d.get(LABEL_INSTANCE, "")
        if not name:
            continue
        _keep_min(latest, name, value)
        pool, kind = d.get(LABEL_POOL, ""), d.get(LABEL_KIND, "")
        if (name not in static and pool in pools and kind in TARGET_KINDS
                and (pool, kind) not in selected):
            _keep_min(found, (pool, kind, name), value)
    for p in config.pools:
        replica = p.replica_label_for(external=True)
        for kind in (KIND_VLLM, KIND_DCGM):
            if (p.name, kind) not in selected:
                continue
            up = source.instant(SERIES_UP, matchers_of(p.series(kind, external=True)), at_s)
            for labels, value in up.items():
                d = dict(labels)
                name = d.get(replica) or d.get(LABEL_INSTANCE, "")
                if name:
                    _keep_min(found, (p.name, kind, name), value)
    urls: dict[tuple[str, str, str], str] = {}
    for h in _health(source):
        if h.target not in static and h.pool in pools:
            urls[(h.pool, h.kind, h.target)] = h.url
    out = [TargetState(t.name, t.pool, t.kind, t.url, _state(latest.get(t.name)))
           for t in config.targets if (t.pool, t.kind) not in selected]
    order = {name: i for i, name in enumerate(pools)}
    for key in sorted({*found, *urls}, key=lambda k: (order[k[0]], k[1] != KIND_VLLM, k[2])):
        pool, kind, name = key
        out.append(TargetState(name, pool, kind, urls.get(key, ""), _state(found.get(key))))
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
