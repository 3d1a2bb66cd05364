"""``vigil slo status`` over 30 days of 1-minute data for 20 replicas, embedded vs Prometheus.

Run: ``.venv/bin/python bench/slo_bench.py [--replicas 20] [--days 30]
[--prom-replicas N] [--prom-days D] [--no-prometheus] [--no-raw] [--data DIR]``

1. Generates one pool of vLLM replicas, one sample a minute for every series the four default
   SLOs, the quantiles and the cost read (the latency and token histograms with vLLM's bucket
   lists, ``request_success_total`` by reason, generation tokens, KV usage, waiting, running,
   ``up``), with a diurnal load, a down stretch and two replica restarts (counter resets).
2. Loads it into a store (series created through ``Store.write``; the bulk of the samples
   inserted straight into the main table, which is what ``write()`` + ``compact()`` leave
   there, twice as fast) and runs ``Store.compact()``, which builds the rollup and seals
   the rows into compressed chunks (``collector.store.sealed``).
3. Times ``slo.status.evaluate(config, EmbeddedSource(store), at)`` (best of 3) with the
   rollup, and once reading every raw sample (``use_rollup = False``).
4. Writes the same samples as OpenMetrics, one file per Prometheus block (``promtool tsdb
   create-blocks-from openmetrics`` re-reads its whole input for every block it cuts), starts
   Prometheus 2.42 on them and times the same ``evaluate`` with ``PrometheusSource`` (best of
   3), after checking that both JSONs agree.

Generated data is cached in ``--data`` (default ``/tmp/vigil-slo-bench``) per size, so a
second run only times. Prints a Markdown table. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.utils import floatToGoString

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collector.store import SCHEMA_VERSION, Store  # noqa: E402
from serving.sim.metrics import build_1_2_5_buckets  # noqa: E402
from slo.sources.embedded import EmbeddedSource  # noqa: E402
from slo.sources.prometheus import PrometheusSource  # noqa: E402
from slo.status import evaluate  # noqa: E402
from vigil.config import Config, parse_config  # noqa: E402
from vigil.conventions import (  # noqa: E402
    VLLM_INTER_TOKEN_LATENCY_BUCKETS,
    VLLM_REQUEST_LATENCY_BUCKETS,
    VLLM_TTFT_BUCKETS,
)
from vigil.model import SeriesKey, labels_of  # noqa: E402

#: Bump when the generated data changes, so stale caches are rebuilt.
DATA_VERSION = 2
SEED = 20261203
STEP_MS = 60_000
H = 3_600_000
#: Generated data ends here (a fixed past instant, so every run builds identical data).
END_MS = 1_760_000_000_000 // H * H + 17 * 60_000
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
POOL = "chat"
FINISHED = ("stop", "length", "abort", "error", "repetition")
FINISHED_SHARE = (0.90, 0.07, 0.01, 0.015, 0.005)
# vLLM 0.33's bucket lists, spelled as vLLM exposes them (prometheus_client's float spelling).
def _le(bounds: Iterable[float]) -> list[str]:
    return [floatToGoString(b) for b in bounds] + ["+Inf"]


TTFT_LE = _le(VLLM_TTFT_BUCKETS)
LATENCY_LE = _le(VLLM_REQUEST_LATENCY_BUCKETS)
ITL_LE = _le(VLLM_INTER_TOKEN_LATENCY_BUCKETS)
TOKENS_LE = _le(float(b) for b in build_1_2_5_buckets(100_000))
#: base name -> (bucket bounds, median, lognormal sigma) of the observations
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": (TTFT_LE, 0.3, 0.9),
    "vllm:e2e_request_latency_seconds": (LATENCY_LE, 4.0, 0.7),
    "vllm:request_queue_time_seconds": (LATENCY_LE, 0.2, 1.2),
    "vllm:inter_token_latency_seconds": (ITL_LE, 0.03, 0.5),
    "vllm:request_generation_tokens": (TOKENS_LE, 180.0, 0.9),
    "vllm:request_prompt_tokens": (TOKENS_LE, 450.0, 0.8),
}
#: Prometheus's largest standard block range that fits in 7 days (2h x 3^4); one file each.
PROM_BLOCK_MS = 162 * H


@dataclass(frozen=True)
class Size:
    replicas: int
    days: float

    @property
    def name(self) -> str:
        return f"{self.replicas}r-{self.days:g}d"

    @property
    def steps(self) -> int:
        return int(self.days * 86400_000 // STEP_MS)


# --- data ---------------------------------------------------------------------------------------
def _lognormal_shares(bounds: list[str], median: float, sigma: float) -> np.ndarray:
    """P(observation in each bucket) for a lognormal, bucket by bucket (not cumulative)."""
    les = np.array([float(b) for b in bounds])
    z = (np.log(np.where(np.isinf(les), 1.0, les)) - math.log(median)) / sigma
    cdf = 0.5 * (1.0 + np.array([math.erf(x / math.sqrt(2)) for x in z]))
    cdf[np.isinf(les)] = 1.0
    return np.diff(np.concatenate([[0.0], cdf]))


def _counter(increments: np.ndarray, reset_at: int | None) -> np.ndarray:
    """Counter values from per-step increments (axis 0); restarts from 0 at ``reset_at``."""
    values = np.cumsum(increments, axis=0, dtype=np.float64)
    if reset_at is not None:
        values[reset_at:] -= values[reset_at - 1]
    return values


def replica_series(r: int, size: Size) -> Iterator[tuple[str, dict[str, str], str, np.ndarray]]:
    """``(name, labels, family type, values)`` of every series of replica ``r``; the values are
    one per step of ``timestamps(r, size)``."""
    rng = np.random.default_rng([SEED, r])
    n = size.steps
    t = np.arange(n)
    day = 1440
    load = 0.55 + 0.4 * np.sin(2 * np.pi * (t / day + r / 20.0)) + rng.normal(0, 0.03, n)
    load = np.clip(load, 0.05, 1.0)
    reset_at = n // 3 + 97 * r if r in (5, 12) else None  # two replicas restart once
    target = {"instance": f"{POOL}-{r:02d}", "pool": POOL, "kind": "vllm"}
    labels = {**target, "engine": "0", "model_name": MODEL}
    up = np.ones(n)
    if r == 3:
        up[n // 2: n // 2 + 120] = 0.0  # two hours down
    yield "up", target, "gauge", up
    yield "vllm:kv_cache_usage_perc", labels, "gauge", np.round(
        np.clip(load * 0.9 + rng.normal(0, 0.05, n), 0, 1), 4)
    yield "vllm:num_requests_waiting", labels, "gauge", rng.poisson(3 * load).astype(float)
    yield "vllm:num_requests_running", labels, "gauge", rng.poisson(12 * load).astype(float)
    requests = rng.poisson(240 * load)
    by_reason = np.stack([rng.binomial(requests, p) for p in FINISHED_SHARE[1:]], axis=1)
    by_reason = np.minimum(by_reason, requests[:, None])
    stop = np.maximum(requests - by_reason.sum(axis=1), 0)
    for j, reason in enumerate(FINISHED):
        inc = stop if j == 0 else by_reason[:, j - 1]
        yield ("vllm:request_success_total", {**labels, "finished_reason": reason}, "counter",
               _counter(inc, reset_at))
    yield ("vllm:generation_tokens_total", labels, "counter",
           _counter(rng.poisson(180 * requests), reset_at))
    for base, (bounds, median, sigma) in HISTOGRAMS.items():
        shares = _lognormal_shares(bounds, median, sigma)
        per_bucket = rng.multinomial(requests, shares)  # (n, buckets)
        cumulative = _counter(np.cumsum(per_bucket, axis=1), reset_at)
        for j, le in enumerate(bounds):
            yield base + "_bucket", {**labels, "le": le}, "histogram", cumulative[:, j]
        mean = median * math.exp(sigma * sigma / 2)
        sums = requests * mean * rng.normal(1.0, 0.02, n)
        yield base + "_sum", labels, "histogram", _counter(np.maximum(sums, 0), reset_at)
        yield base + "_count", labels, "histogram", _counter(requests, reset_at)


def timestamps(r: int, size: Size) -> np.ndarray:
    """One sample a minute, ending within a minute of ``END_MS``; each replica has its own
    phase (whole seconds, so that OpenMetrics' seconds are exact)."""
    phase = (r * 2_000) % STEP_MS
    last = END_MS - STEP_MS + phase
    return last - (size.steps - 1 - np.arange(size.steps, dtype=np.int64)) * STEP_MS


def config(replicas: int, *, availability: bool = True,
           scrape_interval: float | None = None) -> Config:
    """One pool of ``replicas``; its four default SLOs, or the three without availability;
    ``scrape_interval`` (seconds) the data's own when a reader samples at it (the scaling
    replay).

    The figures in docs/benchmarks.md were taken while availability was the scrape-based SLI
    (``avg_over_time(up)``, now the ``replica_up`` indicator); it now counts 5xx answers with
    ``increase(http_requests_total)``, which the synthetic fleet here does not expose."""
    data: dict[str, Any] = {
        "engine": {"promql_semantics": "2"},
        "pools": [{"name": POOL, "model": MODEL, "gpu": "H100", "max_replicas": 2 * replicas}],
    }
    if scrape_interval is not None:
        data["collector"] = {"scrape_interval": scrape_interval}
    if not availability:
        data["slos"] = [{"name": f"{POOL}-{i}", "pool": POOL, "indicator": i}
                        for i in ("ttft", "e2e", "error_rate")]
    return parse_config(data)


# --- the store ----------------------------------------------------------------------------------
def build_store(path: Path, size: Size) -> dict[str, float]:
    """Write ``size``'s data into a new store at ``path`` and compact it; returns timings."""
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    rows = 0
    # Raw retention longer than the data: one sample a minute is what downsampling to 60 s
    # keeps anyway, so the samples are the same, without a one-time downsampling pass over
    # the whole backlog (in production it runs a few minutes at a time).
    with Store(path, clock=lambda: END_MS / 1000 + 300, raw_retention_s=40 * 86400,
               downsampled_retention_s=45 * 86400) as store:
        for r in range(size.replicas):
            ts = timestamps(r, size)
            batch: list[tuple[int, list[int], list[float]]] = []
            for name, labels, family, values in replica_series(r, size):
                key = SeriesKey(name, labels_of(labels))
                # write() creates the series (name, labels, type, counter flag) ...
                store.write([(key, family, int(ts[0]), float(values[0]))])
                batch.append((store._head.ids[key][0], ts[1:].tolist(), values[1:].tolist()))
            # ... and the rest goes straight where write() + compact() would put it.
            with store.transaction():
                for sid, t_list, v_list in batch:
                    store._c.executemany(
                        "INSERT INTO samples (series_id, ts, value) VALUES (?, ?, ?)",
                        zip([sid] * len(t_list), t_list, v_list, strict=True),
                    )
                    rows += len(t_list) + 1
            print(f"  replica {r + 1}/{size.replicas}: {rows:,} samples "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        times["load_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        report = store.compact(now=END_MS / 1000 + 300)
        times["compact_s"] = time.perf_counter() - t1
        print(f"  compact: {report}", file=sys.stderr)
    times["rows"] = rows
    return times


def upgrade_store(path: Path) -> None:
    """A store cached by an older Vigil: opening it writable migrates its schema, and
    ``compact()`` rebuilds the rollup the migration marked stale, or seals its rows."""
    with Store.open_readonly(path) as ro:
        version = int(ro._meta()["schema_version"])
    if version >= SCHEMA_VERSION:
        return
    t0 = time.perf_counter()
    with Store(path, clock=lambda: END_MS / 1000 + 300, raw_retention_s=40 * 86400,
               downsampled_retention_s=45 * 86400) as store:
        report = store.compact(now=END_MS / 1000 + 300)
    print(f"  store schema {version} -> {SCHEMA_VERSION}, compacted in "
          f"{time.perf_counter() - t0:.0f} s: {report}", file=sys.stderr)


# --- Prometheus ---------------------------------------------------------------------------------
def _om_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _om_values(values: np.ndarray) -> list[str]:
    """Exact OpenMetrics spellings: integers as integers, other floats as ``repr``."""
    if np.all(values == np.floor(values)) and np.all(np.abs(values) < 2**53):
        return [str(v) for v in values.astype(np.int64).tolist()]
    return [repr(v) for v in values.tolist()]


def build_prometheus(data_dir: Path, work: Path, size: Size, promtool: str) -> dict[str, float]:
    """Write ``size``'s data as OpenMetrics, one file per 162 h block, into TSDB blocks."""
    times = {"om_s": 0.0, "promtool_s": 0.0, "om_bytes": 0.0}
    data_dir.mkdir(parents=True, exist_ok=True)
    start = int(timestamps(0, size)[0]) // PROM_BLOCK_MS * PROM_BLOCK_MS
    block_lo = start
    while block_lo <= END_MS:
        block_hi = block_lo + PROM_BLOCK_MS
        t0 = time.perf_counter()
        om = work / "block.om"
        n_written = 0
        with om.open("w", encoding="utf-8") as f:
            # Families must be contiguous in OpenMetrics: series grouped by name.
            by_name: dict[str, list[str]] = {}
            for r in range(size.replicas):
                ts = timestamps(r, size)
                lo, hi = np.searchsorted(ts, [block_lo, block_hi])
                if lo == hi:
                    continue
                secs = [str(t) for t in (ts[lo:hi] // 1000).tolist()]
                for name, labels, _family, values in replica_series(r, size):
                    pairs = sorted(labels.items())
                    label_text = ",".join(f'{k}="{_om_escape(v)}"' for k, v in pairs)
                    head = f"{name}{{{label_text}}} "
                    chunk = "".join(
                        f"{head}{v} {t}\n"
                        for v, t in zip(_om_values(values[lo:hi]), secs, strict=True)
                    )
                    by_name.setdefault(name, []).append(chunk)
                    n_written += hi - lo
            for chunks in by_name.values():
                f.writelines(chunks)
            f.write("# EOF\n")
        times["om_s"] += time.perf_counter() - t0
        times["om_bytes"] += om.stat().st_size
        t1 = time.perf_counter()
        result = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics",
             f"--max-block-duration={PROM_BLOCK_MS // H}h", str(om), str(data_dir)],
            capture_output=True, text=True, check=False,
        )
        times["promtool_s"] += time.perf_counter() - t1
        om.unlink()
        if result.returncode != 0:
            raise RuntimeError(
                f"promtool failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        print(f"  block from {block_lo}: {n_written:,} samples, om {times['om_s']:.0f} s, "
              f"promtool {times['promtool_s']:.0f} s", file=sys.stderr, flush=True)
        block_lo = block_hi
    return times


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_prometheus(binary: str, data_dir: Path, work: Path) -> Iterator[str]:
    """Prometheus on ``data_dir`` (no scrapes, loopback); yields its URL; always stopped."""
    cfg = work / "prometheus.yml"
    cfg.write_text("global:\n  evaluation_interval: 1h\nscrape_configs: []\n")
    port = _free_port()
    with (work / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={data_dir}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y",
             # Keep the loaded blocks as they are: no merging into bigger ones in the
             # background while we time queries (a hidden flag, like promtool's).
             f"--storage.tsdb.max-block-duration={PROM_BLOCK_MS // H}h",
             "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=work,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(work / 'prometheus.log').read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/-/ready", timeout=2, trust_env=False).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus not ready after 120 s")
            time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- timing ---------------------------------------------------------------------------------------
def best_of(n: int, fn: Any) -> tuple[float, Any]:
    best, result = math.inf, None
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def _cached(folder: Path, size: Size, what: str, build: Any) -> dict[str, float]:
    """Run ``build()`` unless ``folder`` holds a finished build of this size and version."""
    manifest = folder / "manifest.json"
    want = {"version": DATA_VERSION, "size": size.name, "what": what}
    if manifest.exists():
        saved = json.loads(manifest.read_text())
        if {k: saved.get(k) for k in want} == want:
            print(f"{what}: cached in {folder}", file=sys.stderr)
            return dict(saved["times"])
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"{what}: building {size.name} in {folder}", file=sys.stderr)
    times = build()
    manifest.write_text(json.dumps({**want, "times": times}))
    return times


def _du(path: Path, samples: float) -> str:
    """The size of everything under ``path``, and per sample."""
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    shown = f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"
    return f"{shown} ({size / samples:.2f} B/sample)"


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k != "source"} == {
        k: v for k, v in b.items() if k != "source"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=20)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--prom-replicas", type=int, help="Prometheus size (default: same)")
    parser.add_argument("--prom-days", type=float, help="Prometheus size (default: same)")
    parser.add_argument("--no-prometheus", action="store_true")
    parser.add_argument("--no-raw", action="store_true", help="skip the no-rollup timing")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("/tmp/vigil-slo-bench"))
    args = parser.parse_args(argv)

    size = Size(args.replicas, args.days)
    at = END_MS / 1000
    configs = {"all": config(size.replicas), "no_av": config(size.replicas, availability=False)}
    rows: list[str] = []
    notes: list[str] = []

    store_dir = args.data / f"store-{size.name}"
    built = _cached(store_dir, size, "store", lambda: build_store(store_dir / "vigil.db", size))
    upgrade_store(store_dir / "vigil.db")
    data = f"{size.replicas} replicas × {size.days:g} d"
    with Store.open_readonly(store_dir / "vigil.db") as store:
        # `vigil slo status` as shipped: Prometheus 3 rules (the default).
        source3 = EmbeddedSource(store, semantics="3")
        fast3 = {k: best_of(args.repeat, lambda c=c: evaluate(c, source3, at))
                 for k, c in configs.items()}
        up3_s, _ = best_of(args.repeat, lambda: source3.avg_over_time(
            "up", {"pool": POOL, "kind": "vllm"}, at, 30 * 86400))
        notes.append(f"`avg_over_time(up[30d])` alone (the availability SLO's period): "
                     f"{up3_s:.3f} s embedded, 3.x rules (gauge rollup)")
        rows.append(
            f"| embedded, rollup, 3.x rules (default) | {data} | | | | "
            f"| **{fast3['all'][0]:.3f} s** | **{fast3['no_av'][0]:.3f} s** | |")
        n_series = len(store.series())
        # 2.x rules: bit-identical with Debian's Prometheus 2.42 below.
        source = EmbeddedSource(store, semantics="2")
        fast = {k: best_of(args.repeat, lambda c=c: evaluate(c, source, at))
                for k, c in configs.items()}
        up_s, _ = best_of(args.repeat, lambda: source.avg_over_time(
            "up", {"pool": POOL, "kind": "vllm"}, at, 30 * 86400))
        notes.append(f"`avg_over_time(up[30d])` alone, 2.x rules: {up_s:.3f} s embedded "
                     f"(2.x's running mean of a 0/1 series with downtime is order-dependent: "
                     f"read sample by sample)")
        rows.append(
            f"| embedded, rollup, 2.x rules | {data} | {n_series:,} | {int(built['rows']):,} "
            f"| {_du(store_dir, built['rows'])} | load {built['load_s']:.0f} s "
            f"+ compact {built['compact_s']:.0f} s "
            f"| **{fast['all'][0]:.3f} s** | **{fast['no_av'][0]:.3f} s** | |")
        if not args.no_raw:
            source.use_rollup = False
            raw = {k: best_of(1, lambda c=c: evaluate(c, source, at))
                   for k, c in configs.items()}
            same = all(_same(raw[k][1], fast[k][1]) for k in configs)
            rows.append(f"| embedded, raw samples | {data} | | | | "
                        f"| {raw['all'][0]:.2f} s | {raw['no_av'][0]:.2f} s "
                        f"| {'yes' if same else '**no**'} |")

    if not args.no_prometheus:
        binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
        if not binary or not promtool:
            print("prometheus/promtool not installed: skipping", file=sys.stderr)
        else:
            psize = Size(args.prom_replicas or size.replicas, args.prom_days or size.days)
            prom_dir = args.data / f"prometheus-{psize.name}"
            work = args.data / "work"
            work.mkdir(parents=True, exist_ok=True)
            ptimes = _cached(prom_dir, psize, "prometheus",
                             lambda: build_prometheus(prom_dir / "data", work, psize, promtool))
            per_replica = n_series // size.replicas
            samples = sum(len(timestamps(r, psize)) for r in range(psize.replicas)) * per_replica
            pconfigs = {"all": config(psize.replicas),
                        "no_av": config(psize.replicas, availability=False)}
            with running_prometheus(binary, prom_dir / "data", work) as url, \
                    PrometheusSource(url, semantics="2", timeout_s=600) as remote:
                prom = {k: best_of(args.repeat, lambda c=c: evaluate(c, remote, at))
                        for k, c in pconfigs.items()}
                up_p, _ = best_of(args.repeat, lambda: remote.avg_over_time(
                    "up", {"pool": POOL, "kind": "vllm"}, at, 30 * 86400))
            notes.append(f"`avg_over_time(up[30d])` alone: {up_p:.3f} s on Prometheus")
            same = "–"
            if psize == size:
                same = "yes" if all(_same(prom[k][1], fast[k][1]) for k in configs) else "**no**"
            rows.append(
                f"| Prometheus 2.42 | {psize.replicas} replicas × {psize.days:g} d "
                f"| {psize.replicas * per_replica:,} | {samples:,} | {_du(prom_dir, samples)} "
                f"| OpenMetrics {ptimes['om_bytes'] / 1e9:.1f} GB in {ptimes['om_s']:.0f} s "
                f"+ promtool {ptimes['promtool_s']:.0f} s "
                f"| **{prom['all'][0]:.3f} s** | **{prom['no_av'][0]:.3f} s** | {same} |")

    print(f"\n`slo.status.evaluate` at {at:.0f} (the end of the data), one pool, 1 sample/min; "
          f"best of {args.repeat} (raw samples: 1 run); {os.cpu_count()} CPUs\n")
    print("| source | data | series | samples | on disk | build | evaluate: 4 default SLOs "
          "× 8 windows + quantiles + cost | evaluate: without the availability SLO "
          "| same JSON as embedded |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    for note in notes:
        print(f"* {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
