"""The capacity profiles a plan compares for a pool: one list for `vigil plan` and the
dashboard's Plan page, so both give the same answer.

The candidates are the saved profiles of the pool's model (``[capacity] profiles_path``), the
pool's observed capacity when the history shows one (``slo.planning.capacity_observed``), and the
simulator's estimates for its known calibrations of that model on every GPU with a price. Of
several profiles of one configuration the one judged against targets covering the pool's
latency SLOs now is kept first (``slo.planning.plan.slo_gaps``: a measured profile of a looser SLO
must not hide an estimate that meets today's), then the best basis (measured > observed >
estimated), then the one saved for the pool, then the newest.

The estimates come from the replica model (``slo.planning.estimate``, a capacity search on
``slo.planning.replica``, the calibrated engine the simulator serves too). It is passed in as
``estimator``, so that ``vigil plan --no-estimates`` leaves it out and a test can give its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from slo.planning.capacity_observed import assess_observed
from slo.planning.plan import required_slos, same_model, slo_gaps
from slo.planning.profile_store import ProfileStore
from slo.sources.protocol import Source
from vigil.capacity import BASES, CapacityProfile, ProfileIdentity, SloTarget
from vigil.config import CapacityConfig, Config, PoolConfig
from vigil.errors import ConfigError

__all__ = ["Estimator", "estimates", "gather_candidates", "same_model"]


class Estimator(Protocol):
    """What estimates a capacity without a benchmark (``slo.planning.estimate``)."""

    def known_calibrations(self) -> list[tuple[str, str]]:
        """``(model, gpu)`` pairs the estimator has a calibration of."""
        ...

    def estimated_capacity(self, identity: ProfileIdentity, slos: Sequence[SloTarget],
                           capacity_config: CapacityConfig, *, created_at: float = ...
                           ) -> CapacityProfile:
        """The ``estimated`` profile of ``identity``; ``ConfigError`` when it has none."""
        ...


def _configuration(p: CapacityProfile) -> tuple[Any, ...]:
    i = p.identity
    return (i.model, i.gpu, i.gpus_per_replica, i.quantization, i.speculative,
            i.num_speculative_tokens)


def estimates(config: Config, pool: PoolConfig, estimator: Estimator, at_s: float,
              notes: list[str]) -> list[CapacityProfile]:
    """The estimator's profiles for its calibrations of the pool's model, one per GPU with a
    price; what it cannot estimate is named in ``notes``."""
    slos = required_slos(config, pool)
    out = []
    tried = 0
    for model, gpu in estimator.known_calibrations():
        if not same_model(model, pool.model) or gpu not in config.prices:
            continue
        tried += 1
        identity = ProfileIdentity(model=pool.model, gpu=gpu,
                                   gpus_per_replica=pool.gpus_per_replica)
        try:
            out.append(estimator.estimated_capacity(identity, slos, config.capacity,
                                                    created_at=at_s))
        except ConfigError as exc:
            # A calibration covers one GPU per replica, unquantized: say why, plan on.
            notes.append(f"no estimate for {identity.label()}: {exc}")
    if not tried:
        notes.append(f"no estimated candidates: the simulator has no calibration of "
                     f"{pool.model} on a GPU with a price")
    return out


def gather_candidates(config: Config, pool: PoolConfig, *, source: Source | None,
                      at_s: float, span_s: float, estimator: Estimator | None = None
                      ) -> tuple[list[CapacityProfile], list[str]]:
    """``(candidates, notes)`` for ``pool`` at ``at_s`` (Unix seconds): the saved profiles of
    its model, its observed capacity over the ``span_s`` seconds of history before ``at_s``
    when ``source`` is given, and ``estimator``'s estimates when given; ``notes`` say what was
    left out and why. ``ConfigError`` for a malformed profiles file."""
    notes: list[str] = []
    found = [p for p in ProfileStore(config.capacity_profiles_path()).load()
             if same_model(p.identity.model, pool.model)]
    if source is not None:
        observed = assess_observed(source, config, pool, at_s, span_s)
        if observed.profile is not None:
            found.append(observed.profile)
        else:
            notes.append(f"no observed capacity of pool {pool.name!r}: {observed.reason}")
    if estimator is not None:
        found.extend(estimates(config, pool, estimator, at_s, notes))
    required = required_slos(config, pool)

    def rank(p: CapacityProfile) -> tuple[bool, int, bool, float]:
        return (bool(slo_gaps(p, required)), BASES.index(p.basis), p.pool != pool.name,
                -p.created_at)

    best: dict[tuple[Any, ...], CapacityProfile] = {}
    for p in found:
        key = _configuration(p)
        kept = best.get(key)
        if kept is None or rank(p) < rank(kept):
            best[key] = p
    return list(best.values()), notes
