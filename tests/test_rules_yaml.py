"""The byte-stable YAML writer: what it writes reads back (PyYAML) as exactly what it was given.

PyYAML implements YAML 1.1, the stricter reader for plain scalars (``yes``, ``on``, ``1:20``,
``1_000`` are not strings there), so a string that survives it also survives Go's yaml
(Prometheus, Kubernetes).
"""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from alerts.rules.yaml_emitter import dump, dump_all, scalar

TRICKY_STRINGS = [
    "", " ", "a b", " leading", "trailing ", "yes", "No", "ON", "off", "y", "n", "true",
    "False", "null", "~", "Null", "1", "1.5", "-3", "0x1F", "0o17", "1_000", "1:20",
    "190:20:30", "2026-11-30", "1e5", ".inf", "-.inf", ".nan", "30s", "1h30m", "500ms", "5m1",
    "#comment", "a #b", "a: b", "a:b", "key:", "- item", "-", "?", "? x", "[x]", "{x}", "x,y",
    "*alias", "&anchor", "!tag", "%directive", "@at", "`tick", "'single'", '"double"',
    "it's", 'say "hi"', "back\\slash", "tab\there", "new\nline", "crlf\r\n", "nul\x00",
    "bell\x07", "é", "模型", "line\u2028sep", "nel\x85", "emoji 🙂", "c1\n\x80",
    "tab\nin\tblock", "bom\ufeff",
    'sum by (pool) (rate(x{pool="chat", le="+Inf"}[5m])) > 0',
    "multi\nline\n  indented", "\nleading newline", "trailing newline\n", "  two spaces",
    "keda.sh/v1alpha1", "slo:sli_error:ratio_rate5m", "vllm:${1}", "vllm_(.+)", "{{ $labels.x }}",
]


def _roundtrip(value: object) -> object:
    return yaml.safe_load(dump({"v": value}))["v"]


@pytest.mark.parametrize("text", TRICKY_STRINGS)
def test_strings_read_back_as_the_same_string(text: str) -> None:
    assert _roundtrip(text) == text


@pytest.mark.parametrize("value", [0, 1, -7, 10**12, 0.5, 0.1, 1e-05, 1e21, -2.5e-300,
                                   0.17600000000000005, 6.88, True, False])
def test_numbers_and_bools_read_back_exactly(value: object) -> None:
    got = _roundtrip(value)
    assert got == value and type(got) is type(value)


def test_floats_always_carry_a_dot() -> None:
    assert scalar(1e-05) == "1.0e-05"
    assert scalar(1e21) == "1.0e+21"
    assert scalar(2.5) == "2.5"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused(value: float) -> None:
    with pytest.raises(ValueError, match="non-finite"):
        dump({"v": value})


def test_unsupported_types_are_refused() -> None:
    with pytest.raises(TypeError):
        dump({"v": None})
    with pytest.raises(TypeError):
        dump({"v": {1: "x"}})  # type: ignore[dict-item]


def test_layout_is_that_of_prometheus_docs() -> None:
    doc = {"groups": [{"name": "g", "interval": "30s", "rules": [
        {"record": "a:b:c", "expr": "sum(x)\n/\nsum(y)", "labels": {"slo": "s"}},
        {"alert": "X", "expr": 'up{pool="p"} == 0', "annotations": {}},
    ]}], "empty": []}
    text = dump(doc, comment="Header line one\nline two")
    assert text == (
        "# Header line one\n"
        "# line two\n"
        "groups:\n"
        "- name: g\n"
        "  interval: 30s\n"
        "  rules:\n"
        "  - record: a:b:c\n"
        "    expr: |-\n"
        "      sum(x)\n"
        "      /\n"
        "      sum(y)\n"
        "    labels:\n"
        "      slo: s\n"
        "  - alert: X\n"
        "    expr: 'up{pool=\"p\"} == 0'\n"
        "    annotations: {}\n"
        "empty: []\n"
    )
    assert yaml.safe_load(text) == doc


def test_dump_all_writes_one_document_per_object() -> None:
    docs = [{"a": 1}, {"b": [{"c": "d"}, ["x", "y"]]}]
    text = dump_all(docs, comment="c")
    assert text.startswith("# c\n---\n")
    assert list(yaml.safe_load_all(text)) == docs


_scalars = st.one_of(
    st.text(max_size=30), st.integers(-10**18, 10**18), st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
)
_keys = st.text(min_size=1, max_size=12)
_trees = st.recursive(
    _scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(_keys, children, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _trees, max_size=5))
def test_any_tree_reads_back_identically(tree: dict[str, object]) -> None:
    text = dump(tree)
    assert yaml.safe_load(text) == (tree or None)
    assert dump(tree) == text  # byte-stable
