"""The saved capacity profile that sizes a pool's scale-outs, as ``vigil serve`` picks it.

``slo.status`` (serve and ``vigil slo status``) and ``slo.planning.replay`` (the replay of serve's
decisions) both take the profile from here, so that a replay sizes as serve did.
"""

from __future__ import annotations

from slo.planning.plan import required_slos, slo_gaps
from slo.planning.profile_store import ProfileStore
from slo.scaling.policy import CapacitySizing
from vigil.capacity import CapacityProfile
from vigil.config import Config, PoolConfig
from vigil.errors import ConfigError

__all__ = ["pool_capacity", "profile_for"]


def profile_for(config: Config, pool: PoolConfig) -> tuple[CapacityProfile | None, str | None]:
    """``(the pool's saved capacity profile or None, why one was not used or None)``.

    The best of ``ProfileStore(config.capacity_profiles_path()).candidates(pool)`` (the
    pool's configuration now) whose SLO targets cover the pool's current latency SLOs, as
    ``vigil plan`` requires: a profile judged against a looser target overstates what a
    replica serves. Each profile passed over for that is named in the second item; a missing
    file is no profile, a malformed one is reported (the policy then sizes without it)."""
    try:
        candidates = ProfileStore(config.capacity_profiles_path()).candidates(pool)
    except ConfigError as exc:
        return None, str(exc)
    required = required_slos(config, pool)
    dropped: list[str] = []
    for profile in candidates:
        gaps = slo_gaps(profile, required)
        if not gaps:
            return profile, "; ".join(dropped) or None
        dropped.append(f"profile {profile.key} ({profile.identity.label()}, "
                       f"{profile.basis}): {'; '.join(gaps)}: not used")
    return None, "; ".join(dropped) or None


def pool_capacity(
    config: Config, pool: PoolConfig
) -> tuple[CapacityProfile | None, CapacitySizing | None, str | None]:
    """``(profile, sizing, error)``: the pool's saved capacity profile, the
    ``slo.scaling.policy.CapacitySizing`` the scaling policy sizes scale-outs with (None without a
    usable profile) and why the profiles could not be read or a saved one was not used
    (None when neither happened). What ``vigil serve`` uses, so that a replay of its decisions
    (``slo.planning.replay``) uses it too."""
    profile, error = profile_for(config, pool)
    return profile, CapacitySizing.from_profile(profile), error
