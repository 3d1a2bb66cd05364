"""`vigil alerts --config F [--json]`: the firing alerts and the notification outbox.

It reads what `vigil serve` persisted, from another process: the alerts of the last
evaluation (saved in the outbox by ``Notifier.process``) and the outbox rows
(``alerts.notifier.read_status``). Nothing is created when no outbox exists yet.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from vigil.clock import Clock, system_clock
from vigil_shell.options import add_config_option, add_json_option

__all__ = ["add_arguments", "format_table", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `vigil alerts`."""
    add_config_option(p)
    add_json_option(p)


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    age = now - ts
    if age < 120:
        return f"{age:.0f}s ago"
    if age < 7200:
        return f"{age / 60:.0f}m ago"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def format_table(status: dict[str, Any]) -> str:
    """The human-readable listing of ``read_status``'s dict."""
    now = status["now"]
    lines = []
    firing = status.get("firing") or []
    lines.append(f"{len(firing)} alert(s) active at the last evaluation")
    if firing:
        lines.append(f"{'ALERT':<30} {'SEVERITY':<8} {'POOL':<10} {'SLO':<22} {'SINCE':<10} "
                     "ROUTES")
    for a in firing:
        labels = a["labels"]
        lines.append(
            f"{labels.get('alertname', ''):<30} {labels.get('severity', ''):<8} "
            f"{labels.get('pool', ''):<10} {labels.get('slo', labels.get('instance', '')):<22} "
            f"{_when(a.get('starts_at'), now):<10} {','.join(a.get('routes') or []) or '-'}"
        )
        summary = (a.get("annotations") or {}).get("summary")
        if summary:
            lines.append(f"    {summary}")
    ob = status["outbox"]
    lines.append("")
    lines.append(
        f"outbox {ob['path']}: {ob['pending']} pending ({ob['in_flight']} in flight), "
        f"{ob['done']} delivered, {ob['given_up']} given up, {ob['superseded']} superseded; "
        f"oldest pending {ob['oldest_pending_age_seconds']:.0f}s"
    )
    for title, key in (("pending", "pending_items"), ("given up", "given_up_items")):
        for item in ob.get(key) or []:
            lines.append(
                f"  {title}: {item.get('route')} {item.get('group_key')} "
                f"attempts {item.get('attempts')} age {item.get('age_seconds', 0):.0f}s "
                f"last error: {item.get('last_error') or '-'}"
            )
    return "\n".join(lines)


def run(args: argparse.Namespace, *, clock: Clock = system_clock) -> int:
    """Print the firing alerts and the outbox, ages as of ``clock()``; exit 0."""
    from alerts.notifier import read_status
    from vigil.config import load_config

    config = load_config(args.config)
    status = read_status(config.outbox_target(), clock())
    if args.json:
        json.dump(status, sys.stdout, indent=2, sort_keys=True, default=str)
        print()
    else:
        print(format_table(status))
    return 0
