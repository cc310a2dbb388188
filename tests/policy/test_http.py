"""policy.header_key: the one way the edge and the app write a limit's name in RateLimit headers."""

from __future__ import annotations

import re
from urllib.parse import unquote

import edgegen_policy as policy
from hypothesis import given
from hypothesis import strategies as st

NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1)


def content(key: str) -> str:
    """The sf-string's content, its escapes undone (what a structured-field parser yields)."""
    assert key.startswith('"') and key.endswith('"')
    return re.sub(r"\\(.)", r"\1", key[1:-1])


def test_examples() -> None:
    """ASCII stays as it is, '"' and '\\' are escaped, the rest is percent-encoded UTF-8."""
    assert policy.header_key("api") == '"api"'
    assert policy.header_key("café") == '"caf%C3%A9"'
    assert policy.header_key("100%") == '"100%25"'
    assert policy.header_key('say "hi" \\') == '"say \\"hi\\" \\\\"'


@given(NAMES)
def test_a_key_is_printable_ascii_and_decodes_to_the_name(name: str) -> None:
    """Every key is a valid sf-string whose percent-decoded content is the exact name."""
    key = policy.header_key(name)
    assert all(0x20 <= ord(c) <= 0x7E for c in key)
    assert unquote(content(key), errors="strict") == name


@given(NAMES, NAMES)
def test_different_names_get_different_keys(a: str, b: str) -> None:
    """No two limit names share a key, however one is spelled to look like the other."""
    assert (policy.header_key(a) == policy.header_key(b)) == (a == b)
