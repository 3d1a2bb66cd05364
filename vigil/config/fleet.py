"""What Vigil watches and how: the store, the collector, pools and their vLLM launch profiles,
static targets and discovery (``[store]``, ``[collector]``, ``[[pools]]``, ``[[targets]]``,
``[[discovery]]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from vigil.config.base import Duration, Section, check_http_url
from vigil.conventions import KIND_VLLM, TARGET_LABELS
from vigil.selectors import (
    DEFAULT_REPLICA_LABEL,
    Selector,
    SelectorError,
    check_label_name,
    default_pool_selector,
    is_series_only_label,
    parse_selector,
)


class StoreConfig(Section):
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


class CollectorConfig(Section):
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


class VllmProfileConfig(Section):
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
    #: Where vLLM sends its OpenTelemetry spans (``--otlp-traces-endpoint``; "" = none): its
    #: ``llm_request`` span per request joins the gateway's trace ([gateway.otel]). vLLM
    #: speaks OTLP over gRPC unless its environment sets
    #: ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` (an ``http://.../v1/traces`` URL).
    otlp_traces_endpoint: str = ""
    #: Extra arguments appended verbatim.
    extra_args: list[str] = []



class PoolConfig(Section):
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


class TargetConfig(Section):
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


class DiscoveryConfig(Section):
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
