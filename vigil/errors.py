"""The one exception hierarchy of Vigil.

Every error says *where*: the target, the file and line, or the config key. Code raises the
specific leaf; the CLI turns any ``VigilError`` into a one-line message and an exit code.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "IngestError",
    "ParseError",
    "ScrapeError",
    "StoreError",
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
    """The sample store could not be opened or written."""
