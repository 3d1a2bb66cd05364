"""The max_tokens policy: a server-side default, per-tier caps, never a silent change.

* A request that carries neither ``max_tokens`` nor ``max_completion_tokens`` (absent or null)
  gets ``max_tokens = [gateway] default_max_tokens`` (512 by default; at most the tier's cap).
  This also replaces the completions API's own default of 16 tokens.
* A value above the tier's ``max_tokens_cap`` is refused with an OpenAI-style 400
  (``over_cap = "reject"``) or lowered to the cap (``"clamp"``); either way the decision is
  recorded and the ``X-Vigil-Max-Tokens`` response header says what was sent upstream.
* The effective value is vLLM's: ``max_completion_tokens or max_tokens`` for chat, ``max_tokens``
  for completions (vLLM's completions request has no ``max_completion_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from serving.gateway.errors import BadRequest, OverCap
from vigil.conventions import (
    ENDPOINT_CHAT,
    MAX_TOKENS_CLAMPED,
    MAX_TOKENS_CLIENT,
    MAX_TOKENS_DEFAULT,
)

__all__ = ["MaxTokens", "apply_max_tokens"]

_CHAT_KEYS = ("max_completion_tokens", "max_tokens")
_COMPLETION_KEYS = ("max_tokens",)


@dataclass(frozen=True, slots=True)
class MaxTokens:
    """What the policy decided: the max_tokens sent upstream and why."""

    value: int
    #: "client" | "default" | "clamped"
    decision: str

    def header(self) -> str:
        """The ``X-Vigil-Max-Tokens`` value: ``512; decision=default``."""
        return f"{self.value}; decision={self.decision}"


def _given(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    # bool is an int in Python but not in JSON Schema: `true` is not a token count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer, got {type(value).__name__} "
                         f"{_short(value)}.", param=key, code="invalid_type")
    if value < 1:
        raise BadRequest(f"{key} must be at least 1, got {value}.", param=key,
                         code="invalid_value")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def apply_max_tokens(body: dict[str, Any], *, endpoint: str, tier: str, cap: int,
                     default: int, over_cap: Literal["reject", "clamp"]) -> MaxTokens:
    """Apply the policy to ``body`` in place and return the decision.

    Raises ``BadRequest`` for a non-integer or non-positive value and ``OverCap`` for a value
    above ``cap`` when ``over_cap`` is ``"reject"``.
    """
    keys = _CHAT_KEYS if endpoint == ENDPOINT_CHAT else _COMPLETION_KEYS
    given = [(k, v) for k in keys if (v := _given(body, k)) is not None]
    if not given:
        value = min(default, cap)
        body["max_tokens"] = value
        return MaxTokens(value, MAX_TOKENS_DEFAULT)
    key, value = given[0]  # the first key of `keys` present is the one vLLM uses
    if value <= cap:
        return MaxTokens(value, MAX_TOKENS_CLIENT)
    if over_cap == "reject":
        raise OverCap(key, value, cap, tier)
    for k, _ in given:
        body[k] = cap
    return MaxTokens(cap, MAX_TOKENS_CLAMPED)
