"""``vigil slo backtest``: the generated burn-rate alerts replayed over a history.

``--since 30d`` (default) ends now, at this edge only read from the injected clock; ``--from``
and ``--to`` take Unix seconds or an ISO 8601 time (``2026-11-01`` or
``2026-11-01T12:00:00Z``; a time without a zone is UTC). The history is read from the
embedded store, or from a Prometheus-compatible API (``--prometheus-url`` or ``[engine]
prometheus_url``) with range queries.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from slo.scaling.policy import SIGNAL_LABELS
from slo.sources.open import open_source, request_log
from slo.sources.protocol import RangeSource
from vigil.clock import Clock, system_clock
from vigil.config import load_alert_table, load_config
from vigil.durations import format_duration
from vigil.errors import UsageError
from vigil_shell.options import (
    add_config_option,
    add_json_option,
    add_prometheus_url_option,
    positive_duration_arg,
)

__all__ = ["add_arguments", "format_table", "parse_time", "run"]

_NULL = "–"


def parse_time(text: str) -> float:
    """Unix seconds from ``text``: a number of seconds, or an ISO 8601 date or time (UTC
    when it names no zone). Raises ``argparse.ArgumentTypeError`` otherwise."""
    with contextlib.suppress(ValueError):
        return float(text)
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
    parser.add_argument("--objective", type=_share_arg, action="append", default=[],
                        metavar="RATIO",
                        help="what-if: the same backtest at this objective too (repeatable)")
    parser.add_argument("--threshold", type=positive_duration_arg, action="append",
                        default=[], metavar="SECONDS",
                        help="what-if: a latency SLO at this threshold too (repeatable); also "
                             "the thresholds whose attainment per day is shown")
    parser.add_argument("--alert-table", action="append", default=[], metavar="FILE",
                        help="what-if: the same backtest judged by this alert table too (a TOML "
                             "file of [[engine.burn_rate_alerts]] or [[alerts]] rows; "
                             "repeatable)")
    parser.add_argument("--no-attainment", action="store_true",
                        help="skip the attainment per day and week of latency thresholds")
    parser.add_argument("--no-scaling", action="store_true",
                        help="skip the scaling-advice scorecard")
    parser.add_argument("--scaling-interval", type=positive_duration_arg, metavar="DURATION",
                        help="how often the scaling policy is replayed (default: [collector] "
                             "scrape_interval, as vigil serve decides; a multiple of it)")
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
    from slo.backtest.attainment import attainment
    from slo.backtest.run import backtest
    from slo.backtest.scorecard import scorecards
    from slo.backtest.whatif import AlertTable, costing_for, what_if

    stream = out if out is not None else sys.stdout
    config = load_config(args.config)
    start, end = _window(args, clock())
    # Read before the history is: a wrong file fails at once.
    tables = [AlertTable(Path(f).stem, tuple(load_alert_table(f))) for f in args.alert_table]
    log = request_log(config)
    with open_source(config, args.config, prometheus_url=args.prometheus_url or "",
                     semantics=args.promql_semantics) as source:
        if not isinstance(source, RangeSource):
            raise UsageError(f"{source!r} cannot answer range queries: the backtest needs "
                             "the embedded store or a Prometheus API")
        result = backtest(config, source, start, end, interval_s=args.interval,
                          missed_share=args.missed_share, quiet_share=args.quiet_share,
                          request_log=log)
        doc = result.to_dict()
        if not args.no_attainment:
            for s in result.slos:
                rows = attainment(s.spec, source, start, end,
                                  thresholds=args.threshold or None, request_log=log)
                if rows:
                    doc["slos"][s.spec.name]["attainment"] = rows
        if args.objective or args.threshold or tables:
            costings = {pool.name: costing_for(config, pool, source, start, end)
                        for pool in config.pools}
            table = what_if(config, source, result.grid, objectives=args.objective,
                            thresholds=args.threshold, tables=tables, costings=costings,
                            missed_share=args.missed_share, quiet_share=args.quiet_share,
                            request_log=log, slos=[s.spec for s in result.slos])
            span = result.end - result.start + result.interval_s
            doc["what_if"] = {name: [r.to_dict(span) for r in rows]
                              for name, rows in table.items()}
        if not args.no_scaling:
            try:
                cards = scorecards(result, source, config, every_s=args.scaling_interval)
            except ValueError as exc:  # a decision interval off the scrape grid
                raise UsageError(f"--scaling-interval: {exc}") from None
            doc["scaling"] = {name: card.to_dict() for name, card in cards.items()}
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


def _pct(v: float | None, digits: int = 1) -> str:
    return _NULL if v is None else f"{v * 100:.{digits}f}%"


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
        if s.get("read") == "recorded":
            lines.append("  ratios: the store's recorded series (what its alerts saw)")
        elif s.get("read_reason"):
            lines.append(f"  ratios: raw series, not the store's recorded ones: "
                         f"{s['read_reason']}")
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
        for row in s.get("attainment", []):
            met = [f"{row[k + '_met']} of {row[k]} {k}" for k in ("days", "weeks") if row[k]]
            lines.append(f"  ≤ {_ms(row['threshold_seconds'])} for "
                         f"{_pct(row['good_ratio'], 2)} of requests"
                         + (f"; met on {', '.join(met)}" if met else ""))
        lines.append("")
    for name, rows in doc.get("what_if", {}).items():
        lines.append(f"What if — {name}:")
        named = [r["alert_table"] for r in rows]
        width = max(len(n) for n in named) if len(set(named)) > 1 else 0
        head = f"  {'alerts':<{width}} " if width else "  "
        lines.append(f"{head}{'objective':>9} {'threshold':>9} {'pages/30d':>9} "
                     f"{'tickets/30d':>11} {'missed':>6} {'delay':>7} {'budget':>7}  cost")
        for r in rows:
            per = r["per_30_days"]
            cost = r["cost"]
            priced = (f"${cost['gpu_cost_per_month_usd']:,.0f}/month, "
                      f"{cost['peak_replicas']} × {cost['configuration']}" if cost
                      else r["cost_note"] or _NULL)
            threshold = _NULL if r["threshold_seconds"] is None else _ms(r["threshold_seconds"])
            lead = f"  {r['alert_table']:<{width}} " if width else "  "
            lines.append(f"{lead}{r['objective'] * 100:>8g}% {threshold:>9} "
                         f"{_rate(per.get('page')):>9} {_rate(per.get('ticket')):>11} "
                         f"{r['missed_burns']:>6} "
                         f"{_delay(r['median_detection_delay_seconds']):>7} "
                         f"{_pct(r['budget_remaining']):>7}  {priced}")
        lines.append("")
    for name, card in doc.get("scaling", {}).items():
        lines += _scaling_lines(name, card)
    return "\n".join(lines).rstrip()


#: Scale-outs and scale-ins listed one per line; the rest are counted.
_LISTED = 20


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _scaling_lines(pool: str, card: dict[str, Any]) -> list[str]:
    """One pool's scaling-advice scorecard as report lines."""
    how = {"replay": "replayed", "kept": "vigil serve's kept decisions",
           "kept+replay": f"{card['kept_evaluations']} kept, the rest replayed"}[
        card["decisions"]]
    lines = [f"Scaling advice — pool {pool} ({how}, every "
             f"{format_duration(card['interval_seconds'])}; {card['evaluations']} evaluations;"
             f" judged by {', '.join(card['slos']) or _NULL}):"]
    outs = card["scale_outs"]
    outcomes: dict[str, int] = {}
    for o in outs:
        outcomes[o["outcome"]] = outcomes.get(o["outcome"], 0) + 1
    lines.append(f"  {_count(len(outs), 'scale-out')}" + (
        f": {', '.join(f'{n} {k}' for k, n in sorted(outcomes.items()))}" if outs else ""))
    for o in outs[:_LISTED]:
        after = o["burn_stopped_after_seconds"] or o["burn_began_after_seconds"]
        when = f" after {_delay(after)}" if after is not None else ""
        trig = ", ".join(SIGNAL_LABELS.get(t, t) for t in o["triggers"]) or _NULL
        lines.append(f"    {_time(o['at'])}  {o['current']} → {o['desired']}  on {trig}: "
                     f"{o['outcome']}{when}; +{o['replicas_added']} up by "
                     f"{_time(o['deadline'])}")
    if len(outs) > _LISTED:
        lines.append(f"    … {len(outs) - _LISTED} more")
    ins = card["scale_ins"]
    judged = [s for s in ins if s["too_late"] is not None]
    late = [s for s in judged if s["too_late"]]
    wasted = sum(s["gpu_hours_above_lower_bound"] or 0.0 for s in late)
    lines.append(f"  {_count(len(ins), 'scale-in')}" + (
        f": {len(late)} of {len(judged)} judged too late, {wasted:.1f} GPU-hours above the "
        "lower bound while waiting" if judged else ""))
    for s in late[:_LISTED]:
        lines.append(f"    {_time(s['at'])}  {s['current']} → {s['desired']}: the lower "
                     f"bound allowed it from {_time(s['lower_bound_since'])}, "
                     f"{_delay(s['late_by_seconds'])} beyond the hold; "
                     f"{s['gpu_hours_above_lower_bound']:.2f} GPU-hours above the bound")
    lines.append(f"  {_count(len(card['burns']), 'burn')}; triggers:")
    lines.append(f"    {'trigger':<15} {'threshold':>9} {'firings':>7} {'early':>5} "
                 f"{'late':>4} {'noise':>5} {'warned':>6} {'first':>5}  median lead")
    for sig, t in card["triggers"].items():
        threshold = _NULL if t["threshold"] is None else f"{t['threshold']:g}"
        warned = f"{t['burns_warned']}/{t['burns_warned'] + t['burns_missed']}"
        lines.append(f"    {SIGNAL_LABELS.get(sig, sig):<15} {threshold:>9} "
                     f"{t['firings']:>7} {t['early_warnings']:>5} {t['late']:>4} "
                     f"{t['noise']:>5} {warned:>6} {t['first']:>5}  "
                     f"{_delay(t['median_lead_seconds'])}")
    lines += [f"  note: {n}" for n in card["notes"]]
    lines.append("")
    return lines


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def _rate(v: float | None) -> str:
    return _NULL if v is None else f"{v:.1f}"
