"""`vigil serve`: its options, and the runtime (``serve.server``) wired to them."""

from __future__ import annotations

import argparse
import asyncio

from serve.server import serve_until_stopped
from vigil.config import check_http_url
from vigil.conventions import SERVE_DEFAULT_LISTEN
from vigil.errors import ConfigError
from vigil_shell.options import add_config_option, add_listen_option, add_prometheus_url_option
from vigil_shell.options import parse_listen as _parse_host_port

__all__ = ["add_arguments", "parse_listen", "run"]

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `vigil serve` (``--config`` included)."""
    add_config_option(p)
    add_listen_option(p, default=SERVE_DEFAULT_LISTEN,
                      help=f"address of /metrics and /healthz (default {SERVE_DEFAULT_LISTEN})")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --listen (the endpoint has no authentication)")
    add_prometheus_url_option(p, help="evaluate from this Prometheus-compatible API, which "
                                      "scrapes the replicas itself: no collector, no store "
                                      "(default: [engine] prometheus_url)")


def parse_listen(value: str, *, allow_remote: bool = False) -> tuple[str, int]:
    """``"host:port"`` -> (host, port); ``ConfigError`` for a bad or non-loopback address
    (port 0: the kernel picks one)."""
    host, port = _parse_host_port(value, allow_port_zero=True)
    if host not in _LOOPBACK and not allow_remote:
        raise ConfigError(f"--listen {value}: not a loopback address; /metrics has no "
                          "authentication (pass --allow-remote to bind it anyway)")
    return host, port


def run(args: argparse.Namespace) -> int:
    """`vigil serve --config F [--listen HOST:PORT] [--allow-remote] [--prometheus-url URL]`."""
    from vigil.config import load_config

    config = load_config(args.config)
    listen = parse_listen(args.listen, allow_remote=args.allow_remote)
    url = (getattr(args, "prometheus_url", None) or config.engine.prometheus_url).rstrip("/")
    if url:
        from vigil.config.base import USE_BASIC_AUTH, refuse_password

        try:
            check_http_url(refuse_password(url, "the URL", USE_BASIC_AUTH))
        except ValueError as exc:
            raise ConfigError(f"--prometheus-url: {exc}") from None
    elif not config.targets and not config.discovery:
        raise ConfigError("no [[targets]] or [[discovery]] to scrape (or give "
                          "[engine] prometheus_url to read a Prometheus that scrapes them)",
                          file=args.config, key="targets")
    return asyncio.run(serve_until_stopped(config, listen, prometheus_url=url))
