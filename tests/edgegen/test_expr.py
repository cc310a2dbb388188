"""The rule expression builder: escaping, structure, and the 4,096-character limit."""

from __future__ import annotations

import itertools
import random

import pytest
import rules_eval
from edgegen_policy import AuthenticatedWhen, Matcher
from hypothesis import given
from hypothesis import strategies as st

from edgegen.compiler import _expr

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
        '(http.request.uri.path in {"/a" "/a%0A" "/a%2F" "/a%2F%0A" "/a/" "/a/%0A"} or '
        'starts_with(http.request.uri.path, "/b/") or '
        'starts_with(http.request.uri.path, "/b%2F")) '
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
        '(starts_with(http.request.uri.path, "/api/") or '
        'starts_with(http.request.uri.path, "/api%2F")) and not '
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


def test_credentialed_condition() -> None:
    """The second rule of an unauthenticated-only limit: the matcher AND some credential."""
    when = AuthenticatedWhen(headers=("Authorization",), cookies=("session",))
    matcher = Matcher.create(paths=["/x"])
    text = _expr.matcher_expression(matcher, credentialed=when).text
    assert text == (
        'http.request.uri.path in {"/x" "/x%0A" "/x%2F" "/x%2F%0A" "/x/" "/x/%0A"} and '
        '(any(len(http.request.headers["authorization"][*])[*] gt 0) or '
        'len(http.request.cookies["session"]) gt 0)'
    )
    tree, _ = rules_eval.parse(text)
    assert not rules_eval.evaluate(tree, rules_eval.Request("/x", "GET", "h"))
    bearer = rules_eval.Request("/x/", "GET", "h", headers={"authorization": ["x"]})
    assert rules_eval.evaluate(tree, bearer)


# --- paths as Cloudflare's normalised http.request.uri.path holds them -----------------------


def test_cloudflare_normalisation_model_follows_the_documented_examples() -> None:
    """rules_eval.cloudflare_normalize gives the results of Cloudflare's examples page."""
    assert rules_eval.cloudflare_normalize("/%68ello//pa\\th", "rfc3986") == "/hello//pa%5Cth"
    assert rules_eval.cloudflare_normalize("/%68ello//pa\\th") == "/hello/pa/th"
    assert rules_eval.cloudflare_normalize("/%68ello//pa\\th", "none") == "/%68ello//pa\\th"
    assert rules_eval.cloudflare_normalize("/en//%68ello\\path") == "/en/hello/path"
    assert rules_eval.cloudflare_normalize("/./en//hello./") == "/en/hello./"
    assert rules_eval.cloudflare_normalize("/a/%2e%2E/b%2fc?q") == "/b%2Fc"
    assert rules_eval.cloudflare_normalize("/caf\u00e9 x") == "/caf%C3%A9%20x"


@pytest.mark.parametrize(
    ("path", "normalized"),
    [
        ("/login", "/login"),
        ("/caf\u00e9", "/caf%C3%A9"),
        ("/a b", "/a%20b"),
        ('/a"b', "/a%22b"),
        ("/a|b^c`d{e}", "/a%7Cb%5Ec%60d%7Be%7D"),
        ("/100%", "/100%25"),
        ("/p'q$:@!*+,;=[]~", "/p'q$:@!*+,;=[]~"),
        ("/\U0001f600", "/%F0%9F%98%80"),
    ],
)
def test_policy_paths_are_written_as_the_normalised_path_holds_them(
    path: str, normalized: str
) -> None:
    """A decoded policy path, in the one spelling Cloudflare's normalisation leaves; the same
    string the model of that normalisation gives for the raw path."""
    assert _expr.normalized_path(path) == normalized
    assert rules_eval.cloudflare_normalize(path) == normalized


def test_spellings_are_bounded() -> None:
    """%2F for at most three slashes after the leading one: 8 spellings of a prefix, 48 of an
    exact path (with the trailing / and %2F, each also with a final %0A), however deep the
    path."""
    deep = "/a/b/c/d/e/f/"
    assert len(_expr.path_spellings(deep, exact=False)) == 8
    assert len(_expr.path_spellings(deep.rstrip("/"), exact=True)) == 48
    assert _expr.path_spellings("/api/", exact=False) == ["/api/", "/api%2F"]
    assert _expr.path_spellings("/login", exact=True) == [
        "/login",
        "/login/",
        "/login%2F",
        "/login%0A",
        "/login/%0A",
        "/login%2F%0A",
    ]
    assert _expr.path_spellings("/a/b", exact=False, spellings=_expr.Spellings(0)) == ["/a/b"]


_SPELLING_PIECES = {
    "/": ["/", "%2F", "%2f", "//", "\\", "/./", "/%2e/", "/x/../", "/y/%2E%2e/"],
}


def _spell(rng: random.Random, route: str, policy_slashes: int) -> str:
    """A raw request path the app routes to ``route``: unreserved characters escaped at
    random (either case of hex), non-ASCII raw or escaped, and each of the first
    ``policy_slashes`` slashes after the leading one written as %2F, //, \\ or with dot
    segments."""
    out = ["/"]
    slash = 0
    for char in route[1:]:
        if char == "/":
            slash += 1
            choices = _SPELLING_PIECES["/"] if slash <= policy_slashes else ["/", "//", "/./"]
            out.append(rng.choice(choices))
        elif char.isascii() and (char.isalnum() or char in "-._~") and rng.random() < 0.3:
            hexed = f"%{ord(char):02X}"
            out.append(hexed.lower() if rng.random() < 0.5 else hexed)
        elif not char.isascii() and rng.random() < 0.5:
            escaped = "".join(f"%{b:02X}" for b in char.encode())
            out.append(escaped.lower() if rng.random() < 0.5 else escaped)
        else:
            out.append(char)
    return "".join(out)


ROUTES = [
    # (paths, prefixes, routes the app serves under them)
    (["/login", "/api/v1/sessions"], [], ["/login", "/login/", "/api/v1/sessions"]),
    ([], ["/api/", "/v2/"], ["/api/items", "/api/", "/v2/x/y/z", "/api/a.b/~c-d_e"]),
    (["/caf\u00e9", "/a b"], ["/\u00fcn\u00ef/"], ["/caf\u00e9", "/a b/", "/\u00fcn\u00ef/z"]),
    ([], ["/a/b/c/"], ["/a/b/c/d", "/a/b/c/"]),
]


@pytest.mark.parametrize(("paths", "prefixes", "routes"), ROUTES)
def test_rules_match_every_normalised_spelling_of_a_limited_route(
    paths: list[str], prefixes: list[str], routes: list[str]
) -> None:
    """For 200 random spellings of each route the app counts (escapes, %2F for the policy's
    own slashes, //, \\, dot segments, a trailing slash), the expression matches the path
    Cloudflare's default normalisation leaves; and misses near routes the app does not count."""
    matcher = Matcher.create(paths=paths, path_prefixes=prefixes)
    tree, _ = rules_eval.parse(_expr.matcher_expression(matcher).text)
    rng = random.Random(12)
    policy_slashes = max(p.count("/") - 1 for p in [*paths, *prefixes])
    for route in routes:
        assert matcher.matches_raw("GET", route)
        for _ in range(200):
            raw = _spell(rng, route, policy_slashes)
            assert matcher.matches_raw("GET", raw), raw
            normalized = rules_eval.cloudflare_normalize(raw)
            assert rules_eval.evaluate(tree, rules_eval.Request(normalized, "GET", "h")), (
                raw,
                normalized,
            )
    for near in ["/logins", "/api", "/ap/i", "/v3/x", "/caf", "/a%2Fb", "/x/login"]:
        if not matcher.matches_raw("GET", near):
            normalized = rules_eval.cloudflare_normalize(near)
            assert not rules_eval.evaluate(tree, rules_eval.Request(normalized, "GET", "h"))


def test_the_documented_gaps_of_rule_expressions() -> None:
    """What rules do not match though the app counts it (docs/edge.md lists these; the Worker
    and the app still count them): %2F where the policy has no slash, %5C for a slash, %2F
    around dot segments, %2F at a fourth slash; and under the rfc3986 type or without
    normalisation, // and escapes."""
    matcher = Matcher.create(paths=["/login"], path_prefixes=["/api/", "/a/b/c/d/"])
    tree, _ = rules_eval.parse(_expr.matcher_expression(matcher).text)
    gaps = [
        ("/%2Fapi/x", "cloudflare"),
        ("/api%5Cx", "cloudflare"),
        ("/x%2F..%2Flogin", "cloudflare"),
        ("/a/b/c/d%2Fe", "cloudflare"),
        ("//api/x", "rfc3986"),
        ("/%61pi/x", "none"),
    ]
    for raw, type_ in gaps:
        assert matcher.matches_raw("GET", raw), raw
        normalized = rules_eval.cloudflare_normalize(raw, type_)
        assert not rules_eval.evaluate(tree, rules_eval.Request(normalized, "GET", "h")), raw


def test_spellings_are_dropped_to_fit_the_length_limit() -> None:
    """Many deep paths: the %2F spellings of later slashes go first, then the trailing
    ones; what is left still matches the plain spellings, and stays within 4,096."""
    deep = [f"/{'s' * 12}/{i}/x/y" for i in range(14)]
    matcher = Matcher.create(paths=deep)
    text, kept = _expr.fitted_expression(matcher)
    assert len(text) <= _expr.MAX_EXPRESSION_LENGTH
    assert not kept.complete
    assert len(_expr.matcher_expression(matcher).text) > _expr.MAX_EXPRESSION_LENGTH
    _tree, strings = rules_eval.parse(text)
    assert set(deep) <= set(strings)
    steps = list(itertools.takewhile(lambda s: s != kept, _expr.SPELLING_STEPS))
    assert all(
        len(_expr.matcher_expression(matcher, spellings=s).text) > _expr.MAX_EXPRESSION_LENGTH
        for s in steps
    )
    huge = Matcher.create(paths=[f"/{'p' * 300}/{i}" for i in range(20)])
    with pytest.raises(_expr.ExpressionError, match="4,096"):
        _expr.fitted_expression(huge)
