"""The one exception hierarchy of Vigil.

Every error says *where*: the target, the file and line, or the config key. Code raises the
specific leaf; the CLI turns any ``VigilError`` into a one-line message and an exit code.
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "BatchInputError",
    "ConfigError",
    "EmbeddingError",
    "ExtraMissingError",
    "GatewayError",
    "IngestError",
    "LaunchError",
    "LeaseLost",
    "NotFound",
    "ParseError",
    "ScrapeError",
    "SourceError",
    "StoreError",
    "StoreUnavailable",
    "UsageError",
    "VigilError",
]


class VigilError(Exception):
    """Base class of every error Vigil raises on purpose."""

    exit_code = 1


class ConfigError(VigilError):
    """The configuration file is missing, malformed or inconsistent.

    ``file`` is the TOML path, ``key`` the dotted key path (``targets[2].pool``).
    """

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None):
        self.file = file
        self.key = key
        self.reason = message
        where = ": ".join(p for p in (file, key) if p)
        super().__init__(f"{where}: {message}" if where else message)


class ArgumentError(VigilError, ValueError):
    """A value that cannot be used, named where it was given (an option, a selector, a
    function's argument). A ``ValueError`` too, so that code validating values (pydantic
    among it) treats it as one; the CLI prints it like every ``VigilError``, exit code 2,
    so no command converts a ``ValueError`` by hand."""

    exit_code = 2


class UsageError(ArgumentError):
    """Command-line options that parse one by one but not together (``--from`` after
    ``--to``); the message names them."""


class NotFound(VigilError, KeyError):
    """An id that names nothing (a notification in the outbox); a ``KeyError`` too."""

    def __str__(self) -> str:
        # KeyError's own str() quotes its argument as a repr.
        return str(self.args[0]) if self.args else "not found"


class ParseError(VigilError):
    """An exposition could not be parsed.

    ``source`` names what was parsed (a target name or a file path), ``line`` is 1-based
    (0 when the problem is not tied to a line, such as an empty body).
    """

    exit_code = 2

    def __init__(self, message: str, *, source: str = "<exposition>", line: int = 0,
                 text: str | None = None):
        self.source = source
        self.line = line
        self.text = text
        self.reason = message
        where = f"{source}:{line}" if line else source
        snippet = f" (line: {text[:120]!r})" if text is not None else ""
        super().__init__(f"{where}: {message}{snippet}")


class ScrapeError(VigilError):
    """A scrape failed: connection refused, timeout, bad status, bad content."""

    def __init__(self, message: str, *, target: str):
        self.target = target
        self.reason = message
        super().__init__(f"target {target!r}: {message}")


class IngestError(VigilError):
    """A file given to ``vigil ingest`` could not be stored (nothing was written)."""

    exit_code = 2


class StoreError(VigilError):
    """A database (the sample store, the outbox, the gateway's records, batch queue or cache
    entries) could not be opened, read or written."""


class StoreUnavailable(StoreError):
    """The database server cannot be reached (down, restarting, network cut): nothing was
    written, and the same call may succeed later. Writers that must not lose data buffer and
    retry on this error."""


class LeaseLost(StoreError):
    """This copy does not hold the lease it acts under (another copy took it, it expired, or
    too little of it is left for the write asked): the write was not made."""


class GatewayError(VigilError):
    """A request the gateway refuses or cannot serve, answered as an OpenAI-style error body.

    ``status`` is the HTTP status; ``type``, ``code`` and ``param`` fill the body's ``error``
    object; ``error_class`` is what the request's record says (``bad_request``, ``rejected``,
    ``over_cap``, ``timeout``, ...); ``retry_after`` (seconds) becomes a ``Retry-After`` header.
    The leaves live in ``serving.gateway.errors``.
    """

    def __init__(self, message: str, *, status: int, type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None,
                 error_class: str = "bad_request", retry_after: int | None = None):
        self.status = status
        self.type = type
        self.code = code
        self.param = param
        self.error_class = error_class
        self.retry_after = retry_after
        self.reason = message
        super().__init__(message)


class BatchInputError(VigilError):
    """A batch input file (JSONL) has bad lines; nothing was stored.

    ``problems`` holds ``(line, message)`` pairs, ``line`` 1-based (0: the file as a whole).
    """

    exit_code = 2

    def __init__(self, problems: list[tuple[int, str]], *, source: str = "batch input"):
        self.problems = list(problems)
        self.source = source
        shown = "; ".join(f"line {n}: {m}" if n else m for n, m in self.problems[:20])
        more = len(self.problems) - 20
        tail = f" (and {more} more)" if more > 0 else ""
        super().__init__(f"{source}: {shown}{tail}")


class ExtraMissingError(VigilError):
    """A command needs an optional extra that is not installed (``pip install 'vigil[X]'``).

    ``extra`` names the extra, ``module`` the top-level module that could not be imported.
    """

    exit_code = 2

    def __init__(self, extra: str, module: str):
        self.extra = extra
        self.module = module
        super().__init__(f"needs the {extra!r} extra (pip install 'vigil[{extra}]'): "
                         f"No module named {module!r}")


class LaunchError(VigilError):
    """``vigil vllm-serve`` cannot start vLLM here (no vllm package, no GPU)."""

    exit_code = 2


class SourceError(VigilError):
    """A query to the Prometheus-compatible server failed (unreachable, timed out, refused).

    ``url`` is the server, ``query`` the PromQL expression; the message says both and why.
    """

    def __init__(self, message: str, *, url: str, query: str | None = None):
        self.url = url
        self.query = query
        self.reason = message
        where = f"{url}: query {query!r}" if query is not None else url
        super().__init__(f"Prometheus at {where}: {message}")


class EmbeddingError(VigilError):
    """The semantic cache could not embed a text (model missing or loading, remote endpoint
    down, slow or answering garbage). The cache counts it and treats it as a miss.

    ``source`` names the embedder: ``local:<model folder>`` or the remote URL; ``busy`` is
    true when the embedder was only saturated (too many texts queued), not broken.
    """

    def __init__(self, message: str, *, source: str, busy: bool = False):
        self.source = source
        self.reason = message
        self.busy = busy
        super().__init__(f"embeddings from {source}: {message}")
