"""``vigil rules prometheus`` and ``vigil rules keda``: generated Prometheus and KEDA files.

Wire it as a subcommand with sub-subcommands::

    p = sub.add_parser("rules", help="Prometheus rules, scrape config and KEDA objects")
    alerts.rules_cli.add_arguments(p)
    p.set_defaults(func=alerts.rules_cli.run)

``vigil rules prometheus --config F [--out DIR]`` writes ``DIR/vigil-slo-rules.yml``,
``DIR/vigil-alert-rules.yml``, ``DIR/vigil-rules-test.yml`` and ``DIR/prometheus-scrape.yml``;
without ``--out`` it prints the recording and alerting rules as one rule file.
``vigil rules keda --config F [--out DIR] [--prometheus-url URL] [--namespace NS]
[--scale-target NAME] [--signal vllm|vigil]`` writes ``DIR/vigil-keda.yml`` (or prints it).
Notes (SLOs skipped, triggers left out) go to stderr; errors are ``VigilError``s (exit 2 for a
bad config).
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from vigil.cli_options import (
    add_config_option,
    add_out_option,
    add_prometheus_url_option,
    positive_duration_arg,
)
from vigil.conventions import FILE_KEDA

__all__ = ["add_arguments", "run"]


def _common(p: argparse.ArgumentParser) -> None:
    add_config_option(p)
    add_out_option(p, help="write the files into DIR (created if missing) instead of printing")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sub-subcommands of ``vigil rules`` and their flags (``args.rules_command``)."""
    sub = parser.add_subparsers(dest="rules_command", metavar="SUBCOMMAND", required=True)
    p = sub.add_parser(
        "prometheus",
        help="recording and alerting rules, their promtool tests and the scrape config",
        description="Prometheus recording and alerting rules from the SLO specs, promtool "
                    "unit tests for them, and the scrape jobs that label the targets as Vigil "
                    "does.",
    )
    _common(p)
    p.add_argument("--interval", type=positive_duration_arg, default=None, metavar="DURATION",
                   help="evaluation interval of the rule groups (default: [rules] interval)")
    p.add_argument("--period-interval", type=positive_duration_arg, default=None,
                   metavar="DURATION",
                   help="evaluation interval of the 30-day budget groups (default: [rules] "
                        "period_interval)")
    p = sub.add_parser(
        "keda",
        help="one KEDA ScaledObject per pool",
        description="KEDA ScaledObjects that scale each pool on Vigil's scale-out signals.",
    )
    _common(p)
    add_prometheus_url_option(p, default="",
                              help="the Prometheus KEDA queries (default: [engine] "
                                   "prometheus_url, else the Prometheus Operator's service)")
    p.add_argument("--namespace", default="", help="namespace of the ScaledObjects")
    p.add_argument("--scale-target", default="{pool}", metavar="NAME",
                   help="the Deployment to scale; {pool} is replaced by the pool's name "
                        "(default: {pool})")
    p.add_argument("--signal", choices=("vllm", "vigil"), default="vllm",
                   help="vllm: trigger on queue, KV cache and TTFT p95 read from vLLM (default); "
                        "vigil: on vigil serve's desired replicas (Prometheus must scrape it)")


def _emit(files: dict[str, str], out_dir: str | None, stdout_text: str, out: TextIO) -> None:
    from alerts.rules import write_files

    if out_dir is None:
        out.write(stdout_text)
        return
    for path in write_files(files, out_dir):
        out.write(f"wrote {path}\n")


def _prometheus(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from alerts.rules import generate, rules_options
    from vigil.config import load_config

    config = load_config(args.config)
    options = rules_options(config, interval_s=args.interval,
                            period_interval_s=args.period_interval)
    result = generate(config, options)
    for name, reason in result.validated.skipped:
        err.write(f"vigil rules prometheus: skipped SLO {name}: {reason}\n")
    _emit(result.files(), args.out, result.all_rules_text(), out)
    return 0


def _keda(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from alerts.keda import KedaOptions, generate_keda
    from vigil.config import load_config

    config = load_config(args.config)
    options = KedaOptions(prometheus_url=args.prometheus_url.rstrip("/"),
                          namespace=args.namespace, scale_target=args.scale_target,
                          signal=args.signal)
    result = generate_keda(config, options)
    for warning in result.warnings:
        err.write(f"vigil rules keda: {warning}\n")
    text = result.text()
    _emit({FILE_KEDA: text}, args.out, text, out)
    return 0


def run(args: argparse.Namespace, *, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    """Run ``vigil rules <prometheus|keda>``; returns the exit code."""
    stdout = out if out is not None else sys.stdout
    stderr = err if err is not None else sys.stderr
    if args.rules_command == "prometheus":
        return _prometheus(args, stdout, stderr)
    if args.rules_command == "keda":
        return _keda(args, stdout, stderr)
    raise ValueError(f"unknown rules subcommand {args.rules_command!r}")  # argparse prevents it
