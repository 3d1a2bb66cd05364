"""Reading a request body: strict JSON, then the few fields the gateway itself acts on.

The gateway checks what it needs and what would otherwise reach vLLM as nonsense: the body is a
JSON object, ``model`` a non-empty string, ``stream`` a boolean, ``stream_options`` an object,
``messages`` (chat) a non-empty list of objects, ``prompt`` (completions) and ``input``
(embeddings) present. Everything else is vLLM's to validate; its 400s are passed through.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from serving.gateway.errors import BadRequest
from vigil.conventions import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS

__all__ = ["Incoming", "parse_body", "render_body", "validate"]


@dataclass(slots=True)
class Incoming:
    """A validated request body and the facts the gateway routes and records by."""

    endpoint: str
    body: dict[str, Any]
    model: str
    stream: bool
    #: The client asked for the final usage chunk (``stream_options.include_usage``).
    include_usage: bool


def _no_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON (and vLLM) do not.
    raise ValueError(f"{name} is not valid JSON")


#: ``json.loads(raw, parse_constant=...)`` builds a decoder per call (a microsecond of the hot
#: path): one, made once, decodes what ``json.loads`` would (bytes in UTF-8, -16 or -32).
_DECODE = json.JSONDecoder(parse_constant=_no_constant).decode
#: The upstream body's rendering: compact, UTF-8 (made once for the same reason).
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def parse_body(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object; ``BadRequest`` (400) for anything else."""
    if not raw.strip():
        raise BadRequest("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        data = _DECODE(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"We could not parse the JSON body of your request ({exc}).",
                         code="invalid_json") from None
    except RecursionError:
        raise BadRequest("The JSON body is nested too deeply.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest(f"The request body must be a JSON object, not "
                         f"{_json_type(data)}.", code="invalid_json")
    return data


def render_body(body: dict[str, Any]) -> bytes:
    """``body`` as the compact UTF-8 JSON sent upstream."""
    return _ENCODE(body).encode()


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _wrong_type(param: str, expected: str, value: Any) -> BadRequest:
    return BadRequest(f"{param} must be {expected}, not {_json_type(value)}.", param=param,
                      code="invalid_type")


def validate(body: dict[str, Any], endpoint: str) -> Incoming:
    """Check ``body`` for ``endpoint`` ("chat" | "completions" | "embeddings")."""
    model = body.get("model")
    if model is None:
        raise BadRequest("you must provide a model parameter.", param="model",
                         code="missing_required_parameter")
    if not isinstance(model, str):
        raise _wrong_type("model", "a string", model)
    if not model:
        raise BadRequest("model must not be empty.", param="model", code="invalid_value")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _wrong_type("stream", "a boolean", stream)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise _wrong_type("stream_options", "an object", options)
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise _wrong_type("stream_options.include_usage", "a boolean", usage)
        include_usage = bool(usage)
    if endpoint == ENDPOINT_CHAT:
        messages = body.get("messages")
        if messages is None:
            raise BadRequest("messages is required.", param="messages",
                             code="missing_required_parameter")
        if not isinstance(messages, list):
            raise _wrong_type("messages", "an array", messages)
        if not messages:
            raise BadRequest("messages must not be empty.", param="messages",
                             code="invalid_value")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise _wrong_type(f"messages[{i}]", "an object", m)
    elif endpoint == ENDPOINT_COMPLETIONS:
        prompt = body.get("prompt")
        if prompt is None:
            raise BadRequest("prompt is required.", param="prompt",
                             code="missing_required_parameter")
        if not isinstance(prompt, str | list):
            raise _wrong_type("prompt", "a string or an array", prompt)
    elif endpoint == ENDPOINT_EMBEDDINGS:
        given = body.get("input")
        if given is None:
            raise BadRequest("input is required.", param="input",
                             code="missing_required_parameter")
        if not isinstance(given, str | list):
            raise _wrong_type("input", "a string or an array", given)
    return Incoming(endpoint=endpoint, body=body, model=model, stream=bool(stream),
                    include_usage=include_usage)
