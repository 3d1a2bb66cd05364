"""The ``vigil`` command line.

Each subcommand imports its module lazily so ``vigil --help`` stays fast and works with none
of the extras installed, and every ``VigilError`` becomes one line on stderr and its exit code
(2 for bad config or input). A command whose extra is missing says which one (exit code 2):
``vigil dashboard: needs the 'dashboard' extra (pip install 'vigil[dashboard]'): No module
named 'streamlit'`` (the modules of each extra: ``vigil_shell.extras.EXTRAS``).

The options every command shares are declared once, in ``vigil_shell.options``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from vigil import __version__
from vigil.errors import ExtraMissingError, VigilError
from vigil_shell.extras import missing_extra
from vigil_shell.options import (
    add_log_level_option,
)

__all__ = ["build_parser", "main"]


#: ``(command, help, module)``: every command but ``slo status``, in the order of ``--help``.
COMMANDS = (
    ("collect", "scrape the configured targets into the store", "vigil_shell.collect_cli"),
    ("ingest", "store exposition files as if scraped from a target", "vigil_shell.ingest_cli"),
    ("targets", "every target, static and discovered, and its health, like Prometheus's "
                "targets page", "vigil_shell.targets_cli"),
    ("serve", "collector + SLO evaluation + alerts + /metrics, in one", "vigil_shell.serve"),
    ("alerts", "firing alerts and the notification outbox", "vigil_shell.alerts_cli"),
    ("rules", "Prometheus rules, scrape config, KEDA objects and Grafana dashboards",
     "vigil_shell.rules_cli"),
    ("sim", "run a simulated vLLM fleet (no GPU needed)", "vigil_shell.sim_cli"),
    ("loadgen", "send a mixed workload to a vLLM-compatible endpoint",
     "vigil_shell.loadgen_cli"),
    ("demo", "simulated fleet + load + collector, all on this machine", "vigil_shell.demo"),
    ("gateway", "OpenAI-compatible gateway: tiers, max_tokens policy, semantic cache",
     "vigil_shell.gateway_cli"),
    ("vllm-args", "print the `vllm serve` command for a pool's launch profile",
     "vigil_shell.vllm_args_cli"),
    ("vllm-serve", "run `vllm serve` for a pool (needs the vllm extra and a GPU)",
     "vigil_shell.vllm_serve_cli"),
    ("dashboard", "the Streamlit dashboard", "vigil_shell.dashboard_cli"),
    ("capacity", "the highest load a replica serves within its SLOs, measured",
     "vigil_shell.capacity_cli"),
    ("plan", "the cheapest configuration that meets the SLOs for the traffic",
     "vigil_shell.plan_cli"),
    ("otlp", "request records from OpenTelemetry spans (OTLP/HTTP receiver)",
     "vigil_shell.otlp_cli"),
)
#: ``vigil slo status`` and ``vigil slo backtest``: sub-subcommands.
SLO_STATUS = "vigil_shell.slo_status_cli"
SLO_BACKTEST = "vigil_shell.slo_backtest_cli"
#: ``vigil cost report``.
COST_REPORT = "vigil_shell.cost_cli"


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

    # Each command is a module of vigil_shell with add_arguments(parser) and run(args). Only
    # the chosen command's module is imported, since some import the web stack, the scheduler
    # or pandas: `vigil --help` and `vigil targets` stay fast, and a broken optional module
    # cannot break every command.
    for name, help_text, module in COMMANDS:
        p = sub.add_parser(name, help=help_text)
        if selected == name:
            importlib.import_module(module).add_arguments(p)
        p.set_defaults(func=_run_module(module))

    p = sub.add_parser("slo", help="the SLO engine: SLIs, burn rates, budgets, cost, scaling")
    slo_sub = p.add_subparsers(dest="slo_command", metavar="SUBCOMMAND", required=True)
    for name, help_text, module in (
        ("status", "every SLO, burn rate, cost and scaling advice now", SLO_STATUS),
        ("backtest", "the generated burn-rate alerts replayed over the history", SLO_BACKTEST),
    ):
        p = slo_sub.add_parser(name, help=help_text)
        if selected == "slo":
            importlib.import_module(module).add_arguments(p)
        p.set_defaults(func=_run_module(module))

    p = sub.add_parser("cost", help="GPU cost per tenant, tier, model and pool: the chargeback")
    cost_sub = p.add_subparsers(dest="cost_command", metavar="SUBCOMMAND", required=True)
    p = cost_sub.add_parser("report", help="a month's or a window's cost, adding up to the "
                                           "GPU bill")
    if selected == "cost":
        importlib.import_module(COST_REPORT).add_arguments(p)
    p.set_defaults(func=_run_module(COST_REPORT))
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
