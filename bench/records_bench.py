"""The gateway records writer's throughput: records/s into PostgreSQL (and SQLite), and the
cost of ``RecordWriter.put`` on the request path while the writer thread is busy.

Run: ``.venv/bin/python bench/records_bench.py [--records 50000] [--rounds 3]
[--database postgresql://...] [--sqlite]``

Without ``--database`` a throw-away PostgreSQL server is started (the server binaries of
Debian's ``postgresql`` package, as the tests use them: ``fsync=off``). Each round writes
``--records`` distinct records into a fresh table: ``put`` them all as fast as the caller can
(the buffer holds them all: nothing is dropped), then ``flush``. Reported per round:

* ``records/s``: records divided by the time from the first ``put`` to the end of ``flush``;
* ``put``: the mean cost of one ``put`` call (the loop's time over the records), microseconds,
  measured while the writer thread competes for the GIL, as on a busy gateway.

Prints a Markdown table. Not part of the test suite; the machine's load matters (the load
average is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import fresh_postgres, postgres
from serving.gateway.telemetry.record_writer import RecordWriter
from vigil.storage.gateway_records import GatewayRecord


def record(i: int) -> GatewayRecord:
    """A typical served streaming request (every text column filled)."""
    return GatewayRecord(
        id=f"vgl-{i:012x}", start_s=1_764_000_000.0 + i * 1e-3, ts_s=1_764_000_001.5 + i * 1e-3,
        pool="chat", model="meta-llama/Llama-3.1-8B-Instruct", endpoint="chat", tenant="acme",
        tier="standard", key_id="0123456789ab", replica="replica-3", status=200, stream=True,
        prompt_tokens=812, completion_tokens=256, tokens_source="usage", ttft_s=0.183,
        e2e_s=4.27, queue_s=0.0012, error=False, error_class="", cache_hit="",
        requested_max_tokens=None, max_tokens=1024, max_tokens_decision="default",
        cost_usd=0.000412, saved_usd=None, upstream_id=f"chatcmpl-{i:032x}", batch_id="",
        message="")


def run_round(target: str | Path, n: int) -> tuple[float, float]:
    """Write ``n`` records to ``target``; (records per second, mean put cost in µs)."""
    records = [record(i) for i in range(n)]
    writer = RecordWriter(target, max_queue=n + 1)
    writer.start()
    try:
        begin = time.perf_counter()
        for r in records:
            writer.put(r)
        put_s = time.perf_counter() - begin
        if not writer.flush(timeout=600):
            raise SystemExit(f"not written within 600 s: {writer.written} of {n}")
        total_s = time.perf_counter() - begin
    finally:
        writer.close()
    if writer.written != n or writer.dropped:
        raise SystemExit(f"wrote {writer.written}, dropped {writer.dropped} of {n}")
    return n / total_s, put_s / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database", default="", help="postgresql:// URL of a server to use "
                        "(a database per round is created on it and dropped)")
    parser.add_argument("--sqlite", action="store_true", help="also time an SQLite file")
    args = parser.parse_args()
    rows: list[tuple[str, float, float]] = []
    with contextlib.ExitStack() as stack:
        url = args.database or stack.enter_context(postgres())
        for k in range(args.rounds):
            rows.append(("PostgreSQL", *run_round(fresh_postgres(url, f"records_bench_{k}"),
                                                  args.records)))
        if args.sqlite:
            for _ in range(args.rounds):
                with tempfile.TemporaryDirectory() as tmp:
                    rows.append(("SQLite", *run_round(Path(tmp) / "gw.db", args.records)))
    print(f"{args.records} records per round; load average {os.getloadavg()[0]:.2f}\n")
    print("| database | records/s | put (µs) |")
    print("|---|---:|---:|")
    for name, rate, put_us in rows:
        print(f"| {name} | {rate:,.0f} | {put_us:.2f} |")


if __name__ == "__main__":
    main()
