"""Batch input validation and the OpenAI object shapes (serving/gateway/batch/api.py)."""

from __future__ import annotations

import json

import pytest
from openai.types import Batch, FileObject

from serving.gateway.batch.api import (
    MAX_LINES,
    InputLine,
    batch_object,
    file_object,
    parse_batch_input,
)
from serving.gateway.batch.store import RequestCounts, StoredBatch, StoredFile
from vigil.errors import BatchInputError

MODEL = "m"


def _pool(model: str) -> str | None:
    return {"m": "chat", "other": "elsewhere"}.get(model)


def _parse(text: str, max_lines: int = MAX_LINES) -> list[InputLine]:
    return parse_batch_input(text.encode(), pool_of_model=_pool, pools=["chat"],
                             max_lines=max_lines)


def _line(custom_id: str, **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                **body}})


def _problems(text: str, max_lines: int = MAX_LINES) -> list[tuple[int, str]]:
    with pytest.raises(BatchInputError) as info:
        _parse(text, max_lines)
    return info.value.problems


def test_good_lines_keep_their_line_numbers() -> None:
    completion = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/completions",
                             "body": {"model": MODEL, "prompt": "Once", "max_tokens": 3}})
    lines = _parse("\n".join([_line("a"), "", "   ", completion, _line("b")]) + "\n")
    assert [(x.line, x.custom_id, x.url, x.pool) for x in lines] == [
        (1, "a", "/v1/chat/completions", "chat"), (4, "c", "/v1/completions", "chat"),
        (5, "b", "/v1/chat/completions", "chat")]


@pytest.mark.parametrize(("line", "expected"), [
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"custom_id": "a"}', "missing 'body'"),
    (json.dumps({"custom_id": "", "method": "POST", "url": "/v1/completions", "body": {}}),
     "custom_id must be a non-empty string"),
    (json.dumps({"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}),
     "method must be 'POST'"),
    (json.dumps({"custom_id": "a\u0000b", "method": "POST", "url": "/v1/completions",
                 "body": {}}), "custom_id must not hold a NUL character"),
    (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                 "body": {"model": MODEL}}), "body.prompt is required"),
    (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": MODEL, "messages": []}}), "body.messages must be a non-empty"),
    (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"messages": [{}]}}), "body.model must be a non-empty string"),
    (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                 "body": "text"}), "body must be a JSON object"),
    (_line("a").replace(f'"{MODEL}"', '"other"'), "served by pool 'elsewhere', which takes no"),
])
def test_each_bad_line_says_what_is_wrong(line: str, expected: str) -> None:
    [(number, message)] = _problems(_line("ok") + "\n" + line)
    assert number == 2 and expected in message


def test_error_message_lists_line_numbers() -> None:
    with pytest.raises(BatchInputError) as info:
        _parse("\n".join(["{", _line("a"), _line("a"), "nope"]))
    text = str(info.value)
    assert text.startswith("batch input: line 1: invalid JSON")
    assert "line 3: custom_id 'a' is already used on line 2" in text and "line 4:" in text


def test_many_problems_are_summarised() -> None:
    problems = _problems("\n".join("x" for _ in range(150)))
    assert len(problems) == 100
    with pytest.raises(BatchInputError, match=r"\(and 80 more\)"):
        _parse("\n".join("x" for _ in range(150)))


def test_too_many_requests() -> None:
    assert _problems("\n".join(_line(f"c{i}") for i in range(3)), max_lines=2) == \
        [(0, "3 requests is more than the 2 allowed in one batch")]


def test_objects_parse_with_the_openai_types() -> None:
    stored = StoredBatch(
        id="batch_1", tenant="t", key_id="k", input_file_id="file-1",
        endpoint="/v1/chat/completions", completion_window="24h", status="failed",
        created_at=100, expires_at=86500, in_progress_at=None, finalizing_at=None,
        completed_at=None, failed_at=100, expired_at=None, cancelling_at=None,
        cancelled_at=None, output_file_id=None, error_file_id=None,
        errors=[{"code": "invalid_request", "line": 2, "message": "bad", "param": "url"}],
        metadata={"a": "b"}, model=None)
    b = Batch.model_validate(batch_object(stored, RequestCounts(0, 0, 0)))
    assert b.status == "failed" and b.errors is not None and b.errors.data is not None
    assert b.errors.data[0].line == 2 and b.request_counts is not None
    f = FileObject.model_validate(file_object(
        StoredFile("file-1", "t", "batch_output", "o.jsonl", 10, 100), retention=60))
    assert f.purpose == "batch_output" and f.expires_at == 160 and f.status == "processed"
    assert FileObject.model_validate(file_object(
        StoredFile("file-2", "t", "batch", "i.jsonl", 10, 100), retention=60)).expires_at is None


def test_public_surface() -> None:
    import serving.gateway.batch.queue as batch

    assert sorted(batch.__all__) == ["BatchQueue", "BatchRequest", "OffPeakWindow",
                                     "has_headroom", "parse_off_peak"]
    assert all(hasattr(batch, name) for name in batch.__all__)
