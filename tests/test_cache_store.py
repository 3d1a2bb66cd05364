"""The vector index and the entry store (TTL on a manual clock, LRU bound)."""

from __future__ import annotations

import numpy as np
import pytest

from serving.cache import index as index_module
from serving.cache.index import VectorIndex
from serving.cache.store import EntryStore
from vigil.clock import ManualClock

DIM = 8


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    m = rng.standard_normal((n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def test_search_matches_brute_force_through_adds_and_removes() -> None:
    rng = np.random.default_rng(1)
    vectors = unit(rng, 300)
    index = VectorIndex(DIM)
    live: dict[int, np.ndarray] = {}
    for i, v in enumerate(vectors):  # grows 16 -> 512 rows
        index.add(i, v)
        live[i] = v
    for i in range(0, 300, 3):  # swap-removes from everywhere
        index.remove(i)
        del live[i]
    index.remove(10_000)  # absent: no-op
    assert len(index) == len(live) == 200
    for q in unit(rng, 20):
        got = index.search(q, threshold=0.3, limit=1000)
        want = sorted(((i, float(v @ q)) for i, v in live.items() if float(v @ q) > 0.3),
                      key=lambda p: -p[1])
        assert [i for i, _ in got] == [i for i, _ in want]
        assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-5)
        for i, s in got:
            assert index.score(i, q) == pytest.approx(s, abs=1e-5)


def clustered(rng: np.random.Generator, n: int, dim: int, centres: np.ndarray,
              spread: float) -> np.ndarray:
    """Unit vectors near ``centres`` (near-duplicates: many pass the pruning bound)."""
    picks = centres[rng.integers(0, len(centres), n)]
    m = picks + spread * rng.standard_normal((n, dim)).astype(np.float32) / dim**0.5
    return m / np.linalg.norm(m, axis=1, keepdims=True)


@pytest.mark.parametrize("full_scan_share", [0.0, 0.125, 1.0])
@pytest.mark.parametrize("spread", [0.2, 0.6, 3.0])
def test_pruned_search_is_exact(monkeypatch: pytest.MonkeyPatch, full_scan_share: float,
                                spread: float) -> None:
    # 0.0 forces the full scan, 1.0 always trusts the bound: both must equal brute force.
    monkeypatch.setattr(index_module, "_FULL_SCAN_SHARE", full_scan_share)
    rng = np.random.default_rng(7)
    dim = 384
    centres = unit(rng, 5, dim)
    rows = clustered(rng, 3000, dim, centres, spread)
    index = VectorIndex(dim)
    for i, v in enumerate(rows):
        index.add(i, v)
    for q in clustered(rng, 10, dim, centres, spread):
        for threshold in (0.5, 0.8, 0.95):
            got = index.search(q, threshold=threshold, limit=10_000)
            scores = rows @ q
            want = np.flatnonzero(scores > threshold)
            assert sorted(i for i, _ in got) == sorted(want.tolist())
            assert np.allclose(sorted(s for _, s in got), np.sort(scores[want]), atol=1e-5)


def test_search_limit_keeps_the_best() -> None:
    index = VectorIndex(2)
    for i, angle in enumerate([0.0, 0.1, 0.2, 0.3, 0.4]):
        index.add(i, np.array([np.cos(angle), np.sin(angle)], dtype=np.float32))
    q = np.array([1.0, 0.0], dtype=np.float32)
    assert [i for i, _ in index.search(q, threshold=0.0, limit=2)] == [0, 1]


def test_threshold_is_strict() -> None:
    index = VectorIndex(2)
    index.add(1, np.array([1.0, 0.0], dtype=np.float32))
    q = np.array([1.0, 0.0], dtype=np.float32)
    assert index.search(q, threshold=1.0, limit=5) == []
    assert [i for i, _ in index.search(q, threshold=0.99, limit=5)] == [1]


def test_wrong_dimensions() -> None:
    index = VectorIndex(DIM)
    with pytest.raises(ValueError, match="dimension"):
        index.add(1, np.ones(DIM + 1, dtype=np.float32))
    assert index.search(np.ones(3, dtype=np.float32), threshold=0, limit=1) == []
    with pytest.raises(ValueError):
        VectorIndex(0)


def store(clock: ManualClock, max_entries: int = 10, ttl: float = 100.0) -> EntryStore:
    return EntryStore(max_entries=max_entries, ttl=ttl, clock=clock)


def vec(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    return v


def test_ttl_expiry() -> None:
    clock = ManualClock(1000.0)
    s = store(clock, ttl=100.0)
    e = s.put(l1="a", body=b"{}", l2_partition="p", vector=vec(0), query="x")
    assert e.expires_at == 1100.0
    clock.advance(99.9)
    assert s.get_l1("a") is e and s.get(e.id) is e
    clock.advance(0.1)
    assert s.get_l1("a") is None
    assert (len(s), s.expirations, s.partitions) == (0, 1, 0)


def test_sweep_on_put_drops_expired_entries_oldest_first() -> None:
    clock = ManualClock(0.0)
    s = store(clock, ttl=10.0)
    s.put(l1="a", body=b"1")
    clock.advance(5)
    s.put(l1="b", body=b"2")
    clock.advance(5)  # "a" is 10 s old
    s.put(l1="c", body=b"3")
    assert len(s) == 2 and s.expirations == 1
    assert s.get_l1("b") is not None


def test_lru_eviction_respects_use() -> None:
    clock = ManualClock(0.0)
    s = store(clock, max_entries=2)
    a = s.put(l1="a", body=b"1", l2_partition="p", vector=vec(0), query="a")
    s.put(l1="b", body=b"2", l2_partition="p", vector=vec(1), query="b")
    s.touch(a)
    s.put(l1="c", body=b"3", l2_partition="p", vector=vec(2), query="c")
    assert s.get_l1("b") is None and s.get_l1("a") is not None and s.get_l1("c") is not None
    assert s.evictions == 1
    assert len(s.index("p")) == 2


def test_same_l1_replaces_the_entry() -> None:
    s = store(ManualClock(0.0))
    old = s.put(l1="a", body=b"old", l2_partition="p", vector=vec(0), query="a")
    new = s.put(l1="a", body=b"new", l2_partition="p", vector=vec(1), query="a")
    assert len(s) == 1 and s.get_l1("a") is new and s.get(old.id) is None
    assert old.id not in s.index("p") and new.id in s.index("p")


def test_a_vector_of_another_dimension_stays_l1_only() -> None:
    s = store(ManualClock(0.0))
    s.put(l1="a", body=b"1", l2_partition="p", vector=vec(0), query="a")
    e = s.put(l1="b", body=b"2", l2_partition="p", vector=np.ones(3, dtype=np.float32) / 3**.5,
              query="b")
    assert e.l2_partition is None and s.get_l1("b") is e and len(s.index("p")) == 1


def test_expiry_queue_stays_bounded_under_churn() -> None:
    clock = ManualClock(0.0)
    s = store(clock, max_entries=5, ttl=1e9)  # nothing expires; LRU evicts all the time
    for i in range(1000):
        s.put(l1=f"k{i}", body=b"x")
    assert len(s) == 5 and s.evictions == 995
    assert len(s._expiry) <= 2 * 5 + 16
