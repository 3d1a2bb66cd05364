"""The OTLP receiver's throughput: spans per second that ``OtlpReceiver.receive`` takes, from
protobuf exports of 512 spans (256 requests, each a LiteLLM-shaped router span and a
vLLM-shaped engine span joined on the request id), until every record is written.

Run: ``.venv/bin/python bench/otlp_bench.py [--exports 40] [--rounds 3] [--postgres]
[--database postgresql://...]``

Each round starts a receiver on a fresh records database (an SQLite file; with
``--postgres`` also a throw-away PostgreSQL server started as the tests start theirs, or
``--database``), calls ``receive`` with the exports one after the other (no HTTP: the
protocol, the mapping, the join and the writer are what is measured), then moves the
receiver's clock past the join window, releases every request and waits until the writer has
written them. Reported per database: spans/s over the whole round (the median round) and
records/s. Prints a Markdown table. Not part of the test suite; the machine's load matters
(the load average is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from bench.processes import fresh_postgres
from serving.otlp.receiver import PROTOBUF, OtlpReceiver
from vigil.clock import ManualClock
from vigil.config import Config, parse_config

SPANS_PER_EXPORT = 512
T0_NS = 1_795_000_000_000_000_000


def _kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def export(first: int) -> bytes:
    """One export: requests ``first`` .. ``first + 255``, router and engine span each, in
    separate resources as two senders' batches would be after a collector merged them."""
    req = ExportTraceServiceRequest()
    router = req.resource_spans.add()
    router.resource.attributes.append(_kv("service.name", "litellm"))
    engine = req.resource_spans.add()
    engine.resource.attributes.extend([_kv("service.name", "vllm"),
                                       _kv("vigil.pool", "chat")])
    routers = router.scope_spans.add().spans
    engines = engine.scope_spans.add().spans
    for i in range(first, first + SPANS_PER_EXPORT // 2):
        rid = f"chatcmpl-{i:024x}"
        start = T0_NS + i * 1_000_000
        routers.append(Span(
            trace_id=i.to_bytes(16, "big"), span_id=(2 * i + 1).to_bytes(8, "big"),
            name="litellm_request", kind=Span.SPAN_KIND_INTERNAL,
            start_time_unix_nano=start, end_time_unix_nano=start + 4_500_000_000,
            attributes=[_kv("gen_ai.request.model", "meta-llama/Llama-3.1-8B-Instruct"),
                        _kv("gen_ai.response.id", rid), _kv("gen_ai.usage.input_tokens", 812),
                        _kv("gen_ai.usage.output_tokens", 256),
                        _kv("llm.request.type", "acompletion"),
                        _kv("llm.is_streaming", "True"),
                        _kv("metadata.user_api_key_alias", f"tenant-{i % 50}"),
                        _kv("metadata.user_api_key_hash", "88dc28d0f030c55ed4ab77ed8f")]))
        engines.append(Span(
            trace_id=(10**9 + i).to_bytes(16, "big"), span_id=(2 * i + 2).to_bytes(8, "big"),
            name="llm_request", kind=Span.SPAN_KIND_SERVER,
            start_time_unix_nano=start + 100_000_000,
            end_time_unix_nano=start + 4_350_000_000,
            attributes=[_kv("gen_ai.request.id", rid), _kv("gen_ai.usage.prompt_tokens", 812),
                        _kv("gen_ai.usage.completion_tokens", 256),
                        _kv("gen_ai.latency.time_to_first_token", 0.183),
                        _kv("gen_ai.latency.time_in_queue", 0.0125),
                        _kv("gen_ai.latency.e2e", 4.25),
                        _kv("gen_ai.request.max_tokens", 1024)]))
    return bytes(req.SerializeToString())


def config(records: Path, database: str) -> Config:
    return parse_config({
        "pools": [{"name": "chat", "model": "meta-llama/Llama-3.1-8B-Instruct"}],
        "gateway": {"records_path": str(records), "database": database},
        "otlp": {"join_window": 15, "max_buffer": 1_000_000},
    })


def run_round(cfg: Config, bodies: list[bytes]) -> tuple[float, float]:
    """Every body into a fresh receiver, until written; (spans/s, records/s)."""
    clock = ManualClock(T0_NS * 1e-9)
    receiver = OtlpReceiver(cfg, clock=clock, tick_interval=None)
    receiver.start()
    try:
        begin = time.perf_counter()
        for body in bodies:
            reply = receiver.receive(body, PROTOBUF, "")
            if reply.status != 200:
                raise SystemExit(f"export answered {reply.status}: {reply.body[:200]!r}")
        clock.advance(cfg.otlp.join_window + 1)
        receiver.tick()
        if not receiver.flush(timeout=600):
            raise SystemExit("records not written within 600 s")
        total = time.perf_counter() - begin
        counts = receiver.counts()
    finally:
        receiver.close()
    spans = len(bodies) * SPANS_PER_EXPORT
    if counts["spans"]["recorded"] != spans or counts["written"] != spans // 2:
        raise SystemExit(f"not every span recorded: {counts}")
    return spans / total, counts["written"] / total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--exports", type=int, default=40, help="exports of 512 spans per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--postgres", action="store_true",
                   help="also into a throw-away PostgreSQL server")
    p.add_argument("--database", default="", help="also into this PostgreSQL server's "
                                                  "(a fresh database on it per round)")
    args = p.parse_args()
    bodies = [export(k * SPANS_PER_EXPORT // 2) for k in range(args.exports)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="otlp-bench-") as work, \
            contextlib.ExitStack() as stack:
        targets: list[tuple[str, Any]] = [("SQLite", None)]
        if args.database or args.postgres:
            if args.database:
                url = args.database
            else:
                from bench.processes import postgres

                url = stack.enter_context(postgres())
            targets.append(("PostgreSQL", url))
        for name, url in targets:
            results = []
            for r in range(args.rounds):
                records = Path(work) / f"records-{name}-{r}.db"
                database = fresh_postgres(url, f"otlp_bench_{r}") if url else ""
                results.append(run_round(config(records, database), bodies))
            spans_s = statistics.median(x[0] for x in results)
            records_s = statistics.median(x[1] for x in results)
            rows.append((name, spans_s, records_s))
    load = os.getloadavg()
    print(f"{args.exports} exports x {SPANS_PER_EXPORT} spans ({args.exports * 256} requests), "
          f"median of {args.rounds} rounds; load average {load[0]:.2f} on "
          f"{os.cpu_count()} CPUs\n")
    print("| database | spans/s | records/s |")
    print("| --- | ---: | ---: |")
    for name, spans_s, records_s in rows:
        print(f"| {name} | {spans_s:,.0f} | {records_s:,.0f} |")


if __name__ == "__main__":
    main()
