"""An OTLP/HTTP receiver on loopback: what an OpenTelemetry collector gets from the gateway (and
from vLLM), decoded with OpenTelemetry's own protobuf classes (``opentelemetry-proto``); and a
real collector (rotel) in front of it.

``POST /v1/traces`` and ``POST /v1/metrics`` (protobuf, gzip or not) are answered 200 with an
empty export response; spans and metric points are kept, flattened (``Span``, ``Point``).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from support.loopback import Answer, LoopbackServer, Request, free_port, wait_for

__all__ = ["T0_NS", "OtlpReceiver", "Point", "Span", "json_export", "json_kv", "json_span",
           "otlp_receiver", "rotel_collector"]


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    #: The protobuf's enum: 1 internal, 2 server, 3 client.
    kind: int
    attributes: dict[str, Any]
    #: 0 unset, 1 ok, 2 error.
    status: int
    resource: dict[str, Any]
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Point:
    """One histogram data point of an exported metric."""

    metric: str
    unit: str
    attributes: dict[str, Any]
    count: int
    sum: float
    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    resource: dict[str, Any]


@dataclass
class OtlpReceiver:
    server: LoopbackServer
    spans: list[Span] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    #: Every ``/v1/traces`` body as received (decompressed protobuf), to replay elsewhere.
    trace_bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        """The base URL (``[gateway.otel] endpoint``)."""
        return self.server.url

    def spans_named(self, prefix: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name.startswith(prefix)]

    def latest_points(self, metric: str) -> list[Point]:
        """The points of ``metric`` in the last export that carried it (cumulative
        temporality: each export repeats every series so far)."""
        with self.lock:
            found = [p for p in self.points if p.metric == metric]
        if not found:
            return []
        # Points of one export arrive together; the last len(series) of them are the latest.
        keys: dict[tuple[tuple[str, Any], ...], Point] = {}
        for p in found:
            keys[tuple(sorted(p.attributes.items()))] = p
        return list(keys.values())

    def respond(self, req: Request) -> Answer:
        body = req.body
        if req.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if req.path == "/v1/traces":
            self._traces(body)
            return 200, "application/x-protobuf", ExportTraceServiceResponse().SerializeToString()
        if req.path == "/v1/metrics":
            self._metrics(body)
            return (200, "application/x-protobuf",
                    ExportMetricsServiceResponse().SerializeToString())
        return 404, "text/plain", b"not an OTLP path"

    def _traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        out = []
        for rs in request.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(Span(name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                                    parent_span_id=s.parent_span_id.hex(), kind=s.kind,
                                    attributes=_attributes(s.attributes), status=s.status.code,
                                    resource=resource, start_ns=s.start_time_unix_nano,
                                    end_ns=s.end_time_unix_nano))
        with self.lock:
            self.spans += out
            self.trace_bodies.append(body)

    def _metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        out = []
        for rm in request.resource_metrics:
            resource = _attributes(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.WhichOneof("data") != "histogram":
                        continue
                    for dp in m.histogram.data_points:
                        out.append(Point(metric=m.name, unit=m.unit,
                                         attributes=_attributes(dp.attributes), count=dp.count,
                                         sum=dp.sum, bounds=tuple(dp.explicit_bounds),
                                         counts=tuple(dp.bucket_counts), resource=resource))
        with self.lock:
            self.points += out


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A started receiver; closed when the block ends."""
    receiver = OtlpReceiver(LoopbackServer())
    receiver.server.respond = receiver.respond
    with receiver.server:
        yield receiver


def _rotel_agent() -> str:
    """The ``rotel-agent`` binary of the ``rotel`` wheel (a dev dependency)."""
    import rotel

    agent = Path(rotel.__file__).parent / "rotel-agent"
    if not agent.is_file():
        raise RuntimeError(f"the rotel wheel has no agent binary at {agent}")
    if not os.access(agent, os.X_OK):
        agent.chmod(agent.stat().st_mode | 0o111)
    return str(agent)


@contextmanager
def rotel_collector(receiver: OtlpReceiver, workdir: Path) -> Iterator[str]:
    """A real OpenTelemetry collector (rotel, from PyPI) on loopback that receives OTLP/HTTP and
    exports everything, OTLP/HTTP, to ``receiver``; yields its base URL (what
    ``[gateway.otel] endpoint`` names). What the receiver then holds is what a collector
    accepted, parsed and passed on."""
    http_port, grpc_port = free_port(), free_port()
    log = workdir / "rotel.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [_rotel_agent(), "start", "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
             "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}", "--exporter", "otlp",
             "--otlp-exporter-endpoint", receiver.url, "--otlp-exporter-protocol", "http",
             "--batch-timeout", "50ms", "--pid-file", str(workdir / "rotel.pid"),
             "--log-file", str(workdir / "rotel-agent.log")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"rotel exited with {proc.returncode}:\n"
                                   f"{log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", http_port), timeout=0.2):
                return True
            return False

        wait_for("rotel listening", listening, 30)
        yield f"http://127.0.0.1:{http_port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# --- OTLP/JSON by hand: what a collector or a JS SDK sends -------------------------------
#: A fixed instant for hand-made spans (2026-11-18, Unix nanoseconds).
T0_NS = 1_795_000_000_000_000_000


def json_kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}  # int64: a string in OTLP/JSON
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def json_export(*spans: dict[str, Any], resource: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [json_kv(k, v) for k, v in (resource or {}).items()]},
        "scopeSpans": [{"scope": {"name": "hand"}, "spans": list(spans),
                        "someFutureField": 1}]}]}).encode()


def json_span(span_id: str, attributes: dict[str, Any], *, name: str = "llm_request",
              start_ns: int = T0_NS, end_ns: int = T0_NS + 2_000_000_000,
              kind: int = 2) -> dict[str, Any]:
    return {"traceId": "5B8EFFF798038103D269B633813FC60C", "spanId": span_id,
            "parentSpanId": "", "name": name, "kind": kind,
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(end_ns),
            "attributes": [json_kv(k, v) for k, v in attributes.items()],
            "status": {"code": 0}, "flags": 257}
