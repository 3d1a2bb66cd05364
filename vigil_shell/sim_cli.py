"""``vigil sim``: run a simulated vLLM fleet.

``vigil_shell/cli.py`` wires it as::

    p = subparsers.add_parser("sim", help="run simulated vLLM replicas")
    vigil_shell.sim_cli.add_arguments(p)
    p.set_defaults(func=vigil_shell.sim_cli.run)   # run(args) -> exit code

The replicas stand in for ``vllm serve``, so their options keep vLLM's spelling (``--host``,
``--port``, ``--max-loras``...) rather than Vigil's ``--listen HOST:PORT``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from slo.planning.replica.profiles import DEFAULT_MODEL, PROFILES

if TYPE_CHECKING:
    from serving.sim.server import FleetSpec

__all__ = ["add_arguments", "run", "spec_from_args"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options to ``parser``."""
    parser.add_argument("--replicas", type=int, default=2, help="replicas to run (default 2)")
    parser.add_argument("--port", type=int, default=8100,
                        help="port of the first replica; replica i listens on PORT+i "
                             "(default 8100)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"served model name (default {DEFAULT_MODEL})")
    parser.add_argument("--gpu", default=None,
                        help="GPU price key, e.g. H100 (default: the profile's)")
    parser.add_argument("--profile", default="small", choices=sorted(PROFILES),
                        help="calibration profile (default small: reaches KV pressure on a "
                             "laptop)")
    parser.add_argument("--spec-decode", type=int, default=0, metavar="K",
                        help="speculative decoding with K draft tokens per step (default off)")
    parser.add_argument("--spec-acceptance", type=float, default=0.7, metavar="P",
                        help="P(draft accepted | earlier drafts accepted) (default 0.7)")
    parser.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters")
    parser.add_argument("--max-loras", type=int, default=1,
                        help="LoRA adapters per batch (default 1, as vLLM)")
    parser.add_argument("--lora-modules", nargs="*", default=[], metavar="NAME",
                        help="LoRA adapter names served as models (with --enable-lora)")
    parser.add_argument("--scheduling-policy", default="fcfs", choices=("fcfs", "priority"),
                        help="vLLM scheduling policy (default fcfs, as vLLM)")
    parser.add_argument("--gpus-per-replica", type=int, default=1,
                        help="GPUs per replica in the DCGM exposition (default 1)")
    parser.add_argument("--max-num-queued-reqs", type=int, default=None,
                        help="answer 503 beyond this many queued+running requests")
    parser.add_argument("--max-num-queued-tokens", type=int, default=None,
                        help="answer 503 beyond this many prompt tokens awaiting prefill")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random draws")
    parser.add_argument("--max-model-len", type=int, default=None, metavar="N",
                        help="context length (default: the profile's), as vLLM's flag; it "
                             "also sets the token histograms' largest bucket")
    parser.add_argument("--custom-histogram-buckets", default=None, metavar="JSON",
                        help="as vLLM's flag: {\"time_to_first_token\": [...], "
                             "\"request_latency\": [...]} replacing those families' bounds")
    # Not --log-level: ``vigil`` itself has a global --log-level the subcommand must not shadow.
    parser.add_argument("--uvicorn-log-level", default="warning",
                        choices=("critical", "error", "warning", "info", "debug"),
                        help="log level of the replicas' HTTP servers (default warning)")


def spec_from_args(args: argparse.Namespace) -> FleetSpec:
    """The fleet the parsed options describe (raises ``ConfigError`` when inconsistent)."""
    from serving.sim.server import FleetSpec

    return FleetSpec(
        replicas=args.replicas, port=args.port, host=args.host, model=args.model,
        gpu=args.gpu, profile=args.profile, spec_decode=args.spec_decode,
        spec_acceptance=args.spec_acceptance, enable_lora=args.enable_lora,
        max_loras=args.max_loras, lora_modules=tuple(args.lora_modules),
        scheduling_policy=args.scheduling_policy, seed=args.seed,
        gpus_per_replica=args.gpus_per_replica,
        max_num_queued_reqs=args.max_num_queued_reqs,
        max_num_queued_tokens=args.max_num_queued_tokens,
        max_model_len=getattr(args, "max_model_len", None),
        custom_histogram_buckets=getattr(args, "custom_histogram_buckets", None))


def run(args: argparse.Namespace) -> int:
    """Run the fleet until SIGTERM/SIGINT; returns the exit code."""
    import asyncio

    # Imported here: the web stack takes a second to import and `vigil --help` needs none of it.
    from serving.sim.server import build_replicas, serve_fleet

    spec = spec_from_args(args)
    build_replicas(spec)  # fail fast on a bad profile before binding ports
    asyncio.run(serve_fleet(spec, log_level=getattr(args, "uvicorn_log_level", "warning")))
    return 0
