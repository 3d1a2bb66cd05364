"""The store's compressed chunks give back every sample bit for bit — NaN payloads, -0.0, ±Inf,
staleness markers apart from NaN samples, counter resets, irregular timestamps — compress the
series vLLM exposes, and a blob that is not a chunk is refused with what is wrong with it."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.store.chunks import FORMAT_VERSION, chunk_samples, decode_chunk, encode_chunk
from vigil.errors import StoreError


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype and the same bits (a NaN's payload too): what a lossless codec keeps."""
    return a.dtype == b.dtype and np.array_equal(a.view(np.uint64), b.view(np.uint64))


def _roundtrip(ts: np.ndarray, vals: np.ndarray, stale: np.ndarray | None = None) -> bytes:
    blob = encode_chunk(ts, vals, stale)
    got_ts, got_vals, got_stale = decode_chunk(blob)
    want_stale = np.zeros(ts.size, bool) if stale is None else stale
    assert np.array_equal(got_ts, ts) and got_ts.dtype == np.int64
    assert np.array_equal(got_stale, want_stale)
    keep = ~want_stale
    assert _same_bits(got_vals[keep], vals[keep])
    assert np.isnan(got_vals[want_stale]).all()
    assert chunk_samples(blob) == ts.size
    return blob


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10**6), st.floats(allow_nan=True, width=64),
                          st.booleans()), min_size=1, max_size=300),
       st.integers(-(2**40), 2**40))
def test_any_samples_come_back_bit_for_bit(samples: list[tuple[int, float, bool]],
                                           first: int) -> None:
    ts = first + np.cumsum([s[0] for s in samples]).astype(np.int64)
    vals = np.array([s[1] for s in samples], dtype=np.float64)
    stale = np.array([s[2] for s in samples], dtype=bool)
    _roundtrip(ts, vals, stale)
    _roundtrip(ts, vals)


def test_special_values_and_nan_payloads_survive() -> None:
    payload_nan = np.frombuffer(struct.pack("<Q", 0x7FF0000000000002), np.float64)[0]
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, payload_nan, 5e-324,
                     1.7976931348623157e308])
    ts = np.arange(vals.size, dtype=np.int64) * 15_000
    _roundtrip(ts, vals)
    # A NaN sample and a staleness marker at the same value stay apart.
    stale = np.array([False, False, False, False, False, True, False, False])
    _, got, marks = decode_chunk(encode_chunk(ts, vals, stale))
    assert np.isnan(got[4]) and not marks[4] and marks[5]


def test_a_counter_with_resets_and_a_regular_scrape_compresses() -> None:
    rng = np.random.default_rng(3)
    n = 1440  # a day at one minute
    ts = 1_760_000_000_000 + 60_000 * np.arange(n, dtype=np.int64)
    ts += np.where(rng.random(n) < 0.1, rng.integers(1, 30, n), 0)  # scrape jitter
    counter = np.cumsum(rng.poisson(120, n)).astype(np.float64)
    counter[700:] -= counter[699]  # a restart: the counter starts again from 0
    blob = _roundtrip(ts, counter)
    # 16 bytes a sample uncompressed; the chunk costs under 2.
    assert len(blob) / n < 2.0
    gauge = np.round(rng.random(n) * 0.3 + 0.5, 4)  # KV-cache usage, four decimals
    assert len(_roundtrip(ts, gauge)) / n < 2.5
    # `up`: the jittered timestamps are nearly all of it.
    assert len(_roundtrip(ts, np.full(n, 1.0))) / n < 0.25


def test_one_sample_and_equal_chunks_encode_equally() -> None:
    _roundtrip(np.array([0], np.int64), np.array([np.nan]), np.array([True]))
    ts = np.array([1, 2, 3], np.int64)
    a = encode_chunk(ts, np.array([1.0, 7.0, 3.0]), np.array([False, True, False]))
    b = encode_chunk(ts, np.array([1.0, np.nan, 3.0]), np.array([False, True, False]))
    assert a == b


def test_what_cannot_be_a_chunk_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        encode_chunk(np.array([], np.int64), np.array([]))
    with pytest.raises(ValueError, match="as many values as timestamps"):
        encode_chunk(np.array([1, 2], np.int64), np.array([1.0]))
    with pytest.raises(ValueError, match="ascend strictly: 2 ms follows 2 ms at sample 2"):
        encode_chunk(np.array([1, 2, 2], np.int64), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="staleness mask has 1 entries for 2"):
        encode_chunk(np.array([1, 2], np.int64), np.array([1.0, 2.0]), np.array([True]))


def test_a_blob_that_is_not_a_chunk_says_what_is_wrong() -> None:
    ts = np.arange(100, dtype=np.int64) * 1000
    blob = encode_chunk(ts, np.arange(100.0), np.arange(100) % 7 == 0)
    with pytest.raises(StoreError, match="shorter than its 6-byte header"):
        decode_chunk(blob[:3])
    with pytest.raises(StoreError, match=f"format version 9, this Vigil reads {FORMAT_VERSION}"):
        decode_chunk(bytes([9]) + blob[1:])
    with pytest.raises(StoreError, match=r"truncated in the timestamps \(4 of"):
        decode_chunk(blob[:14])
    with pytest.raises(StoreError, match="the staleness mask cannot be decoded"):
        decode_chunk(blob[:-3])
    plain = encode_chunk(ts, np.arange(100.0))
    with pytest.raises(StoreError, match="truncated in the values"):
        decode_chunk(plain[:-5])
    with pytest.raises(StoreError, match="2 bytes after its values"):
        decode_chunk(plain + b"xx")
    # The header's count and the blobs disagree.
    wrong = bytes([FORMAT_VERSION]) + struct.pack("<I", 99) + plain[5:]
    with pytest.raises(StoreError, match="where its header says 99 samples"):
        decode_chunk(wrong)
    garbled = bytearray(plain)
    garbled[11:15] = b"junk"
    with pytest.raises(StoreError, match="cannot be decoded"):
        decode_chunk(bytes(garbled))
