"""collector.exposition's shared fast paths: a bucket run takes lines ahead of the parser's loop,
so these pin that the loop goes on after the right line and that errors name the right line.

The package's public surface is pinned here too.
"""

from __future__ import annotations

import importlib

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as library_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as library_text

import collector.exposition
from collector.exposition import parse_openmetrics, parse_text
from vigil.errors import ParseError

HIST = "# TYPE h histogram\n"
SUBMODULES = ["body", "families", "fastpath", "formats", "histograms", "labels", "openmetrics",
              "problems", "text", "tokens"]


def text_error(body: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_text(body)
    return info.value


def om_error(body: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_openmetrics(body)
    return info.value


def test_public_surface():
    assert collector.exposition.__all__ == [
        "normalise_vllm_names", "parse", "parse_openmetrics", "parse_text", "sample_value",
        "wire_name",
    ]
    assert all(callable(getattr(collector.exposition, name))
               for name in collector.exposition.__all__)


@pytest.mark.parametrize("name", SUBMODULES)
def test_submodule_all_names_exist(name):
    module = importlib.import_module(f"collector.exposition.{name}")
    assert module.__all__ and len(set(module.__all__)) == len(module.__all__)
    assert all(hasattr(module, attr) for attr in module.__all__)


def test_text_run_across_blank_and_crlf_lines():
    body = (HIST + 'h_bucket{a="x",le="1"} 1\r\n\r\n  \nh_bucket{a="x",le="2"} 2\n\n'
            'h_bucket{a="x",le="+Inf"} 3\nh_count{a="x"} 3\nh_sum{a="x"} 1\n')
    assert parse_text(body) == list(library_text(body))


def test_text_run_to_the_end_of_the_body():
    body = HIST + 'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\n\n\n'
    assert parse_text(body) == list(library_text(body))


def test_text_run_that_ends_the_body_without_inf_names_its_last_bucket():
    err = text_error(HIST + 'h_bucket{le="1"} 1\nh_bucket{le="2"} 2\n\n')
    assert err.line == 3 and 'no le="+Inf"' in err.reason


def test_text_line_after_a_run_is_parsed_with_its_own_number():
    err = text_error(HIST + 'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 1\n\nh_count{ 1\n')
    assert err.line == 5 and err.text == "h_count{ 1"


def test_text_error_inside_a_run_names_its_line():
    err = text_error(HIST + 'h_bucket{le="1"} 1\nh_bucket{le="2"} 2\n\nh_bucket{le="1.5"} 3\n')
    assert err.line == 5 and "does not increase" in err.reason


def test_openmetrics_run_then_eof():
    body = HIST + 'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_count 2\nh_sum 1\n# EOF\n'
    assert parse_openmetrics(body) == list(library_openmetrics(body))


def test_openmetrics_missing_eof_after_a_run_names_the_last_line():
    err = om_error(HIST + 'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 1\n')
    assert err.line == 3 and "missing '# EOF'" in err.reason


def test_openmetrics_blank_line_ends_a_run():
    err = om_error(HIST + 'h_bucket{le="1"} 1\n\nh_bucket{le="+Inf"} 1\n# EOF\n')
    assert err.line == 3 and "blank line" in err.reason


@pytest.mark.parametrize(
    ("bucket", "reason"),
    [
        pytest.param('h_bucket{le="inf"} 1', "non-canonical le", id="inf-spelling"),
        pytest.param('h_bucket{le="+Inf"} 1.5', "not an integer", id="float-count"),
        pytest.param('h_bucket{le="+Inf"} -1', "cannot be negative", id="negative"),
        pytest.param('h_bucket{le="1"} 1', "duplicate series", id="duplicate"),
        pytest.param('h_bucket{le="+Inf"} 0', "not cumulative", id="not-cumulative"),
    ],
)
def test_openmetrics_bucket_rules_inside_a_run(bucket, reason):
    err = om_error(HIST + f'h_bucket{{le="1"}} 1\n{bucket}\n# EOF\n')
    assert err.line == 3 and reason in err.reason and err.text == bucket
