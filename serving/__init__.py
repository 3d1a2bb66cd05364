"""Vigil's serving side: the gateway, vLLM launch profiles and the vLLM simulator.

``serving.sim`` is the vLLM-compatible simulator that stands in for GPUs on laptops, in CI and in
demos: it speaks vLLM's OpenAI API, exposes vLLM 0.33's ``/metrics`` and a DCGM-exporter-style
endpoint, and behaves like a continuous-batching engine on a calibrated GPU.
"""
