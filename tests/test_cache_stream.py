"""replay_stream read by the official openai client over real HTTP, vLLM's chunk shape, and
assemble_stream on the simulator's real streams and the OpenAI fixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk
from support.cache import MODEL, answer, completion_answer, serve

from serving.cache import assemble_stream, replay_stream
from serving.cache.responses import refusal_reason
from serving.sim.testing import running_fleet

FIXTURE = Path(__file__).parent / "fixtures" / "openai_stream_example.txt"
ANSWER = "The KV cache stores the attention keys and values of earlier tokens. ünïcødé ✓"


def events(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE byte stream, checking the framing."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n")
    out = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: ") and "\n" not in block
        out.append(block[len("data: "):])
    return out


def chunks_of(raw: bytes) -> list[dict[str, Any]]:
    payloads = events(raw)
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def replay_app(response: dict[str, Any]) -> FastAPI:
    """An OpenAI-compatible server that answers every request by replaying ``response``."""
    app = FastAPI()

    async def replay(request: Request) -> StreamingResponse:
        body = await request.json()
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(replay_stream(response, include_usage=include),
                                 media_type="text/event-stream")

    app.post("/v1/chat/completions")(replay)
    app.post("/v1/completions")(replay)
    return app


@pytest.mark.parametrize("include_usage", [True, False])
def test_openai_client_reads_a_replayed_chat(include_usage: bool) -> None:
    response = answer(ANSWER)
    with serve(replay_app(response)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "q"}], stream=True,
            stream_options={"include_usage": include_usage})
        chunks = list(stream)
        client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.id for c in chunks} == {response["id"]}
    if include_usage:
        assert chunks[-1].choices == []
        assert chunks[-1].usage.completion_tokens == response["usage"]["completion_tokens"]
        assert chunks[-1].usage.prompt_tokens == 12
    else:
        assert all(c.usage is None for c in chunks)


def test_openai_client_reads_a_replayed_completion() -> None:
    response = completion_answer(ANSWER)
    with serve(replay_app(response)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
        chunks = list(client.completions.create(model=MODEL, prompt="q", stream=True,
                                                stream_options={"include_usage": True}))
        client.close()
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ANSWER
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage.total_tokens == response["usage"]["total_tokens"]


def test_chat_chunks_have_vllms_shape() -> None:
    chunks = chunks_of(b"".join(replay_stream(answer(ANSWER), include_usage=True)))
    role, content, usage = chunks
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert chunk["object"] == "chat.completion.chunk"
    # vLLM: no "usage" key on ordinary chunks; the role chunk has empty content.
    assert "usage" not in role and "usage" not in content
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert content["choices"][0] == {"index": 0, "delta": {"content": ANSWER}, "logprobs": None,
                                     "finish_reason": "stop", "stop_reason": None}
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] > 0


def test_completion_chunks_have_vllms_shape() -> None:
    chunks = chunks_of(b"".join(replay_stream(completion_answer("hi"), include_usage=False)))
    assert len(chunks) == 1
    Completion.model_validate(chunks[0])
    assert chunks[0]["object"] == "text_completion"
    assert chunks[0]["choices"][0]["text"] == "hi"


def test_reasoning_content_is_streamed_before_the_answer() -> None:
    response = answer("42")
    response["choices"][0]["message"]["reasoning_content"] = "Six times seven."
    chunks = chunks_of(b"".join(replay_stream(response, include_usage=False)))
    assert [list(c["choices"][0]["delta"]) for c in chunks] == [
        ["role", "content"], ["reasoning_content"], ["content"]]
    back = assemble_stream(chunks)
    assert back["choices"][0]["message"]["reasoning_content"] == "Six times seven."


def test_replay_refuses_other_objects() -> None:
    with pytest.raises(ValueError, match="cannot stream"):
        list(replay_stream({"object": "list", "data": []}, include_usage=False))


@pytest.mark.parametrize("make", [answer, completion_answer])
def test_assemble_round_trips_replay(make: Any) -> None:
    response = make(ANSWER)
    back = assemble_stream(chunks_of(b"".join(replay_stream(response, include_usage=True))))
    assert back is not None
    for field in ("id", "object", "created", "model"):
        assert back[field] == response[field]
    assert back["usage"] == response["usage"]
    got, want = back["choices"][0], response["choices"][0]
    assert got["finish_reason"] == want["finish_reason"] == "stop"
    if response["object"] == "chat.completion":
        assert got["message"] == {"role": "assistant", "content": ANSWER}
    else:
        assert got["text"] == ANSWER
    assert refusal_reason(back, "chat" if "message" in got else "completions") is None


def test_assemble_the_openai_fixture() -> None:
    chunks = chunks_of(FIXTURE.read_bytes().replace(b"\r\n", b"\n").strip() + b"\n\n")
    back = assemble_stream(chunks)
    assert back["choices"][0]["message"]["content"] == (
        "The KV cache stores the attention keys and values of earlier tokens, so they are not "
        "recomputed for every new token.")
    assert back["usage"] == {"prompt_tokens": 48, "completion_tokens": 23, "total_tokens": 71}
    assert back["id"] == "chatcmpl-8f2c4e1a9b7d4c3e8a6f0b2d1e9c7a54"


def test_assemble_refuses_unfinished_and_broken_streams() -> None:
    chunks = chunks_of(b"".join(replay_stream(answer(ANSWER), include_usage=True)))
    assert assemble_stream([]) is None
    assert assemble_stream(chunks[:1]) is None  # cut after the role chunk: no finish_reason
    error = {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}
    assert assemble_stream([*chunks[:1], error]) is None
    tool = {**chunks[0], "choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {
        "tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]}}]}
    assert assemble_stream([chunks[0], tool]) is None
    assert assemble_stream([{"object": "list"}]) is None


def _sse_chunks(client: httpx.Client, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200
        raw = b"".join(resp.iter_bytes())
    return chunks_of(raw)


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_assemble_the_simulators_stream_equals_its_plain_answer(endpoint: str) -> None:
    if endpoint == "chat/completions":
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    else:
        body = {"model": MODEL, "prompt": "hi"}
    body |= {"max_tokens": 6, "ignore_eos": True, "seed": 3, "temperature": 0}
    with running_fleet(1) as fleet, httpx.Client(timeout=30) as client:
        url = f"{fleet.api_urls[0]}/{endpoint}"
        plain = client.post(url, json=body).json()
        streamed = _sse_chunks(client, url, {**body, "stream": True,
                                             "stream_options": {"include_usage": True}})
    back = assemble_stream(streamed)
    assert back is not None and back["object"] == plain["object"]
    assert back["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"] == 6
    if endpoint == "chat/completions":
        assert back["choices"][0]["message"]["content"] == \
            plain["choices"][0]["message"]["content"]
        assert refusal_reason(back, "chat") is None
    else:
        assert back["choices"][0]["text"] == plain["choices"][0]["text"]
        assert refusal_reason(back, "completions") is None
    assert back["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    # And what we would replay from it parses back to the same answer.
    again = assemble_stream(chunks_of(b"".join(replay_stream(back, include_usage=True))))
    assert again == back
