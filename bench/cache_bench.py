"""Semantic-cache lookup latency over 100k cached entries (target: p50 < 15 ms).

Run: ``.venv/bin/python bench/cache_bench.py [--entries 100000] [--queries 300] [--threads N]
[--backends onnx,torch]``

1. Loads the real all-MiniLM-L6-v2 (``LocalEmbedder``, offline) once per backend (ONNX Runtime
   and torch) and builds one ``SemanticCache`` whose embedder switches between them, so both
   are timed over the same entries and the same machine load.
2. Fills it with ``--entries`` entries, all in ONE L2 partition (the worst case: the search
   scans every row; real traffic spreads over tenants, models and system prompts). Their
   embeddings are **synthetic random unit vectors** (embedding 100k texts would take half an
   hour on a laptop CPU, and the search costs the same for any vectors); each entry also gets
   a real response body (~0.7 kB) and query text. 200 of them are real embeddings of
   FAQ questions, so paraphrases can hit.
3. Times, over ``--queries`` distinct real questions (every query embedding is real):
   * ``lookup, L2 miss``: ``SemanticCache.lookup`` of a new question (exact L1 probe, embedding,
     search of all rows in a worker thread, re-scoring) - the full cost of a miss;
   * ``lookup, L2 hit``: a paraphrase of a stored question (plus guard and response copy);
   * ``lookup, L1 hit``: an exact repeat (hash probe and response copy, no embedding);
   * the three rows above that embed are timed with each backend;
   * ``embedding``: ``LocalEmbedder.embed`` alone; ``search``: ``VectorIndex.search`` alone,
     over the random rows (most pruned by the bound) and over 100k rows clustered at cosine
     ~0.8 around the query embeddings (the hard case: thousands of rows pass the bound);
   * ``decide``: the bypass rules and the key hashes.
4. Reports the index memory (matrix capacity) and the process's RSS growth for the fill.

Prints a Markdown table, with the figures of the torch-only run that docs/benchmarks.md
recorded before the ONNX backend (``BEFORE``) beside the new ones. Not part of the test suite.
The machine's load matters (2 shared cores): the load average is printed with the results.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from serving.cache import LocalEmbedder, SemanticCache  # noqa: E402
from serving.cache.embedder import Backend, Embedder, default_threads  # noqa: E402
from serving.cache.index import VectorIndex  # noqa: E402
from serving.cache.responses import encode  # noqa: E402
from serving.sim.protocol import chat_response  # noqa: E402
from vigil.config import CacheConfig  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SUBJECTS = ["my password", "my email address", "two-factor authentication", "my invoice",
            "the API key", "my subscription", "the billing address", "a team member",
            "the webhook URL", "my username", "the default model", "the rate limit",
            "a support ticket", "the dark theme", "my profile picture", "the audit log",
            "a project", "the data export", "the SSO settings", "my phone number"]
ASKS = ["How do I change {}?", "Where can I find {}?", "Why can't I update {}?",
        "Who can see {}?", "What happens when I delete {}?", "How long does it take to update {}?",
        "Can I share {} with my team?", "Is there an API to manage {}?",
        "How do I reset {}?", "What are the limits on {}?"]
PARAPHRASE = {"How do I change {}?": "What is the way to change {}?",
              "How do I reset {}?": "What is the way to reset {}?"}


#: p50 and p99 (ms) of the run recorded in docs/benchmarks.md before the ONNX backend: torch,
#: 1 embedder thread, load average ~4.6 on the 2-core VM.
BEFORE: dict[str, tuple[float, float]] = {
    "miss": (23.9, 115.6), "hit_l2": (21.1, 56.6), "hit_l1": (0.15, 0.28),
    "embed": (19.3, 64.0), "search": (1.95, 7.7), "search_clustered": (3.4, 27.7),
    "decide": (0.15, 2.8),
}


class SwitchedEmbedder:
    """Hands each embed to the backend chosen before the call, so one filled cache serves
    every backend's rows."""

    def __init__(self, embedders: dict[str, LocalEmbedder]):
        self.embedders = embedders
        self.current: Embedder = next(iter(embedders.values()))
        self.source = "bench"

    async def warm_up(self) -> None:
        for embedder in self.embedders.values():
            await embedder.warm_up()

    async def embed(self, text: str) -> np.ndarray | None:
        return await self.current.embed(text)

    async def aclose(self) -> None:
        for embedder in self.embedders.values():
            await embedder.aclose()


def questions() -> list[str]:
    return [a.format(s) for s in SUBJECTS for a in ASKS]


def body(text: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "system", "content": "You are a helpful "
                                          "support assistant."},
                                         {"role": "user", "content": text}],
            "temperature": 0, "max_tokens": 512}


def response(text: str) -> dict[str, Any]:
    return chat_response(rid="chatcmpl-bench", created=0, model=MODEL,
                         text=text + " " + "Open Settings and follow the steps. " * 12,
                         finish_reason="stop", prompt_tokens=30, completion_tokens=120)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rss_mb() -> float:
    # ru_maxrss is in kB on Linux; the fill dominates the peak.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def interleaved(fns: list[Callable[[], Awaitable[Any]]], n: int
                      ) -> list[tuple[list[float], list[float]]]:
    """(wall seconds, process CPU seconds) of ``n`` calls of each function, called in turn
    (round robin) so that the machine's load changes weigh on every row alike. CPU time is
    not inflated by waiting for a core: with one embedder thread it approximates the latency
    on an idle machine (with more threads it adds theirs up)."""
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in fns]
    for _ in range(n):
        for fn, (wall, cpu) in zip(fns, out, strict=True):
            start, start_cpu = time.perf_counter(), time.process_time()
            await fn()
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return out


# (what, backend or "", timings or None for a note, key of BEFORE or "", target)
Row = tuple[str, str, tuple[list[float], list[float]] | None, str, str]


async def run(entries: int, n_queries: int, threads: int | None,
              backends: list[Backend]) -> list[Row]:
    embedders: dict[str, LocalEmbedder] = {}
    for backend in backends:
        local = LocalEmbedder(threads=threads, backend=backend)
        t = time.perf_counter()
        await local.warm_up()
        print(f"{backend}: model loaded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        embedders[backend] = local
    embedder = SwitchedEmbedder(embedders)
    cfg = CacheConfig(enabled=True, max_entries=entries + 1000)
    cache = SemanticCache.from_config(cfg, embedder=embedder)
    qs = questions()
    stored_real = qs[: min(200, len(qs))]

    def decide(text: str) -> Any:
        key = cache.decide(pool="chat", tenant="acme", endpoint="chat", body=body(text),
                           headers={}).key
        assert key is not None
        return key

    # Fill: synthetic vectors straight into the store (the bench's one private access: going
    # through store() would embed 100k texts), then real ones through the public API.
    rss0 = rss_mb()
    partition = decide(qs[0]).l2_partition
    rng = np.random.default_rng(5)
    body_bytes = encode(response("A cached answer."))
    synthetic = entries - len(stored_real)
    t = time.perf_counter()
    for start in range(0, synthetic, 10_000):
        block = rng.standard_normal((min(10_000, synthetic - start), 384), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        for i, vec in enumerate(block):
            n = start + i
            cache._store.put(l1=f"synthetic-{n}", body=body_bytes, l2_partition=partition,
                             vector=vec, query=f"synthetic question {n}")
    for text in stored_real:
        await cache.store(decide(text), response(text))
    fill_s = time.perf_counter() - t
    rss1 = rss_mb()
    stats = cache.stats()
    assert stats.entries == entries and stats.partitions == 1, stats
    print(f"filled {entries} entries in {fill_s:.1f} s", file=sys.stderr)

    new_questions = [f"{a.format(s)} (case {i})" for i, (a, s) in enumerate(
        (a, s) for s in SUBJECTS for a in ASKS)]
    paraphrases = [PARAPHRASE[a].format(s) for s in SUBJECTS for a in PARAPHRASE]
    for local in embedders.values():
        embedder.current = local
        for _ in range(5):  # warm the threads and BLAS
            await cache.lookup(decide(new_questions[0]))

    it = iter(range(10**9))

    async def miss() -> None:
        text = new_questions[next(it) % len(new_questions)]
        key = decide(text + f" #{next(it)}")
        if await cache.lookup(key) is not None:
            raise AssertionError(f"unexpected hit for {text!r}")

    async def hit_l2() -> None:
        key = decide(paraphrases[next(it) % len(paraphrases)])
        found = await cache.lookup(key)
        if found is None or found.layer != "l2":
            raise AssertionError("expected an L2 hit")

    async def hit_l1() -> None:
        key = decide(stored_real[next(it) % len(stored_real)])
        found = await cache.lookup(key)
        if found is None or found.layer != "l1":
            raise AssertionError("expected an L1 hit")

    async def embed() -> None:
        await embedder.current.embed(new_questions[next(it) % len(new_questions)])

    index = cache._store.index(partition)
    assert index is not None
    query_vectors = [await embedder.embed(q) for q in new_questions[:50]]

    async def search() -> None:
        vec = query_vectors[next(it) % len(query_vectors)]
        index.search(vec, threshold=cfg.similarity_threshold, limit=8)

    # The hard case for the pruning: 100k rows clustered around the real query embeddings
    # (cosine ~0.8 to their centre), so thousands of rows pass the bound for every query.
    centres = np.stack(query_vectors)
    picks = centres[rng.integers(0, len(centres), entries)]
    noisy = picks + 0.75 * rng.standard_normal(picks.shape, dtype=np.float32) / 384**0.5
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    clustered = VectorIndex(384)
    for i, vec in enumerate(noisy):
        clustered.add(i, vec)
    del noisy, picks

    async def search_clustered() -> None:
        vec = query_vectors[next(it) % len(query_vectors)]
        clustered.search(vec, threshold=cfg.similarity_threshold, limit=8)

    async def decide_only() -> None:
        decide(new_questions[next(it) % len(new_questions)])

    def on(backend: str, fn: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            embedder.current = embedders[backend]
            await fn()
        return call

    names: list[tuple[str, str, Callable[[], Awaitable[None]], str, str]] = []
    for backend in embedders:
        names += [
            ("lookup, L2 miss (embedding + search)", backend, on(backend, miss), "miss",
             "p50 < 15 ms"),
            ("lookup, L2 hit (paraphrase)", backend, on(backend, hit_l2), "hit_l2",
             "p50 < 15 ms"),
            ("embedding alone (all-MiniLM-L6-v2, CPU)", backend, on(backend, embed), "embed",
             ""),
        ]
    names += [
        ("lookup, L1 hit (exact repeat)", "", hit_l1, "hit_l1", ""),
        (f"search alone ({entries:,} x 384, random rows)", "", search, "search", ""),
        (f"search alone ({entries:,} x 384, rows at cos ~0.8 to the queries)", "",
         search_clustered, "search_clustered", ""),
        ("decide (rules + key hashes)", "", decide_only, "decide", ""),
    ]
    times = await interleaved([fn for _, _, fn, _, _ in names], n_queries)
    rows: list[Row] = [(name, backend, t, before, target)
                       for (name, backend, _, before, target), t
                       in zip(names, times, strict=True)]
    mem = (f"index matrix {stats.index_bytes / 2**20:.0f} MiB (capacity), process RSS "
           f"+{rss1 - rss0:.0f} MiB for {entries:,} entries "
           f"({(rss1 - rss0) * 1024 / entries:.2f} kB/entry incl. response bodies)")
    rows.append((mem, "", None, "", ""))
    await cache.aclose()
    await embedder.aclose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads of the embedder (default: default_threads())")
    parser.add_argument("--backends", default="onnx,torch",
                        help="comma-separated local embedder backends to time "
                             "(onnx, torch, auto)")
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or any(b not in ("onnx", "torch", "auto") for b in backends):
        parser.error(f"--backends: onnx, torch or auto, got {args.backends!r}")
    rows = asyncio.run(run(args.entries, args.queries, args.threads, backends))
    load = os.getloadavg()
    threads = args.threads if args.threads is not None else default_threads()
    print(f"\n{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{args.queries} queries each; embedder threads {threads}\n")
    print("| what | backend | p50 | p95 | p99 | mean | CPU p50 | before: p50 / p99 (torch) "
          "| target |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, backend, values, before, target in rows:
        if values is None:
            print(f"| {name} | | | | | | | | |")
            continue
        ms = [v * 1000 for v in values[0]]
        cpu = [v * 1000 for v in values[1]]
        old = f"{BEFORE[before][0]} / {BEFORE[before][1]} ms" if before in BEFORE else ""
        print(f"| {name} | {backend} | {pct(ms, 0.5):.2f} ms | {pct(ms, 0.95):.2f} ms | "
              f"{pct(ms, 0.99):.2f} ms | {statistics.fmean(ms):.2f} ms | "
              f"{pct(cpu, 0.5):.2f} ms | {old} | {target} |")


if __name__ == "__main__":
    main()
