"""What the Plan page shows, computed by plain functions: the saved capacity profiles, the
traffic forecast from the store's history, the plan (``slo.planning.plan.plan``: today's
configuration beside the cheapest one that meets the SLOs), the waste over the range
(``slo.cost.waste.waste``) and a replay of the scaling policy
(``slo.planning.replay.replay_decisions``).

Every missing piece is named with its cause (``PlanPage.profiles_note`` and the like), so that
the page never draws an empty chart that reads as "nothing is needed". The page caches
``plan_without_waste`` and ``with_waste`` apart (``dashboard/views/plan.py``): the plan does not
depend on the range, the waste does. Nothing here touches Streamlit.

Units: requests per second, seconds (times are Unix seconds), GPU-hours, USD.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dashboard.empty_states import no_up
from slo.cost.waste import WasteResult, waste
from slo.planning import estimate as capacity_estimate
from slo.planning.candidates import gather_candidates
from slo.planning.forecast import SECONDS_PER_DAY, TrafficForecast, forecast_from_history
from slo.planning.plan import CandidatePlan, PlanResult, current_identity, plan
from slo.planning.profile_store import ProfileStore
from slo.sources.protocol import Source
from vigil.capacity import CapacityProfile
from vigil.config import Config, PoolConfig
from vigil.conventions import VLLM_REQUEST_SUCCESS
from vigil.errors import ConfigError

__all__ = [
    "BASIS_COLORS",
    "DEFAULT_DAYS",
    "MAX_REPLAY_POINTS",
    "PlanPage",
    "ReplaySummary",
    "aligned_range",
    "badge",
    "curve_rows",
    "plan_page",
    "plan_without_waste",
    "replay_summary",
    "waste_rows",
    "with_waste",
]

#: The colour of each basis badge (Streamlit's badge colours): the most trustworthy green.
BASIS_COLORS = {"measured": "green", "observed": "blue", "estimated": "orange"}
#: Days of history the forecast folds into a day, unless the page asks for others.
DEFAULT_DAYS = 7
#: A replay evaluates the whole policy (about a hundred queries) per point: at most this many.
MAX_REPLAY_POINTS = 48


def badge(basis: str) -> str:
    """A Streamlit markdown badge for ``basis`` (``:green-badge[measured]``)."""
    return f":{BASIS_COLORS.get(basis, 'gray')}-badge[{basis}]"


def aligned_range(start_s: float, end_s: float, step_s: float) -> tuple[float, float]:
    """``(start, end)`` moved inwards to multiples of ``step_s``: the whole steps inside the
    range, so that a refresh within a step asks for the same steps (and hits the cache)."""
    return math.ceil(start_s / step_s) * step_s, math.floor(end_s / step_s) * step_s


@dataclass(frozen=True)
class PlanPage:
    """The Plan page of one pool at ``at_s``.

    ``profiles``: every saved profile (``[capacity] profiles_path``); ``traffic`` the forecast
    day (None when the store has no request of the pool: ``traffic_note`` says so); ``result``
    the plan (None without profiles or traffic); ``waste`` over the range with today's
    profile (None: ``waste_note`` says why). Each ``*_note`` is None when its piece is there.
    """

    pool: str
    at_s: float
    days: int
    profiles_path: str
    profiles: tuple[CapacityProfile, ...]
    profiles_note: str | None
    traffic: TrafficForecast | None
    traffic_note: str | None
    result: PlanResult | None
    plan_note: str | None
    waste: WasteResult | None
    waste_note: str | None

    @property
    def today(self) -> CandidatePlan | None:
        """Today's configuration sized for the forecast (None without its profile)."""
        return self.result.today if self.result is not None else None

    @property
    def best(self) -> CandidatePlan | None:
        """The cheapest candidate that meets the SLOs (None when none does)."""
        return self.result.best if self.result is not None else None


def _capacity_command(config_path: str, pool: PoolConfig) -> str:
    return (f"vigil capacity --config {config_path} --pool {pool.name} --url <a replica's "
            "URL> --save")


def _profiles(config: Config, config_path: str, pool: PoolConfig, source: Source,
              at_s: float, days: int) -> tuple[list[CapacityProfile], list[str], str | None]:
    """``(candidates, notes, empty-state note)``: the very candidates ``vigil plan`` compares
    (``slo.planning.candidates``: saved, observed over the ``days`` read, estimated)."""
    path = config.capacity_profiles_path()
    try:
        profiles, notes = gather_candidates(config, pool, source=source, at_s=at_s,
                                            span_s=days * SECONDS_PER_DAY,
                                            estimator=capacity_estimate)
    except ConfigError as exc:
        return [], [], f"The saved capacity profiles cannot be read: {exc}"
    if not profiles:
        why = "; ".join(notes) or "none found"
        return [], notes, (
            f"**No capacity profile** for pool `{pool.name}` ({pool.model}): none saved "
            f"(`{path}` {'holds none of it' if path.exists() else 'does not exist'}), and "
            f"{why}. A plan needs the capacity of a replica at the SLOs: run "
            f"`{_capacity_command(config_path, pool)}` against a replica of the pool "
            "(a measured profile).")
    return profiles, notes, None


def _traffic(source: Source, config: Config, pool: PoolConfig, at_s: float, days: int
             ) -> tuple[TrafficForecast | None, str | None]:
    try:
        return forecast_from_history(source, config, pool, at_s, days), None
    except ValueError as exc:
        return None, (f"**No traffic history yet** for pool `{pool.name}`: {exc}. The plan "
                      f"sizes the pool for a day of its traffic (the rate of "
                      f"`{VLLM_REQUEST_SUCCESS}`): let `vigil serve` collect, or load history "
                      "with `vigil ingest`.")


def _plan_note(result: PlanResult, pool: PoolConfig) -> str | None:
    if not result.candidates:
        left_out = "; ".join(result.notes) or "none"
        return (f"No capacity profile can be planned for pool `{pool.name}` ({pool.model}): "
                f"{left_out}.")
    return None


def _waste(source: Source, config: Config, pool: PoolConfig, today: CapacityProfile | None,
           start_s: float, end_s: float) -> tuple[WasteResult | None, str | None]:
    if today is None:
        return None, ("No waste figure: there is no capacity profile of today's configuration "
                      f"({current_identity(pool).label()}), and the lower bound of GPU time "
                      "is the traffic divided by its capacity.")
    mu = today.max_goodput_rps
    if mu <= 0:
        return None, ("No waste figure: today's profile serves no request within its SLOs "
                      "(its search found no passing level).")
    step = config.capacity.plan_step
    start, end = aligned_range(start_s, end_s, step)
    if end - start < step:
        return None, (f"No waste figure: the range holds no whole `[capacity] plan_step` "
                      f"({step:g} s).")
    if pool.gpu not in config.prices:
        return None, f"No waste figure: no price for GPU `{pool.gpu}` in `[prices]`."
    found = waste(source, config, pool, mu, start, end, step)
    if found.used_gpu_hours <= 0:
        return None, f"No waste figure: {no_up(one_pool=True)}."
    return found, None


def plan_without_waste(config: Config, config_path: str, source: Source, pool: PoolConfig,
                       at_s: float, *, days: int = DEFAULT_DAYS) -> PlanPage:
    """``plan_page`` but for the waste (``waste`` and ``waste_note`` None; ``with_waste``
    adds it): the candidates, the forecast from the ``days`` days before ``at_s`` (Unix
    seconds) and the plan, none of which depends on the range the page shows. A week of
    history is most of the page's work, so the page keeps it apart from the range's waste:
    another range reuses it."""
    path = str(config.capacity_profiles_path())
    profiles, candidate_notes, profiles_note = _profiles(config, config_path, pool, source,
                                                         at_s, days)
    traffic, traffic_note = _traffic(source, config, pool, at_s, days)
    result = plan_note = None
    if profiles and traffic is not None:
        result = plan(config, pool, traffic, profiles)
        # What vigil plan lists as left out, too.
        result = replace(result, notes=(*candidate_notes, *result.notes))
        plan_note = _plan_note(result, pool)
    return PlanPage(pool=pool.name, at_s=at_s, days=days, profiles_path=path,
                    profiles=tuple(profiles), profiles_note=profiles_note, traffic=traffic,
                    traffic_note=traffic_note, result=result, plan_note=plan_note,
                    waste=None, waste_note=None)


def with_waste(page: PlanPage, config: Config, source: Source, pool: PoolConfig,
               range_s: tuple[float, float]) -> PlanPage:
    """``page`` (``plan_without_waste``) with the waste over ``range_s`` = ``(start, end)``
    Unix seconds, at today's capacity as the plan chose it."""
    found: WasteResult | None
    waste_note: str | None
    if page.profiles_note is not None:
        found, waste_note = None, "No waste figure: " + page.profiles_note
    else:
        # Today's profile as the plan chose it; without a plan (no traffic), as the scaling
        # policy finds it.
        today = (page.result.today.profile
                 if page.result is not None and page.result.today is not None
                 else ProfileStore(page.profiles_path).find(pool))
        found, waste_note = _waste(source, config, pool, today, *range_s)
    return replace(page, waste=found, waste_note=waste_note)


def plan_page(config: Config, config_path: str, source: Source, pool: PoolConfig,
              at_s: float, *, days: int = DEFAULT_DAYS, range_s: tuple[float, float]
              ) -> PlanPage:
    """Everything the Plan page shows for ``pool`` at ``at_s`` (Unix seconds): the forecast
    from the ``days`` days before it, the plan of every saved profile, and the waste over
    ``range_s`` = ``(start, end)`` Unix seconds. ``config_path`` is named in the empty
    states' commands."""
    page = plan_without_waste(config, config_path, source, pool, at_s, days=days)
    return with_waste(page, config, source, pool, range_s)


@dataclass(frozen=True)
class ReplaySummary:
    """The scaling policy replayed every ``step_s`` seconds over a range: ``counts`` per
    action and, per point, ``(t, current, desired, action)``."""

    step_s: float
    counts: dict[str, int]
    points: tuple[tuple[float, int, int, str], ...]


def replay_summary(source: Source, config: Config, pool: PoolConfig, start_s: float,
                   end_s: float, *, max_points: int = MAX_REPLAY_POINTS) -> ReplaySummary | None:
    """``slo.planning.replay.replay_decisions`` over ``[start_s, end_s]`` at a step of at least
    ``[capacity] plan_step``, widened so that at most ``max_points`` are evaluated; None
    while ``slo.planning.replay`` is not installed."""
    try:
        from slo.planning.replay import decision_counts, replay_decisions
    except ImportError as exc:
        if exc.name != "slo.planning.replay":
            raise
        return None
    step = float(config.capacity.plan_step)
    if end_s > start_s:
        step = max(step, (end_s - start_s) / max(1, max_points - 1))
        step = math.ceil(step / config.capacity.plan_step) * config.capacity.plan_step
    start, end = aligned_range(start_s, end_s, step)
    if end < start:
        return ReplaySummary(step, {"scale_out": 0, "scale_in": 0, "hold": 0}, ())
    decisions = replay_decisions(source, config, pool, start, end, step)
    points = tuple((t, rec.current, rec.desired, rec.action) for t, rec in decisions)
    return ReplaySummary(step, decision_counts(decisions), points)


def curve_rows(plans: Sequence[tuple[str, CandidatePlan]]
               ) -> list[tuple[float, str, float | None]]:
    """``(seconds of the day, series, replicas)`` rows of each named plan's replicas curve,
    for ``dashboard.charts.long_frame`` (the day is drawn as 1970-01-01 UTC: its clock)."""
    return [(t, name, float(n)) for name, p in plans for t, n in p.replicas_curve]


def waste_rows(result: WasteResult) -> list[tuple[float, str, float | None]]:
    """``(step end, series, GPU-hours)`` rows: used and the lower bound per step."""
    rows: list[tuple[float, str, float | None]] = []
    for s in result.steps:
        rows.append((s.t_s, "used", s.used_gpu_hours))
        rows.append((s.t_s, "lower bound", s.lower_bound_gpu_hours))
    return rows
