"""``vigil loadgen``: send a workload to vLLM-compatible endpoints and print the report.

The options map onto ``serving.loadgen.workload.Workload``; the run is
``serving.loadgen.client.generate`` and the report ``serving.loadgen.report``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from typing import Any

from serving.loadgen.client import Progress, generate
from serving.loadgen.report import RequestResult, Slo, format_report, summarize
from serving.loadgen.workload import SCENARIOS, TIERS, Workload, keyed_workload
from vigil.config import SloDefaults
from vigil.errors import UsageError
from vigil_shell.options import add_config_option, add_json_option, duration_arg

__all__ = ["add_arguments", "keyed_workload", "run", "workload_from_args"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", action="append", required=True, metavar="BASE",
                   help="API base of a replica or the gateway (http://127.0.0.1:8080); "
                        "repeat for round-robin over several")
    p.add_argument("--model", required=True, help="the model name to request")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="steady",
                   help="a preset of the options below (explicit options win)")
    p.add_argument("--key", action="append", default=[], metavar="TIER=KEY",
                   help="API key to send for a tier (the gateway maps keys to tiers); with "
                        "keys, only the keyed tiers are sent; without keys, requests carry "
                        "vLLM's `priority` for their tier")
    g = p.add_argument_group("timing")
    g.add_argument("--rate", type=float, help="arrivals per second (default 2)")
    g.add_argument("--shape", choices=("steady", "ramp", "diurnal", "burst"),
                   help="how the rate changes over time")
    g.add_argument("--peak-rate", "--ramp-to", dest="peak_rate", type=float,
                   help="ramp: rate reached after --ramp; diurnal: the peak; burst: the rate "
                        "during a burst")
    g.add_argument("--ramp", type=duration_arg, metavar="DURATION",
                   help="ramp: time to reach --peak-rate (seconds, or 90s, 5m)")
    g.add_argument("--period", type=duration_arg, metavar="DURATION",
                   help="diurnal: length of a day; burst: time between bursts")
    g.add_argument("--burst-length", type=duration_arg, metavar="DURATION",
                   help="burst: how long each burst lasts")
    g.add_argument("--burstiness", type=float,
                   help="gamma shape of inter-arrival times: 1 = Poisson, <1 burstier")
    g.add_argument("--concurrency", type=int,
                   help="a fixed number of concurrent clients instead of a rate")
    g.add_argument("--duration", type=duration_arg, metavar="DURATION",
                   help="how long to send (seconds, or 90s, 5m); 0 = until Ctrl-C (default)")
    g.add_argument("--num-requests", dest="max_requests", type=int,
                   help="stop after sending this many (and let them finish)")
    m = p.add_argument_group("mix")
    m.add_argument("--stream-share", type=float, help="share of streaming requests (0.8)")
    m.add_argument("--chat-share", type=float, help="share of chat vs completions (0.7)")
    m.add_argument("--long-share", type=float,
                   help="share of long-output outliers (0.02), far above 10x the mean tokens")
    m.add_argument("--long-tokens", type=int, help="output tokens of an outlier (4096)")
    m.add_argument("--faq-share", type=float,
                   help="share of FAQ questions, asked in varying words (0.3)")
    m.add_argument("--no-max-tokens-share", type=float,
                   help="share of requests without max_tokens (0.3)")
    m.add_argument("--max-tokens", metavar="N,...",
                   help="max_tokens values drawn for the other requests (128,256,512)")
    m.add_argument("--tier-mix", metavar="T=S,...",
                   help="tier shares, e.g. premium=0.2,standard=0.6,batch=0.2")
    m.add_argument("--seed", type=int, help="random seed (0)")
    r = p.add_argument_group("report")
    add_config_option(r, required=False,
                      help="Vigil config: goodput uses its TTFT and e2e SLO thresholds")
    defaults = SloDefaults()
    r.add_argument("--goodput-ttft", type=float, metavar="SECONDS",
                   help="goodput TTFT threshold (default: the config's [slo_defaults] "
                        f"ttft_threshold_seconds, {defaults.ttft_threshold_seconds:g})")
    r.add_argument("--goodput-e2e", type=float, metavar="SECONDS",
                   help="goodput e2e threshold (default: the config's [slo_defaults] "
                        f"e2e_threshold_seconds, {defaults.e2e_threshold_seconds:g})")
    add_json_option(r, help="print the report as JSON")
    r.add_argument("--quiet", action="store_true", help="no progress output")


def _tier_mix(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep:
            raise UsageError(f"--tier-mix: expected TIER=SHARE, got {part!r}")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--tier-mix: {value!r} is not a number") from None
    return out


def workload_from_args(args: argparse.Namespace) -> Workload:
    """Defaults, then the scenario's preset, then explicit options; ``ArgumentError`` (a
    ``UsageError`` for an option's spelling) when bad."""
    fields: dict[str, Any] = dict(SCENARIOS[args.scenario])
    for name in ("rate", "shape", "peak_rate", "ramp", "period", "burst_length", "burstiness",
                 "concurrency", "duration", "max_requests", "stream_share", "chat_share",
                 "long_share", "long_tokens", "faq_share", "no_max_tokens_share", "seed"):
        value = getattr(args, name, None)
        if value is not None:
            fields[name] = value
    if args.peak_rate is not None and args.shape is None and fields.get("shape") == "steady":
        fields["shape"] = "ramp"  # `--ramp-to` alone means a ramp, as before
    if args.tier_mix:
        fields["tiers"] = _tier_mix(args.tier_mix)
    if args.max_tokens:
        try:
            fields["max_tokens_choices"] = tuple(int(v) for v in args.max_tokens.split(","))
        except ValueError:
            raise UsageError(f"--max-tokens: expected N,N,..., got {args.max_tokens!r}") from None
    return Workload(**fields)


def _keys(pairs: list[str]) -> dict[str, str]:
    keys: dict[str, str] = {}
    for pair in pairs:
        tier, sep, key = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--key: expected TIER=KEY, got {pair.split('=')[0]!r}=...")
        if tier not in TIERS:
            raise UsageError(f"--key: unknown tier {tier!r} (tiers: {', '.join(TIERS)})")
        keys[tier] = key
    return keys


def _slo(args: argparse.Namespace) -> Slo:
    """The goodput thresholds (seconds): the options, else ``--config``'s ``[slo_defaults]``,
    else the defaults of ``SloDefaults``."""
    if args.config:
        from vigil.config import load_config

        defaults = load_config(args.config).slo_defaults
    else:
        defaults = SloDefaults()
    ttft, e2e = defaults.ttft_threshold_seconds, defaults.e2e_threshold_seconds
    return Slo(ttft=args.goodput_ttft if args.goodput_ttft is not None else ttft,
               e2e=args.goodput_e2e if args.goodput_e2e is not None else e2e)


def run(args: argparse.Namespace) -> int:
    """``vigil loadgen``: exit 0 after a run (even with failed requests: they are reported);
    bad options raise ``ArgumentError`` (exit code 2 from ``vigil_shell.cli.main``)."""
    for u in args.url:
        if not u.startswith(("http://", "https://")):
            raise UsageError(f"--url must be http(s)://, got {u!r}")
    wl = workload_from_args(args)
    keys = _keys(args.key)
    wl = keyed_workload(wl, keys, explicit_mix=bool(args.tier_mix))
    slo = _slo(args)
    progress = None if args.quiet else Progress(wl.duration, wl.max_requests)

    async def main() -> tuple[list[RequestResult], float]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await generate(args.url, args.model, wl, stop, keys=keys, progress=progress)

    results, elapsed = asyncio.run(main())
    report = summarize(results, elapsed, slo)
    if args.json:
        print(json.dumps(report, indent=2, allow_nan=False))
    else:
        print(format_report(report), flush=True)
    return 0
