"""PromQL label matchers (``vigil.selectors``): parsing as PromQL's lexer does, matching as
Prometheus matches, and rendering back to PromQL that parses to the same selector."""

from __future__ import annotations

import pytest

from vigil.selectors import (
    LabelMatcher,
    Selector,
    SelectorError,
    as_selector,
    check_label_name,
    default_pool_selector,
    parse_selector,
    promql_string,
)


def _m(name: str, op: str, value: str) -> LabelMatcher:
    return LabelMatcher(name, op, value)  # type: ignore[arg-type]


# --- parsing -----------------------------------------------------------------------------------
def test_the_four_operators() -> None:
    sel = parse_selector('a="x", b!="y", c=~"z.*", d!~"w"')
    assert list(sel) == [_m("a", "=", "x"), _m("b", "!=", "y"), _m("c", "=~", "z.*"),
                         _m("d", "!~", "w")]


def test_three_quote_styles() -> None:
    sel = parse_selector("a=\"x\", b='y', c=`z`")
    assert [m.value for m in sel] == ["x", "y", "z"]


def test_go_escapes_in_double_and_single_quotes() -> None:
    sel = parse_selector(r'a="\x41\u00e9\101\n\t\\\"", b=' + r"'\'\a'")
    assert sel[0].value == 'A\u00e9A\n\t\\"'
    assert sel[1].value == "'\a"


def test_no_escapes_in_a_raw_string() -> None:
    assert parse_selector(r"a=`\d+\n`")[0].value == r"\d+\n"


def test_trailing_comma() -> None:
    assert parse_selector('a="x",') == parse_selector('a="x"')
    assert parse_selector('{a="x", b="y",}') == parse_selector('a="x", b="y"')


def test_optional_braces_and_space() -> None:
    assert parse_selector('{ a = "x" }') == Selector([_m("a", "=", "x")])
    assert parse_selector('  a="x"  ') == Selector([_m("a", "=", "x")])


@pytest.mark.parametrize(("text", "column"), [
    ('a="x" b="y"', 7),      # missing comma
    ("a=x", 3),              # unquoted value
    ('1a="x"', 1),           # bad label name
    ("a", 2),                # no operator
    ('a="x', 3),             # unterminated string
    (r"a='\q'", 4),          # unknown escape
    ('{a="x"', 1),           # unclosed brace
    ('a=="x"', 3),           # doubled operator
])
def test_errors_say_the_column(text: str, column: int) -> None:
    with pytest.raises(SelectorError) as err:
        parse_selector(text)
    assert err.value.column == column
    assert f"(at column {column})" in str(err.value)


def test_name_refused() -> None:
    with pytest.raises(SelectorError, match="__name__"):
        parse_selector('__name__="up"')


@pytest.mark.parametrize("text", ["", "  ", "{}", "{ }"])
def test_empty_refused(text: str) -> None:
    with pytest.raises(SelectorError, match="empty selector"):
        parse_selector(text)


def test_bad_regex_refused_with_the_pattern() -> None:
    with pytest.raises(SelectorError, match=r"invalid regular expression '\(' for a"):
        parse_selector('a=~"("')


def test_check_label_name() -> None:
    assert check_label_name("pod") == "pod"
    with pytest.raises(SelectorError):
        check_label_name("a-b")


# --- matching ----------------------------------------------------------------------------------
def test_regex_is_fully_anchored() -> None:
    sel = parse_selector('service=~"chat"')
    assert sel.matches({"service": "chat"})
    assert not sel.matches({"service": "chat-vllm"})
    assert not sel.matches({"service": "my-chat"})
    neg = parse_selector('service!~"chat"')
    assert neg.matches({"service": "chat-vllm"})
    assert not neg.matches({"service": "chat"})


def test_regex_alternation_is_anchored_as_a_whole() -> None:
    sel = parse_selector('a=~"x|y"')
    assert sel.matches({"a": "y"})
    assert not sel.matches({"a": "xy"})


def test_missing_label_is_empty() -> None:
    assert parse_selector('team=""').matches({"pod": "p"})
    assert not parse_selector('team!=""').matches({"pod": "p"})
    assert parse_selector('team=~".*"').matches({})
    assert not parse_selector('team=~".+"').matches({})
    assert parse_selector('team!="x"').matches({})


def test_all_matchers_must_match() -> None:
    sel = parse_selector('namespace="llm", pod!="chat-2"')
    assert sel.matches({"namespace": "llm", "pod": "chat-0"})
    assert not sel.matches({"namespace": "llm", "pod": "chat-2"})
    assert not sel.matches({"namespace": "other", "pod": "chat-0"})


# --- building and rendering --------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    'a="x"',
    'namespace="llm", service=~"chat-.*", pod!~"chat-vllm-debug-.*", job!="x"',
    r'a="quote \" backslash \\ newline \n tab \t bell \a", b=`raw \d`',
    "a='\u00e9\u4e2d'",
    'a=""',
])
def test_promql_round_trips_through_parse(text: str) -> None:
    sel = parse_selector(text)
    assert parse_selector(sel.inner()) == sel
    rendered = sel.promql("vllm:num_requests_waiting")
    assert rendered.startswith("vllm:num_requests_waiting{") and rendered.endswith("}")
    assert parse_selector(rendered[len("vllm:num_requests_waiting"):]) == sel


def test_promql_without_matchers_is_the_metric() -> None:
    assert Selector().promql("up") == "up"


def test_promql_string_escapes_control_characters() -> None:
    assert promql_string('a"b\\c\x01') == '"a\\"b\\\\c\\x01"'
    assert parse_selector("a=" + promql_string("\x01\x7f"))[0].value == "\x01\x7f"


def test_and_equal_replaces_equality_and_keeps_others() -> None:
    sel = parse_selector('a="x", a!="y", b=~"z"')
    got = sel.and_equal(("a", "w"), model_name="m")
    assert list(got) == [_m("a", "!=", "y"), _m("b", "=~", "z"), _m("a", "=", "w"),
                         _m("model_name", "=", "m")]


def test_equal_and_names() -> None:
    sel = parse_selector('a=~"x", a="y", b="z"')
    assert sel.equal("a") == "y"
    assert sel.equal("c") is None
    assert sel.names() == ("a", "b")


def test_as_selector() -> None:
    assert as_selector(None) == Selector()
    assert as_selector({"pool": "chat"}) == Selector([_m("pool", "=", "chat")])
    sel = parse_selector('a="x"')
    assert as_selector(sel) is sel


def test_default_pool_selector() -> None:
    assert default_pool_selector("chat").inner() == 'pool="chat", kind="vllm"'
    assert default_pool_selector("chat", "dcgm").inner() == 'pool="chat", kind="dcgm"'
    with pytest.raises(ValueError):
        default_pool_selector("chat", "other")


def test_selector_is_hashable_and_immutable() -> None:
    a, b = parse_selector('a="x"'), parse_selector("a='x'")
    assert a == b and hash(a) == hash(b)
    assert repr(a) == 'Selector({a="x"})'


def test_leading_inline_flags_as_in_re2() -> None:
    # RE2 (Prometheus) accepts a leading (?i); Python only at the very start, so the selector
    # scopes it instead of wrapping the pattern in a group that would reject it.
    sel = parse_selector('service=~"(?i)CHAT-.*", pod!~"(?s)x.y"')
    assert sel.matches({"service": "chat-vllm", "pod": "x\ny2"})
    assert not sel.matches({"service": "my-chat-vllm"})  # still anchored
    assert not sel.matches({"service": "chat-vllm", "pod": "x\ny"})


def test_flags_python_cannot_express_are_named() -> None:
    with pytest.raises(SelectorError, match="ungreedy flag U"):
        parse_selector('a=~"(?U)x+"')
    with pytest.raises(SelectorError, match="global flags not at the start"):
        parse_selector('a=~"x(?i)y"')
