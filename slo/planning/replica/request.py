"""One request inside the simulated engine: what it asked for and how far it got."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from slo.planning.replica.text import Prompt

__all__ = ["EngineRequest", "FinishReason", "RequestStatus"]

#: ``stop``: natural end (EOS); ``length``: hit max_tokens or max_model_len; ``abort``: aborted.
FinishReason = Literal["stop", "length", "abort", "error"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class EngineRequest:
    """A request's state. Times are seconds on the engine's clock; lengths are tokens.

    KV bookkeeping follows vLLM V1: ``num_computed`` tokens have their KV in ``blocks``; while
    decoding, the last sampled token is not computed yet, so ``num_computed == num_tokens - 1``.
    """

    request_id: str
    prompt: Prompt
    #: Effective max_tokens (always set, as in vLLM).
    max_tokens: int
    #: Tokens this request will generate before it finishes, and why it finishes then.
    target_tokens: int
    target_reason: FinishReason
    priority: int
    arrival_time: float
    lora_name: str | None = None

    status: RequestStatus = RequestStatus.WAITING
    num_generated: int = 0
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    #: Full prompt blocks already registered in the prefix cache.
    num_cached_blocks: int = 0
    #: Prefix-cache hit (tokens) at the latest admission.
    cached_tokens: int = 0
    #: True once the request produced output since its latest admission (decode phase).
    decoding: bool = False
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_reason: FinishReason | None = None

    @property
    def prompt_len(self) -> int:
        return self.prompt.num_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return self.prompt.num_tokens + self.num_generated

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def sort_key(self) -> tuple[int, float, str]:
        """vLLM's ``Request.__lt__``: lower priority value first, then arrival, then id."""
        return (self.priority, self.arrival_time, self.request_id)
