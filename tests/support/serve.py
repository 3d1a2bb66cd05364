"""``vigil serve`` against a simulated fleet, for its tests: a config with a tight SLO and a
webhook, load to breach it, and stopping the processes."""

from __future__ import annotations

import contextlib
import subprocess
import threading

import httpx

from support.loopback import wait_for as wait_until

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def tight_slo_config(sim_base: str, hook: str, *, alerts_extra: str = "",
                     route_extra: str = "") -> str:
    """A serve config whose TTFT SLO (20 ms at 99.9 %) a loaded replica breaks at once, with
    one route sending pages to ``hook``."""
    return f"""
[store]
path = "vigil.db"
[collector]
scrape_interval = "1s"
scrape_timeout = "800ms"
[engine]
evaluation_interval = "2s"
window = "1m"
[[pools]]
name = "chat"
model = "{MODEL}"
[[targets]]
name = "r0"
url = "{sim_base}/metrics"
pool = "chat"
[[slos]]
name = "chat-ttft"
pool = "chat"
indicator = "ttft"
threshold_seconds = 0.02
objective = 0.999
[alerts]
outbox_path = "alerts.db"
{alerts_extra}
[[alerts.routes]]
name = "oncall"
match = {{ severity = "page" }}
url = "{hook}"
format = "generic"
group_wait = "1s"
group_interval = "5s"
{route_extra}
"""


def load(base: str, stop: threading.Event) -> None:
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                client.post(base + "/v1/completions", json={
                    "model": MODEL, "prompt": "Hello there " * 20, "max_tokens": 32,
                    "ignore_eos": True})


def stop_process(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()


def wait_for(what: str, check, timeout: float) -> object:
    """Poll ``check`` every 0.25 s until truthy (an HTTP error counts as "not yet")."""
    return wait_until(what, check, timeout, interval_s=0.25, ignore=(httpx.HTTPError,))
