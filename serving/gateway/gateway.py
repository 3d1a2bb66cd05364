"""One request's way through the gateway, from its bytes to its record.

``Gateway.handle`` (HTTP) and ``Gateway.send_batch`` (the batch queue) share one path::

    read the body (bounded) -> API key -> JSON and fields -> model -> pool -> max_tokens policy
      -> budgets (a spent one demotes to batch or refuses) -> semantic cache (a hit answers here)
      -> tier admission -> replica (least outstanding)
      -> upstream, streaming or not (cancelled as soon as the client goes) -> record + metrics

Every request that reaches the gateway ends in exactly one record
(``vigil.storage.gateway_records.GatewayRecord``, built by ``Gateway._record``), refusals included,
written by the records thread after the response is under way. The body is parsed once and
serialised once (the policy and the tier's ``priority`` change it); upstream bytes go to the
client as they came, the only exception being the usage chunk the gateway asked for on a
client's behalf.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from serving.gateway.accounting import gpu_cost_per_second
from serving.gateway.admission import Admission
from serving.gateway.batch.interface import BatchReply, BatchRequest, QueueDepth
from serving.gateway.budgets import DEMOTE, HEADER_BUDGET, REFUSE, BudgetPoller, header_value
from serving.gateway.caching import CacheBridge
from serving.gateway.errors import (
    BodyTooLarge,
    BudgetSpent,
    ModelNotFound,
    NoReplica,
    OverCap,
    QueueFull,
    Unauthorized,
    error_body,
    upstream_5xx_class,
)
from serving.gateway.front.api_keys import KeyRing
from serving.gateway.front.client import ClientGone, DisconnectWatch, header, read_body
from serving.gateway.front.relay import relay
from serving.gateway.front.request_body import Incoming, parse_body, render_body, validate
from serving.gateway.front.responses import (
    CONTENT_SSE,
    raw_headers,
    send_body,
    send_json,
    send_start,
)
from serving.gateway.front.sse import StreamTally
from serving.gateway.max_tokens import MaxTokens, apply_max_tokens
from serving.gateway.telemetry.metrics import GatewayMetrics
from serving.gateway.telemetry.otel import GatewayTelemetry
from serving.gateway.telemetry.record_writer import RecordWriter
from serving.gateway.tiers import Caller
from serving.gateway.upstream.forwarder import (
    Charge,
    Forwarder,
    OpenStream,
    UpstreamReply,
    error_message,
)
from serving.gateway.upstream.replicas import Replica, Upstreams
from vigil.clock import Clock, system_clock
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    ENDPOINT_EMBEDDINGS,
    ENDPOINT_PATHS,
    ERROR_CLIENT_CANCEL,
    ERROR_CODE_BUDGET,
    ERROR_SERVER_CLASSES,
    ERROR_UPSTREAM_4XX,
    ERROR_UPSTREAM_5XX,
    HEADER_CACHE,
    HEADER_MAX_TOKENS,
    HEADER_REPLICA,
    HEADER_REQUEST_ID,
    PHASE_AFTER_FIRST_TOKEN,
    PHASE_BEFORE_FIRST_TOKEN,
    REJECT_BAD_REQUEST,
    REJECT_MODEL_NOT_FOUND,
    REJECT_NO_REPLICA,
    REJECT_OVER_CAP,
    REJECT_QUEUE_FULL,
    REJECT_TOO_LARGE,
    REJECT_UNAUTHORIZED,
    REQUEST_ID_PREFIX,
    STATUS_CLIENT_CLOSED,
    TIER_BATCH,
    TIER_PREMIUM,
    TIER_PRIORITY,
    TOKEN_COMPLETION,
    TOKEN_PROMPT,
    TOKENS_CHUNKS,
    TOKENS_UNKNOWN,
    TOKENS_USAGE,
)
from vigil.errors import GatewayError
from vigil.storage.gateway_records import GatewayRecord

__all__ = ["Call", "Gateway", "new_request_id"]

log = logging.getLogger("vigil.gateway")

_MESSAGE_CHARS = 500
#: Request ids: 128 random bits. Not ``uuid4``: its ``os.urandom`` is a system call per request,
#: and an id needs to be unique, not unpredictable (``random`` is seeded from the OS once).
_ids = random.Random()


def new_request_id() -> str:
    """A fresh ``vgl-<32 hex>`` request id."""
    return f"{REQUEST_ID_PREFIX}{_ids.getrandbits(128):032x}"


@dataclass(slots=True)
class Call:
    """One request as the gateway follows it (filled in as it goes)."""

    id: str
    endpoint: str
    #: Arrival, Unix seconds (the injected clock) and ``time.perf_counter`` seconds.
    start_s: float
    t0: float
    caller: Caller | None = None
    model: str = ""
    pool: str = ""
    stream: bool = False
    include_usage: bool = False
    requested_max_tokens: int | None = None
    max_tokens: MaxTokens | None = None
    queue_s: float = 0.0
    cache_key: Any = None
    cache_header: str | None = None
    #: ``X-Vigil-Budget`` when a spent budget demoted (or refused) it.
    budget_header: str | None = None
    batch_id: str = ""
    #: The replica it ran on and the replica time it is charged for.
    charge: Charge = field(default_factory=Charge)
    #: The response has started (an error can no longer be answered, only recorded).
    responded: bool = False
    #: The record is queued (exactly one per request).
    recorded: bool = False
    #: Its OpenTelemetry span ([gateway.otel]), ended with the record.
    span: Any = None

    @property
    def tier(self) -> str:
        return self.caller.tier if self.caller else ""

    def headers(self, replica: Replica | None = None) -> dict[str, str]:
        """The ``X-Vigil-*`` response headers."""
        h = {HEADER_REQUEST_ID: self.id}
        if replica is not None:
            h[HEADER_REPLICA] = replica.name
        if self.max_tokens is not None:
            h[HEADER_MAX_TOKENS] = self.max_tokens.header()
        if self.cache_header is not None:
            h[HEADER_CACHE] = self.cache_header
        if self.budget_header is not None:
            h[HEADER_BUDGET] = self.budget_header
        return h


def _requested(body: Mapping[str, Any], endpoint: str) -> int | None:
    """The max_tokens the client asked for, as vLLM reads it (None: none or not an int)."""
    keys = ("max_completion_tokens", "max_tokens") if endpoint == "chat" else ("max_tokens",)
    for k in keys:
        v = body.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


_INT64 = 2**63 - 1


def _int64(value: int | None) -> int | None:
    """``value`` if SQLite can store it as an integer, else None (a client may send 10**30)."""
    return value if value is None or -_INT64 <= value <= _INT64 else None


def _usage_tokens(data: Mapping[str, Any]) -> tuple[int, int, bool]:
    """(prompt, completion, exact) from a response's ``usage``."""
    usage = data.get("usage")
    if isinstance(usage, dict):
        p, c = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
        if (isinstance(p, int) and isinstance(c, int) and _int64(p) is not None
                and _int64(c) is not None):
            return p, c, True
    return 0, 0, False


def cached_prompt_tokens(usage: Any) -> int | None:
    """The prompt tokens vLLM's prefix cache served, from a usage's
    ``prompt_tokens_details.cached_tokens`` (vLLM sends it with
    ``--enable-prompt-tokens-details``); None when the answer does not say."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    n = details.get("cached_tokens") if isinstance(details, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**63 else None


def _finish_reason(data: Mapping[str, Any]) -> str | None:
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return None if reason is None else str(reason)
    return None


_REJECT_REASONS: dict[type[GatewayError], str] = {
    Unauthorized: REJECT_UNAUTHORIZED, BodyTooLarge: REJECT_TOO_LARGE,
    ModelNotFound: REJECT_MODEL_NOT_FOUND, OverCap: REJECT_OVER_CAP,
    QueueFull: REJECT_QUEUE_FULL, NoReplica: REJECT_NO_REPLICA,
    BudgetSpent: ERROR_CODE_BUDGET,
}


class Gateway:
    """The gateway's parts and the request path. ``start``/``aclose`` bracket serving."""

    def __init__(self, cfg: Config, *, clock: Clock = system_clock, cache: Any = None,
                 registry: Any = None, upstreams: Upstreams | None = None) -> None:
        self.cfg = cfg
        gw = cfg.gateway
        self._clock = clock
        self.upstreams = upstreams or Upstreams(cfg, clock=clock)
        self.keys = KeyRing(gw.api_keys)
        self.admission = Admission(gw, self.upstreams, clock=clock)
        self.budgets = BudgetPoller(cfg, clock=clock)
        self.forwarder = Forwarder(self.upstreams, read_timeout=gw.read_timeout,
                                   retry_after=self.admission.retry_after)
        self.records = RecordWriter(cfg.gateway_database(), max_queue=gw.records_buffer)
        self.otel = (GatewayTelemetry(gw.otel, server_address=gw.host, server_port=gw.port)
                     if gw.otel.enabled else None)
        self.cache = CacheBridge(gw.cache, clock=clock, cache=cache,
                                 database=cfg.gateway_database())
        #: The batch queue's depth per pool (set by the app when the queue runs).
        self.batch_depth: QueueDepth | None = None
        self.metrics = GatewayMetrics(depth=self.queue_depth, replicas=self.upstreams.replicas,
                                      dropped=lambda: self.records.dropped,
                                      buffered=lambda: self.records.buffered,
                                      write_failures=lambda: self.records.write_failures,
                                      rejected=lambda: self.records.rejected,
                                      cache=lambda: self.cache.stats(),
                                      registry=registry)
        self._pools: dict[str, PoolConfig] = {}
        for p in cfg.pools:
            if p.model in self._pools:
                log.warning("pools %r and %r serve the same model %r: requests go to %r",
                            self._pools[p.model].name, p.name, p.model,
                            self._pools[p.model].name)
                continue
            self._pools[p.model] = p
        # vLLM refuses a non-zero priority unless it runs --scheduling-policy priority.
        self._priority = {p.name: p.vllm.scheduling_policy == "priority" for p in cfg.pools}
        self._cost_rate = {p.name: gpu_cost_per_second(cfg, p.name) for p in cfg.pools}

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the records database, poll the replicas and the budgets once (then in the
        background), load the cache's embedding model."""
        # Opening may mean connecting to PostgreSQL and waiting on its migration lock: in a
        # thread, so that nothing else on the loop (a lifespan running beside it) waits.
        await asyncio.to_thread(self.records.start)
        await self.upstreams.start()
        await self.budgets.start()
        if self.cache.enabled:
            await self.cache.warm_up()

    async def aclose(self) -> None:
        """Stop polling, finish cache stores, write the last records."""
        await self.cache.aclose()
        await self.budgets.aclose()
        await self.upstreams.aclose()
        await asyncio.to_thread(self.records.close)  # waits up to 10 s for the last writes
        if self.otel is not None:
            await asyncio.to_thread(self.otel.shutdown)

    def pool_of_model(self, model: str) -> str | None:
        """The pool serving ``model``, or None."""
        p = self._pools.get(model)
        return p.name if p else None

    def models(self) -> list[tuple[str, str]]:
        """(model, pool) of every served model."""
        return [(m, p.name) for m, p in self._pools.items()]

    def queue_depth(self) -> dict[tuple[str, str], int]:
        """Requests waiting per (pool, tier): at the admission, plus the batch queue."""
        depth = dict(self.admission.waiting)
        if self.batch_depth is not None:
            for p in self.cfg.pools:
                key = (p.name, TIER_BATCH)
                depth[key] = depth.get(key, 0) + int(self.batch_depth(p.name))
        return depth

    # --- HTTP (raw ASGI: see front/responses.py for why) ----------------------------------

    async def handle(self, scope: Scope, receive: Receive, send: Send, endpoint: str) -> None:
        """Serve one POST to ``/v1/chat/completions``, ``/v1/completions`` or
        ``/v1/embeddings`` (``endpoint`` "chat", "completions", "embeddings"), as an ASGI app."""
        call = Call(id=new_request_id(), endpoint=endpoint,
                    start_s=self._clock(), t0=time.perf_counter())
        headers = scope["headers"]
        if self.otel is not None:
            call.span = self.otel.begin(headers)
        try:
            raw = await read_body(receive, header(headers, b"content-length"),
                                  self.cfg.gateway.max_body_bytes)
            call.caller = self.keys.authenticate(header(headers, b"authorization"))
            incoming = self.prepare(call, raw=raw)
            await self._serve(call, incoming, scope, receive, send)
        except GatewayError as exc:
            await self._refused(call, exc, send)
        except ClientGone:
            self._cancelled(call, first_token=False)
            await send_body(send, STATUS_CLIENT_CLOSED, b"", None, [])
        except Exception as exc:  # a bug: answer like the app's own handler, and record it
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            # Recorded as a server-side failure (the only 5xx class there is), so the SLOs
            # count it; the message names the exception.
            await self._refused(call, GatewayError(
                "The gateway failed on this request; it has been logged.", status=500,
                type="server_error", code="internal_error", error_class=ERROR_UPSTREAM_5XX),
                send, message=f"{type(exc).__name__}: {exc}")

    def prepare(self, call: Call, *, raw: bytes | None = None,
                body: dict[str, Any] | None = None) -> Incoming:
        """Parse and check the body, find the pool, apply the max_tokens policy (in place)."""
        if body is None:
            body = parse_body(raw or b"")
        incoming = validate(body, call.endpoint)
        call.model = incoming.model
        pool = self._pools.get(incoming.model)
        if pool is None:
            raise ModelNotFound(incoming.model)
        call.pool = pool.name
        if call.endpoint == ENDPOINT_EMBEDDINGS:
            # Embeddings are one JSON answer: a client's "stream" is not passed on, so that a
            # replica that would honour it cannot answer with events the gateway does not read.
            incoming.stream = False
            incoming.body.pop("stream", None)
            incoming.body.pop("stream_options", None)
            return incoming
        call.stream = incoming.stream
        call.include_usage = incoming.include_usage
        call.requested_max_tokens = _requested(body, call.endpoint)
        gw = self.cfg.gateway
        tier = call.tier
        call.max_tokens = apply_max_tokens(body, endpoint=call.endpoint, tier=tier,
                                           cap=gw.tier(tier).max_tokens_cap,
                                           default=gw.default_max_tokens, over_cap=gw.over_cap)
        return incoming

    async def _serve(self, call: Call, incoming: Incoming, scope: Scope, receive: Receive,
                     send: Send) -> None:
        # Before the cache: a refused tenant is refused whatever the cache holds (the 429 says
        # so), and a demoted hit is recorded at the tier it was served at.
        self._enforce_budget(call)
        if call.endpoint != ENDPOINT_EMBEDDINGS and self.cache.enabled:
            hit = await self._cache_lookup(call, incoming.body, Headers(scope=scope))
            if hit is not None:
                await self._cache_hit_response(call, hit, send)
                return
        # A client that leaves while it waits for admission, for the upstream, or in the middle
        # of the stream cancels it all.
        watch = DisconnectWatch(receive)
        try:
            answer = await self._admit_and_send(call, incoming.body)
        except asyncio.CancelledError:
            watch.stop()
            if watch.claim():
                raise ClientGone() from None
            raise
        except BaseException:
            watch.stop()
            raise
        if isinstance(answer, UpstreamReply):
            watch.stop()
            await self._unary_response(call, answer, send)
        else:
            await self._stream(call, answer, send, watch)

    def _enforce_budget(self, call: Call) -> None:
        """Apply the spent budgets to a new request (``budgets``): a "demote" one makes it a
        batch-tier request (admission, vLLM priority, record and metrics all see ``batch``), a
        "refuse" one raises ``BudgetSpent`` (429). Only here, before admission: a request
        already admitted, a stream included, is never cut when a budget is spent meanwhile.

        The max_tokens policy (``prepare``) stays the API key's tier's: a request within its
        own tier's cap is not rejected because a budget demoted it."""
        caller = call.caller
        assert caller is not None  # authenticated before prepare()
        budget = self.budgets.decide(caller.tenant, call.pool, caller.tier)
        if budget is None:
            return
        if budget.enforce == REFUSE:
            call.budget_header = header_value(REFUSE, budget)
            raise BudgetSpent(budget.name, month=budget.month, monthly=budget.monthly,
                              spent=budget.spent, currency=budget.currency)
        if budget.enforce == DEMOTE and caller.tier != TIER_BATCH:
            call.caller = dataclasses.replace(caller, tier=TIER_BATCH)
            call.budget_header = header_value(DEMOTE, budget)

    async def _admit_and_send(self, call: Call, body: dict[str, Any]
                              ) -> UpstreamReply | OpenStream:
        """Wait for the tier's admission, then send upstream: the complete answer, or an open
        stream."""
        call.queue_s = await self.admission.admit(call.pool, call.tier)
        payload = self._payload(call, body)
        path = ENDPOINT_PATHS[call.endpoint]
        premium = call.tier == TIER_PREMIUM
        prompt = self.forwarder.prompt_of(call.endpoint, body)  # prefix-aware routing's key
        trace = self._trace_headers(call)
        if not call.stream:
            return await self.forwarder.unary(call.pool, path, payload, premium=premium,
                                              charge=call.charge, prompt=prompt, trace=trace)
        return await self.forwarder.open(call.pool, path, payload, premium=premium,
                                         charge=call.charge, prompt=prompt, trace=trace)

    def _trace_headers(self, call: Call) -> bytes:
        """The request's own header lines for the replica: ``X-Request-Id`` (vLLM makes it its
        request id, ``chatcmpl-vgl-...``, so the spans vLLM exports of a request the gateway
        recorded are known for it and not recorded twice by ``serving.otlp``), and
        ``traceparent`` ([gateway.otel] propagate)."""
        own = f"X-Request-Id: {call.id}\r\n".encode()
        return own + (self.otel.upstream_headers(call.span) if self.otel is not None else b"")

    def _payload(self, call: Call, body: dict[str, Any]) -> bytes:
        """The upstream body: the client's after the policy, the tier's priority, usage asked
        for when streaming."""
        up = dict(body)
        if self._priority[call.pool]:
            up["priority"] = TIER_PRIORITY[call.tier]
        else:
            up.pop("priority", None)  # a client never picks its own priority
        if call.stream:
            options = up.get("stream_options")
            up["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                    "include_usage": True}
        return render_body(up)

    # --- the batch queue --------------------------------------------------------------------

    async def send_batch(self, item: BatchRequest) -> BatchReply:
        """``BatchQueue``'s ``send`` (``batch.interface.SendBatch``): one queued request through
        the non-streaming path at the batch tier's priority (no admission wait: the queue
        released it on headroom), recorded with its batch id. Returns (HTTP status, JSON body);
        errors are OpenAI error bodies."""
        call = Call(id=new_request_id(), endpoint=item.endpoint,
                    start_s=self._clock(), t0=time.perf_counter(), caller=item.caller,
                    batch_id=item.batch_id)
        if self.otel is not None:
            call.span = self.otel.begin()
        try:
            body = dict(item.body)
            body["stream"] = False  # a batch result is one JSON body
            body.pop("stream_options", None)
            incoming = self.prepare(call, body=body)
            # Queued work runs at the batch tier already: only a "refuse" budget changes it (a
            # 429 the queue retries like a busy pool's, then writes as the request's error).
            self._enforce_budget(call)
            if self.cache.enabled:
                hit = await self._cache_lookup(call, incoming.body, {})
                if hit is not None:
                    return 200, self._cache_hit_record(call, hit)
            reply = await self.forwarder.unary(call.pool, ENDPOINT_PATHS[call.endpoint],
                                               self._payload(call, incoming.body),
                                               charge=call.charge, prompt=self.forwarder
                                               .prompt_of(item.endpoint, incoming.body),
                                               trace=self._trace_headers(call))
        except GatewayError as exc:
            self._record_refusal(call, exc)
            return exc.status, error_body(exc)
        except asyncio.CancelledError:
            self._cancelled(call, first_token=False)  # shutdown: the queue sends it again
            raise
        self._conclude_unary(call, reply)
        return reply.status, reply.data

    # --- the semantic cache ----------------------------------------------------------------

    async def _cache_lookup(self, call: Call, body: dict[str, Any],
                            headers: Mapping[str, str]) -> Any:
        caller = call.caller
        assert caller is not None  # authenticated before prepare()
        decision = self.cache.decide(pool=call.pool, tenant=caller.tenant,
                                     endpoint=call.endpoint, body=body, headers=headers)
        call.cache_key, call.cache_header = decision.key, decision.header
        m = self.metrics
        if decision.key is None:
            m.cache_lookups.labels(call.pool, "bypass").inc()
            return None
        started = time.perf_counter()
        try:
            hit = await self.cache.lookup(decision.key)
        except Exception:  # the cache is an optimisation: its failure is a miss
            log.exception("semantic cache lookup failed")
            hit = None
        m.cache_seconds.labels(call.pool).observe(time.perf_counter() - started)
        if hit is None:
            m.cache_lookups.labels(call.pool, "miss").inc()
            return None
        call.cache_header = self.cache.hit_header(hit)
        m.cache_lookups.labels(call.pool, call.cache_header.replace("-", "_")).inc()
        return hit

    def _cache_hit_record(self, call: Call, hit: Any) -> dict[str, Any]:
        data: dict[str, Any] = hit.response
        prompt, completion, exact = _usage_tokens(data)
        elapsed = time.perf_counter() - call.t0
        self._record(call, status=200, prompt_tokens=prompt, completion_tokens=completion,
                     tokens_source=TOKENS_USAGE if exact else TOKENS_UNKNOWN,
                     ttft_s=elapsed if call.stream else None, e2e_s=elapsed,
                     cache_hit=str(hit.layer), saved_usd=self.cache.saved_usd(data),
                     upstream_id=str(data.get("id", "")))
        return data

    async def _cache_hit_response(self, call: Call, hit: Any, send: Send) -> None:
        data = self._cache_hit_record(call, hit)
        call.responded = True
        headers = raw_headers(call.headers())
        if call.stream:
            # A cached answer has nothing to wait for: the whole stream goes in one body.
            body = b"".join(self.cache.replay(data, include_usage=call.include_usage))
            await send_body(send, 200, body, CONTENT_SSE, headers)
        else:
            await send_json(send, 200, data, headers)

    # --- answers ----------------------------------------------------------------------------

    async def _unary_response(self, call: Call, reply: UpstreamReply, send: Send) -> None:
        self._conclude_unary(call, reply)
        call.responded = True
        await send_body(send, reply.status, reply.content, reply.content_type.encode(),
                        raw_headers(call.headers(reply.replica)))

    def _conclude_unary(self, call: Call, reply: UpstreamReply) -> None:
        """Record a complete upstream answer (and store it in the cache when it may be)."""
        data = reply.data
        prompt, completion, exact = _usage_tokens(data)
        elapsed = time.perf_counter() - call.t0
        error_class = message = ""
        if reply.status >= 500:
            message = error_message(data)
            error_class = upstream_5xx_class(message)
            self.metrics.upstream_errors.labels(call.pool, reply.replica.name, error_class).inc()
        elif reply.status >= 400:
            message, error_class = error_message(data), ERROR_UPSTREAM_4XX
        cost = self._record(call, status=reply.status, prompt_tokens=prompt,
                            completion_tokens=completion,
                            tokens_source=TOKENS_USAGE if exact else TOKENS_UNKNOWN,
                            ttft_s=None, e2e_s=elapsed,
                            error_class=error_class, message=message,
                            upstream_id=str(data.get("id", "")),
                            cached_tokens=cached_prompt_tokens(data.get("usage")))
        if reply.status == 200 and call.cache_key is not None and _finish_reason(data):
            self.cache.store_later(call.cache_key, data, cost)

    async def _stream(self, call: Call, opened: OpenStream, send: Send,
                      watch: DisconnectWatch) -> None:
        """Relay an open upstream stream; ``watch`` cancels it when the client leaves. However
        it ends, the upstream response is closed first (a client that left frees the GPU
        now), then the request is recorded."""
        tally = StreamTally(include_usage=call.include_usage,
                            keep_chunks=call.cache_key is not None)
        problem: GatewayError | None = None
        try:
            call.responded = True
            await send_start(send, raw_headers(call.headers(opened.replica)))
            problem = await relay(opened, tally, send, read_timeout=self.cfg.gateway.read_timeout)
        except asyncio.CancelledError:
            if not watch.claim():
                raise  # not the client (a shutdown): still closed and recorded below
        finally:
            watch.stop()
            opened.close(whole=tally.done and problem is None)
            self._stream_closed(call, opened, tally, problem)

    def _stream_closed(self, call: Call, opened: OpenStream, tally: StreamTally,
                       problem: GatewayError | None) -> None:
        """Record a stream that ended (finished, failed, or the client left)."""
        replica = opened.replica
        ttft = None if tally.first_at is None else tally.first_at - call.t0
        if problem is None and tally.error is None and not tally.done:
            self._cancelled(call, first_token=tally.first_at is not None, tally=tally,
                            ttft_s=ttft)
            return
        status, error_class, message = 200, "", ""
        if problem is not None:
            status, error_class, message = problem.status, problem.error_class, problem.reason
        elif tally.error is not None:
            message = str(tally.error.get("message", ""))
            code = tally.error.get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            error_class = upstream_5xx_class(message) if status >= 500 else ERROR_UPSTREAM_4XX
        if error_class in ERROR_SERVER_CLASSES:
            self.metrics.upstream_errors.labels(call.pool, replica.name, error_class).inc()
        completion, exact = tally.completion_tokens()
        cost = self._record(call, status=status, prompt_tokens=tally.prompt_tokens(),
                            completion_tokens=completion,
                            tokens_source=TOKENS_USAGE if exact else TOKENS_CHUNKS,
                            ttft_s=ttft, e2e_s=time.perf_counter() - call.t0,
                            error_class=error_class, message=message,
                            upstream_id=tally.upstream_id,
                            cached_tokens=cached_prompt_tokens(tally.usage))
        if (status == 200 and call.cache_key is not None and tally.finish_reason is not None
                and tally.chunks):
            response = self.cache.assemble(tally.chunks)
            if response is not None:
                self.cache.store_later(call.cache_key, response, cost)

    def _cancelled(self, call: Call, *, first_token: bool, tally: StreamTally | None = None,
                   ttft_s: float | None = None) -> None:
        phase = PHASE_AFTER_FIRST_TOKEN if first_token else PHASE_BEFORE_FIRST_TOKEN
        self.metrics.cancellations.labels(call.pool, call.tier, phase).inc()
        prompt = completion = 0
        source = TOKENS_UNKNOWN
        if tally is not None:
            completion, exact = tally.completion_tokens()
            prompt = tally.prompt_tokens()
            source = TOKENS_USAGE if exact else TOKENS_CHUNKS
        self._record(call, status=STATUS_CLIENT_CLOSED, prompt_tokens=prompt,
                     completion_tokens=completion, tokens_source=source, ttft_s=ttft_s,
                     e2e_s=time.perf_counter() - call.t0, error_class=ERROR_CLIENT_CANCEL,
                     message="the client went away")

    async def _refused(self, call: Call, exc: GatewayError, send: Send, *,
                       message: str | None = None) -> None:
        """Answer (and record) a request the gateway refuses or could not serve."""
        if not call.recorded:
            self._record_refusal(call, exc, message=message)
        if call.responded:
            return  # a failure after the answer started is in the record only
        headers = call.headers(call.charge.replica)
        if exc.retry_after is not None:
            headers["Retry-After"] = str(exc.retry_after)
        if isinstance(exc, Unauthorized):
            headers["WWW-Authenticate"] = "Bearer"
        if isinstance(exc, BodyTooLarge):
            headers["Connection"] = "close"
        if isinstance(exc, BudgetSpent):
            # The OpenAI SDKs retry a 429 unless told not to: this one lasts until the month
            # ends, so retrying in a second only makes more refusals.
            headers["X-Should-Retry"] = "false"
        call.responded = True
        await send_json(send, exc.status, error_body(exc), raw_headers(headers))

    def _record_refusal(self, call: Call, exc: GatewayError, *,
                        message: str | None = None) -> None:
        if isinstance(exc, OverCap):
            call.requested_max_tokens = exc.value
        # A timeout or upstream failure was served (and charged); anything else was refused.
        served = exc.error_class in ERROR_SERVER_CLASSES
        if served:
            replica = call.charge.replica
            self.metrics.upstream_errors.labels(
                call.pool, replica.name if replica else "", exc.error_class).inc()
        else:
            reason = _REJECT_REASONS.get(type(exc), REJECT_BAD_REQUEST)
            self.metrics.rejections.labels(call.pool, call.tier, reason).inc()
        self._record(call, status=exc.status, prompt_tokens=0, completion_tokens=0,
                     tokens_source=TOKENS_UNKNOWN, ttft_s=None,
                     e2e_s=time.perf_counter() - call.t0 if served else None,
                     error_class=exc.error_class,
                     message=exc.reason if message is None else message)

    # --- records and metrics ---------------------------------------------------------------

    def _record(self, call: Call, *, status: int, prompt_tokens: int, completion_tokens: int,
                tokens_source: str, ttft_s: float | None, e2e_s: float | None,
                error_class: str = "", message: str = "", cache_hit: str = "",
                saved_usd: float | None = None, upstream_id: str = "",
                cached_tokens: int | None = None) -> float | None:
        """Queue the record, update the metrics; returns the request's cost (USD, None when
        it never reached a replica). ``cached_tokens``: of the prompt, from vLLM's prefix
        cache (None: the answer did not say)."""
        pool, tier = call.pool, call.tier
        replica = call.charge.replica
        cost: float | None = None
        if replica is not None and pool:
            cost = call.charge.share_s * self._cost_rate[pool]
        m = self.metrics
        m.requests.labels(pool, tier, call.endpoint, str(status)).inc()
        if replica is not None or cache_hit:
            if status == 200 and e2e_s is not None:
                m.e2e.labels(pool, tier).observe(e2e_s)
            if ttft_s is not None:
                m.ttft.labels(pool, tier).observe(ttft_s)
            if prompt_tokens:
                m.tokens.labels(pool, tier, TOKEN_PROMPT).inc(prompt_tokens)
            if completion_tokens:
                m.tokens.labels(pool, tier, TOKEN_COMPLETION).inc(completion_tokens)
            if cost:
                m.cost.labels(pool, tier).inc(cost)
            if saved_usd:
                m.saved.labels(pool, tier).inc(saved_usd)
            if call.queue_s:
                m.queue_wait.labels(pool, tier).observe(call.queue_s)
        caller = call.caller
        mt = call.max_tokens
        call.recorded = True
        record = GatewayRecord(
            id=call.id, start_s=call.start_s, ts_s=self._clock(), pool=pool,
            model=call.model[:200], endpoint=call.endpoint,
            tenant=caller.tenant if caller else "", tier=tier,
            key_id=caller.key_id if caller else "",
            replica=replica.name if replica is not None else "", status=status,
            stream=call.stream, prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens, tokens_source=tokens_source, ttft_s=ttft_s,
            e2e_s=e2e_s, queue_s=call.queue_s, error=error_class in ERROR_SERVER_CLASSES,
            error_class=error_class, cache_hit=cache_hit,
            requested_max_tokens=_int64(call.requested_max_tokens),
            max_tokens=mt.value if mt else None, max_tokens_decision=mt.decision if mt else "",
            cost_usd=0.0 if cache_hit else cost, saved_usd=saved_usd,
            upstream_id=upstream_id, batch_id=call.batch_id, message=message[:_MESSAGE_CHARS],
            cached_tokens=cached_tokens)
        self.records.put(record)
        if self.otel is not None:
            self.otel.finish(call.span, record)
        return cost
