"""Saved capacity profiles: one JSON file, ``{"version": 1, "profiles": [...]}``.

``vigil capacity --save`` writes here, and the planner and the scaling policy read from here
(``[capacity] profiles_path``). A profile is kept per identity key, basis and pool: saving
another measurement of the same configuration for the same pool replaces the old one. Writes
go to a temporary file in the same folder and ``os.replace`` it over the old file, so a crash
mid-write leaves the previous file whole, never half a file. A save holds an exclusive
``fcntl.flock`` on a sidecar lock file (the path + ``.lock``) around its read-modify-write, so
two concurrent saves both land. A malformed file is refused with the file and the entry named,
and is never overwritten: saving into it fails the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vigil.capacity import BASES, CapacityProfile, ProfileIdentity
from vigil.config import PoolConfig
from vigil.errors import ConfigError

__all__ = ["FORMAT_VERSION", "ProfileStore", "identity_matches_pool"]

#: The file format's version (the ``version`` key).
FORMAT_VERSION = 1


def identity_matches_pool(identity: ProfileIdentity, pool: PoolConfig) -> bool:
    """Whether ``identity`` describes the configuration ``pool`` runs: the same model, GPU,
    GPUs per replica, quantization and speculative method (``[pools.vllm]``)."""
    return (identity.model == pool.model
            and identity.gpu == pool.gpu
            and identity.gpus_per_replica == pool.gpus_per_replica
            and identity.quantization == pool.vllm.quantization
            and identity.speculative == pool.vllm.speculative_method)


def _rank(profile: CapacityProfile) -> tuple[int, float]:
    """Best first: measured, observed, estimated; then the newest."""
    return (-BASES.index(profile.basis), profile.created_at)


class ProfileStore:
    """The saved capacity profiles in the JSON file at ``path`` (which need not exist yet)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _error(self, message: str, key: str | None = None) -> ConfigError:
        return ConfigError(message, file=str(self.path), key=key)

    def load(self) -> list[CapacityProfile]:
        """Every saved profile, in file order; ``[]`` when the file does not exist.

        ``ConfigError`` naming the file (and ``profiles[i]``) when it is not valid JSON, has
        another version, or holds an entry that is not a profile."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._error(f"cannot read the capacity profiles: {exc.strerror}") from None
        try:
            data: Any = json.loads(text)
        except ValueError as exc:
            raise self._error(f"not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("profiles"), list):
            raise self._error('expected {"version": 1, "profiles": [...]}')
        if data.get("version") != FORMAT_VERSION:
            raise self._error(f"format version {data.get('version')!r} is not "
                              f"{FORMAT_VERSION}", key="version")
        out: list[CapacityProfile] = []
        for i, entry in enumerate(data["profiles"]):
            if not isinstance(entry, dict):
                raise self._error("a profile must be a JSON object", key=f"profiles[{i}]")
            try:
                out.append(CapacityProfile.from_dict(entry))
            except KeyError as exc:
                raise self._error(f"missing field {exc}", key=f"profiles[{i}]") from None
            except (TypeError, ValueError) as exc:
                raise self._error(str(exc), key=f"profiles[{i}]") from None
        return out

    def save(self, profile: CapacityProfile) -> None:
        """Add ``profile``, replacing the saved one with the same key, basis and pool; the
        file is replaced atomically, under an exclusive lock on ``path + ".lock"`` (waits
        for another save to finish). A malformed file is left as it is (``ConfigError``)."""
        with self._locked():
            kept = [p for p in self.load()
                    if (p.key, p.basis, p.pool) != (profile.key, profile.basis, profile.pool)]
            kept.append(profile)
            self._write(kept)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # A sidecar file, not the profiles file itself: os.replace swaps the profiles file's
        # inode, so a lock held on it would not exclude a writer that opened the new one.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._error(f"cannot lock the capacity profiles ({lock_path}): "
                              f"{exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write(self, profiles: list[CapacityProfile]) -> None:
        body = json.dumps({"version": FORMAT_VERSION,
                           "profiles": [p.to_dict() for p in profiles]},
                          indent=2, allow_nan=False) + "\n"
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def find(self, pool: PoolConfig | None = None, *,
             identity: ProfileIdentity | None = None) -> CapacityProfile | None:
        """The best saved profile for ``pool`` or ``identity`` (None: none fits): the first
        of ``candidates(pool, identity=identity)``."""
        found = self.candidates(pool, identity=identity)
        return found[0] if found else None

    def candidates(self, pool: PoolConfig | None = None, *,
                   identity: ProfileIdentity | None = None) -> list[CapacityProfile]:
        """The saved profiles that fit ``pool`` or ``identity``, best first.

        For a pool: only those whose identity is the pool's configuration now
        (``identity_matches_pool``; one saved under the pool's name before its GPU or
        quantization changed does not describe it any more), those saved for the pool's
        name first; for an identity: those with its key. Then the best basis (measured >
        observed > estimated), then the newest. With neither, all of them."""
        profiles = self.load()
        if identity is not None:
            profiles = [p for p in profiles if p.key == identity.key()]
        if pool is None:
            return sorted(profiles, key=_rank, reverse=True)
        same = [p for p in profiles if identity_matches_pool(p.identity, pool)]
        return sorted(same, key=lambda p: (p.pool == pool.name, *_rank(p)), reverse=True)
