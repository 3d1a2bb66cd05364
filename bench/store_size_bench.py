"""Bytes per sample of the embedded store on a DCGM-heavy mix, written as the collector writes.

Run: ``.venv/bin/python bench/store_size_bench.py [--gpus 8] [--days 7] [--span-hours 6]``

The DCGM mix of ``bench/chunk_codec_bench.py`` (per GPU: utilisation, framebuffer, power,
temperature, two clocks and an energy counter, at 15 s with scrape jitter) is written to a new
store one hour of scrapes per ``Store.write`` (every GPU's samples of each scrape together, as a
scrape round writes them), with ``Store.compact`` every 15 minutes of data on a clock that
follows the data, as ``vigil serve`` runs it: the head moves, the rollup advances and every
six-hour span past it is sealed into chunks. Default retention (48 h raw, then one sample a
minute) would thin the mix to a quarter; this bench keeps every sample (retention longer than
the data) to measure the chunks on the samples as scraped. Prints one Markdown table row: the
file's size (database + WAL) and bytes per sample, the write rate and the time compaction took
in all. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import chunk_codec_bench  # noqa: E402 - the DCGM mix

from collector.store import Store  # noqa: E402
from vigil.model import SeriesKey, labels_of  # noqa: E402

FIELDS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
          "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
          "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
HOUR_MS = 3_600_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--span-hours", type=int, default=6)
    args = parser.parse_args(argv)

    series = list(chunk_codec_bench.dcgm_series(args.gpus, args.days))
    keys = []
    for i in range(len(series)):
        gpu, field = divmod(i, len(FIELDS))
        family = "counter" if field == len(FIELDS) - 1 else "gauge"
        keys.append((SeriesKey(FIELDS[field], labels_of(
            {"gpu": str(gpu), "UUID": f"GPU-{gpu:04d}", "Hostname": "node-0"})), family))
    ts = series[0][0]
    values = np.stack([v for _, v in series])  # (series, scrapes)
    total = values.size
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "vigil.db"
        now = {"s": float(ts[0]) / 1000}
        write_s = compact_s = 0.0
        with Store(path, clock=lambda: now["s"], raw_retention_s=400 * 86400,
                   downsampled_retention_s=400 * 86400,
                   chunk_span_s=args.span_hours * 3600) as store:
            start = 0
            next_compact = int(ts[0]) + 15 * 60_000
            while start < ts.size:
                end = int(np.searchsorted(ts, ts[start] + HOUR_MS, side="left"))
                end = max(end, start + 1)
                rows = [(k, fam, t, v)
                        for j, t in enumerate(ts[start:end].tolist())
                        for (k, fam), v in zip(keys, values[:, start + j].tolist(), strict=True)]
                t0 = time.perf_counter()
                store.write(rows)
                write_s += time.perf_counter() - t0
                start = end
                last = int(ts[end - 1])
                while next_compact <= last:
                    now["s"] = next_compact / 1000
                    t0 = time.perf_counter()
                    store.compact()
                    compact_s += time.perf_counter() - t0
                    next_compact += 15 * 60_000
            now["s"] = float(ts[-1]) / 1000 + 60
            t0 = time.perf_counter()
            store.compact()
            compact_s += time.perf_counter() - t0
            c = store._c
            in_chunks, blob = c.execute(
                "SELECT COALESCE(SUM(n), 0), COALESCE(SUM(length(data)), 0) FROM chunks"
            ).fetchone()
            free, pages, page = (c.execute(f"PRAGMA {p}").fetchone()[0]
                                 for p in ("freelist_count", "page_count", "page_size"))
            files = {p.name: p.stat().st_size for p in Path(d).iterdir()}
            print(f"  files {files}; pages {pages} ({free} free) of {page} B; chunk blobs "
                  f"{blob / in_chunks:.2f} B/sample", file=sys.stderr)
        size = sum(p.stat().st_size for p in Path(d).iterdir() if p.name.startswith("vigil"))
    print("| data | samples | in chunks | on disk | bytes/sample | write() | compact(), in all |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| DCGM mix, {args.gpus} GPUs × {args.days:g} d at 15 s, {args.span_hours} h chunks "
          f"| {total:,} | {in_chunks / total:.1%} | {size / 1e6:.1f} MB | **{size / total:.2f}** "
          f"| {total / write_s / 1000:.0f}k samples/s | {compact_s:.1f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
