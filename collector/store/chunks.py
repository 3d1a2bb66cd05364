"""Compressed chunks: a run of one series' samples in one blob, decoded alone.

The codec is pcodec (a maintained numeric codec, in Rust): it picks delta and bit-packing modes
per chunk, and on the store's vLLM series and a DCGM mix it is both the smallest and the fastest
to decode of the codecs ``bench/chunk_codec_bench.py`` measures (1.05 and 1.12 bytes per sample
in chunks of 1,440 samples, against 2.3 for Prometheus 2.42's Gorilla chunks; see
docs/benchmarks.md, "Chunk codecs"). It is lossless on every float64 bit pattern: NaN payloads,
-0.0 and ±Inf come back exactly.

Format, version 1 (integers little-endian)::

    u8  version (1)
    u32 n, the samples (>= 1)
    u8  flags: bit 0, the chunk holds staleness markers
    u32 length of the timestamps' pcodec blob, the blob (int64 Unix ms, strictly ascending)
    u32 length of the values' pcodec blob, the blob (float64)
    the staleness mask, when flagged: n bits (numpy.packbits order), zlib-compressed

A staleness marker is a sample with no value (the store's NULL): its slot in the values holds
a NaN, and the mask says it is a marker, so that a NaN sample and a marker stay apart, as they
do in the ``samples`` table (``collector.store.codec``).
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections import OrderedDict

import numpy as np
import numpy.typing as npt
from pcodec import ChunkConfig, standalone

from vigil.errors import StoreError

__all__ = ["FORMAT_VERSION", "DecodedChunks", "chunk_samples", "decode_chunk", "encode_chunk"]

FORMAT_VERSION = 1
_HEAD = struct.Struct("<BIB")
_LEN = struct.Struct("<I")
_FLAG_STALE = 0x01
_CONFIG = ChunkConfig()

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def encode_chunk(ts_ms: IntArray, values: FloatArray, stale: BoolArray | None = None) -> bytes:
    """One chunk of ``ts_ms`` (int64 Unix ms, strictly ascending) and ``values`` (float64;
    anything at a marker), ``stale`` marking the staleness markers (None: none). ValueError for
    arrays of different lengths, an empty chunk or timestamps that do not ascend."""
    ts = np.ascontiguousarray(ts_ms, dtype=np.int64)
    vals = np.ascontiguousarray(values, dtype=np.float64)
    n = ts.size
    if ts.ndim != 1 or vals.shape != ts.shape:
        raise ValueError(f"a chunk needs as many values as timestamps, not {vals.shape} "
                         f"and {ts.shape}")
    if n == 0:
        raise ValueError("a chunk holds at least one sample")
    if n > 1 and not bool(np.all(ts[1:] > ts[:-1])):
        i = int(np.flatnonzero(ts[1:] <= ts[:-1])[0])
        raise ValueError(f"timestamps must ascend strictly: {int(ts[i + 1])} ms follows "
                         f"{int(ts[i])} ms at sample {i + 1}")
    markers = None
    if stale is not None:
        markers = np.ascontiguousarray(stale, dtype=np.bool_)
        if markers.shape != ts.shape:
            raise ValueError(f"the staleness mask has {markers.size} entries for {n} samples")
        if markers.any():
            # A marker's slot: one NaN whatever the caller left there, so that equal chunks
            # encode to equal bytes.
            vals = np.where(markers, np.nan, vals)
        else:
            markers = None
    ts_blob = standalone.simple_compress(ts, _CONFIG)
    val_blob = standalone.simple_compress(vals, _CONFIG)
    parts = [_HEAD.pack(FORMAT_VERSION, n, _FLAG_STALE if markers is not None else 0),
             _LEN.pack(len(ts_blob)), ts_blob, _LEN.pack(len(val_blob)), val_blob]
    if markers is not None:
        parts.append(zlib.compress(np.packbits(markers).tobytes()))
    return b"".join(parts)


def chunk_samples(blob: bytes) -> int:
    """How many samples the chunk holds, read from its header alone."""
    return _header(blob)[1]


def _header(blob: bytes) -> tuple[int, int, int]:
    if len(blob) < _HEAD.size:
        raise StoreError(f"chunk: {len(blob)} bytes, shorter than its {_HEAD.size}-byte header")
    version, n, flags = _HEAD.unpack_from(blob, 0)
    if version != FORMAT_VERSION:
        raise StoreError(f"chunk: format version {version}, this Vigil reads "
                         f"{FORMAT_VERSION}: written by a newer Vigil, or not a chunk")
    if n == 0:
        raise StoreError("chunk: holds no sample")
    return version, n, flags


def _part(blob: bytes, at: int, what: str) -> tuple[bytes, int]:
    if at + _LEN.size > len(blob):
        raise StoreError(f"chunk: truncated before the {what}")
    (size,) = _LEN.unpack_from(blob, at)
    start = at + _LEN.size
    if start + size > len(blob):
        raise StoreError(f"chunk: truncated in the {what} ({len(blob) - start} of {size} "
                         "bytes)")
    return blob[start:start + size], start + size


def decode_chunk(blob: bytes) -> tuple[IntArray, FloatArray, BoolArray]:
    """``(ts_ms, values, stale)`` of a chunk: int64 Unix ms, float64 (NaN at a marker), the
    markers' mask. StoreError naming what is wrong with a chunk that is not one."""
    _, n, flags = _header(blob)
    ts_blob, at = _part(blob, _HEAD.size, "timestamps")
    val_blob, at = _part(blob, at, "values")
    try:
        ts = standalone.simple_decompress(ts_blob)
        vals = standalone.simple_decompress(val_blob)
    except (RuntimeError, ValueError) as exc:
        raise StoreError(f"chunk: cannot be decoded ({exc})") from None
    if ts.dtype != np.int64 or vals.dtype != np.float64 or ts.size != n or vals.size != n:
        raise StoreError(f"chunk: holds {ts.size} {ts.dtype} timestamps and {vals.size} "
                         f"{vals.dtype} values where its header says {n} samples")
    stale = np.zeros(n, dtype=np.bool_)
    if flags & _FLAG_STALE:
        try:
            packed = np.frombuffer(zlib.decompress(blob[at:]), dtype=np.uint8)
        except zlib.error as exc:
            raise StoreError(f"chunk: the staleness mask cannot be decoded ({exc})") from None
        if packed.size != (n + 7) // 8:
            raise StoreError(f"chunk: the staleness mask has {packed.size * 8} bits for {n} "
                             "samples")
        stale = np.unpackbits(packed, count=n).astype(np.bool_)
    elif at != len(blob):
        raise StoreError(f"chunk: {len(blob) - at} bytes after its values")
    return ts, vals, stale


class DecodedChunks:
    """Recently decoded chunks, kept up to ``budget`` samples in all (least recently used
    first out), for readers that decode the same chunks again and again: the dashboard's
    chart points and the SLO windows that start in the same span. Keyed by the blob itself,
    so a chunk rewritten since (a backfill merged in, a trim) is a new entry, never a stale
    one. The arrays it returns are read-only. Thread-safe."""

    def __init__(self, budget: int = 2_000_000) -> None:
        self.budget = budget
        self._held = 0
        self._lock = threading.Lock()
        self._cache: OrderedDict[bytes, tuple[IntArray, FloatArray, BoolArray]] = OrderedDict()

    def decode(self, blob: bytes) -> tuple[IntArray, FloatArray, BoolArray]:
        """``decode_chunk(blob)``, from the cache when it holds it."""
        with self._lock:
            found = self._cache.get(blob)
            if found is not None:
                self._cache.move_to_end(blob)
                return found
        decoded = decode_chunk(blob)
        for array in decoded:
            array.flags.writeable = False
        n = int(decoded[0].size)
        with self._lock:
            if blob not in self._cache:
                self._cache[blob] = decoded
                self._held += n
                while self._held > self.budget and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._held -= int(old[0].size)
        return decoded
