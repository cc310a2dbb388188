"""A parser and evaluator for the subset of Cloudflare's Rules language that edgegen writes.

Used by the tests to check that generated expressions are well formed (every string
literal closes, every escape is one the language has) and that they *mean* what the
policy's Python matcher means, on the same requests. It follows the documented semantics:
maps of arrays for headers and cookies, ``[*]`` to iterate, and any comparison on a missing
value is false.

Grammar (the subset)::

    expr       := or
    or         := and ("or" and)*
    and        := unary ("and" unary)*
    unary      := "not" unary | primary
    primary    := "(" expr ")" | "true" | "false" | comparison
    comparison := value (("eq" (STRING | NUMBER)) | ("gt" NUMBER) | ("in" "{" STRING+ "}")
                  | ("in" "{" (NUMBER | NUMBER ".." NUMBER)+ "}"))?
    value      := (call | FIELD) index*
    call       := NAME "(" comparison ("," STRING)* ")"
    index      := "[" STRING "]" | "[*]"

:func:`cloudflare_normalize` models the zone's URL normalisation, which decides what
``http.request.uri.path`` holds for a raw request path (see docs/edge.md, "What each layer
sees").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


class Missing:
    """The value of a field that is not there (an absent header or cookie)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING = Missing()
_TOKEN = re.compile(
    r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<number>\d+)|(?P<name>[a-z_][a-z0-9_.]*)'
    r"|(?P<punct>\[\*\]|\.\.|[()\[\]{},]))"
)


class ParseError(ValueError):
    """The expression is not in the subset (or not well formed at all)."""


# --- Cloudflare's URL normalisation -------------------------------------------------------

NORMALIZATION_TYPES = ("cloudflare", "rfc3986", "none")
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# RFC 3986 reserved characters, which the normalisation neither encodes nor decodes.
_RESERVED = frozenset(b":/?#[]@!$&'()*+,;=")
_HEX = frozenset(b"0123456789ABCDEFabcdef")
_SLASH_RUN = re.compile(r"/{2,}")


def _path_bytes(raw: str) -> bytes:
    """A str as the bytes a client sends: UTF-8; surrogate escapes are the bytes they hold,
    lone surrogates become U+FFFD."""
    try:
        return raw.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        cleaned = "".join(
            "\ufffd" if 0xD800 <= ord(c) <= 0xDFFF and not 0xDC80 <= ord(c) <= 0xDCFF else c
            for c in raw
        )
        return cleaned.encode("utf-8", "surrogateescape")


def remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4, step by step as the RFC writes it."""
    source, out = path, ""
    while source:
        if source.startswith("../"):
            source = source[3:]
        elif source.startswith("./"):
            source = source[2:]
        elif source.startswith("/./"):
            source = "/" + source[3:]
        elif source == "/.":
            source = "/"
        elif source.startswith("/../") or source == "/..":
            source = "/" + source[4:] if source.startswith("/../") else "/"
            out = out[: max(out.rfind("/"), 0)]
        elif source in (".", ".."):
            source = ""
        else:
            end = source.find("/", 1 if source.startswith("/") else 0)
            end = len(source) if end < 0 else end
            out, source = out + source[:end], source[end:]
    return out


def cloudflare_normalize(raw_path: str, type_: str = "cloudflare") -> str:
    """What ``http.request.uri.path`` holds for a raw request path (query and fragment are
    not part of it), under the zone's URL normalisation.

    - ``"cloudflare"`` (the default type, scope "incoming"): ``\\`` turned into ``/``, runs
      of ``/`` merged, then the RFC 3986 steps below.
    - ``"rfc3986"``: escaped unreserved characters (``A-Z a-z 0-9 - . _ ~``) decoded, the
      hex of other escapes in upper case, literal bytes that are neither unreserved nor
      reserved percent-encoded (``\\`` as ``%5C``, a ``%`` that starts no escape as
      ``%25``), then dot segments removed. ``//`` stays, and ``%2F`` stays encoded.
    - ``"none"`` (scope "none": normalisation off): the raw path as sent.

    Cloudflare documents the steps but not every corner: the ``%25`` for a stray ``%`` is
    this model's assumption.
    """
    path = raw_path
    for separator in ("?", "#"):
        path = path.split(separator, 1)[0]
    if type_ == "none":
        return path
    if type_ == "cloudflare":
        path = _SLASH_RUN.sub("/", path.replace("\\", "/"))
    elif type_ != "rfc3986":
        raise ValueError(f"unknown normalisation type {type_!r}; use one of {NORMALIZATION_TYPES}")
    data = _path_bytes(path)
    out: list[str] = []
    index = 0
    while index < len(data):
        byte = data[index]
        pair = data[index + 1 : index + 3]
        if byte == 0x25 and len(pair) == 2 and set(pair) <= _HEX:
            value = int(pair, 16)
            out.append(chr(value) if value in _UNRESERVED else "%" + pair.decode().upper())
            index += 3
            continue
        out.append(chr(byte) if byte in _UNRESERVED or byte in _RESERVED else f"%{byte:02X}")
        index += 1
    return remove_dot_segments("".join(out))


def unescape(literal: str) -> str:
    """The value of a string literal; only ``\\"`` and ``\\\\`` are escapes."""
    body = literal[1:-1]
    out: list[str] = []
    index = 0
    while index < len(body):
        char = body[index]
        if char == "\\":
            nxt = body[index + 1]
            if nxt not in '"\\':
                raise ParseError(f"unknown escape \\{nxt} in {literal}")
            out.append(nxt)
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)


def tokenize(text: str) -> list[tuple[str, str]]:
    """Split an expression into (kind, text) tokens; ParseError on anything else."""
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if not match:
            raise ParseError(f"unexpected text at {position}: {text[position : position + 20]!r}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


@dataclass
class Request:
    """What the expression sees of a request."""

    path: str
    method: str
    host: str
    headers: dict[str, list[str]] = field(default_factory=dict)
    cookies: dict[str, list[str]] = field(default_factory=dict)
    # The answer's status, for counting expressions; None before there is one.
    status: int | None = None

    def fields(self) -> dict[str, Any]:
        """Field name -> value."""
        return {
            "http.response.code": MISSING if self.status is None else self.status,
            "http.request.uri.path": self.path,
            "http.request.method": self.method,
            "http.host": self.host,
            "http.request.headers": self.headers,
            "http.request.cookies": self.cookies,
        }


@dataclass(frozen=True)
class Array:
    """The values produced by ``[*]`` (and by functions applied to them)."""

    items: tuple[Any, ...]


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.position = 0
        self.strings: list[str] = []

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise ParseError("unexpected end of expression")
        if expected is not None and token[1] != expected:
            raise ParseError(f"expected {expected!r}, found {token[1]!r}")
        self.position += 1
        return token

    def string(self) -> str:
        kind, text = self.take()
        if kind != "string":
            raise ParseError(f"expected a string, found {text!r}")
        value = unescape(text)
        self.strings.append(value)
        return value

    def parse(self) -> Any:
        node = self.or_()
        if self.peek() is not None:
            raise ParseError(f"trailing tokens from {self.peek()!r}")
        return node

    def or_(self) -> Any:
        parts = [self.and_()]
        while self.peek() == ("name", "or"):
            self.take()
            parts.append(self.and_())
        return ("or", parts) if len(parts) > 1 else parts[0]

    def and_(self) -> Any:
        parts = [self.unary()]
        while self.peek() == ("name", "and"):
            self.take()
            parts.append(self.unary())
        return ("and", parts) if len(parts) > 1 else parts[0]

    def unary(self) -> Any:
        if self.peek() == ("name", "not"):
            self.take()
            return ("not", self.unary())
        return self.primary()

    def primary(self) -> Any:
        token = self.peek()
        if token == ("punct", "("):
            self.take()
            node = self.or_()
            self.take(")")
            return node
        if token in (("name", "true"), ("name", "false")):
            self.take()
            return ("const", token[1] == "true")
        return self.comparison()

    def comparison(self) -> Any:
        value = self.value()
        nxt = self.peek()
        if nxt == ("name", "eq"):
            self.take()
            if self.next_is_number():
                return ("cmp", "eq", value, int(self.take()[1]))
            return ("cmp", "eq", value, self.string())
        if nxt == ("name", "gt"):
            self.take()
            kind, number = self.take()
            if kind != "number":
                raise ParseError(f"gt needs a number, found {number!r}")
            return ("cmp", "gt", value, int(number))
        if nxt == ("name", "in"):
            self.take()
            self.take("{")
            if self.next_is_number():
                return ("cmp", "in", value, self.numbers())
            items: list[str] = []
            while self.peek() != ("punct", "}"):
                items.append(self.string())
            self.take("}")
            if not items:
                raise ParseError("an empty set")
            return ("cmp", "in", value, frozenset(items))
        return value

    def next_is_number(self) -> bool:
        token = self.peek()
        return token is not None and token[0] == "number"

    def numbers(self) -> frozenset[int]:
        """An integer set's items up to its "}": numbers and ranges ``500..599``."""
        found: set[int] = set()
        while self.peek() != ("punct", "}"):
            kind, low = self.take()
            if kind != "number":
                raise ParseError(f"an integer set holds numbers, found {low!r}")
            high = low
            if self.peek() == ("punct", ".."):
                self.take()
                kind, high = self.take()
                if kind != "number" or int(high) < int(low):
                    raise ParseError(f"a bad range {low}..{high}")
            found.update(range(int(low), int(high) + 1))
        self.take("}")
        return frozenset(found)

    def value(self) -> Any:
        kind, name = self.take()
        if kind != "name":
            raise ParseError(f"expected a field or function, found {name!r}")
        if self.peek() == ("punct", "("):
            self.take()
            args: list[Any] = [self.comparison()]
            while self.peek() == ("punct", ","):
                self.take()
                args.append(("str", self.string()))
            self.take(")")
            if name not in ("any", "len", "starts_with", "ends_with"):
                raise ParseError(f"unknown function {name!r}")
            node: Any = ("call", name, args)
        else:
            if name not in Request("", "", "").fields():
                raise ParseError(f"unknown field {name!r}")
            node = ("field", name)
        while self.peek() in (("punct", "["), ("punct", "[*]")):
            if self.take()[1] == "[*]":
                node = ("star", node)
            else:
                node = ("index", node, self.string())
                self.take("]")
        return node


def parse(text: str) -> tuple[Any, list[str]]:
    """Parse an expression; returns the tree and every string literal's value, in order."""
    parser = _Parser(text)
    return parser.parse(), parser.strings


def _compare(op: str, left: Any, right: Any) -> bool:
    if isinstance(left, Missing):
        return False
    if op == "eq":
        return bool(left == right)
    if op == "gt":
        return isinstance(left, int) and left > right
    return bool(left in right)


def _eval(node: Any, request: Request) -> Any:
    kind = node[0]
    if kind == "const":
        return node[1]
    if kind == "str":
        return node[1]
    if kind == "field":
        return request.fields()[node[1]]
    if kind == "index":
        container = _eval(node[1], request)
        if not isinstance(container, dict):
            return MISSING
        return container.get(node[2], MISSING)
    if kind == "star":
        inner = _eval(node[1], request)
        if isinstance(inner, Array):
            return inner
        # Iterating a missing array yields nothing.
        return Array(() if isinstance(inner, Missing) else tuple(inner))
    if kind == "cmp":
        left = _eval(node[2], request)
        if isinstance(left, Array):
            return Array(tuple(_compare(node[1], v, node[3]) for v in left.items))
        return _compare(node[1], left, node[3])
    if kind == "call":
        name, args = node[1], node[2]
        first = _eval(args[0], request)
        if name == "any":
            if not isinstance(first, Array):
                raise ParseError("any() needs an array argument")
            return any(v is True for v in first.items)
        if name == "len":
            if isinstance(first, Array):
                return Array(tuple(_length(v) for v in first.items))
            return _length(first)
        if not isinstance(first, str):
            return MISSING
        other = _eval(args[1], request)
        return first.startswith(other) if name == "starts_with" else first.endswith(other)
    if kind == "or":
        return any(_truth(part, request) for part in node[1])
    if kind == "and":
        return all(_truth(part, request) for part in node[1])
    if kind == "not":
        return not _truth(node[1], request)
    raise ParseError(f"cannot evaluate {node!r}")


def _length(value: Any) -> Any:
    if isinstance(value, Missing):
        return MISSING
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    return len(value)


def _truth(node: Any, request: Request) -> bool:
    value = _eval(node, request)
    if isinstance(value, Array):
        raise ParseError("an array used as a condition; wrap it in any()")
    return value is True


def evaluate(tree: Any, request: Request) -> bool:
    """The value of a parsed expression for a request."""
    return _truth(tree, request)
