"""Request spans out of an OTLP export: the spans that stand for one LLM request, flattened.

Two kinds of span describe a request (the attribute names are the sources' own,
docs/otlp.md has the table):

* **the engine's**: vLLM's ``llm_request`` (SERVER) span, emitted when a request finishes with
  ``--otlp-traces-endpoint``: token counts (``gen_ai.usage.prompt_tokens``/``completion_tokens``)
  and the engine's own times in seconds (``gen_ai.latency.time_to_first_token``,
  ``time_in_queue``, ``e2e``), its id ``gen_ai.request.id`` (the ``chatcmpl-...`` id the
  client gets back). vLLM 0.32 names no model, no server and no error on it.
* **a router's**: a span following the GenAI semantic conventions (``gen_ai.operation.name``,
  ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``/``output_tokens``, ``server.address``,
  ``error.type``): LiteLLM's ``litellm_request`` and its v2 ``chat <model>``, Envoy AI Gateway's
  ``chat <model>``, any GenAI client instrumentation. LiteLLM's key alias and team arrive as
  ``metadata.*`` attributes.

Everything else in an export (HTTP server spans, database spans, vLLM's start-up spans) is not
a request and is skipped, counted as such. Attributes are the span's over its resource's (a
span attribute wins): an engine started with ``OTEL_RESOURCE_ATTRIBUTES=vigil.pool=chat`` names
its pool for every span it sends.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["ENGINE", "ROUTER", "RequestSpan", "kind_of", "request_spans"]

#: What a request span is (``kind_of``).
ENGINE = "engine"
ROUTER = "router"
#: vLLM's span name (vllm/v1/engine/output_processor.py ``do_tracing``).
VLLM_SPAN = "llm_request"
#: Attributes only vLLM's engine span carries.
_VLLM_KEYS = ("gen_ai.latency.e2e", "gen_ai.latency.time_to_first_token",
              "gen_ai.usage.prompt_tokens")
#: Attributes that make a span a GenAI request (semantic conventions, OpenInference, LiteLLM).
_GENAI_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
               "gen_ai.operation.name", "llm.token_count.prompt")
#: OTLP span kinds (trace.proto ``Span.SpanKind``).
KIND_SERVER = 2
KIND_CLIENT = 3
#: OTLP status codes (trace.proto ``Status.StatusCode``).
STATUS_ERROR = 2


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


@dataclass(frozen=True)
class RequestSpan:
    """One span, flattened. Ids are lower-case hex (``parent_id`` "" for a root span); times
    Unix nanoseconds; ``attributes`` the span's over its resource's; ``status`` OTLP's code
    (0 unset, 1 ok, 2 error)."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status: int
    status_message: str
    attributes: Mapping[str, Any]

    def get(self, *names: str) -> Any:
        """The first of ``names`` present, else None."""
        for name in names:
            value = self.attributes.get(name)
            if value is not None and value != "":
                return value
        return None


def request_spans(export: ExportTraceServiceRequest) -> Iterator[RequestSpan]:
    """Every span of ``export``, flattened (requests or not: ``kind_of`` tells)."""
    for resource_spans in export.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes = dict(resource)
                attributes.update((kv.key, _value(kv.value)) for kv in span.attributes)
                yield RequestSpan(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_id=span.parent_span_id.hex(), name=span.name, kind=span.kind,
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    status=span.status.code, status_message=span.status.message,
                    attributes=attributes)


def kind_of(span: RequestSpan) -> str | None:
    """``ENGINE`` for vLLM's request span, ``ROUTER`` for a GenAI request span, ``None`` for
    a span that is not a request (skipped)."""
    if span.name == VLLM_SPAN and any(k in span.attributes for k in _VLLM_KEYS):
        return ENGINE
    if any(k in span.attributes for k in _GENAI_KEYS) or span.name == "litellm_request":
        return ROUTER
    return None
