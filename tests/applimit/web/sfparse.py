"""A small, strict RFC 8941 structured-field parser, used to check every header we emit.

It covers what the RateLimit draft uses: Lists of Items (no inner lists), bare items that are
Integers, Decimals, Strings, Tokens, Byte Sequences and Booleans, and Parameters. Anything the
grammar does not allow raises ``SFError``, so a test that parses a header proves its syntax,
not just its text.
"""

from __future__ import annotations

import base64
import string
from dataclasses import dataclass, field

BareItem = int | float | str | bytes | bool

_LCALPHA = set(string.ascii_lowercase)
_DIGIT = set(string.digits)
_ALPHA = set(string.ascii_letters)
_TCHAR = set("!#$%&'*+-.^_`|~") | _ALPHA | _DIGIT
_KEY_CHARS = _LCALPHA | _DIGIT | set("_-.*")
_BASE64 = set(string.ascii_letters + string.digits + "+/=")


class SFError(ValueError):
    """The text is not valid structured-field syntax."""


@dataclass(frozen=True)
class Token:
    """An sf-token (kept apart from sf-string, which the draft requires for policy names)."""

    value: str


@dataclass
class Item:
    """One list member: a bare item and its parameters, in order."""

    value: BareItem | Token
    params: dict[str, BareItem | Token] = field(default_factory=dict)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        if not char:
            raise SFError(f"unexpected end of input in {self.text!r}")
        self.pos += 1
        return char

    def fail(self, what: str) -> SFError:
        return SFError(f"{what} at offset {self.pos} of {self.text!r}")

    def skip_sp(self) -> None:
        while self.peek() == " ":
            self.pos += 1

    def skip_ows(self) -> None:
        while self.peek() in (" ", "\t") and self.peek():
            self.pos += 1

    def parse_list(self) -> list[Item]:
        members: list[Item] = []
        while self.pos < len(self.text):
            if self.peek() == "(":
                raise self.fail("inner lists are not used by the RateLimit fields")
            members.append(self.parse_item())
            self.skip_ows()
            if self.pos >= len(self.text):
                return members
            if self.take() != ",":
                raise self.fail("expected ',' between list members")
            self.skip_ows()
            if self.pos >= len(self.text):
                raise self.fail("trailing comma")
        return members

    def parse_item(self) -> Item:
        value = self.parse_bare_item()
        return Item(value, self.parse_parameters())

    def parse_parameters(self) -> dict[str, BareItem | Token]:
        params: dict[str, BareItem | Token] = {}
        while self.peek() == ";":
            self.pos += 1
            self.skip_sp()
            key = self.parse_key()
            value: BareItem | Token = True
            if self.peek() == "=":
                self.pos += 1
                value = self.parse_bare_item()
            params[key] = value
        return params

    def parse_key(self) -> str:
        first = self.peek()
        if first not in _LCALPHA and first != "*":
            raise self.fail("a key must start with a lower-case letter or '*'")
        start = self.pos
        while self.peek() and self.peek() in _KEY_CHARS:
            self.pos += 1
        return self.text[start : self.pos]

    def parse_bare_item(self) -> BareItem | Token:
        char = self.peek()
        if char == "-" or char in _DIGIT:
            return self.parse_number()
        if char == '"':
            return self.parse_string()
        if char in _ALPHA or char == "*":
            return self.parse_token()
        if char == ":":
            return self.parse_bytes()
        if char == "?":
            return self.parse_boolean()
        raise self.fail("expected a bare item")

    def parse_number(self) -> int | float:
        sign = 1
        if self.peek() == "-":
            self.pos += 1
            sign = -1
        if self.peek() not in _DIGIT or not self.peek():
            raise self.fail("expected a digit")
        start = self.pos
        decimal = False
        while self.peek() and (self.peek() in _DIGIT or self.peek() == "."):
            if self.peek() == ".":
                if decimal:
                    raise self.fail("two decimal points")
                if self.pos - start > 12:
                    raise self.fail("too many integer digits in a decimal")
                decimal = True
            self.pos += 1
            if not decimal and self.pos - start > 15:
                raise self.fail("an integer has at most 15 digits")
            if decimal and self.pos - start > 16:
                raise self.fail("a decimal has at most 16 characters")
        number = self.text[start : self.pos]
        if decimal:
            if number.endswith("."):
                raise self.fail("a decimal cannot end with '.'")
            if len(number.split(".", 1)[1]) > 3:
                raise self.fail("a decimal has at most 3 fraction digits")
            return sign * float(number)
        return sign * int(number)

    def parse_string(self) -> str:
        self.take()  # the opening quote
        out: list[str] = []
        while True:
            char = self.take()
            if char == "\\":
                escaped = self.take()
                if escaped not in ('"', "\\"):
                    raise self.fail('only \\" and \\\\ are escapes in a string')
                out.append(escaped)
            elif char == '"':
                return "".join(out)
            elif not 0x20 <= ord(char) <= 0x7E:
                raise self.fail(f"character {char!r} is not allowed in a string")
            else:
                out.append(char)

    def parse_token(self) -> Token:
        start = self.pos
        self.pos += 1
        while self.peek() and (self.peek() in _TCHAR or self.peek() in ":/"):
            self.pos += 1
        return Token(self.text[start : self.pos])

    def parse_bytes(self) -> bytes:
        self.take()
        start = self.pos
        while self.peek() and self.peek() != ":":
            if self.peek() not in _BASE64:
                raise self.fail("not base64")
            self.pos += 1
        data = self.text[start : self.pos]
        self.take()
        return base64.b64decode(data)

    def parse_boolean(self) -> bool:
        self.take()
        char = self.take()
        if char not in "01":
            raise self.fail("a boolean is ?0 or ?1")
        return char == "1"


def parse_list(*field_lines: str) -> list[Item]:
    """Parse one List field, given as one or more field lines (combined with ', ')."""
    text = ", ".join(field_lines).strip(" ")
    if not text:
        raise SFError("an empty field is not a List")
    return _Parser(text).parse_list()
