"""The ``vigil`` command line.

Each subcommand imports its module lazily so ``vigil --help`` stays fast and works with none
of the extras installed, and every ``VigilError`` becomes one line on stderr and its exit code
(2 for bad config or input). A command whose extra is missing says which one (exit code 2):
``vigil dashboard: needs the 'dashboard' extra (pip install 'vigil[dashboard]'): No module
named 'streamlit'`` (the modules of each extra: ``vigil.extras.EXTRAS``).

The options every command shares are declared once, in ``vigil.cli_options``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from vigil import __version__
from vigil.cli_options import (
    add_at_option,
    add_config_option,
    add_json_option,
    add_log_level_option,
)
from vigil.errors import ConfigError, ExtraMissingError, VigilError
from vigil.extras import missing_extra

__all__ = ["build_parser", "main"]


# --- collect ------------------------------------------------------------------------------
def _cmd_collect(args: argparse.Namespace) -> int:
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


# --- ingest -------------------------------------------------------------------------------
def _cmd_ingest(args: argparse.Namespace) -> int:
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
    at = args.at if args.at is not None else time.time()
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


# --- targets ------------------------------------------------------------------------------
def _cmd_targets(args: argparse.Namespace) -> int:
    from vigil_shell import targets_cli

    return targets_cli.run(args)


# --- serve / alerts ----------------------------------------------------------------------
def _cmd_serve(args: argparse.Namespace) -> int:
    from vigil_shell import serve

    return serve.run(args)


def _cmd_alerts(args: argparse.Namespace) -> int:
    from vigil_shell import alerts_cli

    return alerts_cli.run(args)


def _cmd_rules(args: argparse.Namespace) -> int:
    from alerts.rules import cli as rules_cli

    return int(rules_cli.run(args))


# --- slo ---------------------------------------------------------------------------------
def _cmd_slo_status(args: argparse.Namespace) -> int:
    from slo import cli as slo_cli

    return slo_cli.run(args)


# --- sim / demo ---------------------------------------------------------------------------
def _cmd_sim(args: argparse.Namespace) -> int:
    from serving.sim import cli as sim_cli

    return sim_cli.run(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from vigil_shell import demo

    return demo.run(args)


def _cmd_loadgen(args: argparse.Namespace) -> int:
    from serving import loadgen

    return loadgen.run(args)


def _run_module(module: str) -> Any:
    """A command function that imports ``module`` only when run and calls its ``run(args)``."""

    def func(args: argparse.Namespace) -> int:
        return int(importlib.import_module(module).run(args))

    return func


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; ``selected`` is the command about to run (its options are added)."""
    parser = argparse.ArgumentParser(
        prog="vigil",
        description="SLO monitoring and cost observability for vLLM fleets.",
    )
    parser.add_argument("--version", action="version", version=f"vigil {__version__}")
    add_log_level_option(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("collect", help="scrape the configured targets into the store")
    add_config_option(p)
    p.add_argument("--once", action="store_true", help="scrape every target once and exit")
    p.set_defaults(func=_cmd_collect)

    p = sub.add_parser("ingest", help="store exposition files as if scraped from a target")
    add_config_option(p)
    p.add_argument("--target", required=True, help="the target's name in the config")
    add_at_option(p, help="timestamp of a file without sample timestamps (default: now)")
    p.add_argument("--no-up", action="store_true",
                   help="store a backfill without `up` as it is; by default it gets up = 1 "
                        "for the target at each of its timestamps, as its scrapes would have")
    p.add_argument("files", nargs="+", metavar="FILE", help="exposition files; - reads stdin")
    p.set_defaults(func=_cmd_ingest)

    p = sub.add_parser("targets", help="every target, static and discovered, and its health, "
                                        "like Prometheus's targets page")
    add_config_option(p)
    add_json_option(p)
    p.add_argument("--refresh", action="store_true",
                   help="after the list, keep reading the discovery sources on their "
                        "intervals and print each target added, removed or changed (Ctrl-C "
                        "stops)")
    p.set_defaults(func=_cmd_targets)

    # The other commands' options live with their modules, which import the web stack, the
    # scheduler or pandas. Only the chosen command's module is imported: `vigil --help` and
    # `vigil targets` stay fast, and a broken optional module cannot break every command.
    lazy = [
        ("serve", "collector + SLO evaluation + alerts + /metrics, in one",
         "vigil_shell.serve", _cmd_serve),
        ("alerts", "firing alerts and the notification outbox", "vigil_shell.alerts_cli",
         _cmd_alerts),
        ("rules", "Prometheus recording/alert rules, scrape config and KEDA ScaledObjects",
         "alerts.rules.cli", _cmd_rules),
        ("sim", "run a simulated vLLM fleet (no GPU needed)", "serving.sim.cli", _cmd_sim),
        ("loadgen", "send a mixed workload to a vLLM-compatible endpoint", "serving.loadgen",
         _cmd_loadgen),
        ("demo", "simulated fleet + load + collector, all on this machine", "vigil_shell.demo",
         _cmd_demo),
        ("gateway", "OpenAI-compatible gateway: tiers, max_tokens policy, semantic cache",
         "serving.gateway.cli", _run_module("serving.gateway.cli")),
        ("vllm-args", "print the `vllm serve` command for a pool's launch profile",
         "serving.vllm_args", _run_module("serving.vllm_args")),
        ("vllm-serve", "run `vllm serve` for a pool (needs the vllm extra and a GPU)",
         "serving.vllm_launch", _run_module("serving.vllm_launch")),
        ("dashboard", "the Streamlit dashboard", "dashboard.cli", _run_module("dashboard.cli")),
        ("capacity", "the highest load a replica serves within its SLOs, measured",
         "vigil_shell.capacity_cli", _run_module("vigil_shell.capacity_cli")),
        ("plan", "the cheapest configuration that meets the SLOs for the traffic",
         "vigil_shell.plan_cli", _run_module("vigil_shell.plan_cli")),
    ]
    for name, help_text, module, func in lazy:
        p = sub.add_parser(name, help=help_text)
        if selected == name:
            importlib.import_module(module).add_arguments(p)
        p.set_defaults(func=func)

    p = sub.add_parser("slo", help="the SLO engine: SLIs, burn rates, budgets, cost, scaling")
    slo_sub = p.add_subparsers(dest="slo_command", metavar="SUBCOMMAND", required=True)
    p = slo_sub.add_parser("status", help="every SLO, burn rate, cost and scaling advice now")
    if selected == "slo":
        importlib.import_module("slo.cli").add_arguments(p)
    p.set_defaults(func=_cmd_slo_status)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The subcommand in ``argv``: the first word that is not a global option or its value."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--log-level":
            skip = True
        elif not a.startswith("-"):
            return a
    return None


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # apscheduler logs every job run at INFO; that is noise at our default level.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vigil ARGV``; returns the exit code (0 ok, 2 bad config, input or missing extra)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = _command_of(argv)
    try:
        # The chosen command's module is imported here (its options), or when it runs: either
        # may find an extra missing.
        parser = build_parser(selected)
        args = parser.parse_args(argv)
        _configure_logging(args.log_level)
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        error = missing_extra(exc)
        if error is None:
            raise
        print(f"vigil {selected}: {error}", file=sys.stderr)
        return error.exit_code
    except ExtraMissingError as exc:
        print(f"vigil {selected}: {exc}", file=sys.stderr)
        return exc.exit_code
    except VigilError as exc:
        print(f"vigil {selected}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `vigil targets --json | head`: the reader left; not an error worth a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
