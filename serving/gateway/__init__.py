"""The OpenAI-compatible gateway in front of vLLM: tiers, max_tokens policy, cancellation,
per-request records, batch queue and semantic cache (``vigil gateway``)."""
