"""``vigil otlp receive --config F [--listen HOST:PORT]``: request records from OpenTelemetry
spans (``serving.otlp``), on their own, for fleets that Vigil's gateway is not in front of.

Serves OTLP/HTTP ``POST /v1/traces`` (and the receiver's counters on ``GET /metrics``) until
SIGTERM or SIGINT, then writes every request still held and exits 0. `vigil serve` runs the
same receiver when ``[otlp] listen`` is set; this command is for running it apart.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from types import FrameType

from vigil.config import load_config
from vigil.errors import ConfigError
from vigil_shell.options import add_config_option, add_listen_option, parse_listen

__all__ = ["add_arguments", "run"]

log = logging.getLogger("vigil.otlp")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``vigil otlp``'s subcommands and their flags."""
    sub = p.add_subparsers(dest="otlp_command", metavar="SUBCOMMAND", required=True)
    r = sub.add_parser("receive", help="OTLP/HTTP trace receiver writing request records")
    add_config_option(r)
    add_listen_option(r, default=None, help="address of POST /v1/traces (default: [otlp] "
                                            "listen; OTLP/HTTP's usual port is 4318)")


def summary(counts: dict[str, object]) -> str:
    """One line of the receiver's counters (``OtlpReceiver.counts``)."""
    spans = counts["spans"]
    assert isinstance(spans, dict)
    parts = [f"{n} {outcome}" for outcome, n in spans.items() if n]
    rejected = counts["rejected"]
    assert isinstance(rejected, dict)
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(rejected.items()))
    return (f"spans: {', '.join(parts) or 'none'}" + (f" (rejected: {why})" if why else "")
            + f"; records: {counts['written']} written, {counts['dropped']} dropped, "
            f"{counts['refused']} refused by the database")


def run(args: argparse.Namespace) -> int:
    """Receive until SIGTERM/SIGINT; exit code 0 (2 for a bad config or address, or a records
    database that cannot be opened)."""
    from serving.otlp.receiver import TRACES_PATH, OtlpReceiver

    cfg = load_config(args.config)
    listen = args.listen or cfg.otlp.listen
    if not listen:
        raise ConfigError("no address to listen on: give --listen HOST:PORT or set [otlp] "
                          "listen", file=args.config, key="otlp.listen")
    host, port = parse_listen(listen, allow_port_zero=True)
    receiver = OtlpReceiver(cfg)
    receiver.start()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        host, port = receiver.serve_http(host, port)
        shown = f"[{host}]" if ":" in host else host
        pools = ", ".join(cfg.otlp.pools) or "every pool"
        print(f"vigil otlp receive: http://{shown}:{port}{TRACES_PATH} (OTLP/HTTP, protobuf or "
              f"JSON) for {pools}; records in {receiver.display}; join window "
              f"{cfg.otlp.join_window:g}s (SIGTERM or Ctrl-C stops)", flush=True)
        while not stop.is_set():
            # A timeout, so that the signal handler's turn comes however the wait is woken.
            stop.wait(1.0)
        print("vigil otlp receive: stopping", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        lost = receiver.close()
    print(f"vigil otlp receive: stopped; {summary(receiver.counts())}", flush=True)
    if lost:
        log.error("%d records could not be written to %s", lost, receiver.display)
    return 0
