"""A request span as (part of) a request record: ``part_of`` reads one span, ``merge`` joins
the parts of one request (a router's span and vLLM's) into the record Vigil's gateway would
have written (``vigil.storage.gateway_records.GatewayRecord``).

**Where it ran** (``Placer``): the pool is the attribute ``[otlp] pool_attribute``, else the
engine the span names (``server.address``/``server.port``) matched to a configured target's
API address (which also gives the replica), else the model when exactly one pool serves it.
A span none of these place is refused as unmapped, naming what it carried.

**Who sent it**: the tenant is the first of ``[otlp] tenant_attributes`` present (LiteLLM's key
alias, ``user.id``), the tier the first of ``tier_attributes``; the key is LiteLLM's hashed key.

**What happened**: tokens are the engine's own count when vLLM's span is there (its usage),
else the router's; time to first token, queue time from vLLM's span (seconds), else the
router's ``gen_ai.response.time_to_first_chunk``; end-to-end is the router's span (what its
client waited) over the engine's ``gen_ai.latency.e2e``. An error is a span with status
ERROR or an HTTP status of 5xx (``error.type`` classifies it); a 4xx is the client's, as in
the gateway's records.

**Refused** (``Rejected``, counted by reason): a request span without a model or pool that
places it, a negative duration or an end before its start, token counts that are not
non-negative integers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from serving.otlp.spans import ENGINE, STATUS_ERROR, RequestSpan, kind_of
from vigil.config import Config, OtlpConfig, TargetConfig
from vigil.conventions import (
    ENDPOINT_CHAT,
    ENDPOINT_COMPLETIONS,
    ENDPOINT_EMBEDDINGS,
    ERROR_BAD_REQUEST,
    ERROR_REJECTED,
    ERROR_TIMEOUT,
    ERROR_UNAUTHORIZED,
    ERROR_UPSTREAM_4XX,
    ERROR_UPSTREAM_5XX,
    OTEL_VIGIL_REQUEST_ID,
    OTLP_RECORD_PREFIX,
    REQUEST_ID_PREFIX,
    TOKENS_UNKNOWN,
    TOKENS_USAGE,
)
from vigil.storage.gateway_records import GatewayRecord

__all__ = ["RECORD_PREFIX", "Part", "Placer", "Rejected", "merge", "part_of"]

RECORD_PREFIX = OTLP_RECORD_PREFIX
_NS = 1e-9
#: GenAI operation names -> the gateway's endpoint names.
_OPERATIONS = {"chat": ENDPOINT_CHAT, "text_completion": ENDPOINT_COMPLETIONS,
               "completion": ENDPOINT_COMPLETIONS, "embeddings": ENDPOINT_EMBEDDINGS,
               "acompletion": ENDPOINT_CHAT, "completion_call": ENDPOINT_CHAT,
               "atext_completion": ENDPOINT_COMPLETIONS, "aembedding": ENDPOINT_EMBEDDINGS}
#: A router's 4xx answers -> the gateway's classes of a request refused before a replica.
_REFUSALS = {401: ERROR_UNAUTHORIZED, 403: ERROR_UNAUTHORIZED, 429: ERROR_REJECTED,
             400: ERROR_BAD_REQUEST, 413: ERROR_BAD_REQUEST, 422: ERROR_BAD_REQUEST}
#: error.type values (and HTTP statuses) -> the gateway's error classes.
_ERROR_CLASSES = {"timeout": ERROR_TIMEOUT, "Timeout": ERROR_TIMEOUT,
                  "APITimeoutError": ERROR_TIMEOUT, "RateLimitError": ERROR_REJECTED,
                  "429": ERROR_REJECTED}


@dataclass(frozen=True)
class Rejected:
    """A request span that cannot be a record: ``reason`` is the counter's label (``"no
    pool"``, ``"negative duration"``, ...), ``detail`` what the span carried. ``refused``
    False: not an error in the span, a request recorded elsewhere (by Vigil's gateway, or a
    pool whose records come from it), so not reported back to the sender as rejected."""

    reason: str
    detail: str
    refused: bool = True


@dataclass(frozen=True)
class Part:
    """What one span says of a request. ``keys`` join it with the request's other spans:
    its request id, and for a router's span its own span id (an engine span whose parent it
    is belongs to the same request)."""

    source: str
    keys: tuple[str, ...]
    trace_id: str
    span_id: str
    start_s: float
    end_s: float
    pool: str
    replica: str
    model: str
    endpoint: str
    tenant: str
    tier: str
    key_id: str
    stream: bool
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    ttft_s: float | None
    queue_s: float | None
    e2e_s: float | None
    status: int
    error: bool
    error_class: str
    request_id: str
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Placer:
    """Which pool (and replica) a span ran on, from the config's pools and targets.

    ``targets``: the targets as they are now, static and discovered (`vigil serve` passes its
    collector's); read again at most every ``REFRESH_S`` seconds, so a replica discovery adds
    is known to the receiver within that. Without it, the config's static targets."""

    #: Seconds between two readings of ``targets``, at the least.
    REFRESH_S = 1.0

    def __init__(self, config: Config,
                 targets: Callable[[], Iterable[TargetConfig]] | None = None) -> None:
        self.otlp: OtlpConfig = config.otlp
        self.pools = {p.name for p in config.pools}
        self.allowed = set(config.otlp.pools) if config.otlp.pools else self.pools
        self._targets = targets
        self._read_at = -math.inf
        self._servers: dict[tuple[str, int], tuple[str, str]] = {}
        self._hosts: dict[str, list[tuple[str, str]]] = {}
        self._index(config.targets)
        self._models: dict[str, list[str]] = {}
        for p in config.pools:
            self._models.setdefault(p.model, []).append(p.name)

    def _index(self, targets: Iterable[TargetConfig]) -> None:
        servers: dict[tuple[str, int], tuple[str, str]] = {}
        for t in targets:
            parts = urlsplit(t.api_base)
            if parts.hostname:
                port = parts.port or (443 if parts.scheme == "https" else 80)
                servers[(parts.hostname.lower(), port)] = (t.pool, t.name)
        # Per host, the targets there: an engine's span names no server, but it comes from
        # the engine's own host (``peer``).
        hosts: dict[str, list[tuple[str, str]]] = {}
        for (host, _), placed in servers.items():
            hosts.setdefault(host, []).append(placed)
        self._servers, self._hosts = servers, hosts

    def _refresh(self) -> None:
        if self._targets is None:
            return
        now = time.monotonic()  # pacing only: which targets exist is not a measurement
        if now - self._read_at < self.REFRESH_S:
            return
        self._read_at = now
        try:
            self._index(list(self._targets()))
        except RuntimeError:  # the discovery changed the set while it was read: next time
            self._read_at = -math.inf

    def place(self, span: RequestSpan, model: str, peer: str = "") -> tuple[str, str] | Rejected:
        """``(pool, replica)`` of ``span`` (replica "" when unknown), or why not. ``peer``: the
        address the export came from; the last resort, for an engine's span that names
        neither pool, server nor model (vLLM 0.32 exports from its own host): the pool of
        the targets on that host, when they are of one pool (the replica when one target)."""
        self._refresh()
        named = span.get(self.otlp.pool_attribute)
        address = span.get("server.address", "net.peer.name")
        port = span.get("server.port", "net.peer.port")
        replica = ""
        pool = ""
        if address is not None:
            try:
                found = self._servers.get((str(address).lower(), int(port or 0)))
            except (TypeError, ValueError):
                found = None
            if found is not None:
                pool, replica = found
        if named is not None:
            pool = str(named)
            if pool not in self.pools:
                return Rejected("unknown pool", f"{self.otlp.pool_attribute}={pool!r}")
        if not pool:
            candidates = self._models.get(model, [])
            if len(candidates) == 1:
                pool = candidates[0]
            elif candidates:
                return Rejected("ambiguous model", f"model {model!r} is served by pools "
                                f"{', '.join(candidates)}; name the pool with "
                                f"{self.otlp.pool_attribute}")
        if not pool and peer:
            there = self._hosts.get(peer.lower(), [])
            if len({p for p, _ in there}) == 1:
                pool = there[0][0]
                replica = there[0][1] if len(there) == 1 else ""
        if not pool:
            where = f" at {address}:{port}" if address is not None else ""
            what = f"model {model!r}" if model else "no model"
            return Rejected("no pool" if model else "no model",
                            f"{what}{where}: no configured pool or target matches")
        if pool not in self.allowed:
            return Rejected("pool not read from spans", f"pool {pool!r} is not in [otlp] pools",
                            refused=False)
        return pool, replica


def _tokens(value: Any) -> int | Rejected | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return Rejected("bad token count", repr(value)[:80])
    try:
        number = float(value)
    except ValueError:
        return Rejected("bad token count", repr(value)[:80])
    if not math.isfinite(number) or number < 0 or number != int(number):
        return Rejected("bad token count", repr(value)[:80])
    return int(number)


def _seconds(value: Any, name: str) -> float | Rejected | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return Rejected("bad duration", f"{name}={value!r}"[:120])
    if not math.isfinite(number):
        return Rejected("bad duration", f"{name}={value!r}"[:120])
    if number < 0:
        return Rejected("negative duration", f"{name}={number:g}")
    return number


def _first(span: RequestSpan, names: Sequence[str]) -> str:
    value = span.get(*names) if names else None
    return "" if value is None else str(value)


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def part_of(span: RequestSpan, placer: Placer, peer: str = "") -> Part | Rejected | None:
    """What ``span`` says of its request; ``None`` when it is not a request span. ``peer``:
    the address the export came from (``Placer.place``)."""
    source = kind_of(span)
    if source is None:
        return None
    gateway_id = span.get(OTEL_VIGIL_REQUEST_ID)
    if gateway_id is not None:
        # Vigil's own gateway's span ([gateway.otel]): the gateway wrote its record.
        return Rejected("through Vigil's gateway", str(gateway_id), refused=False)
    if span.end_ns < span.start_ns:
        return Rejected("negative duration", f"span {span.span_id} ends before it starts")
    model = _first(span, ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name",
                          "litellm.model_group"))
    placed = placer.place(span, model, peer)
    if isinstance(placed, Rejected):
        return placed
    pool, replica = placed
    engine = source == ENGINE
    prompt = _tokens(span.get(*(("gen_ai.usage.prompt_tokens",) if engine else (
        "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"))))
    completion = _tokens(span.get(*(("gen_ai.usage.completion_tokens",) if engine else (
        "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
        "llm.token_count.completion"))))
    cached = _tokens(span.get("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cached_tokens",
                              "llm.token_count.prompt_details.cache_read"))
    ttft = _seconds(span.get("gen_ai.latency.time_to_first_token",
                             "gen_ai.response.time_to_first_chunk"), "time to first token")
    queue = _seconds(span.get("gen_ai.latency.time_in_queue"), "gen_ai.latency.time_in_queue")
    e2e = _seconds(span.get("gen_ai.latency.e2e"), "gen_ai.latency.e2e")
    for value in (prompt, completion, cached, ttft, queue, e2e):
        if isinstance(value, Rejected):
            return value
    assert not isinstance(prompt, Rejected) and not isinstance(completion, Rejected)
    assert not isinstance(cached, Rejected)
    assert not isinstance(ttft, Rejected) and not isinstance(queue, Rejected)
    assert not isinstance(e2e, Rejected)
    if engine and ttft == 0.0:
        ttft = None  # vLLM reports 0.0 when no token was produced
    start_s, end_s = span.start_ns * _NS, span.end_ns * _NS
    if e2e is None and not engine:
        e2e = end_s - start_s
    status_attr = span.get("http.response.status_code", "http.status_code", "error.code")
    try:
        status = int(status_attr) if status_attr is not None else 0
    except (TypeError, ValueError):
        status = 0
    error_type = _first(span, ("error.type",))
    error = (span.status == STATUS_ERROR and not 400 <= status < 500) or status >= 500
    if not status:
        status = 500 if error else 200
    error_class = ""
    if error:
        error_class = _ERROR_CLASSES.get(error_type, ERROR_UPSTREAM_5XX)
    elif 400 <= status < 500:
        error_class = _REFUSALS.get(status, ERROR_UPSTREAM_4XX)
    request_id = _first(span, ("gen_ai.request.id",) if engine else (
        "gen_ai.response.id", "litellm.call_id"))
    if request_id.split("-", 1)[-1].startswith(REQUEST_ID_PREFIX):
        # vLLM's id for a request Vigil's gateway sent (its X-Request-Id): already recorded.
        return Rejected("through Vigil's gateway", request_id, refused=False)
    keys = [f"id:{request_id}"] if request_id else []
    if engine and span.parent_id:
        keys.append(f"span:{span.parent_id}")
    elif not engine:
        keys.append(f"span:{span.span_id}")
    operation = _first(span, ("gen_ai.operation.name", "llm.request.type"))
    return Part(
        source=source, keys=tuple(keys), trace_id=span.trace_id, span_id=span.span_id,
        start_s=start_s, end_s=end_s, pool=pool, replica=replica, model=model,
        endpoint=_OPERATIONS.get(operation, ENDPOINT_CHAT if engine else operation or ""),
        tenant=_first(span, placer.otlp.tenant_attributes),
        tier=_first(span, placer.otlp.tier_attributes),
        key_id=_first(span, ("metadata.user_api_key_hash", "litellm.api_key.hash")),
        stream=_truthy(span.get("gen_ai.request.stream", "llm.is_streaming",
                                "litellm.request.streaming")),
        prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
        ttft_s=ttft, queue_s=queue,
        e2e_s=e2e, status=status, error=error, error_class=error_class,
        request_id=request_id, message=(span.status_message or error_type)[:500])


def _pick(parts: Sequence[Part], name: str, prefer: str) -> Any:
    """The first non-empty value of ``name``, from the ``prefer`` source's parts first."""
    ordered = sorted(parts, key=lambda p: p.source != prefer)
    for p in ordered:
        value = getattr(p, name)
        if value not in (None, ""):
            return value
    return getattr(ordered[0], name)


def record_id(parts: Iterable[Part]) -> str:
    """The record's id: its request id when a part has one (a retried export, or the same
    request received by another copy, gets the same id), else its router span's, else its
    engine span's trace and span ids. The engine's request id first, then the smallest ids:
    the same parts give the same id whatever order they arrived in."""
    ordered = sorted(parts, key=lambda p: (p.source != ENGINE, p.request_id, p.trace_id,
                                           p.span_id))
    for p in ordered:
        if p.request_id:
            return RECORD_PREFIX + p.request_id
    chosen = next((p for p in ordered if p.source != ENGINE), ordered[0])
    return f"{RECORD_PREFIX}{chosen.trace_id}-{chosen.span_id}"


def merge(parts: Sequence[Part]) -> GatewayRecord:
    """One request's record from the parts of its spans (see the module docs)."""
    if not parts:
        raise ValueError("a record needs at least one span")
    router = [p for p in parts if p.source != ENGINE]
    prompt = _pick(parts, "prompt_tokens", ENGINE)
    completion = _pick(parts, "completion_tokens", ENGINE)
    start = min(p.start_s for p in (router or parts))
    end = max(p.end_s for p in (router or parts))
    return GatewayRecord(
        id=record_id(parts), start_s=start, ts_s=end,
        pool=_pick(parts, "pool", "router"), model=_pick(parts, "model", "router"),
        endpoint=_pick(parts, "endpoint", "router"), tenant=_pick(parts, "tenant", "router"),
        tier=_pick(parts, "tier", "router"), key_id=_pick(parts, "key_id", "router"),
        replica=_pick(parts, "replica", ENGINE), status=_pick(parts, "status", "router"),
        stream=any(p.stream for p in parts),
        prompt_tokens=prompt or 0, completion_tokens=completion or 0,
        tokens_source=TOKENS_USAGE if prompt is not None or completion is not None
        else TOKENS_UNKNOWN,
        ttft_s=_pick(parts, "ttft_s", ENGINE), e2e_s=_pick(parts, "e2e_s", "router"),
        queue_s=_pick(parts, "queue_s", ENGINE) or 0.0,
        error=any(p.error for p in parts), error_class=_pick(parts, "error_class", "router"),
        cache_hit="", requested_max_tokens=None, max_tokens=None, max_tokens_decision="",
        cost_usd=None, saved_usd=None, upstream_id=_pick(parts, "request_id", ENGINE),
        batch_id="", message=_pick(parts, "message", "router"),
        cached_tokens=_pick(parts, "cached_tokens", ENGINE))

