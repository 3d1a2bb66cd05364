"""SSE framing and the stream tally: events forwarded whole, usage and tokens accounted."""

from __future__ import annotations

import json

import pytest

from serving.gateway.front.sse import SSE_DONE, MalformedStream, SseFramer, StreamTally, sse_event

_ID = "chatcmpl-8f2c4e1a9b7d4c3e8a6f0b2d1e9c7a54"


def _chunk(delta: dict | None, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish}]
    return {"id": _ID, "object": "chat.completion.chunk", "created": 1796009201,
            "model": "meta-llama/Llama-3.1-8B-Instruct", "choices": choices, "usage": usage}


def _fixture() -> bytes:
    """The events of tests/fixtures/openai_stream_example.txt: an OpenAI chat stream
    (role chunk, three content chunks, an empty finish chunk, the usage chunk, [DONE])."""
    chunks = [_chunk({"role": "assistant", "content": ""}),
              _chunk({"content": "The KV cache stores"}),
              _chunk({"content": " the attention keys and values of earlier tokens,"}),
              _chunk({"content": " so they are not recomputed for every new token."}),
              _chunk({}, "stop"),
              _chunk(None, usage={"prompt_tokens": 48, "completion_tokens": 23,
                                  "total_tokens": 71})]
    return b"".join(sse_event(c) for c in chunks) + SSE_DONE


def test_events_split_across_reads_come_out_whole() -> None:
    framer = SseFramer()
    data = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    out = []
    for i in range(len(data)):
        out += framer.feed(data[i:i + 1])
    assert out == [b'data: {"a":1}\n\n', b'data: {"b":2}\n\n', SSE_DONE]
    assert framer.rest() == b""


def test_several_events_in_one_read_and_an_unfinished_one() -> None:
    framer = SseFramer()
    assert framer.feed(b'data: 1\n\ndata: 2\n\ndata: 3') == [b"data: 1\n\n", b"data: 2\n\n"]
    assert framer.rest() == b"data: 3"
    assert framer.feed(b"\n\n") == [b"data: 3\n\n"]


def test_crlf_line_ends() -> None:
    assert SseFramer().feed(b"data: 1\r\n\r\ndata: 2\r\n\r\n") == [b"data: 1\n\n", b"data: 2\n\n"]


def test_the_openai_fixture_tallied_with_usage_asked() -> None:
    events = SseFramer().feed(_fixture())
    tally = StreamTally(include_usage=True)
    out = [tally.inspect(e, float(i)) for i, e in enumerate(events)]
    assert out == events  # nothing dropped
    assert tally.first_at == 0.0 and tally.done
    assert tally.finish_reason == "stop"
    assert tally.completion_tokens() == (23, True) and tally.prompt_tokens() == 48
    assert tally.content_chunks == 3  # the role chunk and the empty finish chunk carry none
    assert tally.upstream_id.startswith("chatcmpl-")


def test_usage_chunk_dropped_when_not_asked() -> None:
    events = SseFramer().feed(_fixture())
    tally = StreamTally(include_usage=False)
    out = [o for e in events if (o := tally.inspect(e, 0.0)) is not None]
    assert len(out) == len(events) - 1
    assert all(b'"choices":[]' not in o for o in out)
    assert tally.completion_tokens() == (23, True)  # still accounted


def test_tokens_counted_from_chunks_when_usage_never_comes() -> None:
    tally = StreamTally(include_usage=False)
    for text in ("a", "", "b", "c"):
        chunk = {"id": "x", "choices": [{"index": 0, "delta": {"content": text},
                                         "finish_reason": None}]}
        tally.inspect(sse_event(chunk), 1.0)
    completion = {"id": "y", "choices": [{"index": 0, "text": "d", "finish_reason": None}]}
    tally.inspect(sse_event(completion), 2.0)
    assert tally.completion_tokens() == (4, False)
    assert tally.prompt_tokens() == 0 and not tally.done


def test_kept_chunks_for_the_cache() -> None:
    tally = StreamTally(include_usage=False, keep_chunks=True)
    for e in SseFramer().feed(_fixture()):
        tally.inspect(e, 0.0)
    assert len(tally.chunks) == 6 and tally.chunks[-1]["usage"]["total_tokens"] == 71


def test_mid_stream_error_event() -> None:
    tally = StreamTally(include_usage=False)
    event = sse_event({"error": {"message": "CUDA out of memory", "code": 500}})
    assert tally.inspect(event, 0.0) == event
    assert tally.error == {"message": "CUDA out of memory", "code": 500}
    assert tally.first_at is None


def test_comments_pass_through() -> None:
    assert StreamTally(include_usage=False).inspect(b": keep-alive\n\n", 0.0) == b": keep-alive\n\n"


@pytest.mark.parametrize("event", [b"data: not json\n\n", b"data: [1, 2]\n\n"])
def test_malformed_events(event: bytes) -> None:
    with pytest.raises(MalformedStream):
        StreamTally(include_usage=False).inspect(event, 0.0)


def test_multi_line_data_is_joined() -> None:
    tally = StreamTally(include_usage=True)
    payload = json.dumps({"id": "z", "choices": [], "usage": {"prompt_tokens": 1,
                                                                "completion_tokens": 2}})
    event = b"data: " + payload[:10].encode() + b"\ndata: " + payload[10:].encode() + b"\n\n"
    tally.inspect(event, 0.0)
    assert tally.completion_tokens() == (2, True)


def test_counting_without_parsing_agrees_with_parsing() -> None:
    """After the first chunk, ordinary chunks are counted by pattern, not parsed: same count."""
    bodies = [{"id": "x", "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
              for d in ({"role": "assistant", "content": ""}, {"content": "a"}, {"content": ""},
                        {"content": '"quoted"'}, {"reasoning_content": "r"},
                        {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, {})]
    fast = StreamTally(include_usage=False)
    slow = StreamTally(include_usage=False, keep_chunks=True)  # keep_chunks: every chunk parsed
    for i, body in enumerate(bodies):
        spaced = json.dumps(body).encode()  # with spaces, as some servers write it
        for tally in (fast, slow):
            tally.inspect(b"data: " + spaced + b"\n\n", float(i))
    assert fast.content_chunks == slow.content_chunks == 4
    finish = sse_event({"id": "x", "choices": [{"index": 0, "delta": {},
                                                "finish_reason": "stop"}]})
    fast.inspect(finish, 9.0)
    assert fast.finish_reason == "stop"
