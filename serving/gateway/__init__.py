"""The OpenAI-compatible gateway in front of vLLM: tiers, max_tokens policy, cancellation,
per-request records, batch queue and semantic cache (``vigil gateway``).

The request path is ``gateway.Gateway``; beside it, the tiers (``tiers``), the max_tokens policy
(``max_tokens``), tier admission (``admission``), budgets (``budgets``), each request's share of
the GPU cost (``accounting``), the semantic cache's side (``caching``) and the errors
(``errors``). The rooms:

- ``front``: the HTTP front (the FastAPI app, raw-ASGI answers, the uvicorn protocol, reading
  bodies, API keys, SSE framing and relaying);
- ``upstream``: the replicas, their HTTP client, forwarding and prefix-aware routing;
- ``batch``: the batch queue, its API and its store, and its interface with the gateway;
- ``telemetry``: ``/metrics``, OpenTelemetry and the request-record writer.
"""
