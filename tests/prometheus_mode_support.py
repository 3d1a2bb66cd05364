"""The harness of ``tests/test_prometheus_mode.py``: one simulated fleet scraped by two systems.

What it sets up, all on loopback:

* a simulated vLLM fleet (``serving.sim.testing.running_fleet``) and a dead target in its pool;
* Debian's Prometheus, started with exactly the files ``vigil rules prometheus`` writes: its
  ``prometheus-scrape.yml`` as the scrape jobs and the two rule files as ``rule_files``;
* Vigil's own ``Collector`` writing the embedded store, on the same 1 s scrape interval;
* a load driver that stops the world on a fixed rhythm (``Schedule``).

Why stop the world. Two systems that scrape the same counter at different instants see it
differ by what happened between the instants, and nobody can know how much that was: it is
whatever the fleet did in that second. So the fleet's engines are paused (``FleetFreezer``:
no engine step runs, no request arrives) for a few seconds of every cycle, and the evaluation
instants, every window edge and every point of the scaling timelines fall in the middle of a
pause, where both systems have scraped the same frozen values. What happens between the two
scrape instants is then zero, and checked to be zero (``edge_violations``); what remains is
only *where* the instants are, and its effect is derived, not guessed (``Spread``, and the
derivation in ``docs/deploying.md``, "How close the two answers are").

The tolerance, per number (``compare_status``):

* each counter series ``s`` changes by the same raw amount ``N(s)`` in the window on both
  sides (checked); each side extrapolates it to the window's edges with its own factor
  ``k(s) >= 1``, a function of its sample instants (and of ``N(s)`` and the first value, which
  are the same on both sides). ``rho(s) = k_ours(s) / k_theirs(s)``; a ``Spread`` is the range
  ``[lo, hi]`` of ``rho`` over the series a number is made of (those with ``N(s) > 0``);
* a sum of increases (requests, tokens) differs by a factor in ``[lo, hi]``;
* a ratio of two such sums (an error ratio, a mean, a bucket fraction) by a factor in
  ``[lo_num / hi_den, hi_num / lo_den]``, and a quantile lies between the quantiles of the
  other side's buckets with every bucket fraction moved to either end of its own interval
  (``histogram_quantile`` falls as any fraction rises);
* gauges read at a paused instant (KV cache, queue, ``up``) are equal, as is everything made
  from them only (availability, GPU-hours, the KV and queue timelines of the scaling advice);
* the idle share counts samples, so it may differ by a few samples per run of idle samples
  and by the difference of the sample counts (``idle_share_bound``);
* derived numbers (burn rates, budgets, time to exhaustion, costs per request, the TTFT trend
  of the scaling advice) carry their inputs' intervals through their formulas.

A value whose interval straddles a threshold that decides something discrete (an alert, a
scaling reason, an anomaly's bucket) is reported as ambiguous instead of compared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import random
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from helpers import free_port
from prometheus_server import PrometheusServer, require_prometheus

from collector.service import Collector
from serving.sim.testing import FleetHandle
from slo.burn_rate import burn_windows
from slo.lookup import instant_value, select_range
from slo.quantile import Bucket, histogram_quantile, parse_le
from slo.rate import increase
from slo.scaling import fit_window_for, trend
from slo.signals import sample_times, ttft_threshold_for
from slo.source import Source
from slo.spec import SloSpec, effective_slos
from vigil.config import Config
from vigil.conventions import (
    FILE_ALERT_RULES,
    FILE_SCRAPE_CONFIG,
    FILE_SLO_RULES,
    FINISHED_REASON_ERROR,
    KIND_VLLM,
    LABEL_FINISHED_REASON,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_LE,
    LABEL_MODEL_NAME,
    LABEL_POOL,
    SERIES_UP,
    SUFFIX_BUCKET,
    SUFFIX_COUNT,
    SUFFIX_SUM,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_ITL,
    VLLM_KV_CACHE_USAGE,
    VLLM_PROMPT_TOKENS_HIST,
    VLLM_QUEUE_TIME,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
    VLLM_TTFT,
)
from vigil.durations import parse_duration
from vigil.model import Labels

__all__ = [
    "COUNTERS",
    "GAUGES",
    "Checker",
    "CyclePlan",
    "FleetFreezer",
    "LoadStats",
    "Schedule",
    "Sides",
    "Spread",
    "StatusComparison",
    "TtftTrend",
    "collecting",
    "compare_status",
    "drive_load",
    "edge_violations",
    "first_scrapes",
    "grid_jitter",
    "idle_share_bound",
    "key_paths",
    "probe_times",
    "read_samples",
    "scraping_prometheus",
    "slo_status",
    "status_windows",
    "structure_differences",
    "vigil_config_text",
    "wait_for",
]

#: The histograms the status reads (base names) and every counter series they and the cost
#: figures are made of; the gauges it reads.
HISTOGRAMS = (VLLM_TTFT, VLLM_E2E, VLLM_QUEUE_TIME, VLLM_ITL, VLLM_PROMPT_TOKENS_HIST,
              VLLM_GENERATION_TOKENS_HIST)
COUNTERS = (VLLM_REQUEST_SUCCESS, VLLM_GENERATION_TOKENS,
            *(h + s for h in HISTOGRAMS for s in (SUFFIX_BUCKET, SUFFIX_SUM, SUFFIX_COUNT)))
GAUGES = (SERIES_UP, VLLM_KV_CACHE_USAGE, VLLM_REQUESTS_WAITING, VLLM_REQUESTS_RUNNING)
#: Float rounding between two evaluations of the same formula (relative).
REL_EPS = 1e-9
READY_TIMEOUT_S = 30.0


# --- the rhythm -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    """The stop-the-world rhythm (seconds): each cycle of ``cycle_s`` runs the fleet for
    ``run_s`` (requests arrive only then), then pauses it. ``settle_s`` bounds the engine step
    still under way when the pause starts (a 2048-token prefill chunk takes 0.34 s on the
    ``small`` profile). Evaluation instants sit midway between the settled pause and the thaw,
    so the last scrape before them and the first after them (one ``scrape_interval_s`` away
    at most) both see the paused state, with ``margin_s`` to spare on each side."""

    cycle_s: float = 6.0
    run_s: float = 2.0
    settle_s: float = 0.5
    scrape_interval_s: float = 1.0

    @property
    def eval_offset_s(self) -> float:
        """Evaluation instants relative to their cycle's start."""
        return (self.run_s + self.settle_s + self.cycle_s) / 2

    @property
    def margin_s(self) -> float:
        """Slack on each side of the instants' scrape-interval neighbourhoods."""
        return self.cycle_s - self.eval_offset_s - self.scrape_interval_s

    def eval_time(self, start_s: float, cycle: int) -> float:
        """The evaluation instant of ``cycle`` (Unix seconds) for cycles starting at
        ``start_s``."""
        return start_s + cycle * self.cycle_s + self.eval_offset_s


@dataclass(frozen=True)
class CyclePlan:
    """The load of one cycle: Poisson arrivals at ``rate`` per second of run time, ``giant``
    requests with a prompt of more than 10,000 tokens (cost anomalies), or ``restart``: replica
    index restarted (every counter back to zero) while the whole cycle stays paused."""

    rate: float = 0.0
    giant: int = 0
    restart: int | None = None


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
        # 4x rather than the seed's 10x: with the run's few requests per window, one giant
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
                                    ("chat-availability", "availability", "")):
        lines += ["[[slos]]", f'name = "{name}"', 'pool = "chat"', f'indicator = "{indicator}"']
        if period:
            lines.append(f"period = {period}")
    return "\n".join(lines) + "\n"


# --- stopping the world ---------------------------------------------------------------------
class FleetFreezer:
    """Pauses the engines of an in-thread fleet: while ``frozen``, ``Engine.schedule`` finds
    nothing to run, so no step starts (the one under way finishes), no token is produced and no
    gauge or counter moves; the HTTP servers keep answering, ``/metrics`` included. It works on
    the replicas' public ``engine`` objects; call ``install`` again after a restart, which
    builds a new engine."""

    def __init__(self, fleet: FleetHandle) -> None:
        self.fleet = fleet
        self.frozen = False
        for replica in fleet.replicas:
            self.install(replica.engine)

    def install(self, engine: Any) -> None:
        """Wrap ``engine.schedule`` (an instance attribute shadows the method)."""
        original = type(engine).schedule

        def schedule(now: float) -> Any:
            return None if self.frozen else original(engine, now)

        engine.schedule = schedule

    def restart(self, index: int) -> None:
        """Restart replica ``index`` (counters start from zero) and keep it paused."""
        self.fleet.restart(index)
        self.install(self.fleet.replicas[index].engine)


# --- load -----------------------------------------------------------------------------------
@dataclass
class LoadStats:
    """What the client saw: requests sent, answered 2xx, failed (HTTP error or broken stream,
    e.g. by a restart), and cancelled by the client mid-stream (vLLM aborts those)."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    cancelled: int = 0
    giant: int = 0


_SYSTEM = "You are a concise assistant for an online shop. "
_FILLER = "Tell me about the KV cache, batching and tail latency of LLM serving. "


def _body(rng: random.Random, model: str, n: int, giant: bool) -> tuple[str, dict[str, Any]]:
    """One request (path, JSON): chat or completions, 250-1000 prompt tokens (4 characters a
    token in the simulator), 16-160 output tokens; a giant one has a 44,000-character prompt
    (11,000 tokens: the bucket (10000, 20000] of vLLM's token histograms)."""
    if giant:
        text = f"{n} " + _FILLER * (44_000 // len(_FILLER))
        return "/v1/completions", {"model": model, "prompt": text, "max_tokens": 8}
    text = f"{n} " + _FILLER * rng.randint(14, 55)
    body: dict[str, Any] = {"model": model, "max_tokens": rng.choice((16, 48, 96, 160)),
                            "stream": rng.random() < 0.5}
    if rng.random() < 0.7:
        body["messages"] = [{"role": "system", "content": _SYSTEM},
                            {"role": "user", "content": text}]
        return "/v1/chat/completions", body
    body["prompt"] = _SYSTEM + text
    return "/v1/completions", body


async def _send(client: httpx.AsyncClient, url: str, body: dict[str, Any], cancel_after: int,
                stats: LoadStats) -> None:
    stats.sent += 1
    try:
        if body.get("stream"):
            chunks = 0
            async with client.stream("POST", url, json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        chunks += 1
                        if cancel_after and chunks >= cancel_after:
                            # Tokens arrive only while the fleet runs, so the disconnect (and
                            # vLLM's abort) happens in a run phase, never inside a pause.
                            stats.cancelled += 1
                            return
            ok = resp.status_code == 200
        else:
            ok = (await client.post(url, json=body)).status_code == 200
        if ok:
            stats.ok += 1
        else:
            stats.failed += 1
    except httpx.HTTPError:
        stats.failed += 1


async def _sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        await asyncio.sleep(min(left, 0.05))


def drive_load(fleet: FleetHandle, freezer: FleetFreezer, schedule: Schedule,
               start_s: float, plan: Sequence[CyclePlan], *, seed: int = 7) -> LoadStats:
    """Run ``plan`` from ``start_s`` (Unix seconds), one cycle per entry, round-robin over the
    replicas; returns when the last cycle ends (in-flight requests are then cancelled). The
    fleet is left paused between cycles and at the end."""
    stats = LoadStats()
    model = fleet.replicas[0].served_model
    bases = fleet.base_urls

    async def run() -> None:
        rng = random.Random(seed)
        tasks: set[asyncio.Task[None]] = set()
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=5.0), limits=limits,
                                     trust_env=False) as client:
            n = 0
            for k, cycle in enumerate(plan):
                begin = start_s + k * schedule.cycle_s
                await _sleep_until(begin)
                if cycle.restart is not None:
                    # Mid-pause: both systems scrape the paused values before the restart
                    # and the zeroed ones after it, so the reset is the same on both sides.
                    await _sleep_until(begin + schedule.run_s / 2)
                    await asyncio.to_thread(freezer.restart, cycle.restart)
                    continue
                freezer.frozen = False
                arrivals: list[tuple[float, bool]] = []
                t = begin
                while (t := t + rng.expovariate(cycle.rate)) < begin + schedule.run_s - 0.1:
                    arrivals.append((t, False))
                arrivals += [(begin + 0.1 + 0.3 * i, True) for i in range(cycle.giant)]
                for at, giant in sorted(arrivals):
                    await _sleep_until(at)
                    path, body = _body(rng, model, n, giant)
                    cancel = rng.randint(2, 10) if body.get("stream") and rng.random() < 0.12 \
                        else 0
                    stats.giant += giant
                    task = asyncio.create_task(
                        _send(client, bases[n % len(bases)] + path, body, cancel, stats))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    n += 1
                await _sleep_until(begin + schedule.run_s)
                freezer.frozen = True
            await _sleep_until(start_s + len(plan) * schedule.cycle_s)
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    return stats


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
    config = workdir / "prometheus.yml"
    config.write_text("rule_files:\n"
                      f"- {json.dumps(str(rules_dir / FILE_SLO_RULES))}\n"
                      f"- {json.dumps(str(rules_dir / FILE_ALERT_RULES))}\n" + scrape)
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
        )
    server = PrometheusServer(process, f"http://127.0.0.1:{port}", workdir, log_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def slo_status(config_path: Path, at_s: float, prometheus_url: str = "") -> dict[str, Any]:
    """``vigil slo status --config F --json --at T [--prometheus URL]``, parsed."""
    from slo.cli import add_arguments, run

    parser = argparse.ArgumentParser(prog="vigil slo status")
    add_arguments(parser)
    argv = ["--config", str(config_path), "--json", "--at", repr(at_s)]
    if prometheus_url:
        argv += ["--prometheus", prometheus_url]
    out = io.StringIO()
    if run(parser.parse_args(argv), out=out) != 0:
        raise RuntimeError(f"vigil slo status {' '.join(argv)} failed")
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


# --- the samples each side holds ------------------------------------------------------------
SeriesId = tuple[str, Labels]
Samples = dict[SeriesId, tuple[np.ndarray, np.ndarray]]


def read_samples(source: Source, pool: str, at_s: float, span_s: float) -> Samples:
    """Every sample of the pool's vLLM series the status reads, through ``source`` (the same
    ``Source.samples`` the engine uses), over ``span_s`` seconds before ``at_s``."""
    out: Samples = {}
    for metric in (*COUNTERS, *GAUGES):
        found = source.samples(metric, {LABEL_POOL: pool, LABEL_KIND: KIND_VLLM}, at_s, span_s)
        for labels, points in found.items():
            ts = [p.ts_ms for p in points if p.value is not None]
            values = [float(p.value) for p in points if p.value is not None]
            out[(metric, labels)] = (np.array(ts, dtype=np.int64), np.array(values))
    return out


def _label(labels: Labels, name: str) -> str:
    return dict(labels).get(name, "")


def raw_change(vals: np.ndarray) -> float | None:
    """A counter's change between its first and last sample with resets added (a drop adds the
    value before it), no extrapolation: ``slo.anomaly.raw_increase`` on arrays, since the
    premise check runs it tens of thousands of times. None with fewer than 2 samples."""
    if len(vals) < 2:
        return None
    change = float(vals[-1] - vals[0])
    for i in np.flatnonzero(vals[1:] < vals[:-1]):
        change += float(vals[i])
    return change


@dataclass
class Sides:
    """The two systems' samples of the same pool: ``ours`` (the embedded store), ``theirs``
    (Prometheus), and the PromQL rules both evaluate by. Results are cached per instant and
    window: the comparisons ask for the same ones many times."""

    ours: Samples
    theirs: Samples
    semantics: str
    lookback_s: float
    _cache: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def side(self, which: str) -> Samples:
        return self.ours if which == "ours" else self.theirs

    def window(self, which: str, key: SeriesId, at_s: float,
               w: float) -> tuple[np.ndarray, np.ndarray]:
        ts, vals = self.side(which)[key]
        win = select_range(ts, vals, at_s, w, self.semantics)
        return win.ts_ms, win.values

    def counters(self, metrics: Iterable[str] = COUNTERS, **match: str) -> list[SeriesId]:
        """The counter series of ``metrics`` whose labels include ``match``."""
        wanted = set(metrics)
        return sorted(k for k in self.theirs if k[0] in wanted
                      and all(_label(k[1], n) == v for n, v in match.items()))

    def buckets_at(self, base: str, le: float, **match: str) -> list[SeriesId]:
        """The ``base_bucket`` series of bound ``le`` (parsed, so ``1`` is ``1.0``)."""
        return [k for k in self.counters((base + SUFFIX_BUCKET,), **match)
                if parse_le(_label(k[1], LABEL_LE)) == le]

    def change(self, which: str, key: SeriesId, at_s: float,
               w: float) -> tuple[float | None, float | None]:
        """``(raw change, extrapolated increase)`` of one counter series in the window."""
        cache_key = ("change", which, key, at_s, w)
        if cache_key not in self._cache:
            ts, vals = self.window(which, key, at_s, w)
            self._cache[cache_key] = (raw_change(vals),
                                      increase(ts, vals, at_s, w, self.semantics))
        result: tuple[float | None, float | None] = self._cache[cache_key]
        return result

    def spread(self, at_s: float, w: float, series: Iterable[SeriesId]) -> Spread:
        """The range of ``k_ours / k_theirs`` (the two sides' extrapolation factors) over the
        ``series`` with a raw change in the window (see the module docstring)."""
        keys = tuple(series)
        key = ("spread", at_s, w, keys)
        if key not in self._cache:
            rhos = []
            for one in keys:
                raw_o, inc_o = self.change("ours", one, at_s, w)
                raw_t, inc_t = self.change("theirs", one, at_s, w)
                if raw_o and raw_t and inc_o is not None and inc_t is not None:
                    rhos.append((inc_o / raw_o) / (inc_t / raw_t))
            self._cache[key] = Spread(min(rhos), max(rhos)) if rhos else Spread(1.0, 1.0)
        spread: Spread = self._cache[key]
        return spread

    def buckets(self, which: str, base: str, at_s: float, w: float,
                model: str | None = None) -> list[Bucket]:
        """``sum by (le) (increase(base_bucket[w]))`` from one side's samples (per model or
        pool-wide), in ``le`` order."""
        match = {} if model is None else {LABEL_MODEL_NAME: model}
        sums: dict[float, float] = {}
        for series in self.counters((base + SUFFIX_BUCKET,), **match):
            le = parse_le(_label(series[1], LABEL_LE))
            _, inc = self.change(which, series, at_s, w)
            if le is not None and inc is not None:
                sums[le] = sums.get(le, 0.0) + inc
        return sorted(sums.items())

    def quantile_bounds(self, q: float, base: str, at_s: float, w: float,
                        model: str | None = None) -> tuple[float, float, float] | None:
        """``(theirs, lo, hi)``: Prometheus's quantile recomputed from its samples and the
        interval ours must lie in; None without data.

        Each cumulative bucket count of ours is Prometheus's times a factor within the spread
        of its own series, and so is the total (the ``+Inf`` bucket): every bucket fraction
        lies within ``[lo_le / hi_inf, hi_le / lo_inf]`` of Prometheus's. The quantile falls
        as fractions rise, so the two extreme corners bound it."""
        match = {} if model is None else {LABEL_MODEL_NAME: model}
        buckets = self.buckets("theirs", base, at_s, w, model)
        if not buckets or buckets[-1][1] <= 0:
            return None
        value = histogram_quantile(q, buckets, self.semantics)
        if not math.isfinite(value):
            return None
        total = self.spread(at_s, w, self.buckets_at(base, math.inf, **match))
        up, down = [], []
        for le, count in buckets:
            if math.isinf(le):
                up.append((le, count))
                down.append((le, count))
                continue
            s = self.spread(at_s, w, self.buckets_at(base, le, **match))
            up.append((le, min(buckets[-1][1], count * s.hi / total.lo)))
            down.append((le, count * s.lo / total.hi))
        return (value, histogram_quantile(q, up, self.semantics),
                histogram_quantile(q, down, self.semantics))

    def bucket_bounds(self, bases: Iterable[str]) -> set[float]:
        """The finite ``le`` bounds of the given histograms."""
        names = {b + SUFFIX_BUCKET for b in bases}
        out = {parse_le(_label(labels, LABEL_LE)) for metric, labels in self.theirs
               if metric in names}
        return {le for le in out if le is not None and math.isfinite(le)}

    def gauge(self, which: str, key: SeriesId, at_s: float) -> float | None:
        ts, vals = self.side(which)[key]
        return instant_value(ts, vals, at_s, self.lookback_s, self.semantics)


@dataclass(frozen=True)
class Spread:
    """``lo <= k_ours(s) / k_theirs(s) <= hi`` for every counter series ``s`` of a window."""

    lo: float
    hi: float

    @property
    def ratio_widening(self) -> float:
        """How far a ratio of two sums of increases may move: a factor in ``[1/x, x]``."""
        return self.hi / self.lo


# --- the premise: nothing happened between the two systems' scrapes -------------------------
def edge_violations(sides: Sides, at_s: float, windows: Iterable[float],
                    probes: Iterable[float] = (), metrics: Iterable[str] = COUNTERS) -> list[str]:
    """Where the paused-world premise fails at ``at_s``: a series of ``metrics`` whose raw
    change in a window differs between the two systems (something happened between their
    scrapes at an edge), a series on one side only, or a gauge with different values at one
    of the ``probes`` instants."""
    out: list[str] = []
    if set(sides.ours) != set(sides.theirs):
        only = sorted(set(sides.ours) ^ set(sides.theirs))[:5]
        out.append(f"the two systems hold different series, e.g. {only}")
        return out
    for w in windows:
        for key in sides.counters(metrics):
            raw_o, _ = sides.change("ours", key, at_s, w)
            raw_t, _ = sides.change("theirs", key, at_s, w)
            if raw_o != raw_t:
                out.append(f"{key[0]}{dict(key[1])} over {w:g}s at {at_s:.3f}: raw change "
                           f"{raw_o} in the store, {raw_t} in Prometheus")
    for p in probes:
        for key in sorted(k for k in sides.theirs if k[0] in GAUGES):
            ours, theirs = sides.gauge("ours", key, p), sides.gauge("theirs", key, p)
            if ours != theirs:
                out.append(f"{key[0]}{dict(key[1])} at {p:.3f}: {ours} in the store, "
                           f"{theirs} in Prometheus")
    return out


def grid_jitter(ts_ms: np.ndarray, interval_s: float) -> float:
    """The largest distance (seconds) of a scrape instant from its scrape grid (the first
    instant plus whole intervals): both systems schedule on a grid, so this is their jitter."""
    step = interval_s * 1000
    offsets = (ts_ms - ts_ms[0] + step / 2) % step - step / 2
    return float(np.max(np.abs(offsets))) / 1000 if len(ts_ms) else 0.0


def idle_share_bound(sides: Sides, at_s: float, w: float, interval_s: float) -> float:
    """How far the two idle shares may differ at ``at_s`` over ``w``.

    The share is (samples with ``num_requests_running == 0``) / (samples). Both systems scrape
    each target on a grid of ``interval_s`` with jitter ``E`` (measured here), so in any
    stretch of time their sample counts differ by at most ``2 + ceil(4E / interval)``. Merging
    a target's samples of both sides in time order, the idle samples form runs; each run moves
    the difference of the idle counts by at most that much, and the totals differ by ``dn``:
    ``|z1/n1 - z2/n2| <= (|z1 - z2| + |n1 - n2|) / min(n1, n2)``.
    """
    runs = n_ours = n_theirs = 0
    jitter = 0.0
    for key in sorted(k for k in sides.theirs if k[0] == VLLM_REQUESTS_RUNNING):
        merged = []
        for which, tag in (("ours", 0), ("theirs", 1)):
            jitter = max(jitter, grid_jitter(sides.side(which)[key][0], interval_s))
            ts, vals = sides.window(which, key, at_s, w)
            merged += [(int(t), tag, float(v) == 0.0) for t, v in zip(ts, vals, strict=True)]
            if tag:
                n_theirs += len(ts)
            else:
                n_ours += len(ts)
        previous = False
        for _, _, idle in sorted(merged):
            runs += idle and not previous
            previous = idle
    n = min(n_ours, n_theirs)
    if n == 0:
        return 0.0
    per_run = 2 + math.ceil(4 * jitter / interval_s)
    return (per_run * runs + abs(n_ours - n_theirs)) / n


# --- comparing two status documents ---------------------------------------------------------
def key_paths(doc: Any, prefix: str = "") -> dict[str, str]:
    """Every key path of a JSON document with the kind of its value (``null``, ``number``,
    ``string``, ``bool``, ``list[n]``, ``object``)."""
    out: dict[str, str] = {}
    if isinstance(doc, Mapping):
        out[prefix or "."] = "object"
        for k, v in doc.items():
            out.update(key_paths(v, f"{prefix}.{k}"))
    elif isinstance(doc, list):
        out[prefix] = f"list[{len(doc)}]"
        for i, v in enumerate(doc):
            out.update(key_paths(v, f"{prefix}[{i}]"))
    elif doc is None:
        out[prefix] = "null"
    elif isinstance(doc, bool):
        out[prefix] = "bool"
    elif isinstance(doc, int | float):
        out[prefix] = "number"
    else:
        out[prefix] = "string"
    return out


def structure_differences(ours: Any, theirs: Any, excused: Iterable[str] = ()) -> list[str]:
    """Key paths present on one side only, or null on one side only (``excused`` prefixes
    aside: values the tolerance found ambiguous)."""
    a, b = key_paths(ours), key_paths(theirs)
    skip = tuple(excused)
    out = []
    for path in sorted(set(a) | set(b)):
        if skip and path.startswith(skip):
            continue
        if path not in a or path not in b:
            out.append(f"{path}: only in {'the store' if path in a else 'Prometheus'}")
        elif (a[path] == "null") != (b[path] == "null") or a[path] != b[path]:
            out.append(f"{path}: {a[path]} from the store, {b[path]} from Prometheus")
    return out


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _masked(text: Any) -> Any:
    return _NUMBER.sub("#", text) if isinstance(text, str) else text


@dataclass
class Checker:
    """Collects the comparisons of one status pair: ``failures`` (one message per key path),
    ``ambiguous`` (paths whose discrete outcome the tolerance cannot decide), ``compared``."""

    failures: list[str] = field(default_factory=list)
    ambiguous: list[str] = field(default_factory=list)
    compared: int = 0
    exact: int = 0

    def same(self, path: str, ours: Any, theirs: Any) -> None:
        """Must be equal (numbers to the last bit)."""
        self.compared += 1
        self.exact += 1
        if ours != theirs:
            self.failures.append(f"{path}: {ours!r} from the store, {theirs!r} from Prometheus "
                                 "(must be equal)")

    def within(self, path: str, ours: Any, theirs: Any, lo: float, hi: float,
               why: str) -> None:
        """``ours`` must lie in ``[lo, hi]`` (widened by float rounding); null on both sides
        passes, null on one side fails."""
        self.compared += 1
        if ours is None or theirs is None:
            if (ours is None) != (theirs is None):
                self.failures.append(f"{path}: {ours!r} from the store, {theirs!r} from "
                                     "Prometheus (null on one side only)")
            return
        lo, hi = min(lo, hi), max(lo, hi)
        eps = REL_EPS * max(abs(lo), abs(hi), 1e-12)
        if not lo - eps <= ours <= hi + eps:
            self.failures.append(
                f"{path}: {ours!r} from the store, {theirs!r} from Prometheus; allowed "
                f"[{lo!r}, {hi!r}] ({why})")


def _scaled(x: float | None, lo: float, hi: float) -> tuple[float, float]:
    return (0.0, 0.0) if x is None else (x * lo, x * hi)


@dataclass(frozen=True)
class TtftTrend:
    """Prometheus's TTFT p95 now ``(value, lo, hi)`` and its fitted line ``(slope, slope
    tolerance, projection, projection tolerance)``; either None without data."""

    now: tuple[float, float, float] | None
    line: tuple[float, float, float, float] | None

    def undecided(self, threshold: float) -> bool:
        """Whether the tolerance leaves open if TTFT is over ``threshold`` now or projected
        over it with a rising trend."""
        if self.now is not None and self.now[1] <= threshold <= self.now[2]:
            return True
        if self.line is None:
            return False
        slope, d_slope, projected, d_proj = self.line
        return (slope - d_slope <= 0 <= slope + d_slope
                or projected - d_proj <= threshold <= projected + d_proj)


class StatusComparison:
    """Compares ``vigil slo status`` from the store (``ours``) with the one from Prometheus
    (``theirs``) at ``at_s``, number by number, with the tolerance of the module docstring."""

    def __init__(self, config: Config, sides: Sides, at_s: float) -> None:
        self.config = config
        self.sides = sides
        self.at = at_s
        self.check = Checker()

    # -- bounds by kind of number ----------------------------------------------------------
    def sum_of_increases(self, path: str, ours: Any, theirs: Any, w: float,
                         series: Sequence[SeriesId]) -> None:
        s = self.sides.spread(self.at, w, series)
        lo, hi = _scaled(theirs, s.lo, s.hi)
        self.check.within(path, ours, theirs, lo, hi, f"a sum of increases over {w:g}s: "
                          f"extrapolation factors differ by x[{s.lo:.6f}, {s.hi:.6f}]")

    def per_increase(self, path: str, ours: Any, theirs: Any, w: float,
                     series: Sequence[SeriesId]) -> None:
        """``x / sum of increases`` (a cost per request)."""
        s = self.sides.spread(self.at, w, series)
        lo, hi = _scaled(theirs, 1 / s.hi, 1 / s.lo)
        self.check.within(path, ours, theirs, lo, hi, f"per increase over {w:g}s")

    def ratio_bounds(self, theirs: float, w: float, num: Sequence[SeriesId],
                     den: Sequence[SeriesId]) -> tuple[float, float]:
        """A ratio of two sums of increases: each moves within the spread of its series."""
        n, d = self.sides.spread(self.at, w, num), self.sides.spread(self.at, w, den)
        return theirs * n.lo / d.hi, theirs * n.hi / d.lo

    def ratio(self, path: str, ours: Any, theirs: Any, w: float, num: Sequence[SeriesId],
              den: Sequence[SeriesId]) -> None:
        lo, hi = (0.0, 0.0) if theirs is None else self.ratio_bounds(theirs, w, num, den)
        self.check.within(path, ours, theirs, lo, hi, f"a ratio of increases over {w:g}s")

    def error_ratio_bounds(self, spec: SloSpec, theirs: float, w: float) -> tuple[float, float]:
        """The interval of an SLO's error ratio: ``bad / total`` for the error rate; ``1 - good
        fraction`` for latency, the good count being made of the buckets around the threshold;
        availability exact (``up`` never changes here)."""
        if spec.indicator == "availability":
            return theirs, theirs
        model = {LABEL_MODEL_NAME: spec.model}
        if spec.indicator == "error_rate":
            total = self.sides.counters((VLLM_REQUEST_SUCCESS,), **model)
            bad = self.sides.counters((VLLM_REQUEST_SUCCESS,), **model,
                                      **{LABEL_FINISHED_REASON: FINISHED_REASON_ERROR})
            return self.ratio_bounds(theirs, w, bad, total)
        base = VLLM_TTFT if spec.indicator == "ttft" else VLLM_E2E
        threshold = float(spec.threshold_seconds or 0.0)
        bounds = sorted(self.sides.bucket_bounds((base,)))
        around = [max((b for b in bounds if b < threshold), default=None),
                  min((b for b in bounds if b >= threshold), default=None)]
        good = [k for le in around if le is not None
                for k in self.sides.buckets_at(base, le, **model)]
        total = self.sides.buckets_at(base, math.inf, **model)
        good_lo, good_hi = self.ratio_bounds(1.0 - theirs, w, good, total)
        return 1.0 - min(1.0, good_hi), 1.0 - good_lo

    def quantile(self, path: str, ours: Any, theirs: Any, q: float, base: str, w: float,
                 model: str | None, at_s: float | None = None) -> tuple[float, float] | None:
        at = self.at if at_s is None else at_s
        bounds = self.sides.quantile_bounds(q, base, at, w, model)
        if bounds is None:
            self.check.within(path, ours, theirs, math.nan, math.nan, "no data")
            return None
        value, lo, hi = bounds
        if theirs is not None:
            # Our recomputation from Prometheus's own samples is what Prometheus answered.
            self.check.within(path + " (recomputed from Prometheus's samples)", value, theirs,
                              theirs, theirs, "the same samples")
        self.check.within(path, ours, theirs, lo, hi,
                          f"histogram_quantile({q}), every bucket fraction within the "
                          "spread of its series over the +Inf bucket's")
        return lo, hi

    # -- the document ----------------------------------------------------------------------
    def run(self, ours: dict[str, Any], theirs: dict[str, Any]) -> Checker:
        self.check.same(".source", (ours.get("source"), theirs.get("source")),
                        ("embedded", "prometheus"))
        for key in ("at", "promql_semantics", "window"):
            self.check.same(f".{key}", ours.get(key), theirs.get(key))
        for name in sorted(set(ours["pools"]) | set(theirs["pools"])):
            self.pool(f".pools.{name}", name, ours["pools"].get(name), theirs["pools"].get(name))
        self.slos(ours["slos"], theirs["slos"])
        self.anomalies(ours["anomalies"], theirs["anomalies"])
        rest = set(ours) | set(theirs)
        rest -= {"source", "at", "promql_semantics", "window", "pools", "slos", "anomalies"}
        for key in sorted(rest):
            self.check.same(f".{key}", ours.get(key), theirs.get(key))
        return self.check

    def pool(self, path: str, name: str, ours: Any, theirs: Any) -> None:
        if not isinstance(ours, dict) or not isinstance(theirs, dict):
            self.check.same(path, ours, theirs)
            return
        w = self.config.engine.window
        for model in sorted(set(ours["models"]) | set(theirs["models"])):
            a, b = ours["models"].get(model), theirs["models"].get(model)
            mpath = f"{path}.models.{model}"
            if a is None or b is None:
                self.check.same(mpath, a, b)
                continue
            self.model(mpath, model, a, b, w)
        kv_o, kv_t = ours["kv_cache_usage"], theirs["kv_cache_usage"]
        self.check.same(f"{path}.kv_cache_usage", kv_o, kv_t)
        for key in ("queue_length", "replicas_up"):
            self.check.same(f"{path}.{key}", ours[key], theirs[key])
        self.cost(f"{path}.cost", ours["cost"], theirs["cost"])
        self.scaling(f"{path}.scaling", name, ours["scaling"], theirs["scaling"])
        rest = (set(ours) | set(theirs)) - {"models", "kv_cache_usage", "queue_length",
                                            "replicas_up", "cost", "scaling"}
        for key in sorted(rest):
            self.check.same(f"{path}.{key}", ours.get(key), theirs.get(key))

    def model(self, path: str, model: str, ours: dict[str, Any], theirs: dict[str, Any],
              w: float) -> None:
        bases = {"ttft_seconds": VLLM_TTFT, "e2e_seconds": VLLM_E2E,
                 "queue_seconds": VLLM_QUEUE_TIME, "itl_seconds": VLLM_ITL}
        q_o, q_t = ours["quantiles"], theirs["quantiles"]
        for key in sorted(set(q_o) | set(q_t)):
            if key in bases and isinstance(q_o.get(key), dict):
                for qk in sorted(set(q_o[key]) | set(q_t[key])):
                    q = float(qk[1:]) / 100
                    self.quantile(f"{path}.quantiles.{key}.{qk}", q_o[key].get(qk),
                                  q_t[key].get(qk), q, bases[key], w, model)
            else:
                self.check.same(f"{path}.quantiles.{key}", q_o.get(key), q_t.get(key))
        tokens = {"generated": VLLM_GENERATION_TOKENS_HIST, "prompt": VLLM_PROMPT_TOKENS_HIST}
        t_o, t_t = ours["tokens_per_request"], theirs["tokens_per_request"]
        for key in sorted(set(t_o) | set(t_t)):
            a, b = t_o.get(key) or {}, t_t.get(key) or {}
            if key not in tokens:
                self.check.same(f"{path}.tokens_per_request.{key}", a, b)
                continue
            match = {LABEL_MODEL_NAME: model}
            self.ratio(f"{path}.tokens_per_request.{key}.mean", a.get("mean"), b.get("mean"), w,
                       self.sides.counters((tokens[key] + SUFFIX_SUM,), **match),
                       self.sides.counters((tokens[key] + SUFFIX_COUNT,), **match))
            self.quantile(f"{path}.tokens_per_request.{key}.p95", a.get("p95"), b.get("p95"),
                          0.95, tokens[key], w, model)
        for key in sorted((set(ours) | set(theirs)) - {"quantiles", "tokens_per_request"}):
            self.check.same(f"{path}.{key}", ours.get(key), theirs.get(key))

    def cost(self, path: str, ours: dict[str, Any], theirs: dict[str, Any]) -> None:
        w = self.config.engine.cost_window
        metric = {"requests": VLLM_REQUEST_SUCCESS, "output_tokens": VLLM_GENERATION_TOKENS,
                  "per_1000_requests": VLLM_REQUEST_SUCCESS,
                  "per_million_output_tokens": VLLM_GENERATION_TOKENS}
        for key in ("requests", "output_tokens"):
            self.sum_of_increases(f"{path}.{key}", ours[key], theirs[key], w,
                                  self.sides.counters((metric[key],)))
        for model in sorted(set(ours["models"]) | set(theirs["models"])):
            a, b = ours["models"].get(model) or {}, theirs["models"].get(model) or {}
            for key in sorted(set(a) | set(b)):
                series = self.sides.counters((metric.get(key, ""),), **{LABEL_MODEL_NAME: model})
                self.sum_of_increases(f"{path}.models.{model}.{key}", a.get(key), b.get(key), w,
                                      series)
        for key in ("per_1000_requests", "per_million_output_tokens"):
            self.per_increase(f"{path}.{key}", ours[key], theirs[key], w,
                              self.sides.counters((metric[key],)))
        interval = max(self.config.scrape_interval(t) for t in self.config.targets)
        bound = idle_share_bound(self.sides, self.at, w, interval)
        idle = theirs["idle_share"]
        lo, hi = (0.0, 0.0) if idle is None else (idle - bound, idle + bound)
        self.check.within(f"{path}.idle_share", ours["idle_share"], idle, lo, hi,
                          "idle samples counted at different instants (idle_share_bound)")
        cost = theirs["cost_usd"]
        self.check.within(f"{path}.idle_cost_usd", ours["idle_cost_usd"],
                          theirs["idle_cost_usd"], (cost or 0.0) * lo, (cost or 0.0) * hi,
                          "cost_usd x idle_share")
        done = {"requests", "output_tokens", "models", "per_1000_requests",
                "per_million_output_tokens", "idle_share", "idle_cost_usd"}
        # gpu_hours and cost_usd come from avg_over_time(up), constant here: equal.
        for key in sorted((set(ours) | set(theirs)) - done):
            self.check.same(f"{path}.{key}", ours.get(key), theirs.get(key))

    def ttft_trend(self) -> TtftTrend:
        """Prometheus's TTFT p95 timeline of the scaling advice, recomputed from its samples,
        and how far ours may be from it: each point within its quantile interval, carried
        through the least-squares line (linear in the points' values) with its coefficients."""
        w = self.config.engine.window
        fit = fit_window_for(self.config.scaling)
        spinup = float(self.config.scaling.spinup)
        points, pts = [], []
        for t in sample_times(self.at, fit, self.config.collector.scrape_interval):
            bounds = self.sides.quantile_bounds(0.95, VLLM_TTFT, t, w)
            if bounds is not None:
                value, lo, hi = bounds
                points.append((t, value))
                pts.append((t - self.at, max(abs(value - lo), abs(hi - value))))
        now = self.sides.quantile_bounds(0.95, VLLM_TTFT, self.at, w)
        fitted = trend(points, self.at, fit)
        if fitted is None:
            return TtftTrend(now, None)
        n = len(pts)
        mx = math.fsum(x for x, _ in pts) / n
        sxx = math.fsum((x - mx) ** 2 for x, _ in pts)
        d_slope = math.fsum(abs(x - mx) * d for x, d in pts) / sxx
        d_proj = math.fsum(abs(1 / n + (x - mx) * (spinup - mx) / sxx) * d for x, d in pts)
        projected = fitted.at_now + fitted.slope_per_s * spinup
        return TtftTrend(now, (fitted.slope_per_s, d_slope, projected, d_proj))

    def scaling(self, path: str, pool: str, ours: Any, theirs: Any) -> None:
        if not isinstance(ours, dict) or not isinstance(theirs, dict):
            self.check.same(path, ours, theirs)
            return
        w = self.config.engine.window
        ttft = "ttft_p95_seconds"
        sig_o, sig_t = ours["signals"], theirs["signals"]
        self.quantile(f"{path}.signals.{ttft}", sig_o.get(ttft), sig_t.get(ttft), 0.95,
                      VLLM_TTFT, w, None)
        for key in sorted((set(sig_o) | set(sig_t)) - {ttft}):
            self.check.same(f"{path}.signals.{key}", sig_o.get(key), sig_t.get(key))
        tt = self.ttft_trend()
        threshold = float(self.config.scaling.scale_out_ttft_ratio) * ttft_threshold_for(
            self.config, self.config.pool(pool))
        det_o = {d["signal"]: d for d in ours["reason_details"]}
        det_t = {d["signal"]: d for d in theirs["reason_details"]}
        if (ttft in det_o) != (ttft in det_t) and tt.undecided(threshold):
            # Whether TTFT is a reason at all is not decided within the tolerance.
            self.check.ambiguous.append(path)
            return
        self.check.same(f"{path}.reason_details[].signal", sorted(det_o), sorted(det_t))
        for signal in sorted(set(det_o) & set(det_t)):
            a, b = det_o[signal], det_t[signal]
            dpath = f"{path}.reason_details[{signal}]"
            if signal == ttft:
                self.ttft_reason(dpath, a, b, tt)
            else:
                self.check.same(dpath, a, b)
        masked = ([_masked(t) for t in ours["reasons"]], [_masked(t) for t in theirs["reasons"]])
        self.check.same(f"{path}.reasons (numbers masked)", *masked)
        for key in sorted((set(ours) | set(theirs)) - {"signals", "reason_details", "reasons"}):
            # current and the action come from up and the (equal) KV and queue timelines;
            # desired too here: any scale-out asks for max_replicas (current + 1).
            self.check.same(f"{path}.{key}", ours.get(key), theirs.get(key))

    def ttft_reason(self, path: str, a: dict[str, Any], b: dict[str, Any],
                    tt: TtftTrend) -> None:
        """The TTFT reason: its value is the p95 now, its trend and projection the line's."""
        lo, hi = (math.nan, math.nan) if tt.now is None else tt.now[1:]
        self.check.within(f"{path}.value", a["value"], b["value"], lo, hi, "the TTFT p95 now")
        if tt.line is None or b["trend_per_s"] is None:
            for key in ("trend_per_s", "projected"):
                self.check.same(f"{path}.{key}", a[key], b[key])
        else:
            slope, d_slope, projected, d_proj = tt.line
            self.check.within(f"{path}.trend_per_s (recomputed from Prometheus's samples)",
                              slope, b["trend_per_s"], b["trend_per_s"], b["trend_per_s"],
                              "the same samples")
            self.check.within(f"{path}.trend_per_s", a["trend_per_s"], b["trend_per_s"],
                              slope - d_slope, slope + d_slope, "least squares over the TTFT "
                              "timeline, each point within its quantile interval")
            self.check.within(f"{path}.projected", a["projected"], b["projected"],
                              projected - d_proj, projected + d_proj,
                              "the fitted line at now + spinup")
        for key in ("signal", "threshold", "comparison", "horizon_s", "window_s"):
            self.check.same(f"{path}.{key}", a[key], b[key])
        self.check.same(f"{path}.text (numbers masked)", _masked(a["text"]), _masked(b["text"]))

    def slos(self, ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
        specs = {s.name: s for s in effective_slos(self.config)}
        if [s["name"] for s in ours] != [s["name"] for s in theirs]:
            self.check.same(".slos[].name", [s["name"] for s in ours], [s["name"] for s in theirs])
            return
        table = self.config.engine.burn_rate_alerts
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            path = f".slos[{i}]"
            spec = specs[b["name"]]
            budget = 1.0 - spec.objective
            bounds: dict[float, tuple[float, float]] = {}
            for key in sorted(set(a["windows"]) | set(b["windows"])):
                w = parse_duration(key)
                wa, wb = a["windows"].get(key) or {}, b["windows"].get(key) or {}
                err = wb.get("error_ratio")
                lo, hi = (0.0, 0.0) if err is None else \
                    self.error_ratio_bounds(spec, err, w)
                bounds[w] = (lo / budget, hi / budget)
                why = f"{spec.indicator} error ratio over {key}"
                self.check.within(f"{path}.windows.{key}.error_ratio", wa.get("error_ratio"),
                                  err, lo, hi, why)
                self.check.within(f"{path}.windows.{key}.burn_rate", wa.get("burn_rate"),
                                  wb.get("burn_rate"), lo / budget, hi / budget, why)
            perr = b["period_error_ratio"]
            lo, hi = (0.0, 0.0) if perr is None else \
                self.error_ratio_bounds(spec, perr, spec.period_s)
            why = f"{spec.indicator} error ratio over the period"
            self.check.within(f"{path}.period_error_ratio", a["period_error_ratio"], perr, lo, hi,
                              why)
            self.check.within(f"{path}.sli", a["sli"], b["sli"], 1 - hi, 1 - lo, why)
            b_lo, b_hi = 1 - hi / budget, 1 - lo / budget
            self.check.within(f"{path}.budget_remaining", a["budget_remaining"],
                              b["budget_remaining"], b_lo, b_hi, why)
            self.exhaustion(path, a, b, spec.period_s, (b_lo, b_hi))
            alerts_undecided = any(
                lo_ <= row.factor <= hi_
                for row in table for w_ in (row.long_window, row.short_window)
                for lo_, hi_ in [bounds.get(w_, (math.nan, math.nan))])
            if a["alerts"] != b["alerts"] and alerts_undecided:
                self.check.ambiguous.append(f"{path}.alerts")
            else:
                self.check.same(f"{path}.alerts", a["alerts"], b["alerts"])
            cur_a, cur_b = a["current"], b["current"]
            err = cur_b["error_ratio"]
            w = self.config.engine.window
            lo, hi = (0.0, 0.0) if err is None else self.error_ratio_bounds(spec, err, w)
            self.check.within(f"{path}.current.error_ratio", cur_a["error_ratio"], err, lo, hi,
                              "the current window")
            self.check.within(f"{path}.current.sli", cur_a["sli"], cur_b["sli"], 1 - hi, 1 - lo,
                              "the current window")
            self.check.same(f"{path}.current.window", cur_a["window"], cur_b["window"])
            done = {"windows", "period_error_ratio", "sli", "budget_remaining",
                    "time_to_exhaustion_seconds", "alerts", "current"}
            for key in sorted((set(a) | set(b)) - done):
                self.check.same(f"{path}.{key}", a.get(key), b.get(key))

    def exhaustion(self, path: str, a: dict[str, Any], b: dict[str, Any], period_s: float,
                   budget: tuple[float, float]) -> None:
        """``budget_remaining x period / burn_rate(1h)``, both intervals carried through (the
        1 h burn rate is not in the JSON: it is recovered from Prometheus's own figures)."""
        key = f"{path}.time_to_exhaustion_seconds"
        ours, theirs = a["time_to_exhaustion_seconds"], b["time_to_exhaustion_seconds"]
        if theirs is None or b["budget_remaining"] is None:
            undecided = budget[0] <= 0 <= budget[1]
            if ours is not None and undecided:
                self.check.ambiguous.append(key)
            else:
                self.check.same(key, ours, theirs)
            return
        slo_budget = 1 - b["objective"]
        burn = b["budget_remaining"] * period_s / theirs
        spec = next(s for s in effective_slos(self.config) if s.name == b["name"])
        lo, hi = self.error_ratio_bounds(spec, burn * slo_budget, 3600.0)
        burn_lo, burn_hi = lo / slo_budget, hi / slo_budget
        if ours is None and (budget[0] <= 0 or burn_lo <= 0):
            self.check.ambiguous.append(key)
            return
        self.check.within(key, ours, theirs, budget[0] * period_s / burn_hi,
                          budget[1] * period_s / burn_lo,
                          "budget_remaining x period / burn_rate(1h)")

    def anomalies(self, ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
        def key(a: dict[str, Any]) -> tuple[str, str, str]:
            return a["kind"], a["pool"], a["model"]

        by_o, by_t = {key(a): a for a in ours}, {key(a): a for a in theirs}
        w = self.config.anomaly.window
        for k in sorted(set(by_o) | set(by_t)):
            path = f".anomalies[{'/'.join(k)}]"
            a, b = by_o.get(k), by_t.get(k)
            if a is None or b is None:
                self.check.same(path, a, b)
                continue
            match = {LABEL_MODEL_NAME: b["model"]}
            sums = self.sides.counters((VLLM_PROMPT_TOKENS_HIST + SUFFIX_SUM,
                                        VLLM_GENERATION_TOKENS_HIST + SUFFIX_SUM), **match)
            counts = self.sides.counters((VLLM_GENERATION_TOKENS_HIST + SUFFIX_COUNT,), **match)
            lo, hi = self.ratio_bounds(b["threshold_tokens"], w, sums, counts)
            self.ratio(f"{path}.mean_tokens_per_request", a["mean_tokens_per_request"],
                       b["mean_tokens_per_request"], w, sums, counts)
            self.check.within(f"{path}.threshold_tokens", a["threshold_tokens"],
                              b["threshold_tokens"], lo, hi, "multiplier x mean")
            self.sum_of_increases(f"{path}.requests", a["requests"], b["requests"], w, counts)
            # Which buckets lie wholly above the threshold is discrete: decided unless a
            # bucket bound lies inside the threshold's interval.
            bounds = self.sides.bucket_bounds((VLLM_PROMPT_TOKENS_HIST,
                                               VLLM_GENERATION_TOKENS_HIST))
            if any(lo <= x <= hi for x in bounds) and a["by_histogram"] != b["by_histogram"]:
                self.check.ambiguous.append(path)
                continue
            for field_ in ("by_histogram", "requests_above", "kind", "pool", "model", "window",
                           "tokens", "token_multiplier"):
                self.check.same(f"{path}.{field_}", a[field_], b[field_])
            self.check.same(f"{path}.note (numbers masked)", _masked(a["note"]),
                            _masked(b["note"]))


def compare_status(config: Config, sides: Sides, at_s: float, ours: dict[str, Any],
                   theirs: dict[str, Any]) -> Checker:
    """Compare the store's and Prometheus's status at ``at_s`` (see ``StatusComparison``)."""
    return StatusComparison(config, sides, at_s).run(ours, theirs)


def status_windows(config: Config) -> list[float]:
    """Every window the status evaluates (seconds): burn windows, periods, the current, cost
    and anomaly windows, and the 1 h of the time to exhaustion."""
    windows = set(burn_windows(config.engine.burn_rate_alerts))
    windows |= {s.period_s for s in effective_slos(config)}
    windows |= {config.engine.window, config.engine.cost_window, config.anomaly.window, 3600.0}
    return sorted(windows)


def probe_times(config: Config, at_s: float) -> list[float]:
    """The instants the status reads gauges at: ``at_s`` and the scaling timelines' points."""
    span = max(float(config.scaling.scale_in_hold), fit_window_for(config.scaling))
    return sample_times(at_s, span, config.collector.scrape_interval)


def first_scrapes(samples: Samples) -> dict[str, int]:
    """Per target (``instance``), its first ``up`` sample (Unix ms)."""
    return {_label(labels, LABEL_INSTANCE): int(ts[0])
            for (metric, labels), (ts, _) in samples.items() if metric == SERIES_UP and len(ts)}


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll ``check`` until true; RuntimeError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.1)
