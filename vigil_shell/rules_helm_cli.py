"""``vigil rules helm --values FILE [--values FILE ...] [--chart DIR] [--out FILE]``: the
generated objects of the Helm chart's values as a values overlay.

Reads the chart's ``values.yaml`` and the values files as ``helm install -f`` merges them,
checks the ``config`` tree as ``vigil`` checks a config file, and writes ``generated``: the
PrometheusRules, PodMonitors, Grafana dashboard ConfigMaps and KEDA ScaledObjects the enabled
sections ask for, made by the generators of ``vigil rules prometheus --format operator``,
``vigil rules grafana --format operator`` and ``vigil rules keda``, with a copy of the values
they were made from (``alerts.rules.helm_values``). Then::

    helm install vigil deploy/helm/vigil -f my-values.yaml -f generated-values.yaml

Notes (SLOs skipped, triggers left out) go to stderr; errors are ``VigilError``s (exit 2 for a
bad value, naming the file and the key).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TextIO

from vigil.errors import ConfigError

__all__ = ["DEFAULT_CHART", "add_arguments", "run"]

#: The chart in Vigil's source tree, relative to its root (where the command is usually run).
DEFAULT_CHART = "deploy/helm/vigil"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``vigil rules helm``."""
    p.add_argument("--values", "-f", action="append", required=True, metavar="FILE",
                   help="a values file, as given to helm install -f (repeatable, in the same "
                        "order; not the overlay this command writes)")
    p.add_argument("--chart", default=DEFAULT_CHART, metavar="DIR",
                   help="the chart's folder, whose values.yaml Helm merges under the files "
                        f"(default: {DEFAULT_CHART})")
    p.add_argument("--out", "-o", metavar="FILE",
                   help="write the overlay into FILE instead of printing it")


def _command(args: argparse.Namespace) -> str:
    words = ["vigil", "rules", "helm"]
    if args.chart != DEFAULT_CHART:
        words += ["--chart", args.chart]
    for path in args.values:
        words += ["--values", path]
    if args.out is not None:
        words += ["--out", args.out]
    return shlex.join(words)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Write (or print) the overlay; returns the exit code."""
    from alerts.rules.helm_values import (
        generate_overlay,
        load_values_file,
        merge_values,
    )

    chart_values = Path(args.chart) / "values.yaml"
    if not chart_values.is_file():
        raise ConfigError("not a chart folder (no values.yaml): give --chart DIR, the "
                          "folder of the chart deploy/helm/vigil", file=args.chart)
    defaults = load_values_file(chart_values)
    layers = [load_values_file(path) for path in args.values]
    values = merge_values(defaults, layers)
    # Errors name the last file: where a user's config usually is.
    overlay = generate_overlay(values, file=args.values[-1])
    for note in overlay.notes:
        err.write(f"vigil rules helm: {note}\n")
    text = overlay.text(command=_command(args))
    if args.out is None:
        out.write(text)
        return 0
    path = Path(args.out)
    if path.parent != Path():
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    out.write(f"wrote {path}\n")
    return 0
