"""``vigil demo``: the whole story on one machine, in five minutes.

Two simulated vLLM pools (``chat``: Llama-3.1-8B on 2 replicas, ``code``: a coder model on 1),
the gateway in front of them (API keys for the three tiers; the semantic cache on for the chat
pool's FAQ traffic), a load generator sending through the gateway — the chat pool's load ramps
until it crosses the scale-out thresholds and its TTFT SLO burns fast enough to page, with a
few long-output requests (token anomalies) and FAQ questions in other words (cache hits) —
``vigil serve`` (collector, SLO engine, alerts, ``/metrics``), a local webhook receiver that
prints every notification it gets, and the dashboard.

Everything runs as child processes of this one (``vigil_shell.children``: they never outlive it),
on loopback ports; Ctrl-C (or ``--duration``) stops all of it cleanly: load first, then the
gateway and serve (so their last writes finish), then the fleet.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from vigil.conventions import SIM_DCGM_PATH
from vigil_shell.children import StopRequest, port_free, stop, stop_signals
from vigil_shell.children import spawn as spawn_child
from vigil_shell.extras import require_modules
from vigil_shell.options import duration_arg

__all__ = ["DemoPlan", "DemoPool", "add_arguments", "demo_config", "run"]

DEMO_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CODE_MODEL = "Qwen/Qwen2.5-Coder-7B-Instruct"
#: Files the demo writes in its folder.
KEYS_FILE = "api-keys.json"
WEBHOOK_LOG = "webhook.jsonl"


@dataclass(frozen=True)
class DemoPool:
    """One simulated pool: its replicas listen on consecutive ports from ``port``."""

    name: str
    model: str
    replicas: int
    port: int
    gpu: str = "H100"

    def bases(self) -> list[str]:
        return [f"http://127.0.0.1:{self.port + i}" for i in range(self.replicas)]


@dataclass(frozen=True)
class DemoPlan:
    """Where the demo puts things. Ports: the fleet from ``port`` on (chat, then code), then
    ``vigil serve`` and the webhook receiver; the gateway and the dashboard on their own."""

    data_dir: Path
    port: int = 8000
    gateway_port: int = 8080
    dashboard_port: int = 8501
    chat_replicas: int = 2
    code_replicas: int = 1
    scrape_interval: str = "5s"
    cache: bool = True
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def pools(self) -> list[DemoPool]:
        return [
            DemoPool("chat", DEMO_MODEL, self.chat_replicas, self.port),
            DemoPool("code", CODE_MODEL, self.code_replicas, self.port + self.chat_replicas),
        ]

    @property
    def serve_port(self) -> int:
        """``vigil serve``'s /metrics port: right after the fleet's ports."""
        return self.port + self.chat_replicas + self.code_replicas

    @property
    def webhook_port(self) -> int:
        return self.serve_port + 1

    @property
    def config_path(self) -> Path:
        return self.data_dir / "vigil.toml"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def all_ports(self) -> list[int]:
        return [*range(self.port, self.webhook_port + 1), self.gateway_port, self.dashboard_port]


def demo_config(plan: DemoPlan) -> str:
    """The demo's TOML config: two pools with a vLLM and a DCGM target per replica, the
    gateway with one key per tier (only their SHA-256), an alert route to the local receiver."""
    lines = [
        "# Written by `vigil demo`; it is rewritten on the next demo run.",
        "[store]",
        'path = "vigil.db"',
        "",
        "[collector]",
        f'scrape_interval = "{plan.scrape_interval}"',
        'scrape_timeout = "4s"',
        "",
        "[engine]",
        'evaluation_interval = "15s"',
        "",
        "# A chat product that promises 99 % of first tokens within 0.8 s (the default",
        "# threshold at a tighter objective than the default p95): with the gateway shedding",
        "# excess load, an overloaded pool burns this budget fast enough to page.",
        "[slo_defaults]",
        "ttft_objective = 0.99",
    ]
    for pool in plan.pools:
        lines += [
            "",
            "[[pools]]",
            f'name = "{pool.name}"',
            f'model = "{pool.model}"',
            f'gpu = "{pool.gpu}"',
            "gpus_per_replica = 1",
            "min_replicas = 1",
            "max_replicas = 8",
            "[pools.vllm]",
            'scheduling_policy = "priority"',
        ]
    for pool in plan.pools:
        for i, base in enumerate(pool.bases()):
            lines += [
                "",
                "[[targets]]",
                f'name = "{pool.name}-{i}"',
                f'url = "{base}/metrics"',
                f'pool = "{pool.name}"',
                'kind = "vllm"',
                "",
                "[[targets]]",
                f'name = "{pool.name}-{i}-gpu"',
                f'url = "{base}{SIM_DCGM_PATH}"',
                f'pool = "{pool.name}"',
                'kind = "dcgm"',
            ]
    lines += [
        "",
        "[alerts]",
        f'dashboard_url = "{plan.dashboard_url}"',
        'outbox_path = "vigil-alerts.db"',
        "",
        "[[alerts.routes]]",
        'name = "demo-webhook"',
        f'url = "http://127.0.0.1:{plan.webhook_port}/hook"',
        'format = "generic"',
        'group_wait = "5s"',
        'group_interval = "30s"',
        "",
        "[gateway]",
        f'listen = "127.0.0.1:{plan.gateway_port}"',
        'records_path = "vigil-gateway.db"',
        "",
        "[gateway.cache]",
        f"enabled = {'true' if plan.cache else 'false'}",
        'pools = ["chat"]',
        "",
        "[dashboard]",
        f"port = {plan.dashboard_port}",
        'refresh_interval = "10s"',
    ]
    for tier, key in sorted(plan.keys.items()):
        lines += [
            "",
            "[[gateway.api_keys]]",
            f'sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"',
            f'tenant = "demo-{tier}"',
            f'tier = "{tier}"',
        ]
    return "\n".join(lines) + "\n"


def _vigil(*args: str) -> list[str]:
    return [sys.executable, "-m", "vigil_shell.cli", *args]


def _wait_healthy(
    urls: list[str], procs: list[subprocess.Popen[bytes]], timeout: float,
    stopping: Callable[[], bool], what: str,
) -> bool:
    """Wait until every URL answers 200; False if a stop was requested meanwhile."""
    deadline = time.monotonic() + timeout
    pending = list(urls)
    while pending:
        if stopping():
            return False
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"{what} exited during start-up (see its output above)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not healthy after {timeout:.0f}s: {', '.join(pending)}")
        for url in list(pending):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1.0, trust_env=False).status_code == 200:
                    pending.remove(url)
        time.sleep(0.2)
    return True


# --- the webhook receiver -------------------------------------------------------------------
def summarize_notification(payload: dict[str, Any]) -> list[str]:
    """One line per alert of a generic-format notification (what the receiver prints)."""
    out = []
    for a in payload.get("alerts") or ():
        labels = a.get("labels") or {}
        ann = a.get("annotations") or {}
        what = ann.get("summary") or ann.get("description") or ""
        out.append(
            f"[{labels.get('severity', '?')}] {a.get('status', '?')}: "
            f"{labels.get('alertname', '?')} pool={labels.get('pool', '-')} "
            f"slo={labels.get('slo', '-')} {what}".rstrip()
        )
    return out


@contextlib.contextmanager
def webhook_receiver(port: int, log_path: Path):  # type: ignore[no-untyped-def]
    """A local webhook receiver: prints each alert and appends the payload to ``log_path``."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 10 * 1024 * 1024))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            try:
                payload = json.loads(body)
            except ValueError:
                print(f"vigil demo: webhook got a non-JSON body ({len(body)} bytes)", flush=True)
                return
            with lock, log_path.open("a") as f:
                f.write(json.dumps(payload) + "\n")
            for line in summarize_notification(payload):
                print(f"vigil demo: webhook received {line}", flush=True)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


# --- the command ----------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `vigil demo` (its ports are on 127.0.0.1 only)."""
    p.add_argument("--port", type=int, default=8000,
                   help="first port of the simulated fleet (then serve and the webhook)")
    p.add_argument("--gateway-port", type=int, default=8080, metavar="PORT",
                   help="the gateway's port")
    p.add_argument("--dashboard-port", type=int, default=8501, metavar="PORT",
                   help="the dashboard's port")
    p.add_argument("--dir", default="demo-data", help="folder for the demo's config and data")
    p.add_argument("--duration", type=duration_arg, default=0.0, metavar="DURATION",
                   help="how long to run (seconds, or 90s, 5m); 0 runs until Ctrl-C")
    p.add_argument("--rate", type=float, default=5.0, help="chat pool's starting rate (req/s)")
    p.add_argument("--ramp-to", type=float, default=20.0,
                   help="chat pool's rate after --ramp (req/s): past its capacity on purpose")
    p.add_argument("--ramp", type=duration_arg, default=90.0, metavar="DURATION",
                   help="how long the load ramp lasts (seconds, or 90s, 5m)")
    p.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    p.add_argument("--no-cache", action="store_true",
                   help="semantic cache off (skips loading the embedding model)")


def run(args: argparse.Namespace) -> int:
    """Run the demo until Ctrl-C or ``--duration``; exit code 0, 1 if a part failed, 2 when
    a port is taken."""
    # The fleet and the gateway are served by the web stack, the dashboard by Streamlit: say
    # which extra is missing now rather than through a child's traceback.
    require_modules("fastapi", "uvicorn", *(() if args.no_dashboard else ("streamlit",)))
    keys = {tier: f"vigil-demo-{tier}-{secrets.token_hex(8)}"
            for tier in ("premium", "standard", "batch")}
    plan = DemoPlan(data_dir=Path(args.dir).resolve(), port=args.port,
                    gateway_port=args.gateway_port, dashboard_port=args.dashboard_port,
                    cache=not args.no_cache, keys=keys)
    ports = plan.all_ports()
    if args.no_dashboard:
        ports.remove(plan.dashboard_port)
    busy = [p for p in ports if not port_free(p)]
    if busy:
        print(
            f"vigil demo: error: port(s) {', '.join(map(str, busy))} on 127.0.0.1 are in use; "
            "pick others with --port, --gateway-port and --dashboard-port",
            file=sys.stderr,
        )
        return 2
    plan.data_dir.mkdir(parents=True, exist_ok=True)
    plan.config_path.write_text(demo_config(plan))
    keys_path = plan.data_dir / KEYS_FILE
    keys_path.write_text(json.dumps(keys, indent=2) + "\n")
    keys_path.chmod(0o600)
    (plan.data_dir / WEBHOOK_LOG).unlink(missing_ok=True)

    with stop_signals() as request:
        return _run(args, plan, keys, request)


def _run(args: argparse.Namespace, plan: DemoPlan, keys: dict[str, str],
         request: StopRequest) -> int:
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    failed = False

    def spawn(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        proc = spawn_child(cmd)
        children.append((name, proc))
        return proc

    def stopping() -> bool:
        return request.requested or failed

    code = 0
    config = str(plan.config_path)
    with webhook_receiver(plan.webhook_port, plan.data_dir / WEBHOOK_LOG):
        try:
            fleets = []
            for pool in plan.pools:
                fleets.append(spawn(
                    f"fleet-{pool.name}",
                    _vigil("sim", "--replicas", str(pool.replicas), "--port", str(pool.port),
                           "--model", pool.model, "--gpu", pool.gpu, "--profile", "small",
                           "--scheduling-policy", "priority"),
                ))
            bases = [b for pool in plan.pools for b in pool.bases()]
            if _wait_healthy([b + "/health" for b in bases], fleets, 60, stopping, "the fleet"):
                # serve = the collector, the SLO engine every 15 s, alerting and /metrics.
                spawn("serve", _vigil("serve", "--config", config,
                                      "--listen", f"127.0.0.1:{plan.serve_port}"))
                gateway = spawn("gateway", _vigil("gateway", "--config", config))
                if not args.no_dashboard:
                    spawn("dashboard", _vigil("dashboard", "--config", config))
                if _wait_healthy([plan.gateway_url + "/health"], [gateway], 120, stopping,
                                 "the gateway"):
                    key_args = [f"--key={t}={k}" for t, k in keys.items()]
                    spawn("load-chat", _vigil(
                        "loadgen", "--url", plan.gateway_url, "--model", DEMO_MODEL,
                        "--rate", str(args.rate), "--ramp-to", str(args.ramp_to),
                        "--ramp", str(args.ramp), "--long-share", "0.03", "--faq-share", "0.3",
                        # premium (priority 0, never queued) is served first and keeps its
                        # TTFT: a small share, as in most products, so the pool's SLO burns
                        "--tier-mix", "premium=0.1,standard=0.7,batch=0.2", "--quiet",
                        *key_args))
                    spawn("load-code", _vigil(
                        "loadgen", "--url", plan.gateway_url, "--model", CODE_MODEL,
                        # short answers: this pool stays healthy, for contrast
                        "--rate", "1", "--long-share", "0", "--faq-share", "0",
                        "--no-max-tokens-share", "0", "--max-tokens", "32,64,128",
                        "--tier-mix", "standard=1", "--quiet", *key_args))
                    print(_banner(plan, args), flush=True)
            start = time.monotonic()
            while not stopping():
                if args.duration and time.monotonic() - start >= args.duration:
                    break
                for name, p in children:
                    if p.poll() is not None:
                        print(f"vigil demo: {name} exited with code {p.returncode}; stopping",
                              flush=True)
                        failed = True
                        code = 1
                time.sleep(0.2)
        except RuntimeError as exc:
            print(f"vigil demo: error: {exc}", file=sys.stderr)
            code = 1
        finally:
            print("vigil demo: stopping...", flush=True)
            # Load first, then the gateway, dashboard and serve (their last writes finish),
            # then the fleets.
            order = {"load-chat": 0, "load-code": 0, "gateway": 1, "dashboard": 1, "serve": 2}
            stop(sorted(children, key=lambda c: order.get(c[0], 9)),
                 say=lambda line: print(f"vigil demo: {line}", flush=True))
            print("vigil demo: stopped; nothing left running.", flush=True)
    return code


def _banner(plan: DemoPlan, args: argparse.Namespace) -> str:
    cfg = plan.config_path
    std = plan.keys.get("standard", "")
    lines = ["", "Vigil demo is running:"]
    for pool in plan.pools:
        for i, b in enumerate(pool.bases()):
            lines.append(f"  {pool.name}-{i} ({pool.model}): API {b}/v1  metrics {b}/metrics  "
                         f"DCGM {b}{SIM_DCGM_PATH}")
    body = json.dumps({"model": DEMO_MODEL, "messages": [
        {"role": "user", "content": "How do I reset my password?"}]})
    lines += [
        f"  gateway:   {plan.gateway_url}/v1 (keys per tier in {plan.data_dir / KEYS_FILE})",
        f"  dashboard: {plan.dashboard_url}" if not args.no_dashboard else "  dashboard: off",
        f"  vigil serve: scrapes every {plan.scrape_interval}, evaluates SLOs and alerts; "
        f"metrics http://127.0.0.1:{plan.serve_port}/metrics",
        f"  webhook receiver: http://127.0.0.1:{plan.webhook_port}/hook (alerts print here)",
        f"  load: chat {args.rate:g} -> {args.ramp_to:g} req/s over {args.ramp:g}s (past "
        "capacity: watch the scale-out advice, the TTFT burn and the page), code 1 req/s",
        "",
        f"  try:  curl -s {plan.gateway_url}/v1/chat/completions -H 'Authorization: Bearer "
        f"{std}' \\",
        f"          -H 'Content-Type: application/json' -d '{body}'",
        f"        vigil slo status --config {cfg}",
        f"        vigil alerts --config {cfg}",
        "Press Ctrl-C to stop everything.",
    ]
    return "\n".join(lines)
