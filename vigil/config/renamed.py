"""Keys that moved to another place: the old name still loads, with a warning naming the new
one (``RENAMED_KEYS``)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from pydantic import (
    BaseModel,
)

from vigil.errors import ConfigError

#: Keys that moved: (old section, old key) -> (new section, new key). The old name still loads,
#: with a warning.
RENAMED_KEYS: dict[tuple[str, str], tuple[str, str]] = {
    # vLLM does not refuse requests at high KV usage (it queues and preempts): the number is an
    # alert threshold, not an admission limit of the scaling policy.
    ("scaling", "admission_kv_usage"): ("alerts", "kv_usage_high"),
}

_log = logging.getLogger("vigil.config")


def _as_table(value: Any) -> Any:
    """A section as a dict (a section model built in code gives only the keys it was given)."""
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    return value


def _migrate_renamed(data: dict[str, Any], file: str) -> dict[str, Any]:
    """``data`` with every ``RENAMED_KEYS`` old key moved to its new place; a warning per key.

    Raises ``ConfigError`` when a file sets both the old and the new name.
    """
    out = dict(data)
    for (old_section, old_key), (new_section, new_key) in RENAMED_KEYS.items():
        old_table = out.get(old_section)
        if not isinstance(old_table, dict) or old_key not in old_table:
            continue
        new_table = _as_table(out.get(new_section)) if new_section in out else {}
        if not isinstance(new_table, dict):
            continue  # a wrong type: validation names it
        if new_key in new_table:
            raise ConfigError(f"set only [{new_section}] {new_key}: [{old_section}] {old_key} "
                              "is its old name", file=file or None,
                              key=f"{old_section}.{old_key}")
        old_table = dict(old_table)
        new_table = {**new_table, new_key: old_table.pop(old_key)}
        out[old_section], out[new_section] = old_table, new_table
        message = (f"{file or 'the configuration'}: [{old_section}] {old_key} is deprecated; "
                   f"use [{new_section}] {new_key} (same meaning and value)")
        _log.warning("%s", message)
        warnings.warn(message, DeprecationWarning, stacklevel=2)
    return out
