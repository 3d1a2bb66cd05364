"""``vigil slo backtest`` over 30 days of 1-minute data for 20 replicas.

Run: ``.venv/bin/python bench/backtest_bench.py [--replicas 20] [--days 30] [--interval 30]
[--prometheus] [--data DIR]``

The data is ``bench/slo_bench.py``'s (one pool, its histograms with vLLM's bucket lists, a
diurnal load, a down stretch, two counter resets), built once and cached in ``--data``
(the system's temporary folder by default). Times
the backtest of the pool's default SLOs (TTFT, e2e, error rate; availability counts 5xx
answers, which the synthetic fleet does not expose) over the whole history at the rules'
evaluation interval, with the default alert table (windows up to 3 days), under both PromQL
rules, and reports the instants evaluated, the alerts found and the peak memory. With
``--prometheus`` also through Prometheus 2.42 on the same samples (range queries). Then the
scaling-advice scorecard of the same history (the policy replayed every minute, the data's
scrape interval), with its evaluations, scale-outs and scale-ins.

Prints a Markdown table. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import slo_bench  # noqa: E402

from collector.store import Store  # noqa: E402
from slo.backtest.run import Backtest, backtest  # noqa: E402
from slo.backtest.scorecard import scorecards  # noqa: E402
from slo.sources.embedded import EmbeddedSource  # noqa: E402
from slo.sources.prometheus import PrometheusSource  # noqa: E402


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _row(what: str, data: str, seconds: float, result: Backtest) -> str:
    alerts = sum(len(s.alerts) for s in result.slos)
    missed = sum(len(s.missed_burns) for s in result.slos)
    return (f"| {what} | {data} | {len(result.slos)} | {result.grid.n:,} | **{seconds:.1f} s** "
            f"| {alerts} | {missed} | {_peak_mb():,.0f} MB |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=20)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between instants")
    parser.add_argument("--prometheus", action="store_true")
    parser.add_argument("--no-scaling", action="store_true", help="skip the scorecard")
    # The same cache as bench/slo_bench.py: its data is built once for both.
    parser.add_argument("--data", type=Path,
                        default=Path(tempfile.gettempdir()) / "vigil-slo-bench")
    args = parser.parse_args(argv)

    size = slo_bench.Size(args.replicas, args.days)
    store_dir = args.data / f"store-{size.name}"
    slo_bench._cached(store_dir, size, "store",
                      lambda: slo_bench.build_store(store_dir / "vigil.db", size))
    slo_bench.upgrade_store(store_dir / "vigil.db")
    config = slo_bench.config(size.replicas, availability=False,
                              scrape_interval=slo_bench.STEP_MS / 1000)
    end = slo_bench.END_MS / 1000
    start = end - args.days * 86400
    data = f"{size.replicas} replicas × {size.days:g} d"
    rows = [
        "| source | data | SLOs | instants | time | alerts | missed burns | peak RSS |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    results: dict[str, Backtest] = {}
    with Store.open_readonly(store_dir / "vigil.db") as store:
        for semantics in ("3", "2"):
            source = EmbeddedSource(store, semantics=semantics)
            t0 = time.perf_counter()
            result = backtest(config, source, start, end, interval_s=args.interval)
            took = time.perf_counter() - t0
            results[semantics] = result
            rows.append(_row(f"embedded, {semantics}.x rules", data, took, result))
            print(rows[-1], file=sys.stderr, flush=True)
    if args.prometheus:
        binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
        if not binary or not promtool:
            print("prometheus/promtool not installed: skipping", file=sys.stderr)
        else:
            prom_dir = args.data / f"prometheus-{size.name}"
            work = args.data / "work"
            work.mkdir(parents=True, exist_ok=True)
            slo_bench._cached(prom_dir, size, "prometheus", lambda: slo_bench.build_prometheus(
                prom_dir / "data", work, size, promtool))
            with slo_bench.running_prometheus(binary, prom_dir / "data", work) as url, \
                    PrometheusSource(url, semantics="2", timeout_s=1800) as remote:
                t0 = time.perf_counter()
                result = backtest(config, remote, start, end, interval_s=args.interval)
                took = time.perf_counter() - t0
            same = result.to_dict()["slos"] == results["2"].to_dict()["slos"]
            rows.append(_row(f"Prometheus 2.42 (query_range){'' if same else ' **differs**'}",
                             data, took, result))
    print("\n".join(rows))
    if not args.no_scaling:
        with Store.open_readonly(store_dir / "vigil.db") as store:
            source = EmbeddedSource(store, semantics="2")
            t0 = time.perf_counter()
            cards = scorecards(results["2"], source, config)
            took = time.perf_counter() - t0
        print("\n| scorecard | data | evaluations | time | scale-outs | scale-ins | burns | "
              "peak RSS |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, card in cards.items():
            doc = card.to_dict()
            print(f"| pool {name}, replayed every {doc['interval_seconds']:g} s | {data} | "
                  f"{doc['evaluations']:,} | **{took:.1f} s** | {len(doc['scale_outs'])} | "
                  f"{len(doc['scale_ins'])} | {len(doc['burns'])} | {_peak_mb():,.0f} MB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
