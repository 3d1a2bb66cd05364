"""GPU/model profiles: every calibration number of the simulator, as a parameter.

The numbers of ``h100-llama3.1-8b`` are orders of magnitude for Llama-3.1-8B-Instruct in bf16 on one
H100 80GB under vLLM (see DESIGN.md, "Simulator calibration"):

- KV cache per token: 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes = 128 KiB. About
  55 GB are left for KV after ~16 GB of weights at ``gpu_memory_utilization`` 0.92: 449,872 tokens,
  28,117 blocks of 16 tokens (the values of the fixture's ``vllm:cache_config_info``).
- Prefill: ~15k prompt tokens/s per GPU (published range 10-20k).
- Decode: one step is memory-bound: it reads the weights once (~8.5 ms at batch 1) plus a little
  per running sequence and per token of context it attends over, so a step takes ~9 ms at batch 1
  and ~30-40 ms with a few hundred sequences.

The ``small`` profile is the same GPU and model with vLLM's ``num_gpu_blocks_override=2000``,
``max_num_seqs=64`` and ``max_num_batched_tokens=2048``, and slower steps, so that a laptop demo
reaches KV-cache pressure, queueing and preemptions with a few requests per second.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from vigil.errors import ConfigError

__all__ = ["DEFAULT_MODEL", "GPU_MODEL_NAMES", "PROFILES", "Profile", "get_profile"]

#: The model the profiles are calibrated for (the served model name by default).
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"

#: ``--gpu`` price key -> the ``modelName`` NVML reports (DCGM's ``modelName`` label).
GPU_MODEL_NAMES: dict[str, str] = {
    "H100": "NVIDIA H100 80GB HBM3",
    "H200": "NVIDIA H200",
    "A100": "NVIDIA A100-SXM4-80GB",
    "L40S": "NVIDIA L40S",
    "L4": "NVIDIA L4",
}


@dataclass(frozen=True)
class Profile:
    """Calibration of one simulated GPU serving one model. Units are in the field names' docs.

    Step time model (seconds), memory-bound decode plus compute-bound prefill::

        t = decode_base_s
            + decode_per_seq_s * running sequences in the step
            + decode_per_ctx_token_s * context tokens those sequences attend over
            + (prompt tokens computed + draft tokens verified) / prefill_tokens_per_s
    """

    name: str
    #: Price key of the GPU (what the cost model looks up), e.g. ``"H100"``.
    gpu: str = "H100"
    #: NVML model name, DCGM's ``modelName`` label.
    gpu_model_name: str = "NVIDIA H100 80GB HBM3"
    #: Total framebuffer, MiB (an H100 80GB HBM3 reports 81,559 MiB).
    gpu_memory_mib: int = 81_559
    #: Fraction 0-1 of GPU memory vLLM pre-allocates (0.92 is vLLM 0.33's default).
    gpu_memory_utilization: float = 0.92
    #: Framebuffer used outside vLLM's budget (CUDA context, NCCL), MiB.
    cuda_context_mib: int = 512
    #: Framebuffer the driver reserves, MiB (DCGM_FI_DEV_FB_RESERVED).
    fb_reserved_mib: int = 543
    #: Board power with the model loaded and no kernel running, watts.
    power_idle_w: float = 72.0
    #: Board power limit, watts (H100 SXM: 700 W).
    power_max_w: float = 700.0
    #: SM clock under load / when idle, MHz.
    sm_clock_max_mhz: int = 1980
    sm_clock_idle_mhz: int = 345
    #: HBM clock, MHz.
    mem_clock_mhz: int = 2619
    #: GPU temperature at idle / at sustained full power, degrees C.
    temp_idle_c: float = 31.0
    temp_max_c: float = 74.0
    #: NVIDIA driver version (DCGM's ``DCGM_FI_DRIVER_VERSION`` label).
    driver_version: str = "570.172.08"

    #: KV-cache bytes per token (128 KiB for Llama-3.1-8B in bf16).
    kv_bytes_per_token: int = 131_072
    #: Tokens per KV block (vLLM's ``--block-size``).
    block_size: int = 16
    #: KV blocks available (vLLM's ``num_gpu_blocks``).
    num_gpu_blocks: int = 28_117
    #: Set when the block count is forced (vLLM's ``--num-gpu-blocks-override``).
    num_gpu_blocks_override: int | None = None
    #: Max running sequences per engine. vLLM's generic default is 256; the newest vLLM picks
    #: 1024 on GPUs with >= 70 GB (H100/H200) - use ``dataclasses.replace`` to try that.
    max_num_seqs: int = 256
    #: Token budget of one engine step (chunked prefill; 8192 is vLLM's H100 default).
    max_num_batched_tokens: int = 8192
    #: Longest prompt + output, tokens.
    max_model_len: int = 131_072

    #: Prefill throughput, prompt tokens per second.
    prefill_tokens_per_s: float = 15_000.0
    #: Decode step time at batch 1, seconds (reading the weights once).
    decode_base_s: float = 0.0085
    #: Extra step time per running sequence, seconds.
    decode_per_seq_s: float = 0.00009
    #: Extra step time per token of context attended over, seconds (KV reads).
    decode_per_ctx_token_s: float = 8e-9

    def __post_init__(self) -> None:
        where = f"profile {self.name!r}"
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError("gpu_memory_utilization must be in (0, 1]", key=where)
        for field in ("block_size", "num_gpu_blocks", "max_num_seqs",
                      "max_num_batched_tokens", "max_model_len"):
            if getattr(self, field) < 1:
                raise ConfigError(f"{field} must be >= 1", key=where)
        if self.prefill_tokens_per_s <= 0 or self.decode_base_s <= 0:
            raise ConfigError("prefill_tokens_per_s and decode_base_s must be > 0", key=where)
        if self.max_model_len > self.kv_cache_size_tokens:
            # vLLM refuses to start in this case ("To serve at least one request with the model's
            # max seq len ... KV cache is needed, which is larger than the available KV cache").
            raise ConfigError(
                f"max_model_len {self.max_model_len} does not fit in the KV cache "
                f"({self.kv_cache_size_tokens} tokens); lower max_model_len", key=where)

    @property
    def kv_cache_size_tokens(self) -> int:
        """Tokens the KV cache holds (blocks x block size)."""
        return self.num_gpu_blocks * self.block_size

    @property
    def kv_cache_max_concurrency(self) -> float:
        """How many max_model_len requests fit in the cache at once (vLLM's definition)."""
        return self.kv_cache_size_tokens / self.max_model_len

    @property
    def kv_cache_gib(self) -> float:
        """Size of the KV cache, GiB."""
        return self.kv_cache_size_tokens * self.kv_bytes_per_token / 2**30

    def blocks_for(self, tokens: int) -> int:
        """KV blocks needed to hold ``tokens`` tokens."""
        return math.ceil(tokens / self.block_size)

    def step_seconds(self, *, decode_seqs: int, context_tokens: int,
                     compute_tokens: int) -> float:
        """Duration of one engine step, seconds.

        ``decode_seqs`` sequences are in the batch, attending over ``context_tokens`` tokens of
        KV in total; ``compute_tokens`` are prompt tokens computed plus draft tokens verified.
        """
        return (self.decode_base_s
                + self.decode_per_seq_s * decode_seqs
                + self.decode_per_ctx_token_s * context_tokens
                + compute_tokens / self.prefill_tokens_per_s)

    def with_gpu(self, gpu: str) -> Profile:
        """The same calibration under another GPU price key / model name."""
        if gpu == self.gpu:
            return self
        name = GPU_MODEL_NAMES.get(gpu, f"NVIDIA {gpu}")
        return dataclasses.replace(self, gpu=gpu, gpu_model_name=name)


H100_LLAMA31_8B = Profile(name="h100-llama3.1-8b")

SMALL = Profile(
    name="small",
    num_gpu_blocks=2000,
    num_gpu_blocks_override=2000,
    max_num_seqs=64,
    max_num_batched_tokens=2048,
    max_model_len=16_384,
    # Smaller chunks and a busy laptop-sized budget: slower than the full H100 profile, so that
    # a handful of requests per second already fills the 32k-token cache.
    prefill_tokens_per_s=6_000.0,
    decode_base_s=0.015,
    decode_per_seq_s=0.00025,
)

#: Profiles by name (the CLI's ``--profile`` choices).
PROFILES: dict[str, Profile] = {p.name: p for p in (H100_LLAMA31_8B, SMALL)}


def get_profile(name: str, *, gpu: str | None = None) -> Profile:
    """The profile called ``name``, optionally under another GPU price key."""
    try:
        profile = PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown simulator profile {name!r} (choose from "
                          f"{', '.join(sorted(PROFILES))})", key="sim.profile") from None
    return profile.with_gpu(gpu) if gpu else profile
