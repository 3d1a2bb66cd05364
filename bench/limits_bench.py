"""Time limits, measured: the workloads whose speed the tests check functionally only.

Run: ``.venv/bin/python bench/limits_bench.py [--seconds 0.5] [--no-fleet] [--demo]``

A test that asserts on elapsed wall time fails on a loaded machine for reasons that have
nothing to do with the code, so the tests check what each workload does and this script says
how fast it was. It prints a Markdown table: workload, measured seconds, budget seconds and
the ratio measured / budget (under 1: within budget). It is a report and always exits 0.

The workloads and their budgets:

* every 10 MB garbage body of ``tests/test_exposition.py`` (``GARBAGE``) must fail to parse,
  and its pathological comment parse, within 3 s each (about 0.1 s on the project's VM: the
  parser is linear). Timed with ``bench/parse_bench.py``'s ``bench_parse`` (mean of one call in
  the best round);
* the collector fleet of ``tests/test_collector_fleet.py`` (three simulated replicas, one killed
  and restarted, scraped every 0.5 s): the seconds between two scrapes of a replica that stayed
  up, budget 0.5 s / 0.6 (at least 60 % of the scheduled scrapes happen). About 15 s;
* with ``--demo``, ``vigil demo`` (``tests/test_demo.py``): the seconds until the story is told
  (every target stored, a scale-out advised, a page at the webhook), budget 300 s. Up to 5 min.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from parse_bench import bench_parse  # noqa: E402

from collector.exposition import parse, parse_text  # noqa: E402
from vigil.errors import ParseError  # noqa: E402

#: Budgets (seconds): the limits the tests used to assert.
PARSE_BUDGET_S = 3.0
#: A replica that stays up is scraped at least this share of its scheduled times.
SCRAPE_SHARE = 0.6
STORY_BUDGET_S = 300.0


@dataclass(frozen=True)
class Row:
    """One workload: what it took and what it may take (seconds)."""

    workload: str
    measured_s: float
    budget_s: float

    @property
    def ratio(self) -> float:
        return self.measured_s / self.budget_s


def _failing(body: str | bytes) -> list:
    """Parse ``body``, which must fail; the families of a failed parse are none."""
    try:
        parse(body)  # type: ignore[arg-type]
    except ParseError:
        return []
    raise SystemExit("a garbage body parsed without an error")


def bench_parser(seconds: float) -> list[Row]:
    """The garbage bodies and the pathological comment, each timed for ``seconds``."""
    from test_exposition import GARBAGE, pathological_comment

    rows = []
    cases: list[tuple[str, Callable[[], str | bytes], Callable[..., list]]] = [
        *((f"parse fails on garbage: {name}", make, _failing) for name, make in GARBAGE.items()),
        ("parse a pathological comment", pathological_comment, parse_text),
    ]
    for name, make, fn in cases:
        result = bench_parse(fn, make(), name=name, input_name="10 MB", seconds=seconds,
                             rounds=1)
        rows.append(Row(name, result.seconds_per_parse, PARSE_BUDGET_S))
    return rows


def bench_fleet() -> Row:
    """The collector fleet's kill-and-restart run: seconds per scrape of a steady replica."""
    from test_collector_fleet import SCRAPE_INTERVAL_S, kill_and_restart

    from collector.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        cfg, elapsed = kill_and_restart(Path(tmp))
        with Store(cfg.store_path()) as store:
            up = {k.as_dict()["instance"]: v for k, v in store.points("up").items()}
    scrapes = min(len(up["r0"]), len(up["r1"]))
    return Row(f"collector fleet: seconds per scrape ({SCRAPE_INTERVAL_S:g} s interval)",
               elapsed / max(scrapes, 1), SCRAPE_INTERVAL_S / SCRAPE_SHARE)


def bench_demo() -> Row:
    """``vigil demo`` until its story is told (or the budget passed)."""
    from test_demo import start_demo

    with tempfile.TemporaryDirectory() as tmp:
        demo = start_demo(Path(tmp))
        try:
            waited = demo.wait_for_story(STORY_BUDGET_S * 1.5)
            told = demo.told()
        finally:
            demo.stop()
    return Row("vigil demo: the story told" + ("" if told else " (not told)"), waited,
               STORY_BUDGET_S)


def markdown(rows: list[Row]) -> str:
    lines = ["| workload | measured s | budget s | measured / budget |",
             "| --- | ---: | ---: | ---: |"]
    lines += [f"| {r.workload} | {r.measured_s:.3f} | {r.budget_s:.3f} | {r.ratio:.3f} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5,
                        help="timing per parse workload, seconds (default 0.5)")
    parser.add_argument("--no-fleet", action="store_true",
                        help="skip the collector fleet (three simulated replicas, ~15 s)")
    parser.add_argument("--demo", action="store_true",
                        help="also time `vigil demo`'s story (up to 5 minutes)")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"Python {platform.python_version()}, {platform.machine()}, "
          f"{os.cpu_count()} cores, load average {load:.2f}.\n")
    rows = bench_parser(args.seconds)
    if not args.no_fleet:
        rows.append(bench_fleet())
    if args.demo:
        rows.append(bench_demo())
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
