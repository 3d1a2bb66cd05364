"""A simulated fleet on free ports, for tests: ``with running_fleet(2) as fleet: ...``.

By default the fleet runs in a background thread with its own event loop, in the test's
process, so a test can reach into the replicas (``fleet.replicas[0].engine``) and restart them
(``fleet.restart(0)``). With ``subprocess=True`` it runs ``vigil sim`` in a child
process instead (closer to production, and its CPU use can be measured separately); then only
the URLs are available.

It stays in the package rather than in ``tests/support``: the benchmarks (``bench/``) run
simulated fleets with it too, and they import the packages, not the test suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess as sp
import sys
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from serving.sim.replica import SimReplica
from serving.sim.server import Fleet, FleetSpec, build_replicas
from slo.planning.replica.profiles import Profile
from vigil.conventions import SIM_DCGM_PATH

__all__ = [
    "PER_REQUEST_HISTOGRAMS",
    "PORTS_ENV",
    "FleetHandle",
    "free_port_block",
    "invariant_violations",
    "running_fleet",
    "sample_values",
    "total",
]

_T = TypeVar("_T")
_REPO_ROOT = Path(__file__).resolve().parents[2]


#: ``VIGIL_TEST_PORTS=low-high``: the ports ``free_port_block`` may hand out (inclusive).
#: Vigil's test suite gives each parallel worker a range of its own below the kernel's
#: ephemeral range (32768-60999 by default), so that neither another worker nor the local end
#: of any outgoing connection can take a port between the check and the server's bind. Unset,
#: the kernel picks the block (bind to port 0).
PORTS_ENV = "VIGIL_TEST_PORTS"

_cursor: dict[str, int] = {}  # range -> the next port to try in it
_cursor_lock = threading.Lock()


def _bindable(ports: range, host: str) -> bool:
    socks: list[socket.socket] = []
    try:
        for p in ports:
            s = socket.socket()
            socks.append(s)
            s.bind((host, p))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def _block_in_range(n: int, host: str, span: str) -> int:
    """A block of ``n`` free ports in ``span`` (``low-high``), handed out in turn so that a
    port is not given again before the rest of the range has been."""
    try:
        low, high = (int(x) for x in span.split("-"))
    except ValueError:
        raise ValueError(f"{PORTS_ENV}={span!r}: expected low-high, e.g. 20000-21999"
                         ) from None
    if not 0 < low <= high - n + 1 <= 65535 - n + 1:
        raise ValueError(f"{PORTS_ENV}={span!r} has no block of {n} ports")
    size = high - low + 1
    with _cursor_lock:
        # Start at a pid-dependent place: a run right after another does not meet the
        # earlier run's ports still in TIME_WAIT.
        at = _cursor.get(span, low + os.getpid() % size)
        for _ in range(size):
            base = at if at + n - 1 <= high else low
            at = base + n if base + n <= high else low
            if _bindable(range(base, base + n), host):
                _cursor[span] = at
                return base
    raise RuntimeError(f"no block of {n} free ports in {PORTS_ENV}={span}")


def free_port_block(n: int, host: str = "127.0.0.1") -> int:
    """A port ``p`` such that ``p .. p+n-1`` are free right now (from ``VIGIL_TEST_PORTS``
    when it is set)."""
    span = os.environ.get(PORTS_ENV)
    if span:
        return _block_in_range(n, host, span)
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind((host, 0))
            base = probe.getsockname()[1]
        if base + n > 65535:
            continue
        if _bindable(range(base, base + n), host):
            return base
    raise RuntimeError(f"no block of {n} free ports found")


@dataclass
class FleetHandle:
    """A running test fleet. URLs are per replica, in port order."""

    host: str
    ports: list[int]
    names: list[str]
    #: The replica objects (in-thread fleets only).
    replicas: list[SimReplica] = field(default_factory=list)
    loop: asyncio.AbstractEventLoop | None = None
    process: sp.Popen[str] | None = None

    @property
    def base_urls(self) -> list[str]:
        return [f"http://{self.host}:{p}" for p in self.ports]

    @property
    def api_urls(self) -> list[str]:
        """OpenAI base URLs (``.../v1``)."""
        return [f"{u}/v1" for u in self.base_urls]

    @property
    def metrics_urls(self) -> list[str]:
        return [f"{u}/metrics" for u in self.base_urls]

    @property
    def dcgm_urls(self) -> list[str]:
        return [f"{u}{SIM_DCGM_PATH}" for u in self.base_urls]

    def call(self, coro: Coroutine[Any, Any, _T], timeout: float = 10.0) -> _T:
        """Run ``coro`` on the fleet's event loop and return its result (in-thread fleets)."""
        if self.loop is None:
            coro.close()
            raise RuntimeError("only an in-thread fleet can run code in its event loop")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def restart(self, index: int) -> None:
        """``SimReplica.restart()`` of replica ``index``: counters start from zero again."""
        if not self.replicas:
            raise RuntimeError("restart needs an in-thread fleet")
        self.call(self.replicas[index].restart())


@contextlib.contextmanager
def running_fleet(replicas: int = 1, *, subprocess: bool = False,
                  profile: str | Profile = "small",
                  startup_timeout: float = 20.0, **spec: Any) -> Iterator[FleetHandle]:
    """Start ``replicas`` simulated replicas on free consecutive ports; stop them on exit.

    ``spec`` takes the other ``FleetSpec`` fields (``spec_decode=3``, ``enable_lora=True``,
    ``scheduling_policy="priority"``, ...). ``profile`` may be a ``Profile`` object for a
    custom calibration (in-thread fleets only).
    """
    host = spec.pop("host", "127.0.0.1")
    port = spec.pop("port", None) or free_port_block(replicas, host)
    fleet_spec = FleetSpec(replicas=replicas, port=port, host=host, profile=profile, **spec)
    if subprocess:
        with _subprocess_fleet(fleet_spec, startup_timeout) as handle:
            yield handle
    else:
        with _thread_fleet(fleet_spec, startup_timeout) as handle:
            yield handle


@contextlib.contextmanager
def _thread_fleet(spec: FleetSpec, startup_timeout: float) -> Iterator[FleetHandle]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        fleet = Fleet(build_replicas(spec))
        state["fleet"] = fleet
        state["stop"] = stop = asyncio.Event()
        try:
            await fleet.start()
        except BaseException as exc:
            state["error"] = exc
            ready.set()
            return
        ready.set()
        await stop.wait()
        await fleet.stop()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),),
                              name="sim-fleet", daemon=True)
    thread.start()
    try:
        if not ready.wait(startup_timeout):
            raise RuntimeError("the simulated fleet did not start in time")
        if "error" in state:
            raise state["error"]
        fleet: Fleet = state["fleet"]
        yield FleetHandle(host=spec.host, ports=[r.config.port for r in fleet.replicas],
                          names=[r.name for r in fleet.replicas], replicas=fleet.replicas,
                          loop=loop)
    finally:
        if "stop" in state and thread.is_alive():
            loop.call_soon_threadsafe(state["stop"].set)
        thread.join(15)
        if not thread.is_alive():
            loop.close()


@contextlib.contextmanager
def _subprocess_fleet(spec: FleetSpec, startup_timeout: float) -> Iterator[FleetHandle]:
    if not isinstance(spec.profile, str):
        raise ValueError("a subprocess fleet needs a profile name, not a Profile object")
    # The `vigil sim` command, run as a child process.
    args = [sys.executable, "-m", "vigil_shell.cli", "sim", "--replicas", str(spec.replicas),
            "--port", str(spec.port), "--host", spec.host, "--model", spec.model,
            "--profile", spec.profile, "--scheduling-policy", spec.scheduling_policy,
            "--seed", str(spec.seed), "--spec-decode", str(spec.spec_decode),
            "--spec-acceptance", str(spec.spec_acceptance),
            "--gpus-per-replica", str(spec.gpus_per_replica)]
    if spec.gpu:
        args += ["--gpu", spec.gpu]
    if spec.enable_lora:
        args += ["--enable-lora", "--max-loras", str(spec.max_loras),
                 "--lora-modules", *spec.lora_modules]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(_REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = sp.Popen(args, cwd=_REPO_ROOT, env=env, stdout=sp.PIPE, stderr=sp.PIPE, text=True)
    try:
        names = _read_startup_lines(proc, spec.replicas, startup_timeout)
        yield FleetHandle(host=spec.host,
                          ports=[spec.port + i for i in range(spec.replicas)],
                          names=names, process=proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except sp.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _read_startup_lines(proc: sp.Popen[str], n: int, timeout: float) -> list[str]:
    """The replica names from the fleet's ``<name>: api=...`` lines."""
    names: list[str] = []
    lines: list[str] = []
    done = threading.Event()

    def reader() -> None:
        for line in proc.stdout or ():
            lines.append(line)
            if len(lines) >= n:
                break
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    if not done.wait(timeout) or len(lines) < n:
        proc.kill()
        err = proc.stderr.read() if proc.stderr else ""
        raise RuntimeError(f"simulated fleet did not start: {err.strip()[-2000:]}")
    for line in lines:
        names.append(line.split(":", 1)[0])
    return names


# --- reading what the simulator exposes -----------------------------------------------------

#: The per-request histograms: each ``_count`` equals the sum of ``request_success``.
PER_REQUEST_HISTOGRAMS = (
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds", "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens", "vllm:request_time_per_output_token_seconds",
    "vllm:request_params_n", "vllm:request_params_max_tokens",
    "vllm:request_max_num_generation_tokens", "vllm:request_num_preemptions",
    "vllm:request_prefill_kv_computed_tokens",
)


def sample_values(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a text exposition: ``(name, labels) -> value``."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def invariant_violations(text: str, *, at_rest: bool = False) -> list[str]:
    """The fixture README's invariants that a vLLM ``/metrics`` text breaks (empty: none).

    ``at_rest``: no request in flight, so the TTFT and preemption counts must match the
    finished requests exactly. Requests aborted by a disconnect are not expected (they keep
    their TTFT and preemptions but never finish, as in vLLM).
    """
    s = sample_values(text)
    out: list[str] = []

    def eq(what: str, a: float, b: float) -> None:
        if abs(a - b) > 1e-6 * max(1.0, abs(a), abs(b)):
            out.append(f"{what}: {a} != {b}")

    success = total(s, "vllm:request_success_total")
    for h in PER_REQUEST_HISTOGRAMS:
        eq(f"{h}_count = sum(request_success)", total(s, f"{h}_count"), success)
    ttft = total(s, "vllm:time_to_first_token_seconds_count")
    in_flight = total(s, "vllm:num_requests_running") + total(s, "vllm:num_requests_waiting")
    if at_rest:
        eq("ttft_count = finished (at rest)", ttft, success)
        eq("num_preemptions = request_num_preemptions_sum (at rest)",
           total(s, "vllm:num_preemptions_total"), total(s, "vllm:request_num_preemptions_sum"))
        eq("running + waiting = 0 (at rest)", in_flight, 0)
        eq("kv_cache_usage_perc = 0 (at rest)", total(s, "vllm:kv_cache_usage_perc"), 0)
    elif not success <= ttft <= success + in_flight:
        out.append(f"ttft_count {ttft} not in [finished {success}, +in flight {in_flight}]")
    if total(s, "vllm:num_preemptions_total") < total(s, "vllm:request_num_preemptions_sum"):
        out.append("num_preemptions_total < request_num_preemptions_sum")
    local_compute = total(s, "vllm:prompt_tokens_by_source_total", source="local_compute")
    cache_hit = total(s, "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
    generation = total(s, "vllm:generation_tokens_total")
    eq("iteration_tokens_total_sum = local_compute + generation",
       total(s, "vllm:iteration_tokens_total_sum"), local_compute + generation)
    eq("prompt_tokens = sum(by_source)", total(s, "vllm:prompt_tokens_total"),
       total(s, "vllm:prompt_tokens_by_source_total"))
    eq("prompt_tokens_cached = local_cache_hit", total(s, "vllm:prompt_tokens_cached_total"),
       cache_hit)
    eq("cached_by_source{device} = prefix_cache_hits",
       total(s, "vllm:prompt_tokens_cached_by_source_total", source="device"),
       total(s, "vllm:prefix_cache_hits_total"))
    accepted = total(s, "vllm:spec_decode_num_accepted_tokens_total")
    eq("generation = itl_count + ttft_count + accepted", generation,
       total(s, "vllm:inter_token_latency_seconds_count") + ttft + accepted)
    eq("accepted = sum(accepted_per_pos)", accepted,
       total(s, "vllm:spec_decode_num_accepted_tokens_per_pos_total"))
    eq("waiting = sum(waiting_by_reason)", total(s, "vllm:num_requests_waiting"),
       total(s, "vllm:num_requests_waiting_by_reason"))
    eq("http highr count = sum(http_requests_total)",
       total(s, "http_request_duration_highr_seconds_count"), total(s, "http_requests_total"))
    if total(s, "vllm:prefix_cache_hits_total") > total(s, "vllm:prefix_cache_queries_total"):
        out.append("prefix_cache_hits > prefix_cache_queries")
    return out
