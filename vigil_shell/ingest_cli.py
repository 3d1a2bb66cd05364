"""``vigil ingest``: store exposition files as if scraped from a configured target (files with
timestamps are backfills)."""

from __future__ import annotations

import argparse

from vigil.clock import Clock, system_clock
from vigil.errors import ConfigError
from vigil_shell.options import add_at_option, add_config_option

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``vigil ingest``."""
    add_config_option(p)
    p.add_argument("--target", required=True, help="the target's name in the config")
    add_at_option(p, help="timestamp of a file without sample timestamps (default: now)")
    p.add_argument("--no-up", action="store_true",
                   help="store a backfill without `up` as it is; by default it gets up = 1 "
                        "for the target at each of its timestamps, as its scrapes would have")
    p.add_argument("files", nargs="+", metavar="FILE", help="exposition files; - reads stdin")


def run(args: argparse.Namespace, *, clock: Clock = system_clock) -> int:
    """Store the files as if scraped from ``--target``; a file without timestamps is stamped
    ``--at``, else ``clock()``."""
    from collector.ingest import prepare_ingest, write_ingest
    from collector.service import target_info
    from collector.store import Store
    from vigil.config import load_config

    cfg = load_config(args.config)
    try:
        target = cfg.target(args.target)
    except KeyError:
        names = ", ".join(t.name for t in cfg.targets) or "none"
        raise ConfigError(
            f"--target {args.target!r} is not a target of this config (targets: {names})",
            file=args.config,
        ) from None
    at = args.at if args.at is not None else clock()
    # Parse everything first: a bad file must not even create the store.
    prepared = prepare_ingest(target_info(target), args.files, at=at,
                              backfill_up=not args.no_up)
    s = cfg.store
    with Store(cfg.store_path(), raw_retention_s=s.raw_retention,
               downsampled_retention_s=s.downsampled_retention,
               resolution_s=s.resolution) as store:
        report = write_ingest(store, prepared)
    for name, mode, n in report.files:
        print(f"{name}: {n} samples ({mode})")
    if report.up_added:
        print(f"up = 1 at {report.up_added} backfill timestamps (--no-up to skip)")
    print(f"stored {report.points} points for target {target.name!r} in {cfg.store_path()}")
    return 0
