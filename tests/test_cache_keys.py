"""Bypass rules, partitions and the exact L1 key (no embedding model needed)."""

from __future__ import annotations

from typing import Any

import pytest
from support.cache import MODEL, chat, config

import serving.cache
from serving.cache import CacheDecision, SemanticCache
from serving.cache.keys import build_key, normalise_text
from serving.cache.policy import is_sampled
from vigil.clock import ManualClock


def decide(body: dict[str, Any], *, headers: dict[str, str] | None = None,
           tenant: str = "acme", pool: str = "chat", endpoint: str = "chat",
           **cfg: Any) -> CacheDecision:
    # No embedder: decide() never embeds.
    cache = SemanticCache(config(**cfg), embedder=None, clock=ManualClock())
    return cache.decide(pool=pool, tenant=tenant, endpoint=endpoint, body=body,
                        headers=headers or {})


def key(body: dict[str, Any], **kwargs: Any) -> Any:
    return build_key(pool=kwargs.pop("pool", "chat"), tenant=kwargs.pop("tenant", "acme"),
                     endpoint=kwargs.pop("endpoint", "chat"), body=body)


def test_public_surface() -> None:
    assert sorted(serving.cache.__all__) == [
        "CacheDecision", "CacheHit", "CacheKey", "CacheStats", "Embedder", "LocalEmbedder",
        "RemoteEmbedder", "SemanticCache", "SharedEntries", "assemble_stream", "replay_stream"]


def test_a_greedy_faq_request_is_cacheable() -> None:
    decision = decide(chat("How do I reset my password?"))
    assert decision.cacheable and decision.bypass is None
    assert decision.key.query == "How do I reset my password?"


@pytest.mark.parametrize(("body", "headers", "cfg", "reason"), [
    (chat("q"), {}, {"enabled": False}, "disabled"),
    (chat("q"), {}, {"pools": ["other"]}, "pool"),
    (chat("q"), {}, {"exclude_tenants": ["acme"]}, "tenant"),
    (chat("q"), {"X-Vigil-Cache": "off"}, {}, "opt_out"),
    (chat("q"), {"x-vigil-cache": " OFF "}, {}, "opt_out"),
    (chat("q", user="u-123"), {}, {}, "personal"),
    (chat("q", user=""), {}, {}, "personal"),
    (chat("q", safety_identifier="hash"), {}, {}, "personal"),
    (chat("q", tools=[{"type": "function", "function": {"name": "f"}}]), {}, {}, "tools"),
    (chat("q", tool_choice="auto"), {}, {}, "tools"),
    (chat("q", functions=[{"name": "f"}]), {}, {}, "tools"),
    (chat("q", history=[{"role": "assistant", "content": None,
                         "tool_calls": [{"id": "c1", "type": "function"}]},
                        {"role": "tool", "tool_call_id": "c1", "content": "42"}]),
     {}, {}, "tools"),
    (chat("q", n=2), {}, {}, "n"),
    (chat("q", logprobs=True), {}, {}, "logprobs"),
    (chat("q", top_logprobs=3), {}, {}, "logprobs"),
    (chat("q", temperature=0.7), {}, {}, "sampled"),
    (chat("q", temperature=None), {}, {}, "sampled"),  # absent: the model's default samples
    (chat("q", temperature="0"), {}, {}, "malformed"),
    ({"model": MODEL, "messages": "hi", "temperature": 0}, {}, {}, "malformed"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": 0}, {}, {}, "malformed"),
    (chat([{"type": "text", "text": "what is this?"},  # type: ignore[arg-type]
           {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]), {}, {}, "content"),
])
def test_bypass_reasons(body: dict[str, Any], headers: dict[str, str], cfg: dict[str, Any],
                        reason: str) -> None:
    decision = decide(body, headers=headers, **cfg)
    assert (decision.key, decision.bypass) == (None, reason)


def test_other_header_values_do_not_opt_out() -> None:
    assert decide(chat("q"), headers={"X-Vigil-Cache": "on"}).cacheable
    assert decide(chat("q"), headers={"X-Other": "off"}).cacheable


def test_embeddings_are_never_cached() -> None:
    body = {"model": MODEL, "input": ["q"]}
    assert decide(body, endpoint="embeddings").bypass == "endpoint"


def test_pool_list_admits_listed_pools() -> None:
    assert decide(chat("q"), pool="chat", pools=["chat"]).cacheable


def test_cache_sampled_admits_sampling_requests() -> None:
    assert decide(chat("q", temperature=0.7), cache_sampled=True).cacheable
    assert decide(chat("q", temperature=None), cache_sampled=True).cacheable


def test_greedy_detection() -> None:
    assert not is_sampled({"temperature": 0})
    assert not is_sampled({"temperature": 0.0})
    assert not is_sampled({"temperature": 0.8, "top_k": 1})  # vLLM: top_k 1 is greedy
    assert is_sampled({})
    assert is_sampled({"temperature": 0.2})


def test_completions_with_token_ids_or_several_prompts_bypass() -> None:
    base = {"model": MODEL, "temperature": 0}
    assert decide({**base, "prompt": [1, 2, 3]}, endpoint="completions").bypass == "content"
    assert decide({**base, "prompt": ["a", "b"]}, endpoint="completions").bypass == "content"
    one = decide({**base, "prompt": ["a b"]}, endpoint="completions")
    assert one.cacheable and one.key.query == "a b"


def test_normalisation() -> None:
    assert normalise_text("  How do I\tRESET my\n password?  ") == "how do i reset my password?"
    assert normalise_text("ﬁle Straße") == "file strasse"  # NFKC then casefold


def test_l1_ignores_case_and_whitespace_of_the_conversation() -> None:
    assert key(chat("How do I reset my password?")).l1 == \
        key(chat("  how do I reset   my PASSWORD? ")).l1


def test_text_parts_equal_plain_text() -> None:
    parts = [{"type": "text", "text": "How do I reset"}, {"type": "text", "text": "my password?"}]
    assert key(chat(parts)).l1 == key(chat("How do I reset\nmy password?")).l1  # type: ignore


@pytest.mark.parametrize(("a", "b"), [
    ({"tenant": "acme"}, {"tenant": "globex"}),
    ({"pool": "chat"}, {"pool": "chat-big"}),
    ({"endpoint": "chat"}, {"endpoint": "completions"}),
])
def test_partition_separates_tenant_pool_endpoint(a: dict[str, Any], b: dict[str, Any]) -> None:
    body = {**chat("q"), "prompt": "q"}
    ka, kb = key(body, **a), key(body, **b)
    assert ka.partition != kb.partition and ka.l1 != kb.l1 and ka.l2_partition != kb.l2_partition


@pytest.mark.parametrize("change", [
    {"model": "other/model"}, {"max_tokens": 100}, {"temperature": 0.5}, {"top_p": 0.9},
    {"stop": "END"}, {"seed": 1}, {"response_format": {"type": "json_object"}},
    {"presence_penalty": 0.5}, {"guided_json": {"type": "object"}}, {"echo": True},
])
def test_partition_includes_answer_changing_fields(change: dict[str, Any]) -> None:
    assert key(chat("q")).partition != key({**chat("q"), **change}).partition


@pytest.mark.parametrize("change", [
    {"stream": True}, {"stream_options": {"include_usage": True}}, {"priority": 2},
    {"metadata": {"a": "b"}}, {"temperature": 0.0}, {"request_id": "r1"}, {"store": False},
])
def test_partition_ignores_delivery_fields(change: dict[str, Any]) -> None:
    assert key(chat("q")).partition == key({**chat("q"), **change}).partition


def test_equivalent_parameter_spellings_share_a_partition() -> None:
    assert key(chat("q", stop="END")).partition == key(chat("q", stop=["END"])).partition
    assert key(chat("q", stop=["b", "a"])).partition == key(chat("q", stop=["a", "b"])).partition
    base = chat("q")
    del base["max_tokens"]
    assert key({**base, "max_completion_tokens": 64}).partition == \
        key({**base, "max_tokens": 64}).partition


def test_system_prompt_is_part_of_the_partition() -> None:
    plain = key(chat("q"))
    with_system = key(chat("q", system="Be brief."))
    developer = key({**chat("q"), "messages": [{"role": "developer", "content": "Be brief."},
                                               {"role": "user", "content": "q"}]})
    assert len({plain.partition, with_system.partition, developer.partition}) == 3
    assert with_system.query == "q"


def test_l2_partition_holds_the_earlier_turns_not_the_last_message() -> None:
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    a = key(chat("first question", history=history))
    b = key(chat("second question", history=history))
    c = key(chat("first question"))
    assert a.l2_partition == b.l2_partition != c.l2_partition
    assert a.l1 != b.l1


def test_no_l2_when_the_last_message_is_not_the_users() -> None:
    body = {**chat("q"), "messages": [{"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "Sure, the answer"}]}
    k = key(body)
    assert k.query is None and k.l1
