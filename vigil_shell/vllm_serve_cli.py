"""``vigil vllm-serve``: run ``vllm serve`` for a pool's launch profile, on this machine.

It replaces the current process with vLLM (``os.execv``) once two things are true: the
``vllm`` package is importable (``pip install 'vigil[vllm]'``) and an NVIDIA GPU is present
(``nvidia-smi -L`` lists one, or ``/dev/nvidia0`` exists). Otherwise it exits 2 and says which
is missing. This is the only module that touches vLLM; it never imports it (``find_spec``
answers whether it could be), and runs it as its own process.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from serving.vllm_args import VllmCommand
from vigil.errors import LaunchError
from vigil_shell.vllm_args_cli import add_common_arguments, command_from_args

__all__ = ["add_arguments", "gpu_present", "missing_requirements", "run", "vllm_installed"]

_INSTALL_HINT = "pip install 'vigil[vllm]'"


def vllm_installed() -> bool:
    """Whether the ``vllm`` package can be imported here (found without importing it: importing
    vLLM loads torch and CUDA, seconds of work, just to answer yes)."""
    return importlib.util.find_spec("vllm") is not None


def gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible: ``nvidia-smi -L`` lists one, or ``/dev/nvidia0``."""
    exe = shutil.which("nvidia-smi")
    if exe is not None:
        try:
            out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10,
                                 check=False)
        except (OSError, subprocess.TimeoutExpired):
            out = None
        if out is not None and out.returncode == 0 and "GPU " in out.stdout:
            return True
    return Path("/dev/nvidia0").exists()


def missing_requirements(*, installed: Callable[[], bool] = vllm_installed,
                         gpu: Callable[[], bool] = gpu_present) -> list[str]:
    """What keeps vLLM from running here, one sentence each (empty: nothing)."""
    missing = []
    if not installed():
        missing.append(f"the vllm package is not installed in {sys.executable} "
                       f"(install it with: {_INSTALL_HINT})")
    if not gpu():
        missing.append("no NVIDIA GPU found (`nvidia-smi -L` lists none and /dev/nvidia0 "
                       "does not exist); vLLM needs a CUDA GPU")
    return missing


def _vllm_executable() -> list[str]:
    """How to start vLLM's CLI: its ``vllm`` script next to this Python, on PATH, or the
    module entry point."""
    beside = Path(sys.executable).with_name("vllm")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("vllm")
    if found:
        return [found]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``vigil vllm-serve`` (those of ``vigil vllm-args`` but ``--json``)."""
    add_common_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Exec ``vllm serve`` for ``--pool``; ``LaunchError`` (exit 2) when it cannot run here."""
    command: VllmCommand = command_from_args(args)  # a bad config or pool fails first
    missing = missing_requirements()
    if missing:
        raise LaunchError("cannot start vLLM here: " + "; ".join(missing)
                          + f". The command it would run: {command.shell()}")
    for note in command.notes:
        print(f"# note: {note}", file=sys.stderr)
    argv = _vllm_executable() + command.argv[1:]  # argv[0] is "vllm"
    print(f"vigil vllm-serve: exec {shlex.join(argv)}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return 0  # pragma: no cover - execv does not return
