"""``vigil slo status``: the SLO engine's answer at one instant, as JSON or a readable table.

Wire it as a sub-subcommand::

    slo = sub.add_parser("slo", ...).add_subparsers(dest="slo_command", required=True)
    p = slo.add_parser("status", help="...")
    vigil_shell.slo_status_cli.add_arguments(p)
    p.set_defaults(func=vigil_shell.slo_status_cli.run)

Flags override ``[engine]``: ``--prometheus-url URL`` (or ``engine.prometheus_url``) reads from
a Prometheus-compatible API, otherwise the embedded store is opened read-only. The evaluation
time is ``--at`` or, at this edge only, the injected clock's now.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from slo.objectives.quantiles import QUANTILE_SOURCES, quantile_range, seconds_bucket_text
from slo.sources.open import open_source, request_log
from vigil.clock import Clock, system_clock
from vigil.config import load_config
from vigil_shell.options import (
    add_at_option,
    add_config_option,
    add_json_option,
    add_prometheus_url_option,
    positive_duration_arg,
)

__all__ = ["TABLE_WIDTH", "add_arguments", "format_table", "run"]

#: The readable output fits a terminal this wide (columns).
TABLE_WIDTH = 100
_NULL = "–"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``vigil slo status``."""
    add_config_option(parser)
    add_at_option(parser, help="evaluation time (default: now)")
    parser.add_argument("--window", type=positive_duration_arg, metavar="DURATION",
                        help="window of the quantiles and current SLIs (default: [engine] window)")
    add_json_option(parser)
    add_prometheus_url_option(parser, help="read from this Prometheus-compatible API instead "
                                           "of the store (default: [engine] prometheus_url)")
    parser.add_argument("--promql-semantics", choices=("auto", "2", "3"),
                        help="PromQL rules: 3 = Prometheus 3.x, 2 = 2.x, auto = the server's "
                             "(3 for the store) (default: [engine] promql_semantics)")
    parser.add_argument("--source", choices=QUANTILE_SOURCES, default="auto",
                        dest="quantile_source",
                        help="where quantiles and tokens per request come from: auto = the "
                             "gateway's records where they cover a model, else vLLM's "
                             "histograms; histogram = always the histograms, as Prometheus "
                             "computes them (default: auto)")
    parser.add_argument("--recorded-rules", choices=("auto", "off"),
                        help="with a Prometheus-compatible store: auto = each SLO's ratios "
                             "from the series the store's evaluation of Vigil's rules "
                             "recorded, when current; off = always from raw series "
                             "(default: [engine] recorded_rules)")


def run(args: argparse.Namespace, *, clock: Clock = system_clock,
        out: TextIO | None = None) -> int:
    """Evaluate and print; returns the exit code (errors are raised as ``VigilError``)."""
    from slo.status import evaluate

    stream = out if out is not None else sys.stdout
    config = load_config(args.config)
    if getattr(args, "recorded_rules", None):
        engine = config.engine.model_copy(update={"recorded_rules": args.recorded_rules})
        config = config.model_copy(update={"engine": engine})
    at = args.at if args.at is not None else clock()
    with open_source(config, args.config, prometheus_url=args.prometheus_url or "",
                     semantics=args.promql_semantics) as source:
        result = evaluate(config, source, at, window_s=args.window,
                          request_log=request_log(config),
                          quantile_source=getattr(args, "quantile_source", "auto"))
    if args.json:
        stream.write(json.dumps(result, indent=2, allow_nan=False) + "\n")
    else:
        stream.write(format_table(result) + "\n")
    return 0


# --- the readable table ----------------------------------------------------------------------
def _fit(text: str, width: int = TABLE_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _cell(text: str, width: int) -> str:
    return _fit(text, width).ljust(width)


def _fmt(value: Any, spec: Callable[[float], str]) -> str:
    return _NULL if value is None else spec(value)


def _pct(digits: int) -> Callable[[float], str]:
    return lambda v: f"{v * 100:.{digits}f}%"


def _seconds(v: float) -> str:
    return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"


def _seconds_range(lo: float, hi: float) -> str:
    """A bucket of seconds, compact: ``≤300ms``, ``100–250ms``, ``1–2.5s``."""
    return seconds_bucket_text(lo, hi, sep="")


def _tokens_range(lo: float, hi: float) -> str:
    """A bucket of tokens: ``≤100``, ``100–200``, ``>2000``."""
    if math.isinf(hi):
        return f">{lo:g}"
    if lo <= 0:
        return f"≤{hi:g}"
    return f"{lo:g}–{hi:g}"


def _quantile(block: dict[str, Any], key: str, spec: Callable[[float], str],
              ranged: Callable[[float, float], str]) -> str:
    """A quantile as a number, or as its bucket when the bucket is too wide to trust the
    interpolated number (``slo.objectives.quantiles.quantile_range``)."""
    found = quantile_range(block, key)
    if found is not None:
        return ranged(*found)
    return _fmt(block.get(key), spec)


def _origin(blocks: list[dict[str, Any]]) -> str:
    """``gateway`` when every figure of the line is from the records, ``histogram`` when none
    is, ``mixed`` otherwise."""
    sources: set[str] = {b["source"] for b in blocks if b and b.get("source") is not None}
    if not sources:
        return _NULL
    return sources.pop() if len(sources) == 1 else "mixed"


def _pool_lines(name: str, pool: dict[str, Any]) -> list[str]:
    kv = pool.get("kv_cache_usage") or {}
    cost = pool.get("cost") or {}
    scaling = pool.get("scaling")
    if scaling:
        reasons = scaling.get("reasons") or []
        first = reasons[0] if reasons else ""
        if isinstance(first, dict):  # tolerate structured reasons
            first = first.get("message") or first.get("reason") or json.dumps(first)
        action = (f"{scaling.get('action', _NULL)} {scaling.get('current', _NULL)}→"
                  f"{scaling.get('desired', _NULL)}" + (f": {first}" if first else ""))
    else:
        action = f"scaling {_NULL}"
    lines = [
        _fit(f"pool {name}"),
        _fit(
            f"  KV avg {_fmt(kv.get('avg'), _pct(1))} max {_fmt(kv.get('max'), _pct(1))}"
            f"  queue {_fmt(pool.get('queue_length'), lambda v: f'{v:g}')}"
            f"  cost/1k req {_fmt(cost.get('per_1000_requests'), lambda v: f'${v:.3f}')}"
            f"  {action}"
        ),
    ]
    for model, block in (pool.get("models") or {}).items():
        q = block.get("quantiles") or {}
        ttft = q.get("ttft_seconds") or {}
        e2e = q.get("e2e_seconds") or {}
        gen = (block.get("tokens_per_request") or {}).get("generated") or {}
        lines.append(_fit(f"  {model} ({_origin([ttft, e2e, gen])})"))
        lines.append(_fit(
            f"    TTFT p95 {_quantile(ttft, 'p95', _seconds, _seconds_range)}"
            f" p99 {_quantile(ttft, 'p99', _seconds, _seconds_range)}"
            f"  e2e p50 {_quantile(e2e, 'p50', _seconds, _seconds_range)}"
            f" p95 {_quantile(e2e, 'p95', _seconds, _seconds_range)}"
            f"  gen tok/req {_fmt(gen.get('mean'), lambda v: f'{v:.0f}')}"
            f" p95 {_quantile(gen, 'p95', lambda v: f'{v:.0f}', _tokens_range)}"
        ))
    return lines


_SLO_COLUMNS = (("SLO", 24), ("INDICATOR", 12), ("OBJECTIVE", 9), ("SLI", 8),
                ("BUDGET", 8), ("BURN 1h", 8), ("BURN 5m", 8))


def _slo_line(cells: list[str], alerts: str) -> str:
    parts = [_cell(c, w) for c, (_, w) in zip(cells, _SLO_COLUMNS, strict=True)]
    return _fit(" ".join(parts) + " " + alerts).rstrip()


def format_table(result: dict[str, Any]) -> str:
    """The readable form of ``slo.status.evaluate``'s result: one block per pool, then one
    line per SLO; every line at most ``TABLE_WIDTH`` columns, ``–`` for null."""
    at = datetime.fromtimestamp(result["at"], UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    lines = [_fit(f"vigil slo status at {at}  ({result.get('source')}, PromQL "
                  f"{result.get('promql_semantics')}, window {result.get('window')})")]
    # The warnings first (the server's, a short retention, SLOs not read from the store's
    # recorded series): every figure below may come from part of the data.
    lines += [f"WARNING: {w}" for w in result.get("warnings") or []]
    recorded = result.get("recorded_rules")
    if recorded is not None:
        n_read, n_raw = len(recorded.get("read") or []), len(recorded.get("fallback") or {})
        lines.append(_fit(f"SLO ratios: {n_read} read from the store's recorded series, "
                          f"{n_raw} computed from raw series (recorded_rules = "
                          f"{recorded.get('mode')})"))
    lines.append("")
    for name, pool in (result.get("pools") or {}).items():
        lines += _pool_lines(name, pool)
        lines.append("")
    lines.append(_slo_line([h for h, _ in _SLO_COLUMNS], "ALERTS"))
    for slo in result.get("slos") or []:
        windows = slo.get("windows") or {}
        burn = {k: (windows.get(k) or {}).get("burn_rate") for k in ("1h", "5m")}
        cells = [
            slo.get("name", ""),
            slo.get("indicator", ""),
            _fmt(slo.get("objective"), _pct(2)),
            _fmt(slo.get("sli"), _pct(2)),
            _fmt(slo.get("budget_remaining"), _pct(1)),
            _fmt(burn["1h"], lambda v: f"{v:.2f}"),
            _fmt(burn["5m"], lambda v: f"{v:.2f}"),
        ]
        alerts = ",".join(slo.get("alerts") or []) or _NULL
        lines.append(_slo_line(cells, alerts))
    # Why an SLI is null (no requests, a family the replicas lack): the JSON's "reason".
    for slo in result.get("slos") or []:
        if slo.get("sli") is None and slo.get("reason"):
            lines += textwrap.wrap(f"{slo.get('name', '')}: {slo['reason']}", TABLE_WIDTH,
                                   initial_indent="  ", subsequent_indent="    ",
                                   break_on_hyphens=False)
    return "\n".join(lines).rstrip("\n")
