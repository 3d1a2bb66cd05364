"""file_sd: target groups from JSON or YAML files, as Prometheus's ``file_sd_configs``.

Every read expands the patterns (globs allowed; a relative pattern is relative to the config
file's folder) and reads each file that matches. A file is parsed again only when its bytes
changed; a file being rewritten can be read half-written, so a file that fails to parse keeps
its previous targets and the problem is reported (the next read picks up the complete file).
A file that no longer exists takes its targets with it, as in Prometheus.

One difference from Prometheus: an empty (0-byte) file also keeps its previous targets, since
that is what a file looks like between its truncation and its rewrite; write ``[]`` for a
file with no targets.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from collector.discovery.model import DiscoveryError, TargetGroup, parse_groups
from vigil.config import DiscoveryConfig
from vigil.errors import ConfigError

__all__ = ["FILE_SD_EXTENSIONS", "FileSource"]

#: The file name endings file_sd reads, and the format of each (as Prometheus decides).
FILE_SD_EXTENSIONS = {".json": "json", ".yml": "yaml", ".yaml": "yaml"}

#: The label Prometheus sets on every file_sd target (internal: not a series label).
META_FILEPATH = "__meta_filepath"


def _format(path: str) -> str | None:
    return FILE_SD_EXTENSIONS.get(os.path.splitext(path)[1].lower())


class FileSource:
    """The files of one ``[[discovery]]`` entry with ``files``; ``base`` is the folder that
    relative patterns are relative to (the config file's)."""

    def __init__(self, config: DiscoveryConfig, *, base: Path, index: int = 0):
        self.config = config
        self.base = base
        self.groups: dict[str, list[TargetGroup]] = {}
        self.problems: list[str] = []
        #: Per file (as shown): a digest of the bytes last parsed successfully.
        self._digests: dict[str, bytes] = {}
        for j, pattern in enumerate(config.files):
            if _format(pattern) is None:
                raise ConfigError(
                    f"{pattern!r}: a file_sd file must end in .json, .yml or .yaml",
                    key=f"discovery[{index}].files[{j}]")

    def _matches(self) -> list[tuple[str, Path]]:
        """(path as shown, absolute path) of every file the patterns match, in order."""
        out: dict[str, Path] = {}
        for pattern in self.config.files:
            relative = not os.path.isabs(pattern)
            full = str(self.base / pattern) if relative else pattern
            for found in sorted(glob.glob(full)):
                shown = os.path.relpath(found, self.base) if relative else found
                out.setdefault(shown, Path(found))
        return list(out.items())

    async def read(self) -> None:
        """Read every matching file; a file that fails keeps its previous groups."""
        problems: list[str] = []
        seen: set[str] = set()
        for shown, path in self._matches():
            seen.add(shown)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                seen.discard(shown)  # gone between the glob and the read
                continue
            except OSError as exc:
                problems.append(self._kept(shown, f"cannot read: {exc.strerror or exc}"))
                continue
            digest = hashlib.blake2b(data, digest_size=16).digest()
            if self._digests.get(shown) == digest and shown in self.groups:
                continue
            if not data.strip():
                problems.append(self._kept(
                    shown, "the file is empty (being written?); write [] for no targets"))
                continue
            try:
                groups = parse_groups(_decode(data, _format(shown) or "json", shown),
                                      where=shown)
            except DiscoveryError as exc:
                problems.append(self._kept(shown, exc.reason))
                continue
            self.groups[shown] = [
                TargetGroup(g.targets, tuple(sorted((*g.labels, (META_FILEPATH, shown)))))
                for g in groups
            ]
            self._digests[shown] = digest
        for shown in list(self.groups):
            if shown not in seen:
                del self.groups[shown]
                self._digests.pop(shown, None)
        self.problems = problems

    def _kept(self, shown: str, reason: str) -> str:
        kept = len({t for g in self.groups.get(shown, []) for t in g.targets})
        return f"{shown}: {reason}; its previous {kept} target(s) are kept"


def _decode(data: bytes, fmt: str, shown: str) -> Any:
    """The document in ``data``; ``DiscoveryError`` naming the line of a syntax error."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DiscoveryError(f"not UTF-8 text ({exc.reason})", source=shown) from None
    if fmt == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise DiscoveryError(f"invalid JSON at line {exc.lineno} column {exc.colno}: "
                                 f"{exc.msg}", source=shown) from None
    import yaml  # imported here: only YAML file_sd needs it

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise DiscoveryError(f"invalid YAML{where}: {problem}", source=shown) from None
