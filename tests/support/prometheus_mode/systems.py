"""The two systems of the Prometheus-mode run (``test_prometheus_mode.py``), all on loopback:

* the run's Vigil config (``vigil_config_text``): one pool of a simulated fleet's replicas and
  a dead target, every window a multiple of the stop-the-world cycle;
* Vigil's own ``Collector`` writing the embedded store in a thread (``collecting``);
* Debian's Prometheus started with exactly the files ``vigil rules prometheus`` writes: its
  ``prometheus-scrape.yml`` as the scrape jobs and the two rule files as ``rule_files``
  (``scraping_prometheus``);
* ``vigil slo status --json`` from either (``slo_status``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from collector.service import Collector
from support.prometheus import PrometheusServer, require_prometheus, start_prometheus
from support.prometheus_mode.load import Schedule
from vigil.config import Config
from vigil.conventions import FILE_ALERT_RULES, FILE_SCRAPE_CONFIG, FILE_SLO_RULES

__all__ = ["collecting", "scraping_prometheus", "slo_status", "vigil_config_text"]

#: How long the collector's thread may take to start and to stop (seconds).
READY_TIMEOUT_S = 30.0


# --- the config -----------------------------------------------------------------------------
def vigil_config_text(metrics_urls: Sequence[str], dead_url: str, model: str,
                      schedule: Schedule) -> str:
    """The test's Vigil config (TOML): one pool of the fleet's replicas plus a dead target.

    Every window is a multiple of the cycle, so that ``T - w`` falls in a pause when ``T``
    does. ``[collector] scrape_interval`` is the step of the scaling timelines (the status
    samples them at that step), so it is the cycle too; the targets override it with 1 s.
    ``promql_semantics = "2"``: the server is Prometheus 2.42 and the store must follow the
    same rules ("auto" would mean 3.x rules for the store), so that only the instants differ.
    """
    cycle = int(schedule.cycle_s)
    if cycle != schedule.cycle_s:
        raise ValueError("the cycle must be a whole number of seconds")

    def d(n: int) -> str:
        return json.dumps(f"{n * cycle}s")

    scrape = json.dumps(f"{schedule.scrape_interval_s:g}s")
    lines = [
        "[store]", 'path = "vigil.db"',
        "[collector]", f"scrape_interval = {d(1)}", f"scrape_timeout = {scrape}",
        "[engine]", 'promql_semantics = "2"', f"window = {d(2)}", f"cost_window = {d(5)}",
        # 4x rather than the default 10x: with the run's few requests per window, one giant
        # prompt lifts the mean enough to hide itself from a 10x threshold.
        "[anomaly]", f"window = {d(5)}", "token_multiplier = 4.0",
        "[scaling]", "scale_out_queue_length = 4", f"scale_in_hold = {d(5)}",
        f"cooldown = {d(2)}",
    ]
    # A scaled-down SRE-workbook table: pages and tickets within the test's minute.
    for severity, factor, long_w, short_w in (("page", 14.4, 6, 2), ("page", 6.0, 12, 3),
                                              ("ticket", 1.0, 4, 1)):
        lines += ["[[engine.burn_rate_alerts]]", f'severity = "{severity}"',
                  f"factor = {factor}", f"long_window = {d(long_w)}",
                  f"short_window = {d(short_w)}"]
    lines += ["[[pools]]", 'name = "chat"', f"model = {json.dumps(model)}", "max_replicas = 3"]
    urls = [*metrics_urls, dead_url]
    for i, url in enumerate(urls):
        lines += ["[[targets]]", f'name = "chat-{i}"', f"url = {json.dumps(url)}",
                  'pool = "chat"', f"scrape_interval = {scrape}", f"scrape_timeout = {scrape}"]
    # Two SLOs over a period inside the run, two over the default 30 days.
    for name, indicator, period in (("chat-ttft", "ttft", d(10)), ("chat-e2e", "e2e", ""),
                                    ("chat-error-rate", "error_rate", d(10)),
                                    ("chat-replica-up", "replica_up", "")):
        lines += ["[[slos]]", f'name = "{name}"', 'pool = "chat"', f'indicator = "{indicator}"']
        if period:
            lines.append(f"period = {period}")
    return "\n".join(lines) + "\n"


# --- Vigil's collector and a scraping Prometheus --------------------------------------------
@contextlib.contextmanager
def collecting(config: Config) -> Iterator[Collector]:
    """Vigil's ``Collector`` scraping on its schedule in a thread (its own event loop) until
    the block ends; an error inside it is raised here."""
    state: dict[str, Any] = {}
    ready = threading.Event()
    collector = Collector(config)

    async def main() -> None:
        state["loop"] = asyncio.get_running_loop()
        state["stop"] = stop = asyncio.Event()
        ready.set()
        try:
            await collector.run(stop)
        finally:
            await collector.close()

    def thread_main() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the main thread
            state["error"] = exc
            ready.set()

    thread = threading.Thread(target=thread_main, name="vigil-collector", daemon=True)
    thread.start()
    ready.wait(READY_TIMEOUT_S)
    try:
        yield collector
    finally:
        if "loop" in state:
            state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(READY_TIMEOUT_S)
        if "error" in state:
            raise state["error"]


@contextlib.contextmanager
def scraping_prometheus(workdir: Path, rules_dir: Path) -> Iterator[PrometheusServer]:
    """Prometheus whose configuration is the generated files as they are: the scrape jobs of
    ``prometheus-scrape.yml`` and the two rule files (nothing edited: the config already has
    the loopback ports)."""
    prometheus, _ = require_prometheus()
    scrape = (rules_dir / FILE_SCRAPE_CONFIG).read_text()
    config = ("rule_files:\n"
              f"- {json.dumps(str(rules_dir / FILE_SLO_RULES))}\n"
              f"- {json.dumps(str(rules_dir / FILE_ALERT_RULES))}\n" + scrape)
    # A retention that covers the 30-day SLO periods, as a deployment for them must keep.
    server = start_prometheus(prometheus, workdir, config, workdir / "data",
                              "--storage.tsdb.retention.time=100y")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def slo_status(config_path: Path, at_s: float, prometheus_url: str = "",
               recorded_rules: str = "") -> dict[str, Any]:
    """``vigil slo status --config F --json --at T [--prometheus-url URL]
    [--recorded-rules auto|off]``, parsed."""
    from vigil_shell.slo_status_cli import add_arguments, run

    parser = argparse.ArgumentParser(prog="vigil slo status")
    add_arguments(parser)
    argv = ["--config", str(config_path), "--json", "--at", repr(at_s)]
    if prometheus_url:
        argv += ["--prometheus-url", prometheus_url]
    if recorded_rules:
        argv += ["--recorded-rules", recorded_rules]
    out = io.StringIO()
    if run(parser.parse_args(argv), out=out) != 0:
        raise RuntimeError(f"vigil slo status {' '.join(argv)} failed")
    result: dict[str, Any] = json.loads(out.getvalue())
    return result

