"""``vigil cost report``: the chargeback of a month or a window, by tenant, tier, model or pool,
as a table, CSV or JSON (``slo.cost.report``)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from typing import Any, TextIO

from slo.cost.ledger import GROUPINGS
from slo.cost.report import cost_report
from slo.sources.open import open_source, request_log
from vigil.clock import Clock, system_clock
from vigil.config import load_config
from vigil.config.cost import parse_since
from vigil.errors import UsageError
from vigil.storage.cost_statements import Statements
from vigil_shell.options import add_at_option, add_config_option, add_prometheus_url_option

__all__ = ["add_arguments", "format_csv", "format_table", "run"]

_NULL = "–"
#: ``--from 1762732800`` (Unix seconds) rather than an ISO date.
_SECONDS = re.compile(r"\d+(\.\d*)?")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``vigil cost report``."""
    add_config_option(parser)
    parser.add_argument("--by", default="tenant", metavar="GROUPS",
                        help=f"group by these, comma-separated, of {', '.join(GROUPINGS)} "
                             "(default: tenant)")
    parser.add_argument("--month", metavar="YYYY-MM",
                        help="a calendar month in [cost] timezone (up to now while it runs)")
    parser.add_argument("--from", dest="start", metavar="TIME",
                        help="the window's start: Unix seconds or an ISO date or date and time "
                             "(a date is midnight in [cost] timezone)")
    parser.add_argument("--to", dest="end", metavar="TIME", help="the window's end (default: now)")
    parser.add_argument("--pool", action="append", metavar="POOL",
                        help="only this pool (repeatable; default: every pool)")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table")
    add_at_option(parser, help="what counts as now (default: the clock)")
    add_prometheus_url_option(parser, help="read the replicas' series from this "
                                           "Prometheus-compatible API instead of the store "
                                           "(default: [engine] prometheus_url)")


def _time(text: str, tz: str, flag: str) -> float:
    """Unix seconds of ``text``: a number of seconds, else an ISO date or date and time."""
    try:
        return parse_since(text, tz) if not _SECONDS.fullmatch(text) else float(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def run(args: argparse.Namespace, *, clock: Clock = system_clock,
        out: TextIO | None = None) -> int:
    """Report and print; returns the exit code (errors are raised as ``VigilError``)."""
    stream = out if out is not None else sys.stdout
    config = load_config(args.config)
    by = [b.strip() for b in args.by.split(",") if b.strip()]
    unknown = [b for b in by if b not in GROUPINGS]
    if unknown or not by:
        raise UsageError(f"--by: {', '.join(unknown) or 'nothing'} is not one of "
                         f"{', '.join(GROUPINGS)}")
    at = args.at if args.at is not None else clock()
    tz = config.cost.timezone
    if args.month and (args.start or args.end):
        raise UsageError("--month or --from/--to, not both")
    if not args.month and not args.start:
        raise UsageError("give --month YYYY-MM or --from TIME [--to TIME]")
    for name in args.pool or ():
        if name not in {p.name for p in config.pools}:
            raise UsageError(f"--pool: no pool {name!r} (pools: "
                             f"{', '.join(p.name for p in config.pools)})")
    start = _time(args.start, tz, "--from") if args.start else None
    end = _time(args.end, tz, "--to") if args.end else at
    with open_source(config, args.config, prometheus_url=args.prometheus_url or "") as source:
        report = cost_report(source, config, request_log(config), by=by, start_s=start,
                             end_s=end, month=args.month, at_s=at, pools=args.pool,
                             statements=Statements(config.cost_statements_path()))
    if args.format == "json":
        stream.write(json.dumps(report, indent=2, allow_nan=False) + "\n")
    elif args.format == "csv":
        stream.write(format_csv(report))
    else:
        stream.write(format_table(report) + "\n")
    return 0


#: The report's columns: (key, heading, format).
_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("cost", "cost", "{:.2f}"),
    ("gpu_hours", "GPU-h", "{:.2f}"),
    ("requests", "requests", "{:d}"),
    ("output_tokens", "out tokens", "{:d}"),
    ("per_1000_requests", "per 1k req", "{:.4f}"),
    ("per_million_output_tokens", "per 1M out", "{:.2f}"),
    ("slo_met_share", "SLO met", "{:.1%}"),
    ("per_slo_met_request", "per good req", "{:.5f}"),
)


def _fmt(value: Any, spec: str) -> str:
    return _NULL if value is None else spec.format(value)


def format_table(report: dict[str, Any]) -> str:
    """The report as a readable table: a row per group, then each pool's reconciliation."""
    cur = report["currency"]
    span = f"{report['month']} ({report['timezone']})" if report["month"] else \
        f"{report['from']} – {report['to']}"
    lines = [f"Cost {span}, in {cur}; idle: {report['idle_policy']}"]
    if report["frozen_at"]:
        lines.append(f"Frozen statement of {report['frozen_at']}")
    if not report["rows"]:
        lines.append("no data in the window: no replica billed and no request recorded")
        return "\n".join(lines + [f"warning: {w}" for w in report["warnings"]])
    groups = report["by"]
    head = [*groups, *(f"{h} ({cur})" if k == "cost" else h for k, h, _ in _COLUMNS)]
    body = [[str(r[g]) or _NULL for g in groups] + [_fmt(r[k], f) for k, _, f in _COLUMNS]
            for r in report["rows"]]
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    lines.append("  ".join(h.ljust(w) if i < len(groups) else h.rjust(w)
                           for i, (h, w) in enumerate(zip(head, widths, strict=True))))
    for row in body:
        lines.append("  ".join(c.ljust(w) if i < len(groups) else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    lines.append(f"total {report['total']:.2f} {cur}")
    lines.append("Reconciliation:")
    lines += [f"  {p['text']}" for p in report["pools"]]
    for r in report["restated"]:
        key = ", ".join(f"{g}={r[g]}" for g in groups)
        lines.append(f"restated {key}: {r['frozen_cost']:.2f} -> {r['cost_now']:.2f} {cur} "
                     f"({r['difference']:+.2f}), requests {r['frozen_requests']} -> "
                     f"{r['requests_now']}")
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)


def format_csv(report: dict[str, Any]) -> str:
    """The report's rows as CSV, the currency in the cost columns' names."""
    cur = report["currency"]
    buf = io.StringIO()
    keys = [*report["by"], *(k for k, _, _ in _COLUMNS), "busy_cost", "idle_cost",
            "cancelled", "timed_out", "cache_hits", "saved", "prompt_tokens", "cached_tokens"]
    money = {"cost", "per_1000_requests", "per_million_output_tokens", "per_slo_met_request",
             "busy_cost", "idle_cost", "saved"}
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([f"{k}_{cur.lower()}" if k in money else k for k in keys])
    for r in report["rows"]:
        w.writerow(["" if r[k] is None else r[k] for k in keys])
    return buf.getvalue()
