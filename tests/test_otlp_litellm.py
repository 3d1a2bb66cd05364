"""Behind LiteLLM: a real LiteLLM proxy (``.venv-litellm``) in front of a simulated replica
exports its spans through a real OpenTelemetry collector (rotel) to Vigil's OTLP receiver
(``serving.otlp``, over HTTP on loopback), and the records Vigil writes are the requests the
client sent, one each: the same response ids, the tokens the client was told, the tenant of
the key it used, inside the time the client waited; the per-tenant counts and token sums are
the client's. A request with an unknown key is a refusal that names no tenant.

What cannot be compared here: LiteLLM's own spend log. It lives in LiteLLM's database, which is
Prisma's, whose engine binaries are downloaded at start from a host outside the package
registries (tests/support/litellm.py); the tenants come from LiteLLM's ``custom_auth`` hook,
which the spans report as the key alias a virtual key would give.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from support.litellm import Tenant, require_litellm, running_litellm
from support.loopback import wait_for
from support.otlp import rotel_collector

from serving.otlp.receiver import OtlpReceiver
from serving.sim.testing import running_fleet
from slo.objectives.quantiles import sample_quantile
from slo.sources.request_log import GatewayRecords
from vigil.clock import ManualClock
from vigil.config import parse_config
from vigil.conventions import ERROR_UNAUTHORIZED

pytestmark = [pytest.mark.slow, pytest.mark.real_litellm]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TENANTS = (Tenant(key="sk-vigil-otlp-a", alias="tenant-a", team="team-a"),
           Tenant(key="sk-vigil-otlp-b", alias="tenant-b", team="team-b"))
#: Requests per tenant: streamed and not, of different lengths.
PER_TENANT = 8


@dataclass(frozen=True)
class Sent:
    """One request as the client saw it (Unix seconds)."""

    tenant: str
    response_id: str
    prompt_tokens: int
    completion_tokens: int
    start_s: float
    end_s: float
    stream: bool


@dataclass(frozen=True)
class _Url:
    """What ``rotel_collector`` needs of a receiver: where to export to."""

    url: str


def _send(client: openai.OpenAI, tenant: str, i: int) -> Sent:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": f"request {i} of {tenant}: " + "tell me more " * i}]
    start = time.time()
    if i % 2:
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=4 + i, stream=True,
            stream_options={"include_usage": True}))
        usage = next(c.usage for c in reversed(chunks) if c.usage is not None)
        response_id = chunks[0].id
    else:
        reply = client.chat.completions.create(model=MODEL, messages=messages,
                                               max_tokens=4 + i)
        assert reply.usage is not None
        usage, response_id = reply.usage, reply.id
    return Sent(tenant, response_id, usage.prompt_tokens, usage.completion_tokens, start,
                time.time(), bool(i % 2))


def test_litellm_spans_make_the_records_the_client_saw(tmp_path: Path) -> None:
    require_litellm()
    config = parse_config({
        "pools": [{"name": "chat", "model": MODEL}],
        "gateway": {"records_path": str(tmp_path / "records.db")},
        "otlp": {"join_window": "5s"}})
    clock = ManualClock(time.time())
    vigil = OtlpReceiver(config, clock=clock, tick_interval=None)
    vigil.start()
    sent: list[Sent] = []
    try:
        host, port = vigil.serve_http("127.0.0.1", 0)
        with running_fleet(1) as fleet, \
                rotel_collector(_Url(f"http://{host}:{port}"), tmp_path) as collector, \
                running_litellm(fleet.api_urls[0], MODEL, collector, tmp_path / "litellm",
                                tenants=TENANTS) as url:
            for tenant in TENANTS:
                client = openai.OpenAI(base_url=url, api_key=tenant.key, max_retries=0)
                sent += [_send(client, tenant.alias, i) for i in range(PER_TENANT)]
            stranger = openai.OpenAI(base_url=url, api_key="sk-nobody", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                stranger.chat.completions.create(model=MODEL, max_tokens=3, messages=[
                    {"role": "user", "content": "let me in"}])
            expected = len(sent) + 1
            wait_for(f"{expected} request spans through LiteLLM and rotel",
                     lambda: vigil.counts()["spans"]["recorded"] >= expected, 60,
                     interval_s=0.2)
        clock.advance(10.0)  # past the join window: every request is released
        vigil.tick()
        assert vigil.flush(10.0)
        counts = vigil.counts()
    finally:
        vigil.close()

    with GatewayRecords(tmp_path / "records.db") as records:
        rows = records.rows("chat", clock() + 60, 3600)
    by_id = {r.upstream_id: r for r in rows}
    assert len(rows) == len(sent) + 1, rows
    for s in sent:
        row = by_id[s.response_id]
        assert (row.tenant, row.prompt_tokens, row.completion_tokens) == (
            s.tenant, s.prompt_tokens, s.completion_tokens)
        assert row.model == MODEL and not row.error and row.status == 200
        # LiteLLM's span lies inside what the client waited.
        assert s.start_s <= row.start_s <= row.ts_s <= s.end_s
        assert row.e2e_s is not None and 0 < row.e2e_s <= s.end_s - s.start_s
        assert row.stream == s.stream
    per_tenant = Counter(r.tenant for r in rows if r.tenant)
    assert per_tenant == Counter(s.tenant for s in sent)
    for tenant in TENANTS:
        assert sum(r.completion_tokens for r in rows if r.tenant == tenant.alias) == sum(
            s.completion_tokens for s in sent if s.tenant == tenant.alias)
    (refused,) = [r for r in rows if r.upstream_id not in {s.response_id for s in sent}]
    assert refused.tenant == "" and refused.status == 401
    assert refused.error_class == ERROR_UNAUTHORIZED and not refused.error
    assert counts["spans"]["rejected"] == 0, counts
    # Vigil's exact quantiles from these records (the engine's own function) against the
    # client's: every record's span lies inside the client's wait, so each order statistic
    # is at most the client's; the gap is the proxy's and the client's own overhead.
    with GatewayRecords(tmp_path / "records.db") as records:
        served = [r for r in records.records("chat", clock() + 60, 3600) if not r.error_class]
    for q in (0.5, 0.95):
        ours = sample_quantile(q, [r.e2e_s for r in served if r.e2e_s is not None])
        client = sample_quantile(q, [s.end_s - s.start_s for s in sent])
        assert ours is not None and client is not None and 0 < ours <= client
        print(f"e2e p{round(q * 100)}: records {ours * 1000:.1f} ms, client {client * 1000:.1f} ms")
