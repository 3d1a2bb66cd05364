"""docs/configuration.md is generated from the config models and the example's comments."""

from __future__ import annotations

from pathlib import Path

from vigil_shell.config_reference import example_comments, reference_markdown

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"


def test_the_committed_reference_is_up_to_date() -> None:
    assert DOC.read_text() == reference_markdown(), (
        "docs/configuration.md is stale: run "
        "`.venv/bin/python -m vigil_shell.config_reference > docs/configuration.md`"
    )


def test_every_key_has_a_type_a_default_and_a_meaning() -> None:
    rows = [line for line in reference_markdown().splitlines()
            if line.startswith("| `")]
    assert len(rows) > 100
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 4 and all(cells), row


def test_durations_are_shown_in_prometheus_syntax_and_comments_are_parsed() -> None:
    text = reference_markdown()
    assert "| `raw_retention` | duration (s) | `2d` |" in text
    assert "| `budget_low_ratio` | ratio 0-1 | `0.1` |" in text
    assert '| `promql_semantics` | "auto" \\| "2" \\| "3" | `"auto"` |' in text
    keys, sections = example_comments(
        "[a]  # the a table\nx = 1  # an x\n# y = 2  # a commented y\n[[b.c]]\nz = 3\n")
    assert keys == {"a.x": "an x", "a.y": "a commented y"}
    assert sections == {"a": "the a table"}
