"""`vigil dashboard`: the command it runs, and the refusal to expose an unauthenticated
dashboard (exit code 2, with a message that says how to configure access)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from test_dashboard_seed import config_toml

from dashboard.cli import APP_PATH, add_arguments, streamlit_command
from vigil.cli import main


def _config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "vigil.toml"
    path.write_text(config_toml() + extra)
    return path


def test_registered_as_vigil_dashboard(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["dashboard", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out and "--address" in out and "--port" in out and "--at" in out


def test_flags() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", "f.toml", "--port", "9000", "--address", "::1",
                              "--at", "1795000000"])
    assert (args.config, args.port, args.address, args.at) == ("f.toml", 9000, "::1",
                                                                1_795_000_000.0)


def test_streamlit_command_is_headless_without_usage_statistics() -> None:
    cmd = streamlit_command("127.0.0.1", 8600)
    assert cmd[:5] == [sys.executable, "-m", "streamlit", "run", str(APP_PATH)]
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
    code = main(["dashboard", "--config", str(_config(tmp_path)), "--address", address])
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
    assert main(["dashboard", "--config", str(_config(tmp_path)), "--port", "70000"]) == 2
    assert "out of range" in capsys.readouterr().err
    assert main(["dashboard", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "file not found" in capsys.readouterr().err
