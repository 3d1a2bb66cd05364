"""The SLO engine's settings: SLO defaults and specs, burn-rate alerts, the engine, token
anomalies, scaling and capacity (``[slo_defaults]``, ``[[slos]]``, ``[engine]``, ``[anomaly]``,
``[scaling]``, ``[capacity]``)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from vigil.config.base import (
    USE_BASIC_AUTH,
    Duration,
    Ratio,
    Section,
    check_http_url,
    refuse_password,
)
from vigil.config.http import HttpClientConfig


class SloDefaults(Section):
    """The default SLOs: the defaults of every pool's SLO set."""

    ttft_threshold_seconds: float = Field(default=0.8, gt=0)
    ttft_objective: Ratio = 0.95
    e2e_threshold_seconds: float = Field(default=8.0, gt=0)
    e2e_objective: Ratio = 0.95
    #: The e2e SLO is stated for a generation of this many output tokens; the status JSON's
    #: ``e2e_seconds_normalised`` rescales each request the gateway recorded to this length.
    e2e_reference_output_tokens: int = Field(default=512, gt=0)
    error_rate_objective: Ratio = 0.995
    availability_objective: Ratio = 0.995
    period: Duration = 30 * 86400.0


class ScalingConfig(Section):
    """The scale-out / scale-in policy (ratios 0-1, counts, seconds)."""

    scale_out_kv_usage: Ratio = 0.80
    scale_out_queue_length: float = Field(default=50, ge=0)
    #: Scale out when the pool's TTFT quantile ``scale_out_ttft_quantile`` exceeds this
    #: fraction of the TTFT SLO threshold.
    scale_out_ttft_ratio: Ratio = 0.80
    #: The TTFT quantile scale-out compares (0.95: the p95), over ``[engine] window``; also
    #: the quantile of the KEDA TTFT trigger.
    scale_out_ttft_quantile: Ratio = Field(default=0.95, gt=0)
    scale_in_kv_usage: Ratio = 0.30
    scale_in_queue_length: float = Field(default=0, ge=0)
    scale_in_hold: Duration = 600.0
    cooldown: Duration = 300.0
    #: GPU spin-up time (2-5 min is typical): scale out before a threshold is crossed.
    spinup: Duration = 180.0


class AnomalyConfig(Section):
    """Cost anomalies."""

    #: A request whose token count exceeds this multiple of the mean is an anomaly.
    token_multiplier: float = Field(default=10.0, gt=1)
    #: The mean is taken over this rolling window (seconds).
    window: Duration = 3600.0


#: ``availability``: the share of requests answered without a server error (from the
#: gateway's records, else vLLM's ``http_requests_total``); ``replica_up``: the share of scrape
#: time the pool's vLLM targets were up (what ``availability`` measured before).
Indicator = Literal["ttft", "e2e", "error_rate", "availability", "replica_up"]
Endpoint = Literal["chat", "completions", "all"]


class SloConfig(Section):
    """One SLO: an indicator for one pool (and model, and endpoint) with an objective."""

    name: str = Field(min_length=1)
    pool: str
    #: Default: the pool's model.
    model: str | None = None
    endpoint: Endpoint = "all"
    indicator: Indicator
    #: Ratio 0-1 of good events (good time, for replica_up); default from [slo_defaults]
    #: (replica_up takes availability_objective).
    objective: Annotated[float, Field(gt=0.0, lt=1.0)] | None = None
    #: Latency indicators only; default from [slo_defaults].
    threshold_seconds: Annotated[float, Field(gt=0)] | None = None
    period: Duration | None = None


class BurnRateAlert(Section):
    """One row of the multiwindow multi-burn-rate table (SRE workbook, table 5-8).

    A row gives ``budget_share`` (each SLO's factor is then derived from its own period,
    ``slo.objectives.burn_rate.alert_factor``) or a fixed ``factor``, not both.
    """

    severity: Literal["page", "ticket"]
    #: Share 0-1 of the SLO period's error budget the alert may spend in its long window;
    #: each SLO's factor is budget_share × period / long_window (0.02 over 1h: 14.4 for a
    #: 30-day SLO, 3.36 for a 7-day one).
    budget_share: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    #: A fixed burn rate for every SLO whatever its period: how many times faster than
    #: "exactly on budget" the budget is spent. Instead of budget_share.
    factor: Annotated[float, Field(gt=0)] | None = None
    long_window: Duration
    short_window: Duration

    @model_validator(mode="after")
    def _check(self) -> BurnRateAlert:
        if self.budget_share is not None and self.factor is not None:
            raise ValueError("budget_share and factor are both given: keep one (budget_share "
                             "derives each SLO's factor from its period, factor is the same "
                             "for every period)")
        if self.budget_share is None and self.factor is None:
            raise ValueError("give budget_share (share 0-1 of the budget spent in "
                             "long_window) or factor (a fixed burn rate)")
        if not 0 < self.short_window < self.long_window:
            raise ValueError("short_window must be more than 0 and less than long_window")
        return self


def _default_burn_rate_alerts() -> list[BurnRateAlert]:
    # The table is a data file that cites its source, not numbers buried here.
    path = Path(__file__).resolve().parents[2] / "slo" / "burn_rate_windows.toml"
    data = tomllib.loads(path.read_text())
    return [BurnRateAlert.model_validate(a) for a in data["alerts"]]


class EngineConfig(Section):
    """The SLO engine: where it reads, which PromQL rules it follows, its default windows."""

    #: "3" (Prometheus 3.x rules) or "2" (2.x: left-closed ranges, ...); "auto" (default):
    #: the server's own major version when reading from Prometheus, else "3".
    promql_semantics: Literal["auto", "2", "3"] = "auto"
    #: Read from this Prometheus-compatible API instead of the embedded store ("" = store).
    prometheus_url: str = ""
    #: Instant-vector lookback (Prometheus's --query.lookback-delta), seconds.
    lookback: Duration = 300.0
    #: Window of the quantiles and the current SLI (seconds).
    window: Duration = 300.0
    #: Window of the cost figures (seconds).
    cost_window: Duration = 3600.0
    #: How often `vigil serve` evaluates (seconds).
    evaluation_interval: Duration = 30.0
    burn_rate_alerts: list[BurnRateAlert] = Field(default_factory=_default_burn_rate_alerts)
    #: How every read of ``prometheus_url`` authenticates: headers, credentials, TLS.
    http: HttpClientConfig = HttpClientConfig()
    #: The query language of ``prometheus_url``'s store: "promql" (Prometheus, Thanos, Mimir,
    #: Cortex) or "metricsql" (VictoriaMetrics, and vmalert evaluating the generated rules
    #: there): Vigil then writes PromQL's increase in MetricsQL functions, so the numbers
    #: are Prometheus's (docs/prometheus-rules.md).
    dialect: Literal["promql", "metricsql"] = "promql"
    #: Reading from ``prometheus_url``: "auto" (default) takes each SLO's error ratios from
    #: the series the store's evaluation of `vigil rules prometheus`'s rules recorded, when
    #: they are loaded and of this config's spec version, else computes them from raw
    #: series; "off" always computes them from raw series.
    recorded_rules: Literal["auto", "off"] = "auto"

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v:
            return v
        return check_http_url(refuse_password(v, "the URL", USE_BASIC_AUTH)).rstrip("/")




class CapacityConfig(Section):
    """Capacity at the SLO (``vigil capacity``) and the planner (``vigil plan``)."""

    #: Saved capacity profiles (JSON); relative paths are relative to the config file.
    profiles_path: str = "vigil-capacity.json"
    #: The search bisects until the passing and failing concurrencies are within this ratio.
    precision: Annotated[float, Field(gt=0.0, le=0.5)] = 0.10
    #: Confidence level 0-1 of each probe's attainment interval (Wilson score).
    confidence: Annotated[float, Field(ge=0.5, lt=1.0)] = 0.95
    #: A probe whose every request succeeded within this fraction 0-1 of each SLO threshold
    #: passes after clear_probe_requests requests, whatever its duration; it takes the latency
    #: tail to grow less than 1 / clear_margin past the worst of them (docs/capacity.md, "The
    #: latency margin"). 0 turns the rule off.
    clear_margin: Ratio = 0.5
    clear_probe_requests: int = Field(default=20, ge=10)
    #: Any other probe runs at least this long (seconds) and sends at least
    #: min_probe_requests...
    probe_duration: Duration = 20.0
    min_probe_requests: int = Field(default=100, ge=10)
    #: ...and is extended until its interval is resolved, up to this many requests, or until
    #: an interval straddling its objective is at most indifference x (1 - objective) either
    #: side of its centre: the level is then at the knee within what a probe resolves and is
    #: decided on its point estimate (docs/capacity.md, "The verdict"). 0: only
    #: max_probe_requests ends it.
    max_probe_requests: int = Field(default=2000, ge=10)
    indifference: Ratio = 0.5
    #: The search never goes above this concurrency.
    max_concurrency: int = Field(default=1024, ge=1)
    #: Open the search with a quick ramp (one stream added per finished request) that
    #: estimates the knee, then probe outward from the estimate; false: probe 1, 2, 4, ...
    #: (docs/capacity.md, "The search").
    ramp: bool = True
    #: Stop a level early once its finished requests already show a failure at a confidence
    #: corrected for the repeated looks (docs/capacity.md, "Early fail").
    early_fail: bool = True
    #: Hours per month of the monthly cost (730 = 8760 / 12).
    hours_per_month: float = Field(default=730.0, gt=0)
    #: Step of the planner's replicas-over-the-day curve and of the waste figures (seconds).
    plan_step: Duration = 900.0

    @model_validator(mode="after")
    def _check(self) -> CapacityConfig:
        if self.max_probe_requests < self.min_probe_requests:
            raise ValueError("max_probe_requests must be at least min_probe_requests")
        if self.clear_margin >= 1.0:
            # At 1 the rule would pass any small sample of good requests: no margin at all.
            raise ValueError("clear_margin must be less than 1 (a share of the threshold)")
        if self.probe_duration <= 0:
            raise ValueError("probe_duration must be more than 0 seconds")
        if self.plan_step < 60:
            raise ValueError("plan_step must be at least 60 seconds")
        return self
