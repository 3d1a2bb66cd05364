"""``vigil gateway --config F [--listen HOST:PORT]``: serve the gateway with uvicorn.

SIGINT or SIGTERM stops it gracefully: no new connections, streams in flight get
``SHUTDOWN_GRACE`` seconds to finish, then the batch loop, the pollers and the records writer
stop (every queued record is written).

uvicorn runs on uvloop with the httptools parser when they are installed (``uvicorn[standard]``'s
extras): both in C, they take a large part of the per-event cost of relaying a stream off the
gateway's CPU (docs/gateway.md, Performance). Without them it runs on asyncio and h11, slower.
The objects that live as long as the process are frozen out of the garbage collector's
generations once start-up is done, before the first request (``freeze_heap``). The web stack
(the ``gateway`` extra) is imported only to serve: ``vigil gateway --help`` works without it.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import signal

from vigil.config import Config, load_config
from vigil.errors import ConfigError
from vigil_shell.options import add_config_option, add_listen_option, parse_listen

__all__ = ["SHUTDOWN_GRACE", "add_arguments", "freeze_heap", "parse_listen", "replicas_line",
           "run", "server_choices"]

#: Seconds in-flight requests get to finish on shutdown.
SHUTDOWN_GRACE = 10

log = logging.getLogger("vigil.gateway")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``vigil gateway``."""
    add_config_option(p)
    add_listen_option(p, default=None, help="address to listen on (default: [gateway] listen)")


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def server_choices() -> tuple[str, str]:
    """uvicorn's ``loop`` and ``http``: ``uvloop`` and ``httptools`` when importable, else
    ``asyncio`` and ``h11``."""
    return ("uvloop" if _importable("uvloop") else "asyncio",
            "httptools" if _importable("httptools") else "h11")


def replicas_line(cfg: Config) -> str:
    """Where the replicas come from, for the start-up line: the static ones by name, each
    discovery source with its mechanism (each replica it finds is logged as it joins or
    leaves, and ``/health`` lists them all with their origin)."""
    static = [f"{t.name} ({t.pool})" for t in cfg.targets if t.kind == "vllm"]
    parts = [f"static: {', '.join(static)}"] if static else []
    parts += [f"discovery {d.name!r} ({d.mechanism}, every {d.refresh_interval:g} s)"
              for d in cfg.discovery]
    return "replicas: " + "; ".join(parts)


def freeze_heap() -> None:
    """Collect once, then move every object alive now out of the collector's generations
    (``gc.freeze``): what start-up made (modules, the app, pydantic's schemas, uvicorn's
    lazily imported protocol modules, the records database, the cache's embedding model) lives
    as long as the process, and a full collection that walked it all would pause the event
    loop for tens of milliseconds (docs/gateway.md, Performance). Called by the lifespan after
    start-up, before the first request; the one collection here is the last full walk."""
    gc.collect()
    gc.freeze()


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; exit code 0 (2 for a bad config)."""
    import uvicorn

    from serving.gateway.front.app import create_app
    from serving.gateway.front.uvicorn_protocol import protocol

    cfg = load_config(args.config)
    if not cfg.discovery and not any(t.kind == "vllm" for t in cfg.targets):
        raise ConfigError("the gateway needs at least one kind = \"vllm\" target or a "
                          "[[discovery]] source to send requests to", file=args.config,
                          key="targets")
    if not cfg.gateway.api_keys:
        log.warning("no [[gateway.api_keys]]: every request will get 401")
    host, port = parse_listen(args.listen or cfg.gateway.listen)
    app = create_app(cfg, on_started=freeze_heap)
    loop, http = server_choices()
    pools = ", ".join(f"{p.name} ({p.model})" for p in cfg.pools)
    print(f"vigil gateway: http://{host}:{port}/v1 for pools {pools}; records in "
          f"{cfg.gateway_records_path()}; {loop} + {http} (Ctrl-C stops)", flush=True)
    print(replicas_line(cfg), flush=True)
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again for the handler
    # it found: with Python's default one that kills the process (exit -15). A no-op handler
    # makes a requested stop the clean exit (0) it is.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False,
                    timeout_graceful_shutdown=SHUTDOWN_GRACE, lifespan="on", loop=loop,
                    http=protocol(http))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
