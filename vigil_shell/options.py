"""The options every ``vigil`` command spells the same way, declared once.

A command's module (``vigil_shell.slo_status_cli``, ``vigil_shell.gateway_cli``...) adds them to
its parser from here without importing the ``vigil`` command itself:

=====================  ============================================================
``--config``, ``-c``   the Vigil TOML config file
``--log-level``        DEBUG, INFO, WARNING or ERROR (any case); the global option
``--json``             machine-readable output on stdout
``--at``               a time as Unix seconds
``--out``, ``-o``      a folder to write files into instead of printing them
``--listen``           ``HOST:PORT`` a server binds (IPv6 in brackets)
``--prometheus-url``   a Prometheus-compatible API (``[engine] prometheus_url``)
=====================  ============================================================

Durations are written as in the config (``90s``, ``5m``, ``1h30m``) or as plain seconds.
A renamed option keeps its old spelling as a hidden alias that says so on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from vigil.durations import parse_duration
from vigil.http_server import parse_listen

__all__ = [
    "LOG_LEVELS",
    "add_at_option",
    "add_config_option",
    "add_deprecated_alias",
    "add_json_option",
    "add_listen_option",
    "add_log_level_option",
    "add_out_option",
    "add_prometheus_url_option",
    "duration_arg",
    "parse_listen",
    "positive_duration_arg",
]

#: The accepted ``--log-level`` values (the standard library's names).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# ArgumentParser and argument groups both have add_argument; argparse has no public name for
# their common base.
Container = argparse._ActionsContainer


def add_config_option(p: Container, *, required: bool = True,
                      help: str = "Vigil TOML config file") -> None:
    """``--config FILE`` / ``-c FILE`` (``args.config``)."""
    p.add_argument("--config", "-c", required=required, metavar="FILE", help=help)


def add_log_level_option(p: Container) -> None:
    """``--log-level LEVEL`` (``args.log_level``, upper case; default INFO)."""
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO",
                   metavar="LEVEL", help=f"{', '.join(LOG_LEVELS)} (default INFO)")


def add_json_option(p: Container, *, help: str = "machine-readable output (JSON)") -> None:
    """``--json`` (``args.json``)."""
    p.add_argument("--json", action="store_true", help=help)


def add_at_option(p: Container, *, help: str) -> None:
    """``--at UNIX_SECONDS`` (``args.at``: float seconds since the epoch, or None)."""
    p.add_argument("--at", type=float, metavar="UNIX_SECONDS", help=help)


def add_out_option(p: Container, *, help: str) -> None:
    """``--out DIR`` / ``-o DIR`` (``args.out``, or None)."""
    p.add_argument("--out", "-o", metavar="DIR", help=help)


def add_listen_option(p: Container, *, default: str | None, help: str) -> None:
    """``--listen HOST:PORT`` (``args.listen``: the text; ``parse_listen`` splits it)."""
    p.add_argument("--listen", default=default, metavar="HOST:PORT", help=help)


class _DeprecatedAlias(argparse.Action):
    """Stores like the option it stands for, after a note on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, replacement: str,
                 **kwargs: Any) -> None:
        self.replacement = replacement
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated; use {self.replacement}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_alias(p: Container, flag: str, *, dest: str, replacement: str,
                         type: Callable[[str], Any] | None = None) -> None:
    """A hidden old spelling ``flag`` of an option, storing into ``dest``; using it prints
    "``flag`` is deprecated; use ``replacement``" on stderr (not a warning: scripts that call
    the command keep working, and the person reading its output learns the new name)."""
    extra: dict[str, Any] = {} if type is None else {"type": type}
    p.add_argument(flag, dest=dest, action=_DeprecatedAlias, replacement=replacement,
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS, **extra)


def add_prometheus_url_option(p: Container, *, default: str | None = None,
                              help: str) -> None:
    """``--prometheus-url URL`` (``args.prometheus_url``), with ``--prometheus`` as its
    deprecated alias."""
    p.add_argument("--prometheus-url", default=default, metavar="URL", help=help)
    add_deprecated_alias(p, "--prometheus", dest="prometheus_url",
                         replacement="--prometheus-url")


def duration_arg(text: str) -> float:
    """An option's duration in seconds: ``"90"``, ``"1.5"``, ``"90s"``, ``"5m"``, ``"1h30m"``
    (>= 0); ``argparse.ArgumentTypeError`` otherwise."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"a duration must be >= 0 seconds, got {text!r}")
    return seconds


def positive_duration_arg(text: str) -> float:
    """``duration_arg`` that must be more than 0 seconds."""
    seconds = duration_arg(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return seconds
