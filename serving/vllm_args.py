"""The ``vllm serve`` command line of a pool's launch profile (``vigil vllm-args``,
``vigil vllm-serve``: the commands are in ``vigil_shell``).

Flags were checked against vLLM's source and docs (0.33: ``vllm/config/*.py``,
``vllm/v1/metrics/buckets.py``, docs/usage/metrics.md); see docs/vllm-launch.md. What the
profile asks for that no flag does is said in ``notes`` (printed on stderr, so stdout stays
exactly the command):

* ``quantization = "fp8"`` -> ``--quantization fp8``: vLLM quantizes a BF16/FP16 checkpoint
  to FP8 at load time, no calibration.
* ``"int8"`` (W8A8) and ``"int4"`` (AWQ/GPTQ W4A16) have no load-time flag: the pool's model
  must name a checkpoint already quantized that way, and vLLM reads the scheme from its
  ``config.json`` (``quantization_config``), so no ``--quantization`` is emitted.
* The SLO thresholds become extra bucket bounds through ``--custom-histogram-buckets`` (vLLM
  >= 0.33): vLLM's defaults plus the pool's TTFT and e2e thresholds, so the SLO engine reads an
  exact bucket instead of interpolating. Omitted when every threshold already is a bound.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from slo.objectives.spec import effective_slos
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    VLLM_BUCKET_FAMILY_REQUEST_LATENCY,
    VLLM_BUCKET_FAMILY_TTFT,
    VLLM_REQUEST_LATENCY_BUCKETS,
    VLLM_SPEC_METHODS_NEEDING_MODEL,
    VLLM_SPEC_METHODS_WITHOUT_MODEL,
    VLLM_TTFT_BUCKETS,
)
from vigil.errors import ConfigError

__all__ = [
    "VllmCommand",
    "build_command",
    "histogram_buckets",
    "pool_of",
    "speculative_config",
]

_PREQUANTIZED = {
    "int8": "INT8 W8A8 (e.g. compressed-tensors from llm-compressor)",
    "int4": "INT4 W4A16 (AWQ or GPTQ)",
}


@dataclass(frozen=True)
class VllmCommand:
    """A ``vllm serve`` argv and what the reader should know about it."""

    argv: list[str]
    notes: list[str] = field(default_factory=list)

    def shell(self) -> str:
        """The command as one shell-quoted line."""
        return shlex.join(self.argv)


def pool_of(cfg: Config, name: str) -> PoolConfig:
    """The pool called ``name``; ``ConfigError`` (exit 2) listing the known pools otherwise."""
    try:
        return cfg.pool(name)
    except KeyError:
        known = ", ".join(repr(p.name) for p in cfg.pools) or "none defined"
        raise ConfigError(f"pool {name!r} does not exist (pools: {known})",
                          file=cfg.source or None, key="--pool") from None


def _json(value: Any) -> str:
    return json.dumps(value)


def speculative_config(pool: PoolConfig) -> dict[str, Any] | None:
    """vLLM's ``--speculative-config`` for the profile, None when speculation is off.

    ``speculative_method`` is ``"ngram"`` (or another method that needs no checkpoint:
    ``suffix``, ``mtp``, ``ngram_gpu``) or the name of a draft model (``method`` becomes
    ``"draft_model"``). A method that needs a checkpoint of its own (``eagle3``, ``medusa``...)
    cannot be written here: pass ``--speculative-config`` in ``extra_args`` instead.
    """
    v = pool.vllm
    method = v.speculative_method.strip()
    if not method:
        return None
    if method in VLLM_SPEC_METHODS_WITHOUT_MODEL:
        return {"method": method, "num_speculative_tokens": v.num_speculative_tokens}
    if method in VLLM_SPEC_METHODS_NEEDING_MODEL:
        raise ConfigError(
            f"speculative method {method!r} needs a draft or head checkpoint as well: set "
            "speculative_method to a draft model's name (method draft_model), or leave it "
            "empty and pass --speculative-config '{...}' in extra_args",
            file=None, key=f"pools[{pool.name}].vllm.speculative_method")
    return {"method": "draft_model", "model": method,
            "num_speculative_tokens": v.num_speculative_tokens}


def _slo_thresholds(cfg: Config, pool: PoolConfig) -> dict[str, list[float]]:
    """The pool's latency SLO thresholds (seconds) by indicator (``ttft``, ``e2e``)."""
    out: dict[str, list[float]] = {"ttft": [], "e2e": []}
    for spec in effective_slos(cfg):
        if spec.pool == pool.name and spec.threshold_seconds is not None \
                and spec.indicator in out:
            out[spec.indicator].append(spec.threshold_seconds)
    return out


def histogram_buckets(ttft_thresholds: list[float], e2e_thresholds: list[float]
                      ) -> dict[str, list[float]] | None:
    """``--custom-histogram-buckets`` that add the thresholds (seconds) to vLLM's default TTFT
    and request-latency bounds; None when every threshold already is a default bound.

    A family's list replaces vLLM's (it does not add), so it is written in full: the defaults,
    which the Prometheus rules rely on, stay bounds.
    """
    out: dict[str, list[float]] = {}
    for family, defaults, extra in (
            (VLLM_BUCKET_FAMILY_TTFT, VLLM_TTFT_BUCKETS, ttft_thresholds),
            (VLLM_BUCKET_FAMILY_REQUEST_LATENCY, VLLM_REQUEST_LATENCY_BUCKETS, e2e_thresholds)):
        bounds = sorted({float(b) for b in (*defaults, *extra)})
        if len(bounds) > len(defaults):
            out[family] = bounds
    return out or None


def build_command(cfg: Config, pool_name: str, *, host: str | None = None,
                  port: int | None = None) -> VllmCommand:
    """The ``vllm serve`` command of pool ``pool_name``'s ``[pools.vllm]`` profile."""
    pool = pool_of(cfg, pool_name)
    v = pool.vllm
    argv = ["vllm", "serve", pool.model, "--served-model-name", pool.model]
    notes: list[str] = []
    if host is not None:
        argv += ["--host", host]
    if port is not None:
        argv += ["--port", str(port)]
    if pool.gpus_per_replica > 1:
        argv += ["--tensor-parallel-size", str(pool.gpus_per_replica)]
    if v.quantization == "fp8":
        argv += ["--quantization", "fp8"]
    elif v.quantization in _PREQUANTIZED:
        notes.append(
            f"quantization {v.quantization!r}: vLLM cannot quantize to "
            f"{_PREQUANTIZED[v.quantization]} at load time; the model {pool.model!r} must be a "
            "checkpoint already quantized that way (vLLM reads the scheme from its "
            "config.json, so no --quantization flag is given)")
    argv += ["--scheduling-policy", v.scheduling_policy]
    if v.scheduling_policy != "priority":
        notes.append(
            "scheduling_policy 'fcfs': vLLM refuses requests with a non-zero priority "
            "('Got priority 2 but Priority scheduling is not enabled.'), and the gateway sends "
            "priority 1 (standard) and 2 (batch); use 'priority' behind the gateway")
    spec = speculative_config(pool)
    if spec is not None:
        argv += ["--speculative-config", _json(spec)]
    argv.append("--enable-prefix-caching" if v.enable_prefix_caching
                else "--no-enable-prefix-caching")
    # usage.prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache served,
    # which the chargeback weighs less than computed ones (slo.cost.attribution).
    argv.append("--enable-prompt-tokens-details")
    argv += ["--max-num-seqs", str(v.max_num_seqs)]
    if v.max_model_len is not None:
        argv += ["--max-model-len", str(v.max_model_len)]
    argv += ["--gpu-memory-utilization", f"{v.gpu_memory_utilization:g}"]
    argv += ["--override-generation-config", _json({"max_new_tokens": v.max_new_tokens})]
    largest_cap = max(cfg.gateway.tier(t).max_tokens_cap for t in ("premium", "standard",
                                                                      "batch"))
    if v.max_new_tokens < largest_cap:
        notes.append(
            f"max_new_tokens {v.max_new_tokens}: vLLM applies it as a ceiling on every "
            f"request, not only as a default, so a request asking for more (the gateway's "
            f"tier caps go up to {largest_cap}) is cut at {v.max_new_tokens} by vLLM; the "
            "gateway sets the default itself ([gateway] default_max_tokens)")
    thresholds = _slo_thresholds(cfg, pool)
    buckets = histogram_buckets(thresholds["ttft"], thresholds["e2e"])
    if buckets is not None:
        argv += ["--custom-histogram-buckets", _json(buckets)]
    if v.otlp_traces_endpoint:
        argv += ["--otlp-traces-endpoint", v.otlp_traces_endpoint]
        if v.otlp_traces_endpoint.rstrip("/").endswith("/v1/traces"):
            notes.append(
                f"otlp_traces_endpoint {v.otlp_traces_endpoint!r} is an OTLP/HTTP path: vLLM "
                "exports over gRPC unless its environment sets "
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf")
    argv += list(v.extra_args)
    return VllmCommand(argv, notes)
