"""`vigil dashboard`: the command it runs, the refusal to expose an unauthenticated
dashboard (exit code 2, with a message that says how to configure access), and a Streamlit
server that never outlives the command (SIGTERM, SIGINT, SIGHUP, and SIGKILL of the command)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from support.dashboard_seed import config_toml
from support.loopback import free_port

from vigil.config import parse_config
from vigil_shell.children import port_free
from vigil_shell.cli import main
from vigil_shell.dashboard_cli import APP_PATH, add_arguments, listen_address, streamlit_command

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0
#: The command's own bound (vigil_shell.dashboard_cli.STOP_GRACE) plus room for a loaded machine.
STOP_TIMEOUT_S = 20.0


def _config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "vigil.toml"
    path.write_text(config_toml() + extra)
    return path


def test_registered_as_vigil_dashboard(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["dashboard", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out and "--listen" in out and "--at" in out
    # the old spellings still work, but are not offered
    assert "--address" not in out and "--port" not in out


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vigil dashboard")
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flags() -> None:
    args = _parse("-c", "f.toml", "--listen", "[::1]:9000", "--at", "1795000000")
    assert (args.config, args.listen, args.at) == ("f.toml", "[::1]:9000", 1_795_000_000.0)
    assert listen_address(args, parse_config({})) == ("::1", 9000)


def test_listen_defaults_to_the_config() -> None:
    config = parse_config({"dashboard": {"address": "127.0.0.2", "port": 8600}})
    assert listen_address(_parse("-c", "f.toml"), config) == ("127.0.0.2", 8600)


def test_old_address_and_port_flags_still_work_with_a_note(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse("-c", "f.toml", "--port", "9000", "--address", "::1")
    assert listen_address(args, parse_config({})) == ("::1", 9000)
    err = capsys.readouterr().err
    assert "--port is deprecated; use --listen" in err
    assert "--address is deprecated; use --listen" in err


def test_streamlit_command_is_headless_without_usage_statistics() -> None:
    cmd = streamlit_command("127.0.0.1", 8600)
    assert cmd[:5] == [sys.executable, "-m", "dashboard.warm", "run", str(APP_PATH)]
    opts = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert opts["--server.headless"] == "true"
    assert opts["--server.address"] == "127.0.0.1"
    assert opts["--server.port"] == "8600"
    assert opts["--browser.gatherUsageStats"] == "false"
    assert APP_PATH.exists() and APP_PATH.name == "app.py"


@pytest.mark.parametrize("address", ["0.0.0.0", "10.1.2.3", "::"])
def test_refuses_to_bind_elsewhere_without_authentication(
        tmp_path: Path, address: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no .streamlit/secrets.toml here
    monkeypatch.setenv("HOME", str(tmp_path))
    listen = f"[{address}]:8501" if ":" in address else f"{address}:8501"
    code = main(["dashboard", "--config", str(_config(tmp_path)), "--listen", listen])
    assert code == 2
    err = capsys.readouterr().err
    assert f"binding the dashboard to {address}" in err
    assert "dashboard.address" in err
    assert 'password_env = "VIGIL_DASHBOARD_PASSWORD"' in err and "st.login" in err


def test_refusal_names_the_unset_password_variable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("VIGIL_TEST_DASH_PW", "")
    config = _config(tmp_path, '\n[dashboard]\naddress = "0.0.0.0"\n'
                               'password_env = "VIGIL_TEST_DASH_PW"\n')
    assert main(["dashboard", "--config", str(config)]) == 2
    assert "export VIGIL_TEST_DASH_PW=" in capsys.readouterr().err


def test_bad_port_and_bad_config_are_errors(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "--config", str(_config(tmp_path)),
                 "--listen", "127.0.0.1:70000"]) == 2
    assert "--listen must be HOST:PORT with a port 1-65535" in capsys.readouterr().err
    assert main(["dashboard", "--config", str(_config(tmp_path)), "--port", "70000"]) == 2
    assert "out of range" in capsys.readouterr().err
    assert main(["dashboard", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "file not found" in capsys.readouterr().err


# --- the Streamlit server stops with the command ---------------------------------------------
def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")"
                if int(stat.rpartition(")")[2].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _until(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} after {timeout:.0f}s")
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_streamlit_stops_with_the_command(tmp_path: Path, sig: int) -> None:
    port = free_port()
    log = tmp_path / "dashboard.log"
    with log.open("wb") as out:
        # Its own session, as from a terminal: only the signal the test sends reaches it.
        proc = subprocess.Popen(
            [sys.executable, "-m", "vigil_shell.cli", "dashboard", "--config",
             str(_config(tmp_path)), "--listen", f"127.0.0.1:{port}"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    streamlit: list[int] = []
    try:
        def serving() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"vigil dashboard exited: {log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2,
                                 trust_env=False).text == "ok"
            return False

        _until("no answer", serving, START_TIMEOUT_S)
        streamlit = _children(proc.pid)
        assert len(streamlit) == 1, streamlit
        os.kill(proc.pid, sig)
        proc.wait(timeout=STOP_TIMEOUT_S)
        if sig != signal.SIGKILL:
            assert proc.returncode == 0, log.read_text()[-3000:]
        _until("Streamlit still runs", lambda: not _alive(streamlit[0]), STOP_TIMEOUT_S)
        _until(f"port {port} still bound", lambda: port_free(port), STOP_TIMEOUT_S)
    finally:
        for pid in [proc.pid, *streamlit]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
