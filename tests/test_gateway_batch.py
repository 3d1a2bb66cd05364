"""The batch API over real HTTP: the official openai client against a simulated replica, bad
input files, tenant isolation, batch creation checks (serving/gateway/batch/api.py)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from support.batch import (
    MODEL,
    ControlledLoad,
    HttpSender,
    LoopThread,
    batch_config,
    chat_line,
    file_lines,
    headers,
    jsonl,
    openai_client,
    running_queue,
    submit,
    upload,
    wait_status,
)

from serving.sim.testing import FleetHandle, running_fleet, sample_values, total


@pytest.fixture
def fleet() -> Iterator[FleetHandle]:
    with running_fleet(1, scheduling_policy="priority") as f:
        yield f


@pytest.fixture
def gateway(loop: LoopThread, fleet: FleetHandle, tmp_path: Path
            ) -> Iterator[tuple[httpx.Client, HttpSender]]:
    """The batch app in front of a simulated replica, with headroom."""
    sender = HttpSender(fleet.base_urls[0])
    load = ControlledLoad()
    load.idle()
    with running_queue(loop, tmp_path / "gw.db", batch_config(), send=sender,
                       load=load) as (client, _):
        yield client, sender
    loop.call(sender.aclose())


def test_openai_client_round_trip(gateway: tuple[httpx.Client, HttpSender],
                                  fleet: FleetHandle) -> None:
    client, _ = gateway
    oa = openai_client(client)
    lines = [chat_line(f"req-{i}", content=f"Question {i}?") for i in range(3)]
    f = oa.files.create(file=("input.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert f.purpose == "batch" and f.bytes == len(jsonl(lines))
    assert oa.files.retrieve(f.id).filename == "input.jsonl"
    b = oa.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                          completion_window="24h", metadata={"job": "nightly"})
    assert b.status == "in_progress" and b.metadata == {"job": "nightly"} and b.model == MODEL
    done = wait_status(client, b.id, "completed")
    b = oa.batches.retrieve(b.id)
    assert b.status == "completed" and b.completed_at is not None and b.error_file_id is None
    assert b.request_counts is not None
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == \
        (3, 3, 0)
    assert b.output_file_id == done["output_file_id"]
    out = [json.loads(x) for x in oa.files.content(b.output_file_id).text
           .splitlines()]
    assert [x["custom_id"] for x in out] == ["req-0", "req-1", "req-2"]
    for x in out:
        assert x["error"] is None and x["response"]["status_code"] == 200
        assert x["response"]["body"]["choices"][0]["message"]["content"]
        assert x["response"]["request_id"] == x["response"]["body"]["id"]
    assert [x.id for x in oa.batches.list()] == [b.id]
    text = httpx.get(fleet.metrics_urls[0]).text
    assert total(sample_values(text), "vllm:request_success_total") == 3


def test_bad_lines_are_rejected_with_their_line_numbers(
        gateway: tuple[httpx.Client, HttpSender]) -> None:
    client, sender = gateway
    content = jsonl([
        chat_line("ok-1"),
        '{"custom_id": "x", "method": "POST",',  # line 2: cut short
        chat_line("m", model="no-such-model"),  # line 3
        "",  # line 4: blank lines are skipped
        chat_line("ok-1"),  # line 5: duplicate custom_id
        {**chat_line("u"), "url": "/v1/embeddings"},  # line 6
        {**chat_line("k"), "bdy": {}},  # line 7: typo
    ])
    r = upload(client, content)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "file" and err["code"] == "invalid_batch_file"
    msg = err["message"]
    assert "line 2: invalid JSON" in msg
    assert "line 3: model 'no-such-model' is not served" in msg
    assert "line 5: custom_id 'ok-1' is already used on line 1" in msg
    assert "line 6: url must be" in msg and "'/v1/embeddings'" in msg
    assert "line 7: unknown key 'bdy'" in msg
    assert "line 1:" not in msg and "line 4:" not in msg
    # The official client surfaces the same message.
    oa = openai_client(client)
    with pytest.raises(openai.BadRequestError, match="line 3: model 'no-such-model'"):
        oa.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    assert sender.sent == []


@pytest.mark.parametrize(("content", "purpose", "expected"), [
    (b"", "batch", "the file holds no requests"),
    (b"\xff\xfe", "batch", "not UTF-8"),
    (jsonl([chat_line("a")]), "fine-tune", "purpose must be 'batch'"),
    (jsonl([{**chat_line("s"), "body": {**chat_line("s")["body"], "stream": True}}]), "batch",
     "line 1: body.stream must be false"),
])
def test_upload_refuses(gateway: tuple[httpx.Client, HttpSender], content: bytes,
                        purpose: str, expected: str) -> None:
    client, _ = gateway
    r = upload(client, content, purpose=purpose)
    assert r.status_code == 400
    assert expected in r.json()["error"]["message"]


def test_unknown_key_gets_401(gateway: tuple[httpx.Client, HttpSender]) -> None:
    client, _ = gateway
    assert client.get("/v1/batches").status_code == 401
    assert upload(client, jsonl([chat_line("a")]), key="key-nobody").status_code == 401


def test_tenants_see_only_their_own_files_and_batches(
        gateway: tuple[httpx.Client, HttpSender]) -> None:
    client, _ = gateway
    b = submit(client, [chat_line("a")], key="key-alpha")
    wait_status(client, b["id"], "completed")
    file_id, out_id = b["input_file_id"], wait_status(client, b["id"], "completed")[
        "output_file_id"]
    beta = headers("key-beta")
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content",
                 f"/v1/files/{out_id}/content", f"/v1/batches/{b['id']}"):
        r = client.get(path, headers=beta)
        assert r.status_code == 404, path
        assert r.json()["error"]["code"] == "not_found"
    assert client.post(f"/v1/batches/{b['id']}/cancel", headers=beta).status_code == 404
    r = client.post("/v1/batches", headers=beta, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions",
        "completion_window": "24h"})
    assert r.status_code == 404
    assert client.get("/v1/batches", headers=beta).json()["data"] == []
    # Another key of the same tenant sees everything.
    alpha2 = headers("key-alpha-2")
    assert client.get(f"/v1/batches/{b['id']}", headers=alpha2).status_code == 200
    assert [x["id"] for x in client.get("/v1/batches", headers=alpha2).json()["data"]] == \
        [b["id"]]


def test_list_pages_newest_first(gateway: tuple[httpx.Client, HttpSender]) -> None:
    client, _ = gateway
    ids = [submit(client, [chat_line(f"p{i}")])["id"] for i in range(3)]
    page = client.get("/v1/batches", params={"limit": 2}, headers=headers()).json()
    assert [x["id"] for x in page["data"]] == ids[::-1][:2] and page["has_more"] is True
    page2 = client.get("/v1/batches", params={"limit": 2, "after": page["last_id"]},
                       headers=headers()).json()
    assert [x["id"] for x in page2["data"]] == [ids[0]] and page2["has_more"] is False
    r = client.get("/v1/batches", params={"limit": 0}, headers=headers())
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"


def test_endpoint_mismatch_fails_the_batch_with_line_numbers(
        gateway: tuple[httpx.Client, HttpSender]) -> None:
    client, sender = gateway
    lines = [chat_line("a"),
             {"custom_id": "b", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": "hi", "max_tokens": 2}}]
    file_id = upload(client, jsonl(lines)).json()["id"]
    r = client.post("/v1/batches", headers=headers(), json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions",
        "completion_window": "24h"})
    assert r.status_code == 200
    b = r.json()
    assert b["status"] == "failed" and b["failed_at"] is not None
    assert [(e["line"], e["param"]) for e in b["errors"]["data"]] == [(2, "url")]
    assert "does not match the batch's endpoint" in b["errors"]["data"][0]["message"]
    assert b["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert sender.sent == []


@pytest.mark.parametrize(("body", "param", "status"), [
    ({"endpoint": "/v1/chat/completions", "completion_window": "24h"}, "input_file_id", 400),
    ({"input_file_id": "file-x", "endpoint": "/v1/embeddings", "completion_window": "24h"},
     "endpoint", 400),
    ({"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
      "completion_window": "soon"}, "completion_window", 400),
    ({"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
      "completion_window": "24h", "priority": 0}, "priority", 400),
    ({"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
      "completion_window": "24h", "metadata": {"k": 1}}, "metadata", 400),
    ({"input_file_id": "file-nope", "endpoint": "/v1/chat/completions",
      "completion_window": "24h"}, None, 404),
])
def test_create_batch_refuses(gateway: tuple[httpx.Client, HttpSender], body: dict[str, object],
                              param: str | None, status: int) -> None:
    client, _ = gateway
    r = client.post("/v1/batches", headers=headers(), json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_output_file_cannot_start_a_batch(gateway: tuple[httpx.Client, HttpSender]) -> None:
    client, _ = gateway
    b = wait_status(client, submit(client, [chat_line("a")])["id"], "completed")
    r = client.post("/v1/batches", headers=headers(), json={
        "input_file_id": b["output_file_id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h"})
    assert r.status_code == 400 and "purpose 'batch_output'" in r.json()["error"]["message"]
    out = client.get(f"/v1/files/{b['output_file_id']}", headers=headers()).json()
    assert out["purpose"] == "batch_output" and out["expires_at"] is not None
    assert len(file_lines(client, b["output_file_id"])) == 1
