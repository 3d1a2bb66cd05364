"""``vigil slo backtest``: the generated burn-rate alerts replayed over a history.

``--since 30d`` (default) ends now, at this edge only read from the injected clock; ``--from``
and ``--to`` take Unix seconds or an ISO 8601 time (``2026-11-01`` or
``2026-11-01T12:00:00Z``; a time without a zone is UTC). The history is read from the
embedded store, or from a Prometheus-compatible API (``--prometheus-url`` or ``[engine]
prometheus_url``) with range queries.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from slo.sources.open import open_source, request_log
from vigil.cli_options import (
    add_config_option,
    add_json_option,
    add_prometheus_url_option,
    positive_duration_arg,
)
from vigil.clock import Clock, system_clock
from vigil.config import load_config
from vigil.durations import format_duration
from vigil.errors import UsageError

__all__ = ["add_arguments", "format_table", "parse_time", "run"]

_NULL = "–"


def parse_time(text: str) -> float:
    """Unix seconds from ``text``: a number of seconds, or an ISO 8601 date or time (UTC
    when it names no zone). Raises ``argparse.ArgumentTypeError`` otherwise."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (Unix seconds, or ISO 8601 such as 2026-11-01T12:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _share_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a share of the budget is 0-1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``vigil slo backtest``."""
    from slo.backtest.run import DEFAULT_MISSED_SHARE, DEFAULT_QUIET_SHARE

    add_config_option(parser)
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--since", type=positive_duration_arg, metavar="DURATION",
                      help="the history up to now (default: 30d)")
    when.add_argument("--from", dest="start", type=parse_time, metavar="TIME",
                      help="start of the history (Unix seconds or ISO 8601; with --to)")
    parser.add_argument("--to", dest="end", type=parse_time, metavar="TIME",
                        help="end of the history (default: now)")
    parser.add_argument("--interval", type=positive_duration_arg, metavar="DURATION",
                        help="evaluation interval (default: [rules] interval, the alert "
                             "rules' own)")
    parser.add_argument("--missed-share", type=_share_arg, default=DEFAULT_MISSED_SHARE,
                        metavar="RATIO",
                        help="report a fast burn no alert caught when it consumed at least "
                             f"this share of the budget (default {DEFAULT_MISSED_SHARE:g})")
    parser.add_argument("--quiet-share", type=_share_arg, default=DEFAULT_QUIET_SHARE,
                        metavar="RATIO",
                        help="flag an alert during which less than this share of the budget "
                             f"burned (default {DEFAULT_QUIET_SHARE:g})")
    add_json_option(parser)
    add_prometheus_url_option(parser, help="read the history from this Prometheus-compatible "
                                           "API (default: [engine] prometheus_url)")
    parser.add_argument("--promql-semantics", choices=("auto", "2", "3"),
                        help="PromQL rules: 3 = Prometheus 3.x, 2 = 2.x, auto = the server's "
                             "(default: [engine] promql_semantics)")


def _window(args: argparse.Namespace, now: float) -> tuple[float, float]:
    end = args.end if args.end is not None else now
    if args.start is not None:
        start = args.start
    else:
        start = end - (args.since if args.since is not None else 30 * 86400.0)
    if not start < end:
        raise UsageError(f"the history must start before it ends (--from {start:g} is not "
                         f"before --to {end:g})")
    return start, end


def run(args: argparse.Namespace, *, clock: Clock = system_clock,
        out: TextIO | None = None) -> int:
    """Replay and print; returns the exit code (errors are raised as ``VigilError``)."""
    from slo.backtest.run import backtest

    stream = out if out is not None else sys.stdout
    config = load_config(args.config)
    start, end = _window(args, clock())
    with open_source(config, args.config, prometheus_url=args.prometheus_url or "",
                     semantics=args.promql_semantics) as source:
        result = backtest(config, source, start, end, interval_s=args.interval,
                          missed_share=args.missed_share, quiet_share=args.quiet_share,
                          request_log=request_log(config))
    doc = result.to_dict()
    if args.json:
        stream.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    else:
        stream.write(format_table(doc) + "\n")
    return 0


# --- the readable table ----------------------------------------------------------------------
def _time(t: float | None) -> str:
    if t is None:
        return "firing"
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M")


def _pct(v: float | None) -> str:
    return _NULL if v is None else f"{v * 100:.1f}%"


def _delay(v: float | None) -> str:
    return _NULL if v is None else format_duration(v) if v >= 1 else "0s"


def format_table(doc: dict[str, Any]) -> str:
    """The backtest as a terminal report: per SLO its alerts, missed burns and budget."""
    lines = [f"Backtest {_time(doc['from'])} – {_time(doc['to'])} UTC, "
             f"{doc['evaluations']} evaluations every {format_duration(doc['interval_seconds'])}"
             f" ({doc['source']})", ""]
    for name, s in doc["slos"].items():
        threshold = (f" ≤ {s['threshold_seconds']:g}s" if s["threshold_seconds"] is not None
                     else "")
        rates = ", ".join(f"{n:.1f} {sev}s" for sev, n in s["per_30_days"].items()
                          if n is not None)
        lines.append(f"{name}: {s['indicator']}{threshold} for {s['objective'] * 100:g}% over "
                     f"{s['period']} — budget left {_pct(s['budget_remaining'])}; "
                     f"per 30 days: {rates or _NULL}; median detection "
                     f"{_delay(s['median_detection_delay_seconds'])}")
        for a in s["alerts"]:
            flag = "  (quiet)" if a["quiet"] else ""
            peak = _NULL if a["peak_burn_rate"] is None else f"{a['peak_burn_rate']:.1f}x"
            lines.append(f"  {a['severity']:<7} {_time(a['start'])} → {_time(a['end'])}  "
                         f"peak {peak:>7}  consumed {_pct(a['budget_consumed']):>6}  "
                         f"detected after {_delay(a['detection_delay_seconds'])}{flag}")
        for m in s["missed_burns"]:
            lines.append(f"  MISSED  {_time(m['start'])} → {_time(m['end'])}  "
                         f"consumed {_pct(m['budget_consumed'])} with no alert")
        if not s["alerts"] and not s["missed_burns"]:
            lines.append("  no alert, no missed burn")
        lines.append("")
    return "\n".join(lines).rstrip()
