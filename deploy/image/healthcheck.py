#!/opt/vigil/bin/python
"""The image's health check: ``vigil-healthcheck [URL | --pid PID]`` (exit 0 healthy, 1 not).

One image runs every Vigil process, so the check finds out which one it is checking: the Vigil
process of the container (the lowest-numbered process that runs the ``vigil`` command: PID 1
under ``ENTRYPOINT ["vigil"]``, or the child of an init such as ``docker run --init``), or
``--pid PID``. Its command line is read with Vigil's own parser and its config file loaded, so
the address is the one the process listens on, however it was given (``--listen``, the
config, the defaults), and the endpoint is its health route:

* ``vigil serve``: ``/healthz`` (503 while the last evaluation failed)
* ``vigil gateway``: ``/health``
* ``vigil dashboard``: Streamlit's ``/_stcore/health``

A wildcard address (``0.0.0.0``, ``::``) is checked on loopback. Any other command (``vigil
collect``) serves no HTTP: it is healthy while it runs. With a URL, that URL is checked.
Written for Python's standard library and Vigil's packages only: the image has no curl.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from vigil.errors import VigilError

#: Seconds a health endpoint gets to answer (docker's own --timeout is 30 s by default).
TIMEOUT_S = 5.0
#: The health route of each command that serves HTTP.
ROUTES = {"serve": "/healthz", "gateway": "/health", "dashboard": "/_stcore/health"}
#: Wildcard addresses and the loopback address that reaches a server bound to them.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def vigil_argv(pid: int) -> list[str] | None:
    """The arguments after ``vigil`` in process ``pid``'s command line, or None when that
    process does not run the ``vigil`` command: ``PYTHON .../vigil ARGS`` (the kernel starts
    the script under the interpreter of its ``#!`` line), or ``vigil ARGS``."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    argv = [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]
    names = [os.path.basename(a) for a in argv[:2]]
    if names[:1] == ["vigil"]:
        return argv[1:]
    if len(names) == 2 and names[0].startswith("python") and names[1] == "vigil":
        return argv[2:]
    return None


def find_vigil() -> int | None:
    """The lowest-numbered process that runs ``vigil`` (other than this check)."""
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return next((pid for pid in pids if pid != os.getpid() and vigil_argv(pid) is not None),
                None)


def seen_by(pid: int, path: str) -> Path:
    """``path`` as process ``pid`` sees it (its root directory and its working directory),
    reached through ``/proc``: the check finds the config file the process read even when it
    runs in another mount namespace (``buildah run``, ``kubectl exec``)."""
    proc = Path(f"/proc/{pid}")
    return proc / "root" / path.lstrip("/") if path.startswith("/") else proc / "cwd" / path


def health_url(argv: list[str], config_file: Callable[[str], Path] = Path) -> str | None:
    """The health URL of a process that runs ``vigil ARGV``, or None when its command serves
    no HTTP; ``config_file`` maps its ``--config`` to the file to read."""
    from vigil.config import load_config
    from vigil_shell.cli import build_parser
    from vigil_shell.options import parse_listen

    # Which command first (its options are known only to the parser built for it), then its
    # options, exactly as `vigil` parsed them.
    command = build_parser().parse_known_args(argv)[0].command
    if command not in ROUTES:
        return None
    args = build_parser(command).parse_args(argv)
    if command == "serve":
        listen = args.listen
    else:
        config = load_config(str(config_file(args.config)))
        if command == "gateway":
            listen = args.listen or config.gateway.listen
        else:
            from vigil_shell.dashboard_cli import listen_address

            address, port = listen_address(args, config)
            listen = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    host, port = parse_listen(listen, allow_port_zero=True)
    host = WILDCARDS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{ROUTES[command]}"


def check(url: str) -> tuple[bool, str]:
    """(healthy, what was seen) for one GET of ``url``: healthy on a 2xx answer."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return True, f"{url}: {response.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: {exc.code} {exc.read(500).decode(errors='replace').strip()}"
    except (OSError, ValueError) as exc:
        return False, f"{url}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vigil-healthcheck", description=__doc__.split("\n")[0])
    parser.add_argument("url", nargs="?", help="check this URL instead of finding the process")
    parser.add_argument("--pid", type=int, help="the Vigil process to check (default: found)")
    args = parser.parse_args(argv)
    url = args.url
    if url is None:
        pid = args.pid if args.pid is not None else find_vigil()
        vigil = None if pid is None else vigil_argv(pid)
        if pid is None or vigil is None:
            print("vigil-healthcheck: no vigil process found", file=sys.stderr)
            return 1
        try:
            url = health_url(vigil, lambda path: seen_by(pid, path))
        except (OSError, VigilError, SystemExit) as exc:
            print(f"vigil-healthcheck: cannot tell process {pid}'s address: {exc}",
                  file=sys.stderr)
            return 1
        if url is None:
            print(f"vigil-healthcheck: process {pid} (vigil {' '.join(vigil[:1])}) serves no "
                  "HTTP; it runs, so it is healthy")
            return 0
    healthy, seen = check(url)
    print(f"vigil-healthcheck: {seen}", file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
