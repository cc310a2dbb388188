"""The rule expression builder: escaping, structure, and the 4,096-character limit."""

from __future__ import annotations

import pytest
import rules_eval
from hypothesis import given
from hypothesis import strategies as st

from edgegen import _expr
from policy import AuthenticatedWhen, Matcher

HOSTILE = [
    '"',
    "\\",
    '\\"',
    '"\\"',
    "${x}",
    "%{y}",
    "`tick`",
    "</script>",
    "ünï",
    "\u2028\u2029",
    "日本語",
    'a" or true or "',
    "\\\\\\",
    "",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_string_literal_round_trips(value: str) -> None:
    """Every hostile string comes back unchanged from the literal the builder writes."""
    literal = _expr.string(value)
    tree, strings = rules_eval.parse(f"http.request.uri.path eq {literal}")
    assert strings == [value]
    assert tree[0] == "cmp"


@given(st.text(alphabet=st.characters(min_codepoint=0x20, exclude_categories=["Cs"])))
def test_any_printable_string_round_trips(value: str) -> None:
    """Any string without controls is one literal whose value is the string itself."""
    value = value.replace("\x7f", "")
    _tree, strings = rules_eval.parse(f"http.host eq {_expr.string(value)}")
    assert strings == [value]


@pytest.mark.parametrize("value", ["a\nb", "tab\there", "\x00", "\x7f", "\ud800"])
def test_unrepresentable_strings_are_refused(value: str) -> None:
    """Control characters and lone surrogates have no escape: the builder refuses them."""
    with pytest.raises(_expr.ExpressionError, match="cannot hold"):
        _expr.string(value)


def test_sets_and_single_values() -> None:
    """One value is `eq`, several an inline set with space-separated literals."""
    assert _expr.one_of("http.request.method", ["POST"]).text == 'http.request.method eq "POST"'
    assert (
        _expr.one_of("http.request.method", ["GET", "POST"]).text
        == 'http.request.method in {"GET" "POST"}'
    )


def test_compound_operands_are_parenthesised() -> None:
    """An `or` inside an `and` gets parentheses; single comparisons do not."""
    matcher = Matcher.create(paths=["/a"], path_prefixes=["/b/"], methods=["POST"])
    text = _expr.matcher_expression(matcher).text
    assert text == (
        '(http.request.uri.path eq "/a" or starts_with(http.request.uri.path, "/b/")) '
        'and http.request.method eq "POST"'
    )


def test_empty_matcher_is_true() -> None:
    """A matcher with no criteria matches every request: the expression `true`."""
    assert _expr.matcher_expression(Matcher.create()).text == "true"


def test_hosts_exact_and_wildcard() -> None:
    """`*.example.com` is ends_with(".example.com"); exact hosts compare with eq/in."""
    matcher = Matcher.create(hosts=["api.example.com", "*.example.com"])
    assert _expr.host_condition(matcher) == _expr.Expr(
        'http.host eq "api.example.com" or ends_with(http.host, ".example.com")', atom=False
    )


def test_unauthenticated_condition() -> None:
    """Headers: some value non-empty (any/len/[*]); cookies: present; all negated together."""
    when = AuthenticatedWhen(headers=("Authorization",), cookies=("session",))
    text = _expr.matcher_expression(Matcher.create(path_prefixes=["/api/"]), when).text
    assert text == (
        'starts_with(http.request.uri.path, "/api/") and not '
        '(any(len(http.request.headers["authorization"][*])[*] gt 0) or '
        'len(http.request.cookies["session"]) gt 0)'
    )
    tree, _ = rules_eval.parse(text)
    anonymous = rules_eval.Request("/api/x", "GET", "h")
    assert rules_eval.evaluate(tree, anonymous)
    empty = rules_eval.Request("/api/x", "GET", "h", headers={"authorization": [""]})
    assert rules_eval.evaluate(tree, empty)
    bearer = rules_eval.Request("/api/x", "GET", "h", headers={"authorization": ["", "t"]})
    assert not rules_eval.evaluate(tree, bearer)
    cookie = rules_eval.Request("/api/x", "GET", "h", cookies={"session": [""]})
    assert not rules_eval.evaluate(tree, cookie)


def test_no_credentials_means_no_condition() -> None:
    """With nothing in authenticated_when, unauthenticated-only adds no condition."""
    matcher = Matcher.create(paths=["/x"])
    assert (
        _expr.matcher_expression(matcher, AuthenticatedWhen()).text
        == _expr.matcher_expression(matcher).text
    )


def test_length_limit() -> None:
    """render() accepts 4,096 characters and refuses one more."""
    prefix = 'http.host eq ""'
    fits = _expr.Expr(f'http.host eq "{"a" * (4096 - len(prefix))}"')
    assert len(_expr.render(fits)) == 4096
    over = _expr.Expr(fits.text + " ")
    with pytest.raises(_expr.ExpressionError, match="4,097 characters long"):
        _expr.render(over)


def test_the_parser_rejects_malformed_text() -> None:
    """The test parser itself catches an unbalanced literal or an unknown escape."""
    with pytest.raises(rules_eval.ParseError):
        rules_eval.parse('http.host eq "a')
    with pytest.raises(rules_eval.ParseError):
        rules_eval.parse('http.host eq "a\\n"')
    with pytest.raises(rules_eval.ParseError):
        rules_eval.parse('http.host eq "a" or')


def test_hostile_hosts_and_credentials_are_escaped() -> None:
    """Strings that bypass the policy's validation still come out as exact literals."""
    matcher = Matcher.create(hosts=['ev"il\\.com', '*.x"y${z}'], methods=['P"OST'])
    when = AuthenticatedWhen.model_construct(headers=('x"h',), cookies=('c\\"k',))
    text = _expr.matcher_expression(matcher, when).text
    _tree, strings = rules_eval.parse(text)
    assert strings == ['P"OST', 'ev"il\\.com', '.x"y${z}', 'x"h', 'c\\"k']
