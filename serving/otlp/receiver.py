"""``OtlpReceiver``: OTLP/HTTP ``POST /v1/traces`` in, the gateway's request records out.

An export is decoded (``application/x-protobuf`` or OTLP/JSON, gzip or deflate or neither),
each span read (``serving.otlp.mapping.part_of``), the parts of one request held until its
other spans had time to arrive (``serving.otlp.join.Joiner``), and each request's record put
into a ``RecordWriter`` on the gateway's records database, where ``slo.sources.request_log``
reads every record the gateway writes.

``receive`` is the whole protocol without HTTP (bytes and headers in, status, body and headers
out); ``serve_http`` puts it on a standard-library threading HTTP server.

**Every span is counted by outcome** (``counts()``): ``recorded`` (its part was accepted),
``not_request`` (not a request span: skipped), ``rejected`` by reason (``Rejected.reason``),
``late`` (its request's record was already released, or the same span twice: a collector's
retry), ``throttled`` (in an export answered 503, which the sender retries) and ``elsewhere``
(a request Vigil's gateway recorded, or of a pool left to it: not an error). Rejected spans
are reported in the response's ``partial_success`` with HTTP 200, so the sender does not retry
them (the OTLP specification: a partial success MUST NOT be retried).

**Backpressure**: what is held in memory (records queued for the database plus requests held
in the joiner) is kept within ``[otlp] max_buffer``: an export that would take it past the
bound is answered 503 with ``Retry-After`` and nothing of it is kept; the sender retries it
later (429, 502, 503 and 504 are OTLP's retryable codes). Nothing is dropped silently: the
writer's own bound is set above anything admission lets through.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from serving.gateway.telemetry.record_writer import RecordWriter
from serving.otlp.join import Joiner
from serving.otlp.mapping import Part, Placer, Rejected, part_of
from serving.otlp.spans import RequestSpan, request_spans
from vigil.clock import Clock, system_clock
from vigil.config import Config, TargetConfig
from vigil.conventions import (
    METRIC_OTLP_BUFFERED,
    METRIC_OTLP_EXPORTS,
    METRIC_OTLP_RECORDS_DROPPED,
    METRIC_OTLP_RECORDS_WRITTEN,
    METRIC_OTLP_SPANS,
)
from vigil.http_server import threading_http_server
from vigil.storage.gateway_records import GatewayRecord

__all__ = ["JSON", "PROTOBUF", "TRACES_PATH", "OtlpCollector", "OtlpReceiver", "Reply"]

log = logging.getLogger("vigil.otlp")

#: The one path served (OTLP/HTTP's default for traces).
TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: Seconds a sender answered 503 is asked to wait before it retries.
RETRY_AFTER_S = 5
#: Seconds between two log lines about the same rejection reason, at the least.
LOG_EVERY_S = 60.0
#: The fewest bytes a request span takes in an export (a name, its pool in the resource), so
#: that ``max_body // MIN_SPAN_BYTES`` bounds the records of one export.
MIN_SPAN_BYTES = 16
#: Reasons named with an example in ``partial_success.error_message`` (counts are all given).
_EXAMPLES = 5

#: Span outcomes, the ``outcome`` label of ``vigil_otlp_spans_total``.
RECORDED = "recorded"
NOT_REQUEST = "not_request"
REJECTED = "rejected"
LATE = "late"
THROTTLED = "throttled"
#: A request recorded elsewhere: by Vigil's gateway, or a pool whose records come from it
#: (``Rejected.refused`` False): counted by reason, not reported to the sender as refused.
ELSEWHERE = "elsewhere"
OUTCOMES = (RECORDED, NOT_REQUEST, REJECTED, LATE, THROTTLED, ELSEWHERE)

#: Series on ``/metrics`` (``OtlpCollector``).
METRIC_SPANS = METRIC_OTLP_SPANS
METRIC_EXPORTS = METRIC_OTLP_EXPORTS
METRIC_RECORDS_WRITTEN = METRIC_OTLP_RECORDS_WRITTEN
METRIC_RECORDS_DROPPED = METRIC_OTLP_RECORDS_DROPPED
METRIC_BUFFERED = METRIC_OTLP_BUFFERED

#: OTLP/JSON fields that hold ids as hex (protobuf's JSON mapping expects base64 for bytes).
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")

try:  # googleapis-common-protos: a dependency of the OTLP exporter, so normally here
    from google.rpc.status_pb2 import Status as _RpcStatus
except ImportError:  # pragma: no cover - the JSON fallback below answers instead
    _RpcStatus = None


class Reply(NamedTuple):
    """What ``receive`` answers: HTTP status, body, its content type, extra headers."""

    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]


class BadExport(Exception):
    """An export that cannot be read: answered ``status`` (400, 413, 415) with the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded as its ``Content-Encoding`` says, never more than ``limit`` bytes out
    (413 past it: a small gzip bomb must not fill the memory)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        if len(body) > limit:
            raise BadExport(413, f"the body is {len(body)} bytes, more than the {limit} "
                                 "accepted ([otlp] max_body)")
        return body
    if encoding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise BadExport(415, f"Content-Encoding {encoding!r} is not supported (gzip, deflate "
                             "or none)")
    out: list[bytes] = []
    size = 0
    rest = body
    try:
        while rest:  # gzip allows several members one after another
            d = zlib.decompressobj(wbits)
            chunk = d.decompress(rest, limit + 1 - size)
            size += len(chunk)
            out.append(chunk)
            if size > limit or d.unconsumed_tail:
                raise BadExport(413, f"the body is more than {limit} bytes once decompressed "
                                     "([otlp] max_body)")
            if not d.eof:
                raise BadExport(400, f"the {encoding} body is truncated")
            rest = d.unused_data if encoding == "gzip" else b""
    except zlib.error as exc:
        raise BadExport(400, f"the body is not valid {encoding}: {exc}") from None
    return b"".join(out)


def _hex_ids_to_base64(node: Any) -> None:
    """OTLP/JSON spells trace and span ids in hex; protobuf's JSON mapping of ``bytes`` is
    base64. Rewritten in place, everywhere they occur (spans and their links)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
                except ValueError:
                    raise BadExport(400, f"{key} {value[:40]!r} is not hex") from None
            else:
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)


def decode_export(body: bytes, media_type: str) -> ExportTraceServiceRequest:
    """``body`` (already inflated) as an export; ``BadExport(400)`` when it is not one."""
    export = ExportTraceServiceRequest()
    if media_type == PROTOBUF:
        try:
            export.ParseFromString(body)
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise BadExport(400, f"not an ExportTraceServiceRequest: {exc}") from None
        return export
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadExport(400, f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadExport(400, "an OTLP/JSON export is an object with resourceSpans")
    _hex_ids_to_base64(data)
    try:
        # Unknown fields MUST be ignored (OTLP/JSON); int64 as strings and enums as integers
        # are what protobuf's JSON parser takes anyway.
        json_format.ParseDict(data, export, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise BadExport(400, f"not an OTLP/JSON export: {str(exc)[:300]}") from None
    return export


def _encode(message: Message, media_type: str) -> bytes:
    if media_type == JSON:
        return str(json_format.MessageToJson(message, indent=None)).encode()
    return bytes(message.SerializeToString())


def _status_body(status: int, message: str, media_type: str) -> tuple[bytes, str]:
    """An error's body: ``google.rpc.Status`` (OTLP's failure body) in the request's content
    type; JSON ``{"message": ...}`` if the class is missing or the request's type unknown."""
    if _RpcStatus is not None and media_type in (PROTOBUF, JSON):
        return _encode(_RpcStatus(message=message), media_type), media_type
    return json.dumps({"message": message}).encode(), JSON


class _Tally:
    """One export's outcome: spans by outcome, rejections by reason (with an example)."""

    def __init__(self) -> None:
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.reasons: dict[str, int] = {}
        self.elsewhere: dict[str, int] = {}
        self.examples: dict[str, tuple[str, RequestSpan]] = {}

    def reject(self, why: Rejected, span: RequestSpan) -> None:
        if not why.refused:
            self.outcomes[ELSEWHERE] += 1
            self.elsewhere[why.reason] = self.elsewhere.get(why.reason, 0) + 1
            return
        self.outcomes[REJECTED] += 1
        self.reasons[why.reason] = self.reasons.get(why.reason, 0) + 1
        self.examples.setdefault(why.reason, (why.detail, span))

    def message(self) -> str:
        """``partial_success.error_message``: every reason with its count, the first few with
        what one of their spans carried."""
        parts = []
        for i, (reason, n) in enumerate(sorted(self.reasons.items(), key=lambda x: -x[1])):
            text = f"{n} {reason}"
            if i < _EXAMPLES:
                detail, span = self.examples[reason]
                text += f" (e.g. span {span.span_id} of trace {span.trace_id}: {detail[:200]})"
            parts.append(text)
        return "spans not recorded: " + "; ".join(parts)


class OtlpReceiver:
    """The receiver: a ``Placer``, a ``Joiner`` and a ``RecordWriter`` (see the module docs).

    ``clock`` gives "now" (Unix seconds) for the join window and the log's pace. ``target``
    overrides the records database (default ``config.gateway_database()``).
    ``tick_interval``: seconds between the background releases of due requests (None: no
    thread; ``tick()`` releases them, as tests do). ``start()`` before ``receive``; ``close()``
    at the end writes what is held.
    """

    def __init__(self, config: Config, *, clock: Clock = system_clock,
                 target: str | Path | None = None, tick_interval: float | None = 1.0,
                 targets: Callable[[], Iterable[TargetConfig]] | None = None) -> None:
        self.config = config
        self.otlp = config.otlp
        self.clock = clock
        # ``targets``: the targets now, discovered ones too (`vigil serve`'s collector's).
        self.placer = Placer(config, targets)
        self.joiner = Joiner(self.otlp.join_window, max_groups=self.otlp.max_buffer)
        # Admission (``receive``) keeps what is held within max_buffer plus one export's
        # records, and an export holds at most max_body // MIN_SPAN_BYTES request spans: the
        # writer's own bound, past which it would drop the oldest, is never reached.
        self.writer = RecordWriter(
            config.gateway_database() if target is None else target,
            max_queue=self.otlp.max_buffer + self.otlp.max_body // MIN_SPAN_BYTES)
        self.tick_interval = tick_interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._spans = dict.fromkeys(OUTCOMES, 0)
        self._rejected: dict[str, int] = {}
        self._elsewhere: dict[str, int] = {}
        self._exports: dict[int, int] = {}
        self._released = 0
        #: reason -> (when last logged, rejections since, an example's trace and span ids)
        self._unlogged: dict[str, list[Any]] = {}

    # --- lifecycle ------------------------------------------------------------------------
    @property
    def display(self) -> str:
        """The records database, without its password."""
        return self.writer.display

    def start(self) -> None:
        """Open the records database (``StoreError`` if it cannot be), start writing and
        releasing."""
        self.writer.start()
        if self.tick_interval is not None:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick_loop, name="otlp-join",
                                            daemon=True)
            self._ticker.start()

    def close(self, timeout: float = 10.0) -> int:
        """Stop serving, write every request held (whatever its age) and close the database;
        returns the records that could not be written (the writer logs them)."""
        self.stop_http()
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            self._put(self.joiner.drain(self.clock()))
        self._log_rejections(force=True)
        return self.writer.close(timeout)

    def _tick_loop(self) -> None:
        assert self.tick_interval is not None
        while not self._stop.wait(self.tick_interval):
            try:
                self.tick()
            except Exception:  # the thread must outlive one bad tick; the log tells why
                log.exception("releasing due OTLP requests failed")

    def tick(self) -> int:
        """Release the requests whose join window is over into the writer; how many."""
        with self._lock:
            return self._put(self.joiner.due(self.clock()))

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until every released record is written, at most ``timeout`` seconds."""
        return self.writer.flush(timeout)

    def _put(self, records: Iterable[GatewayRecord]) -> int:
        n = 0
        for record in records:
            self.writer.put(record)
            n += 1
        self._released += n
        return n

    # --- the protocol -----------------------------------------------------------------------
    def receive(self, body: bytes, content_type: str, content_encoding: str = "",
                peer: str = "") -> Reply:
        """Answer one ``POST /v1/traces``: HTTP status, body, content type, headers. ``peer``:
        the sender's address (places an engine's spans that name nothing else)."""
        media = _media_type(content_type)
        if media not in (PROTOBUF, JSON):
            return self._fail(415, f"Content-Type {content_type!r} is not OTLP's "
                                   f"({PROTOBUF} or {JSON})", JSON)
        try:
            export = decode_export(_inflate(body, content_encoding, self.otlp.max_body), media)
        except BadExport as exc:
            return self._fail(exc.status, str(exc), media)
        spans = list(request_spans(export))
        # Read outside the lock: the mapping is pure, and other exports may go on meanwhile.
        parts = [(s, self._part(s, peer)) for s in spans]
        # An upper bound on what this export adds: parts joining a held request add none.
        adding = sum(1 for _, p in parts if isinstance(p, Part))
        tally = _Tally()
        with self._lock:
            now = self.clock()
            # The timer in the request path: what is due goes out before admission counts it.
            self._put(self.joiner.due(now))
            held = self.writer.buffered + len(self.joiner)
            if held and held + adding > self.otlp.max_buffer:
                self._spans[THROTTLED] += len(spans)
                self._exports[503] = self._exports.get(503, 0) + 1
                reply = self._error(503, f"{held} records are waiting for the database "
                                         f"({self.otlp.max_buffer} at most, [otlp] max_buffer); "
                                         f"retry in {RETRY_AFTER_S} s", media)
                return reply._replace(headers={"Retry-After": str(RETRY_AFTER_S)})
            for span, part in parts:
                if part is None:
                    tally.outcomes[NOT_REQUEST] += 1
                elif isinstance(part, Rejected):
                    tally.reject(part, span)
                else:
                    late = self.joiner.late
                    self._put(self.joiner.add(part, now))
                    tally.outcomes[LATE if self.joiner.late > late else RECORDED] += 1
            for outcome, n in tally.outcomes.items():
                self._spans[outcome] += n
            for reason, n in tally.elsewhere.items():
                self._elsewhere[reason] = self._elsewhere.get(reason, 0) + n
            for reason, n in tally.reasons.items():
                self._rejected[reason] = self._rejected.get(reason, 0) + n
                entry = self._unlogged.setdefault(reason, [float("-inf"), 0, ""])
                entry[1] += n
                _, span = tally.examples[reason]
                entry[2] = f"trace {span.trace_id} span {span.span_id}"
            self._exports[200] = self._exports.get(200, 0) + 1
        self._log_rejections()
        response = ExportTraceServiceResponse()
        if tally.reasons:
            response.partial_success.CopyFrom(ExportTracePartialSuccess(
                rejected_spans=tally.outcomes[REJECTED], error_message=tally.message()))
        return Reply(200, _encode(response, media), media, {})

    def _part(self, span: RequestSpan, peer: str) -> Part | Rejected | None:
        try:
            return part_of(span, self.placer, peer)
        except Exception as exc:  # a span the mapping did not foresee: refused, not a crash
            log.debug("span %s of trace %s could not be read", span.span_id, span.trace_id,
                      exc_info=True)
            return Rejected("unreadable span", f"{type(exc).__name__}")

    def _fail(self, status: int, message: str, media: str) -> Reply:
        self.count_export(status)
        return self._error(status, message, media)

    def count_export(self, status: int) -> None:
        """Count an export answered ``status`` without ``receive`` (the HTTP side refusing a
        body before reading it)."""
        with self._lock:
            self._exports[status] = self._exports.get(status, 0) + 1

    @staticmethod
    def _error(status: int, message: str, media: str) -> Reply:
        body, ctype = _status_body(status, message, media)
        return Reply(status, body, ctype, {})

    def _log_rejections(self, *, force: bool = False) -> None:
        """One line per rejection reason and minute at the most, with the count since the last
        line and an example's ids (never what the spans carried)."""
        now = self.clock()
        lines = []
        with self._lock:
            for reason, entry in self._unlogged.items():
                last, n, example = entry
                if n and (force or now - last >= LOG_EVERY_S):
                    lines.append((reason, n, example))
                    entry[0], entry[1] = now, 0
        for reason, n, example in lines:
            log.warning("refused %d spans: %s (e.g. %s)", n, reason, example)

    # --- counters ---------------------------------------------------------------------------
    def counts(self) -> dict[str, Any]:
        """Spans by outcome (``spans``) and rejection reason (``rejected``), exports by HTTP
        status, records released, written, dropped and refused by the database, and what is
        held now (``buffered``: queued for the database, ``held``: requests in the joiner)."""
        with self._lock:
            return {
                "spans": dict(self._spans),
                "rejected": dict(self._rejected),
                "elsewhere": dict(self._elsewhere),
                "exports": dict(self._exports),
                "joined": self.joiner.joined,
                "released": self._released,
                "written": self.writer.written,
                "dropped": self.writer.dropped,
                "refused": self.writer.rejected,
                "buffered": self.writer.buffered,
                "held": len(self.joiner),
            }

    # --- HTTP -------------------------------------------------------------------------------
    def serve_http(self, host: str, port: int) -> tuple[str, int]:
        """Serve ``POST /v1/traces`` (and ``GET /metrics``: ``OtlpCollector``) on a thread;
        returns the address bound (port 0: the kernel's choice)."""
        if self._http is not None:
            raise RuntimeError("the OTLP receiver already serves HTTP")
        self._http = _http_server(host, port, self)
        self._http_thread = threading.Thread(target=self._http.serve_forever,
                                             name="otlp-http", daemon=True)
        self._http_thread.start()
        return host, int(self._http.server_address[1])

    def stop_http(self) -> None:
        """Stop taking exports (answers under way finish)."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


def _http_server(host: str, port: int, receiver: OtlpReceiver) -> ThreadingHTTPServer:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OtlpCollector(receiver))
    max_body = receiver.otlp.max_body

    class Handler(BaseHTTPRequestHandler):
        # Keep-alive: exporters send batch after batch on one connection.
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != TRACES_PATH:
                self._drain_or_close()
                self._reply(404, "text/plain; charset=utf-8",
                            f"not found: OTLP traces are POSTed to {TRACES_PATH}\n".encode())
                return
            length = self.headers.get("Content-Length")
            ctype = self.headers.get("Content-Type", "")
            media = _media_type(ctype)
            if length is None or not length.isdigit():
                self.close_connection = True  # a body of unknown length cannot be skipped
                body, rtype = _status_body(411, "Content-Length is required", media)
                receiver.count_export(411)
                self._reply(411, rtype, body)
                return
            if int(length) > max_body:
                # Not read: the connection is closed instead of reading what is refused.
                self.close_connection = True
                body, rtype = _status_body(413, f"the body is {length} bytes, more than the "
                                                f"{max_body} accepted ([otlp] max_body)", media)
                receiver.count_export(413)
                self._reply(413, rtype, body)
                return
            data = self.rfile.read(int(length))
            try:
                reply = receiver.receive(data, ctype, self.headers.get("Content-Encoding", ""),
                                         peer=str(self.client_address[0]))
            except Exception:  # a defect: the sender gets a 500, the log the traceback
                log.exception("an OTLP export could not be handled")
                body, rtype = _status_body(500, "internal error", media)
                self._reply(500, rtype, body)
                return
            self._reply(reply.status, reply.content_type, reply.body, reply.headers)

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/metrics":
                encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
                self._reply(200, ctype, encoder(registry))
            else:
                self._reply(404, "text/plain; charset=utf-8",
                            f"not found: POST OTLP traces to {TRACES_PATH}\n".encode())

        def _drain_or_close(self) -> None:
            length = self.headers.get("Content-Length", "")
            if length.isdigit() and int(length) <= max_body:
                self.rfile.read(int(length))
            else:
                self.close_connection = True

        def _reply(self, status: int, ctype: str, body: bytes,
                   headers: dict[str, str] | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the sender left; it retries on its own

        def log_message(self, *args: object) -> None:
            pass  # one line per export would drown the log; counts() has the figures

    return threading_http_server(host, port, Handler)


class OtlpCollector:
    """The receiver's counters as Prometheus series (a ``prometheus_client`` collector, for
    `vigil serve`'s ``/metrics`` and the receiver's own)."""

    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def collect(self) -> Iterator[Metric]:
        """The series, from ``counts()`` at scrape time."""
        c = self.receiver.counts()
        spans = CounterMetricFamily(
            METRIC_SPANS, "Spans received over OTLP, by outcome (recorded, not_request, "
            "rejected, late, throttled, elsewhere) and, for rejected and elsewhere, reason",
            labels=["outcome", "reason"])
        for outcome in OUTCOMES:
            if outcome not in (REJECTED, ELSEWHERE):
                spans.add_metric([outcome, ""], float(c["spans"][outcome]))
        for reason, n in sorted(c["rejected"].items()):
            spans.add_metric([REJECTED, reason], float(n))
        for reason, n in sorted(c["elsewhere"].items()):
            spans.add_metric([ELSEWHERE, reason], float(n))
        yield spans
        exports = CounterMetricFamily(METRIC_EXPORTS, "OTLP trace exports answered, by HTTP "
                                      "status", labels=["code"])
        for code, n in sorted(c["exports"].items()):
            exports.add_metric([str(code)], float(n))
        yield exports
        yield CounterMetricFamily(METRIC_RECORDS_WRITTEN, "Request records from spans written "
                                  "to the records database", value=float(c["written"]))
        yield CounterMetricFamily(METRIC_RECORDS_DROPPED, "Request records from spans lost "
                                  "(buffer full) or refused by the database",
                                  value=float(c["dropped"] + c["refused"]))
        yield GaugeMetricFamily(METRIC_BUFFERED, "Request records held in memory: queued for "
                                "the database, or waiting for their other spans",
                                value=float(c["buffered"] + c["held"]))
