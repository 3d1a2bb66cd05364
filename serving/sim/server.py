"""A simulated fleet: N replicas on ports ``port .. port+N-1`` in one process and one event loop.

Each replica is its own ``uvicorn.Server`` (uvicorn's own signal handling off) with its own
engine, registry and GPU model. ``run_fleet`` blocks until SIGTERM/SIGINT, then stops every
replica cleanly; ``Fleet`` is the same thing as an object, for embedding (see ``testing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import uvicorn

from serving.sim.replica import ReplicaConfig, SimReplica
from slo.planning.replica.engine import EngineConfig, SpecDecodeConfig
from slo.planning.replica.profiles import DEFAULT_MODEL, Profile, get_profile
from slo.planning.replica.queues import SchedulingPolicy
from vigil.conventions import VLLM_BUCKET_FAMILY_REQUEST_LATENCY, VLLM_BUCKET_FAMILY_TTFT
from vigil.errors import ConfigError

#: The bucket families ``--custom-histogram-buckets`` may set in the simulator (vLLM has more,
#: for histograms the simulator does not keep).
CUSTOM_BUCKET_FAMILIES = (VLLM_BUCKET_FAMILY_TTFT, VLLM_BUCKET_FAMILY_REQUEST_LATENCY)

__all__ = ["Fleet", "FleetSpec", "build_replicas", "model_short_name", "run_fleet"]


@dataclass(frozen=True)
class FleetSpec:
    """Everything ``vigil sim`` can set. Ports are ``port .. port + replicas - 1``."""

    replicas: int = 2
    port: int = 8100
    host: str = "127.0.0.1"
    model: str = DEFAULT_MODEL
    gpu: str | None = None
    #: A profile name (``--profile``) or a ``Profile`` (tests with custom calibration).
    profile: str | Profile = "small"
    #: Draft tokens per step with speculative decoding (0: off).
    spec_decode: int = 0
    #: P(draft accepted | earlier drafts accepted), ratio 0-1.
    spec_acceptance: float = 0.7
    enable_lora: bool = False
    max_loras: int = 1  # vLLM's --max-loras default
    lora_modules: tuple[str, ...] = ()
    scheduling_policy: SchedulingPolicy = "fcfs"
    seed: int = 0
    gpus_per_replica: int = 1
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    #: vLLM's ``--max-model-len``: overrides the profile's context length (None: the profile's).
    max_model_len: int | None = None
    #: vLLM's ``--custom-histogram-buckets`` (JSON object: bucket family -> bounds), checked as
    #: vLLM checks it at start-up.
    custom_histogram_buckets: str | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError("need at least one replica", key="sim.replicas")
        if not 0 <= self.port <= 65535 - self.replicas + 1:
            raise ConfigError(f"port {self.port} out of range", key="sim.port")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ConfigError(f"unknown scheduling policy {self.scheduling_policy!r}",
                              key="sim.scheduling_policy")
        if self.spec_decode < 0 or not 0 <= self.spec_acceptance <= 1:
            raise ConfigError("spec_decode must be >= 0 and spec_acceptance in [0, 1]",
                              key="sim.spec_decode")
        if self.gpus_per_replica < 1:
            raise ConfigError("gpus_per_replica must be >= 1", key="sim.gpus_per_replica")


def _println(line: str) -> None:
    print(line, flush=True)  # flushed: a parent process may be waiting for these lines


def model_short_name(model: str) -> str:
    """``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b-instruct``."""
    return model.rstrip("/").rsplit("/", 1)[-1].lower()


def build_replicas(spec: FleetSpec) -> list[SimReplica]:
    """The replicas of ``spec``, named ``<model-short>-<i>``, not started yet."""
    if isinstance(spec.profile, Profile):
        profile = spec.profile.with_gpu(spec.gpu) if spec.gpu else spec.profile
    else:
        profile = get_profile(spec.profile, gpu=spec.gpu)
    if spec.max_model_len is not None:
        profile = dataclasses.replace(profile, max_model_len=spec.max_model_len)
    buckets = parse_custom_buckets(spec.custom_histogram_buckets)
    engine = EngineConfig(
        profile=profile,
        scheduling_policy=spec.scheduling_policy,
        spec_decode=(SpecDecodeConfig(num_speculative_tokens=spec.spec_decode,
                                      acceptance=spec.spec_acceptance)
                     if spec.spec_decode else None),
        enable_lora=spec.enable_lora,
        max_loras=spec.max_loras,
        seed=spec.seed,
    )
    short = model_short_name(spec.model)
    return [SimReplica(ReplicaConfig(
        name=f"{short}-{i}", served_model=spec.model, engine=engine, host=spec.host,
        port=spec.port + i, gpus=spec.gpus_per_replica, lora_modules=spec.lora_modules,
        max_num_queued_reqs=spec.max_num_queued_reqs,
        max_num_queued_tokens=spec.max_num_queued_tokens,
        custom_histogram_buckets=buckets)) for i in range(spec.replicas)]


def parse_custom_buckets(text: str | None) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """``--custom-histogram-buckets`` as vLLM reads it: a JSON object from a bucket family
    (``time_to_first_token``, ``request_latency``) to bounds that are positive, finite and
    strictly increasing; anything else is refused at start (``ConfigError``)."""
    if not text:
        return ()
    where = "--custom-histogram-buckets"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"not JSON: {e}", key=where) from None
    if not isinstance(value, dict):
        raise ConfigError("must be a JSON object of bucket family -> bounds", key=where)
    out = []
    for family, bounds in value.items():
        if family not in CUSTOM_BUCKET_FAMILIES:
            raise ConfigError(f"unknown bucket family {family!r} (the simulator knows "
                              f"{', '.join(CUSTOM_BUCKET_FAMILIES)})", key=where)
        if (not isinstance(bounds, list) or not bounds
                or not all(isinstance(b, int | float) and not isinstance(b, bool)
                           and math.isfinite(b) and b > 0 for b in bounds)
                or any(b >= c for b, c in itertools.pairwise(bounds))):
            raise ConfigError(f"{family}: bounds must be positive, finite and strictly "
                              f"increasing, not {bounds!r}", key=where)
        out.append((family, tuple(float(b) for b in bounds)))
    return tuple(out)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the fleet."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}",
                          key="sim.port") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class Fleet:
    """Replicas served by uvicorn in the current event loop."""

    def __init__(self, replicas: Sequence[SimReplica], *, log_level: str = "warning") -> None:
        self.replicas = list(replicas)
        self._log_level = log_level
        self._servers: list[_Server] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Bind every port (all or nothing), start engines and servers, wait until serving."""
        socks: list[socket.socket] = []
        try:
            for r in self.replicas:
                socks.append(_bind(r.config.host, r.config.port))
        except ConfigError:
            for s in socks:
                s.close()
            raise
        for r, sock in zip(self.replicas, socks, strict=True):
            r.start()
            config = uvicorn.Config(r.app, host=r.config.host, port=r.config.port,
                                    log_level=self._log_level, access_log=False,
                                    lifespan="off", ws="none", timeout_graceful_shutdown=2)
            server = _Server(config)
            self._servers.append(server)
            self._tasks.append(asyncio.create_task(server.serve(sockets=[sock]),
                                                   name=f"uvicorn-{r.name}"))
        while not all(s.started for s in self._servers):
            for t in self._tasks:
                if t.done():  # startup failed: surface the error
                    await t
            await asyncio.sleep(0.01)

    def request_exit(self) -> None:
        """Ask every server to stop (signal-handler safe)."""
        for s in self._servers:
            s.should_exit = True

    async def wait(self) -> None:
        """Until every server has stopped."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Stop engines first (streams end at once), then the servers."""
        for r in self.replicas:
            await r.stop()
        self.request_exit()
        await self.wait()

    def describe(self) -> list[str]:
        """One line per replica: API base URL, metrics URL, DCGM URL."""
        return [f"{r.name}: api={r.api_url} metrics={r.metrics_url} dcgm={r.dcgm_url}"
                for r in self.replicas]


async def serve_fleet(spec: FleetSpec, *, print_fn: Callable[[str], None] = _println,
                      log_level: str = "warning") -> None:
    """Serve ``spec`` until SIGTERM or SIGINT."""
    fleet = Fleet(build_replicas(spec), log_level=log_level)
    await fleet.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for line in fleet.describe():
        print_fn(line)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await fleet.stop()


def run_fleet(replicas: int, port: int, *, model: str = DEFAULT_MODEL, gpu: str | None = None,
              profile: str | Profile = "small", host: str = "127.0.0.1", spec_decode: int = 0,
              spec_acceptance: float = 0.7, enable_lora: bool = False, max_loras: int = 1,
              lora_modules: Sequence[str] = (), scheduling_policy: SchedulingPolicy = "fcfs",
              seed: int = 0, gpus_per_replica: int = 1, max_num_queued_reqs: int | None = None,
              max_num_queued_tokens: int | None = None,
              print_fn: Callable[[str], None] = _println, log_level: str = "warning") -> None:
    """Run ``replicas`` simulated vLLM servers on ``port ..`` until SIGTERM/SIGINT (blocking)."""
    spec = FleetSpec(replicas=replicas, port=port, host=host, model=model, gpu=gpu,
                     profile=profile, spec_decode=spec_decode, spec_acceptance=spec_acceptance,
                     enable_lora=enable_lora, max_loras=max_loras,
                     lora_modules=tuple(lora_modules), scheduling_policy=scheduling_policy,
                     seed=seed, gpus_per_replica=gpus_per_replica,
                     max_num_queued_reqs=max_num_queued_reqs,
                     max_num_queued_tokens=max_num_queued_tokens)
    asyncio.run(serve_fleet(spec, print_fn=print_fn, log_level=log_level))
