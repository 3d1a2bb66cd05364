"""Golden files: a config in, exactly these files out, byte for byte, run after run.

Each folder under ``tests/golden/rules/`` holds a ``vigil.toml`` and the files ``vigil rules
prometheus --out`` and ``vigil rules keda --out`` write from it. A change to the generator shows
up here as a diff to review; after reviewing, regenerate with::

    VIGIL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_rules_golden.py

The generated files are also what ``tests/test_rules_promtool.py`` feeds to promtool.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import pytest

from alerts.rules.keda import generate_keda
from alerts.rules.pipeline import generate
from vigil.config import load_config
from vigil.conventions import FILE_KEDA

GOLDEN = Path(__file__).resolve().parent / "golden" / "rules"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "vigil.toml").is_file())
UPDATE = os.environ.get("VIGIL_UPDATE_GOLDEN") == "1"


def generated(case: str) -> dict[str, str]:
    """File name -> text for one golden case."""
    config = load_config(GOLDEN / case / "vigil.toml")
    files = generate(config).files()
    files[FILE_KEDA] = generate_keda(config).text()
    return files


def test_there_are_golden_cases() -> None:
    assert CASES == ["defaults", "fleet", "kubernetes"]


@pytest.mark.parametrize("case", CASES)
def test_files_equal_the_golden_files(case: str) -> None:
    folder = GOLDEN / case
    files = generated(case)
    if UPDATE:
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
    expected = {p.name for p in folder.iterdir() if p.name != "vigil.toml"}
    assert set(files) == expected
    for name, text in files.items():
        want = (folder / name).read_text(encoding="utf-8")
        if text != want:
            diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                                f"golden/{case}/{name}", "generated", n=2))
            pytest.fail(f"{name} differs from the golden file (VIGIL_UPDATE_GOLDEN=1 "
                        f"regenerates it after review):\n{diff[:6000]}")


@pytest.mark.parametrize("case", CASES)
def test_output_is_byte_stable_and_carries_no_version_or_date(case: str) -> None:
    first, second = generated(case), generated(case)
    assert first == second
    for name, text in first.items():
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), name  # no dates
        assert "0.1.0" not in text, name  # no Vigil version
        assert str(GOLDEN) not in text, name  # no path of the config file
        assert text.endswith("\n") and not text.endswith("\n\n"), name
        assert all(line == line.rstrip() for line in text.splitlines()), name
