"""Parse benchmark: collector.exposition against prometheus_client 0.26's own parsers.

Run: ``.venv/bin/python bench/parse_bench.py [--seconds 3]``

Prints a Markdown table: samples/s, speed-up over prometheus_client on the same input, and the
peak memory one parse allocates (tracemalloc). Each measurement runs for ``--seconds`` in total,
split into 5 rounds that alternate between prometheus_client and ours; the best round counts.
Single thread, so one core (no taskset pinning; on a shared machine the load average printed
above the table says how noisy the numbers are). The outputs are checked identical to the
library's before anything is timed.

Target: at least 4x prometheus_client's ``text_string_to_metric_families`` on the vLLM fixture
(client_python#1114 made it ~4x slower in 0.22); the collector must parse 1,000 vLLM
replicas every 15 s on one core.

``bench_parse`` is the reusable piece: give it any ``body -> families`` callable (a parse+store
leg, say) and it returns a ``BenchResult``; ``bench_pair`` times two such callables with their
rounds interleaved, so a speed-up is measured under the same machine load.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.metrics_core import Metric  # noqa: E402
from prometheus_client.openmetrics.parser import (  # noqa: E402
    text_string_to_metric_families as library_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as library_text  # noqa: E402

from collector.exposition import parse, parse_text  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
VLLM_TEXT = FIXTURES / "vllm_v1_metrics_sample.txt"
VLLM_OPENMETRICS = FIXTURES / "vllm_v1_metrics_sample.openmetrics.txt"
DCGM_TEXT = FIXTURES / "dcgm_exporter_sample.txt"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
ROUNDS = 5

ParseFn = Callable[[str], Sequence[Metric]]


@dataclass(frozen=True)
class BenchResult:
    """One timed parser on one input.

    ``seconds_per_parse`` is the mean wall time of one call in the best round (seconds);
    ``samples_per_second`` follows from it; ``peak_kib`` is tracemalloc's peak during one call
    (KiB, allocations made by the call, not the input text).
    """

    name: str
    input_name: str
    samples: int
    seconds_per_parse: float
    peak_kib: float

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds_per_parse


def bench_parse(fn: ParseFn, body: str, *, name: str, input_name: str,
                seconds: float = 3.0, rounds: int = ROUNDS) -> BenchResult:
    """Time ``fn(body)`` for ``seconds`` in total (``rounds`` rounds, best one counts).

    ``fn`` returns the parsed families; their sample count is the unit of throughput.
    """
    samples = sum(len(family.samples) for family in fn(body))
    best = min(_round(fn, body, seconds / rounds) for _ in range(rounds))
    return BenchResult(name, input_name, samples, best, _peak_kib(fn, body))


def bench_pair(baseline: tuple[ParseFn, str], candidate: tuple[ParseFn, str], *,
               names: tuple[str, str], input_name: str, seconds: float = 3.0,
               rounds: int = ROUNDS) -> tuple[BenchResult, BenchResult]:
    """``bench_parse`` for two parsers with their rounds interleaved.

    On a shared machine the load changes from second to second; alternating rounds exposes
    both parsers to the same conditions, so their ratio is steadier than two separate runs.
    """
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, (fn, body) in enumerate((baseline, candidate)):
            best[i] = min(best[i], _round(fn, body, seconds / rounds))
    results = []
    for (fn, body), name, seconds_per_parse in zip((baseline, candidate), names, best,
                                                   strict=True):
        samples = sum(len(family.samples) for family in fn(body))
        results.append(BenchResult(name, input_name, samples, seconds_per_parse,
                                   _peak_kib(fn, body)))
    return results[0], results[1]


def _round(fn: ParseFn, body: str, seconds: float) -> float:
    """Mean wall time of ``fn(body)`` over calls repeated for ``seconds`` (at least one call)."""
    calls = 0
    start = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds or calls == 0:
        fn(body)
        calls += 1
        elapsed = time.perf_counter() - start
    return elapsed / calls


def _peak_kib(fn: ParseFn, body: str) -> float:
    """Peak traced memory of one ``fn(body)`` call, KiB (tracemalloc; timed separately)."""
    tracemalloc.start()
    try:
        fn(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 1024


def colon_spelling(openmetrics: str) -> str:
    """The OpenMetrics fixture with its samples spelled ``vllm:`` again.

    prometheus_client rejects the fixture as served (client_python#1177: HELP/TYPE say ``vllm:``,
    samples ``vllm_``), so the library is timed on this spelling; ours parses both.
    """
    return re.sub(r"(?m)^vllm_", "vllm:", openmetrics)


def _check_identical(ours: Sequence[Metric], library: Sequence[Metric], what: str) -> None:
    same = list(ours) == list(library) and all(
        list(s.labels.items()) == list(t.labels.items()) and type(s.value) is type(t.value)
        for mine, theirs in zip(ours, library, strict=True)
        for s, t in zip(mine.samples, theirs.samples, strict=True)
    )
    if not same:
        raise SystemExit(f"{what}: collector.exposition differs from prometheus_client")


def run(seconds: float) -> list[tuple[BenchResult, BenchResult | None]]:
    """Every row of the table, each paired with the library run it is compared with."""
    vllm = VLLM_TEXT.read_text(encoding="utf-8")
    dcgm = DCGM_TEXT.read_text(encoding="utf-8")
    om = VLLM_OPENMETRICS.read_text(encoding="utf-8")
    om_colon = colon_spelling(om)

    def lib_text(body: str) -> list[Metric]:
        return list(library_text(body))

    def lib_om(body: str) -> list[Metric]:
        return list(library_openmetrics(body))

    def ours_om(body: str) -> list[Metric]:
        return parse(body, content_type=OPENMETRICS_CONTENT_TYPE)

    _check_identical(parse_text(vllm), lib_text(vllm), "vLLM text")
    _check_identical(parse(dcgm), lib_text(dcgm), "DCGM text")
    _check_identical(ours_om(om), lib_om(om_colon), "vLLM OpenMetrics")

    rows: list[tuple[BenchResult, BenchResult | None]] = []
    cases = [
        ("vLLM v1 text", vllm, lib_text, "parse_text", parse_text, vllm),
        ("DCGM text", dcgm, lib_text, "parse", parse, dcgm),
        ("vLLM v1 OpenMetrics", om_colon, lib_om, "parse", ours_om, om),
    ]
    for input_name, lib_body, lib_fn, our_name, our_fn, our_body in cases:
        library, ours = bench_pair(
            (lib_fn, lib_body), (our_fn, our_body), input_name=input_name, seconds=seconds,
            names=("prometheus_client", f"collector.exposition.{our_name}"),
        )
        rows += [(library, None), (ours, library)]
    return rows


def markdown(rows: list[tuple[BenchResult, BenchResult | None]]) -> str:
    lines = [
        "| implementation | input | samples/parse | samples/s | speed-up vs prometheus_client "
        "| peak memory KiB |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for result, baseline in rows:
        speedup = "1.0x" if baseline is None else (
            f"{baseline.seconds_per_parse / result.seconds_per_parse:.1f}x"
        )
        lines.append(
            f"| {result.name} | {result.input_name} | {result.samples} "
            f"| {result.samples_per_second:,.0f} | {speedup} | {result.peak_kib:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="timing budget per measurement, seconds (default 3)")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"Python {platform.python_version()}, prometheus_client {version('prometheus_client')},"
          f" {platform.machine()}, 1 core (single thread), load average {load:.2f};"
          f" {args.seconds:g} s per measurement, best of {ROUNDS} rounds.\n")
    print(markdown(run(args.seconds)))
    print("\nOpenMetrics: prometheus_client rejects the fixture as served (client_python#1177), "
          "so it is timed on the `vllm:` spelling; ours on the file as served.")


if __name__ == "__main__":
    main()
