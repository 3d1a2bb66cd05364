"""The gateway's per-request records: tiers, error classes, cache savings, anomalous requests.

vLLM's metrics know nothing of tenants, tiers, the semantic cache or timeouts seen by clients;
the gateway (``vigil gateway``) records every request it handled in ``[gateway] records_path``
(or the ``[gateway] database`` several gateways share), opened as the engine opens it
(``slo.sources.open.request_log``) and read through ``slo.sources.protocol.RequestLog``. Without
them there is simply no gateway data: every function here is then never called and the pages
say how to get it.

The sums below (cost, savings, counts per tier or error class) are over records as stored;
``cost_usd`` is the request's attributed share of its replica's GPU time (busy time only: idle
GPU time is the pool's, which the engine's cost per 1000 requests includes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from slo.cost.pool import tier_costs
from slo.sources.open import request_log
from slo.sources.protocol import RequestLog
from vigil.config import Config
from vigil.conventions import ANOMALY_REQUEST
from vigil.model import RequestRecord

__all__ = [
    "CLASS_OK",
    "anomaly_rows",
    "error_class_point",
    "open_request_log",
    "savings_point",
]

#: The error-class label of a request without an error.
CLASS_OK = "ok"

def open_request_log(config: Config) -> RequestLog | None:
    """The gateway's records as the engine opens them for a long-lived reader
    (``slo.sources.open.request_log(shared=True)``): one reader per database URL for the
    process, or ``None`` when the records file does not exist (the gateway never ran)."""
    return request_log(config, shared=True)


def _records(log: RequestLog, pool: str, at_s: float, window_s: float,
             model: str | None = None) -> list[RequestRecord]:
    return [r for r in log.records(pool, at_s, window_s) if model is None or r.model == model]


def savings_point(log: RequestLog, pool: str, at_s: float, window_s: float
                  ) -> dict[str, float]:
    """Semantic-cache results over the window: ``saved_usd`` (the engine's
    ``cache_savings_usd``: what the hits would have cost), ``hits``, ``l1_hits``, ``l2_hits``
    and ``requests`` (every record)."""
    records = _records(log, pool, at_s, window_s)
    saved = tier_costs(records, None)[1]
    return {
        "saved_usd": saved or 0.0,
        "hits": float(sum(1 for r in records if r.cache_hit)),
        "l1_hits": float(sum(1 for r in records if r.cache_hit == "l1")),
        "l2_hits": float(sum(1 for r in records if r.cache_hit == "l2")),
        "requests": float(len(records)),
    }


def error_class_point(log: RequestLog, pool: str, at_s: float, window_s: float,
                      model: str | None = None) -> dict[str, float]:
    """Requests per error class over the window (``timeout``, ``upstream_5xx``, ``oom``,
    ``client_cancel``, ``rejected``, ...; ``ok`` for none), as the gateway recorded them."""
    out: dict[str, float] = {}
    for r in _records(log, pool, at_s, window_s, model):
        key = r.error_class or CLASS_OK
        out[key] = out.get(key, 0.0) + 1
    return dict(sorted(out.items()))


def anomaly_rows(anomalies: Iterable[Mapping[str, Any]], records: Iterable[RequestRecord]
                 ) -> list[dict[str, Any]]:
    """The engine's per-request anomalies (``"kind": "request"``) joined by request id with
    their ``records`` for the time, tier and cost: one row each, newest first (a request
    flagged in two overlapping windows is listed once)."""
    by_id = {r.id: r for r in records}
    rows: dict[str, dict[str, Any]] = {}
    for a in anomalies:
        if a.get("kind") != ANOMALY_REQUEST:
            continue
        rid = str(a.get("id"))
        r = by_id.get(rid)
        rows.setdefault(rid, {
            "time": None if r is None else r.ts_s,
            "pool": a.get("pool"),
            "model": a.get("model"),
            "tier": None if r is None else (r.tier or None),
            "endpoint": a.get("endpoint"),
            "tokens": a.get("request_tokens"),
            "threshold_tokens": a.get("threshold_tokens"),
            "mean_tokens": a.get("mean_tokens_per_request"),
            "cost_usd": None if r is None else r.cost_usd,
            "id": rid,
        })
    return sorted(rows.values(), key=lambda row: -(row["time"] or 0.0))
