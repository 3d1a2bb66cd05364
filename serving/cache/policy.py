"""Which requests the cache may answer: the bypass rules, each with its reason.

A request bypasses the cache (neither looked up nor stored) when any of these holds, checked in
this order (the first reason is reported):

* ``disabled``  — ``[gateway.cache] enabled = false``;
* ``endpoint``  — not ``chat`` or ``completions`` (embeddings are never cached);
* ``pool``      — ``[gateway.cache] pools`` is not empty and does not list the pool;
* ``tenant``    — the tenant is in ``exclude_tenants``;
* ``opt_out``   — request header ``X-Vigil-Cache: off`` (name and value case-insensitive);
* ``personal``  — the body has a ``user`` (or ``safety_identifier``) field, whatever its value:
  the client says the answer is for one person;
* ``tools``     — ``tools``/``functions`` given, a ``tool_choice``/``function_call`` other than
  "none", or a tool result or assistant tool call in the conversation: tool answers depend on
  the outside world;
* ``n``         — ``n`` other than 1: several samples are wanted, not one answer;
* ``logprobs``  — ``logprobs``/``top_logprobs``/``prompt_logprobs``: per-token data of one run;
* ``sampled``   — the request samples (see below) and ``cache_sampled`` is false;
* ``malformed`` / ``content`` — a body we cannot key (wrong types; images, token-id prompts).
  The cache never rejects a request: the upstream answers it and reports its errors.

**Sampled or greedy.** A request is greedy when ``temperature`` is 0 (or ``top_k`` is 1, which
vLLM also treats as greedy). A *missing* temperature counts as sampled: OpenAI's default is 1,
and vLLM's default comes from the model's ``generation_config.json`` (Llama-3.1-8B-Instruct
ships temperature 0.6), falling back to 1.0, so an absent temperature almost always means
sampling. Caching a sample would replay one random draw to everyone; ``cache_sampled = true``
accepts that (the partition then includes temperature, top_p, seed, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vigil.config import CacheConfig
from vigil.conventions import (
    CACHE_BYPASS_DISABLED,
    CACHE_BYPASS_ENDPOINT,
    CACHE_BYPASS_LOGPROBS,
    CACHE_BYPASS_MALFORMED,
    CACHE_BYPASS_N,
    CACHE_BYPASS_OPT_OUT,
    CACHE_BYPASS_PERSONAL,
    CACHE_BYPASS_POOL,
    CACHE_BYPASS_SAMPLED,
    CACHE_BYPASS_TENANT,
    CACHE_BYPASS_TOOLS,
    CACHE_OPT_OUT,
    ENDPOINT_CHAT,
    ENDPOINT_COMPLETIONS,
    HEADER_CACHE,
)

__all__ = ["bypass_reason", "is_sampled"]

_PERSONAL_FIELDS = ("user", "safety_identifier")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_sampled(body: Mapping[str, Any]) -> bool:
    """True when the request samples (temperature absent or > 0, unless ``top_k`` is 1)."""
    if body.get("top_k") == 1:
        return False
    temperature = body.get("temperature")
    return temperature is None or (_number(temperature) and temperature > 0)


def _opted_out(headers: Mapping[str, str]) -> bool:
    wanted = HEADER_CACHE.lower()
    return any(name.lower() == wanted and str(value).strip().lower() == CACHE_OPT_OUT
               for name, value in headers.items())


def _uses_tools(body: Mapping[str, Any]) -> bool:
    if body.get("tools") or body.get("functions"):
        return True
    for choice in ("tool_choice", "function_call"):
        if body.get(choice) not in (None, "none"):
            return True
    messages = body.get("messages")
    if isinstance(messages, list):
        for msg in messages:
            if not isinstance(msg, dict):
                continue
            if msg.get("role") in ("tool", "function"):
                return True
            if msg.get("tool_calls") or msg.get("function_call"):
                return True
    return False


def bypass_reason(cfg: CacheConfig, *, pool: str, tenant: str, endpoint: str,
                  body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """Why the request must bypass the cache (a ``CACHE_BYPASS_*`` value), or None."""
    if not cfg.enabled:
        return CACHE_BYPASS_DISABLED
    if endpoint not in (ENDPOINT_CHAT, ENDPOINT_COMPLETIONS):
        return CACHE_BYPASS_ENDPOINT
    if cfg.pools and pool not in cfg.pools:
        return CACHE_BYPASS_POOL
    if tenant in cfg.exclude_tenants:
        return CACHE_BYPASS_TENANT
    if _opted_out(headers):
        return CACHE_BYPASS_OPT_OUT
    if any(f in body for f in _PERSONAL_FIELDS):
        return CACHE_BYPASS_PERSONAL
    if _uses_tools(body):
        return CACHE_BYPASS_TOOLS
    n = body.get("n")
    if n is not None and n != 1:
        return CACHE_BYPASS_N
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") not in (None, 0) \
            or body.get("prompt_logprobs") is not None:
        return CACHE_BYPASS_LOGPROBS
    temperature = body.get("temperature")
    if temperature is not None and not _number(temperature):
        return CACHE_BYPASS_MALFORMED
    if is_sampled(body) and not cfg.cache_sampled:
        return CACHE_BYPASS_SAMPLED
    return None
