"""Saved capacity profiles: round trip, replacement, atomic writes, malformed files, and which
profile a pool gets."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from slo.planning.profile_store import ProfileStore
from vigil.capacity import CapacityProfile, ProfileIdentity, SloTarget
from vigil.config import PoolConfig, VllmProfileConfig
from vigil.errors import ConfigError

IDENTITY = ProfileIdentity(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100",
                           prompt_tokens=1024, output_tokens=512)
SLO = SloTarget("chat-e2e", "e2e", 8.0, 0.95)


def profile(basis: str = "measured", pool: str = "", created_at: float = 100.0,
            identity: ProfileIdentity = IDENTITY, goodput: float = 5.0) -> CapacityProfile:
    return CapacityProfile(identity=identity, basis=basis, max_concurrency=16,  # type: ignore[arg-type]
                           max_goodput_rps=goodput, max_output_tokens_per_s=900.0,
                           slos=(SLO,), pool=pool, created_at=created_at)


def test_a_missing_file_holds_no_profiles(tmp_path: Path) -> None:
    assert ProfileStore(tmp_path / "none.json").load() == []
    assert ProfileStore(tmp_path / "none.json").find() is None


def test_save_load_round_trip_and_replacement(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "sub" / "capacity.json")
    store.save(profile(goodput=5.0))
    store.save(profile(pool="chat"))
    store.save(profile(basis="estimated"))
    store.save(profile(goodput=7.0))  # same key, basis and pool: replaces the first
    got = store.load()
    assert len(got) == 3 and got[-1].max_goodput_rps == 7.0
    data = json.loads(store.path.read_text())
    assert data["version"] == 1 and len(data["profiles"]) == 3
    # No temp file left; the lock's sidecar file stays (removing it would race a waiter).
    assert sorted(p.name for p in store.path.parent.iterdir()) == [
        "capacity.json", "capacity.json.lock"]


@pytest.mark.parametrize(("body", "where"), [
    ("{not json", "not valid JSON"),
    ('{"version": 2, "profiles": []}', "version"),
    ('[1, 2]', '"profiles"'),
    ('{"version": 1, "profiles": [PROFILE, 3]}', "profiles[1]: a profile must be"),
    ('{"version": 1, "profiles": [PROFILE, {"basis": "measured"}]}',
     "profiles[1]: missing field 'identity'"),
    ('{"version": 1, "profiles": [PROFILE, BADBASIS]}', "profiles[1]: basis must be"),
])
def test_a_malformed_file_is_refused_with_file_and_entry_and_kept(tmp_path: Path, body: str,
                                                                    where: str) -> None:
    good = json.dumps(profile().to_dict())
    bad = json.dumps({**profile().to_dict(), "basis": "guessed"})
    path = tmp_path / "capacity.json"
    path.write_text(body.replace("PROFILE", good).replace("BADBASIS", bad))
    before = path.read_bytes()
    store = ProfileStore(path)
    with pytest.raises(ConfigError) as err:
        store.load()
    assert str(path) in str(err.value) and where in str(err.value)
    with pytest.raises(ConfigError):
        store.save(profile())
    assert path.read_bytes() == before  # nothing lost


def test_find_for_a_pool_prefers_its_name_then_its_configuration(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "capacity.json")
    pool = PoolConfig(name="chat", model=IDENTITY.model, gpu="H100")
    assert store.find(pool) is None
    store.save(profile(basis="estimated", created_at=50))
    assert store.find(pool).basis == "estimated"  # same configuration
    store.save(profile(basis="observed", created_at=10))
    assert store.find(pool).basis == "observed"  # better basis beats newer
    store.save(profile(basis="measured", created_at=5))
    assert store.find(pool).basis == "measured"
    named = profile(basis="estimated", pool="chat", created_at=1)
    store.save(named)
    assert store.find(pool) == named  # saved for the pool: wins over the configuration
    other = PoolConfig(name="batch", model=IDENTITY.model, gpu="H100",
                       vllm=VllmProfileConfig(quantization="fp8"))
    assert store.find(other) is None  # another quantization is another configuration
    fp8 = replace(IDENTITY, quantization="fp8")
    store.save(profile(identity=fp8, created_at=1))
    store.save(profile(identity=fp8, created_at=2, pool="x"))
    assert store.find(other).created_at == 2  # newest of the same basis
    assert store.find(identity=fp8).identity == fp8
    assert store.find(PoolConfig(name="l4", model=IDENTITY.model, gpu="L4")) is None


def test_find_for_a_pool_drops_its_profiles_of_another_configuration(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "capacity.json")
    pool = PoolConfig(name="chat", model=IDENTITY.model, gpu="H100")
    # Saved for the pool before it moved to fp8 / to 2 GPUs per replica / to another GPU.
    for changed in (replace(IDENTITY, quantization="fp8"), replace(IDENTITY, gpus_per_replica=2),
                    replace(IDENTITY, gpu="A100"), replace(IDENTITY, speculative="ngram")):
        store.save(profile(identity=changed, pool="chat"))
    assert store.find(pool) is None
    assert store.candidates(pool) == []
    unnamed = profile(basis="estimated")
    store.save(unnamed)
    assert store.find(pool) == unnamed  # the configuration counts, the name only ranks
    named = profile(basis="estimated", pool="chat", created_at=1)
    store.save(named)
    assert store.candidates(pool) == [named, unnamed]


def _save_many(path: str, first: int, count: int) -> None:
    store = ProfileStore(path)
    for i in range(first, first + count):
        store.save(profile(pool=f"pool-{i}", created_at=float(i)))


def test_concurrent_saves_from_threads_lose_nothing(tmp_path: Path) -> None:
    # Each save opens the lock file anew, and flock excludes two open files of it in one
    # process as it does across processes: without the lock one save's read-modify-write
    # overwrites the other's and profiles go missing.
    path = tmp_path / "capacity.json"
    threads = [threading.Thread(target=_save_many, args=(str(path), first, 20))
               for first in (0, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(ProfileStore(path).load()) == 40
