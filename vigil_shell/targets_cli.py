"""``vigil targets``: every target, static and discovered, with its health, like Prometheus's
targets page.

The discovery sources are read once (each file, URL and DNS name), so the list is what the
collector would scrape now; the health columns come from the store when there is one, and an
up vLLM target whose /metrics lacks a family Vigil reads gets a ``warning:`` line per family
under its row (``warnings`` in ``--json``). Exit code 0, 1 when a discovery source could not
be read or skipped targets (each problem on stderr, naming the source), 2 for a bad config.
``--refresh`` keeps reading the sources on their intervals after the list and prints each
change as it happens, until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from collector.discovery import DiscoveredTarget, TargetChanges, TargetSet
from collector.vllm_families import health_warnings
from vigil.config import Config, load_config
from vigil_shell.options import add_config_option, add_json_option

__all__ = ["add_arguments", "run", "target_rows"]


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _history(store: Any, target: str, now: float, span_s: float = 3600.0) -> dict[str, Any]:
    """From the stored series: since when the current state holds, the up ratio over the last
    hour and the process start time (a restart shows as a newer start and a counter reset)."""
    start_ms = int((now - span_s) * 1000)
    ups = store.points("up", {"instance": target}, start_ms=start_ms)
    values = [p for pts in ups.values() for p in pts if p.value is not None]
    values.sort()
    out: dict[str, Any] = {"state_since": None, "up_ratio_1h": None, "down_scrapes_1h": None,
                           "process_start_time": None}
    if values:
        out["up_ratio_1h"] = round(sum(p.value for p in values) / len(values), 4)
        out["down_scrapes_1h"] = sum(1 for p in values if p.value == 0.0)
        since = values[-1].ts_ms
        for p in reversed(values):
            if p.value != values[-1].value:
                break
            since = p.ts_ms
        # The state held through the whole span: say so rather than invent a start.
        out["state_since"] = since / 1000 if since != values[0].ts_ms or len(values) < 2 else None
    starts = store.last_points("process_start_time_seconds", {"instance": target},
                               at_ms=int(now * 1000))
    for p in starts.values():
        if p.value is not None:
            out["process_start_time"] = p.value
    return out


def _open_if_ready(path: Path) -> Any:
    """The store read-only, or None when it does not exist yet or is still being created."""
    from collector.store import Store
    from vigil.errors import StoreError

    if not path.exists():
        return None
    try:
        return Store(path, readonly=True)
    except StoreError:
        # The collector creates the file a moment before its schema; say "no data yet"
        # rather than fail. A file that is really not a store fails the same way but
        # has a size, and then the error is the right answer.
        if path.stat().st_size == 0:
            return None
        raise


def target_rows(targets: dict[str, DiscoveredTarget], store: Any,
                now: float) -> list[dict[str, Any]]:
    """One row per target: what it is, where it came from and, from ``store`` (or None),
    its last scrape (with its warnings: the vLLM families it lacked) and the last hour's
    history (times in Unix seconds)."""
    health = {h.target: h for h in store.target_health()} if store else {}
    rows = []
    for name, dt in targets.items():
        t = dt.target
        h = health.get(name)
        row: dict[str, Any] = {
            "target": name,
            "pool": t.pool,
            "kind": t.kind,
            "url": t.url,
            "origin": dt.origin,
            "labels": dict(sorted(t.labels.items())),
            "up": None if h is None else h.up,
            "last_scrape": None if h is None else h.last_scrape,
            "last_duration_seconds": None if h is None else round(h.duration, 6),
            "samples": None if h is None else h.samples,
            # Down: why. Up: "" (its warnings are listed apart: the scrape was stored).
            "last_error": None if h is None else ("" if h.up else h.error),
            "warnings": [] if h is None else health_warnings(h),
        }
        row.update(_history(store, name, now) if store and h else {
            "state_since": None, "up_ratio_1h": None, "down_scrapes_1h": None,
            "process_start_time": None})
        rows.append(row)
    return rows


def _discovery_rows(cfg: Config, errors: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": d.name, "mechanism": d.mechanism, "error": errors.get(d.name, "")}
            for d in cfg.discovery]


def _print_table(rows: list[dict[str, Any]], now: float) -> None:
    width = max([16, *(len(r["target"]) for r in rows)])
    pool_w = max([8, *(len(r["pool"]) for r in rows)])
    print(
        f"{'TARGET':<{width}} {'POOL':<{pool_w}} {'KIND':<4} {'STATE':<7} {'SINCE':<9} "
        f"{'UP 1H':>6} {'STARTED':<9} {'LAST':<8} {'DUR':>7} {'SAMPLES':>7}  ORIGIN  ERROR"
    )
    for r in rows:
        if r["up"] is None:
            state, last, dur, samples = "unknown", "never", "-", "-"
        else:
            state = "up" if r["up"] else "DOWN"
            last = _age(now - r["last_scrape"])
            dur = f"{r['last_duration_seconds'] * 1000:.1f}ms"
            samples = str(r["samples"])
        since = _age(now - r["state_since"]) if r["state_since"] else "-"
        ratio = f"{r['up_ratio_1h'] * 100:.1f}%" if r["up_ratio_1h"] is not None else "-"
        started = _age(now - r["process_start_time"]) if r["process_start_time"] else "-"
        labels = ",".join(f"{k}={v}" for k, v in r["labels"].items())
        origin = r["origin"] + (f" {{{labels}}}" if labels else "")
        print(
            f"{r['target']:<{width}} {r['pool']:<{pool_w}} {r['kind']:<4} {state:<7} "
            f"{since:<9} {ratio:>6} {started:<9} {last:<8} {dur:>7} {samples:>7}  {origin}  "
            f"{r['last_error'] or ''}".rstrip()
        )
        for warning in r["warnings"]:
            print(f"  warning: {warning}")


def _report_errors(cfg: Config, errors: dict[str, str]) -> int:
    """Each source's problem on stderr; 1 when there is any, else 0."""
    code = 0
    for d in cfg.discovery:
        if errors.get(d.name):
            print(f"vigil targets: discovery {d.name} ({d.mechanism}): {errors[d.name]}",
                  file=sys.stderr)
            code = 1
    return code


def _change_lines(changes: TargetChanges, as_json: bool) -> list[str]:
    out = []
    for what, sign, targets in (("added", "+", changes.added), ("removed", "-", changes.removed),
                                ("changed", "~", changes.changed)):
        for dt in targets:
            t = dt.target
            if as_json:
                out.append(json.dumps({"change": what, "target": t.name, "pool": t.pool,
                                       "kind": t.kind, "url": t.url, "origin": dt.origin,
                                       "labels": dict(sorted(t.labels.items()))}))
            else:
                out.append(f"{sign} {t.name} {t.pool} {t.kind} {t.url}  {dt.origin}")
    return out


async def _watch(targets: TargetSet, cfg: Config, as_json: bool) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Signal handlers need the main thread of a Unix loop; elsewhere Ctrl-C still ends the
        # watch through KeyboardInterrupt.
        with suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    reported = targets.errors()

    def show(changes: TargetChanges) -> None:
        for line in _change_lines(changes, as_json):
            print(line, flush=True)

    targets.subscribe(show)
    print("vigil targets: watching the discovery sources (Ctrl-C stops)", file=sys.stderr,
          flush=True)
    task = loop.create_task(targets.run(stop))
    while not stop.is_set():
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        errors = targets.errors()
        if errors != reported:
            _report_errors(cfg, {k: v for k, v in errors.items() if v != reported.get(k)})
            reported = errors
    await task
    return 1 if any(reported.values()) else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``vigil targets``."""
    add_config_option(p)
    add_json_option(p)
    p.add_argument("--refresh", action="store_true",
                   help="after the list, keep reading the discovery sources on their "
                        "intervals and print each target added, removed or changed (Ctrl-C "
                        "stops)")


def run(args: argparse.Namespace) -> int:
    """``vigil targets``: list every target; the exit code says whether discovery worked."""
    cfg = load_config(args.config)
    targets = TargetSet(cfg)
    return asyncio.run(_main(args, cfg, targets))


async def _main(args: argparse.Namespace, cfg: Config, targets: TargetSet) -> int:
    await targets.refresh(force=True)
    errors = targets.errors()
    path = cfg.store_path()
    now = time.time()
    store = _open_if_ready(path)
    try:
        rows = target_rows(targets.current(), store, now)
    finally:
        if store is not None:
            store.close()
    if args.json:
        json.dump({"store": str(path), "targets": rows,
                   "discovery": _discovery_rows(cfg, errors)}, sys.stdout, indent=2)
        print()
    else:
        if store is None:
            print(f"no store at {path} yet: start `vigil collect --config {args.config}`")
        _print_table(rows, now)
    sys.stdout.flush()
    code = _report_errors(cfg, errors)
    if getattr(args, "refresh", False):
        code = await _watch(targets, cfg, args.json)
    return code
