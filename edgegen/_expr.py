"""A small builder for Cloudflare Rules language (wirefilter) expressions.

Every string that comes from the policy enters an expression through :func:`string`, which
escapes it; nothing else in edgegen writes expression text. Operands are parenthesised
whenever they are not a single comparison, so precedence never depends on the reader
knowing that ``and`` binds tighter than ``or``. :func:`render` refuses expressions over
Cloudflare's 4,096-character limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from policy import AuthenticatedWhen, Matcher
from policy.capabilities import COOKIES, HEADERS, HOST, METHOD, PATH

MAX_EXPRESSION_LENGTH = 4096


class ExpressionError(ValueError):
    """An expression Cloudflare would reject: a string it cannot hold, or too long."""


@dataclass(frozen=True, slots=True)
class Expr:
    """A piece of expression text; ``atom`` is False for ``and``/``or``/``not`` forms."""

    text: str
    atom: bool = True

    def operand(self) -> str:
        """The text, parenthesised unless it is a single comparison or call."""
        return self.text if self.atom else f"({self.text})"


TRUE = Expr("true")


def string(value: str) -> str:
    """A double-quoted string literal with ``\\`` and ``"`` escaped.

    Control characters and lone surrogates are refused: the Rules language has no escape
    for them, and no request field edgegen compares can contain them.
    """
    for char in value:
        code = ord(char)
        if code < 0x20 or code == 0x7F or 0xD800 <= code <= 0xDFFF:
            raise ExpressionError(
                f"{value!r} contains the character U+{code:04X}, which a rule expression "
                "cannot hold; remove it"
            )
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def string_set(values: Iterable[str]) -> str:
    """An inline set: ``{"a" "b"}``."""
    return "{" + " ".join(string(v) for v in values) + "}"


def eq(field: str, value: str) -> Expr:
    """``field eq "value"``."""
    return Expr(f"{field} eq {string(value)}")


def one_of(field: str, values: Sequence[str]) -> Expr:
    """``field eq "a"`` for one value, ``field in {"a" "b"}`` for several."""
    if len(values) == 1:
        return eq(field, values[0])
    return Expr(f"{field} in {string_set(values)}")


def starts_with(field: str, value: str) -> Expr:
    """``starts_with(field, "value")``."""
    return Expr(f"starts_with({field}, {string(value)})")


def ends_with(field: str, value: str) -> Expr:
    """``ends_with(field, "value")``."""
    return Expr(f"ends_with({field}, {string(value)})")


def _join(parts: Sequence[Expr], word: str) -> Expr:
    if not parts:
        raise ExpressionError(f"an empty '{word}' has no meaning; give at least one part")
    if len(parts) == 1:
        return parts[0]
    return Expr(f" {word} ".join(p.operand() for p in parts), atom=False)


def any_of(parts: Sequence[Expr]) -> Expr:
    """True when any part is true (``or``)."""
    return _join(parts, "or")


def all_of(parts: Sequence[Expr]) -> Expr:
    """True when every part is true (``and``); no parts at all is ``true``."""
    return _join(parts, "and") if parts else TRUE


def not_(part: Expr) -> Expr:
    """Negation, with parentheses around a compound operand.

    ``not`` binds tightest, so ``not (...)`` is itself a single operand.
    """
    return Expr(f"not {part.operand()}")


def header_present(name: str) -> Expr:
    """Some value of the header is non-empty.

    ``http.request.headers`` maps lower-case names to arrays of values; ``len(...[*])[*]``
    is the length of each value, and ``any`` over the values of an absent header is false.
    """
    return Expr(f"any(len({HEADERS}[{string(name.lower())}][*])[*] gt 0)")


def cookie_present(name: str) -> Expr:
    """The cookie is sent (with any value).

    ``len`` of the cookie's array of values; a comparison on an absent cookie is false,
    so this is true exactly when the cookie appears at least once.
    """
    return Expr(f"len({COOKIES}[{string(name)}]) gt 0")


def path_condition(matcher: Matcher) -> Expr | None:
    """Exact paths OR prefixes; None when the matcher takes every path."""
    parts: list[Expr] = []
    if matcher.paths:
        parts.append(one_of(PATH, sorted(matcher.paths)))
    parts.extend(starts_with(PATH, prefix) for prefix in matcher.path_prefixes)
    return any_of(parts) if parts else None


def method_condition(matcher: Matcher) -> Expr | None:
    """The request method is one of the listed ones; None for any method."""
    if not matcher.methods:
        return None
    return one_of(METHOD, sorted(matcher.methods))


def host_condition(matcher: Matcher) -> Expr | None:
    """Exact hosts, and ``*.example.com`` as ``ends_with(http.host, ".example.com")``."""
    exact = [h for h in matcher.hosts if not h.startswith("*.")]
    wild = [h[1:] for h in matcher.hosts if h.startswith("*.")]
    parts: list[Expr] = []
    if exact:
        parts.append(one_of(HOST, exact))
    parts.extend(ends_with(HOST, suffix) for suffix in wild)
    return any_of(parts) if parts else None


def authenticated(when: AuthenticatedWhen) -> Expr | None:
    """The request carries a listed credential; None when no credential is listed."""
    parts = [header_present(h) for h in when.headers]
    parts.extend(cookie_present(c) for c in when.cookies)
    return any_of(parts) if parts else None


def matcher_expression(matcher: Matcher, unauthenticated: AuthenticatedWhen | None = None) -> Expr:
    """The expression for a policy matcher, optionally limited to unauthenticated requests.

    Means the same as ``Matcher.matches``: (exact paths OR prefixes) AND methods AND hosts.
    """
    parts = [
        part
        for part in (path_condition(matcher), method_condition(matcher), host_condition(matcher))
        if part is not None
    ]
    if unauthenticated is not None:
        credentials = authenticated(unauthenticated)
        if credentials is not None:
            parts.append(not_(credentials))
    return all_of(parts)


def render(expr: Expr) -> str:
    """The final expression text; ExpressionError when it exceeds 4,096 characters."""
    if len(expr.text) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(
            f"the rule expression is {len(expr.text):,} characters long and Cloudflare allows "
            f"{MAX_EXPRESSION_LENGTH:,}"
        )
    return expr.text
