"""A DCGM-exporter-style exposition for the GPUs of one simulated replica.

Served on the replica's own port at ``vigil.conventions.SIM_DCGM_PATH``. The text is rendered by
hand the way dcgm-exporter 4.5.3-4.8.2 renders it (``internal/pkg/rendermetrics``): HELP/TYPE per
field, labels ``gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION,
container, namespace, pod`` in that order, integers as ``%d`` and doubles as ``%f``. The fields
are those of ``default-counters.csv`` plus ``DCGM_FI_PROF_SM_ACTIVE`` / ``SM_OCCUPANCY``.

Values are derived from the engine's steps, not drawn at random:

- utilisation and the DCP ratios are moving averages (time constant ``tau_s``) of what the
  steps did: busy time, prefill share (compute-bound) and batch size (memory-bound decode);
- power follows the same activity between the profile's idle and max board power; the energy
  counter (mJ) integrates the instantaneous power exactly, so ``rate()`` of it is the power;
- ``FB_USED`` stays at ``gpu_memory_utilization`` x total (+ the CUDA context) whatever the
  load, because vLLM pre-allocates its KV cache; use ``vllm:kv_cache_usage_perc`` for load;
- temperature follows power with a slow time constant; UUIDs derive from the replica name.

A replica restart restarts vLLM, not the GPU: the same ``GpuActivity`` (and energy counter) is
kept across ``SimReplica.restart()``.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from slo.planning.replica.profiles import Profile
from vigil.clock import Clock, system_clock

__all__ = ["GpuActivity", "GpuSnapshot", "render_dcgm"]

# PCI bus ids of the eight GPUs of a DGX H100, reused per replica (one replica = one node).
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
# Batch size at which the memory-bound decode saturates the GPU's activity counters.
_FULL_BATCH = 256


class _Ema:
    """Continuous-time moving average of a piecewise-constant signal."""

    __slots__ = ("tau", "value")

    def __init__(self, tau: float, value: float = 0.0) -> None:
        self.tau = tau
        self.value = value

    def hold(self, target: float, dt: float) -> None:
        """The signal was ``target`` for ``dt`` seconds."""
        if dt > 0:
            self.value = target + (self.value - target) * math.exp(-dt / self.tau)


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU's readings (every GPU of a replica reads the same; they work in lockstep)."""

    util: float  # ratio 0-1 of time a kernel ran
    sm_active: float  # ratio 0-1
    sm_occupancy: float  # ratio 0-1
    tensor_active: float  # ratio 0-1
    dram_active: float  # ratio 0-1
    gr_engine_active: float  # ratio 0-1
    power_w: float  # watts
    energy_mj: int  # millijoules since boot
    temp_c: float  # degrees C
    sm_clock_mhz: int


class GpuActivity:
    """The GPUs of one replica, integrating the engine's steps over time.

    ``gpus`` GPUs serve the replica (tensor parallel); each gets a deterministic UUID from
    ``replica`` and its index. Times are seconds on ``clock``.
    """

    def __init__(self, profile: Profile, replica: str, *, gpus: int = 1,
                 clock: Clock = system_clock, tau_s: float = 2.0,
                 temp_tau_s: float = 45.0) -> None:
        self.profile = profile
        self.replica = replica
        self.gpus = gpus
        self._clock = clock
        self._t = clock()
        self._busy = _Ema(tau_s)
        self._sm = _Ema(tau_s)
        self._tensor = _Ema(tau_s)
        self._dram = _Ema(tau_s)
        self._power = _Ema(tau_s, profile.power_idle_w)
        self._heat = _Ema(temp_tau_s)  # ratio 0-1 of the way from idle to max power
        digest = hashlib.blake2b(replica.encode(), digest_size=8).digest()
        # Energy since boot: a deterministic 15-45 kWh, so the counter looks like a real GPU's.
        self._energy_mj = float(5.4e10 + int.from_bytes(digest, "big") % 10**11)
        self.uuids = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"vigil-sim:{replica}:{i}"))
                      for i in range(gpus)]

    def _idle_until(self, t: float) -> None:
        dt = t - self._t
        if dt <= 0:
            return
        idle = self.profile.power_idle_w
        for ema in (self._busy, self._sm, self._tensor, self._dram, self._heat):
            ema.hold(0.0, dt)
        self._power.hold(idle, dt)
        self._energy_mj += idle * dt * 1000.0
        self._t = t

    def record_step(self, start: float, end: float, *, prefill_tokens: int,
                    decode_seqs: int) -> None:
        """An engine step ran from ``start`` to ``end`` (seconds)."""
        self._idle_until(start)
        dt = end - max(start, self._t)
        if dt <= 0:
            return
        p = self.profile
        prefill_share = min(1.0, prefill_tokens / p.prefill_tokens_per_s / dt)
        batch = min(1.0, decode_seqs / _FULL_BATCH)
        decode_share = 1.0 - prefill_share
        sm = prefill_share * 0.95 + decode_share * (0.35 + 0.55 * batch)
        tensor = prefill_share * 0.65 + decode_share * (0.06 + 0.30 * batch)
        dram = prefill_share * 0.30 + decode_share * (0.55 + 0.35 * batch)
        intensity = prefill_share + decode_share * (0.30 + 0.50 * batch)
        power = p.power_idle_w + (p.power_max_w - p.power_idle_w) * 0.9 * intensity
        self._busy.hold(1.0, dt)
        self._sm.hold(sm, dt)
        self._tensor.hold(tensor, dt)
        self._dram.hold(dram, dt)
        self._power.hold(power, dt)
        self._heat.hold((power - p.power_idle_w) / (p.power_max_w - p.power_idle_w), dt)
        self._energy_mj += power * dt * 1000.0
        self._t = end

    def snapshot(self, now: float | None = None) -> GpuSnapshot:
        """Readings at ``now`` (default: the clock), counting the time since the last step idle."""
        self._idle_until(self._clock() if now is None else now)
        p = self.profile
        power_frac = (self._power.value - p.power_idle_w) / (p.power_max_w - p.power_idle_w)
        if self._busy.value < 0.02:
            clock_mhz = p.sm_clock_idle_mhz
        else:  # boost clock, throttled a little near the power limit
            clock_mhz = round(p.sm_clock_max_mhz - 225 * max(0.0, power_frac - 0.85) / 0.15)
        return GpuSnapshot(
            util=self._busy.value,
            sm_active=self._sm.value,
            sm_occupancy=self._sm.value * 0.31,
            tensor_active=self._tensor.value,
            dram_active=self._dram.value,
            gr_engine_active=min(1.0, self._busy.value * 0.99),
            power_w=self._power.value,
            energy_mj=int(self._energy_mj),
            temp_c=p.temp_idle_c + (p.temp_max_c - p.temp_idle_c) * self._heat.value,
            sm_clock_mhz=int(clock_mhz),
        )


_Field = tuple[str, str, str, str, Callable[[GpuSnapshot, Profile], float]]


def _fb_used(p: Profile) -> int:
    return round(p.gpu_memory_mib * p.gpu_memory_utilization) + p.cuda_context_mib


# (name, type, HELP, format, value): HELP/TYPE as in dcgm-exporter's default-counters.csv.
_FIELDS: tuple[_Field, ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "%d",
     lambda s, p: s.sm_clock_mhz),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "%d",
     lambda s, p: p.mem_clock_mhz),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "%d",
     lambda s, p: s.temp_c - 6),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "%d", lambda s, p: s.temp_c),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "%f", lambda s, p: s.power_w),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ).", "%d", lambda s, p: s.energy_mj),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "%d",
     lambda s, p: 0),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "%d",
     lambda s, p: round(100 * s.util)),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "%d",
     lambda s, p: round(70 * s.dram_active)),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", "%d", lambda s, p: 0),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", "%d", lambda s, p: 0),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "%d",
     lambda s, p: 0),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "%d",
     lambda s, p: p.gpu_memory_mib - _fb_used(p) - p.fb_reserved_mib),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "%d",
     lambda s, p: _fb_used(p)),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", "%d",
     lambda s, p: p.fb_reserved_mib),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
     "Total number of NVLink bandwidth counters for all lanes.", "%d", lambda s, p: 0),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", "%d", lambda s, p: 0),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors", "%d", lambda s, p: 0),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors", "%d", lambda s, p: 0),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", "%d",
     lambda s, p: 0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
     "%f", lambda s, p: s.gr_engine_active),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge",
     "The ratio of cycles an SM has at least 1 warp assigned.", "%f", lambda s, p: s.sm_active),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.",
     "%f", lambda s, p: s.sm_occupancy),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
     "Ratio of cycles the tensor (HMMA) pipe is active.", "%f", lambda s, p: s.tensor_active),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data.", "%f",
     lambda s, p: s.dram_active),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
     "The rate of data transmitted over the PCIe bus - including both protocol headers and "
     "data payloads - in bytes per second.", "%d", lambda s, p: 120_000 + 1.6e6 * s.util),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
     "The rate of data received over the PCIe bus - including both protocol headers and data "
     "payloads - in bytes per second.", "%d", lambda s, p: 240_000 + 3.2e6 * s.util),
)


def render_dcgm(gpu: GpuActivity, *, now: float | None = None, namespace: str = "vigil-sim",
                container: str = "vllm") -> str:
    """The exposition dcgm-exporter would serve for ``gpu``'s GPUs."""
    snap = gpu.snapshot(now)
    p = gpu.profile
    label_sets = []
    for i, gpu_uuid in enumerate(gpu.uuids):
        bus = _PCI_BUSES[i % len(_PCI_BUSES)]
        label_sets.append(
            f'gpu="{i}",UUID="GPU-{gpu_uuid}",pci_bus_id="00000000:{bus:02X}:00.0",'
            f'device="nvidia{i}",modelName="{p.gpu_model_name}",'
            f'Hostname="{gpu.replica}-node",DCGM_FI_DRIVER_VERSION="{p.driver_version}",'
            f'container="{container}",namespace="{namespace}",pod="{gpu.replica}"')
    lines: list[str] = []
    for name, kind, doc, fmt, value in _FIELDS:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        v = value(snap, p)
        text = fmt % (round(v) if fmt == "%d" else v)
        lines.extend(f"{name}{{{labels}}} {text}" for labels in label_sets)
    return "\n".join(lines) + "\n"
