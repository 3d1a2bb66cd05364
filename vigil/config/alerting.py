"""Alerting and the generated rules: routes and the outbox, KEDA and the rule files
(``[alerts]``, ``[rules]``, ``[rules.keda]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from vigil.config.base import Duration, Ratio, Section, check_http_url


class AlertRouteConfig(Section):
    """Where matching alerts go, grouped like Alertmanager groups them."""

    name: str = Field(min_length=1)
    #: Label equality matchers (severity, pool, slo, alertname, ...); empty matches every alert.
    match: dict[str, str] = {}
    url: str
    #: generic JSON | Slack incoming webhook | Alertmanager webhook v4 | Alertmanager API v2.
    format: Literal["generic", "slack", "alertmanager", "alertmanager_api"] = "generic"
    #: Environment variable holding the HMAC-SHA256 secret (secrets never live in the file).
    secret_env: str | None = None
    timeout: Duration = 10.0
    group_by: list[str] = ["alertname", "pool", "slo"]
    group_wait: Duration = 30.0
    group_interval: Duration = 300.0
    repeat_interval: Duration = 4 * 3600.0
    send_resolved: bool = True
    #: Keep matching later routes after this one (Alertmanager's ``continue``).
    continue_matching: bool = False

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        return check_http_url(v)


class AlertsConfig(Section):
    """Alert evaluation and delivery."""

    #: Linked from every alert's annotations.
    dashboard_url: str = "http://127.0.0.1:8501"
    #: The durable notification outbox (SQLite; its own file, never the sample store's).
    outbox_path: str = "vigil-alerts.db"
    #: A notification still undelivered after this long is given up (and counted) (seconds).
    max_age: Duration = 24 * 3600.0
    #: Retry backoff: first delay and cap (seconds); jitter is added.
    retry_initial: Duration = 1.0
    retry_max: Duration = 300.0
    #: A target down for this many consecutive scrapes raises ``TargetDown``.
    target_down_scrapes: int = Field(default=3, ge=1)
    #: Error budget remaining below this ratio raises ``ErrorBudgetLow``.
    budget_low_ratio: Ratio = 0.10
    #: A replica's KV-cache usage above this ratio raises ``KvCacheUsageHigh``. vLLM refuses
    #: nothing there: once the cache is full its scheduler stops admitting waiting requests
    #: (they queue, TTFT grows) and preempts running ones (their KV is recomputed later).
    kv_usage_high: Ratio = 0.90
    #: How long a replica's KV-cache usage must stay above ``kv_usage_high`` before
    #: ``KvCacheUsageHigh`` fires (0 = at once): one full scrape during a burst is normal.
    #: The generated Prometheus rule's ``for`` and ``vigil serve``'s hold alike.
    kv_usage_high_for: Duration = 60.0
    routes: list[AlertRouteConfig] = []


class KedaConfig(Section):
    """The KEDA ScaledObjects of ``vigil rules keda``."""

    #: The HPA's scale-down stabilisation window is at least this long (and at least
    #: ``[scaling] scale_in_hold`` and ``cooldown``); Kubernetes caps it at 1 h (seconds).
    min_scale_down_stabilization: Duration = 600.0

    @model_validator(mode="after")
    def _check(self) -> KedaConfig:
        if not 0 <= self.min_scale_down_stabilization <= 3600:
            raise ValueError("min_scale_down_stabilization must be between 0 and 3600 seconds "
                             "(Kubernetes' limit)")
        return self


class RulesConfig(Section):
    """The files ``vigil rules`` generates: Prometheus rule groups and KEDA objects."""

    #: Evaluation interval of every generated rule group but the period ones (seconds).
    interval: Duration = 30.0
    #: Evaluation interval of the ``vigil-slo-period-*`` groups, whose 30-day ``increase``
    #: reads a month of samples per evaluation (seconds).
    period_interval: Duration = 300.0
    keda: KedaConfig = KedaConfig()

    @model_validator(mode="after")
    def _check(self) -> RulesConfig:
        for name in ("interval", "period_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0 seconds")
        return self
