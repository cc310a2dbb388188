"""The test-side structured-field parser: it must accept the grammar and reject the rest,
or the header tests that rely on it prove nothing."""

from __future__ import annotations

import pytest
from sfparse import SFError, Token, parse_list

from applimit.web._headers import sf_string


def test_parses_the_drafts_own_examples() -> None:
    """The RateLimit draft's examples parse into names and integer parameters."""
    items = parse_list('"burst";q=100;w=60,"daily";q=1000;w=86400')
    assert [(i.value, i.params) for i in items] == [
        ("burst", {"q": 100, "w": 60}),
        ("daily", {"q": 1000, "w": 86400}),
    ]
    (item,) = parse_list('"default";r=50;t=30')
    assert item.params == {"r": 50, "t": 30}
    (keyed,) = parse_list('"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:')
    assert keyed.params["qu"] == "content-bytes"
    assert isinstance(keyed.params["pk"], bytes)


def test_field_lines_combine_and_whitespace_is_allowed_where_the_grammar_says() -> None:
    """Two field lines are one list; OWS around commas and SP after ';' are fine."""
    items = parse_list('"a";q=1', ' "b"; q=2 ,\t"c";q=3')
    assert [i.value for i in items] == ["a", "b", "c"]
    assert items[1].params == {"q": 2}


def test_tokens_are_kept_apart_from_strings() -> None:
    """A token name parses, but as a Token, so tests can insist on sf-strings."""
    (item,) = parse_list("default;q=1;flag")
    assert item.value == Token("default")
    assert item.params == {"q": 1, "flag": True}


@pytest.mark.parametrize(
    "text",
    [
        '"a";q=1,',  # trailing comma
        '"a";q=1,,"b"',  # empty member
        '"a" "b"',  # missing comma
        '"a";Q=1',  # upper-case key
        '"a";q=',  # missing value
        '"a;q=1',  # unterminated string
        '"a\\x"',  # bad escape
        '"caf\u00e9"',  # non-ASCII in a string
        '"a";q=1234567890123456',  # 16-digit integer
        '"a";q=1.',  # decimal without fraction
        '"a";q=1.2345',  # four fraction digits
        '"a";q=?2',  # bad boolean
        "(a b)",  # inner list: not used by these fields
        "",  # empty field
        '"a";q=1;',  # dangling ';'
        "@1659578233",  # a Date (RFC 9651) is not an item these fields use
    ],
)
def test_rejects_what_the_grammar_forbids(text: str) -> None:
    """Each of these breaks RFC 8941; a parser that accepted them would hide bugs."""
    with pytest.raises(SFError):
        parse_list(text)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("api", "api"),
        ('say "hi"', 'say "hi"'),
        ("back\\slash", "back\\slash"),
        ("café", "caf%C3%A9"),
        ("tab\tname", "tab%09name"),
        ("100%", "100%25"),
    ],
)
def test_sf_string_round_trips_through_the_parser(name: str, expected: str) -> None:
    """Whatever a limit is called, its header item is a valid sf-string; non-ASCII and
    controls and % are percent-encoded, quotes and backslashes escaped."""
    (item,) = parse_list(f"{sf_string(name)};q=1")
    assert item.value == expected
