"""The configuration reference (``docs/configuration.md``), generated so that it cannot drift.

Keys, types, units and defaults come from the pydantic models in ``vigil.config``; the one-line
meaning of each key comes from its comment in ``vigil.example.toml`` (a test requires every key
there to have one). ``python -m vigil_shell.config_reference > docs/configuration.md``
regenerates the file, and a test fails when the committed file differs from what this module
produces.
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from vigil.config import Config
from vigil.durations import format_duration, parse_duration

__all__ = ["example_comments", "reference_markdown"]

EXAMPLE = Path(__file__).resolve().parent.parent / "vigil.example.toml"

_SECTION = re.compile(r"^\[\[?([a-z_.]+)\]\]?\s*(?:#\s*(.*))?$")
_KEY = re.compile(r"^([a-z0-9_]+)\s*=\s*(.*?)(?:\s+#\s*(.*))?$")


def example_comments(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """``(keys, sections)``: the comment of each ``section.key`` and of each section header
    in the example file (commented-out lines included; the first comment of a key wins)."""
    keys: dict[str, str] = {}
    sections: dict[str, str] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            line = line.lstrip("#").strip()
        m = _SECTION.match(line)
        if m:
            section = m.group(1)
            if m.group(2):
                sections.setdefault(section, m.group(2).strip())
            continue
        m = _KEY.match(line)
        if m and m.group(3):
            keys.setdefault(f"{section}.{m.group(1)}", m.group(3).strip())
    return keys, sections


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _list_of_model(t: Any) -> type[BaseModel] | None:
    if get_origin(t) is list:
        (inner,) = get_args(t)
        if _is_model(inner):
            return inner  # type: ignore[no-any-return]
    return None


def _type_name(info: FieldInfo) -> str:
    meta = info.metadata
    if any(getattr(m, "func", None) is parse_duration for m in meta):
        return "duration (s)"
    ann = info.annotation
    bounds = {type(m).__name__: m for m in meta}
    if ann is float and "Ge" in bounds and "Le" in bounds and (
        bounds["Ge"].ge == 0 and bounds["Le"].le == 1
    ):
        return "ratio 0-1"
    return _ann_name(ann)


def _ann_name(ann: Any) -> str:
    origin = get_origin(ann)
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in get_args(ann))
    if origin in (types.UnionType, typing.Union):
        parts = [a for a in get_args(ann) if a is not type(None)]
        name = " \\| ".join(_ann_name(a) for a in parts)
        return f"{name} (optional)" if len(parts) < len(get_args(ann)) else name
    if origin is list:
        return f"list of {_ann_name(get_args(ann)[0])}"
    if origin is dict:
        k, v = get_args(ann)
        return f"table {_ann_name(k)} → {_ann_name(v)}"
    if origin is typing.Annotated:
        return _ann_name(get_args(ann)[0])
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        ann, getattr(ann, "__name__", str(ann)))


def _default(info: FieldInfo, type_name: str) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(table)"
    if value is None:
        return "unset"
    if type_name.startswith("duration") and isinstance(value, int | float):
        return f"`{format_duration(float(value))}`"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return f"{len(value)} rows"
    return f"`{json.dumps(value)}`"


def _rows(model: type[BaseModel], path: str, comments: dict[str, str],
          section_comments: dict[str, str],
          out: list[tuple[str, str, list[tuple[str, str, str, str]]]], array: bool) -> None:
    rows: list[tuple[str, str, str, str]] = []
    nested: list[tuple[str, type[BaseModel], bool]] = []
    for name, info in model.model_fields.items():
        if name == "source" and model is Config:
            continue
        ann = info.annotation
        if _is_model(ann):
            nested.append((f"{path}.{name}" if path else name, ann, False))  # type: ignore[arg-type]
            continue
        inner = _list_of_model(ann)
        if inner is not None:
            nested.append((f"{path}.{name}" if path else name, inner, True))
            continue
        type_name = _type_name(info)
        key = f"{path}.{name}" if path else name
        meaning = comments.get(key) or section_comments.get(key, "")  # [prices] is a table
        rows.append((name, type_name, _default(info, type_name), meaning))
    if rows:
        out.append((path, "array" if array else "table", rows))
    for sub, sub_model, sub_array in nested:
        _rows(sub_model, sub, comments, section_comments, out, sub_array)


def reference_markdown(example_text: str | None = None) -> str:
    """The whole reference as Markdown."""
    text = EXAMPLE.read_text() if example_text is None else example_text
    comments, section_comments = example_comments(text)
    tables: list[tuple[str, str, list[tuple[str, str, str, str]]]] = []
    _rows(Config, "", comments, section_comments, tables, False)
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m vigil_shell.config_reference > docs/configuration.md`",
        "     from the pydantic models in vigil/config/ and the comments of vigil.example.toml.",
        "     Do not edit by hand: tests/test_config_reference.py fails when it drifts. -->",
        "",
        "One TOML file (`--config F`). Unknown keys, wrong types and broken references stop",
        "Vigil with the file and the dotted key named (exit code 2). Durations take Prometheus",
        'syntax (`"15s"`, `"5m"`, `"48h"`, `"35d"`) or a number of seconds; ratios are 0-1.',
        "Relative paths are relative to the config file's folder. A commented example of every",
        "key: [`vigil.example.toml`](../vigil.example.toml).",
        "",
    ]
    for path, kind, rows in tables:
        header = "top level" if not path else (f"[[{path}]]" if kind == "array" else f"[{path}]")
        lines.append(f"## `{header}`" if path else "## Top level")
        lines.append("")
        if section_comments.get(path):
            lines += [section_comments[path][0].upper() + section_comments[path][1:], ""]
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, type_name, default, meaning in rows:
            cell = meaning.replace("|", r"\|")
            lines.append(f"| `{name}` | {type_name} | {default} | {cell} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_markdown())
