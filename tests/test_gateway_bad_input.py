"""Bad input and bad upstreams: an OpenAI-style error with the right status, no hung
connection, and the request's record written."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from support.gateway import (
    MODEL,
    GatewayHandle,
    ScriptedUpstream,
    gateway_config,
    running_gateway,
    scripted_upstream,
)

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with scripted_upstream() as up:
        yield up


@pytest.fixture(scope="module")
def gw(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory
       ) -> Iterator[GatewayHandle]:
    tmp = tmp_path_factory.mktemp("bad")
    cfg = gateway_config(tmp, [upstream.url], gateway={
        "read_timeout": "0.5s", "max_body_bytes": 1_000_000,
        "tiers": {"standard": {"max_tokens_cap": 1000}}})
    with running_gateway(cfg) as handle:
        yield handle


@pytest.fixture(autouse=True)
def _ok_upstream(upstream: ScriptedUpstream) -> Iterator[None]:
    upstream.mode = "ok"
    yield
    upstream.mode = "ok"


def _error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code
    return err


def _record_of(gw: GatewayHandle, r: httpx.Response):
    return gw.record(r.headers["x-vigil-request-id"])


def test_invalid_json(gw: GatewayHandle) -> None:
    with gw.http() as c:
        r = c.post(CHAT, content=b'{"model": ', headers={"Content-Type": "application/json"})
    _error(r, 400, "invalid_json")
    rec = _record_of(gw, r)
    assert (rec.status, rec.error_class, rec.error) == (400, "bad_request", False)
    assert rec.tenant == "acme" and rec.e2e_s is None


@pytest.mark.parametrize("raw", [b"", b"[1, 2]", b'"text"', b"null", b'{"model": NaN}'])
def test_body_that_is_not_an_object(gw: GatewayHandle, raw: bytes) -> None:
    with gw.http() as c:
        _error(c.post(CHAT, content=raw), 400, "invalid_json")


@pytest.mark.parametrize(("field", "value", "param"), [
    ("model", 7, "model"),
    ("model", "", "model"),
    ("stream", "yes", "stream"),
    ("messages", "hello", "messages"),
    ("messages", [], "messages"),
    ("messages", ["hello"], "messages[0]"),
    ("stream_options", [True], "stream_options"),
    ("max_tokens", "12", "max_tokens"),
    ("max_tokens", 12.5, "max_tokens"),
    ("max_tokens", True, "max_tokens"),
    ("max_completion_tokens", -1, "max_completion_tokens"),
    ("max_tokens", 0, "max_tokens"),
])
def test_wrong_types_and_values(gw: GatewayHandle, field: str, value: object,
                                param: str) -> None:
    body = {"model": MODEL, "messages": MESSAGES, field: value}
    with gw.http() as c:
        err = _error(c.post(CHAT, json=body), 400)
    assert err["param"] == param


def test_missing_model_and_messages(gw: GatewayHandle) -> None:
    with gw.http() as c:
        assert _error(c.post(CHAT, json={"messages": MESSAGES}), 400)["param"] == "model"
        assert _error(c.post(CHAT, json={"model": MODEL}), 400)["param"] == "messages"
        assert _error(c.post("/v1/completions", json={"model": MODEL}), 400)["param"] == "prompt"
        assert _error(c.post("/v1/embeddings", json={"model": MODEL}), 400)["param"] == "input"


def test_unknown_model_is_404_model_not_found(gw: GatewayHandle) -> None:
    client = gw.client()
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"
    with gw.http() as c:
        r = c.post(CHAT, json={"model": "gpt-9", "messages": MESSAGES})
    rec = _record_of(gw, r)
    assert (rec.status, rec.model, rec.pool, rec.error_class) == (404, "gpt-9", "", "bad_request")


def test_huge_max_tokens_is_over_cap(gw: GatewayHandle) -> None:
    with gw.http() as c:
        r = c.post(CHAT, json={"model": MODEL, "messages": MESSAGES, "max_tokens": 10**30})
    err = _error(r, 400, "max_tokens_over_cap")
    assert err["param"] == "max_tokens"
    rec = _record_of(gw, r)
    assert rec.error_class == "over_cap"
    assert rec.requested_max_tokens is None  # 10**30 does not fit SQLite's integer


def test_ten_megabyte_body_is_413_and_connection_not_hung(gw: GatewayHandle) -> None:
    prompt = "x" * (10 * 1024 * 1024)
    with gw.http(timeout=30) as c:
        r = c.post(CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": prompt}]})
        _error(r, 413, "request_too_large")
        # The same client keeps working afterwards (a fresh connection if the old one closed).
        assert c.get("/health").status_code == 200
    rec = _record_of(gw, r)
    assert (rec.status, rec.error_class) == (413, "bad_request")


def test_unknown_path_and_method_are_openai_errors(gw: GatewayHandle) -> None:
    with gw.http() as c:
        _error(c.get("/v1/nothing"), 404)
        _error(c.get(CHAT), 405)


@pytest.mark.parametrize(("mode", "status", "error_class"), [
    ("hang", 504, "timeout"),
    ("reset", 502, "upstream_5xx"),
    ("close", 502, "upstream_5xx"),
    ("garbage", 502, "upstream_5xx"),
    ("json_garbage", 502, "upstream_5xx"),
    ("html_502", 502, "upstream_5xx"),
])
def test_failing_upstream_non_streaming(gw: GatewayHandle, upstream: ScriptedUpstream,
                                        mode: str, status: int, error_class: str) -> None:
    upstream.mode = mode
    with gw.http() as c:
        r = c.post(CHAT, json={"model": MODEL, "messages": MESSAGES})
    _error(r, status)
    rec = _record_of(gw, r)
    assert (rec.status, rec.error_class, rec.error) == (status, error_class, True)
    assert rec.replica == "chat-0" and rec.e2e_s is not None


@pytest.mark.parametrize(("mode", "error_class"), [("error_500", "upstream_5xx"),
                                                   ("oom", "oom")])
def test_upstream_500_is_passed_through_and_classified(gw: GatewayHandle,
                                                       upstream: ScriptedUpstream, mode: str,
                                                       error_class: str) -> None:
    upstream.mode = mode
    with gw.http() as c:
        r = c.post(CHAT, json={"model": MODEL, "messages": MESSAGES})
    assert r.status_code == 500
    assert r.json()["error"]["code"] == 500  # vLLM's own body, as it came
    rec = _record_of(gw, r)
    assert (rec.error_class, rec.error) == (error_class, True)


@pytest.mark.parametrize(("mode", "error_class", "status"), [
    ("hang_after_first", "timeout", 504),
    ("stream_garbage", "upstream_5xx", 502),
    ("stream_cut", "upstream_5xx", 502),
])
def test_failing_upstream_mid_stream(gw: GatewayHandle, upstream: ScriptedUpstream, mode: str,
                                     error_class: str, status: int) -> None:
    upstream.mode = mode
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    with gw.http() as c, c.stream("POST", CHAT, json=body) as r:
        assert r.status_code == 200
        events = [e for e in r.read().split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    err = json.loads(events[-2][len(b"data: "):])["error"]
    assert err["type"] == "server_error"
    rec = _record_of(gw, r)
    assert (rec.status, rec.error_class, rec.error) == (status, error_class, True)
    assert rec.completion_tokens == 1 and rec.tokens_source == "chunks"
    assert rec.ttft_s is not None


def test_official_client_sees_the_mid_stream_error(gw: GatewayHandle,
                                                   upstream: ScriptedUpstream) -> None:
    upstream.mode = "stream_cut"
    stream = gw.client().chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError):
        list(stream)


def test_upstream_is_fine_again_afterwards(gw: GatewayHandle) -> None:
    out = gw.client().chat.completions.create(model=MODEL, messages=MESSAGES)
    assert out.choices[0].message.content == "Hello there."

