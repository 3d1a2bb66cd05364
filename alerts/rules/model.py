"""The values the rule pipeline passes along: options, rules, groups (``alerts.rules.pipeline``).

A ``Rule`` is one Prometheus recording or alerting rule. Besides what goes into the file it
keeps ``standalone``, the same expression with every recorded series it reads replaced by that
rule's own expression, so that a test can evaluate it on raw data alone (Prometheus evaluates
rules only as new samples arrive, never over backfilled history), and ``origin``: which number
of the embedded engine it must equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vigil.config import AlertsConfig, RulesConfig
from vigil.durations import prom_duration

__all__ = ["Origin", "Rule", "RuleGroup", "RulesOptions", "prom_duration"]


@dataclass(frozen=True)
class RulesOptions:
    """Knobs of ``vigil rules prometheus`` (seconds); ``alerts.rules.pipeline.rules_options``
    takes the intervals from ``[rules]`` and the KV hold from ``[alerts]``, whose defaults
    these are.

    ``interval_s``: evaluation interval of every rule group but the period ones;
    ``period_interval_s``: of the ``vigil-slo-period-*`` groups, whose 30-day ``increase`` reads
    a month of raw samples per evaluation (a budget figure five minutes old is still exact for
    its evaluation time); ``kv_alert_for_s``: how long a replica's KV-cache usage must stay above
    ``[alerts] kv_usage_high`` before ``KvCacheUsageHigh`` fires, the rule's ``for``
    (``[alerts] kv_usage_high_for``: a single full scrape during a burst is normal).
    """

    interval_s: float = RulesConfig().interval
    period_interval_s: float = RulesConfig().period_interval
    kv_alert_for_s: float = AlertsConfig().kv_usage_high_for

    def __post_init__(self) -> None:
        for name in ("interval_s", "period_interval_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be more than 0 seconds, got {value!r}")
        if self.kv_alert_for_s < 0:
            raise ValueError(f"kv_alert_for_s cannot be negative, got {self.kv_alert_for_s!r}")


@dataclass(frozen=True)
class Origin:
    """The embedded engine's number a rule records (or the condition it alerts on).

    ``kind`` is one of ``sli_error``, ``objective``, ``error_budget``, ``time_period_days``,
    ``current_burn_rate``, ``period_burn_rate``, ``period_budget_remaining`` (per ``slo``),
    ``quantile`` (``signal`` and ``quantile``), ``kv_avg``, ``kv_max``, ``queue``,
    ``gpu_cost``, ``gpu_cost_per_1000`` (per ``pool``), or ``burn_alert`` (``severity``),
    ``budget_low``, ``kv_high``, ``target_down`` for alerts. ``window_s`` is the window the
    number is computed over, when it has one (the scrape interval for ``target_down``);
    ``instance`` the one target a ``target_down`` rule watches ("" = the whole pool).
    """

    kind: str
    slo: str = ""
    pool: str = ""
    instance: str = ""
    window_s: float | None = None
    signal: str = ""
    quantile: float | None = None
    severity: str = ""


@dataclass(frozen=True)
class Rule:
    """One recording (``record``) or alerting (``alert``) rule."""

    expr: str
    origin: Origin
    record: str = ""
    alert: str = ""
    #: The expression with recorded series inlined (equals ``expr`` for rules on raw series).
    standalone: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    for_s: float = 0.0

    def __post_init__(self) -> None:
        if bool(self.record) == bool(self.alert):
            raise ValueError("a rule is either a recording rule or an alerting rule")
        if not self.standalone:
            object.__setattr__(self, "standalone", self.expr)

    @property
    def name(self) -> str:
        """The recorded metric name or the alert name."""
        return self.record or self.alert

    def to_dict(self) -> dict[str, Any]:
        """The rule as Prometheus's rule file spells it, keys in the documented order."""
        out: dict[str, Any] = {"record": self.record} if self.record else {"alert": self.alert}
        out["expr"] = self.expr
        if self.alert and self.for_s > 0:
            out["for"] = prom_duration(self.for_s)
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


@dataclass(frozen=True)
class RuleGroup:
    """A rule group: its rules are evaluated in order, every ``interval_s`` seconds."""

    name: str
    interval_s: float
    rules: tuple[Rule, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "interval": prom_duration(self.interval_s),
            "rules": [r.to_dict() for r in self.rules],
        }
