"""The container image (``deploy/Containerfile``) for its test: the build, and Vigil's processes
run inside the image with buildah.

The image is built by ``make image-test-build``: the offline base (``deploy/image/
offline-base.sh``, Debian's archive, no registry) and then ``make image`` on it with buildah,
into a vfs store of its own under ``IMAGE_TEST_DIR``, which writes ``build.log`` and
``build.status`` (``EXIT_CODE SECONDS``) there. ``make test`` starts that build in the
background, in a folder of its own, and sets ``VIGIL_IMAGE_TEST_DIR``: the test then waits for
``build.status``. Without the variable the test builds the image itself, in a temporary folder
under ``/var/tmp`` that it removes afterwards (a few minutes); with it set by hand to the folder
of a finished ``make image-test-build IMAGE_TEST_DIR=...``, the test reuses that build.

Processes run with ``buildah run --isolation chroot``, which needs no OCI runtime (none is
installed with buildah here, and podman is not available): no network namespace, so a server
inside answers on the host's loopback, and the host's simulated replica is reachable from
inside; no PID namespace either, so the processes inside are visible in the host's ``/proc``.
``buildah run`` has no read-only switch, so every top-level folder of the image's root is
bind-mounted over itself read-only (``-v DIR:/DIR:ro``; buildah mounts them parents first, so
the data folder's writable bind lands on top of ``/var``'s). Only ``/`` itself and ``/run`` stay
writable (buildah creates its ``/run/.containerenv`` mount point there; neither is writable by
the image's user anyway); a snapshot of the root before and after (``snapshot``) shows that
nothing was written there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import in_ci, require_binary

ROOT = Path(__file__).resolve().parents[2]
#: The image ``make image-test-build`` tags (the Makefile's ``IMAGE_TEST``).
IMAGE = "localhost/vigil:test"
#: Where ``make test`` says its background build writes (the Makefile's ``IMAGE_TEST_DIR``).
DIR_ENV = "VIGIL_IMAGE_TEST_DIR"
#: Where the test builds when ``DIR_ENV`` is unset: a folder of its own in it, removed after.
#: Not pytest's temporary folders: a vfs store is about 1 GB, and pytest keeps three runs'.
BUILD_PARENT = Path("/var/tmp")
#: How long the build may take (a bound on the wait, not a measurement): the offline base is
#: about half a minute to two, the image one to three on a busy 2-core machine.
BUILD_TIMEOUT_S = 1200.0
#: The image's user and group (deploy/Containerfile).
UID = GID = 10001
#: The data folder inside the image.
DATA = "/var/lib/vigil"
#: The venv's ``vigil`` script: the second word of a Vigil process's command line.
VIGIL_SCRIPT = "/opt/vigil/bin/vigil"
#: Top-level entries of the root left writable: the kernel's file systems, which buildah
#: mounts itself, and ``/run``, where it creates its ``/run/.containerenv`` mount point.
NOT_READ_ONLY = frozenset({"dev", "proc", "sys", "run"})


@dataclass(frozen=True)
class Build:
    """A finished build of the image: its folder and how long it took."""

    folder: Path
    seconds: int

    @property
    def storage_conf(self) -> Path:
        return self.folder / "storage.conf"

    def env(self) -> dict[str, str]:
        """The environment under which buildah uses the build's store."""
        return {**os.environ, "CONTAINERS_STORAGE_CONF": str(self.storage_conf)}

    def buildah(self, *args: str, check: bool = True, timeout: float = 120.0
                ) -> subprocess.CompletedProcess[str]:
        """``buildah ARGS`` on the build's store; stdout and stderr captured as text."""
        result = subprocess.run(["buildah", *args], env=self.env(), capture_output=True,
                                text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)}: exit {result.returncode}\n"
                                 f"{result.stdout}{result.stderr}")
        return result


def _end(message: str) -> None:
    """Skip, or fail under CI: there a missing tool or right is a broken machine."""
    if in_ci():
        pytest.fail(f"{message}; CI must run this test", pytrace=False)
    pytest.skip(message)


def _log_tail(folder: Path, lines: int = 60) -> str:
    log = folder / "build.log"
    text = log.read_text(errors="replace") if log.exists() else "(no build.log)"
    return "\n".join(text.splitlines()[-lines:])


def _wait_for_status(folder: Path, timeout_s: float) -> tuple[int, int]:
    """``(exit code, seconds)`` from ``build.status`` once the build writes it."""
    status = folder / "build.status"
    deadline = time.monotonic() + timeout_s
    while not status.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {status} within {timeout_s:g} s; the build's log "
                                 f"ends:\n{_log_tail(folder)}")
        time.sleep(1.0)
    code, seconds = status.read_text().split()
    return int(code), int(seconds)


@contextmanager
def built_image() -> Iterator[Build]:
    """The image of this tree: the build ``make test`` runs in the background (waited for), or
    one made now with ``make image-test-build`` in a temporary folder, removed at the end
    (buildah and mmdebstrap installed first if missing). Skips, or fails under CI, when the
    tools are missing and cannot be installed, or when not root (mmdebstrap's root mode and
    buildah's store both need it)."""
    if os.geteuid() != 0:
        _end("building the image needs root (mmdebstrap's root mode, buildah's store)")
    given = os.environ.get(DIR_ENV)
    if given:
        yield _finished(Path(given))
        return
    # The Makefile's install steps first, so that a missing tool is told apart from a failed
    # build.
    subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "buildah", "mmdebstrap"],
                   capture_output=True, timeout=600, check=False)
    for tool in ("buildah", "mmdebstrap"):
        require_binary(tool)
    folder = Path(tempfile.mkdtemp(prefix="vigil-image-test.", dir=BUILD_PARENT))
    try:
        subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "image-test-build",
                        f"IMAGE_TEST_DIR={folder}"], capture_output=True,
                       timeout=BUILD_TIMEOUT_S, check=False)
        yield _finished(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _finished(folder: Path) -> Build:
    """The build in ``folder`` once it has ended; AssertionError with its log if it failed."""
    code, seconds = _wait_for_status(folder, BUILD_TIMEOUT_S)
    if code != 0:
        raise AssertionError(f"make image-test-build failed (exit {code}); {folder}/build.log "
                             f"ends:\n{_log_tail(folder)}")
    return Build(folder, seconds)


@dataclass(frozen=True)
class Container:
    """A working container of the image, its root file system mounted at ``root``."""

    build: Build
    name: str
    root: Path

    def read_only_binds(self) -> list[str]:
        """``-v DIR:DIR:ro`` for every top-level folder of the root but ``NOT_READ_ONLY``."""
        args: list[str] = []
        for entry in sorted(self.root.iterdir()):
            if entry.is_dir() and not entry.is_symlink() and entry.name not in NOT_READ_ONLY:
                args += ["-v", f"{entry}:/{entry.name}:ro"]
        return args

    def run_args(self, *command: str, data: Path | None = None,
                 config: Path | None = None) -> list[str]:
        """The ``buildah run`` command line of ``command`` on a read-only root, with ``data``
        as the data folder and ``config``'s folder at ``/etc/vigil`` (read-only)."""
        args = ["buildah", "run", "--isolation", "chroot", *self.read_only_binds()]
        if data is not None:
            args += ["-v", f"{data}:{DATA}"]
        if config is not None:
            args += ["-v", f"{config.parent}:/etc/vigil:ro"]
        return [*args, self.name, "--", *command]

    def run(self, *command: str, data: Path | None = None, config: Path | None = None,
            timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``command`` inside to its end (read-only root); output captured as text."""
        return subprocess.run(self.run_args(*command, data=data, config=config),
                              env=self.build.env(), capture_output=True, text=True,
                              timeout=timeout, check=False)

    def start(self, *command: str, data: Path, config: Path, log: Path) -> Started:
        """Start ``command`` inside (read-only root), its output into ``log``."""
        with log.open("wb") as out:
            proc = subprocess.Popen(self.run_args(*command, data=data, config=config),
                                    env=self.build.env(), stdout=out,
                                    stderr=subprocess.STDOUT)
        return Started(proc, log)


@contextmanager
def container(build: Build) -> Iterator[Container]:
    """A working container of ``IMAGE`` with its root mounted; removed at the end."""
    name = build.buildah("from", "--pull-never", IMAGE).stdout.strip()
    try:
        root = Path(build.buildah("mount", name).stdout.strip())
        yield Container(build, name, root)
    finally:
        build.buildah("rm", name, check=False)


@dataclass
class Started:
    """A ``buildah run`` started in the background, and the Vigil process it runs."""

    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def vigil_pid(self, timeout_s: float = 30.0) -> int:
        """The PID (in the host's view) of the ``vigil`` process that this ``buildah run``
        started: a descendant whose command line is ``PYTHON /opt/vigil/bin/vigil ...``."""
        deadline = time.monotonic() + timeout_s
        while True:
            for pid in descendants(self.proc.pid):
                if is_vigil(pid):
                    return pid
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no vigil process under buildah run (exit "
                                     f"{self.proc.poll()}):\n{self.output()[-3000:]}")
            time.sleep(0.1)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM to the Vigil process (``buildah run`` would kill it outright instead of
        passing the signal on), then wait for ``buildah run`` to end; SIGKILL to whatever of
        it is left after ``timeout_s``. Returns the exit code ``buildah run`` passed on."""
        tree = descendants(self.proc.pid)
        for pid in tree:
            if is_vigil(pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            for pid in [self.proc.pid, *tree]:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait(10)
            return None


def cmdline(pid: int) -> list[str]:
    """Process ``pid``'s command line ([] once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def is_vigil(pid: int) -> bool:
    """Whether process ``pid`` is a Vigil process of the image: ``PYTHON /opt/vigil/bin/vigil
    ...`` (buildah's own helper between it and ``buildah run`` shows the same arguments after
    its name, ``buildah-chroot-exec``)."""
    argv = cmdline(pid)
    return argv[1:2] == [VIGIL_SCRIPT] and os.path.basename(argv[0]).startswith("python")


def descendants(pid: int) -> list[int]:
    """Every live descendant of process ``pid``, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError, ValueError, IndexError):
                # The parent is the second field after the command name, which may hold
                # spaces and parentheses: split after its closing one.
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in sorted(children.get(todo.pop(0), [])):
            found.append(child)
            todo.append(child)
    return found


def ids(pid: int) -> tuple[set[int], set[int]]:
    """The (real, effective, saved, file-system) user and group IDs of process ``pid``."""
    fields = {line.split(":", 1)[0]: line.split(":", 1)[1].split()
              for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line}
    return {int(u) for u in fields["Uid"]}, {int(g) for g in fields["Gid"]}


#: (mode, size, modification time in ns) of each path under a root.
Snapshot = dict[str, tuple[int, int, int]]


def snapshot(root: Path) -> Snapshot:
    """Every file and folder under ``root`` (symbolic links not followed; ``/proc``, ``/sys``
    and ``/dev``, where buildah mounts the kernel's, left out), relative to ``root``."""
    out: Snapshot = {}
    todo = [root]
    while todo:
        folder = todo.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                rel = os.path.relpath(entry.path, root)
                if rel in ("proc", "sys", "dev"):
                    continue
                st = entry.stat(follow_symlinks=False)
                out[rel] = (st.st_mode, st.st_size, st.st_mtime_ns)
                if entry.is_dir(follow_symlinks=False):
                    todo.append(Path(entry.path))
    return out


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """The paths added, removed or changed between two snapshots."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def data_folder(parent: Path) -> Path:
    """An empty data folder owned by the image's user, mode 0750 as in the image (what a
    volume with ``fsGroup`` gives, or docker's copy of the image's folder into a new one)."""
    folder = parent / "data"
    folder.mkdir()
    os.chown(folder, UID, GID)
    folder.chmod(0o750)
    return folder

