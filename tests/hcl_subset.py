"""A parser for the subset of HCL (Terraform's language) that edgegen writes.

Used by the tests to read ``ratelimit.tf`` back and compare it with the JSON ruleset. It
follows the HCL native syntax for what it covers: blocks with labels, ``name = value``
attributes, objects, tuples (trailing commas allowed), strings with the escapes ``\\n \\r
\\t \\" \\\\ \\uNNNN \\UNNNNNNNN``, ``$${``/``%%{`` for literal ``${``/``%{`` (a bare ``${`` or
``%{`` is an interpolation or directive and is refused), numbers, booleans, references
and function calls (``concat(a, b)``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


class HclError(ValueError):
    """The text is not in the subset."""


@dataclass(frozen=True)
class Reference:
    """A bare traversal like ``var.zone_id`` or a type keyword like ``string``."""

    name: str


@dataclass(frozen=True)
class Call:
    """A function call like ``concat(var.extra_rules, local.edgegen_rules)``."""

    name: str
    args: tuple[Any, ...]


_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_NUMBER = re.compile(r"-?\d+(\.\d+)?")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip(self, newlines: bool = True) -> None:
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            elif char in " \t" or (newlines and char == "\n"):
                self.pos += 1
            else:
                break

    def expect(self, literal: str) -> None:
        self.skip()
        if not self.text.startswith(literal, self.pos):
            raise HclError(
                f"expected {literal!r} at {self.pos}: {self.text[self.pos : self.pos + 30]!r}"
            )
        self.pos += len(literal)

    def name(self) -> str:
        self.skip()
        match = _NAME.match(self.text, self.pos)
        if not match:
            raise HclError(f"expected a name at {self.pos}")
        self.pos = match.end()
        return match.group(0)

    def string(self) -> str:
        self.skip()
        if self.text[self.pos] != '"':
            raise HclError(f"expected a string at {self.pos}")
        self.pos += 1
        out: list[str] = []
        while True:
            if self.pos >= len(self.text):
                raise HclError("unterminated string")
            char = self.text[self.pos]
            if char == '"':
                self.pos += 1
                return "".join(out)
            if char == "\n":
                raise HclError("newline inside a quoted string")
            if char == "\\":
                nxt = self.text[self.pos + 1]
                if nxt in _SIMPLE_ESCAPES:
                    out.append(_SIMPLE_ESCAPES[nxt])
                    self.pos += 2
                elif nxt == "u":
                    out.append(chr(int(self.text[self.pos + 2 : self.pos + 6], 16)))
                    self.pos += 6
                elif nxt == "U":
                    out.append(chr(int(self.text[self.pos + 2 : self.pos + 10], 16)))
                    self.pos += 10
                else:
                    raise HclError(f"unknown escape \\{nxt}")
                continue
            if char in "$%" and self.text.startswith("{", self.pos + 1):
                raise HclError(f"template sequence {char}{{ in a string at {self.pos}")
            if char in "$%" and self.text.startswith(char + "{", self.pos + 1):
                out.append(char + "{")
                self.pos += 3
                continue
            out.append(char)
            self.pos += 1

    def value(self) -> Any:
        self.skip()
        char = self.text[self.pos]
        if char == '"':
            return self.string()
        if char == "[":
            self.pos += 1
            items: list[Any] = []
            while True:
                self.skip()
                if self.text[self.pos] == "]":
                    self.pos += 1
                    return items
                items.append(self.value())
                self.skip()
                if self.text[self.pos] == ",":
                    self.pos += 1
                elif self.text[self.pos] != "]":
                    raise HclError(f"expected , or ] at {self.pos}")
        if char == "{":
            self.pos += 1
            return self.body("}")
        number = _NUMBER.match(self.text, self.pos)
        if number:
            self.pos = number.end()
            text = number.group(0)
            return float(text) if "." in text else int(text)
        word = self.name()
        if self.text.startswith("(", self.pos):
            self.pos += 1
            args: list[Any] = []
            while True:
                self.skip()
                if self.text[self.pos] == ")":
                    self.pos += 1
                    return Call(word, tuple(args))
                args.append(self.value())
                self.skip()
                if self.text[self.pos] == ",":
                    self.pos += 1
                elif self.text[self.pos] != ")":
                    raise HclError(f"expected , or ) at {self.pos}")
        if word == "true":
            return True
        if word == "false":
            return False
        return Reference(word)

    def body(self, closer: str | None) -> dict[str, Any]:
        """Attributes and blocks until ``closer`` (or the end of the file)."""
        out: dict[str, Any] = {}
        while True:
            self.skip()
            if self.pos >= len(self.text):
                if closer is None:
                    return out
                raise HclError("unexpected end of file")
            if closer is not None and self.text[self.pos] == closer:
                self.pos += 1
                return out
            key = self.name()
            self.skip(newlines=False)
            if self.text[self.pos] == "=":
                self.pos += 1
                if key in out:
                    raise HclError(f"attribute {key!r} set twice")
                out[key] = self.value()
                continue
            labels: list[str] = []
            while self.text[self.pos] == '"':
                labels.append(self.string())
                self.skip(newlines=False)
            self.expect("{")
            out.setdefault(key, []).append((tuple(labels), self.body("}")))


def parse(text: str) -> dict[str, Any]:
    """Parse a whole file: attributes -> values, block types -> [(labels, body)]."""
    return _Parser(text).body(None)
