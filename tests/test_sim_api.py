"""The simulator's OpenAI API over real HTTP: shapes, streaming, disconnects, errors, the CLI."""

from __future__ import annotations

import argparse
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from serving.sim.testing import FleetHandle, running_fleet, sample_values, total
from slo.planning.replica.profiles import get_profile
from slo.planning.replica.text import encode_text, natural_output_len, render_chat
from vigil_shell.sim_cli import add_arguments, spec_from_args

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SMALL = get_profile("small")


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetHandle]:
    with running_fleet(1, max_num_queued_reqs=None) as f:
        yield f


def events(lines: Iterator[str]) -> list[str]:
    """The ``data:`` payloads of an SSE stream."""
    return [ln[len("data: "):] for ln in lines if ln.startswith("data: ")]


def metrics(f: FleetHandle) -> dict:
    return sample_values(httpx.get(f.metrics_urls[0], timeout=10).text)


def wait_until(pred, what: str, timeout: float = 10.0) -> None:
    """Poll ``pred`` (bounded) - for effects that happen on the server's event loop."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# --- shapes -----------------------------------------------------------------------------------


def test_models_health_version(fleet: FleetHandle):
    base = fleet.base_urls[0]
    health = httpx.get(base + "/health", timeout=10)
    assert health.status_code == 200 and health.content == b""
    assert httpx.get(base + "/version", timeout=10).json() == {"version": "0.33.0"}
    models = httpx.get(base + "/v1/models", timeout=10).json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert {k: card[k] for k in ("id", "object", "owned_by", "root", "max_model_len")} == {
        "id": MODEL, "object": "model", "owned_by": "vllm", "root": MODEL,
        "max_model_len": SMALL.max_model_len}
    assert isinstance(card["created"], int)
    assert card["permission"][0]["object"] == "model_permission"


def test_streaming_chat_chunks(fleet: FleetHandle):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is a KV cache?"}],
            "max_tokens": 12, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", fleet.api_urls[0] + "/chat/completions", json=body,
                      timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = events(r.iter_lines())
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "usage" not in chunks[0]  # vLLM sends no "usage": null on ordinary chunks
    content = chunks[1:-1]
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert content[-1]["choices"][0]["stop_reason"] is None
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    assert text.strip()
    final = chunks[-1]
    assert final["choices"] == []
    assert final["usage"]["completion_tokens"] == 12
    assert final["usage"]["total_tokens"] == final["usage"]["prompt_tokens"] + 12


def test_streaming_completions_without_usage(fleet: FleetHandle):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", fleet.api_urls[0] + "/completions", json=body, timeout=30) as r:
        data = events(r.iter_lines())
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert all(c["choices"] for c in chunks)  # no usage chunk without include_usage
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(len(c["choices"][0]["text"].split()) for c in chunks) >= 1


def test_non_streaming_shapes(fleet: FleetHandle):
    chat = httpx.post(fleet.api_urls[0] + "/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Hi"}],
        "max_completion_tokens": 7, "ignore_eos": True}).json()
    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
    choice = chat["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length" and chat["usage"]["completion_tokens"] == 7
    comp = httpx.post(fleet.api_urls[0] + "/completions", timeout=30, json={
        "model": MODEL, "prompt": "Hello", "max_tokens": 3, "seed": 1}).json()
    assert comp["object"] == "text_completion" and comp["id"].startswith("cmpl-")
    assert comp["choices"][0]["text"]
    assert comp["usage"] == {"prompt_tokens": 2, "total_tokens": 5, "completion_tokens": 3,
                             "prompt_tokens_details": None}


def short_seed(rendered_prompt: str, most: int = 20) -> int:
    """A ``seed`` for which the simulated model stops by itself within ``most`` tokens."""
    digest = encode_text(rendered_prompt).digest
    return next(s for s in range(10_000) if natural_output_len(digest, s) <= most)


def test_same_request_same_answer(fleet: FleetHandle):
    prompt = "Tell me about GPUs"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2000, "seed": short_seed(prompt)}
    a = httpx.post(fleet.api_urls[0] + "/completions", json=body, timeout=60).json()
    b = httpx.post(fleet.api_urls[0] + "/completions", json=body, timeout=60).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["choices"][0]["finish_reason"] == "stop"  # a natural end, well before 2000
    assert a["usage"]["completion_tokens"] <= 20


def test_default_max_tokens_follow_vllm(fleet: FleetHandle):
    messages = [{"role": "user", "content": "hello"}]
    before = metrics(fleet)
    chat = httpx.post(fleet.api_urls[0] + "/chat/completions", timeout=60, json={
        "model": MODEL, "messages": messages, "seed": short_seed(render_chat(messages))}).json()
    assert chat["choices"][0]["finish_reason"] == "stop"
    mid = metrics(fleet)
    httpx.post(fleet.api_urls[0] + "/completions", timeout=60,
               json={"model": MODEL, "prompt": "hello"})
    after = metrics(fleet)
    name = "vllm:request_params_max_tokens_sum"
    # Chat without max_tokens: up to the context window; legacy completions default to 16.
    assert total(mid, name) - total(before, name) == (
        SMALL.max_model_len - chat["usage"]["prompt_tokens"])
    assert total(after, name) - total(mid, name) == 16


# --- client disconnects -----------------------------------------------------------------------


def _idle(f: FleetHandle) -> bool:
    s = metrics(f)
    return (total(s, "vllm:num_requests_running") == 0
            and total(s, "vllm:num_requests_waiting") == 0
            and total(s, "vllm:kv_cache_usage_perc") == 0)


def test_streaming_disconnect_aborts_at_once():
    with running_fleet(1) as f:
        body = {"model": MODEL, "prompt": "x" * 8000, "max_tokens": 10_000,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f.api_urls[0] + "/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            got = [ln for ln in (next(lines) for _ in range(4)) if ln.startswith("data: ")]
            assert got
            s = metrics(f)
            assert total(s, "vllm:num_requests_running") == 1
            assert total(s, "vllm:kv_cache_usage_perc") > 0
        # Leaving the block closes the connection mid-stream.
        wait_until(lambda: _idle(f), "running=0 and kv usage=0 after the disconnect")
        s = metrics(f)
    # vLLM does not count client aborts (vllm-project/vllm#31503): no finished request at all.
    assert total(s, "vllm:request_success_total") == 0
    assert total(s, "vllm:request_success_total", finished_reason="abort") == 0
    assert total(s, "vllm:time_to_first_token_seconds_count") == 1
    assert f.replicas[0].engine.pool.num_free == SMALL.num_gpu_blocks


def test_non_streaming_disconnect_aborts_at_once():
    with running_fleet(1) as f:
        body = json.dumps({"model": MODEL, "prompt": "y" * 8000, "max_tokens": 10_000,
                           "ignore_eos": True}).encode()
        sock = socket.create_connection((f.host, f.ports[0]))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: sim\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: total(metrics(f), "vllm:num_requests_running") == 1,
                   "the request to run")
        sock.close()
        wait_until(lambda: _idle(f), "running=0 and kv usage=0 after the disconnect")
        assert total(metrics(f), "vllm:request_success_total") == 0


# --- errors -----------------------------------------------------------------------------------

LONG = "z" * (4 * SMALL.max_model_len + 8)

BAD_REQUESTS = [
    ("invalid json", "/completions", b"{not json", 400, "BadRequestError", None),
    ("not an object", "/completions", b"[1, 2]", 400, "BadRequestError", None),
    ("schema: messages", "/chat/completions", {"messages": "hi"}, 400, "BadRequestError",
     "messages"),
    ("schema: max_tokens", "/completions", {"prompt": "a", "max_tokens": "many"}, 400,
     "BadRequestError", "max_tokens"),
    ("no prompt", "/completions", {"model": MODEL}, 400, "BadRequestError", "prompt"),
    ("unknown model", "/chat/completions",
     {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, 404, "NotFoundError",
     "model"),
    ("prompt too long", "/completions", {"prompt": LONG}, 400, "BadRequestError",
     "input_tokens"),
    ("max_tokens too large", "/completions", {"prompt": "a", "max_tokens": 10**6}, 400,
     "BadRequestError", "max_tokens"),
    ("max_tokens zero", "/completions", {"prompt": "a", "max_tokens": 0}, 400,
     "BadRequestError", "max_tokens"),
    ("max_completion_tokens negative", "/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -3}, 400,
     "BadRequestError", "max_tokens"),
    ("n > 1", "/completions", {"prompt": "a", "n": 2}, 400, "BadRequestError", "n"),
    ("min_tokens > max_tokens", "/completions", {"prompt": "a", "max_tokens": 3,
                                                 "min_tokens": 5}, 400, "BadRequestError",
     "min_tokens"),
]


@pytest.mark.parametrize(("case", "path", "body", "status", "etype", "param"), BAD_REQUESTS,
                         ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests(fleet: FleetHandle, case, path, body, status, etype, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(fleet.api_urls[0] + path, content=content, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()
    assert set(err) == {"error"}
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["code"] == status and err["error"]["type"] == etype
    assert err["error"]["param"] == param
    assert err["error"]["message"]
    if case == "unknown model":
        assert err["error"]["message"] == "The model `gpt-9` does not exist."
    if case == "prompt too long":
        assert err["error"]["message"].startswith(
            f"This model's maximum context length is {SMALL.max_model_len} tokens. "
            f"However, your request has {-(-len(LONG) // 4)} input tokens.")


def test_queue_limit_answers_503():
    with running_fleet(1, max_num_queued_reqs=1) as f:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 10_000, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f.api_urls[0] + "/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()  # keep it referenced: dropping it closes the stream
            next(lines)
            busy = httpx.post(f.api_urls[0] + "/completions", timeout=30,
                              json={"model": MODEL, "prompt": "b", "max_tokens": 2})
        assert busy.status_code == 503
        assert busy.json()["error"]["code"] == 503
        s = metrics(f)
    assert total(s, "vllm:admission_rejections_total", reason="max_num_queued_reqs") == 1


def test_restart_ends_an_open_stream_with_an_error_event():
    with running_fleet(1) as f:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 10_000, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f.api_urls[0] + "/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            next(lines)
            f.restart(0)
            data = events(lines)
        assert data[-1] == "[DONE]"
        assert json.loads(data[-2])["error"]["code"] == 500
        assert _idle(f)


# --- the fleet as a process and the CLI -------------------------------------------------------


def test_cli_options_build_the_fleet_spec():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    spec = spec_from_args(parser.parse_args(
        ["--replicas", "3", "--port", "9000", "--profile", "h100-llama3.1-8b",
         "--spec-decode", "3", "--spec-acceptance", "0.6", "--enable-lora",
         "--lora-modules", "a", "b", "--scheduling-policy", "priority", "--seed", "5",
         "--gpu", "H100"]))
    assert (spec.replicas, spec.port, spec.profile, spec.spec_decode) == (
        3, 9000, "h100-llama3.1-8b", 3)
    assert spec.enable_lora and spec.lora_modules == ("a", "b")
    assert spec.scheduling_policy == "priority" and spec.seed == 5 and spec.gpu == "H100"


def test_subprocess_fleet_serves_and_stops_cleanly():
    with running_fleet(2, subprocess=True) as f:
        assert f.names == ["llama-3.1-8b-instruct-0", "llama-3.1-8b-instruct-1"]
        for base in f.base_urls:
            assert httpx.get(base + "/health", timeout=10).status_code == 200
        r = httpx.post(f.api_urls[1] + "/completions", timeout=30,
                       json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200
        proc = f.process
    assert proc is not None and proc.returncode == 0
