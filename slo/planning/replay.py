"""The scaling decisions the policy made, or would have made, over the stored history.

``replay_decisions`` evaluates the scaling recommendation at each step of ``[start_s,
end_s]`` through the very call ``slo.status`` makes for ``vigil serve`` and ``vigil slo
status``: ``slo.scaling.signals.recommend_for_pool(source, config, pool, t, step_s=<[collector]
scrape_interval>)``, signals sampled every scrape interval, the cooldown and the scale-in hold
read from the stored ``up`` series. Nothing is re-implemented here, so a replay at the instants
serve evaluated at gives serve's decisions, and a replay with another ``[scaling]`` table
says what that table would have decided on the same history.

The replay is the recommendation, not its consequence: the replicas in the history are the ones
that ran, whatever was recommended (``slo.planning.policy_replay`` replays a policy that acts).

Units: Unix seconds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from slo.planning.pool_profile import pool_capacity
from slo.scaling.policy import CapacitySizing, Recommendation
from slo.scaling.signals import recommend_for_pool
from slo.sources.protocol import Source
from vigil.config import Config, PoolConfig

__all__ = ["decision_counts", "replay_decisions", "replay_times"]


def replay_times(start_s: float, end_s: float, step_s: float) -> list[float]:
    """``start_s, start_s + step_s, ...`` up to ``end_s`` (included when on the grid)."""
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be > 0 seconds, not {step_s!r}")
    if not (math.isfinite(start_s) and math.isfinite(end_s)) or end_s < start_s:
        raise ValueError(f"need finite start_s <= end_s (Unix seconds), not {start_s!r}, "
                         f"{end_s!r}")
    n = math.floor((end_s - start_s) / step_s + 1e-9)
    return [start_s + k * step_s for k in range(n + 1)]


def replay_decisions(
    source: Source,
    config: Config,
    pool: PoolConfig,
    start_s: float,
    end_s: float,
    step_s: float,
    *,
    at: Sequence[float] | None = None,
    capacity: CapacitySizing | Literal["saved"] | None = "saved",
) -> list[tuple[float, Recommendation]]:
    """``(t, recommendation)`` at ``t = start_s, start_s + step_s, ... <= end_s`` (Unix
    seconds), oldest first, exactly as ``slo.status.evaluate`` computes the pool's
    ``"scaling"`` block at ``t``. ``at``: evaluate at these instants instead (an evaluation
    log's timestamps). ``capacity``: what sizes scale-outs; ``"saved"`` (default) the pool's
    saved capacity profile, as serve uses it (``slo.planning.pool_profile.pool_capacity``);
    ``None`` the proportional rule; or a ``CapacitySizing`` to see what another capacity would
    have done."""
    times = list(at) if at is not None else replay_times(start_s, end_s, step_s)
    step = config.collector.scrape_interval  # as slo.status passes it
    # "saved": the profile serve would size with.
    sizing = pool_capacity(config, pool)[1] if isinstance(capacity, str) else capacity
    kwargs = {} if sizing is None else {"capacity": sizing}
    return [(t, recommend_for_pool(source, config, pool, t, step_s=step, **kwargs))
            for t in times]


def decision_counts(decisions: Sequence[tuple[float, Recommendation]]) -> dict[str, int]:
    """How many decisions of each action (``scale_out``, ``scale_in``, ``hold``) a replay
    made; every action present, 0 when absent."""
    counts = Counter(rec.action for _, rec in decisions)
    return {a: counts.get(a, 0) for a in ("scale_out", "scale_in", "hold")}
