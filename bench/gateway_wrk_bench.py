"""Gateway under wrk: the latency one gateway worker adds to plain (non-streaming) requests.

Run: ``.venv/bin/python bench/gateway_wrk_bench.py [--seconds 20] [--connections 4]
[--rounds 2] [--source DIR] [--database postgresql://...|--postgres] [--gateway-env K=V]``.

Three processes on loopback: nginx as the upstream (a fixed vLLM-shaped chat completion with
usage on ``POST /v1/chat/completions``, ``/health`` 200, a small vLLM ``/metrics`` exposition,
one worker, no access log), one ``vigil gateway`` in front of it (one pool, one target: the
nginx), and wrk (``-t1 -cN --latency`` with a Lua script posting a small non-streaming chat
request). Each round runs wrk straight at nginx, then through the gateway; added latency is
the gateway's quantile minus nginx's of the same round. wrk's own ``--latency`` table stops at
p99, so the Lua ``done`` hook prints p50/p90/p99/p99.9 from the same histogram (microseconds).

nginx rather than a Python stub: its p99 on this machine is a quarter of a millisecond, so
whatever tail the table shows is the gateway's. The records go to SQLite in the temporary
directory, or to PostgreSQL with ``--database URL`` (an empty database that the gateway may
create its tables in) or ``--postgres`` (a throw-away server started with ``initdb`` and
``pg_ctl`` from the PostgreSQL binaries on this machine). ``--source DIR`` runs the gateway of
another source tree (e.g. a ``git worktree`` of an older commit) for a before/after table.

Each leg reports the gateway's CPU per request (user + system, all of its threads), the
machine's load average, and its CPU pressure (Linux PSI: the share of the leg's wall time in
which some task waited for a CPU). The machine has 2 cores for wrk, nginx and the gateway (and
whatever else runs on it): a leg with high pressure measured its neighbours as much as the
gateway. Prints Markdown.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.processes import (  # noqa: E402
    cpu_pressure_us,
    cpu_seconds,
    free_port,
    postgres,
    stop,
    wait_http,
)

MODEL = "bench-model"
KEY = "sk-bench"

#: What the upstream answers: a vLLM chat completion (its fields and their order).
COMPLETION = {
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there!",
                                         "tool_calls": []},
                 "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
    "usage": {"prompt_tokens": 12, "total_tokens": 16, "completion_tokens": 4,
              "prompt_tokens_details": None},
    "prompt_logprobs": None,
}
METRICS = f"""# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.1
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 0.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 1.0
"""
REQUEST = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}],
           "max_tokens": 16}

#: wrk's script: POST the request; print p50/p90/p99/p99.9 (us), requests, errors at the end.
WRK_LUA = """wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
done = function(summary, latency, requests)
  for _, p in ipairs({{50, 90, 99, 99.9}}) do
    io.write(string.format("VIGIL p%s %d\\n", p, latency:percentile(p)))
  end
  local e = summary.errors
  io.write(string.format("VIGIL requests %d duration_us %d errors %d non2xx %d\\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout,
    e.status))
end
"""


def _lua_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def nginx_conf(tmp: Path, port: int) -> Path:
    """The upstream stub's config (paths relative to the ``-p`` prefix ``tmp``)."""
    completion = json.dumps(COMPLETION, separators=(",", ":"))
    metrics = METRICS.replace("\n", "\\n").replace('"', '\\"')
    conf = tmp / "nginx.conf"
    conf.write_text(f"""daemon off;
master_process on;
worker_processes 1;
pid nginx.pid;
error_log nginx-error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path tmp-body;
    proxy_temp_path tmp-proxy;
    fastcgi_temp_path tmp-fastcgi;
    uwsgi_temp_path tmp-uwsgi;
    scgi_temp_path tmp-scgi;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        location = /v1/chat/completions {{
            default_type application/json;
            return 200 '{completion}';
        }}
        location = /health {{ return 200 ''; }}
        location = /metrics {{
            default_type "text/plain; version=0.0.4; charset=utf-8";
            return 200 "{metrics}";
        }}
    }}
}}
""")
    return conf


def gateway_config(tmp: Path, upstream: str, port: int, database: str) -> Path:
    path = tmp / "vigil.toml"
    db_line = f'database = "{database}"' if database else ""
    path.write_text(f"""
[[pools]]
name = "bench"
model = "{MODEL}"

[[targets]]
name = "nginx-0"
url = "{upstream}/metrics"
pool = "bench"

[gateway]
listen = "127.0.0.1:{port}"
records_path = "{tmp / 'records.db'}"
{db_line}

[[gateway.api_keys]]
sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"
tenant = "bench"
tier = "premium"
""")
    return path


# --- processes ---------------------------------------------------------------------------------

@contextlib.contextmanager
def process(args: list[str], health: str, log: Path, *, cwd: Path = ROOT,
            env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` until the block ends, up once ``health`` answers 200; output to ``log``."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(health, proc, log)
        yield proc
    finally:
        stop(proc)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# --- wrk ---------------------------------------------------------------------------------------

@dataclass
class Leg:
    name: str
    round: int
    requests: int
    seconds: float
    errors: int
    #: Quantile (50, 90, 99, 99.9) -> seconds.
    latency: dict[float, float]
    gateway_cpu_s: float | None
    load: float
    pressure: float | None

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


_LINE = re.compile(r"^VIGIL p([\d.]+) (\d+)$")
_TOTALS = re.compile(r"^VIGIL requests (\d+) duration_us (\d+) errors (\d+) non2xx (\d+)$")


def parse_wrk(out: str) -> tuple[dict[float, float], int, float, int]:
    """(quantile -> seconds, requests, seconds, errors incl. non-2xx) from the script's lines."""
    latency: dict[float, float] = {}
    totals = None
    for line in out.splitlines():
        if m := _LINE.match(line.strip()):
            latency[float(m.group(1))] = int(m.group(2)) / 1e6
        elif m := _TOTALS.match(line.strip()):
            totals = m
    if totals is None or len(latency) != 4:
        raise RuntimeError(f"wrk printed no summary:\n{out[-2000:]}")
    return (latency, int(totals.group(1)), int(totals.group(2)) / 1e6,
            int(totals.group(3)) + int(totals.group(4)))


def run_wrk(name: str, rnd: int, url: str, script: Path, args: argparse.Namespace,
            gateway_pid: int | None) -> Leg:
    cmd = ["wrk", "-t1", f"-c{args.connections}", f"-d{args.seconds}s", "--latency",
           "-s", str(script), url]
    load = load_average()
    cpu0 = cpu_seconds(gateway_pid) if gateway_pid else None
    psi0, wall0 = cpu_pressure_us(), time.monotonic()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         timeout=args.seconds + 60).stdout
    wall = time.monotonic() - wall0
    psi1 = cpu_pressure_us()
    cpu = cpu_seconds(gateway_pid) - cpu0 if gateway_pid and cpu0 is not None else None
    latency, requests, seconds, errors = parse_wrk(out)
    pressure = (psi1 - psi0) / 1e6 / wall if psi0 is not None and psi1 is not None else None
    return Leg(name, rnd, requests, seconds, errors, latency, cpu, max(load, load_average()),
               pressure)


# --- the report --------------------------------------------------------------------------------

def ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def report(legs: list[Leg], args: argparse.Namespace, banner: str) -> str:
    lines = [
        f"wrk -t1 -c{args.connections} -d{args.seconds}s, {args.rounds} round(s); "
        f"records on {args.store}; {banner}",
        "",
        "| leg | round | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | added p50 ms | "
        "added p99 ms | gateway CPU/req ms | errors | load avg | CPU pressure |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {leg.round: leg for leg in legs if leg.name == "nginx"}
    for leg in legs:
        lat = leg.latency
        ref = base.get(leg.round)
        gw = leg.name != "nginx" and ref is not None
        added50 = ms(lat[50] - ref.latency[50]) if gw and ref else ""
        added99 = ms(lat[99] - ref.latency[99]) if gw and ref else ""
        cpu = (f"{leg.gateway_cpu_s / leg.requests * 1e3:.3f}"
               if leg.gateway_cpu_s is not None and leg.requests else "")
        pressure = "" if leg.pressure is None else f"{leg.pressure:.0%}"
        lines.append(
            f"| {leg.name} | {leg.round} | {leg.rps:,.0f} | {ms(lat[50])} | {ms(lat[90])} | "
            f"{ms(lat[99])} | {ms(lat[99.9])} | {added50} | {added99} | {cpu} | {leg.errors} | "
            f"{leg.load:.2f} | {pressure} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=20, help="wrk's duration per leg (s)")
    p.add_argument("--connections", type=int, default=4, help="wrk's connections")
    p.add_argument("--rounds", type=int, default=2, help="nginx + gateway legs, this many times")
    p.add_argument("--source", type=Path, default=ROOT,
                   help="source tree of the gateway to run (default: this one)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the gateway")
    db = p.add_mutually_exclusive_group()
    db.add_argument("--database", default="", help="postgresql:// URL for the records")
    db.add_argument("--postgres", action="store_true",
                    help="start a throw-away PostgreSQL server for the records")
    p.add_argument("--gateway-env", action="append", default=[], metavar="K=V",
                   help="environment variable for the gateway process (repeatable)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            raise SystemExit(f"{tool} is not installed (apt-get install wrk nginx-light)")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"

    tmp = Path(tempfile.mkdtemp(prefix="vigil-wrk-"))
    try:
        with contextlib.ExitStack() as stack:
            database = args.database
            if args.postgres:
                database = stack.enter_context(postgres())
            args.store = "PostgreSQL" if database else "SQLite"
            up_port, gw_port = free_port(), free_port()
            upstream = f"http://127.0.0.1:{up_port}"
            stack.enter_context(process(
                [nginx, "-p", str(tmp), "-c", str(nginx_conf(tmp, up_port))],
                f"{upstream}/health", tmp / "nginx.out"))
            cfg = gateway_config(tmp, upstream, gw_port, database)
            env = {**os.environ, "PYTHONPATH": str(args.source)}
            env.update(kv.split("=", 1) for kv in args.gateway_env)
            gateway = stack.enter_context(process(
                [args.python, "-m", "vigil_shell", "gateway", "--config", str(cfg)],
                f"http://127.0.0.1:{gw_port}/health", tmp / "gateway.out",
                cwd=args.source, env=env))
            banner = (tmp / "gateway.out").read_text(errors="replace").splitlines()
            banner_line = next((b for b in banner if b.startswith("vigil gateway")), "")
            banner_line = banner_line.split(";")[-1].strip().removesuffix("(Ctrl-C stops)")
            script = tmp / "post.lua"
            script.write_text(WRK_LUA.format(body=_lua_string(json.dumps(REQUEST)), key=KEY))
            path = "/v1/chat/completions"
            legs: list[Leg] = []
            # A short warm-up of each, not measured (connections, caches, JIT-less warmth).
            for url in (upstream, f"http://127.0.0.1:{gw_port}"):
                subprocess.run(["wrk", "-t1", "-c2", "-d2s", "-s", str(script), url + path],
                               check=True, capture_output=True)
            for rnd in range(1, args.rounds + 1):
                legs.append(run_wrk("nginx", rnd, upstream + path, script, args, None))
                legs.append(run_wrk("gateway", rnd, f"http://127.0.0.1:{gw_port}{path}",
                                    script, args, gateway.pid))
                print(report(legs[-2:], args, banner_line), file=sys.stderr, flush=True)
        print(report(legs, args, f"gateway: {banner_line} ({args.source})"))
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
