"""collector.exposition: identical to prometheus_client 0.26 on valid input, strict otherwise.

Identity is checked against the library itself -- Metric.__eq__ plus sample by sample: order,
label order, value types (int vs float), timestamps, exemplars -- on every fixture the library
can parse, on hand-written edge cases and on a seeded batch of random expositions.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as library_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as library_text
from prometheus_client.samples import Timestamp
from support.exposition import assert_identical

from collector.exposition import normalise_vllm_names, parse, parse_openmetrics, parse_text
from vigil.errors import ParseError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEXT_FIXTURES = [
    "vllm_v1_metrics_sample.txt",
    "vllm_v0_metrics_sample.txt",
    "dcgm_exporter_sample.txt",
]
OM_FIXTURE = "vllm_v1_metrics_sample.openmetrics.txt"
CONSOLE_FIXTURE = "vllm_repo_docs_usage_metrics_md_console_example.txt"
OM_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def unescaped_names(openmetrics: str) -> str:
    """The OpenMetrics fixture with sample names back in their `vllm:` spelling."""
    return re.sub(r"(?m)^vllm_", "vllm:", openmetrics)








def same_as_library(text: str) -> list[Metric]:
    ours = parse_text(text)
    assert_identical(ours, list(library_text(text)))
    return ours


def same_as_library_om(text: str) -> list[Metric]:
    ours = parse_openmetrics(text)
    assert_identical(ours, list(library_openmetrics(text)))
    return ours


def parse_error(body: str | bytes, **kwargs: object) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse(body, **kwargs)  # type: ignore[arg-type]
    return info.value


# --- fixtures ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", TEXT_FIXTURES)
def test_fixture_identical_to_library(name):
    families = same_as_library(fixture(name))
    assert families and all(f.samples for f in families)


@pytest.mark.parametrize("name", TEXT_FIXTURES)
def test_fixture_through_parse_bytes(name):
    body = (FIXTURES / name).read_bytes()
    assert parse(body, content_type="text/plain; version=0.0.4") == parse_text(fixture(name))


def test_vllm_fixture_label_dicts_are_not_shared():
    families = parse_text(fixture("vllm_v1_metrics_sample.txt"))
    dicts = [s.labels for f in families for s in f.samples]
    assert len({id(d) for d in dicts}) == len(dicts) == 507


def test_openmetrics_fixture_library_rejects_the_1177_quirk():
    with pytest.raises(ValueError, match="Clashing name"):
        list(library_openmetrics(fixture(OM_FIXTURE)))


def test_openmetrics_fixture_equals_library_on_colon_spelling():
    text = fixture(OM_FIXTURE)
    library = list(library_openmetrics(unescaped_names(text)))
    assert_identical(parse_openmetrics(text), library)
    assert_identical(parse_openmetrics(unescaped_names(text)), library)


def test_openmetrics_quirk_matches_text_format_counters_and_gauges():
    om = normalise_vllm_names(parse(fixture(OM_FIXTURE), content_type=OM_CONTENT_TYPE))
    text = parse(fixture("vllm_v1_metrics_sample.txt"))
    assert not any(s.name.startswith("vllm_") for f in om for s in f.samples)
    picked = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in om if f.type in ("counter", "gauge") for s in f.samples
    }
    in_text = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in text for s in f.samples
    }
    assert len(picked) > 100
    assert all(in_text[key] == value for key, value in picked.items())
    assert {k: in_text[k] for k in picked} == picked


def test_console_example_is_rejected_verbatim_by_both():
    text = fixture(CONSOLE_FIXTURE)
    with pytest.raises(ValueError):
        list(library_text(text))
    err = parse_error(text)
    assert err.line == 1 and "invalid metric name" in err.reason


def test_console_example_without_prompt_is_a_truncated_histogram():
    lines = [
        line for line in fixture(CONSOLE_FIXTURE).split("\n")
        if not line.startswith("$ ") and line.strip() != "..."
    ]
    body = "\n".join(lines)
    assert list(library_text(body))  # the library takes it: a histogram with no +Inf bucket
    err = parse_error(body)
    last_bucket = max(i for i, line in enumerate(lines, 1) if "_bucket{" in line)
    assert err.line == last_bucket and 'no le="+Inf" bucket' in err.reason


# --- text format edge cases, each compared with the library -------------------------------


def test_label_escaping():
    families = same_as_library(
        '# TYPE m gauge\n'
        'm{a="quote \\" here",b="back\\\\slash",c="new\\nline",d="keep \\t and \\x"} 1\n'
        'm{a="{braces},commas=\\"and\\" #hash",b="é😀"} 2\n'
        'm{a="\\\\\\"",b=""} 3\n'
    )
    first = families[0].samples[0].labels
    assert first == {"a": 'quote " here', "b": "back\\slash", "c": "new\nline",
                     "d": "keep \\t and \\x"}


def test_help_escaping():
    families = same_as_library(
        '# HELP m a \\\\ backslash, a \\n newline, a \\" quote kept, \\t kept\n'
        "# TYPE m gauge\nm 1\n"
    )
    assert families[0].documentation == 'a \\ backslash, a \n newline, a \\" quote kept, \\t kept'


@pytest.mark.parametrize("value", ["+Inf", "-Inf", "NaN", "inf", "nan", "Infinity", "-infinity"])
def test_nan_inf(value):
    families = same_as_library(f"# TYPE m gauge\nm {value}\nm{{a=\"x\"}} {value}\n")
    assert all(isinstance(s.value, float) for s in families[0].samples)


@pytest.mark.parametrize("value", ["1", "-5", "+7", "0", "-0", "007", "1.0", "1e3", ".5", "5.",
                                   "-2.5e-3", "1E+06", "123456789012345678901234567890"])
def test_values_keep_int_or_float(value):
    (family,) = same_as_library(f"m {value}\n")
    assert type(family.samples[0].value) is (int if "." not in value and "e" not in value.lower()
                                                else float)


def test_timestamps():
    families = same_as_library(
        "# TYPE m gauge\n"
        'm{a="1"} 1 1700000000123\n'
        'm{a="2"} 2 -5\n'
        'm{a="3"} 3 +17\n'
        'm{a="4"} 4\t1700000000000\n'
    )
    ts = [s.timestamp for s in families[0].samples]
    assert ts == [1700000000.123, -0.005, 0.017, 1700000000.0]  # float seconds, like the library


def test_same_series_at_other_timestamps_is_a_backfill_not_a_duplicate():
    same_as_library("# TYPE m gauge\nm 1 1000\nm 2 2000\nm 3 3000\n")


def test_counter_without_total():
    (family,) = same_as_library("# HELP c requests\n# TYPE c counter\nc 5\nc{a=\"x\"} 6\n")
    assert family.name == "c" and [s.name for s in family.samples] == ["c_total", "c_total"]


def test_counter_with_total():
    (family,) = same_as_library("# TYPE c_total counter\nc_total 5\n")
    assert family.name == "c" and family.samples[0].name == "c_total"


def test_created_lines_are_their_own_gauge_families():
    families = same_as_library(
        "# HELP c_total n\n# TYPE c_total counter\nc_total 5\n"
        "# HELP c_created n\n# TYPE c_created gauge\nc_created 1.7e9\n"
    )
    assert [(f.name, f.type) for f in families] == [("c", "counter"), ("c_created", "gauge")]


def test_created_without_metadata_becomes_untyped_family():
    families = same_as_library("# TYPE c counter\nc_total 5\nc_created 1.7e9\n")
    assert [(f.name, f.type, len(f.samples)) for f in families] == [
        ("c", "counter", 0), ("c_total", "unknown", 1), ("c_created", "unknown", 1)
    ]


def test_untyped():
    families = same_as_library(
        "# TYPE u untyped\nu 1\nu{a=\"b\"} 2\n"
        "# HELP h only help\nh 3\nh{x=\"y\"} 4\n"
    )
    assert [(f.name, f.type, len(f.samples)) for f in families] == [
        ("u", "unknown", 2), ("h", "unknown", 2)
    ]


def test_metrics_without_help_or_type_are_one_family_per_sample():
    families = same_as_library("a 1\nb{x=\"1\"} 2\nb{x=\"2\"} 3\n")
    assert [(f.name, len(f.samples)) for f in families] == [("a", 1), ("b", 1), ("b", 1)]


def test_help_after_type():
    (family,) = same_as_library("# TYPE g gauge\n# HELP g the doc\ng 1\n")
    assert (family.type, family.documentation) == ("gauge", "the doc")


def test_foreign_sample_starts_an_untyped_family():
    families = same_as_library(
        "# TYPE g gauge\ng 1\nother 2\ng_bucket 3\n# TYPE h gauge\nh 4\n"
    )
    assert [(f.name, f.type) for f in families] == [
        ("g", "gauge"), ("other", "unknown"), ("g_bucket", "unknown"), ("h", "gauge")
    ]


def test_summary():
    (family,) = same_as_library(
        "# HELP s lat\n# TYPE s summary\n"
        's{quantile="0.5"} 1.5\ns{quantile="0.99"} 3\ns_count 10\ns_sum 17.5\n'
        's{a="x",quantile="0.5"} 2\ns_count{a="x"} 1\ns_sum{a="x"} 2\n'
    )
    assert family.type == "summary" and len(family.samples) == 7


def test_histogram():
    (family,) = same_as_library(
        "# HELP h lat\n# TYPE h histogram\n"
        'h_bucket{le="0.1"} 1\nh_bucket{le="1"} 3\nh_bucket{le="+Inf"} 4\nh_count 4\nh_sum 2.5\n'
        'h_sum{a="x"} 1\nh_bucket{a="x",le="1"} 1.0\nh_bucket{a="x",le="+Inf"} 2.0\n'
        'h_count{a="x"} 2.0\n'
        'h_bucket{le="-1",b="y"} 0\nh_bucket{le="+Inf",b="y"} 0\n'
    )
    assert family.type == "histogram" and len(family.samples) == 11


def test_histogram_label_order_varies_between_lines():
    same_as_library(
        "# TYPE h histogram\n"
        'h_bucket{a="x",le="1",b="y"} 1\nh_bucket{b="y",le="+Inf",a="x"} 2\n'
        'h_count{b="y",a="x"} 2\n'
    )


def test_bucket_runs_follow_the_library():
    # Runs of buckets broken by a label change, an escape, a timestamp, odd spacing, a float
    # count, an interleaved label set and a second family; each must parse as the library does.
    same_as_library(
        "# TYPE h histogram\n"
        'h_bucket{a="x",le="1",m="p"} 1\nh_bucket{a="x",le="2",m="p"} 2.0\n'
        'h_bucket{a="x",le="+Inf",m="p"} 3\n'
        'h_bucket{a="x",le="1",m="q"} 0\nh_bucket{a="x",le="2",m="q"}  1\n'
        'h_bucket{a="x",le="+Inf",m="q"} 1\n'
        'h_bucket{a="t",le="1"} 1 1000\nh_bucket{a="t",le="+Inf"} 1 1000\n'
        'h_bucket{a="x\\"y",le="1",m="q"} 1\nh_bucket{a="x\\"y",le="+Inf",m="q"} 1\n'
        'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 1\nh_count 1\nh_sum 0.5\n'
        'h_count{a="x",m="p"} 3\nh_count{a="x",m="q"} 1\n'
        "# TYPE k histogram\n"
        'k_bucket{a="x",le="1",m="p"} 1\nk_bucket{a="x",le="+Inf",m="p"} 1\n'
    )


def test_bucket_run_still_validates_each_bucket():
    err = parse_error(
        "# TYPE h histogram\n"
        'h_bucket{a="x",le="1"} 5\nh_bucket{a="x",le="2"} 6\nh_bucket{a="x",le="3"} 4\n'
    )
    assert err.line == 4 and "not cumulative" in err.reason
    err = parse_error("# TYPE h histogram\n" 'h_bucket{le="1"} 1\nh_bucket{le="1"} 1\n')
    assert err.line == 3 and "duplicate series" in err.reason
    err = parse_error("# TYPE h histogram\n" 'h_bucket{le="1"} 1\nh_bucket{le="x"} 1\n')
    assert err.line == 3 and "invalid le label 'x'" in err.reason


def test_repeated_label_sets_get_their_own_dicts():
    families = same_as_library(
        '# TYPE a gauge\na{m="1"} 1\n# TYPE b gauge\nb{m="1"} 2\n# TYPE c gauge\nc{m="1"} 3\n'
    )
    first, second, third = (f.samples[0].labels for f in families)
    first["m"] = "changed"
    assert second == third == {"m": "1"}


def test_blank_lines_comments_and_whitespace():
    same_as_library(
        "\n\n# a comment\n#\n# HELPER not help\n#   TYPE  g   gauge\n  \n"
        "g{ a = \"1\" , b=\"2\", } 1\n"
        "g {a=\"2\"}\t2\t 1000\n"
        "\tg{a=\"3\"}   3   \r\n"
        "g{a=\"4\",}4\n"
        "# EOF\n"
    )


def test_crlf_line_endings():
    same_as_library("# HELP g doc\r\n# TYPE g gauge\r\ng{a=\"1\"} 1\r\ng{a=\"2\"} 2\r\n")


def test_empty_label_sets_and_label_values():
    same_as_library('# TYPE g gauge\ng{} 1\ng{a=""} 2\ng{a="",b="x"} 3\n')


# --- OpenMetrics edge cases, each compared with the library -------------------------------


def test_openmetrics_counter_with_created_and_exemplar():
    (family,) = same_as_library_om(
        "# TYPE c counter\n# HELP c a \\\\ b \\\" c \\n d \\x\n"
        'c_total{a="1"} 5 # {trace_id="abc"} 1 1700000000.5\nc_created{a="1"} 1.7e9\n'
        "# EOF\n"
    )
    assert family.documentation == 'a \\ b " c \n d \\x'
    assert family.samples[0].exemplar.timestamp == Timestamp(1700000000, 500000000)


def test_openmetrics_timestamps():
    (family,) = same_as_library_om(
        '# TYPE g gauge\ng{a="1"} 1 1700000000\ng{a="2"} 2 1700000000.123456789\n'
        'g{a="3"} 3 1.5e9\n# EOF\n'
    )
    assert [type(s.timestamp) for s in family.samples] == [Timestamp, Timestamp, float]


def test_openmetrics_unit_info_stateset_gaugehistogram_summary():
    same_as_library_om(
        "# TYPE lat_seconds histogram\n# UNIT lat_seconds seconds\n"
        'lat_seconds_bucket{le="0.5"} 1\nlat_seconds_bucket{le="+Inf"} 2 # {id="x"} 0.7\n'
        "lat_seconds_count 2\nlat_seconds_sum 1.1\nlat_seconds_created 1.7e9\n"
        "# TYPE build info\nbuild_info{version=\"1\"} 1\n"
        "# TYPE st stateset\nst{st=\"a\"} 1\nst{st=\"b\"} 0\n"
        "# TYPE gh gaugehistogram\ngh_bucket{le=\"-1\"} 1\ngh_bucket{le=\"+Inf\"} 2\n"
        "gh_gcount 2\ngh_gsum -3\n"
        '# TYPE q summary\nq{quantile="0.5"} 1\nq_count 3\nq_sum 4\n'
        "# TYPE u unknown\nu 1\n"
        "no_metadata 2\n# EOF"
    )


def test_openmetrics_1177_quirk_on_a_small_body():
    body = (
        "# HELP vllm:x requests\n# TYPE vllm:x counter\n"
        'vllm_x_total{m="a"} 3\nvllm_x_created{m="a"} 1.7e9\n'
        "# TYPE vllm:g gauge\nvllm_g 2\n# EOF\n"
    )
    families = parse(body)
    assert [(f.name, f.type, [s.name for s in f.samples]) for f in families] == [
        ("vllm:x", "counter", ["vllm:x_total", "vllm:x_created"]),
        ("vllm:g", "gauge", ["vllm:g"]),
    ]
    # What the library does instead: empty typed families plus unknown `vllm_` families.
    assert [f.name for f in library_openmetrics(body)] == [
        "vllm:x", "vllm_x_total", "vllm_x_created", "vllm:g", "vllm_g"
    ]


# --- format selection and names ---------------------------------------------------------


def test_parse_picks_openmetrics_from_content_type_or_trailing_eof():
    om = "# TYPE c counter\nc_total 1\n# EOF\n"
    assert parse(om)[0].type == "counter"  # sniffed from # EOF
    assert parse(om.encode(), content_type=OM_CONTENT_TYPE) == parse_openmetrics(om)
    # Declared text: '# EOF' is a comment and c_total does not belong to family 'c'.
    assert [f.name for f in parse(om, content_type="text/plain; version=0.0.4")] == [
        "c", "c_total"
    ]
    with pytest.raises(ParseError, match="after '# EOF'"):
        parse("c_total 1\n# EOF\n\n")  # sniffed as OpenMetrics, which allows nothing after EOF
    assert parse(b"g 1\n") == parse_text("g 1\n")


def test_normalise_vllm_names():
    families = parse_text(
        "# TYPE vllm_x gauge\nvllm_x 1\n# TYPE vllm:y gauge\nvllm:y 2\n"
        "# TYPE other_vllm_z gauge\nother_vllm_z 3\n"
    )
    out = normalise_vllm_names(families)
    assert [(f.name, [s.name for s in f.samples]) for f in out] == [
        ("vllm:x", ["vllm:x"]), ("vllm:y", ["vllm:y"]), ("other_vllm_z", ["other_vllm_z"])
    ]
    assert out[1] is families[1] and out[0] is not families[0]
    assert families[0].name == "vllm_x"  # the input is not modified


# --- malformed payloads: ParseError with line and reason -----------------------------------


@pytest.mark.parametrize(
    ("body", "line", "reason"),
    [
        pytest.param("g 1\ng\n", 2, "has no value", id="sample-without-value"),
        pytest.param('g{a="1"}\n', 1, "has no value", id="labels-without-value"),
        pytest.param('g 1\ng{a="1" 2\n', 2, "unterminated label set", id="unterminated-labels"),
        pytest.param('g{a="1\n', 1, "unterminated quoted value", id="unterminated-quote"),
        pytest.param('g{a="1} 2\n', 1, "unterminated quoted value", id="quote-eats-brace"),
        pytest.param("g abc\n", 1, "invalid sample value 'abc'", id="value-abc"),
        pytest.param("g 1.2.3\n", 1, "invalid sample value '1.2.3'", id="value-1.2.3"),
        pytest.param("g 1_000\n", 1, "invalid sample value", id="value-underscore"),
        pytest.param("g 1 1.5\n", 1, "invalid timestamp", id="timestamp-not-ms"),
        pytest.param("g 1 2 3\n", 1, "unexpected text", id="extra-fields"),
        pytest.param('# TYPE g gauge\ng{a="1"} 1\ng{a="2"} 2\ng{a="1"} 3\n', 4,
                     'duplicate series g{a="1"} (first on line 2)', id="duplicate-series"),
        pytest.param('g{a="1",b="2"} 1\ng{b="2",a="1"} 2\n', 2, "duplicate series",
                     id="duplicate-series-reordered"),
        pytest.param("# TYPE h histogram\n"
                     'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_count 2\n'
                     'h_bucket{a="x",le="1"} 1\nh_bucket{a="x",le="5"} 1\nh_count{a="x"} 1\n',
                     6, 'h{a="x"} has no le="+Inf" bucket', id="histogram-missing-inf"),
        pytest.param("# TYPE h histogram\n"
                     'h_bucket{le="1"} 3\nh_bucket{le="2"} 2\nh_bucket{le="+Inf"} 4\n',
                     3, "not cumulative", id="histogram-not-cumulative"),
        pytest.param("# TYPE h histogram\n"
                     'h_bucket{le="2"} 1\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 4\n',
                     3, "does not increase", id="histogram-le-not-increasing"),
        pytest.param("# TYPE h histogram\n"
                     'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 4\nh_count 5\nh_sum 1\n',
                     4, "_count 5 differs from the +Inf bucket 4", id="histogram-count"),
        pytest.param("# TYPE h histogram\nh_bucket 1\n", 2, "without an 'le' label",
                     id="histogram-bucket-without-le"),
        pytest.param('# TYPE h histogram\nh_bucket{le="fast"} 1\n', 2, "invalid le",
                     id="histogram-bad-le"),
        pytest.param("# TYPE h histogram\nh_count 1\nh_sum 1\n", 2, "no le=",
                     id="histogram-no-buckets"),
        pytest.param("g-h 1\n", 1, "invalid metric name 'g-h'", id="bad-metric-name"),
        pytest.param('my metric{a="1"} 1\n', 1, "invalid metric name 'my metric'",
                     id="metric-name-with-space"),
        pytest.param('{__name__="g"} 1\n', 1, "must start with a metric name",
                     id="utf8-name-syntax"),
        pytest.param("# HELP g-h doc\n", 1, "invalid metric name 'g-h'", id="bad-help-name"),
        pytest.param('g{a-b="1"} 1\n', 1, "invalid label name 'a-b'", id="bad-label-name"),
        pytest.param('g{a:b="1"} 1\n', 1, "invalid label name 'a:b'", id="colon-label-name"),
        pytest.param('g{__x="1"} 1\n', 1, "reserved label name '__x'", id="reserved-label"),
        pytest.param('g{a="1",a="2"} 1\n', 1, "duplicate label name 'a'", id="duplicate-label"),
        pytest.param('g{,a="1"} 1\n', 1, "expected a label name", id="leading-comma"),
        pytest.param('g{a=1} 1\n', 1, "not a quoted string", id="unquoted-label-value"),
        pytest.param("# TYPE g gauges\ng 1\n", 1, "unknown metric type 'gauges'",
                     id="unknown-type"),
        pytest.param("# TYPE g info\ng 1\n", 1, "unknown metric type 'info'", id="om-only-type"),
        pytest.param("# TYPE g\n", 1, "without a type", id="type-without-type"),
        pytest.param("# HELP\n", 1, "without a metric name", id="help-without-name"),
        pytest.param("# TYPE g gauge\n# TYPE g counter\n", 2, "duplicate TYPE",
                     id="duplicate-type"),
        pytest.param("# HELP g a\n# HELP g b\n", 2, "duplicate HELP", id="duplicate-help"),
        pytest.param("# HELP g a\ng 1\n# TYPE g counter\n", 3, "comes after its samples",
                     id="type-after-samples"),
        pytest.param("# TYPE g gauge\ng 1\n# TYPE k gauge\nk 1\ng{a=\"x\"} 2\n", 5,
                     "separated from its family", id="ungrouped-family"),
    ],
)
def test_malformed_text(body, line, reason):
    err = parse_error(body)
    assert err.line == line and reason in err.reason, err
    assert err.source == "<exposition>" and err.text == body.split("\n")[line - 1]


@pytest.mark.parametrize(
    ("body", "line", "reason"),
    [
        pytest.param("# TYPE g gauge\ng 1\n", 2, "missing '# EOF'", id="missing-eof"),
        pytest.param("g 1\n# EOF\ng 2\n", 3, "after '# EOF'", id="text-after-eof"),
        pytest.param("g 1\n\ng 2\n# EOF\n", 2, "blank line", id="blank-line"),
        pytest.param("# just a comment\n# EOF\n", 1, "invalid comment", id="plain-comment"),
        pytest.param("g  1\n# EOF\n", 1, "one space", id="double-space"),
        pytest.param('g{a="1", b="2"} 1\n# EOF\n', 1, "expected a label name",
                     id="space-in-labels"),
        pytest.param("# TYPE g gauge\ng 1\ng 2\n# EOF\n", 3, "duplicate series g",
                     id="duplicate-series"),
        pytest.param("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_count 1\nh_sum 1\n# EOF\n",
                     2, 'no le="+Inf"', id="histogram-missing-inf"),
        pytest.param("# TYPE h histogram\nh_bucket{le=\"inf\"} 1\n# EOF\n", 2, "non-canonical",
                     id="histogram-inf-spelling"),
        pytest.param("# TYPE c counter\nc_total -1\n# EOF\n", 2, "cannot be negative",
                     id="negative-counter"),
        pytest.param("# TYPE g gauge\ng 1 # {a=\"1\"} 1\n# EOF\n", 2, "exemplars",
                     id="exemplar-on-gauge"),
        pytest.param("# TYPE g untyped\n# EOF\n", 1, "unknown metric type 'untyped'",
                     id="untyped-type"),
        pytest.param("# UNIT g seconds\n# TYPE g gauge\ng 1\n# EOF\n", 1, "does not match",
                     id="unit-mismatch"),
    ],
)
def test_malformed_openmetrics(body, line, reason):
    err = parse_error(body, content_type=OM_CONTENT_TYPE)
    assert err.line == line and reason in err.reason, err


def test_empty_body():
    for body in ("", b"", "\n", b"  \n\t\n"):
        err = parse_error(body)
        assert err.line == 0 and err.reason == "empty exposition"
    with pytest.raises(ParseError, match="empty exposition"):
        parse_openmetrics("")


@pytest.mark.parametrize(
    ("body", "line"),
    [
        pytest.param(b"<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>\n", 1,
                     id="doctype"),
        pytest.param(b"\n  <html>\n<head><title>404</title></head>\n", 2, id="leading-blank"),
        pytest.param(b"upstream error\n<html><body>oops</body></html>\n", 2, id="html-later"),
        pytest.param(b"<html>\xff\xfe latin-1 \xe9 page</html>", 1, id="not-utf8"),
    ],
)
def test_html_error_page(body, line):
    err = parse_error(body)
    assert err.reason == "looks like HTML, not a Prometheus exposition" and err.line == line


def test_bad_utf8_names_line_and_byte():
    err = parse_error(b"g 1\nh{a=\"\xff\"} 2\n")
    assert err.line == 2 and "not valid UTF-8" in err.reason and "byte 9" in err.reason


def test_source_is_reported():
    err = parse_error(b"g 1\ng x\n", source="chat-0")
    assert err.source == "chat-0" and str(err).startswith("chat-0:2: invalid sample value")


# --- garbage fails with a short reason (its speed: bench/limits_bench.py) -------------

TEN_MB = 10 * 1024 * 1024


#: Ten-megabyte bodies a broken or hostile target might serve, by name. How fast each fails is
#: measured against its budget by ``bench/limits_bench.py``, not asserted here.
GARBAGE: dict[str, Callable[[], str | bytes]] = {
    "random-bytes": lambda: os.urandom(TEN_MB),
    "random-str": lambda: random.Random(7).randbytes(TEN_MB).decode("latin-1"),
    "one-huge-name": lambda: "a" * TEN_MB,
    "backslashes-in-a-value": lambda: 'g{a="' + "\\" * TEN_MB,
    "escaped-quotes": lambda: 'g{a="' + '\\"' * (TEN_MB // 2),
    "endless-label-set": lambda: "g{" + 'a="b",' * (TEN_MB // 6),
    "nul-bytes": lambda: "\x00" * TEN_MB,
}


def pathological_comment() -> str:
    """Ten megabytes of escapes and quotes in comments, then one sample."""
    return "# HELP g " + '\\"' * (TEN_MB // 2) + "\n# x " + '"\\ ' * (TEN_MB // 3) + "\ng 1\n"


@pytest.mark.parametrize("name", list(GARBAGE))
def test_garbage_fails_with_a_short_reason(name):
    err = parse_error(GARBAGE[name]())
    assert 1 <= err.line < 100 and len(err.reason) < 300  # random bytes may hold a newline


def test_pathological_comment_parses():
    (family,) = parse_text(pathological_comment())
    assert family.samples[0].value == 1


# --- random expositions: identical to the library ---------------------------------------

_NAMES = ["g", "a:b", "_u", "vllm:x", "Q9"]
_CHARS = ["a", " ", "\\\\", '\\"', "\\n", "{", "}", ",", "=", "#", "é", "\t", "\\x", "le=1"]


def _label_value(rng: random.Random, tag: str) -> str:
    return "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 5))) + tag


def _random_text_exposition(rng: random.Random) -> str:
    lines = []
    for i in range(rng.randint(1, 5)):
        typ = rng.choice(["counter", "gauge", "untyped", "histogram", "summary", None])
        name = rng.choice(_NAMES) + str(i)
        if typ:
            lines += [f"# HELP {name} d\\\\o\\nc", f"# TYPE {name} {typ}"][:: rng.choice([1, -1])]
        names = rng.sample(["a", "b", "model_name", "_z"], rng.randint(0, 2))
        for group in range(rng.randint(1, 3) if names else 1):
            labels = [(n, _label_value(rng, str(group) if j == 0 else ""))
                      for j, n in enumerate(names)]

            def fmt(extra: list[tuple[str, str]], labels=labels) -> str:
                items = labels + extra
                return "{" + ",".join(f'{k}="{v}"' for k, v in items) + "}" if items else ""

            if typ == "histogram":
                total = 0
                for le in ["0.1", "1", "1e3", "+Inf"][rng.randint(0, 3):]:
                    total += rng.randint(0, 3)
                    lines.append(f"{name}_bucket{fmt([('le', le)])} {total}")
                lines += [f"{name}_count{fmt([])} {total}", f"{name}_sum{fmt([])} 1.5"]
            elif typ == "summary":
                lines += [f"{name}{fmt([('quantile', '0.5')])} 1", f"{name}_count{fmt([])} 2",
                          f"{name}_sum{fmt([])} 3"]
            else:
                value = rng.choice(["1", "-2", "3.5", "NaN", "+Inf", "1e3", ".5"])
                stamp = rng.choice(["", "", " 1700000000000", "\t-5"])
                lines.append(f"{name}{fmt([])}{rng.choice([' ', '  ', chr(9)])}{value}{stamp}")
    return rng.choice(["\n", "\r\n"]).join(lines) + "\n"


def test_random_text_expositions_identical_to_library():
    rng = random.Random(20261130)
    for _ in range(300):
        text = _random_text_exposition(rng)
        same_as_library(text)
