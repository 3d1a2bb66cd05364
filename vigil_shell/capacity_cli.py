"""``vigil capacity``: the highest load one replica serves within its SLOs, measured.

``vigil capacity --url BASE --model M [--config F] [--pool P]`` runs the capacity search
(``slo.planning.capacity_search.search``) against a live replica or gateway, on one closed loop
of streamed chat completions kept running from its opening ramp (``[capacity] ramp``, which
estimates the knee the search starts from) to its last level
(``serving.loadgen.probe.LoadRunner``), of one request shape (``--prompt-tokens``,
``--output-tokens``); each level is judged against every latency SLO of the pool (or
of the model; without ``--config``, the defaults of ``[slo_defaults]``). It prints the probes and
the result: the highest passing concurrency, its goodput (requests/s within every SLO) and
output tokens/s. ``--save`` keeps the result in ``[capacity] profiles_path`` as a ``measured``
profile for the planner and the scaling policy; ``--list`` prints the saved profiles.

Exit codes: 0 a capacity was found (or listed), 1 no level passes (even one request at a time
misses an SLO), 2 bad options or config, or an endpoint that cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import httpx

from slo.objectives.spec import effective_slos
from slo.planning.capacity_search import SearchResult, profile_from_search, search
from slo.planning.profile_store import ProfileStore
from vigil.capacity import CapacityProfile, Probe, ProfileIdentity, SloTarget
from vigil.config import Config, PoolConfig, SloDefaults, check_http_url, load_config
from vigil.conventions import ENDPOINT_ALL, ENDPOINT_CHAT
from vigil.errors import ConfigError, UsageError
from vigil_shell.options import add_config_option, add_json_option

__all__ = ["add_arguments", "format_probe_row", "format_profiles", "probe_header", "run",
           "slo_targets"]

#: The prompt length of a probe request when not given (tokens): ``vllm bench serve``'s
#: random dataset default.
DEFAULT_PROMPT_TOKENS = 1024
_QUANTIZATIONS = ("none", "fp8", "int8", "int4")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``vigil capacity``."""
    p.add_argument("--url", metavar="BASE",
                   help="API base of the replica or gateway to measure (http://host:port)")
    p.add_argument("--model", help="the model name to request (default: the pool's model)")
    add_config_option(p, required=False,
                      help="Vigil config: its SLOs, [capacity] settings and profiles file")
    p.add_argument("--pool", help="the pool the replica belongs to: its latency SLOs and its "
                                  "configuration (GPU, quantization, speculative decoding)")
    p.add_argument("--prompt-tokens", type=int, metavar="N",
                   help=f"prompt tokens per request (default {DEFAULT_PROMPT_TOKENS})")
    p.add_argument("--output-tokens", type=int, metavar="N",
                   help="output tokens per request (default: [slo_defaults] "
                        "e2e_reference_output_tokens, the length the e2e SLO is stated for)")
    p.add_argument("--key", metavar="KEY", help="API key sent as a bearer token")
    g = p.add_argument_group("identity (without --pool; each overrides the pool's)")
    g.add_argument("--gpu", help="the GPU's price key, e.g. H100")
    g.add_argument("--gpus-per-replica", type=int, metavar="N")
    g.add_argument("--quantization", choices=_QUANTIZATIONS)
    g.add_argument("--speculative", metavar="METHOD",
                   help='speculative decoding: "ngram" or a draft model\'s name')
    g.add_argument("--num-speculative-tokens", type=int, metavar="N")
    add_json_option(p)
    p.add_argument("--save", action="store_true",
                   help="save the result as a measured profile ([capacity] profiles_path)")
    p.add_argument("--list", action="store_true", help="print the saved profiles and exit")


# --- SLOs and identity ---------------------------------------------------------------------
def _defaults(defaults: SloDefaults) -> list[SloTarget]:
    return [SloTarget("ttft", "ttft", defaults.ttft_threshold_seconds, defaults.ttft_objective),
            SloTarget("e2e", "e2e", defaults.e2e_threshold_seconds, defaults.e2e_objective)]


def slo_targets(config: Config, pool: PoolConfig | None, model: str) -> list[SloTarget]:
    """The latency SLOs a probe is judged against: every ttft/e2e SLO of ``pool`` (else of
    every pool serving ``model``) for chat or all endpoints; when no pool serves the model,
    the ``[slo_defaults]`` thresholds. ``ConfigError`` when the pool has SLOs but none of
    latency."""
    specs = [s for s in effective_slos(config)
             if (s.pool == pool.name if pool is not None else s.model == model)]
    latency = [SloTarget(s.name, "ttft" if s.indicator == "ttft" else "e2e",
                         float(s.threshold_seconds), s.objective)
               for s in specs if s.is_latency and s.threshold_seconds is not None
               and s.endpoint in (ENDPOINT_ALL, ENDPOINT_CHAT)]
    if latency:
        return latency
    if specs:
        where = f"pool {pool.name!r}" if pool is not None else f"model {model!r}"
        raise ConfigError(f"{where} has no ttft or e2e SLO for chat completions to measure "
                          "capacity against", file=config.source or None, key="slos")
    return _defaults(config.slo_defaults)


def _identity(args: argparse.Namespace, pool: PoolConfig | None, model: str,
              prompt_tokens: int, output_tokens: int) -> ProfileIdentity:
    speculative = args.speculative if args.speculative is not None else (
        pool.vllm.speculative_method if pool is not None else "")
    num_spec = args.num_speculative_tokens
    if num_spec is None:
        num_spec = pool.vllm.num_speculative_tokens if pool is not None and speculative else 0
    return ProfileIdentity(
        model=model,
        gpu=args.gpu or (pool.gpu if pool is not None else "unknown"),
        gpus_per_replica=args.gpus_per_replica or (pool.gpus_per_replica if pool else 1),
        quantization=args.quantization or (pool.vllm.quantization if pool else "none"),
        speculative=speculative,
        num_speculative_tokens=num_spec if speculative else 0,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
    )


# --- output ----------------------------------------------------------------------------------
def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def probe_header() -> str:
    """The header of the probe table (times in ms, rates per second)."""
    return (f"{'conc':>5} {'reqs':>5} {'err':>4} {'attain':>7} {'interval':>13} "
            f"{'good/s':>7} {'req/s':>7} {'tok/s':>8} {'TTFT95':>7} {'ITL95':>6} "
            f"{'E2E95':>7}  verdict")


def format_probe_row(p: Probe) -> str:
    """One probe as a row of the table: attainment in percent with its interval."""
    interval = f"[{p.attainment_low * 100:.1f}-{p.attainment_high * 100:.1f}]"
    return (f"{p.concurrency:>5} {p.requests:>5} {p.errors:>4} {p.attainment * 100:>6.1f}% "
            f"{interval:>13} {p.goodput_rps:>7.2f} {p.throughput_rps:>7.2f} "
            f"{p.output_tokens_per_s:>8.1f} {_ms(p.ttft_s.get('p95')):>7} "
            f"{_ms(p.itl_s.get('p95')):>6} {_ms(p.e2e_s.get('p95')):>7}  "
            f"{'pass' if p.passed else 'FAIL'}")


def _slo_text(slos: Sequence[SloTarget]) -> str:
    return ", ".join(f"{s.name} ({s.indicator} <= {s.threshold_seconds:g} s for "
                     f"{s.objective * 100:g}%)" for s in slos)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{max(0.0, seconds):.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h ago"
    return f"{seconds / 86400:.0f}d ago"


def format_profiles(profiles: Sequence[CapacityProfile], now: float) -> str:
    """The saved profiles as a table: key, basis, identity, pool, figures, age."""
    if not profiles:
        return "no saved capacity profiles"
    lines = [f"{'key':<12}  {'basis':<9} {'identity':<34} {'pool':<10} {'conc':>5} "
             f"{'good/s':>8} {'tok/s':>8}  age"]
    for p in profiles:
        ident = p.identity
        label = f"{ident.label()} ({ident.prompt_tokens}/{ident.output_tokens} tok)"
        if len(label) > 34:
            label = label[:33] + "…"
        lines.append(f"{p.key:<12}  {p.basis:<9} {label:<34} {p.pool or '-':<10} "
                     f"{p.max_concurrency:>5} {p.max_goodput_rps:>8.2f} "
                     f"{p.max_output_tokens_per_s:>8.1f}  {_age(now - p.created_at)}")
    return "\n".join(lines)


def _json_profile(profile: CapacityProfile, **extra: Any) -> dict[str, Any]:
    return {"key": profile.key, **profile.to_dict(), **extra}


# --- running ---------------------------------------------------------------------------------
async def _preflight(client: httpx.AsyncClient, base: str, model: str,
                     key: str | None) -> None:
    """Refuse early, with the reason, an endpoint that cannot serve the probes."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = await client.get(f"{base}/v1/models", headers=headers)
    except httpx.HTTPError as exc:
        raise UsageError(f"cannot reach {base}: {type(exc).__name__}: {exc}") from None
    if resp.status_code in (401, 403):
        raise UsageError(f"{base} refused the request (HTTP {resp.status_code}): give the "
                          "API key with --key")
    if resp.status_code != 200:
        return  # not every OpenAI-compatible server lists its models; the probes will tell
    try:
        served = [m.get("id") for m in resp.json().get("data") or ()]
    except (ValueError, AttributeError):
        return
    if served and model not in served:
        raise UsageError(f"{base} does not serve model {model!r} (it serves: "
                          f"{', '.join(map(str, served))})")


async def _measure(args: argparse.Namespace, config: Config, base: str, model: str,
                   slos: list[SloTarget], prompt_tokens: int, output_tokens: int,
                   table: TextIO) -> tuple[SearchResult, list[int]]:
    """The search, on one closed loop kept running across its levels (``LoadRunner``): the
    result and the levels that stopped early on a clear failure."""
    from serving.loadgen.probe import LoadRunner

    cap = config.capacity
    # The ramp may run up to max_concurrency streams; a level retiring some cancels them
    # before it adds none, so this many connections always suffice.
    limits = httpx.Limits(max_connections=cap.max_concurrency + 4,
                          max_keepalive_connections=cap.max_concurrency + 4)
    timeout = httpx.Timeout(600.0, connect=5.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        await _preflight(client, base, model, args.key)
        runner = LoadRunner(base, model, prompt_tokens=prompt_tokens,
                            output_tokens=output_tokens, api_key=args.key, client=client)
        try:
            ramp = None
            if cap.ramp:
                ramp = await runner.ramp(slos, cap.max_concurrency)
                table.write(f"ramp: 1 to {ramp.streams} streams, {ramp.requests} requests in "
                            f"{ramp.seconds:.0f} s, knee estimated at {ramp.knee:.1f} in "
                            f"flight: probing from {ramp.start}\n")
            table.write(probe_header() + "\n")
            table.flush()

            async def probe(concurrency: int) -> Probe:
                p = await runner.probe(concurrency, slos, cap)
                table.write(format_probe_row(p) + "\n")
                table.flush()
                return p

            result = await search(probe, max_concurrency=cap.max_concurrency,
                                  precision=cap.precision,
                                  start=ramp.start if ramp is not None else None)
        finally:
            await runner.close()
    return dataclasses.replace(result, ramp=ramp), runner.early_failed


def _explain_failure(result: SearchResult, slos: Sequence[SloTarget]) -> str:
    p = result.failed
    if p is None:
        return "no load level passes"
    if p.requests and p.errors == p.requests:
        return (f"every request failed at concurrency {p.concurrency} ({p.errors} of "
                f"{p.requests}); see the log for the first error")
    missed = [f"{s.name} {p.attainment_by_slo.get(s.name, 0.0) * 100:.1f}% within "
              f"{s.threshold_seconds:g} s (objective {s.objective * 100:g}%)"
              for s in slos if p.attainment_by_slo.get(s.name, 0.0) < s.objective]
    return ("even concurrency 1 (one request at a time) misses the SLO: "
            + ("; ".join(missed) or f"attainment {p.attainment * 100:.1f}%")
            + " — this replica cannot meet it at any load")


def run(args: argparse.Namespace, *, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    """``vigil capacity``; returns the exit code (0, 1 no level passes). Options that do
    not fit together raise ``UsageError`` (exit code 2 from ``vigil_shell.cli.main``)."""
    stdout = out if out is not None else sys.stdout
    stderr = err if err is not None else sys.stderr
    return _run(args, stdout, stderr)


def _run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    config = load_config(args.config) if args.config else Config()
    store = ProfileStore(config.capacity_profiles_path())
    if args.list:
        profiles = store.load()
        if args.json:
            stdout.write(json.dumps({"path": str(store.path), "profiles":
                                     [_json_profile(p) for p in profiles]},
                                    indent=2, allow_nan=False) + "\n")
        else:
            stdout.write(f"{store.path}\n{format_profiles(profiles, time.time())}\n")
        return 0
    pool: PoolConfig | None = None
    if args.pool:
        if not args.config:
            raise UsageError("--pool needs --config (the file that defines the pool)")
        try:
            pool = config.pool(args.pool)
        except KeyError:
            names = ", ".join(p.name for p in config.pools) or "none"
            raise UsageError(f"--pool {args.pool!r} is not a pool of {args.config} "
                              f"(pools: {names})") from None
    model = args.model or (pool.model if pool is not None else None)
    if not args.url or not model:
        raise UsageError("--url and --model are required (or --list)")
    try:
        base = check_http_url(args.url.rstrip("/"))
    except ValueError as exc:
        raise UsageError(f"--url {exc}") from None
    base = base.removesuffix("/v1")
    prompt_tokens = args.prompt_tokens or DEFAULT_PROMPT_TOKENS
    output_tokens = args.output_tokens or config.slo_defaults.e2e_reference_output_tokens
    if prompt_tokens < 1 or output_tokens < 1:
        raise UsageError("--prompt-tokens and --output-tokens must be at least 1")
    identity = _identity(args, pool, model, prompt_tokens, output_tokens)
    if args.save and identity.gpu == "unknown":
        raise UsageError("--save needs the GPU the replica runs on: --gpu NAME or --pool")
    slos = slo_targets(config, pool, model)
    cap = config.capacity
    table = stderr if args.json else stdout
    table.write(f"vigil capacity: {identity.label()} at {base}, {prompt_tokens} prompt / "
                f"{output_tokens} output tokens per request\nSLOs: {_slo_text(slos)}; "
                f"{cap.confidence * 100:g}% intervals, precision {cap.precision * 100:g}%\n")
    started = time.monotonic()
    result, early_failed = asyncio.run(_measure(args, config, base, model, slos,
                                                prompt_tokens, output_tokens, table))
    profile = profile_from_search(identity, "measured", result, slos, source=base,
                                  pool=pool.name if pool is not None else "",
                                  created_at=time.time(), confidence=cap.confidence,
                                  precision=cap.precision)
    if early_failed:
        profile = dataclasses.replace(profile, notes=(
            *profile.notes, "stopped early on a clear failure (interval corrected for "
            "repeated looks): concurrency " + ", ".join(map(str, early_failed))))
    wall = time.monotonic() - started
    saved = ""
    if args.save and result.best is not None:
        store.save(profile)
        saved = str(store.path)
    if args.json:
        search_info = {
            "ramp": result.ramp.to_dict() if result.ramp is not None else None,
            "levels": [p.concurrency for p in result.probes],
            "early_failed": early_failed,
            "requests": sum(p.requests for p in result.probes)
            + (result.ramp.requests if result.ramp is not None else 0),
        }
        stdout.write(json.dumps(_json_profile(profile, saved_to=saved or None,
                                              search_seconds=round(wall, 3),
                                              search=search_info),
                                indent=2, allow_nan=False) + "\n")
    else:
        lines = []
        if result.best is not None:
            lines.append(f"capacity: {profile.max_concurrency} requests in flight, "
                         f"{profile.max_goodput_rps:.2f} req/s within the SLOs, "
                         f"{profile.max_output_tokens_per_s:.1f} output tok/s (measured, "
                         f"{len(result.probes)} probes, "
                         f"{sum(p.requests for p in result.probes)} requests"
                         + (f" after a ramp of {result.ramp.requests}"
                            if result.ramp is not None else "")
                         + f", {wall:.0f} s)")
        lines += [f"note: {n}" for n in profile.notes]
        if saved:
            lines.append(f"saved to {saved} (key {profile.key})")
        stdout.write("\n".join(lines) + "\n")
    if result.best is None:
        stderr.write(f"vigil capacity: {_explain_failure(result, slos)}\n")
        if args.save:
            stderr.write("vigil capacity: nothing saved\n")
        return 1
    return 0
