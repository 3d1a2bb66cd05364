"""What one SLO evaluation costs a Prometheus: samples touched and time, raw vs recorded.

Run: ``.venv/bin/python bench/prometheus_scale_bench.py [--replicas 20,100] [--days 7]
[--step 60] [--repeat 3] [--data DIR]``

1. Generates one pool (``chat``, one model) of N vLLM replicas as a Prometheus scraping them
   with the jobs ``vigil rules prometheus`` writes stores them (``job="vigil-chat-NNN"``,
   ``instance``, ``pool``, ``kind``, vLLM's ``engine`` and ``model_name``): every family the
   status reads (the six histograms with vLLM 0.33's bucket bounds, ``request_success_total``
   per finish reason, token counters, ``http_requests_total`` per handler, method and status,
   the gauges, ``up``), one sample every ``--step`` seconds, each replica at its own scrape
   phase, over ``--days`` days and an hour. It is streamed as OpenMetrics, one file per
   18-hour block, into ``promtool tsdb create-blocks-from openmetrics``.
2. Starts Prometheus on those blocks with the generated ``vigil-slo-rules.yml`` loaded and
   backfills the recorded series (``promtool tsdb create-blocks-from rules``) over the 30
   minutes before the evaluation instant, then restarts it on the data directory so that it
   serves them, and waits until it has merged the overlapping blocks.
3. Evaluates ``slo.status.evaluate`` at the end of the data through the ``PrometheusSource``
   ``open_source`` opens, with ``[engine] recorded_rules = "off"`` (every SLO window a raw
   ``sum(increase(...))``) and ``"auto"`` (the recorded series). A response hook on the
   source's session reads ``stats=all``'s ``samples`` of every query: the samples each
   evaluation touches (``totalQueryableSamples``, summed) and the most any query held at once
   (``peakSamples``). Then times ``--repeat`` evaluations without the stats parameter (as
   ``vigil serve`` sends them) and keeps the best.
4. Prints a Markdown table and the extrapolation to 500 replicas x 30 days: each query's
   samples are its series times the samples per series in its window, so a query over the
   SLO period grows with replicas and period, every other query with replicas only.

The SLO period is ``--days`` (7d by default) so that the raw period query reads the whole
backfill. A raw evaluation past ``--query.max-samples`` is reported with Vigil's message and
measured again on a Prometheus with the limit raised. Generated data is cached in ``--data``
per size and version of the generated rules (default: the repository's
``build/prometheus-scale-bench``). Not part of the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import slo_bench  # noqa: E402
from processes import free_port, stop, wait_http  # noqa: E402

from alerts.rules.pipeline import generate  # noqa: E402
from slo.sources.open import open_source  # noqa: E402
from slo.sources.prometheus import PrometheusSource  # noqa: E402
from slo.status import evaluate  # noqa: E402
from vigil.config import Config, EngineConfig, load_config  # noqa: E402
from vigil.conventions import FILE_SLO_RULES  # noqa: E402
from vigil.errors import SourceError  # noqa: E402

#: Bump when the generated data changes, so stale caches are rebuilt.
DATA_VERSION = 1
SEED = 20261206
H_S = 3600
DAY_S = 86400
#: The evaluation instant: a fixed past hour, so every run builds identical data.
AT_S = 1_760_000_000 // H_S * H_S
POOL = slo_bench.POOL
MODEL = slo_bench.MODEL
#: One OpenMetrics file and one TSDB block per 18 h (2 h x 3^2, a range Prometheus's own
#: compactor makes): promtool re-reads its whole input for every block it cuts.
BLOCK_S = 18 * H_S
#: The recorded series are backfilled over this long before the evaluation instant.
RULES_BACKFILL_S = 30 * 60
#: Prometheus's default --query.max-samples, and the limit of the second run when a raw
#: evaluation passes it.
DEFAULT_MAX_SAMPLES = 50_000_000
RAISED_MAX_SAMPLES = 1_000_000_000
#: The limits the extrapolation is compared with.
VM_MAX_SAMPLES_PER_QUERY = 1_000_000_000
#: Requests a replica finishes per second at full load (the load is diurnal, 15-95 %).
REQUESTS_PER_S = 4.0
#: vLLM's http_requests_total series (prometheus_fastapi_instrumentator's handler, method and
#: status) and each one's share of the requests; the availability SLO counts POST 5xx.
HTTP_SERIES = (
    ("/v1/chat/completions", "POST", "2xx", 0.93),
    ("/v1/chat/completions", "POST", "4xx", 0.008),
    ("/v1/chat/completions", "POST", "5xx", 0.002),
    ("/v1/completions", "POST", "2xx", 0.06),
    ("/v1/models", "GET", "2xx", 0.01),
    ("/health", "GET", "2xx", 0.05),
)
_RANGE_RE = re.compile(r"\[(\d+)ms\]")


@dataclass(frozen=True)
class Size:
    replicas: int
    days: float
    step_s: int

    @property
    def name(self) -> str:
        return f"{self.replicas}r-{self.days:g}d-{self.step_s}s"

    @property
    def start_s(self) -> int:
        # An hour more than the period, so the period window is full at the evaluation.
        return AT_S - int(self.days * DAY_S) - H_S

    def stamps(self, r: int) -> np.ndarray:
        """Replica ``r``'s scrape times (whole seconds): every ``step_s`` from its own phase,
        the last within one step before ``AT_S``, as Prometheus spreads its targets."""
        phase = (r * 7) % self.step_s
        last = AT_S - self.step_s + phase
        first = last - (last - self.start_s) // self.step_s * self.step_s
        return np.arange(first, last + 1, self.step_s, dtype=np.int64)


# --- the series -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Series:
    name: str
    labels: dict[str, str]
    #: Whether the values are a counter's running total (carried from block to block).
    counter: bool


def _le(bounds: tuple[float, ...] | list[float]) -> list[str]:
    return slo_bench._le(bounds)


def replica_layout(r: int) -> list[Series]:
    """Every series replica ``r`` has in Prometheus, in file order (grouped by name)."""
    target = {"job": f"vigil-{POOL}-{r:03d}", "instance": f"{POOL}-{r:03d}", "pool": POOL,
              "kind": "vllm"}
    vllm = {**target, "engine": "0", "model_name": MODEL}
    out = [Series("up", target, False)]
    for gauge in ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
                  "vllm:num_requests_running"):
        out.append(Series(gauge, vllm, False))
    out += [Series("vllm:request_success_total", {**vllm, "finished_reason": reason}, True)
            for reason in slo_bench.FINISHED]
    out += [Series(name, vllm, True) for name in (
        "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")]
    out += [Series("http_requests_total",
                   {**target, "handler": handler, "method": method, "status": status}, True)
            for handler, method, status, _ in HTTP_SERIES]
    for base, (bounds, _median, _sigma) in slo_bench.HISTOGRAMS.items():
        out += [Series(base + "_bucket", {**vllm, "le": le}, True) for le in bounds]
        out += [Series(base + "_sum", vllm, True), Series(base + "_count", vllm, True)]
    return out


def block_increments(r: int, size: Size, ts: np.ndarray, block: int) -> np.ndarray:
    """``(series, samples)``: each counter's increments over the scrapes ``ts`` and each
    gauge's values, in ``replica_layout`` order. Seeded per replica and block, so a block can
    be generated without the ones before it (counters are carried by the caller)."""
    rng = np.random.default_rng([SEED, r, block])
    n = len(ts)
    phase = ts / DAY_S + r / 17.0
    load = np.clip(0.55 + 0.4 * np.sin(2 * np.pi * phase) + rng.normal(0, 0.03, n), 0.05, 1.0)
    rows: list[np.ndarray] = [np.ones(n)]
    rows.append(np.round(np.clip(load * 0.9 + rng.normal(0, 0.05, n), 0, 1), 4))
    rows.append(rng.poisson(3 * load).astype(float))
    rows.append(rng.poisson(12 * load).astype(float))
    requests_ = rng.poisson(REQUESTS_PER_S * size.step_s * load)
    by_reason = np.stack([rng.binomial(requests_, p) for p in slo_bench.FINISHED_SHARE[1:]])
    by_reason = np.minimum(by_reason, requests_)
    rows.append(np.maximum(requests_ - by_reason.sum(axis=0), 0).astype(float))
    rows += [row.astype(float) for row in by_reason]
    prompt = rng.poisson(450.0 * requests_)
    queries = prompt + rng.poisson(20.0 * requests_)
    rows += [rng.poisson(180.0 * requests_).astype(float), prompt.astype(float),
             queries.astype(float), rng.binomial(queries, 0.4).astype(float)]
    for *_, share in HTTP_SERIES:
        rows.append(rng.poisson(share * requests_).astype(float))
    for bounds, median, sigma in slo_bench.HISTOGRAMS.values():
        shares = slo_bench._lognormal_shares(bounds, median, sigma)
        per_bucket = rng.multinomial(requests_, shares)  # (n, buckets)
        rows += list(np.cumsum(per_bucket, axis=1).T.astype(float))
        mean = median * math.exp(sigma * sigma / 2)
        rows.append(np.maximum(requests_ * mean * rng.normal(1.0, 0.02, n), 0.0))
        rows.append(requests_.astype(float))
    return np.stack(rows)


def _om_head(series: Series) -> str:
    labels = ",".join(f'{k}="{slo_bench._om_escape(v)}"' for k, v in sorted(series.labels.items()))
    return f"{series.name}{{{labels}}} "


def _om_lines(head: str, values: np.ndarray, secs: list[str]) -> str:
    return "".join(f"{head}{v} {t}\n"
                   for v, t in zip(slo_bench._om_values(values), secs, strict=True))


def build_prometheus(data_dir: Path, work: Path, size: Size, promtool: str) -> dict[str, float]:
    """Stream ``size``'s series as OpenMetrics, one file per 18 h block, into TSDB blocks."""
    times = {"om_s": 0.0, "promtool_s": 0.0, "om_bytes": 0.0, "samples": 0.0, "series": 0.0}
    data_dir.mkdir(parents=True, exist_ok=True)
    layouts = [replica_layout(r) for r in range(size.replicas)]
    times["series"] = float(sum(len(lay) for lay in layouts))
    heads = [[_om_head(s) for s in lay] for lay in layouts]
    counter = np.array([s.counter for s in layouts[0]])
    carried = [np.zeros(len(lay)) for lay in layouts]
    stamps = [size.stamps(r) for r in range(size.replicas)]
    lo = size.start_s // BLOCK_S * BLOCK_S
    block = 0
    while lo <= AT_S:
        hi = lo + BLOCK_S
        t0 = time.perf_counter()
        # One block of every replica at a time (~150 MB of float64 at 100 replicas): the file
        # is written family by family, which OpenMetrics wants contiguous.
        values: list[np.ndarray] = []
        secs: list[list[str]] = []
        for r in range(size.replicas):
            i, j = np.searchsorted(stamps[r], [lo, hi])
            ts = stamps[r][i:j]
            inc = block_increments(r, size, ts, block)
            totals = np.where(counter[:, None], np.cumsum(inc, axis=1) + carried[r][:, None], inc)
            if len(ts):
                carried[r] = np.where(counter, totals[:, -1], 0.0)
            values.append(totals)
            secs.append([str(t) for t in ts.tolist()])
        om = work / "block.om"
        with om.open("w", encoding="utf-8") as f:
            for k in range(len(counter)):
                for r in range(size.replicas):
                    if secs[r]:
                        f.write(_om_lines(heads[r][k], values[r][k], secs[r]))
            f.write("# EOF\n")
        n = sum(len(s) for s in secs) * len(counter)
        del values, secs
        times["om_s"] += time.perf_counter() - t0
        times["om_bytes"] += om.stat().st_size
        times["samples"] += n
        t1 = time.perf_counter()
        result = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics",
             f"--max-block-duration={BLOCK_S // H_S}h", str(om), str(data_dir)],
            capture_output=True, text=True, check=False)
        times["promtool_s"] += time.perf_counter() - t1
        om.unlink()
        if result.returncode != 0:
            raise RuntimeError(
                f"promtool failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        print(f"  block {block} ({lo}): {n:,} samples, OpenMetrics {times['om_s']:.0f} s, "
              f"promtool {times['promtool_s']:.0f} s", file=sys.stderr, flush=True)
        lo, block = hi, block + 1
    return times


# --- the Vigil config and its rules ------------------------------------------------------
def config_text(size: Size, url: str, recorded: str | None) -> str:
    """The bench's Vigil config: one pool of ``size.replicas`` targets (the generated scrape
    jobs label their series as the data does), the four default SLOs over ``size.days``."""
    lines = ["[engine]", f"prometheus_url = {json.dumps(url)}"]
    if recorded is not None:
        lines.append(f"recorded_rules = {json.dumps(recorded)}")
    lines += ["[slo_defaults]", f'period = "{size.days:g}d"',
              "[[pools]]", f"name = {json.dumps(POOL)}", f"model = {json.dumps(MODEL)}",
              'gpu = "H100"', f"max_replicas = {2 * size.replicas}"]
    for r in range(size.replicas):
        # Addresses never dialled: Prometheus here scrapes nothing.
        lines += ["[[targets]]", f'name = "{POOL}-{r:03d}"',
                  f'url = "http://10.{r // 250}.{r % 250}.1:8000/metrics"', f'pool = "{POOL}"']
    return "\n".join(lines) + "\n"


def recorded_supported() -> bool:
    """Whether this Vigil has ``[engine] recorded_rules`` (the recorded read path)."""
    return "recorded_rules" in EngineConfig.model_fields


def write_config(work: Path, size: Size, url: str, recorded: str | None) -> tuple[Config, Path]:
    path = work / f"vigil-{size.name}.toml"
    path.write_text(config_text(size, url, recorded))
    return load_config(path), path


def write_rules(work: Path, size: Size) -> Path:
    """``vigil rules prometheus``'s recording rules for the bench's config, in ``work``."""
    config, _ = write_config(work, size, "http://127.0.0.1:9", None)
    path = work / FILE_SLO_RULES
    path.write_text(generate(config).files()[FILE_SLO_RULES])
    return path


# --- Prometheus -----------------------------------------------------------------------------------
@contextlib.contextmanager
def running_prometheus(binary: str, data_dir: Path, work: Path, *, rules: Path | None = None,
                       max_samples: int = DEFAULT_MAX_SAMPLES) -> Iterator[str]:
    """Prometheus on ``data_dir`` (no scrapes, loopback, ``rules`` loaded); yields its URL."""
    cfg = work / "prometheus.yml"
    text = "global:\n  evaluation_interval: 30s\nscrape_configs: []\n"
    if rules is not None:
        text += f"rule_files:\n- {json.dumps(str(rules))}\n"
    cfg.write_text(text)
    port = free_port()
    log_path = work / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={data_dir}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y",
             # Blocks stay the 18 h promtool cut: no merging into bigger ones in the
             # background while queries are timed.
             f"--storage.tsdb.max-block-duration={BLOCK_S // H_S}h",
             f"--query.max-samples={max_samples}", "--query.timeout=10m", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/-/ready", proc, log_path, timeout=300)
        yield url
    finally:
        if proc.poll() is None:
            stop(proc, timeout=60)


def _blocks(data_dir: Path) -> list[tuple[int, int]]:
    out = []
    for meta in data_dir.glob("*/meta.json"):
        doc = json.loads(meta.read_text())
        out.append((int(doc["minTime"]), int(doc["maxTime"])))
    return sorted(out)


def _overlapping(data_dir: Path) -> bool:
    blocks = _blocks(data_dir)
    return any(b[0] < a[1] for a, b in itertools.pairwise(blocks))


def backfill_rules(binary: str, promtool: str, data_dir: Path, work: Path, rules: Path) -> float:
    """Record ``rules`` over the ``RULES_BACKFILL_S`` before ``AT_S`` into ``data_dir``
    (promtool evaluates them against a Prometheus on the raw blocks); returns seconds."""
    out = work / "rule-blocks"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    with running_prometheus(binary, data_dir, work, max_samples=RAISED_MAX_SAMPLES) as url:
        result = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "rules", f"--url={url}",
             f"--start={AT_S - RULES_BACKFILL_S}", f"--end={AT_S}", f"--output-dir={out}",
             str(rules)], capture_output=True, text=True, check=False, cwd=work)
    if result.returncode != 0:
        raise RuntimeError(f"promtool rules failed:\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")
    for block in out.iterdir():
        if (block / "meta.json").exists():
            shutil.move(str(block), data_dir / block.name)
    # The rule blocks overlap the last raw block in time: Prometheus merges them a minute or
    # so after it starts. Let it do that now, not while queries are timed.
    with running_prometheus(binary, data_dir, work):
        deadline = time.monotonic() + 1800
        while _overlapping(data_dir) or any(data_dir.glob("*.tmp*")):
            if time.monotonic() > deadline:
                raise RuntimeError("Prometheus did not merge the rule blocks in 30 minutes")
            time.sleep(5)
    return time.perf_counter() - t0


# --- measuring --------------------------------------------------------------------------------
@dataclass
class QueryStats:
    expr: str
    samples: int
    peak: int
    eval_s: float


@dataclass
class Meter:
    """Reads ``stats=all`` from every query answer the source receives."""

    queries: list[QueryStats] = field(default_factory=list)

    def hook(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        if not urlsplit(response.url).path.endswith("/api/v1/query") \
                or response.status_code != 200:
            return
        request = response.request
        asked = parse_qs(urlsplit(request.url or "").query)
        if isinstance(request.body, str | bytes) and request.body:
            body = request.body.decode() if isinstance(request.body, bytes) else request.body
            asked.update(parse_qs(body))
        stats = response.json()["data"].get("stats") or {}
        samples = stats.get("samples") or {}
        self.queries.append(QueryStats(
            asked.get("query", ["?"])[0], int(samples.get("totalQueryableSamples", 0)),
            int(samples.get("peakSamples", 0)),
            float((stats.get("timings") or {}).get("evalTotalTime", 0.0))))


@dataclass
class Row:
    size: Size
    path: str
    max_samples: int
    queries: list[QueryStats]
    wall_s: float
    error: str = ""
    note: str = ""

    @property
    def samples(self) -> int:
        return sum(q.samples for q in self.queries)

    @property
    def peak(self) -> int:
        return max((q.peak for q in self.queries), default=0)

    @property
    def biggest(self) -> int:
        return max((q.samples for q in self.queries), default=0)

    @property
    def server_s(self) -> float:
        return sum(q.eval_s for q in self.queries)


def _recorded_taken(status: dict[str, Any]) -> str:
    """What the status says of the recorded read: the SLOs read from recorded series, and
    why the others were computed from raw series."""
    info = status.get("recorded_rules")
    if not info:
        return "the status says nothing of recorded rules: every SLO computed from raw series"
    read = ", ".join(info.get("read") or []) or "none"
    fallback = "".join(f"; {k} raw: {v}" for k, v in sorted((info.get("fallback") or {}).items()))
    return f"SLOs read from recorded series: {read}{fallback}"


def measure(size: Size, work: Path, url: str, path: str, repeat: int,
            max_samples: int) -> Row:
    """One evaluation with stats, then ``repeat`` timed ones without; a ``SourceError`` is
    kept as the row's error."""
    recorded = {"raw": "off", "recorded": "auto"}[path] if recorded_supported() else None
    config, config_file = write_config(work, size, url, recorded)
    meter = Meter()
    with open_source(config, str(config_file)) as source:
        assert isinstance(source, PrometheusSource)
        extra: Callable[[], Any] | None = None
        if path == "recorded" and recorded is None:
            # No recorded read path in this Vigil yet: its one query, sent through the same
            # source, stands for the SLO windows of the evaluation.
            names = [f"{POOL}-{i}" for i in ("ttft", "e2e", "error-rate", "availability")]
            expr = ('{__name__=~"slo:(sli_error:ratio_rate.+|spec_info)", slo=~"'
                    + "|".join(names) + '"}[600000ms]')
            extra = functools.partial(source.query, expr, AT_S)
        run: Callable[[], Any] = extra or (lambda: evaluate(config, source, AT_S))
        source._session.hooks["response"].append(meter.hook)
        source._params = {**source._params, "stats": "all"}
        note = ""
        try:
            status = run()
        except SourceError as exc:
            return Row(size, path, max_samples, meter.queries, math.nan, error=str(exc))
        if isinstance(status, dict) and path == "recorded":
            note = _recorded_taken(status)
        elif extra is not None:
            note = "the recorded query alone (this Vigil has no [engine] recorded_rules)"
        counted = list(meter.queries)
        source._session.hooks["response"].remove(meter.hook)
        source._params = {k: v for k, v in source._params.items() if k != "stats"}
        best = math.inf
        for _ in range(repeat):
            t0 = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t0)
    return Row(size, path, max_samples, counted, best, note=note)


# --- reporting --------------------------------------------------------------------------------
def _window_s(expr: str) -> float:
    """The longest range in a query (seconds), 0 without one."""
    return max((int(m) / 1000 for m in _RANGE_RE.findall(expr)), default=0.0)


def extrapolate(row: Row, replicas: int, days: float) -> tuple[int, int, str]:
    """``(samples per evaluation, largest query)`` of ``row``'s queries at ``replicas`` x
    ``days``, and the arithmetic: a raw query's samples are series x samples per series in its
    window; series grow with replicas, and a query over the SLO period (``row.size.days``)
    reads ``days / row.size.days`` times more per series. A recorded query reads one series
    per SLO and window: neither grows."""
    r_factor = replicas / row.size.replicas
    d_factor = days / row.size.days
    period_s = row.size.days * DAY_S
    period_q = [q for q in row.queries if abs(_window_s(q.expr) - period_s) < 1]
    other = [q for q in row.queries if q not in period_q]
    recorded = [q for q in row.queries if "slo:" in q.expr]
    other = [q for q in other if q not in recorded]
    p = sum(q.samples for q in period_q)
    o = sum(q.samples for q in other)
    c = sum(q.samples for q in recorded)
    total = round(p * r_factor * d_factor + o * r_factor + c)
    biggest = round(max([q.samples * r_factor * d_factor for q in period_q]
                        + [q.samples * r_factor for q in other]
                        + [float(q.samples) for q in recorded] + [0.0]))
    text = (f"{row.path}: period queries {p:,} x {r_factor:g} x {d_factor:.4g} "
            f"+ other raw queries {o:,} x {r_factor:g} + recorded {c:,} = {total:,} samples "
            f"({len(period_q)} queries over the period, {len(other)} other raw, "
            f"{len(recorded)} recorded); the largest query {biggest:,}")
    return total, biggest, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="20,100", help="comma-separated pool sizes")
    parser.add_argument("--days", type=float, default=7.0, help="backfill and SLO period")
    parser.add_argument("--step", type=int, default=60, help="scrape interval, seconds")
    parser.add_argument("--repeat", type=int, default=3, help="timed evaluations (best kept)")
    parser.add_argument("--data", type=Path, default=ROOT / "build" / "prometheus-scale-bench")
    parser.add_argument("--queries", action="store_true",
                        help="also list every query of each evaluation with its samples")
    args = parser.parse_args(argv)
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not binary or not promtool:
        print("prometheus and promtool are needed (apt-get install prometheus)", file=sys.stderr)
        return 2

    rows: list[Row] = []
    built: dict[str, dict[str, float]] = {}
    for n in (int(x) for x in args.replicas.split(",")):
        size = Size(n, args.days, args.step)
        folder = args.data.resolve() / size.name
        work = folder / "work"
        data_dir = folder / "data"

        def build(size: Size = size, data_dir: Path = data_dir, work: Path = work,
                  folder: Path = folder) -> dict[str, float]:
            work.mkdir(parents=True, exist_ok=True)
            times = build_prometheus(data_dir, work, size, promtool)
            rules = write_rules(work, size)
            times["rules_s"] = backfill_rules(binary, promtool, data_dir, work, rules)
            return times

        work.mkdir(parents=True, exist_ok=True)
        rules = write_rules(work, size)
        times = _cached(folder, size, rules.read_text(), build)
        built[size.name] = times
        with running_prometheus(binary, data_dir, work, rules=rules) as url:
            for path in ("raw", "recorded"):
                row = measure(size, work, url, path, args.repeat, DEFAULT_MAX_SAMPLES)
                rows.append(row)
                print(f"  {size.name} {path}: {row.samples:,} samples, {row.wall_s:.2f} s"
                      f"{' ' + row.error if row.error else ''}", file=sys.stderr, flush=True)
        if any(r.error for r in rows if r.size == size):
            with running_prometheus(binary, data_dir, work, rules=rules,
                                    max_samples=RAISED_MAX_SAMPLES) as url:
                for path in ("raw", "recorded"):
                    if any(r.error for r in rows if r.size == size and r.path == path):
                        rows.append(measure(size, work, url, path, args.repeat,
                                            RAISED_MAX_SAMPLES))

    print(f"\n`slo.status.evaluate` at {AT_S} through `PrometheusSource`, Prometheus "
          f"{_version(binary)}, one pool, 4 SLOs over {args.days:g} days, one sample every "
          f"{args.step} s per series; wall time best of {args.repeat}; {os.cpu_count()} CPUs\n")
    print("| replicas | window | path | series | queries | samples touched | peak samples "
          "| largest query | server eval s | wall s |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        limit = "" if row.max_samples == DEFAULT_MAX_SAMPLES else \
            f" (--query.max-samples={row.max_samples:.0e})"
        wall = "error" if row.error else f"{row.wall_s:.2f}"
        print(f"| {row.size.replicas} | {row.size.days:g}d | {row.path}{limit} "
              f"| {int(built[row.size.name]['series']):,} | {len(row.queries)} "
              f"| {row.samples:,} | {row.peak:,} | {row.biggest:,} | {row.server_s:.2f} "
              f"| {wall} |")
    print()
    for name, times in built.items():
        print(f"* {name}: {int(times['samples']):,} samples; OpenMetrics "
              f"{times['om_bytes'] / 1e9:.1f} GB in {times['om_s']:.0f} s, promtool "
              f"{times['promtool_s']:.0f} s, recorded series backfilled in "
              f"{times['rules_s']:.0f} s")
    for row in rows:
        if row.error:
            print(f"* {row.size.replicas} replicas, {row.path}: {row.error}")
        if row.note:
            print(f"* {row.size.replicas} replicas, {row.path}: {row.note}")
    print(f"\nExtrapolated to 500 replicas x 30 days at this run's {args.step} s scrape "
          "interval (raw samples scale with 1 / interval; the recorded query does not):\n")
    for row in rows:
        if row.error:
            continue
        if row.size.replicas != max(r.size.replicas for r in rows):
            continue
        total, biggest, text = extrapolate(row, 500, 30.0)
        print(f"* {text}; {total / VM_MAX_SAMPLES_PER_QUERY:.2f}x VictoriaMetrics' "
              f"-search.maxSamplesPerQuery ({VM_MAX_SAMPLES_PER_QUERY:.0e}) for the whole "
              f"evaluation, {biggest / VM_MAX_SAMPLES_PER_QUERY:.1%} of it for the largest "
              f"query")
    if args.queries:
        for row in rows:
            print(f"\n{row.size.replicas} replicas, {row.path}:\n")
            print("| samples | peak | window s | query |\n|---:|---:|---:|---|")
            for q in sorted(row.queries, key=lambda q: -q.samples):
                print(f"| {q.samples:,} | {q.peak:,} | {_window_s(q.expr):g} "
                      f"| `{q.expr[:160]}` |")
    return 0


def _cached(folder: Path, size: Size, rules: str,
            build: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Run ``build()`` unless ``folder`` holds a finished build of this size and version whose
    series were recorded by the recording rules ``rules`` (their text): rules generated
    otherwise record other series, or another ``spec_version``."""
    manifest = folder / "manifest.json"
    want = {"version": DATA_VERSION, "size": size.name,
            "rules": hashlib.sha256(rules.encode()).hexdigest()[:16]}
    if manifest.exists():
        saved = json.loads(manifest.read_text())
        if {k: saved.get(k) for k in want} == want:
            print(f"{size.name}: cached in {folder}", file=sys.stderr)
            return dict(saved["times"])
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"{size.name}: building in {folder}", file=sys.stderr)
    times = build()
    manifest.write_text(json.dumps({**want, "times": times}))
    return times


def _version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"version (\S+)", out.stdout + out.stderr)
    return found.group(1) if found else "(unknown version)"


if __name__ == "__main__":
    raise SystemExit(main())
