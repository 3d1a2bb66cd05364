"""``vigil rules prometheus``, ``vigil rules keda`` and ``vigil rules grafana``: generated
Prometheus, KEDA and Grafana files.

Wire it as a subcommand with sub-subcommands::

    p = sub.add_parser("rules", help="Prometheus rules, scrape config and KEDA objects")
    vigil_shell.rules_cli.add_arguments(p)
    p.set_defaults(func=vigil_shell.rules_cli.run)

``vigil rules prometheus --config F [--out DIR]`` writes ``DIR/vigil-slo-rules.yml``,
``DIR/vigil-alert-rules.yml``, ``DIR/vigil-rules-test.yml`` and ``DIR/prometheus-scrape.yml``;
without ``--out`` it prints the recording and alerting rules as one rule file.
``vigil rules prometheus --format operator [--namespace NS] [--label K=V ...]
[--pod-selector K=V,...] [--port NAME] [--pod-namespace NS] [--dcgm-pod-selector K=V,...]
[--dcgm-port NAME] [--dcgm-namespace NS]`` writes ``DIR/vigil-operator.yml`` (or prints it):
PodMonitors and PrometheusRules for the Prometheus Operator (``alerts.rules.operator``).
``vigil rules keda --config F [--out DIR] [--prometheus-url URL] [--namespace NS]
[--scale-target NAME] [--signal vllm|vigil]`` writes ``DIR/vigil-keda.yml`` (or prints it).
``vigil rules grafana --config F [--out DIR] [--format files|operator] [--operator
sidecar|grafana-operator] [--namespace NS] [--label K=V ...] [--folder NAME]
[--instance-selector K=V ...]`` writes ``DIR/vigil-slo-overview.json``, ``vigil-slo-detail.json``,
``vigil-fleet.json`` and ``vigil-cost.json`` (or prints them as one JSON list), or with
``--format operator`` ``DIR/vigil-grafana-dashboards.yml`` (``alerts.rules.grafana``).
``vigil rules helm --values FILE [--chart DIR] [--out FILE]`` writes the Helm chart's
generated-objects overlay (``vigil_shell.rules_helm_cli``).
Notes (SLOs skipped, triggers left out) go to stderr; errors are ``VigilError``s (exit 2 for a
bad config).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from vigil.conventions import (
    FILE_KEDA,
    FILE_OPERATOR,
    KEDA_AUTH_SECRET,
    OPERATOR_DCGM_PORT,
    OPERATOR_POD_SELECTOR,
    OPERATOR_PORT,
)
from vigil.errors import ConfigError
from vigil_shell import rules_helm_cli
from vigil_shell.options import (
    add_config_option,
    add_out_option,
    add_prometheus_url_option,
    positive_duration_arg,
)

if TYPE_CHECKING:
    from alerts.rules.operator import OperatorOptions

__all__ = ["FORMATS", "FORMAT_FILES", "FORMAT_OPERATOR", "add_arguments", "run"]

#: ``vigil rules prometheus --format``: rule files and scrape jobs, or Operator objects.
FORMAT_FILES = "files"
FORMAT_OPERATOR = "operator"
FORMATS = (FORMAT_FILES, FORMAT_OPERATOR)
#: The options of ``--format operator`` alone (argparse dest, flag).
_OPERATOR_OPTIONS = (
    ("namespace", "--namespace"), ("label", "--label"), ("pod_selector", "--pod-selector"),
    ("port", "--port"), ("pod_namespace", "--pod-namespace"),
    ("dcgm_pod_selector", "--dcgm-pod-selector"), ("dcgm_port", "--dcgm-port"),
    ("dcgm_namespace", "--dcgm-namespace"),
)


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
    p.add_argument("--format", choices=FORMATS, default=FORMAT_FILES,
                   help="files: rule files, promtool tests and scrape jobs (default); "
                        "operator: Prometheus Operator PodMonitors and PrometheusRules")
    _operator_arguments(p.add_argument_group(
        "--format operator", "where the objects go and how the PodMonitors find the pods"))
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
    p.add_argument("--auth-secret", default=KEDA_AUTH_SECRET, metavar="NAME",
                   help="the Secret holding the [engine.http] credential for KEDA, its keys "
                        "named as KEDA's parameters: bearerToken, username and password, "
                        "customAuthHeader and customAuthValue, cert, key, ca "
                        f"(default {KEDA_AUTH_SECRET})")
    p.add_argument("--signal", choices=("vllm", "vigil"), default="vllm",
                   help="vllm: trigger on queue, KV cache and TTFT p95 read from vLLM (default); "
                        "vigil: on vigil serve's desired replicas (Prometheus must scrape it)")
    p = sub.add_parser(
        "grafana",
        help="Grafana dashboards over the rules: SLO overview and detail, fleet, cost",
        description="Grafana dashboards (JSON model) from the same SLO specs and pools as the "
                    "rules; their queries read the recording rules of `vigil rules "
                    "prometheus`, so load those into the Prometheus the dashboards query.",
    )
    _common(p)
    p.add_argument("--format", choices=FORMATS, default=FORMAT_FILES,
                   help="files: one JSON file per dashboard (default); operator: Kubernetes "
                        "objects Grafana picks up")
    g = p.add_argument_group("--format operator", "which objects, and where they go")
    g.add_argument("--operator", choices=("sidecar", "grafana-operator"), default=None,
                   help="sidecar: ConfigMaps labelled grafana_dashboard=1 for Grafana's "
                        "dashboard sidecar (default); grafana-operator: GrafanaDashboard "
                        "objects")
    g.add_argument("--namespace", default=None, metavar="NS",
                   help="namespace of the objects (default: kubectl's current one)")
    g.add_argument("--label", action="append", default=None, metavar="KEY=VALUE",
                   help="a metadata label of every object (repeatable)")
    g.add_argument("--folder", default=None, metavar="NAME",
                   help="the Grafana folder of the dashboards (default: Vigil)")
    g.add_argument("--instance-selector", action="append", default=None, metavar="KEY=VALUE",
                   help="matchLabels of the Grafana instances a GrafanaDashboard is for "
                        "(repeatable; default: dashboards=grafana)")
    p = sub.add_parser(
        "helm",
        help="the Helm chart's generated objects as a values overlay",
        description="The PrometheusRules, PodMonitors, Grafana dashboard ConfigMaps and KEDA "
                    "ScaledObjects that the Helm chart's values enable, from their config tree "
                    "and by the generators of the other `vigil rules` commands, as a values "
                    "file to add after yours: helm install vigil deploy/helm/vigil -f "
                    "my-values.yaml -f generated-values.yaml.",
    )
    rules_helm_cli.add_arguments(p)


def _operator_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--namespace", default=None, metavar="NS",
                   help="namespace of the objects (default: kubectl's current one)")
    g.add_argument("--label", action="append", default=None, metavar="KEY=VALUE",
                   help="a metadata label of every object, e.g. release=kube-prometheus-stack "
                        "for the Prometheus's ruleSelector and podMonitorSelector (repeatable)")
    g.add_argument("--pod-selector", default=None, metavar="K=V,...",
                   help="matchLabels of a pool's vLLM pods, {pool} replaced by its name "
                        f"(default: {OPERATOR_POD_SELECTOR}, vLLM production-stack's)")
    g.add_argument("--port", default=None, metavar="NAME",
                   help=f"name of the vLLM pods' metrics port (default: {OPERATOR_PORT})")
    g.add_argument("--pod-namespace", default=None, metavar="NS",
                   help="namespace of the vLLM pods (default: the PodMonitor's)")
    g.add_argument("--dcgm-pod-selector", default=None, metavar="K=V,...",
                   help="matchLabels of a pool's dcgm-exporter pods, {pool} replaced (default: "
                        "none, no dcgm-exporter PodMonitor)")
    g.add_argument("--dcgm-port", default=None, metavar="NAME",
                   help=f"dcgm-exporter's metrics port name (default: {OPERATOR_DCGM_PORT})")
    g.add_argument("--dcgm-namespace", default=None, metavar="NS",
                   help="namespace of the dcgm-exporter pods (default: the PodMonitor's)")


def _operator_options(args: argparse.Namespace) -> OperatorOptions:
    from alerts.rules.operator import OperatorOptions, parse_label

    given = {dest: getattr(args, dest) for dest, _ in _OPERATOR_OPTIONS
             if getattr(args, dest) is not None}
    labels = tuple(parse_label(text) for text in given.pop("label", []))
    return OperatorOptions(labels=labels, **given)


def _emit(files: dict[str, str], out_dir: str | None, stdout_text: str, out: TextIO) -> None:
    from alerts.rules.pipeline import write_files

    if out_dir is None:
        out.write(stdout_text)
        return
    for path in write_files(files, out_dir):
        out.write(f"wrote {path}\n")


def _prometheus(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from alerts.rules.operator import generate_operator
    from alerts.rules.pipeline import generate, rules_options
    from vigil.config import load_config

    config = load_config(args.config)
    options = rules_options(config, interval_s=args.interval,
                            period_interval_s=args.period_interval)
    operator = args.format == FORMAT_OPERATOR
    if not operator:
        given = [flag for dest, flag in _OPERATOR_OPTIONS if getattr(args, dest) is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: only with --format operator")
    operator_options = _operator_options(args) if operator else None
    result = generate(config, options)
    for name, reason in result.validated.skipped:
        err.write(f"vigil rules prometheus: skipped SLO {name}: {reason}\n")
    if operator_options is None and args.out is not None:  # the scrape jobs are written
        from alerts.rules.scrape_config import scrape_notes

        for note in scrape_notes(config):
            err.write(f"vigil rules prometheus: {note}\n")
    if operator_options is not None:
        objects = generate_operator(result, operator_options)
        for note in objects.notes:
            err.write(f"vigil rules prometheus: {note}\n")
        text = objects.text()
        _emit({FILE_OPERATOR: text}, args.out, text, out)
        return 0
    _emit(result.files(), args.out, result.all_rules_text(), out)
    return 0


def _keda(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from alerts.rules.keda import KedaOptions, generate_keda
    from vigil.config import load_config

    config = load_config(args.config)
    options = KedaOptions(prometheus_url=args.prometheus_url.rstrip("/"),
                          namespace=args.namespace, scale_target=args.scale_target,
                          signal=args.signal, auth_secret=args.auth_secret)
    result = generate_keda(config, options)
    for warning in result.warnings:
        err.write(f"vigil rules keda: {warning}\n")
    text = result.text()
    _emit({FILE_KEDA: text}, args.out, text, out)
    return 0


#: The options of ``vigil rules grafana --format operator`` alone (argparse dest, flag).
_GRAFANA_OPERATOR_OPTIONS = (("operator", "--operator"), ("namespace", "--namespace"),
                             ("label", "--label"), ("folder", "--folder"),
                             ("instance_selector", "--instance-selector"))


def _grafana(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from alerts.rules.grafana import GrafanaOptions, generate_grafana
    from alerts.rules.operator import parse_label
    from alerts.rules.pipeline import generate
    from vigil.config import load_config

    given = {dest: getattr(args, dest) for dest, _ in _GRAFANA_OPERATOR_OPTIONS
             if getattr(args, dest) is not None}
    if args.format != FORMAT_OPERATOR and given:
        flags = [flag for dest, flag in _GRAFANA_OPERATOR_OPTIONS if dest in given]
        raise ConfigError(f"{', '.join(flags)}: only with --format operator")
    labels = tuple(parse_label(text) for text in given.pop("label", []))
    selector = tuple(parse_label(text, "--instance-selector")
                     for text in given.pop("instance_selector", []))
    options = GrafanaOptions(format=args.format, labels=labels, **given,
                             **({"instance_selector": selector} if selector else {}))
    config = load_config(args.config)
    result = generate(config)
    for name, reason in result.validated.skipped:
        err.write(f"vigil rules grafana: skipped SLO {name}: {reason}\n")
    output = generate_grafana(result, options)
    _emit(output.files(), args.out, output.stdout_text(), out)
    return 0


def run(args: argparse.Namespace, *, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    """Run ``vigil rules <prometheus|keda|grafana|helm>``; returns the exit code."""
    stdout = out if out is not None else sys.stdout
    stderr = err if err is not None else sys.stderr
    if args.rules_command == "prometheus":
        return _prometheus(args, stdout, stderr)
    if args.rules_command == "keda":
        return _keda(args, stdout, stderr)
    if args.rules_command == "grafana":
        return _grafana(args, stdout, stderr)
    if args.rules_command == "helm":
        return rules_helm_cli.run(args, stdout, stderr)
    raise ValueError(f"unknown rules subcommand {args.rules_command!r}")  # argparse prevents it
