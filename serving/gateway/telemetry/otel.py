"""OpenTelemetry from the gateway (``[gateway.otel]``): the GenAI semantic conventions' metrics
and a span per request, exported over OTLP/HTTP, and W3C trace context sent to the replicas.

Per request (``begin`` at arrival, ``finish`` with its record, exactly once):

* a span named ``{gen_ai.operation.name} {gen_ai.request.model}`` (``chat my-model``), kind
  SERVER, the child of the client's ``traceparent`` when it sends one; its attributes are the
  conventions' (``gen_ai.operation.name``, ``gen_ai.provider.name`` = ``vllm``,
  ``gen_ai.request.model``, ``gen_ai.request.max_tokens``, ``gen_ai.request.stream``,
  ``gen_ai.usage.input_tokens`` / ``output_tokens``, ``gen_ai.response.id``, ``error.type``,
  ``server.address`` / ``port``, ``http.response.status_code``) and Vigil's (``vigil.pool``,
  ``vigil.tier``, ``vigil.cache.hit``, ``vigil.replica``, ``vigil.request.id``,
  ``vigil.queue.seconds``). A server-side failure sets the span's status to ERROR.
* ``traceparent`` (and ``tracestate``) on the request to the replica, naming the gateway's span
  as the parent: vLLM started with ``--otlp-traces-endpoint`` makes its ``llm_request`` span a
  child of it, in the same trace.
* the model-server metrics ``gen_ai.server.request.duration`` (every request served or failed
  upstream, ``error.type`` on errors), ``gen_ai.server.time_to_first_token`` (successful
  streams), ``gen_ai.server.time_per_output_token`` (successful streams of two tokens or more:
  the time after the first token over the tokens after it), and ``gen_ai.client.token.usage``
  (``gen_ai.token.type`` input and output, when the replica reported its usage: the gateway is
  the replica's client), with the conventions' advised bucket boundaries and units.

The times are the gateway's own (the record's TTFT and e2e, the same numbers as its Prometheus
histograms). Nothing here waits on the exporter: spans go into a bounded queue that a
background thread exports (``BatchSpanProcessor``; a full queue drops spans), metrics are
aggregated in memory and exported every ``export_interval`` by another thread. The SDK's
providers are the gateway's own, not OpenTelemetry's global ones, so two gateways in one process
(tests) do not share them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vigil.config.gateway import OtelConfig
from vigil.conventions import (
    ENDPOINT_EMBEDDINGS,
    OTEL_ERROR_TYPE,
    OTEL_HTTP_STATUS,
    OTEL_INPUT_TOKENS,
    OTEL_METRICS_PATH,
    OTEL_OPERATION,
    OTEL_OPERATIONS,
    OTEL_OUTPUT_TOKENS,
    OTEL_PROVIDER,
    OTEL_PROVIDER_VLLM,
    OTEL_REQUEST_DURATION_BUCKETS,
    OTEL_REQUEST_MAX_TOKENS,
    OTEL_REQUEST_MODEL,
    OTEL_REQUEST_STREAM,
    OTEL_RESPONSE_ID,
    OTEL_SERVER_ADDRESS,
    OTEL_SERVER_PORT,
    OTEL_SERVER_REQUEST_DURATION,
    OTEL_SERVER_TIME_PER_OUTPUT_TOKEN,
    OTEL_SERVER_TIME_TO_FIRST_TOKEN,
    OTEL_TOKEN_BUCKETS,
    OTEL_TOKEN_TYPE,
    OTEL_TOKEN_USAGE,
    OTEL_TPOT_BUCKETS,
    OTEL_TRACES_PATH,
    OTEL_TTFT_BUCKETS,
    OTEL_VIGIL_CACHE,
    OTEL_VIGIL_POOL,
    OTEL_VIGIL_QUEUE,
    OTEL_VIGIL_REPLICA,
    OTEL_VIGIL_REQUEST_ID,
    OTEL_VIGIL_TIER,
    TOKENS_USAGE,
)
from vigil.errors import ConfigError
from vigil.storage.gateway_records import GatewayRecord

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["GatewayTelemetry", "span_name"]

log = logging.getLogger("vigil.gateway.otel")

#: The instrumentation scope's name.
SCOPE = "vigil.gateway"
#: Spans per export, and milliseconds between exports. Encoding a batch runs in Python in the
#: exporter's thread, holding the GIL that the event loop needs: small batches sent often keep
#: each hold short, so a request waits behind one at most a millisecond or two (the SDK's
#: default, 512 spans every 5 s, held it for tens of milliseconds: 140 ms added to the p99 TTFT
#: at 200 streams, bench/gateway_bench.py).
EXPORT_BATCH = 32
EXPORT_DELAY_MS = 200
#: Seconds one export may take (the exporter's own retries included).
EXPORT_TIMEOUT_S = 5.0
#: Seconds the gateway's shutdown waits for the last export: an unreachable collector must not
#: hold the gateway's exit for the exporter's retries.
SHUTDOWN_TIMEOUT_S = 5.0


def span_name(record: GatewayRecord) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}``, as the conventions name a span
    (the operation alone when the request named no model)."""
    operation = OTEL_OPERATIONS.get(record.endpoint, record.endpoint)
    return f"{operation} {record.model}" if record.model else operation


#: The histograms: name, unit, description (the conventions' own words).
_INSTRUMENTS = (
    (OTEL_SERVER_REQUEST_DURATION, "s", "Generative AI server request duration such as "
                                        "time-to-last byte or last output token."),
    (OTEL_SERVER_TIME_TO_FIRST_TOKEN, "s", "Time to generate first token for successful "
                                           "responses."),
    (OTEL_SERVER_TIME_PER_OUTPUT_TOKEN, "s", "Time per output token generated after the first "
                                             "token for successful responses."),
    (OTEL_TOKEN_USAGE, "{token}", "Number of input and output tokens used."),
)


class _Getter:
    """OpenTelemetry's ``Getter`` over an ASGI scope's header list (lower-case bytes)."""

    def get(self, carrier: Iterable[tuple[bytes, bytes]], key: str) -> list[str] | None:
        wanted = key.lower().encode()
        found = [v.decode("latin-1") for k, v in carrier if k == wanted]
        return found or None

    def keys(self, carrier: Iterable[tuple[bytes, bytes]]) -> list[str]:
        return [k.decode("latin-1") for k, _ in carrier]


class GatewayTelemetry:
    """The gateway's tracer and meter, built from ``[gateway.otel]``; ``server_address`` and
    ``server_port`` are the gateway's own (``[gateway] listen``)."""

    def __init__(self, cfg: OtelConfig, *, server_address: str, server_port: int) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError as exc:
            raise ConfigError(f"[gateway.otel] is enabled but OpenTelemetry's SDK cannot be "
                              f"imported ({exc}); install the 'gateway' extra",
                              key="gateway.otel.enabled") from None
        self.cfg = cfg
        self._static = {OTEL_PROVIDER: OTEL_PROVIDER_VLLM, OTEL_SERVER_ADDRESS: server_address,
                        OTEL_SERVER_PORT: server_port}
        resource = Resource.create({"service.name": cfg.service_name})
        self._propagator = TraceContextTextMapPropagator()
        self._getter = _Getter()
        self._tracer_provider: Any = None
        self._tracer: Any = None
        if cfg.traces:
            self._tracer_provider = TracerProvider(resource=resource)
            self._tracer_provider.add_span_processor(BatchSpanProcessor(
                OTLPSpanExporter(endpoint=cfg.endpoint + OTEL_TRACES_PATH,
                                 headers=dict(cfg.headers) or None, timeout=EXPORT_TIMEOUT_S),
                max_queue_size=cfg.max_queue,
                max_export_batch_size=min(EXPORT_BATCH, cfg.max_queue),
                schedule_delay_millis=EXPORT_DELAY_MS))
            self._tracer = self._tracer_provider.get_tracer(SCOPE)
        self._meter_provider: Any = None
        if cfg.metrics:
            buckets = {OTEL_SERVER_REQUEST_DURATION: OTEL_REQUEST_DURATION_BUCKETS,
                       OTEL_SERVER_TIME_TO_FIRST_TOKEN: OTEL_TTFT_BUCKETS,
                       OTEL_SERVER_TIME_PER_OUTPUT_TOKEN: OTEL_TPOT_BUCKETS,
                       OTEL_TOKEN_USAGE: OTEL_TOKEN_BUCKETS}
            views = [View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(
                [float(b) for b in bounds])) for name, bounds in buckets.items()]
            reader = PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=cfg.endpoint + OTEL_METRICS_PATH,
                                   headers=dict(cfg.headers) or None,
                                   timeout=EXPORT_TIMEOUT_S),
                export_interval_millis=cfg.export_interval * 1000)
            self._meter_provider = MeterProvider(resource=resource, metric_readers=[reader],
                                                 views=views)
            meter = self._meter_provider.get_meter(SCOPE)
            self._duration, self._ttft, self._tpot, self._tokens = (
                meter.create_histogram(name, unit=unit, description=text)
                for name, unit, text in _INSTRUMENTS)

    # --- the request path (no I/O) -----------------------------------------------------------

    def begin(self, headers: Iterable[tuple[bytes, bytes]] = ()) -> Span | None:
        """The request's span, started now: a child of the client's ``traceparent`` when the
        request carries one (``headers``: the ASGI scope's). None without traces."""
        if self._tracer is None:
            return None
        from opentelemetry.trace import SpanKind

        parent = self._propagator.extract(list(headers), getter=self._getter)
        span: Span = self._tracer.start_span("gateway request", context=parent,
                                             kind=SpanKind.SERVER)
        return span

    def upstream_headers(self, span: Span | None) -> bytes:
        """``traceparent: ...\\r\\n`` (and ``tracestate``) naming ``span`` as the parent, for the
        request to the replica; b"" without a span or with ``propagate`` off."""
        if span is None or not self.cfg.propagate:
            return b""
        from opentelemetry.trace import set_span_in_context

        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=set_span_in_context(span))
        return b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in carrier.items())

    def finish(self, span: Span | None, record: GatewayRecord) -> None:
        """End ``span`` with what ``record`` says, and record the request's metrics."""
        operation = OTEL_OPERATIONS.get(record.endpoint, record.endpoint)
        common: dict[str, Any] = {**self._static, OTEL_OPERATION: operation,
                                  OTEL_VIGIL_POOL: record.pool, OTEL_VIGIL_TIER: record.tier}
        if record.model:
            common[OTEL_REQUEST_MODEL] = record.model
        failed = record.error or record.status >= 400
        if span is not None:
            self._end_span(span, record, common, failed)
        if self._meter_provider is None:
            return
        served = record.e2e_s is not None
        duration = record.e2e_s if served else max(0.0, record.ts_s - record.start_s)
        if served or record.error:
            attrs = dict(common)
            if failed:
                attrs[OTEL_ERROR_TYPE] = record.error_class or str(record.status)
            self._duration.record(duration, attrs)
        if not served or failed:
            return
        if record.ttft_s is not None:
            self._ttft.record(record.ttft_s, common)
            after = record.completion_tokens - 1
            if after > 0 and record.e2e_s is not None:
                self._tpot.record(max(0.0, record.e2e_s - record.ttft_s) / after, common)
        if record.tokens_source == TOKENS_USAGE:
            self._tokens.record(record.prompt_tokens, {**common, OTEL_TOKEN_TYPE: "input"})
            if record.endpoint != ENDPOINT_EMBEDDINGS:
                self._tokens.record(record.completion_tokens,
                                    {**common, OTEL_TOKEN_TYPE: "output"})

    def _end_span(self, span: Span, record: GatewayRecord, common: dict[str, Any],
                  failed: bool) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.update_name(span_name(record))
        attrs: dict[str, Any] = {
            **common, OTEL_VIGIL_REQUEST_ID: record.id, OTEL_HTTP_STATUS: record.status,
            OTEL_REQUEST_STREAM: record.stream, OTEL_VIGIL_QUEUE: record.queue_s,
            OTEL_VIGIL_CACHE: record.cache_hit or "miss",
        }
        if record.replica:
            attrs[OTEL_VIGIL_REPLICA] = record.replica
        if record.max_tokens is not None:
            attrs[OTEL_REQUEST_MAX_TOKENS] = record.max_tokens
        if record.tokens_source == TOKENS_USAGE:
            attrs[OTEL_INPUT_TOKENS] = record.prompt_tokens
            attrs[OTEL_OUTPUT_TOKENS] = record.completion_tokens
        if record.upstream_id:
            attrs[OTEL_RESPONSE_ID] = record.upstream_id
        if failed:
            attrs[OTEL_ERROR_TYPE] = record.error_class or str(record.status)
        span.set_attributes(attrs)
        if record.error:
            span.set_status(Status(StatusCode.ERROR, record.error_class))
        span.end()

    # --- outside the request path ------------------------------------------------------------

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export what is held now (spans and metrics); True if both finished in time."""
        ok = True
        millis = int(timeout_s * 1000)
        if self._tracer_provider is not None:
            ok = bool(self._tracer_provider.force_flush(millis)) and ok
        if self._meter_provider is not None:
            ok = bool(self._meter_provider.force_flush(millis)) and ok
        return ok

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Export what is held and stop the exporters' threads (at the gateway's close),
        waiting ``timeout_s`` seconds at most: what a collector has not taken by then is
        dropped, and logged."""
        providers = [p for p in (self._tracer_provider, self._meter_provider) if p is not None]

        def stop(provider: Any) -> None:
            try:
                provider.shutdown()
            except Exception:  # an unreachable collector must not fail the shutdown
                log.warning("OpenTelemetry: exporting at shutdown failed", exc_info=True)

        threads = [threading.Thread(target=stop, args=(p,), daemon=True,
                                    name="otel-shutdown") for p in providers]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in threads):
            log.warning("OpenTelemetry: %s did not take the last export within %.0f s; "
                        "what it held is dropped", self.cfg.endpoint, timeout_s)
