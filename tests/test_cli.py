"""The ``vigil`` command as a whole: options spelled once (``vigil_shell.options``), a missing
extra named in one line with exit code 2 (``vigil_shell.extras``), ``--help`` without any extra."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from vigil.errors import ConfigError, ExtraMissingError
from vigil_shell.cli import main
from vigil_shell.extras import EXTRAS, extra_of, missing_extra, require_modules
from vigil_shell.options import (
    add_log_level_option,
    add_prometheus_url_option,
    duration_arg,
    parse_listen,
    positive_duration_arg,
)

REPO = Path(__file__).resolve().parent.parent
#: Every optional module, blocked as if no extra were installed.
BLOCKED = sorted({m for modules in EXTRAS.values() for m in modules})


def _vigil_without_extras(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``vigil ARGV`` in a Python where importing any extra's module fails, as after a core
    install (``sys.modules[name] = None`` from a sitecustomize on PYTHONPATH)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None\n")
    return subprocess.run(
        [sys.executable, "-m", "vigil_shell.cli", *argv], cwd=REPO, capture_output=True,
        text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)})


def test_help_works_without_any_extra(tmp_path: Path) -> None:
    for argv in (["--help"], ["collect", "--help"], ["gateway", "--help"]):
        done = _vigil_without_extras(tmp_path, *argv)
        assert done.returncode == 0, (argv, done.stderr)
        assert "usage: vigil" in done.stdout


@pytest.mark.parametrize(("argv", "extra", "module"), [
    (["dashboard", "--config", "x"], "dashboard", "streamlit"),
    (["gateway", "--config", "x"], "gateway", "uvicorn"),
    (["sim", "--replicas", "1"], "gateway", "uvicorn"),
    (["demo", "--duration", "1"], "gateway", "fastapi"),
])
def test_a_missing_extra_is_one_line_and_exit_2(tmp_path: Path, argv: list[str], extra: str,
                                                module: str) -> None:
    done = _vigil_without_extras(tmp_path, *argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"vigil {argv[0]}: needs the {extra!r} extra (pip install "
                           f"'vigil[{extra}]'): No module named {module!r}\n")


def test_the_sitecustomize_really_blocks(tmp_path: Path) -> None:
    # Without this the test above would pass on a machine where the extras are installed
    # for the wrong reason (the hook never ran).
    done = _vigil_without_extras(tmp_path, "dashboard", "--config", "x")
    assert "No module named 'streamlit'" in done.stderr


def test_extras_table() -> None:
    assert extra_of("streamlit") == "dashboard"
    assert extra_of("fastapi.responses") == "gateway"
    assert extra_of("sentence_transformers") == "semantic"
    assert extra_of("vllm") == "vllm"
    assert extra_of("pandas") is None and extra_of(None) is None
    assert missing_extra(ModuleNotFoundError("x", name="pandas")) is None
    error = missing_extra(ModuleNotFoundError("x", name="uvicorn.config"))
    assert isinstance(error, ExtraMissingError) and error.exit_code == 2
    assert (error.extra, error.module) == ("gateway", "uvicorn")


def test_require_modules() -> None:
    require_modules("json", "argparse")
    with pytest.raises(ModuleNotFoundError) as exc:
        require_modules("json", "vigil_no_such_module")
    assert exc.value.name == "vigil_no_such_module"


# --- options spelled once -------------------------------------------------------------------
def test_log_level_is_one_of_four_in_any_case(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="vigil")
    add_log_level_option(parser)
    assert parser.parse_args([]).log_level == "INFO"
    assert parser.parse_args(["--log-level", "debug"]).log_level == "DEBUG"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--log-level", "verbose"])
    assert exc.value.code == 2
    assert "invalid choice: 'VERBOSE'" in capsys.readouterr().err


def test_a_bad_log_level_stops_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--log-level", "LOUD", "collect", "--config", "x"])
    assert exc.value.code == 2
    assert "--log-level" in capsys.readouterr().err


def test_prometheus_is_an_alias_of_prometheus_url(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="vigil slo status")
    add_prometheus_url_option(parser, help="the server")
    assert parser.parse_args([]).prometheus_url is None
    assert parser.parse_args(["--prometheus-url", "http://a"]).prometheus_url == "http://a"
    assert capsys.readouterr().err == ""
    assert parser.parse_args(["--prometheus", "http://b"]).prometheus_url == "http://b"
    assert capsys.readouterr().err == ("vigil slo status: --prometheus is deprecated; "
                                       "use --prometheus-url\n")
    assert "--prometheus " not in parser.format_help()


def test_every_command_spells_prometheus_url_the_same(
        capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["slo", "status", "--help"], ["rules", "keda", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "--prometheus-url URL" in capsys.readouterr().out, argv


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:8080") == ("::1", 8080)
    assert parse_listen("[::1]:0", allow_port_zero=True) == ("::1", 0)
    for bad in ("8080", "host:", ":8080", "h:0", "h:65536", "h:x"):
        with pytest.raises(ConfigError, match="--listen must be HOST:PORT"):
            parse_listen(bad)


def test_durations_take_units_or_seconds() -> None:
    assert duration_arg("90") == 90.0
    assert duration_arg("1.5") == 1.5
    assert duration_arg("1m30s") == 90.0
    assert duration_arg("0") == 0.0
    for bad in ("-1", "nan", "inf", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration_arg(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="more than 0"):
        positive_duration_arg("0s")
