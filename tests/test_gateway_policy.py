"""The max_tokens policy: default, caps, reject or clamp, and what reaches vLLM."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from support.gateway import (
    MODEL,
    PREMIUM,
    STANDARD,
    gateway_config,
    running_gateway,
    scripted_upstream,
)

from serving.gateway.errors import BadRequest, OverCap
from serving.gateway.max_tokens import MaxTokens, apply_max_tokens

POLICY = {"tier": "standard", "cap": 100, "default": 512, "over_cap": "reject"}


def _apply(body: dict, endpoint: str = "chat", **kw: object) -> MaxTokens:
    return apply_max_tokens(body, endpoint=endpoint, **{**POLICY, **kw})  # type: ignore[arg-type]


def test_default_when_absent_or_null() -> None:
    body: dict = {"messages": []}
    assert _apply(body, cap=4096) == MaxTokens(512, "default")
    assert body["max_tokens"] == 512
    body = {"max_tokens": None, "max_completion_tokens": None}
    assert _apply(body, cap=4096) == MaxTokens(512, "default")


def test_default_never_exceeds_the_cap() -> None:
    body: dict = {}
    assert _apply(body) == MaxTokens(100, "default")
    assert body["max_tokens"] == 100


def test_completions_default_replaces_the_16_token_default() -> None:
    body: dict = {"prompt": "x"}
    assert _apply(body, "completions", cap=4096) == MaxTokens(512, "default")


def test_client_value_under_the_cap_is_kept() -> None:
    body = {"max_tokens": 40}
    assert _apply(body) == MaxTokens(40, "client")
    assert body == {"max_tokens": 40}


def test_max_completion_tokens_wins_like_vllm() -> None:
    body = {"max_completion_tokens": 30, "max_tokens": 90}
    assert _apply(body) == MaxTokens(30, "client")


def test_completions_ignore_max_completion_tokens() -> None:
    body = {"max_completion_tokens": 30}
    assert _apply(body, "completions", cap=4096) == MaxTokens(512, "default")
    assert body["max_tokens"] == 512


def test_over_cap_rejected() -> None:
    with pytest.raises(OverCap) as info:
        _apply({"max_tokens": 101})
    assert (info.value.status, info.value.param, info.value.value) == (400, "max_tokens", 101)
    assert info.value.error_class == "over_cap"
    with pytest.raises(OverCap) as info:
        _apply({"max_completion_tokens": 10**30})
    assert info.value.param == "max_completion_tokens"


def test_over_cap_clamped_says_so() -> None:
    body = {"max_completion_tokens": 500, "max_tokens": 700}
    assert _apply(body, over_cap="clamp") == MaxTokens(100, "clamped")
    assert body == {"max_completion_tokens": 100, "max_tokens": 100}
    assert MaxTokens(100, "clamped").header() == "100; decision=clamped"


@pytest.mark.parametrize("value", [0, -5, "10", 1.5, True, [1]])
def test_bad_values(value: object) -> None:
    with pytest.raises(BadRequest) as info:
        _apply({"max_tokens": value})
    assert info.value.param == "max_tokens"


def test_caps_per_tier_end_to_end(tmp_path: Path) -> None:
    with scripted_upstream() as up:
        cfg = gateway_config(tmp_path, [up.url], gateway={
            "over_cap": "reject",
            "tiers": {"standard": {"max_tokens_cap": 1000}, "premium": {"max_tokens_cap": 3000}}})
        with running_gateway(cfg) as gw:
            messages = [{"role": "user", "content": "x"}]
            with pytest.raises(openai.BadRequestError) as info:
                gw.client(STANDARD).chat.completions.create(model=MODEL, messages=messages,
                                                            max_tokens=2000)
            assert info.value.code == "max_tokens_over_cap"
            raw = gw.client(PREMIUM).chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=2000)
            assert raw.headers["x-vigil-max-tokens"] == "2000; decision=client"
            assert up.bodies[-1]["max_tokens"] == 2000
            assert len(up.bodies) == 1  # the refused request never went upstream
            records = gw.all_records()
    refused = [r for r in records if r.status == 400]
    assert len(refused) == 1
    assert (refused[0].error_class, refused[0].requested_max_tokens, refused[0].max_tokens) == (
        "over_cap", 2000, None)


def test_clamp_mode_end_to_end(tmp_path: Path) -> None:
    with scripted_upstream() as up:
        cfg = gateway_config(tmp_path, [up.url], gateway={
            "over_cap": "clamp", "default_max_tokens": 64,
            "tiers": {"standard": {"max_tokens_cap": 1000}}})
        with running_gateway(cfg) as gw, gw.http() as c:
            r = c.post("/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "x"}],
                "max_completion_tokens": 5000})
            assert r.status_code == 200
            assert r.headers["x-vigil-max-tokens"] == "1000; decision=clamped"
            assert up.bodies[-1]["max_completion_tokens"] == 1000
            rec = gw.record(r.headers["x-vigil-request-id"])
            assert (rec.requested_max_tokens, rec.max_tokens, rec.max_tokens_decision) == (
                5000, 1000, "clamped")
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
            assert up.bodies[-1]["max_tokens"] == 64
            rec = gw.record(r.headers["x-vigil-request-id"])
            assert (rec.requested_max_tokens, rec.max_tokens_decision) == (None, "default")
