"""What an empty chart or cell on the Business page is missing, in words that name the cause.

A cost figure needs two things: GPU time (from ``up``: a scrape writes it, and so does a
backfill unless ingested with ``--no-up``) and something to divide it by (finished requests,
generated tokens). A chart with no point says which of the two the range lacks, so that "no
request finished" is never shown beside a table of finished requests. Pure functions of the
engine's ``cost`` blocks (see ``slo.cost.pool.pool_cost``).

``has_dcgm`` says whether a pool can have DCGM series at all, for the Server page's GPU chart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vigil.config import Config, PoolConfig
from vigil.conventions import (
    KIND_DCGM,
    SERIES_UP,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_REQUESTS_RUNNING,
)

__all__ = ["NO_UP", "cost_gap", "has_dcgm", "missing_cost", "no_up", "tier_gap", "tokens_gap"]


def has_dcgm(config: Config, pool: PoolConfig, *, external: bool) -> bool:
    """Whether ``pool`` has a source of DCGM series: a ``[[targets]]`` of kind "dcgm", a
    ``[[discovery]]`` whose targets default to kind "dcgm" and to this pool (or name their
    pool per group), or, read from a Prometheus (``external``), a ``dcgm_selector``."""
    if any(t.pool == pool.name and t.kind == KIND_DCGM for t in config.targets):
        return True
    if any(d.kind == KIND_DCGM and d.pool in ("", pool.name) for d in config.discovery):
        return True
    return external and bool(pool.dcgm_selector)


def no_up(*, one_pool: bool = False, where: str = "the range") -> str:
    """The cause of a cost figure missing although requests were served: no ``up``."""
    whose = "this pool's" if one_pool else "the pools'"
    return (f"no `{SERIES_UP}` sample for {whose} targets in {where}: GPU cost needs them "
            f"(a scrape writes `{SERIES_UP}`; history ingested with `vigil ingest --no-up` "
            "has none)")


#: ``no_up()`` for a chart of every shown pool over the range.
NO_UP = no_up()

# The figure a chart divides the cost by: (cost key, its amount, what "none" means).
_PER = {
    "per_1000_requests": ("requests", "No request finished in this range."),
    "per_million_output_tokens": ("output_tokens", "No token was generated in this range."),
}


def _served(costs: Iterable[Mapping[str, Any]], amount: str) -> bool:
    return any((c.get(amount) or 0) > 0 for c in costs)


def _billed(costs: Iterable[Mapping[str, Any]]) -> bool:
    return any(c.get("gpu_hours") is not None for c in costs)


def cost_gap(costs: list[Mapping[str, Any]], figure: str) -> str:
    """Why no cost block in ``costs`` (every pool, every instant of a chart) has ``figure``:
    ``"per_1000_requests"``, ``"per_million_output_tokens"`` or ``"idle_cost_usd"``."""
    billed = _billed(costs)
    if figure == "idle_cost_usd":
        if not billed:
            return f"No idle cost: {NO_UP}."
        return (f"No `{VLLM_REQUESTS_RUNNING}` sample in this range: the idle share (engines "
                "running no request) needs it.")
    amount, nothing = _PER[figure]
    served = _served(costs, amount)
    if not billed:
        what = "Requests finished" if amount == "requests" else "Tokens were generated"
        if served:
            return f"{what}, but there is {NO_UP}."
        return f"{nothing[:-1]}, and there is {NO_UP}."
    if not served:
        return nothing
    return ("No instant of this range has both GPU time and "
            f"{'finished requests' if amount == 'requests' else 'generated tokens'} in its "
            "cost window.")


def missing_cost(cost: Mapping[str, Any]) -> str | None:
    """For the "now" table: why a pool that served requests has no cost (``None`` when it
    has one, or served nothing)."""
    requests = cost.get("requests") or 0
    if cost.get("cost_usd") is None and requests > 0:
        return (f"{requests:,.0f} requests finished in the last {cost.get('window', '')}, but "
                f"there is {no_up(one_pool=True, where='that window')}")
    return None


def tokens_gap(costs: list[Mapping[str, Any]]) -> str:
    """Why the tokens-per-request chart is empty: no request finished, or requests finished
    and the generation-tokens histogram has no observation of them."""
    if _served(costs, "requests"):
        return (f"Requests finished, but `{VLLM_GENERATION_TOKENS_HIST}` has no observation in "
                "this range (the servers do not expose it?).")
    return "No request finished in this range."


def tier_gap(tiers: Iterable[Mapping[str, Mapping[str, Any]] | None]) -> str:
    """Why the cost-by-tier charts are empty, given each instant's ``by_tier`` block."""
    blocks = [b for b in tiers if b]
    if any((v.get("requests") or 0) > 0 for b in blocks for v in b.values()):
        return f"The gateway recorded tiered requests, but there is {NO_UP}."
    # Only cancelled, timed-out or cached requests: a tier's cost per 1000 counts the ones a
    # replica finished (``slo.cost.pool``), so there is nothing to divide by, though there was
    # traffic.
    if any((v.get(k) or 0) > 0 for b in blocks for v in b.values()
           for k in ("cancelled", "timed_out", "cache_hits")):
        return ("The gateway recorded tiered requests, but a replica finished none of them "
                "in this range (all cancelled, timed out or answered from the cache).")
    return "No tiered request in this range."
