"""``vigil collect``: scrape every target, static and discovered, into the store."""

from __future__ import annotations

import argparse
import asyncio
import signal

from vigil.errors import ConfigError
from vigil_shell.options import add_config_option

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``vigil collect``."""
    add_config_option(p)
    p.add_argument("--once", action="store_true", help="scrape every target once and exit")


def run(args: argparse.Namespace) -> int:
    """Scrape every target once (``--once``: print each one's health) or on its schedule until
    SIGTERM or Ctrl-C."""
    from collector.service import Collector
    from vigil.config import load_config

    cfg = load_config(args.config)
    if not cfg.targets and not cfg.discovery:
        raise ConfigError("no [[targets]] to scrape and no [[discovery]] to find them",
                          file=args.config, key="targets")

    async def once() -> int:
        async with Collector(cfg) as c:
            results = await c.scrape_all()
        for h in results:
            state = "up" if h.up else f"DOWN ({h.error})"
            print(f"{h.target:<24} {state:<8} {h.samples:>6} samples  {h.duration * 1000:7.1f} ms")
        return 0

    async def forever() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with Collector(cfg) as c:
            found = f" ({len(cfg.discovery)} discovery sources)" if cfg.discovery else ""
            print(
                f"vigil collect: {len(c.targets)} targets{found} every "
                f"{cfg.collector.scrape_interval:g}s into {cfg.store_path()} (Ctrl-C stops)",
                flush=True,
            )
            await c.run(stop)
            print(f"vigil collect: stopped after {c.scrapes} scrapes", flush=True)
        return 0

    return asyncio.run(once() if args.once else forever())
