"""``vigil plan``: the cheapest configuration that meets the SLOs for the pool's traffic.

The traffic is ``--rate R`` (requests/s all day) or ``--forecast`` (the default): the next day
forecast from the last ``--days`` days of the store's history (``slo.planning.forecast``). The
candidates are the saved capacity profiles of the pool's model (``[capacity] profiles_path``),
the pool's observed capacity when the history shows one (whenever there is a store or a
Prometheus to read), and the
simulator's estimates for its known calibrations of that model on every GPU with a price
(``--no-estimates`` leaves them out). Of several profiles of one configuration the best basis
is kept (measured > observed > estimated), then the one saved for the pool, then the newest.

Every figure carries its basis. The table lists the candidates that meet every SLO cheapest
first, then the others, beside today's configuration and what the cheapest saves per month.
``--lever batch|cache|output-tokens`` (repeatable) pulls a lever measured from the gateway's
records (``slo.planning.plan.measure_levers``).

Exit codes: 0 with a candidate meeting every SLO; 1 when none does (the output says why);
2 on a configuration error.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from typing import Any, TextIO

from slo.planning.candidates import gather_candidates
from slo.planning.forecast import (
    SECONDS_PER_DAY,
    TrafficForecast,
    constant_traffic,
    forecast_from_history,
)
from slo.planning.plan import (
    LEVER_NAMES,
    CandidatePlan,
    Levers,
    PlanResult,
    current_identity,
    measure_levers,
    plan,
    required_slos,
)
from slo.sources.protocol import Source
from vigil.config import Config, PoolConfig, load_config
from vigil.errors import ConfigError
from vigil_shell.options import add_at_option, add_config_option, add_json_option

__all__ = ["add_arguments", "run"]

_NULL = "–"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``vigil plan``."""
    add_config_option(parser)
    parser.add_argument("--pool", help="the pool to plan (default: the only pool)")
    traffic = parser.add_mutually_exclusive_group()
    traffic.add_argument("--rate", type=_rate, metavar="RPS",
                         help="plan for this many requests/s all day")
    traffic.add_argument("--forecast", action="store_true",
                         help="plan for the next day forecast from the store's history "
                              "(the default)")
    parser.add_argument("--days", type=_days, default=7, metavar="N",
                        help="days of history the forecast and the levers read (default 7)")
    add_at_option(parser, help="the end of the history read (default: now)")
    parser.add_argument("--lever", action="append", choices=LEVER_NAMES, default=[],
                        help="pull a lever measured from the gateway's records (repeatable)")
    parser.add_argument("--within-max-replicas", action="store_true",
                        help="size within the pool's max_replicas (default: unbounded, with a "
                             "note when a plan needs more)")
    parser.add_argument("--no-estimates", action="store_true",
                        help="leave out the simulator's estimated candidates")
    add_json_option(parser)


def _rate(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"a rate must be >= 0 requests/s, got {text!r}")
    return v


def _days(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--days must be a whole number >= 1, got {text!r}")
    return int(text)


def _pool(config: Config, name: str | None, file: str) -> PoolConfig:
    if name is None:
        if len(config.pools) != 1:
            names = ", ".join(p.name for p in config.pools) or "none defined"
            raise ConfigError(f"give --pool (pools: {names})", file=file, key="pools")
        return config.pools[0]
    try:
        return config.pool(name)
    except KeyError:
        names = ", ".join(p.name for p in config.pools) or "none defined"
        raise ConfigError(f"--pool {name!r} is not a pool of this config (pools: {names})",
                          file=file) from None


@contextmanager
def _maybe_source(config: Config, file: str, needed: bool) -> Iterator[Source | None]:
    """The configured source; ``None`` when it is not needed and the store does not exist."""
    from slo.sources.open import open_source

    if not needed and not config.engine.prometheus_url and not config.store_path().exists():
        yield None
        return
    with open_source(config, file) as source:
        yield source


def run(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Plan and print; returns the exit code (errors are raised as ``VigilError``)."""
    stream = out if out is not None else sys.stdout
    config = load_config(args.config)
    pool = _pool(config, args.pool, args.config)
    at = args.at if args.at is not None else time.time()
    span = args.days * SECONDS_PER_DAY
    forecast = args.rate is None
    with ExitStack() as stack:
        source = stack.enter_context(_maybe_source(config, args.config, needed=forecast))
        if source is None and forecast:  # pragma: no cover - needed=True always opens one
            raise ConfigError("no source to forecast from", file=args.config)
        if forecast and source is not None:
            try:
                traffic = forecast_from_history(source, config, pool, at, args.days)
            except ValueError as exc:
                raise ConfigError(f"cannot forecast the traffic: {exc} (or give --rate)",
                                  file=args.config) from None
        else:
            traffic = constant_traffic(args.rate, step_s=config.capacity.plan_step)
        estimator = None
        if not args.no_estimates:
            from slo.planning import estimate as estimator
        candidates, notes = gather_candidates(
            config, pool, source=source, at_s=at, span_s=span, estimator=estimator)
        levers: Levers | None = None
        if args.lever:
            from slo.sources.open import request_log

            log = request_log(config)
            records = list(log.records(pool.name, at, span)) if log is not None else []
            levers, lever_notes = measure_levers(args.lever, pool=pool, records=records,
                                                 source=source, at_s=at, span_s=span)
            notes.extend(lever_notes)
    result = plan(config, pool, traffic, candidates, levers=levers,
                  respect_max_replicas=args.within_max_replicas)
    notes.extend(result.notes)
    report = to_json(config, pool, traffic, result, notes)
    if args.json:
        stream.write(json.dumps(report, indent=2, allow_nan=False) + "\n")
    else:
        stream.write(format_report(report) + "\n")
    return 0 if result.best is not None else 1


# --- the report ------------------------------------------------------------------------------
def _plan_json(c: CandidatePlan) -> dict[str, Any]:
    return {
        "configuration": c.profile.identity.label(),
        "identity": asdict(c.profile.identity),
        "basis": c.basis,
        "profile_basis": c.profile.basis,
        "profile_source": c.profile.source,
        "rps_per_replica": c.rps_per_replica,
        "peak_replicas": c.peak_replicas,
        "replicas_curve": [[t, n] for t, n in c.replicas_curve],
        "gpu_hours_per_day": c.gpu_hours_per_day,
        "usd_per_gpu_hour": c.usd_per_gpu_hour,
        "cost_per_day_usd": c.cost_per_day_usd,
        "cost_per_month_usd": c.cost_per_month_usd,
        "cost_per_1000_requests": c.cost_per_1000_requests,
        "headroom": c.headroom,
        "meets_slo": c.meets_slo,
        "notes": list(c.notes),
    }


def _why_none(result: PlanResult, pool: PoolConfig) -> str:
    if not result.candidates:
        return (f"no capacity profile of {pool.model}: measure one with `vigil capacity "
                "--save`, or let the simulator estimate one")
    reasons = sorted({n for c in result.candidates for n in c.notes
                      if "does not count" in n or "cannot serve" in n or "μ = 0" in n})
    return "no candidate meets every SLO" + (f": {'; '.join(reasons)}" if reasons else "")


def to_json(config: Config, pool: PoolConfig, traffic: TrafficForecast, result: PlanResult,
            notes: list[str]) -> dict[str, Any]:
    """The JSON form of a plan (every figure with its basis; USD, GPU-hours, requests/s)."""
    best, today = result.best, result.today
    saving = None
    if best is not None and today is not None:
        saving = today.cost_per_month_usd - best.cost_per_month_usd
    return {
        "pool": pool.name,
        "model": pool.model,
        "today_configuration": current_identity(pool).label(),
        "slos": [asdict(s) for s in required_slos(config, pool)],
        "traffic": {
            "basis": traffic.basis,
            "days": traffic.days,
            "trend_per_day": traffic.trend_per_day,
            "peak_rps": traffic.peak_rps(),
            "requests_per_day": traffic.requests_per_day(),
            "net_of_cache": traffic.net_of_cache,
            "notes": list(traffic.notes),
        },
        "hours_per_month": config.capacity.hours_per_month,
        "plan_step_s": config.capacity.plan_step,
        "candidates": [_plan_json(c) for c in result.candidates],
        "today": None if today is None else _plan_json(today),
        "best": None if best is None else best.profile.identity.label(),
        "saving_per_month_usd": saving,
        "levers": [asdict(e) for e in result.levers],
        "verdict": "" if best is not None else _why_none(result, pool),
        "notes": notes,
    }


_COLUMNS = (("", 2), ("CONFIGURATION", 36), ("BASIS", 9), ("RPS/REPL", 8), ("PEAK", 5),
            ("GPU-H/DAY", 9), ("$/MONTH", 10), ("$/1K REQ", 8), ("HEADROOM", 8), ("SLO", 5))


def _row(cells: list[str]) -> str:
    parts = []
    for text, (_, width) in zip(cells, _COLUMNS, strict=True):
        parts.append((text if len(text) <= width else text[: width - 1] + "…").ljust(width))
    return " ".join(parts).rstrip()


def _money(v: float | None, digits: int = 2) -> str:
    return _NULL if v is None else f"${v:,.{digits}f}"


def format_report(report: dict[str, Any]) -> str:
    """The readable form of ``to_json``'s report: the traffic, the candidates' table (``*``
    marks today's configuration), the saving, levers and notes."""
    t = report["traffic"]
    given = "given rate" if t["days"] == 0 else f"forecast from {t['days']} day(s)"
    lines = [f"vigil plan: pool {report['pool']} ({report['model']}); traffic {given} "
             f"({t['basis']}): peak {t['peak_rps']:.3g} requests/s, "
             f"{t['requests_per_day']:,.0f} requests/day", ""]
    lines.append(_row([h for h, _ in _COLUMNS]))
    today = report["today"]
    for i, c in enumerate(report["candidates"], start=1):
        mark = "*" if today is not None and c["identity"] == today["identity"] \
            and c["profile_basis"] == today["profile_basis"] else ""
        lines.append(_row([
            f"{i}{mark}", c["configuration"], c["basis"], f"{c['rps_per_replica']:.3g}",
            str(c["peak_replicas"]), f"{c['gpu_hours_per_day']:.1f}",
            _money(c["cost_per_month_usd"]), _money(c["cost_per_1000_requests"], 3),
            f"{c['headroom'] * 100:.0f}%", "meets" if c["meets_slo"] else "no",
        ]))
    lines.append("")
    if today is None:
        lines.append(f"today ({report['today_configuration']}): no capacity profile of it, "
                     "so no saving to show")
    else:
        lines.append(f"today (*): {today['configuration']}, {_money(today['cost_per_month_usd'])}"
                     f"/month ({today['basis']})")
    if report["best"] is not None:
        saving = report["saving_per_month_usd"]
        best = report["candidates"][0]
        line = (f"cheapest meeting every SLO: {best['configuration']}, "
                f"{_money(best['cost_per_month_usd'])}/month ({best['basis']})")
        if today is not None and best["identity"] == today["identity"]:
            line += ": today's configuration"
        elif saving is not None:
            line += f", saves {_money(saving)}/month against today"
        lines.append(line)
    else:
        lines.append(report["verdict"])
    lines.append(f"(a month is {report['hours_per_month']:g} hours)")
    for e in report["levers"]:
        where = f" from {e['source']}" if e["source"] else ""
        lines.append(f"lever {e['name']} = {e['value']:.4g}{where}: {e['effect']}")
    for n in list(t["notes"]) + list(report["notes"]):
        lines.append(f"note: {n}")
    for i, c in enumerate(report["candidates"], start=1):
        for n in c["notes"]:
            lines.append(f"note {i}: {n}")
    return "\n".join(lines)
