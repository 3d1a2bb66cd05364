"""``[cost]``, ``[[cost.prices]]`` and ``[[budgets]]``: how a pool's GPU bill is split over
tenants (``slo.cost.attribution``), the prices it is billed at over time, and the monthly
budgets that alert (and, at the gateway, demote or refuse) before they run out."""

from __future__ import annotations

import re
import zoneinfo
from datetime import UTC, date, datetime
from typing import Literal

from pydantic import Field, field_validator, model_validator

from vigil.config.base import Duration, Ratio, Section
from vigil.conventions import TIER_PREMIUM, Tier

#: The tiers whose headroom idle time keeps, by default: premium never waits.
_RESERVED_TIERS: tuple[Tier, ...] = (TIER_PREMIUM,)

#: Where a pool's idle GPU time is billed: to the platform (its own line), to the pool's
#: tenants in proportion to what they used, or to the tenants of ``[cost] idle_tiers`` (the
#: tiers whose headroom the idle time kept).
IdlePolicy = Literal["platform", "pro_rata", "tiers"]
#: How a price is paid: by the hour while a replica runs (``on_demand``, ``spot``) or
#: committed for a number of replicas whether they run or not (``reserved``).
Capacity = Literal["on_demand", "reserved", "spot"]
#: What the gateway does with a new request of a tenant over budget: nothing, send it to the
#: batch tier, or refuse it with an OpenAI-style 429 that names the budget.
Enforcement = Literal["off", "demote", "refuse"]


def parse_since(value: str, tz: str) -> float:
    """Unix seconds of ``value``: an ISO date (midnight in ``tz``, an IANA zone) or an ISO date
    and time (with an offset, else in ``tz``). ``ValueError`` naming the accepted forms."""
    try:
        if len(value) == 10:
            d = date.fromisoformat(value)
            when = datetime(d.year, d.month, d.day)
        else:
            when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"not an ISO date (2026-11-15) or date and time "
                         f"(2026-11-15T09:00:00+09:00): {value!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=zoneinfo.ZoneInfo(tz))
    return when.astimezone(UTC).timestamp()


class PriceConfig(Section):
    """One price of a pool's GPUs from a moment on (``[[cost.prices]]``). Before a pool's first
    ``on_demand`` entry, its GPU's ``[prices]`` rate applies."""

    #: The pool it prices.
    pool: str = Field(min_length=1)
    #: From when: an ISO date (midnight in ``[cost] timezone``) or date and time; until the
    #: pool's next entry of the same ``capacity``.
    since: str = Field(min_length=10)
    capacity: Capacity = "on_demand"
    #: Price of one GPU for one hour, in ``[cost] currency``.
    per_gpu_hour: float = Field(ge=0)
    #: ``reserved``: how many replicas are committed (their GPUs are paid whether they run or
    #: not; the unused ones are idle cost). 0 ends an earlier reservation.
    replicas: int = Field(default=0, ge=0)
    #: ``spot``: a regular expression matching the names of the replicas that run on spot
    #: capacity (the whole name, as PromQL's ``=~``).
    replica_match: str = ""

    @field_validator("replica_match")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return v

    @model_validator(mode="after")
    def _fits_capacity(self) -> PriceConfig:
        if self.capacity == "reserved" and self.replica_match:
            raise ValueError("replica_match belongs to spot prices; a reserved price takes "
                             "replicas = N")
        if self.capacity == "spot" and not self.replica_match:
            raise ValueError("a spot price needs replica_match: the replicas it applies to")
        if self.capacity != "reserved" and self.replicas:
            raise ValueError("replicas belongs to reserved prices (the committed replicas)")
        return self


class CostConfig(Section):
    """How GPU cost is attributed to tenants and reported (``vigil cost report``)."""

    #: The currency every price is in and every figure is named in (ISO 4217).
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    #: The IANA time zone whose midnights close months and budgets (a team in Seoul closes
    #: its month at 15:00 UTC): ``Asia/Seoul``, ``Europe/Berlin``, ``UTC``.
    timezone: str = "UTC"
    #: The span over which the gateway's records are compared with vLLM's token counters on
    #: each replica: work the counters show above the records is traffic that did not pass
    #: the gateway (the ``unattributed`` line). Shorter tells it apart in time more finely;
    #: longer forgives the time between a token's count and its record.
    step: Duration = Field(default=300.0, ge=30.0, le=3600.0)
    #: What one computed prompt token costs the engine, in decode steps of one request. A
    #: decode step reads every weight for a whole batch, shared by its requests, while prefill
    #: computes many tokens per read: on an H100 with an 8B model a prompt token takes about
    #: a quarter of a batch-64 decode step's per-request share.
    prefill_token_weight: float = Field(default=0.25, gt=0.0)
    #: What one prompt token served from vLLM's prefix cache costs, in decode steps: its KV
    #: is read, not computed.
    cached_token_weight: float = Field(default=0.025, ge=0.0)
    #: The share by which vLLM's counters may exceed the records' work in a step before the
    #: excess is billed as unattributed traffic (counts and records are taken at slightly
    #: different moments).
    unattributed_tolerance: Ratio = 0.05
    #: Where idle GPU time goes (see ``IdlePolicy``).
    idle: IdlePolicy = "platform"
    #: With ``idle = "tiers"``: the tiers whose tenants carry the idle time.
    idle_tiers: list[Tier] = Field(default_factory=lambda: list(_RESERVED_TIERS))
    #: Tenants that reach the pools through another router (their records arrive over
    #: OpenTelemetry) and so are in no ``[[gateway.api_keys]]``: budgets may name them.
    tenants: list[str] = []
    #: Tenant labels on ``/metrics`` at the most: the tenants that cost most this month, the
    #: rest summed as ``other``.
    metrics_tenants: int = Field(default=10, ge=1, le=1000)
    #: How often `vigil serve` recomputes this month's chargeback for the budgets and
    #: ``/metrics`` (closed days are kept; only the current one is read again).
    evaluation_interval: Duration = Field(default=300.0, ge=10.0)
    #: How far back the trailing spending rate of a budget's forecast looks.
    forecast_window: Duration = Field(default=7 * 86400.0, ge=3600.0)
    #: A closed month is frozen by the first report that reads it at least this long after its
    #: end; later reports show the frozen figures and restate any difference.
    close_after: Duration = Field(default=86400.0, ge=0.0)
    #: The frozen months (SQLite; relative to the config file).
    statements_path: str = "cost-statements.sqlite"
    #: Prices over time, per pool.
    prices: list[PriceConfig] = []

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            zoneinfo.ZoneInfo(v)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r}: give an IANA name such as "
                             "'Asia/Seoul' or 'UTC'") from None
        return v

    @model_validator(mode="after")
    def _since(self) -> CostConfig:
        for i, p in enumerate(self.prices):
            try:
                parse_since(p.since, self.timezone)
            except ValueError as exc:
                raise ValueError(f"prices[{i}].since: {exc}") from None
        return self


class BudgetConfig(Section):
    """A monthly budget of a tenant (optionally of one pool or tier): alerts at shares of it
    and before the trailing rate would exhaust it, and optional enforcement at the gateway."""

    #: How alerts and the 429 name it; default ``<tenant>[/<pool>][/<tier>]``.
    name: str = ""
    tenant: str = Field(min_length=1)
    #: Only this pool's cost ("" = every pool).
    pool: str = ""
    #: Only this tier's cost ("" = every tier).
    tier: Literal["", "premium", "standard", "batch"] = ""
    #: The amount per calendar month (in ``[cost] timezone``), in ``[cost] currency``.
    monthly: float = Field(gt=0)
    #: Shares of ``monthly`` that each send one alert when crossed (1.0 = spent).
    alert_at: list[float] = Field(default_factory=lambda: [0.5, 0.8, 1.0])
    #: Alert when the trailing rate (``[cost] forecast_window``) would spend the budget
    #: before the month ends, with the date it would.
    forecast: bool = True
    severity: Literal["page", "ticket"] = "ticket"
    #: At the gateway, once spent: demote new requests to the batch tier, or refuse them.
    enforce: Enforcement = "off"

    @field_validator("alert_at")
    @classmethod
    def _shares(cls, v: list[float]) -> list[float]:
        for share in v:
            if not 0 < share <= 10:
                raise ValueError(f"a share of the budget is above 0 and at most 10 "
                                 f"(1.0 = spent), got {share!r}")
        if len(set(v)) != len(v):
            raise ValueError("a share is listed twice")
        return sorted(v)

    def display_name(self) -> str:
        """``name``, or ``<tenant>[/<pool>][/<tier>]``."""
        return self.name or "/".join(x for x in (self.tenant, self.pool, self.tier) if x)


__all__ = ["BudgetConfig", "Capacity", "CostConfig", "Enforcement", "IdlePolicy", "PriceConfig",
           "parse_since"]
