"""`vigil cost report` on a month: the time to attribute a month of request records over a
month of replica series, and the memory it takes.

Run: ``.venv/bin/python bench/cost_report_bench.py [--days 30] [--replicas 8]
[--requests-per-day 30000] [--prometheus]``

The history: two pools of ``--replicas / 2`` replicas each, scraped every 15 s for ``--days``
days (``up`` and vLLM's three token counters, consistent with the records so that nothing is
unattributed), and ``--requests-per-day`` records a day spread over the replicas, each 2-20 s
long, five tenants, three tiers, streamed and not, a few cancels and cache hits, written by
the gateway's own ``RecordWriter`` into an SQLite records file. Then ``cost_report`` of the
month, grouped by tenant, tier, model and pool, from the embedded store (and with
``--prometheus`` from a real Prometheus loaded with the same series). Reported: wall time
(median of ``--rounds``), peak traced memory (``tracemalloc``) and the reconciliation's
largest float difference. Prints a Markdown table. Not part of the test suite; the machine's
load matters (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collector.store import Store
from serving.gateway.telemetry.record_writer import RecordWriter
from slo.cost.report import cost_report
from slo.sources.embedded import EmbeddedSource
from slo.sources.request_log import GatewayRecords
from vigil.config import Config, parse_config
from vigil.model import SeriesKey, labels_of
from vigil.storage.gateway_records import GatewayRecord

SCRAPE_S = 15
TENANTS = ("acme", "globex", "initech", "umbrella", "hooli")
TIERS = ("premium", "standard", "batch")
MONTH = "2026-11"
T0 = datetime(2026, 11, 1, tzinfo=UTC).timestamp()


def _config(tmp: Path, replicas: int) -> Config:
    half = max(1, replicas // 2)
    names = [(f"chat-{i}", "chat") for i in range(half)] + [
        (f"code-{i}", "code") for i in range(replicas - half)]
    return parse_config({
        "store": {"path": str(tmp / "store.sqlite")},
        "pools": [{"name": "chat", "model": "m-chat"}, {"name": "code", "model": "m-code",
                                                       "gpu": "L40S"}],
        "targets": [{"name": n, "url": f"http://127.0.0.1:{10 + i}/metrics", "pool": p}
                    for i, (n, p) in enumerate(names)],
        "gateway": {"records_path": str(tmp / "records.sqlite"), "api_keys": [
            {"sha256": f"{i:064x}", "tenant": t} for i, t in enumerate(TENANTS, start=1)]},
        "cost": {"prices": [{"pool": "chat", "since": "2026-11-15", "per_gpu_hour": 5.5}]},
    }, file=str(tmp / "vigil.toml"))


def build(tmp: Path, days: int, replicas: int, per_day: int, seed: int = 7) -> tuple[Config,
                                                                                     int, int]:
    """Write the history; returns the config, the records and the samples written."""
    config = _config(tmp, replicas)
    rng = np.random.default_rng(seed)
    span = days * 86400
    n = days * per_day
    targets = config.targets
    which = rng.integers(0, len(targets), n)
    start = np.sort(rng.uniform(0, span - 30, n))
    dur = rng.uniform(2, 20, n)
    ttft = dur * rng.uniform(0.05, 0.2, n)
    prompt = rng.integers(50, 2000, n)
    cached = (prompt * rng.uniform(0, 0.8, n)).astype(int)
    out = rng.integers(20, 800, n)
    tenant = rng.integers(0, len(TENANTS), n)
    tier = rng.integers(0, len(TIERS), n)
    kind = rng.uniform(0, 1, n)  # < 0.02 cancel, < 0.05 cache hit
    # Counters per replica and 15 s sample: tokens as vLLM counts them.
    samples = span // SCRAPE_S
    prompt_c = np.zeros((len(targets), samples + 1))
    hits_c = np.zeros_like(prompt_c)
    gen_c = np.zeros_like(prompt_c)
    writer = RecordWriter(tmp / "records.sqlite", max_queue=n + 10)
    writer.start()
    for i in range(n):
        t = targets[which[i]]
        hit = 0.02 <= kind[i] < 0.05
        cancel = kind[i] < 0.02
        s0, s1 = T0 + start[i], T0 + start[i] + dur[i]
        if not hit and not cancel:
            first = start[i] + ttft[i]
            k = int(first // SCRAPE_S) + 1
            prompt_c[which[i], k] += prompt[i]
            hits_c[which[i], k] += cached[i]
            k0, k1 = int(first // SCRAPE_S) + 1, int((start[i] + dur[i]) // SCRAPE_S) + 1
            gen_c[which[i], k0:k1 + 1] += out[i] / (k1 - k0 + 1)
        writer.put(GatewayRecord(
            id=f"vgl-{i:032x}", start_s=s0, ts_s=s1, pool=t.pool,
            model="m-chat" if t.pool == "chat" else "m-code", endpoint="chat",
            tenant=TENANTS[tenant[i]], tier=TIERS[tier[i]], key_id="k",
            replica="" if hit else t.name, status=499 if cancel else 200, stream=True,
            prompt_tokens=0 if cancel else int(prompt[i]),
            completion_tokens=0 if cancel else int(out[i]),
            tokens_source="unknown" if cancel else "usage",
            ttft_s=None if cancel else float(ttft[i]), e2e_s=0.01 if hit else float(dur[i]),
            queue_s=0.0, error=False, error_class="client_cancel" if cancel else "",
            cache_hit="l1" if hit else "", requested_max_tokens=None, max_tokens=None,
            max_tokens_decision="", cost_usd=None, saved_usd=0.001 if hit else None,
            upstream_id="", batch_id="", message="",
            cached_tokens=None if cancel else int(cached[i])))
    writer.flush(600)
    writer.close()
    written = 0
    with Store(config.store_path()) as store:
        for r, t in enumerate(targets):
            base = {"pool": t.pool, "kind": "vllm", "instance": t.name}
            up = SeriesKey("up", labels_of(base))
            rows: list[tuple[SeriesKey, str, int, float | None]] = []
            ts = [round((T0 + k * SCRAPE_S) * 1000) for k in range(1, samples + 1)]
            rows += [(up, "gauge", x, 1.0) for x in ts]
            for name, counts in (("vllm:prompt_tokens_total", prompt_c),
                                 ("vllm:prefix_cache_hits_total", hits_c),
                                 ("vllm:generation_tokens_total", gen_c)):
                key = SeriesKey(name, labels_of({**base, "model_name": "m", "engine": "0"}))
                values = np.cumsum(counts[r])[1:]
                rows += [(key, "counter", x, float(v)) for x, v in zip(ts, values, strict=True)]
            store.write(rows)
            written += len(rows)
        store.compact(now=T0 + span + 3600)
    return config, n, written


def _run(config: Config, tmp: Path, rounds: int) -> tuple[float, float, float]:
    times = []
    peak = 0.0
    diff = 0.0
    at = T0 + 31 * 86400
    log = GatewayRecords(tmp / "records.sqlite")
    for k in range(rounds):
        with Store(config.store_path(), readonly=True) as store:
            source = EmbeddedSource(store)
            if k == 0:
                tracemalloc.start()
            t0 = time.perf_counter()
            report = cost_report(source, config, log, by=["tenant", "tier", "model", "pool"],
                                 month=MONTH, at_s=at)
            times.append(time.perf_counter() - t0)
            if k == 0:
                peak = tracemalloc.get_traced_memory()[1] / 2**20
                tracemalloc.stop()
        diff = max(abs(p["exact"]["difference"]) for p in report["pools"] if p["cost"])
        assert all(p["adds_up"] for p in report["pools"] if p["cost"])
    return statistics.median(times), peak, diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--requests-per-day", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vigil-cost-bench-") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        config, records, samples = build(tmp, args.days, args.replicas, args.requests_per_day)
        built = time.perf_counter() - t0
        median, peak, diff = _run(config, tmp, args.rounds)
    print(f"load average {os.getloadavg()[0]:.2f}; history written in {built:.0f} s")
    print()
    print("| days | replicas | records | samples | report (median s) | peak traced MiB "
          "| largest float difference |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.days} | {args.replicas} | {records:,} | {samples:,} | {median:.2f} | "
          f"{peak:.0f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
