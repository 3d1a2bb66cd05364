"""Bytes per sample of candidate chunk codecs on vLLM and DCGM series: which one the embedded
store's compressed chunks should use.

Run: ``.venv/bin/python bench/chunk_codec_bench.py [--replicas 2] [--data DIR]``

The vLLM series are ``bench/slo_bench.py``'s (20 replicas × 30 days of one-minute samples,
built once and cached in ``--data``, the system's temporary folder by default): every series
of the first ``--replicas`` replicas, histograms with vLLM's bucket lists, counters with
resets, KV usage and queue gauges. The DCGM mix is synthetic, shaped like the DCGM
exporter's fields (``tests/fixtures`` has a real capture): per GPU, utilisation (whole percent,
noisy), framebuffer used (MiB, slowly moving), power (W with three decimals), temperature and
clocks (whole numbers, mostly constant), energy (a counter in mJ), at a 15-second interval.

Each series is cut into chunks of ``N`` samples (as Prometheus cuts 120) and each chunk encoded
by each codec; the sizes include every byte the chunk needs to be decoded alone (timestamps,
values, the staleness mask). Every codec is checked to round-trip bit for bit before it is
timed. Codecs:

* ``raw``: int64 timestamps and float64 values as they are (16 bytes per sample);
* ``delta+zlib``: delta-of-delta timestamps and XOR-with-previous values, byte-shuffled, then
  zlib (the standard library; Gorilla's ideas with a general compressor in place of bit
  packing);
* ``delta+zstd``: the same, zstandard at level 3;
* ``pcodec``: pcodec 1.x (a maintained numeric codec, Rust, with its own delta and
  bit-packing modes chosen per chunk) on the timestamps and on the values.

Prometheus 2.42's TSDB (Gorilla chunks) holds the same 30-day vLLM data in 2.3 bytes per
sample (docs/benchmarks.md#store). With ``--on-disk``, every series of all 20 replicas is also
written in ``collector.store.chunks`` blobs of 1,440 samples to a fresh SQLite file (a
rowid table with a unique index on series and first timestamp, as the store would keep them) and
the file's size after ``VACUUM`` is divided by the samples: what the chunks cost on disk with
SQLite's pages and keys. Prints Markdown tables. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import slo_bench  # noqa: E402

from collector.store import Store  # noqa: E402
from collector.store.chunks import encode_chunk  # noqa: E402

Chunk = tuple[np.ndarray, np.ndarray]  # int64 ms, float64 (NaN where stale)
Codec = tuple[Callable[[np.ndarray, np.ndarray], bytes],
              Callable[[bytes, int], tuple[np.ndarray, np.ndarray]]]


def _shuffle(words: np.ndarray) -> bytes:
    """The bytes of 8-byte words, byte planes first (the high bytes of slowly changing values
    are runs of zeros a general compressor squeezes)."""
    return words.view(np.uint8).reshape(-1, 8).T.tobytes()


def _unshuffle(data: bytes, n: int) -> np.ndarray:
    return np.frombuffer(data, np.uint8).reshape(8, n).T.copy().view(np.uint64).reshape(n)


def _delta_encode(ts: np.ndarray, vals: np.ndarray) -> bytes:
    n = ts.size
    d = np.diff(ts, prepend=ts[:1])
    dod = np.diff(d, prepend=np.int64(0))
    dod[0] = ts[0]
    bits = vals.view(np.uint64)
    xor = bits ^ np.concatenate(([np.uint64(0)], bits[:-1]))
    return n.to_bytes(4, "little") + _shuffle(dod.view(np.uint64)) + _shuffle(xor)


def _delta_decode(raw: bytes) -> tuple[np.ndarray, np.ndarray]:
    n = int.from_bytes(raw[:4], "little")
    dod = _unshuffle(raw[4:4 + 8 * n], n).view(np.int64)
    xor = _unshuffle(raw[4 + 8 * n:], n)
    d = dod.copy()
    d[0] = 0
    ts = dod[0] + np.cumsum(np.cumsum(d))
    bits = np.bitwise_xor.accumulate(xor)
    return ts, bits.view(np.float64)


def _codecs() -> dict[str, Codec]:
    out: dict[str, Codec] = {
        "raw": (lambda ts, v: ts.tobytes() + v.tobytes(),
                lambda b, n: (np.frombuffer(b[:8 * n], np.int64),
                              np.frombuffer(b[8 * n:], np.float64))),
        "delta+zlib": (lambda ts, v: zlib.compress(_delta_encode(ts, v), 6),
                       lambda b, n: _delta_decode(zlib.decompress(b))),
    }
    try:
        import zstandard

        cz, dz = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
        out["delta+zstd"] = (lambda ts, v: cz.compress(_delta_encode(ts, v)),
                             lambda b, n: _delta_decode(dz.decompress(b)))
    except ImportError:
        print("zstandard not installed: skipping delta+zstd", file=sys.stderr)
    try:
        from pcodec import ChunkConfig, standalone

        config = ChunkConfig()

        def pco_encode(ts: np.ndarray, v: np.ndarray) -> bytes:
            a = standalone.simple_compress(ts, config)
            return len(a).to_bytes(4, "little") + a + standalone.simple_compress(v, config)

        def pco_decode(b: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
            k = int.from_bytes(b[:4], "little")
            return (standalone.simple_decompress(b[4:4 + k]),
                    standalone.simple_decompress(b[4 + k:]))

        out["pcodec"] = (pco_encode, pco_decode)
    except ImportError:
        print("pcodec not installed: skipping pcodec", file=sys.stderr)
    return out


def _stale_bytes(stale: np.ndarray) -> int:
    """What the staleness mask costs a chunk: nothing when no sample is a marker (a flag),
    else its packed bits, compressed."""
    return 1 if not stale.any() else 1 + len(zlib.compress(np.packbits(stale).tobytes()))


def vllm_series(store_path: Path, replicas: int) -> Iterator[Chunk]:
    """Every series of the first ``replicas`` replicas of the bench store."""
    wanted = {f"{slo_bench.POOL}-{i:02d}" for i in range(replicas)}
    with Store.open_readonly(store_path) as store:
        for name in store.metric_names():
            for key, _, ts, vals, _stale in store.series_arrays(
                    name, {}, 0, 2**62, lambda k: dict(k.labels).get("instance") in wanted):
                del key
                yield ts, vals


def dcgm_series(gpus: int, days: float, seed: int = 7) -> Iterator[Chunk]:
    """A synthetic DCGM exporter mix at 15 s: six gauges and an energy counter per GPU."""
    rng = np.random.default_rng(seed)
    n = int(days * 86400 / 15)
    ts = slo_bench.END_MS - 15_000 * np.arange(n, dtype=np.int64)[::-1]
    # Scrape jitter: most scrapes on time, some a few ms late (as real scrapers are).
    ts = ts + np.where(rng.random(n) < 0.1, rng.integers(1, 40, n), 0)
    load = 0.5 + 0.4 * np.sin(np.arange(n) * 2 * np.pi / 5760)
    for _ in range(gpus):
        util = np.clip(np.round(load * 100 + rng.normal(0, 6, n)), 0, 100)
        fb = np.round(40_000 + 30_000 * load + np.cumsum(rng.normal(0, 2, n)))
        power = np.round(120 + 500 * load + rng.normal(0, 8, n), 3)
        temp = np.round(45 + 25 * load + rng.normal(0, 0.4, n))
        sm_clock = np.where(rng.random(n) < 0.02, 1755.0, 1980.0)
        mem_clock = np.full(n, 2619.0)
        energy = np.cumsum(np.round(power * 15_000))
        for vals in (util, fb, power, temp, sm_clock, mem_clock, energy):
            yield ts, vals.astype(np.float64)


def measure(series: list[Chunk], size: int, codecs: dict[str, Codec]
            ) -> dict[str, tuple[float, float, float]]:
    """Per codec: (bytes per sample, encode and decode throughput in million samples/s)."""
    chunks = [(ts[i:i + size], v[i:i + size]) for ts, v in series
              for i in range(0, ts.size, size)]
    samples = sum(c[0].size for c in chunks)
    out = {}
    for name, (enc, dec) in codecs.items():
        blobs = [enc(np.ascontiguousarray(ts), np.ascontiguousarray(v)) for ts, v in chunks]
        for (ts, v), b in zip(chunks[:200], blobs[:200], strict=True):
            got_ts, got_v = dec(b, ts.size)
            assert np.array_equal(got_ts, ts), name
            assert np.array_equal(got_v.view(np.uint64), v.view(np.uint64)), name
        t0 = time.perf_counter()
        blobs = [enc(np.ascontiguousarray(ts), np.ascontiguousarray(v)) for ts, v in chunks]
        t_enc = time.perf_counter() - t0
        t0 = time.perf_counter()
        for (ts, _), b in zip(chunks, blobs, strict=True):
            dec(b, ts.size)
        t_dec = time.perf_counter() - t0
        stale = sum(_stale_bytes(np.isnan(v)) for _, v in chunks)
        size_b = sum(len(b) for b in blobs) + stale
        out[name] = (size_b / samples, samples / t_enc / 1e6, samples / t_dec / 1e6)
    return out


def on_disk(store_path: Path, out: Path, size: int) -> tuple[int, int, float]:
    """Every series of the store in chunks of ``size`` samples, in a new SQLite file:
    ``(samples, bytes after VACUUM, seconds to encode and write)``."""
    import sqlite3

    out.unlink(missing_ok=True)
    db = sqlite3.connect(out)
    db.execute("PRAGMA page_size = 4096")
    # A rowid table: a WITHOUT ROWID (index) b-tree keeps at most ~1,000 bytes of a row in its
    # page and spills the rest to a whole 4 KB overflow page, which a 1.5 KB chunk would waste;
    # a table b-tree keeps up to ~4,000 bytes in the page. The key is a separate index.
    db.execute("CREATE TABLE chunks (series_id INTEGER NOT NULL, start_ts INTEGER NOT NULL, "
               "end_ts INTEGER NOT NULL, n INTEGER NOT NULL, data BLOB NOT NULL)")
    db.execute("CREATE UNIQUE INDEX chunks_key ON chunks (series_id, start_ts)")
    samples = 0
    sid = 0
    t0 = time.perf_counter()
    with Store.open_readonly(store_path) as store:
        for name in store.metric_names():
            rows = []
            for _key, _, ts, vals, stale in store.series_arrays(name, {}, 0, 2**62):
                sid += 1
                for i in range(0, ts.size, size):
                    t, v, m = ts[i:i + size], vals[i:i + size], stale[i:i + size]
                    rows.append((sid, int(t[0]), int(t[-1]), int(t.size),
                                 encode_chunk(t, v, m)))
                samples += int(ts.size)
            db.executemany("INSERT INTO chunks VALUES (?, ?, ?, ?, ?)", rows)
            db.commit()
    took = time.perf_counter() - t0
    db.execute("VACUUM")
    db.close()
    return samples, out.stat().st_size, took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--sizes", default="120,480,1440", help="samples per chunk")
    parser.add_argument("--on-disk", action="store_true",
                        help="also write the whole 20-replica store as chunks and measure it")
    parser.add_argument("--data", type=Path,
                        default=Path(tempfile.gettempdir()) / "vigil-slo-bench")
    args = parser.parse_args(argv)
    size = slo_bench.Size(20, 30.0)
    store_dir = args.data / f"store-{size.name}"
    slo_bench._cached(store_dir, size, "store",
                      lambda: slo_bench.build_store(store_dir / "vigil.db", size))
    mixes = {
        f"vLLM, {args.replicas} replicas × 30 d at 1 min": list(
            vllm_series(store_dir / "vigil.db", args.replicas)),
        f"DCGM, {args.gpus} GPUs × 7 d at 15 s": list(dcgm_series(args.gpus, 7.0)),
    }
    codecs = _codecs()
    print("| data | samples | chunk | codec | bytes/sample | encode | decode |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mix, series in mixes.items():
        total = sum(ts.size for ts, _ in series)
        for n in (int(x) for x in args.sizes.split(",")):
            for name, (bps, enc, dec) in measure(series, n, codecs).items():
                print(f"| {mix} | {total:,} | {n} | {name} | **{bps:.2f}** | "
                      f"{enc:.1f} M/s | {dec:.1f} M/s |", flush=True)
    if args.on_disk:
        samples, size_b, took = on_disk(store_dir / "vigil.db", args.data / "chunks.db", 1440)
        print("\n| data | samples | chunk | file after VACUUM | bytes/sample | encode + write |")
        print("| --- | --- | --- | --- | --- | --- |")
        print(f"| vLLM, 20 replicas × 30 d at 1 min | {samples:,} | 1440 | "
              f"{size_b / 1e6:,.0f} MB | **{size_b / samples:.2f}** | {took:.0f} s |")
        (args.data / "chunks.db").unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
