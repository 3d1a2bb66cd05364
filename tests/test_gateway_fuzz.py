"""Fuzzing the gateway's request surface with hypothesis (schemathesis is not installed).

Whatever the body, headers or endpoint: never a 500, and every refusal is a JSON body with an
OpenAI-style ``error`` object. The upstream is a scripted replica that always answers, so every
failure found here is the gateway's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.gateway import (
    KEYS,
    MODEL,
    GatewayHandle,
    gateway_config,
    running_gateway,
    scripted_upstream,
)

FIELDS = ["model", "messages", "prompt", "input", "stream", "stream_options", "max_tokens",
          "max_completion_tokens", "priority", "temperature", "n", "user", "tools"]
VALID = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": MODEL, "prompt": "hi"},
    "/v1/embeddings": {"model": MODEL, "input": "hi"},
}

json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
auth_headers = st.sampled_from([None, "", "Bearer", "Bearer sk-nope", "Basic abc",
                                *[f"Bearer {k}" for k in KEYS for _ in range(3)]])


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes]:
    """A path and a body: a valid body with a few fields added, replaced or removed, or (one
    time in ten) raw bytes."""
    path = draw(st.sampled_from(sorted(VALID)))
    if draw(st.integers(0, 9)) == 0:
        return path, draw(st.binary(max_size=64))
    body: dict[str, Any] = dict(VALID[path])
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            body.pop(key, None)
        else:
            body[key] = draw(json_values)
    return path, json.dumps(body).encode()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayHandle, httpx.Client]]:
    with scripted_upstream() as up:
        cfg = gateway_config(tmp_path_factory.mktemp("fuzz"), [up.url], gateway={
            "max_body_bytes": 4096, "tiers": {"batch": {"max_wait": "0s"}}})
        with running_gateway(cfg) as handle, httpx.Client(base_url=handle.url,
                                                          timeout=10) as client:
            yield handle, client


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests(), auth=auth_headers,
       content_type=st.sampled_from(["application/json", "text/plain", None]))
# Found by this test: "stream" on an embeddings request was passed on, and a replica that
# honoured it answered events where the gateway reads one JSON body (502).
@example(request=("/v1/embeddings", json.dumps({"model": MODEL, "input": "hi",
                                                "stream": True}).encode()),
         auth="Bearer sk-premium", content_type="application/json")
def test_no_500_and_errors_are_openai_shaped(gw: tuple[GatewayHandle, httpx.Client],
                                             request: tuple[str, bytes], auth: str | None,
                                             content_type: str | None) -> None:
    _, client = gw
    path, body = request
    headers = {}
    if auth is not None:
        headers["Authorization"] = auth
    if content_type is not None:
        headers["Content-Type"] = content_type
    r = client.post(path, content=body, headers=headers)
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert {"type", "param", "code"} <= set(err)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.endswith("data: [DONE]\n\n")
    else:
        assert isinstance(r.json(), dict)


def test_fuzzed_requests_were_all_recorded(gw: tuple[GatewayHandle, httpx.Client]) -> None:
    handle, _ = gw
    records = handle.all_records()
    assert len(records) >= 300
    assert not [r for r in records if r.status >= 500]
    assert {r.status for r in records} >= {200, 400, 401}
