"""The LiteLLM harness (tests/support/litellm.py): a real LiteLLM proxy in front of a simulated
replica exports one ``litellm_request`` span per request to the OTLP receiver, with the token
counts the client got; and without a database, the tenants' keys (custom auth) show in the
spans as key alias and team, while a refused key's request is exported as an error that names
no tenant."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from support.litellm import MASTER_KEY, REQUEST_SPAN, Tenant, require_litellm, running_litellm
from support.loopback import wait_for
from support.otlp import OtlpReceiver, Span, otlp_receiver

from serving.sim.testing import running_fleet

pytestmark = [pytest.mark.slow, pytest.mark.real_litellm]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "How does batching change latency?"}]
#: Generous bound on the wait for spans (the proxy exports every 0.2 s).
SPANS_TIMEOUT_S = 30.0
#: A span's status code (OTLP's enum) for an error.
STATUS_ERROR = 2


def request_spans(receiver: OtlpReceiver, count: int) -> list[Span]:
    """The receiver's ``litellm_request`` spans, once there are ``count`` of them."""
    def enough() -> list[Span] | None:
        found = receiver.spans_named(REQUEST_SPAN)
        return found if len(found) >= count else None

    return wait_for(f"{count} {REQUEST_SPAN} spans", enough, SPANS_TIMEOUT_S)


def test_each_request_exports_a_litellm_request_span_with_its_usage(tmp_path: Path) -> None:
    require_litellm()
    with running_fleet(1) as fleet, otlp_receiver() as receiver, \
            running_litellm(fleet.api_urls[0], MODEL, receiver.url, tmp_path) as url:
        client = openai.OpenAI(base_url=url, api_key=MASTER_KEY, max_retries=0)
        plain = client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                               max_tokens=12)
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=7, stream=True,
            stream_options={"include_usage": True}))
        streamed_usage = next(c.usage for c in reversed(chunks) if c.usage is not None)
        assert plain.usage is not None
        expected = {plain.id: (plain.usage.prompt_tokens, plain.usage.completion_tokens, "False"),
                    chunks[0].id: (streamed_usage.prompt_tokens,
                                   streamed_usage.completion_tokens, "True")}

        spans = request_spans(receiver, 2)

    got = {s.attributes["gen_ai.response.id"]: (s.attributes["gen_ai.usage.input_tokens"],
                                                s.attributes["gen_ai.usage.output_tokens"],
                                                s.attributes["llm.is_streaming"])
           for s in spans}
    assert got == expected
    assert expected[chunks[0].id][1] == 7
    for s in spans:
        assert s.attributes["gen_ai.system"] == "hosted_vllm"
        assert s.attributes["gen_ai.request.model"] == MODEL
        assert s.resource["service.name"] == "litellm"


def test_tenant_keys_show_as_key_alias_and_team_without_a_database(tmp_path: Path) -> None:
    require_litellm()
    tenants = [Tenant(key="sk-vigil-tenant-a", alias="tenant-a", team="team-a"),
               Tenant(key="sk-vigil-tenant-b", alias="tenant-b", team="team-b")]
    with running_fleet(1) as fleet, otlp_receiver() as receiver, \
            running_litellm(fleet.api_urls[0], MODEL, receiver.url, tmp_path,
                            tenants=tenants) as url:
        ids = {}
        for tenant in tenants:
            client = openai.OpenAI(base_url=url, api_key=tenant.key, max_retries=0)
            response = client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=5,
                user=f"end-user-of-{tenant.alias}")
            ids[response.id] = tenant
        stranger = openai.OpenAI(base_url=url, api_key="sk-unknown", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            stranger.chat.completions.create(model=MODEL, messages=MESSAGES,
                                             max_tokens=5)

        # The refused request is exported too, as an error.
        spans = request_spans(receiver, 3)

    refused = [s for s in spans if s.status == STATUS_ERROR]
    served = [s for s in spans if s.status != STATUS_ERROR]
    assert [(s.attributes["error.code"], s.attributes["metadata.user_api_key_alias"])
            for s in refused] == [("401", "")]
    assert len(served) == 2
    for s in served:
        tenant = ids[s.attributes["gen_ai.response.id"]]
        assert s.attributes["metadata.user_api_key_alias"] == tenant.alias
        assert s.attributes["metadata.user_api_key_team_id"] == tenant.team
        assert s.attributes["metadata.user_api_key_end_user_id"] == f"end-user-of-{tenant.alias}"
        assert s.attributes["llm.user"] == f"end-user-of-{tenant.alias}"
