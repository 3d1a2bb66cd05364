"""End-to-end collector benchmark: parse + label + store, and a real HTTP scrape round.

Run: ``.venv/bin/python bench/collect_bench.py [--seconds 3] [--targets 200]``

Prints a Markdown table. The target: at least 100k samples/s end to end on one core,
so that one collector can scrape 1,000 replicas (~700 samples each) every 15 s (~47k samples/s).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from collector.exposition import parse_text  # noqa: E402
from collector.scrape import Fetched, TargetInfo  # noqa: E402
from collector.service import Collector, ScrapeWriter  # noqa: E402
from collector.store import Store  # noqa: E402
from vigil.config import parse_config  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "vllm_v1_metrics_sample.txt"


def _best_rate(fn, samples_per_call: int, seconds: float, rounds: int = 5) -> float:
    """Best-of-``rounds`` samples/s of ``fn`` called repeatedly for ``seconds`` in total."""
    best = 0.0
    per_round = seconds / rounds
    for _ in range(rounds):
        n = 0
        t0 = time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= per_round:
                break
        best = max(best, n * samples_per_call / dt)
    return best


def _peak_kib(fn) -> float:
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 1024


def bench_end_to_end(seconds: float) -> list[tuple[str, float, float]]:
    """(leg, samples/s, peak KiB) for library parse, our parse, and parse+label+store."""
    text = FIXTURE.read_text()
    nsamples = sum(len(f.samples) for f in parse_text(text))
    rows = []
    lib = _best_rate(lambda: list(text_string_to_metric_families(text)), nsamples, seconds)
    rows.append(("prometheus_client 0.26 parse", lib,
                 _peak_kib(lambda: list(text_string_to_metric_families(text)))))
    ours = _best_rate(lambda: parse_text(text), nsamples, seconds)
    rows.append(("vigil parse_text", ours, _peak_kib(lambda: parse_text(text))))

    body = text.encode()
    targets = [TargetInfo(f"chat-{i}", "http://x/metrics", "chat", "vllm") for i in range(50)]
    per_call = (nsamples + 3) * len(targets)
    for label, fast in (
        ("vigil parse + label + store, repeat scrape (layout fast path)", True),
        ("vigil parse + label + store, full parse + layout learning every scrape", False),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "bench.db")
            writer = ScrapeWriter(store)
            clock = [1_795_000_000.0]

            def one(writer: ScrapeWriter = writer, fast: bool = fast,
                    clock: list[float] = clock) -> None:
                clock[0] += 15
                for t in targets:
                    if not fast:
                        writer._layouts.clear()  # force the full path
                    h = writer.process(t, Fetched(body, "text/plain; version=0.0.4", 0.0, ""),
                                       clock[0])
                    if not h.up:
                        raise RuntimeError(h.error)

            one()  # the first scrape creates the series; measure steady-state scrapes
            rows.append((label, _best_rate(one, per_call, seconds), _peak_kib(one)))
            store.close()
    return rows


def bench_http_round(ntargets: int) -> tuple[float, int, int]:
    """One concurrent scrape round of ``ntargets`` over loopback HTTP.

    The targets are served by a separate process (``bench/fixture_server.py``), so the server
    does not share the collector's interpreter. Returns (seconds, samples, targets up).
    """
    import subprocess

    from support.loopback import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("fixture_server.py")), str(FIXTURE),
         str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/{FIXTURE.name}"
    try:
        import httpx

        for _ in range(100):
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as tmp:
            cfg = parse_config({
                "store": {"path": str(Path(tmp) / "b.db")},
                "pools": [{"name": "chat", "model": "m"}],
                "targets": [{"name": f"r{i}", "url": url, "pool": "chat"}
                            for i in range(ntargets)],
            })

            async def go() -> tuple[float, int, int]:
                async with Collector(cfg) as c:
                    await c.scrape_all()  # warm up: series created
                    t0 = time.perf_counter()
                    res = await c.scrape_all()
                    dt = time.perf_counter() - t0
                    return dt, sum(h.samples for h in res if h.up), sum(h.up for h in res)

            return asyncio.run(go())
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--targets", type=int, default=200)
    args = ap.parse_args()
    rows = bench_end_to_end(args.seconds)
    base = rows[0][1]
    print("| leg (1 core, vLLM 0.33 fixture, 709 lines) | samples/s | vs prometheus_client "
          "| peak memory KiB |")
    print("| --- | ---: | ---: | ---: |")
    for name, rate, peak in rows:
        print(f"| {name} | {rate:,.0f} | {rate / base:.1f}x | {peak:,.0f} |")
    dt, n, up = bench_http_round(args.targets)
    print()
    print("| scrape round over loopback HTTP | targets (up) | samples | seconds | samples/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| one Collector.scrape_all() | {args.targets} ({up}) | {n:,} | {dt:.2f} "
          f"| {n / dt:,.0f} |")


if __name__ == "__main__":
    main()
