"""Gateway overhead: latency the gateway adds to streaming requests, and requests/s.

Run: ``.venv/bin/python bench/gateway_bench.py [--streams 1,50,200] [--seconds 15]``

Three processes on loopback: a fast upstream, ``vigil gateway`` in front of it, and this
script's load generator, which keeps N streams busy (each sends a streaming chat request, reads
it to its end, sends the next) first straight to the upstream, then through the gateway, and
compares. Added latency = gateway quantile - direct quantile, for the time to the first body
bytes (TTFT) and to the end of the stream (e2e). Targets (issue 5): p50 < 1 ms, p99 < 5 ms.

Which upstream and why: neither the simulator nor a uvicorn/starlette app, but a raw asyncio
HTTP/1.1 server streaming a fixed completion on a fixed schedule (first chunk after ``--ttft``,
then ``--tokens`` chunks ``--interval`` apart, the usage chunk, ``[DONE]``), with every byte
prepared in advance. The simulator's step scheduling moves each request's timing by milliseconds,
which would drown a sub-millisecond difference; a starlette app costs as much CPU per chunk as
the gateway itself, and on a 2-core machine that CPU is taken from the gateway being measured.
The load generator is as lean for the same reason: one keep-alive connection per stream,
prepared request bytes, and no parsing beyond finding the end of the chunked body. The SSE
chunks have vLLM's shape, so the gateway does all of its usual work on them. Prints Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
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

MODEL = "bench-model"
KEY = "sk-bench"


# --- the upstream ----------------------------------------------------------------------------

def _chunk(delta: dict | None, finish: str | None = None, usage: dict | None = None) -> bytes:
    body: dict = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
                  "model": MODEL, "choices": [] if delta is None else [
                      {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    data = b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"  # one HTTP/1.1 chunk


async def serve_upstream(port: int, tokens: int, interval: float, ttft: float) -> None:
    """A vLLM-shaped streaming endpoint with a fixed schedule, plus /health and /metrics."""
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    first = _chunk({"role": "assistant", "content": ""}) + _chunk({"content": " word0"})
    words = [_chunk({"content": f" word{i}"}, "length" if i == tokens - 1 else None)
             for i in range(1, tokens)]
    usage = _chunk(None, usage={"prompt_tokens": 12, "completion_tokens": tokens,
                                "total_tokens": 12 + tokens})
    done = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"  # [DONE] (14 bytes), then the last chunk
    metrics = (f'vllm:kv_cache_usage_perc{{model_name="{MODEL}"}} 0.1\n'
               f'vllm:num_requests_waiting{{model_name="{MODEL}"}} 0\n'
               f'vllm:num_requests_running{{model_name="{MODEL}"}} 1\n').encode()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head_bytes = await reader.readuntil(b"\r\n\r\n")
                lines = head_bytes.split(b"\r\n")
                length = 0
                for line in lines[1:]:
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length)
                path = lines[0].split(b" ")[1].split(b"?")[0]
                if path == b"/health":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    continue
                if path == b"/metrics":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                                 + f"content-length: {len(metrics)}\r\n\r\n".encode()
                                 + metrics)
                    continue
                writer.write(head)
                await asyncio.sleep(ttft)
                writer.write(first)
                for w in words:
                    await asyncio.sleep(interval)
                    writer.write(w)
                if b'"include_usage":true' in body:
                    writer.write(usage)
                writer.write(done)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


# --- processes ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


@contextlib.contextmanager
def process(args: list[str], health: str, cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    # The caller's PYTHONPATH is kept (after the repo): it can add uvloop and httptools, which
    # uvicorn picks up by itself, to compare.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_http(health, proc)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def gateway_config(tmp: Path, upstream: str, port: int) -> Path:
    import hashlib
    path = tmp / "vigil.toml"
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
records_path = "{tmp / 'records.db'}"

[[gateway.api_keys]]
sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"
tenant = "bench"
tier = "premium"
""")
    return path


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the load ----------------------------------------------------------------------------------

@dataclass
class Run:
    target: str
    streams: int
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    cpu: float = 0.0

    @property
    def rps(self) -> float:
        return len(self.e2e) / self.seconds if self.seconds else 0.0


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


async def load(base: str, streams: int, seconds: float, warmup: float) -> Run:
    """Keep ``streams`` streaming requests going for ``warmup + seconds``; measure the last
    ``seconds``: time to the first body bytes and to the end of the chunked body."""
    run = Run(target=base, streams=streams)
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 64,
                       "messages": [{"role": "user", "content": "benchmark"}]}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
               f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\n\r\n").encode() + body
    end_of_body = b"\r\n0\r\n\r\n"
    start = time.perf_counter()
    measure_from = start + warmup
    stop = measure_from + seconds

    async def stream() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while True:
                t0 = time.perf_counter()
                if t0 >= stop:
                    return
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                ok = head.startswith(b"HTTP/1.1 200")
                first = None
                tail = b""
                while True:
                    data = await reader.read(65536)
                    if not data:
                        raise ConnectionError("closed")
                    if first is None:
                        first = time.perf_counter()
                    tail = (tail + data)[-len(end_of_body):]
                    if tail == end_of_body:
                        break
                end = time.perf_counter()
                if t0 < measure_from or end > stop:
                    continue
                if not ok:
                    run.errors += 1
                    continue
                run.ttft.append(first - t0)
                run.e2e.append(end - t0)
        except (ConnectionError, asyncio.IncompleteReadError):
            run.errors += 1
        finally:
            writer.close()

    await asyncio.gather(*(stream() for _ in range(streams)))
    run.seconds = seconds
    return run


def ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--streams", default="1,50,200",
                   help="concurrent streams, comma-separated (1: the uncontended cost)")
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds per leg")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds per leg")
    p.add_argument("--tokens", type=int, default=20, help="content chunks per stream")
    p.add_argument("--interval", type=float, default=0.05,
                   help="seconds between chunks (0.05: 20 tokens/s, a busy vLLM's pace)")
    p.add_argument("--ttft", type=float, default=0.05, help="upstream seconds to first chunk")
    p.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_upstream:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_upstream(args.serve_upstream, args.tokens, args.interval,
                                       args.ttft))
        return 0

    levels = [int(x) for x in args.streams.split(",")]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        up_port, gw_port = free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        gateway = f"http://127.0.0.1:{gw_port}"
        config = gateway_config(tmp, upstream, gw_port)
        with process([sys.executable, __file__, "--serve-upstream", str(up_port),
                      "--tokens", str(args.tokens), "--interval", str(args.interval),
                      "--ttft", str(args.ttft)], f"{upstream}/health", tmp), \
                process([sys.executable, "-m", "vigil.cli", "gateway", "--config", str(config)],
                        f"{gateway}/health", tmp) as gw_proc:
            for streams in levels:
                for name, base in (("direct", upstream), ("gateway", gateway)):
                    cpu0 = cpu_seconds(gw_proc.pid)
                    run = asyncio.run(load(base, streams, args.seconds, args.warmup))
                    run.target = name
                    run.cpu = cpu_seconds(gw_proc.pid) - cpu0
                    runs.append(run)
                    print(f"  {streams} streams {name}: {len(run.e2e)} requests, "
                          f"{run.errors} errors", file=sys.stderr, flush=True)

    print(f"Upstream: fixed schedule, first chunk after {args.ttft * 1000:g} ms, "
          f"{args.tokens} chunks {args.interval * 1000:g} ms apart; "
          f"{args.seconds:g} s measured per leg after {args.warmup:g} s warm-up.\n")
    print("| streams | path | req/s | TTFT p50 ms | TTFT p99 ms | e2e p50 ms | e2e p99 ms "
          "| errors | gateway CPU s / 1k req |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        cpu = f"{r.cpu / len(r.e2e) * 1000:.2f}" if r.target == "gateway" and r.e2e else ""
        print(f"| {r.streams} | {r.target} | {r.rps:.1f} | {ms(quantile(r.ttft, .5))} | "
              f"{ms(quantile(r.ttft, .99))} | {ms(quantile(r.e2e, .5))} | "
              f"{ms(quantile(r.e2e, .99))} | {r.errors} | {cpu} |")
    print("\n| streams | added TTFT p50 ms | added TTFT p99 ms | added e2e p50 ms "
          "| added e2e p99 ms | target p50 < 1 ms, p99 < 5 ms |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for direct, via in zip(runs[::2], runs[1::2], strict=True):
        added = [quantile(via.ttft, .5) - quantile(direct.ttft, .5),
                 quantile(via.ttft, .99) - quantile(direct.ttft, .99),
                 quantile(via.e2e, .5) - quantile(direct.e2e, .5),
                 quantile(via.e2e, .99) - quantile(direct.e2e, .99)]
        met = "met" if added[0] < 0.001 and added[1] < 0.005 else "not met"
        print(f"| {direct.streams} | " + " | ".join(ms(a) for a in added) + f" | {met} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
