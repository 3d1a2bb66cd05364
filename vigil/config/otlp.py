"""``[otlp]``: request records from OpenTelemetry spans, for pools that Vigil's gateway is not
in front of (``serving.otlp``)."""

from __future__ import annotations

from pydantic import Field, field_validator

from vigil.config.base import Duration, Section


class OtlpConfig(Section):
    """Which spans become request records, and how their attributes name pool, tenant and tier.

    A span's pool is, in this order: the attribute ``pool_attribute`` (on the span or its
    resource); the engine it reached (``server.address``/``server.port``) matched to a
    configured target; the model (``gen_ai.response.model``, ``gen_ai.request.model``) when
    exactly one pool serves it. A span none of these place is counted as unmapped.
    """

    #: ``host:port`` of the OTLP/HTTP receiver (``POST /v1/traces``) that `vigil serve` starts
    #: ("" = none); `vigil otlp receive --listen` starts one on its own.
    listen: str = Field(default="", pattern=r"^(|\[?[A-Za-z0-9_.:-]*\]?:\d{1,5})$")
    #: The pools whose records come from spans ([] = every pool). Leave out a pool that
    #: Vigil's gateway fronts: its records come from the gateway, and its vLLM's spans
    #: would count each request twice.
    pools: list[str] = []
    #: The span or resource attribute that names the pool outright.
    pool_attribute: str = "vigil.pool"
    #: Attributes that name the tenant, the first one present wins: LiteLLM's key alias (its
    #: legacy and v2 spans), then the OpenTelemetry user attributes.
    tenant_attributes: list[str] = Field(default_factory=lambda: [
        "metadata.user_api_key_alias", "litellm.metadata.user_api_key_alias",
        "user.id", "enduser.id"])
    #: Attributes that name the tier ("premium" | "standard" | "batch"); none by default.
    tier_attributes: list[str] = []
    #: How long a request's spans wait for the others of the same request (a router's and
    #: vLLM's, exported in separate batches) before its record is written (seconds).
    join_window: Duration = Field(default=15.0, gt=0.0, le=600.0)
    #: Records held in memory when the database cannot take them; past this the receiver
    #: answers 503 with Retry-After, and the sender retries (the OTLP spec's backpressure).
    max_buffer: int = Field(default=100_000, ge=100)
    #: The largest request body accepted, after gzip (bytes; the OTLP spec recommends 64 MiB).
    max_body: int = Field(default=64 * 1024 * 1024, ge=1024)

    @field_validator("tenant_attributes", "tier_attributes")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not name or name != name.strip():
                raise ValueError(f"an attribute name must be non-empty without spaces: {name!r}")
        return v
