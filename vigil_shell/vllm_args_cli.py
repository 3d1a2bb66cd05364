"""``vigil vllm-args``: print the ``vllm serve`` command of a pool's launch profile
(``serving.vllm_args.build_command``); the options are shared with ``vigil vllm-serve``."""

from __future__ import annotations

import argparse
import json
import sys

from serving.vllm_args import VllmCommand, build_command
from vigil.config import load_config
from vigil_shell.options import add_config_option, add_json_option

__all__ = ["add_arguments", "add_common_arguments", "command_from_args", "run"]


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range 1-65535")
    return port


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--pool``, ``--host``, ``--port`` (shared with ``vigil vllm-serve``).

    ``--host`` and ``--port`` are passed to vLLM as they are: they keep ``vllm serve``'s own
    spelling rather than Vigil's ``--listen HOST:PORT``."""
    add_config_option(parser)
    parser.add_argument("--pool", required=True, help="the pool whose [pools.vllm] profile to use")
    parser.add_argument("--host", help="address vLLM listens on (default: vLLM's own)")
    parser.add_argument("--port", type=_port, help="port vLLM listens on (default: vLLM's own)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``vigil vllm-args``."""
    add_common_arguments(parser)
    add_json_option(parser, help="print the argv as a JSON list instead of a shell line")


def command_from_args(args: argparse.Namespace) -> VllmCommand:
    """The command for parsed ``--config/--pool/--host/--port``."""
    cfg = load_config(args.config)
    return build_command(cfg, args.pool, host=args.host, port=args.port)


def run(args: argparse.Namespace) -> int:
    """Print the command (stdout: one line, or the JSON argv); notes go to stderr as
    ``# note: ...`` lines."""
    command = command_from_args(args)
    for note in command.notes:
        print(f"# note: {note}", file=sys.stderr)
    print(json.dumps(command.argv) if args.json else command.shell())
    return 0
