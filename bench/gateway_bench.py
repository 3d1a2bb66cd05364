"""Gateway overhead: latency the gateway adds to streaming requests, and requests/s.

Run: ``.venv/bin/python bench/gateway_bench.py [--streams 1,50,200] [--seconds 15]
[--baseline DIR] [--legs direct,before,after] [--rounds 2] [--arrivals spread|lockstep]``, or
``--compare-clients N`` for the CPU cost of the HTTP clients the gateway could use upstream.

Separate processes on loopback: a fast upstream, one ``vigil gateway`` per gateway leg in front
of it, and this script's load generator, which keeps N streams busy (each sends a streaming chat
request, reads it to its end, sends the next) first straight to the upstream, then through each
gateway, and compares. Added latency = gateway quantile - direct quantile, for the time to the
first body bytes (TTFT) and to the end of the stream (e2e). Targets: p50 < 1 ms,
p99 < 5 ms.

Legs: ``direct`` (the upstream itself), ``after`` (this tree's gateway), ``before`` (the gateway
of the source tree ``--baseline DIR``, e.g. ``git archive <commit> | tar -x -C DIR``, run as it
ran there: uvloop and httptools hidden, which uvicorn would otherwise pick up by itself),
``before-fast`` (the same with them), ``after-plain`` (this tree without uvloop and httptools:
what the gateway costs without the optional speed-ups), ``after-otel`` (this tree with
``[gateway.otel]`` on, exporting every span and, each second, the metrics to a real collector,
rotel, that drops them) and ``after-otel-dead`` (the same with the collector's port closed: what
an unreachable collector costs the request path). All gateways start at once; an idle one
only polls the upstream every 2 s.

Which upstream and why: neither the simulator nor a uvicorn/starlette app, but a raw asyncio
HTTP/1.1 server streaming a fixed completion on a fixed schedule (first chunk after ``--ttft``,
then ``--tokens`` chunks ``--interval`` apart, the usage chunk, ``[DONE]``), with every byte
prepared in advance and each write a timer callback (no coroutine per chunk). The simulator's
step scheduling moves each request's timing by milliseconds, which would drown a
sub-millisecond difference; a starlette app costs as much CPU per chunk as the gateway itself,
and on a 2-core machine that CPU is taken from the gateway being measured. The load generator is
as lean for the same reason: an asyncio protocol per stream (one keep-alive connection each),
prepared request bytes, and no parsing beyond finding the end of the body. Both run on uvloop
when it is installed. The SSE chunks have vLLM's shape, so the gateway does all of its usual
work on them. Each leg reports the CPU each process spent per request (all requests of the leg,
warm-up included), so a reader can see who took the machine, and the machine's CPU pressure
(the share of the leg's time in which some task waited for a CPU, Linux PSI): on a shared
machine, a leg with high pressure measured the neighbours as much as the gateway. Prints
Markdown.

Arrivals (``--arrivals``): ``spread`` (default) starts the streams evenly over one request's
duration, so their events arrive spread over time, as independent clients' do; ``lockstep``
starts them all at once, so each chunk interval brings a burst of one event per stream, the way
one vLLM replica emits one token for every running sequence at each decode step. A gateway
relays a burst one event after another: the last of N waits for the N-1 before it, so in
lockstep the added latency grows with N times the gateway's CPU per event.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.processes import (  # noqa: E402
    cpu_pressure_us,
    cpu_seconds,
    free_port,
    own_cpu_seconds,
    stop,
    wait_http,
)

MODEL = "bench-model"
KEY = "sk-bench"
#: Optional C speed-ups of the gateway's server side (uvicorn's ``loop`` and ``http``).
SPEEDUPS = ("uvloop", "httptools")


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when installed (the leanest load generator and upstream), else
    asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: what ``new_loop`` makes."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run_async(main: object) -> object:
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main)  # type: ignore[arg-type]


# --- the upstream ----------------------------------------------------------------------------

def _chunk(delta: dict | None, finish: str | None = None, usage: dict | None = None) -> bytes:
    body: dict = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
                  "model": MODEL, "choices": [] if delta is None else [
                      {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    data = b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"  # one HTTP/1.1 chunk


class _Upstream(asyncio.Protocol):
    """One connection to the bench upstream: requests in, timed chunks out."""

    def __init__(self, schedule: tuple[bytes, list[bytes], bytes, bytes], metrics: bytes,
                 interval: float, ttft: float) -> None:
        self.head, self.words, self.usage, self.done = schedule
        self.metrics = metrics
        self.interval = interval
        self.ttft = ttft
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            self.answer(head.split(b" ", 2)[1].split(b"?")[0], body)

    def answer(self, path: bytes, body: bytes) -> None:
        t = self.transport
        assert t is not None
        if path == b"/health":
            t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        elif path == b"/metrics":
            t.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                    + f"content-length: {len(self.metrics)}\r\n\r\n".encode() + self.metrics)
        else:
            t.write(self.head)
            # Each chunk at its own time from the request's arrival: a late timer does not
            # push the chunks after it.
            start = self.loop.time() + self.ttft
            self.timer = self.loop.call_at(start, self.step, 0, start,
                                           b'"include_usage":true' in body)

    def step(self, i: int, start: float, usage: bool) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if i < len(self.words):
            t.write(self.words[i])
            self.timer = self.loop.call_at(start + (i + 1) * self.interval, self.step, i + 1,
                                           start, usage)
            return
        self.timer = None
        t.write((self.usage if usage else b"") + self.done)


async def serve_upstream(port: int, tokens: int, interval: float, ttft: float) -> None:
    """A vLLM-shaped streaming endpoint with a fixed schedule, plus /health and /metrics."""
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    first = _chunk({"role": "assistant", "content": ""}) + _chunk({"content": " word0"})
    words = [first] + [_chunk({"content": f" word{i}"}, "length" if i == tokens - 1 else None)
                       for i in range(1, tokens)]
    usage = _chunk(None, usage={"prompt_tokens": 12, "completion_tokens": tokens,
                                "total_tokens": 12 + tokens})
    done = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"  # [DONE] (14 bytes), then the last chunk
    metrics = (f'vllm:kv_cache_usage_perc{{model_name="{MODEL}"}} 0.1\n'
               f'vllm:num_requests_waiting{{model_name="{MODEL}"}} 0\n'
               f'vllm:num_requests_running{{model_name="{MODEL}"}} 1\n').encode()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Upstream((head, words, usage, done), metrics, interval, ttft),
        "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


# --- processes ---------------------------------------------------------------------------------

@contextlib.contextmanager
def process(args: list[str], health: str, cwd: Path, log: Path, pythonpath: Path = ROOT
            ) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` until the block ends; up once ``health`` answers 200. stderr goes to
    ``log`` (a pipe nobody reads could fill up and stall the process); stdout is a pipe for
    the start line."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    with log.open("wb") as err:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err)
    try:
        wait_http(health, proc, log)
        yield proc
    finally:
        stop(proc)
        if proc.stdout is not None:
            proc.stdout.close()


#: ``python -c`` program: hide the modules named in argv[1] (comma-separated), then run
#: ``vigil`` with the rest of argv.
_LAUNCH = ("import sys\n"
           "for m in filter(None, sys.argv[1].split(',')): sys.modules[m] = None\n"
           "from vigil_shell.cli import main\n"
           "sys.exit(main(sys.argv[2:]))\n")


def gateway_config(tmp: Path, name: str, upstream: str, port: int, otel: str = "") -> Path:
    """The leg's config; ``otel``: the [gateway.otel] endpoint ("" = off)."""
    path = tmp / f"vigil-{name}.toml"
    otel_table = (f'\n[gateway.otel]\nenabled = true\nendpoint = "{otel}"\n'
                  'export_interval = "1s"\n' if otel else "")
    path.write_text(f"""
[[pools]]
name = "bench"
model = "{MODEL}"

[[targets]]
name = "bench-0"
url = "{upstream}/metrics"
pool = "bench"

[gateway]
listen = "127.0.0.1:{port}"
records_path = "{tmp / f'records-{name}.db'}"

[[gateway.api_keys]]
sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"
tenant = "bench"
tier = "premium"
{otel_table}""")
    return path


#: The legs that run this tree with [gateway.otel] on.
OTEL_LEGS = ("after-otel", "after-otel-dead")


@contextlib.contextmanager
def rotel_blackhole(tmp: Path) -> Iterator[str]:
    """A rotel collector (the ``rotel`` wheel, a dev dependency) on loopback that accepts
    OTLP/HTTP and drops it; yields its base URL."""
    import rotel

    agent = Path(rotel.__file__).parent / "rotel-agent"
    http_port, grpc_port = free_port(), free_port()
    with (tmp / "rotel.log").open("wb") as out:
        proc = subprocess.Popen(
            [str(agent), "start", "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
             "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}", "--exporter", "blackhole",
             "--pid-file", str(tmp / "rotel.pid"), "--log-file", str(tmp / "rotel-agent.log")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", http_port), timeout=0.2):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"rotel did not start: {(tmp / 'rotel.log').read_text()}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{http_port}"
    finally:
        proc.terminate()
        proc.wait(10)


# --- the load ----------------------------------------------------------------------------------

@dataclass
class Run:
    leg: str
    streams: int
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    #: Requests completed in the whole leg (warm-up included), and each process's CPU seconds
    #: over it: the load generator, the upstream, the gateway (0 for direct).
    completed: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    #: Wall seconds of the whole leg, and of them the seconds in which some task on the
    #: machine waited for a CPU (PSI; None when unknown): how contended the machine was.
    wall: float = 0.0
    stalled: float | None = None

    @property
    def rps(self) -> float:
        return len(self.e2e) / self.seconds if self.seconds else 0.0

    def merge(self, other: Run) -> None:
        self.ttft += other.ttft
        self.e2e += other.e2e
        self.errors += other.errors
        self.seconds += other.seconds
        self.completed += other.completed
        self.wall += other.wall
        self.stalled = (None if self.stalled is None or other.stalled is None
                        else self.stalled + other.stalled)
        for k, v in other.cpu.items():
            self.cpu[k] = self.cpu.get(k, 0.0) + v


def quantile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


class _Stream(asyncio.Protocol):
    """One load-generator stream: a keep-alive connection sending the next request as soon as
    the previous answer ended (chunked: ``0\\r\\n\\r\\n``; else its content-length)."""

    END = b"\r\n0\r\n\r\n"

    def __init__(self, run: Run, request: bytes, measure_from: float, stop: float,
                 finished: asyncio.Future[None], first_at: float) -> None:
        self.run, self.request = run, request
        self.measure_from, self.stop = measure_from, stop
        self.finished = finished
        self.first_at = first_at
        self.transport: asyncio.Transport | None = None
        self.t0 = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time() + max(0.0, self.first_at - time.perf_counter()), self.send)

    def send(self) -> None:
        assert self.transport is not None
        self.t0 = time.perf_counter()
        if self.t0 >= self.stop:
            self.transport.close()
            return
        self.head = b""
        self.head_done = False
        self.ok = False
        self.first: float | None = None
        self.tail = b""
        self.remaining: int | None = None  # body bytes left when it has a content-length
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.t0 < self.stop:
            self.run.errors += 1  # closed in the middle of an answer
        if not self.finished.done():
            self.finished.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.head_done:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end], self.head[end + 4:]
            self.head_done = True
            self.ok = head.startswith(b"HTTP/1.1 200")
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    self.remaining = int(line[15:])
            if not data and self.remaining != 0:
                return
        if self.first is None:
            self.first = now
        if self.remaining is not None:
            self.remaining -= len(data)
            if self.remaining > 0:
                return
        else:
            self.tail = (self.tail + data)[-len(self.END):]
            if self.tail != self.END:
                return
        self.answered(now)

    def answered(self, end: float) -> None:
        run = self.run
        run.completed += 1
        if self.t0 >= self.measure_from and end <= self.stop:
            if self.ok:
                assert self.first is not None
                run.ttft.append(self.first - self.t0)
                run.e2e.append(end - self.t0)
            else:
                run.errors += 1
        self.send()


async def load(base: str, streams: int, seconds: float, warmup: float, leg: str,
               stagger: float = 0.0, key: str = KEY) -> Run:
    """Keep ``streams`` streaming requests going for ``warmup + seconds``; measure the last
    ``seconds``: time to the first body bytes and to the end of the body. Stream ``i`` sends
    its first request ``i * stagger / streams`` seconds after the start (0: all at once)."""
    run = Run(leg=leg, streams=streams, seconds=seconds)
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 64,
                       "messages": [{"role": "user", "content": "benchmark"}]}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
               f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\n\r\n").encode() + body
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    measure_from = start + warmup
    stop = measure_from + seconds
    finished = [loop.create_future() for _ in range(streams)]
    for i, f in enumerate(finished):
        first_at = start + i * stagger / streams
        try:
            await loop.create_connection(
                lambda f=f, first_at=first_at: _Stream(run, request, measure_from, stop, f,
                                                       first_at), host, int(port))
        except OSError:
            run.errors += 1
            f.set_result(None)
    await asyncio.gather(*finished)
    return run


def ms(x: float) -> str:
    return f"{x * 1000:.2f}"


# --- the HTTP clients, compared -------------------------------------------------------------------

async def client_cost(base: str, name: str, requests: int, concurrency: int) -> float:
    """CPU seconds this process spends per streamed request read to its end with client
    ``name`` (``gateway``: serving.gateway.upstream.http_client; ``httpx``; ``aiohttp``)."""
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 64,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "benchmark"}]}).encode()
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    path = "/v1/chat/completions"
    closers = []
    if name == "gateway":
        from serving.gateway.upstream.http_client import ReplicaConnections
        pool = ReplicaConnections(base, connect_timeout=5, read_timeout=60, keepalive=4,
                                  headers=headers)
        closers.append(pool.aclose)

        async def one() -> None:
            r = await pool.post(path, body)
            while await r.read():
                pass
            r.close()
    elif name == "httpx":
        # As the gateway used it before its own client: 16 pools per replica (httpcore's pool
        # bookkeeping grows with the square of its connections, encode/httpcore#1035).
        shards = [httpx.AsyncClient(base_url=base, limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=32)) for _ in range(16)]
        closers += [c.aclose for c in shards]
        turn = iter(range(1 << 62))

        async def one() -> None:
            client = shards[next(turn) % len(shards)]
            r = await client.send(client.build_request("POST", path, content=body,
                                                       headers=headers), stream=True)
            async for _ in r.aiter_raw():
                pass
            await r.aclose()
    else:
        import aiohttp
        session = aiohttp.ClientSession(base, connector=aiohttp.TCPConnector(limit=0),
                                        auto_decompress=False)
        closers.append(session.close)

        async def one() -> None:
            async with session.post(path, data=body, headers=headers) as r:
                async for _ in r.content.iter_any():
                    pass

    gate = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with gate:
            await one()

    await one()  # connect first
    cpu = time.process_time()
    await asyncio.gather(*(limited() for _ in range(requests)))
    cpu = time.process_time() - cpu
    for close in closers:
        await close()
    return cpu / requests


def compare_clients(args: argparse.Namespace) -> None:
    """The client comparison that chose the gateway's own client (upstream_http's docstring)."""
    clients = ["gateway", "httpx"]
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        print("(aiohttp is not installed: not compared)", file=sys.stderr)
    else:
        clients.append("aiohttp")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rows = []
        for tokens in (args.tokens, 1):
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            # A fast schedule: the client's CPU is what is measured, not the waiting.
            with process([sys.executable, __file__, "--serve-upstream", str(port), "--tokens",
                          str(tokens), "--interval", "0.002", "--ttft", "0.002"],
                         f"{base}/health", tmp, tmp / "upstream.log"):
                for name in clients:
                    cost = run_async(client_cost(base, name, args.compare_clients, 20))
                    assert isinstance(cost, float)
                    rows.append((tokens, name, cost))
    print(f"| chunks per stream | client | CPU µs per streamed request ({args.compare_clients} "
          f"requests, 20 at a time, on {loop_name()}) |")
    print("| ---: | --- | ---: |")
    for tokens, name, cost in rows:
        print(f"| {tokens} | {name} | {cost * 1e6:.0f} |")


# --- the legs ----------------------------------------------------------------------------------

@dataclass
class Gateway:
    """A gateway leg: its name, how it is launched, and (once up) its process."""

    name: str
    source: Path
    hidden: tuple[str, ...]
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None
    banner: str = ""


def gateway_legs(names: list[str], baseline: Path | None) -> list[Gateway]:
    legs = []
    for name in names:
        if name in ("direct", LITELLM_LEG):
            continue
        if name.startswith("before") and baseline is None:
            raise SystemExit(f"leg {name!r} needs --baseline DIR")
        source = baseline if name.startswith("before") and baseline is not None else ROOT
        hidden = SPEEDUPS if name in ("before", "after-plain") else ()
        if name not in ("before", "before-fast", "after", "after-plain", *OTEL_LEGS):
            raise SystemExit(f"unknown leg {name!r}")
        legs.append(Gateway(name, source, hidden))
    return legs


#: The leg that runs LiteLLM's proxy (``--litellm PATH``) on the same upstream, for the
#: comparison the issue asks for (its published overhead: p50 2-12 ms, p99 13-43 ms).
LITELLM_LEG = "litellm"


@dataclass
class Litellm:
    url: str
    key: str
    proc: subprocess.Popen[bytes]


@contextlib.contextmanager
def litellm_proxy(executable: str, upstream: str, tmp: Path) -> Iterator[Litellm]:
    """LiteLLM's proxy (from its own environment: it is not a Vigil dependency) serving
    ``MODEL`` from ``upstream`` as a hosted vLLM, on loopback, with its logs in a file."""
    port = free_port()
    key = "sk-" + os.urandom(16).hex()  # it refuses a weak master key
    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: hosted_vllm/{MODEL}\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: none\n")
    env = {**os.environ, "LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR"}
    env.pop("PYTHONPATH", None)
    log = tmp / "litellm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([executable, "--config", str(config), "--host", "127.0.0.1",
                                 "--port", str(port)], cwd=tmp, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health/liveliness", proc, log, timeout=180.0)
        yield Litellm(url, key, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(streams: int, leg: str, base: str, args: argparse.Namespace,
            pids: dict[str, int], key: str = KEY) -> Run:
    """One leg at one level: the load, and the CPU of each process over it."""
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    own = own_cpu_seconds()
    pressure, wall = cpu_pressure_us(), time.perf_counter()
    stagger = args.ttft + args.tokens * args.interval if args.arrivals == "spread" else 0.0
    run = run_async(load(base, streams, args.seconds, args.warmup, leg, stagger, key))
    assert isinstance(run, Run)
    run.cpu = {k: cpu_seconds(p) - before[k] for k, p in pids.items()}
    run.cpu["loadgen"] = own_cpu_seconds() - own
    run.wall = time.perf_counter() - wall
    after = cpu_pressure_us()
    run.stalled = None if pressure is None or after is None else (after - pressure) / 1e6
    return run


def report(runs: list[Run], gateways: list[Gateway], args: argparse.Namespace,
           load_avg: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    print(f"Machine: {os.cpu_count()} CPUs, load average {load_avg[0][0]:.2f} at the start, "
          f"{load_avg[1][0]:.2f} at the end (1 min); Python {platform.python_version()}.")
    print(f"Upstream: fixed schedule, first chunk after {args.ttft * 1000:g} ms, "
          f"{args.tokens} chunks {args.interval * 1000:g} ms apart; "
          f"{args.seconds:g} s measured per leg after {args.warmup:g} s warm-up"
          + (f", {args.rounds} rounds interleaved" if args.rounds > 1 else "")
          + f"; arrivals {args.arrivals}.")
    for g in gateways:
        print(f"Gateway `{g.name}`: {g.source}"
              + (f" with {', '.join(g.hidden)} hidden" if g.hidden else "")
              + (f" ({g.banner})" if g.banner else "") + ".")
    print()
    print("| streams | leg | req/s | TTFT p50 ms | TTFT p99 ms | e2e p50 ms | e2e p99 ms "
          "| errors | CPU ms/req gateway | upstream | load gen | CPU pressure |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        n = max(1, r.completed)

        def per_req(key: str, r: Run = r, n: int = n) -> str:
            return f"{r.cpu[key] / n * 1000:.2f}" if key in r.cpu else ""

        pressure = "" if r.stalled is None or not r.wall else f"{r.stalled / r.wall:.0%}"
        print(f"| {r.streams} | {r.leg} | {r.rps:.1f} | {ms(quantile(r.ttft, .5))} | "
              f"{ms(quantile(r.ttft, .99))} | {ms(quantile(r.e2e, .5))} | "
              f"{ms(quantile(r.e2e, .99))} | {r.errors} | {per_req('gateway')} | "
              f"{per_req('upstream')} | {per_req('loadgen')} | {pressure} |")
    print("\n| streams | leg | added TTFT p50 ms | added TTFT p99 ms | added e2e p50 ms "
          "| added e2e p99 ms | target p50 < 1 ms, p99 < 5 ms |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
    direct = {r.streams: r for r in runs if r.leg == "direct"}
    for via in runs:
        base = direct.get(via.streams)
        if via.leg == "direct" or base is None:
            continue
        added = [quantile(via.ttft, .5) - quantile(base.ttft, .5),
                 quantile(via.ttft, .99) - quantile(base.ttft, .99),
                 quantile(via.e2e, .5) - quantile(base.e2e, .5),
                 quantile(via.e2e, .99) - quantile(base.e2e, .99)]
        met = all(a < 0.001 for a in added[::2]) and all(a < 0.005 for a in added[1::2])
        print(f"| {via.streams} | {via.leg} | " + " | ".join(ms(a) for a in added)
              + f" | {'met' if met else 'not met'} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--streams", default="1,50,200",
                   help="concurrent streams, comma-separated (1: the uncontended cost)")
    p.add_argument("--legs", default=None,
                   help="comma-separated: direct, before, before-fast, after, after-plain, "
                        "after-otel, after-otel-dead "
                        "(default: direct,before,after with --baseline, else direct,after)")
    p.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                   help="source tree of the gateway to compare against (legs before*)")
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds per leg")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds per leg")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat each level's legs this many times, interleaved, and pool them "
                        "(spreads a change in the machine's load over all legs)")
    p.add_argument("--arrivals", choices=("spread", "lockstep"), default="spread",
                   help="spread: the streams start evenly over one request's duration, so "
                        "their events arrive spread over time; lockstep: all start at once, "
                        "so every chunk interval brings a burst of one event per stream")
    p.add_argument("--tokens", type=int, default=20, help="content chunks per stream")
    p.add_argument("--interval", type=float, default=0.05,
                   help="seconds between chunks (0.05: 20 tokens/s, a busy vLLM's pace)")
    p.add_argument("--ttft", type=float, default=0.05, help="upstream seconds to first chunk")
    p.add_argument("--litellm", metavar="PATH",
                   help="the `litellm` executable of an environment with litellm[proxy]: "
                        "adds the leg 'litellm' (its proxy on the same upstream)")
    p.add_argument("--compare-clients", type=int, default=0, metavar="N",
                   help="instead: the CPU per streamed request of the gateway's HTTP client, "
                        "httpx and aiohttp (if installed), over N requests each")
    p.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.compare_clients:
        compare_clients(args)
        return 0
    if args.serve_upstream:
        with contextlib.suppress(KeyboardInterrupt):
            run_async(serve_upstream(args.serve_upstream, args.tokens, args.interval,
                                     args.ttft))
        return 0

    levels = [int(x) for x in args.streams.split(",")]
    legs = (args.legs.split(",") if args.legs else
            ["direct", "before", "after"] if args.baseline else ["direct", "after"])
    if args.litellm and LITELLM_LEG not in legs:
        legs.append(LITELLM_LEG)
    if LITELLM_LEG in legs and not args.litellm:
        raise SystemExit("leg 'litellm' needs --litellm PATH")
    gateways = gateway_legs(legs, args.baseline.resolve() if args.baseline else None)
    by_name = {g.name: g for g in gateways}
    load_start = os.getloadavg()
    runs: dict[tuple[int, str], Run] = {}
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        up_proc = stack.enter_context(process(
            [sys.executable, __file__, "--serve-upstream", str(up_port), "--tokens",
             str(args.tokens), "--interval", str(args.interval), "--ttft", str(args.ttft)],
            f"{upstream}/health", tmp, tmp / "upstream.log"))
        collector = (stack.enter_context(rotel_blackhole(tmp))
                     if "after-otel" in legs else "")
        for g in gateways:
            port = free_port()
            g.url = f"http://127.0.0.1:{port}"
            otel = {"after-otel": collector,
                    "after-otel-dead": f"http://127.0.0.1:{free_port()}"}.get(g.name, "")
            config = gateway_config(tmp, g.name, upstream, port, otel)
            g.proc = stack.enter_context(process(
                [sys.executable, "-c", _LAUNCH, ",".join(g.hidden), "gateway", "--config",
                 str(config)], f"{g.url}/health", tmp, tmp / f"{g.name}.log",
                pythonpath=g.source))
        for g in gateways:  # the start line says which loop and parser it runs on
            assert g.proc is not None and g.proc.stdout is not None
            g.banner = g.proc.stdout.readline().decode().strip().rpartition("; ")[2]
            g.banner = g.banner.removesuffix(" (Ctrl-C stops)") if " + " in g.banner else ""
        lite = (stack.enter_context(litellm_proxy(args.litellm, upstream, tmp))
                if LITELLM_LEG in legs else None)
        for streams in levels:
            for _ in range(args.rounds):
                for leg in legs:
                    gw = by_name.get(leg)
                    pids = {"upstream": up_proc.pid}
                    base, key = upstream, KEY
                    if gw is not None:
                        assert gw.proc is not None
                        pids["gateway"] = gw.proc.pid
                        base = gw.url
                    elif leg == LITELLM_LEG and lite is not None:
                        pids["gateway"] = lite.proc.pid
                        base, key = lite.url, lite.key
                    run = measure(streams, leg, base, args, pids, key)
                    key = (streams, leg)
                    if key in runs:
                        runs[key].merge(run)
                    else:
                        runs[key] = run
                    print(f"  {streams} streams {leg}: {len(run.e2e)} requests, "
                          f"{run.errors} errors, load average {os.getloadavg()[0]:.2f}",
                          file=sys.stderr, flush=True)
    report(list(runs.values()), gateways, args, (load_start, os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
