"""The dashboard's Overview and Quality pages over 7 days of 1-minute data for 8 replicas.

Run: ``.venv/bin/python bench/dashboard_bench.py [--replicas 8] [--days 7] [--data DIR]
[--ranges 6h,24h,7d]``

1. Builds (once; cached in ``--data``, default ``/tmp/vigil-dashboard-bench``) a store with
   ``bench/slo_bench.py``'s generator: one pool of vLLM replicas, every series the SLOs,
   quantiles, cost and scaling read, a diurnal load, a down stretch and two restarts, then
   compacted (rollup built) as the collector leaves it.
2. Renders each page with Streamlit's ``AppTest`` (the real app, pinned to the end of the
   data through the URL's ``at``), in one process so that Streamlit's caches are shared as in
   a server:

   * **first load**: empty caches (the config, the store, every engine evaluation);
   * **after the first load**: the same page again, another session (what a second user or a
     reload costs; the issue's target is < 2 s);
   * **refresh**: the end moved one minute later (a live page's auto-refresh): the chart
     grids keep their cached points, only the newest ones are evaluated.

Prints a Markdown table (seconds, best of ``--repeat`` for the cached cases).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import slo_bench  # noqa: E402 - the generator of bench/slo_bench.py

from vigil.conventions import DASHBOARD_ENV_CONFIG  # noqa: E402

APP = ROOT / "dashboard" / "app.py"
PAGES = {"Overview": None, "Quality": "views/quality.py"}
TARGET_S = 2.0


def write_config(folder: Path, db: Path, replicas: int) -> Path:
    """A config over the bench store: one pool, one vLLM target per replica (never scraped)."""
    lines = [f'[store]\npath = "{db}"',
             f'[[pools]]\nname = "{slo_bench.POOL}"\nmodel = "{slo_bench.MODEL}"\n'
             f'gpu = "H100"\nmax_replicas = {2 * replicas}']
    for r in range(replicas):
        lines.append(f'[[targets]]\nname = "{slo_bench.POOL}-{r:02d}"\n'
                     f'url = "http://127.0.0.1:9/metrics"\npool = "{slo_bench.POOL}"')
    path = folder / "vigil.toml"
    path.write_text("\n\n".join(lines) + "\n")
    return path


def render(page: str | None, at_s: float, range_key: str) -> float:
    """Seconds to run the app's script for ``page`` once, in a new session."""
    from streamlit.testing.v1 import AppTest

    app = AppTest.from_file(str(APP), default_timeout=600)
    app.query_params["at"] = repr(at_s)
    app.query_params["range"] = range_key
    if page is not None:
        # A session lands on a page: the first run registers the pages, the second is the
        # page itself (timed).
        app.run()
        app.switch_page(page)
    t0 = time.perf_counter()
    app.run()
    elapsed = time.perf_counter() - t0
    if app.exception:
        raise RuntimeError(f"{page}: {[e.value for e in app.exception]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--ranges", default="6h,24h,7d",
                        help="time ranges to render, comma-separated (the dashboard's choices)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("/tmp/vigil-dashboard-bench"))
    args = parser.parse_args(argv)

    size = slo_bench.Size(args.replicas, args.days)
    store_dir = args.data / f"store-{size.name}"
    built = slo_bench._cached(store_dir, size, "store",
                              lambda: slo_bench.build_store(store_dir / "vigil.db", size))
    config = write_config(args.data, store_dir / "vigil.db", args.replicas)
    os.environ[DASHBOARD_ENV_CONFIG] = str(config)
    end = slo_bench.END_MS / 1000

    rows = []
    met = True
    for range_key in args.ranges.split(","):
        for name, page in PAGES.items():
            first = render(page, end, range_key)
            again = min(render(page, end, range_key) for _ in range(args.repeat))
            refresh = min(render(page, end + 60.0 * (i + 1), range_key)
                          for i in range(args.repeat))
            met = met and again < TARGET_S
            ok = "yes" if again < TARGET_S else "**no**"
            rows.append(f"| {name} | {range_key} | {first:.2f} s | **{again:.2f} s** "
                        f"| {refresh:.2f} s | {ok} |")
            print(f"  {name} {range_key}: first {first:.2f} s, again {again:.2f} s, "
                  f"refresh {refresh:.2f} s", file=sys.stderr, flush=True)

    print(f"\nDashboard pages over {args.replicas} replicas × {args.days:g} days of 1-minute "
          f"data ({int(built['rows']):,} samples), `AppTest` in one process, "
          f"{os.cpu_count()} CPUs; best of {args.repeat} for the cached cases\n")
    print("| page | range | first load | after the first load | refresh (end + 1 min) "
          f"| < {TARGET_S:g} s |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
