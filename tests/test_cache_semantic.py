"""The semantic cache end to end with the real all-MiniLM-L6-v2 (no stand-in for the model):
paraphrases hit, other questions, negations, tenants, system prompts and parameters miss,
TTL and LRU on a manual clock, only completed answers are stored."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from support.cache import (
    MODEL,
    T0,
    answer,
    ask,
    chat,
    completion_answer,
    decide,
    local_embedder,
    make_cache,
    remember,
)

from serving.cache import CacheHit, LocalEmbedder, SemanticCache
from serving.cache.embedder import MAX_PENDING
from vigil.clock import ManualClock
from vigil.config import CacheConfig
from vigil.errors import EmbeddingError

PASSWORD = "How do I reset my password?"
PASSWORD_ANSWER = "Open Settings, then Security, then Reset password."


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def similarity(a: str, b: str) -> float:
    """Cosine similarity of two texts under the real model."""
    async def go() -> float:
        ea = await local_embedder().embed(a)
        eb = await local_embedder().embed(b)
        assert ea is not None and eb is not None
        return float(np.dot(ea, eb))
    return run(go())


def content(hit: CacheHit) -> str:
    return hit.response["choices"][0]["message"]["content"]


def test_paraphrase_hits_l2() -> None:
    assert similarity(PASSWORD, "What is the way to reset my password?") > 0.95

    async def go() -> None:
        clock = ManualClock(T0)
        cache = make_cache(clock)
        await remember(cache, chat(PASSWORD), PASSWORD_ANSWER)
        clock.advance(30)
        hit = await ask(cache, chat("What is the way to reset my password?"))
        assert hit is not None and hit.layer == "l2"
        assert 0.95 < hit.similarity <= 1.0
        assert content(hit) == PASSWORD_ANSWER
        # A fresh identity: never another request's id; created is now.
        assert hit.response["id"].startswith("chatcmpl-")
        assert hit.response["id"] != "chatcmpl-upstream0000"
        assert hit.response["created"] == int(T0 + 30)
        assert hit.lookup_seconds > 0
        again = await ask(cache, chat("What is the way to reset my password?"))
        assert again is not None and again.response["id"] != hit.response["id"]
        stats = cache.stats()
        assert (stats.hits_l2, stats.misses, stats.stores) == (2, 1, 1)
    run(go())


def test_exact_repeat_hits_l1_despite_case_and_whitespace() -> None:
    async def go() -> None:
        cache = make_cache()
        await remember(cache, chat(PASSWORD), PASSWORD_ANSWER)
        hit = await ask(cache, chat("  how do I   RESET my\npassword? "))
        assert hit is not None and (hit.layer, hit.similarity) == ("l1", 1.0)
        assert content(hit) == PASSWORD_ANSWER
    run(go())


def test_unrelated_question_misses() -> None:
    async def go() -> None:
        cache = make_cache()
        await remember(cache, chat(PASSWORD), PASSWORD_ANSWER)
        assert await ask(cache, chat("What is the capital of France?")) is None
        assert await ask(cache, chat("How do I change my email address?")) is None
    run(go())


def test_turn_off_the_light_misses_turn_on_the_light() -> None:
    async def go() -> None:
        # Threshold lowered below their similarity (0.86): only the guard can refuse it.
        cache = make_cache(similarity_threshold=0.8)
        await remember(cache, chat("turn on the light"), "The light is on.")
        assert await ask(cache, chat("turn off the light")) is None
        assert cache.stats().guard_rejections == 1
        hit = await ask(cache, chat("turn the light on"))
        assert hit is not None and content(hit) == "The light is on."
    assert similarity("turn on the light", "turn off the light") > 0.8
    run(go())


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is it safe to drink?", "Is it not safe to drink?"),
    ("Does the API support streaming?", "Does the API not support streaming?"),
    ("Should I take it before meals?", "Should I take it after meals?"),
])
def test_negations_above_the_threshold_miss(stored: str, asked: str) -> None:
    # These pairs pass the default 0.95 with this model: the threshold alone would serve them.
    assert similarity(stored, asked) > 0.95

    async def go() -> None:
        cache = make_cache()
        await remember(cache, chat(stored), "An answer.")
        assert await ask(cache, chat(asked)) is None
        assert cache.stats().guard_rejections == 1
    run(go())


def test_numbers_must_match() -> None:
    async def go() -> None:
        cache = make_cache(similarity_threshold=0.8)
        await remember(cache, chat("What is 15% of 200?"), "30")
        assert await ask(cache, chat("What is 15% of 300?")) is None
    assert similarity("What is 15% of 200?", "What is 15% of 300?") > 0.8
    run(go())


def test_guard_falls_back_to_the_next_candidate() -> None:
    query, negated, agreeing = ("Is it safe to drink?", "Is it not safe to drink?",
                                "Is it safe for drinking?")
    assert similarity(query, negated) > similarity(query, agreeing) > 0.9

    async def go() -> None:
        cache = make_cache(similarity_threshold=0.9)
        await remember(cache, chat(negated), "No.")
        await remember(cache, chat(agreeing), "Yes.")
        hit = await ask(cache, chat(query))
        assert hit is not None and content(hit) == "Yes."
    run(go())


def test_another_tenant_misses() -> None:
    async def go() -> None:
        cache = make_cache()
        await remember(cache, chat(PASSWORD), PASSWORD_ANSWER, tenant="acme")
        assert await ask(cache, chat(PASSWORD), tenant="globex") is None
        assert await ask(cache, chat("What is the way to reset my password?"),
                         tenant="globex") is None
        assert await ask(cache, chat(PASSWORD), tenant="acme") is not None
    run(go())


def test_a_different_system_prompt_misses() -> None:
    async def go() -> None:
        cache = make_cache()
        await remember(cache, chat(PASSWORD, system="You are a helpful assistant."),
                       PASSWORD_ANSWER)
        assert await ask(cache, chat(PASSWORD, system="Answer in French.")) is None
        assert await ask(cache, chat(PASSWORD)) is None
        # Case is kept in system prompts ("ANSWER IN CAPITALS" is another instruction).
        assert await ask(cache, chat(PASSWORD, system="YOU ARE A HELPFUL ASSISTANT.")) is None
        # Whitespace is not.
        hit = await ask(cache, chat(PASSWORD, system="You are a  helpful\nassistant."))
        assert hit is not None
    run(go())


@pytest.mark.parametrize("change", [
    {"max_tokens": 100}, {"stop": ["\n"]}, {"seed": 7}, {"top_p": 0.5},
    {"response_format": {"type": "json_object"}}, {"min_p": 0.1},  # a vLLM extra
])
def test_different_sampling_parameters_miss(change: dict[str, Any]) -> None:
    async def go() -> None:
        cache = make_cache()
        await remember(cache, chat(PASSWORD), PASSWORD_ANSWER)
        assert await ask(cache, {**chat(PASSWORD), **change}) is None
    run(go())


def test_neutral_fields_do_not_split_the_partition() -> None:
    async def go() -> None:
        cache = make_cache()
        await remember(cache, chat(PASSWORD), PASSWORD_ANSWER)
        body = {**chat(PASSWORD), "stream": True, "stream_options": {"include_usage": True},
                "priority": 1, "metadata": {"ticket": "42"}, "temperature": 0.0}
        hit = await ask(cache, body)
        assert hit is not None and hit.layer == "l1"
    run(go())


def test_earlier_turns_must_match_exactly() -> None:
    first = [{"role": "user", "content": "Should I restart the server?"},
             {"role": "assistant", "content": "Yes, restart it."}]
    other = [{"role": "user", "content": "Should I delete the database?"},
             {"role": "assistant", "content": "Yes, delete it."}]

    async def go() -> None:
        cache = make_cache()
        await remember(cache, chat("Ok, how do I do that?", history=first), "Run restart.")
        assert await ask(cache, chat("Ok, how do I do that?", history=other)) is None
        assert await ask(cache, chat("Ok, how do I do that?")) is None
        hit = await ask(cache, chat("Ok, how can I do that?", history=first))
        assert hit is not None and hit.layer == "l2"
    assert similarity("Ok, how do I do that?", "Ok, how can I do that?") > 0.95
    run(go())


def test_completions_hit_and_never_mix_with_chat() -> None:
    async def go() -> None:
        cache = make_cache()
        body = {"model": MODEL, "prompt": PASSWORD, "temperature": 0, "max_tokens": 64}
        key = decide(cache, body, endpoint="completions").key
        assert key is not None and await cache.lookup(key) is None
        await cache.store(key, completion_answer(PASSWORD_ANSWER))
        paraphrase = {**body, "prompt": "What is the way to reset my password?"}
        hit = await ask(cache, paraphrase, endpoint="completions")
        assert hit is not None and hit.response["choices"][0]["text"] == PASSWORD_ANSWER
        assert hit.response["id"].startswith("cmpl-")
        assert await ask(cache, chat(PASSWORD, max_tokens=64)) is None
    run(go())


def test_ttl_expiry_on_the_injected_clock() -> None:
    async def go() -> None:
        clock = ManualClock(T0)
        cache = make_cache(clock, ttl=600.0)
        await remember(cache, chat(PASSWORD), PASSWORD_ANSWER)
        clock.advance(599.0)
        assert await ask(cache, chat(PASSWORD)) is not None
        assert await ask(cache, chat("What is the way to reset my password?")) is not None
        clock.advance(1.0)  # a hit does not extend the TTL
        assert await ask(cache, chat(PASSWORD)) is None
        assert await ask(cache, chat("What is the way to reset my password?")) is None
        stats = cache.stats()
        assert (stats.entries, stats.expirations, stats.partitions) == (0, 1, 0)
    run(go())


def test_lru_bound_evicts_the_least_recently_used() -> None:
    async def go() -> None:
        cache = make_cache(max_entries=2)
        await remember(cache, chat(PASSWORD), PASSWORD_ANSWER)
        await remember(cache, chat("What is the capital of France?"), "Paris.")
        assert await ask(cache, chat(PASSWORD)) is not None  # now France is the LRU one
        await remember(cache, chat("How many days are in a leap year?"), "366.")
        assert await ask(cache, chat("What is the capital of France?")) is None
        assert await ask(cache, chat("Which city is the capital of France?")) is None
        assert await ask(cache, chat("What is the way to reset my password?")) is not None
        assert await ask(cache, chat("How many days does a leap year have?")) is not None
        stats = cache.stats()
        assert (stats.entries, stats.evictions) == (2, 1)
    run(go())


@pytest.mark.parametrize(("response", "reason"), [
    (answer("cut off", finish_reason="abort"), "incomplete"),
    ({**answer("x"), "choices": []}, "incomplete"),
    ({"error": {"message": "boom", "type": "InternalServerError", "code": 500}}, "error"),
    (answer("calls", finish_reason="tool_calls"), "tool_calls"),
    ({**answer("x"), "object": "text_completion"}, "incomplete"),
])
def test_only_completed_responses_are_stored(response: dict[str, Any], reason: str) -> None:
    async def go() -> None:
        cache = make_cache()
        key = decide(cache, chat(PASSWORD)).key
        await cache.store(key, response)
        assert await ask(cache, chat(PASSWORD)) is None
        assert cache.stats().refused == {reason: 1}
        assert cache.stats().entries == 0
    run(go())


def test_unfinished_choice_is_refused() -> None:
    response = answer("half an ans")
    response["choices"][0]["finish_reason"] = None

    async def go() -> None:
        cache = make_cache()
        await cache.store(decide(cache, chat(PASSWORD)).key, response)
        assert cache.stats().entries == 0
    run(go())


def test_a_lookup_in_an_empty_partition_does_not_embed() -> None:
    async def go() -> None:
        cache = make_cache()
        key = decide(cache, chat(PASSWORD)).key
        assert await cache.lookup(key) is None
        assert key.embedding is None and not key.embed_attempted
        await cache.store(key, answer(PASSWORD_ANSWER))  # embeds now
        assert key.embedding is not None and cache.stats().partitions == 1
        other = decide(cache, chat("Something else entirely?")).key
        assert await cache.lookup(other) is None
        assert other.embedding is not None  # the partition has entries now: searched
    run(go())


def test_store_without_lookup_embeds_itself() -> None:
    async def go() -> None:
        cache = make_cache()
        await cache.store(decide(cache, chat(PASSWORD)).key, answer(PASSWORD_ANSWER))
        hit = await ask(cache, chat("What is the way to reset my password?"))
        assert hit is not None and hit.layer == "l2"
    run(go())


def test_messages_longer_than_the_model_window_are_l1_only() -> None:
    long_text = "Please review this log line carefully. " * 60  # > 256 word pieces

    async def go() -> None:
        cache = make_cache()
        await remember(cache, chat(long_text), "Reviewed.")
        assert cache.stats().partitions == 0  # no embedding stored
        assert await ask(cache, chat(long_text)) is not None  # exact repeats still hit
        assert await ask(cache, chat(long_text + " Thanks.")) is None
    run(go())


def test_a_loading_model_means_a_miss_not_a_failure() -> None:
    async def go() -> None:
        embedder = LocalEmbedder()  # not warmed up: the first embed finds no model yet
        cache = SemanticCache.from_config(CacheConfig(enabled=True), embedder=embedder,
                                          clock=ManualClock(T0))
        key = decide(cache, chat(PASSWORD)).key
        assert await cache.lookup(key) is None  # empty partition: nothing to embed for
        await cache.store(key, answer(PASSWORD_ANSWER))
        stats = cache.stats()
        assert (stats.embedding_failures, stats.entries, stats.partitions) == (1, 1, 0)
        assert await ask(cache, chat(PASSWORD)) is not None  # L1 still serves it
        await cache.warm_up()
        await remember(cache, chat("What is the capital of France?"), "Paris.")
        assert cache.stats().partitions == 1  # loaded now: the next entry has its embedding
        hit = await ask(cache, chat("What's the capital of France?"))
        assert hit is not None and hit.layer == "l2"
        await embedder.aclose()
    run(go())


def test_a_broken_model_folder_is_a_miss(tmp_path: Any) -> None:
    async def go() -> None:
        embedder = LocalEmbedder(tmp_path)  # an empty folder: not a model
        cache = SemanticCache(CacheConfig(enabled=True), embedder=embedder,
                              clock=ManualClock(T0))
        with pytest.raises(EmbeddingError, match="cannot load the model"):
            await cache.warm_up()
        key = decide(cache, chat(PASSWORD)).key
        assert await cache.lookup(key) is None
        await cache.store(key, answer(PASSWORD_ANSWER))
        assert cache.stats().embedding_failures == 1
        await embedder.aclose()
    run(go())


def test_a_saturated_embedder_misses_instead_of_queueing() -> None:
    async def go() -> None:
        cache = make_cache()
        await remember(cache, chat(PASSWORD), PASSWORD_ANSWER)  # the partition is not empty
        questions = [f"How do I export report number {i}?" for i in range(MAX_PENDING + 3)]
        keys = [decide(cache, chat(q)).key for q in questions]
        # The embedding thread is held until every lookup has asked: an encode ending
        # between two asks would free a place, and how many are refused would then depend
        # on the machine's load.
        gate = threading.Event()
        embedder = local_embedder()
        embedder._executor.submit(gate.wait)
        lookups = asyncio.gather(*(cache.lookup(k) for k in keys))
        for _ in range(5000):
            if cache.stats().embeddings_busy == 3:
                break
            await asyncio.sleep(0.001)
        gate.set()
        results = await lookups
        assert results == [None] * len(keys)
        stats = cache.stats()
        assert (stats.embeddings_busy, stats.embedding_failures) == (3, 0)
        assert sum(k.embedding is not None for k in keys) == MAX_PENDING
    run(go())


def test_the_shared_embedder_runs_on_onnx_runtime() -> None:
    # Every test above goes through this embedder: they pin the cache's behaviour on the
    # default backend (tests/test_cache_onnx.py compares it with torch).
    assert local_embedder().backend == "onnx"


def test_the_embedders_torch_threads_stay_in_its_thread() -> None:
    import torch

    before = torch.get_num_threads()
    embedder = LocalEmbedder(threads=1, backend="torch")
    embedder.load()
    try:
        assert torch.get_num_threads() == before  # the caller's thread is untouched
        assert run(embedder.embed(PASSWORD)) is not None
    finally:
        run(embedder.aclose())
    with pytest.raises(ValueError, match="threads"):
        LocalEmbedder(threads=0)
