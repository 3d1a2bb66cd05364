"""The queries of a Grafana dashboard's JSON model, and their text with Grafana's variables
replaced, for the tests that check them with promtool or send them to a real Prometheus."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["panel_queries", "substitute", "variable_queries"]


def panel_queries(model: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query of a dashboard's JSON model, rows included."""
    out = []
    stack: list[Mapping[str, Any]] = list(model.get("panels") or [])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels") or [])
        for target in panel.get("targets") or []:
            if target.get("expr"):
                out.append((str(panel.get("title", "")), str(target["expr"])))
    return out


def variable_queries(model: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(variable, query)`` of the query variables (``label_values(<selector>, <label>)``)."""
    out = []
    for v in (model.get("templating") or {}).get("list") or []:
        if v.get("type") == "query":
            out.append((str(v["name"]), str(v.get("query", ""))))
    return out


#: Values the variables take for ``substitute`` (a check, not a dashboard): every pool,
#: model, SLO and endpoint.
_ALL = ".*"
_VARIABLES = re.compile(r"\$(__rate_interval|__range|pool|model|slo|endpoint)\b")


def substitute(expr: str, values: Mapping[str, str] | None = None, *,
               rate_interval: str = "1m", range_: str = "1h") -> str:
    """``expr`` with Grafana's variables replaced: ``$pool``, ``$model``, ``$slo``,
    ``$endpoint`` by ``values`` (regexes; ``.*`` when not given), ``$__rate_interval`` and
    ``$__range`` by durations. For promtool and for queries a test sends to Prometheus."""
    given = dict(values or {})

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "__rate_interval":
            return rate_interval
        if name == "__range":
            return range_
        return given.get(name, _ALL)

    return _VARIABLES.sub(value, expr)
