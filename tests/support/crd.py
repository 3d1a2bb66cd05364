"""Checking objects against a CustomResourceDefinition's schema the way the API server does,
where ``jsonschema`` alone is laxer (shared by the KEDA, Prometheus Operator and Helm tests)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["python_patterns", "unknown_fields"]


def python_patterns(schema: Any) -> Any:
    """``schema`` with its ``pattern``s in Python's syntax: Go's RE2 takes a flag group such as
    ``(?i)`` anywhere (``^(?i)(abort|warn)?$``), Python only at the start."""
    if isinstance(schema, dict):
        out = {k: python_patterns(v) for k, v in schema.items()}
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            flags = "".join(re.findall(r"\(\?[a-z]+\)", pattern))
            out["pattern"] = flags + re.sub(r"\(\?[a-z]+\)", "", pattern)
        return out
    if isinstance(schema, list):
        return [python_patterns(v) for v in schema]
    return schema


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields of ``obj`` that the structural schema does not declare: Kubernetes prunes them,
    or refuses them under strict field validation, while ``jsonschema`` lets them through
    (CRDs set no ``additionalProperties: false``)."""
    out: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                out += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields") and path != ".metadata":
                out.append(f"{path}.{key}")
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out
