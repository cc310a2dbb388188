"""A small builder for Cloudflare Rules language (wirefilter) expressions.

Every string that comes from the policy enters an expression through :func:`string`, which
escapes it; nothing else in edgegen writes expression text. Operands are parenthesised
whenever they are not a single comparison, so precedence never depends on the reader
knowing that ``and`` binds tighter than ``or``. :func:`render` refuses expressions over
Cloudflare's 4,096-character limit.

Paths. Policy paths are decoded (``/café``, as the router declares them); rules compare
``http.request.uri.path``, which holds the path after the zone's URL normalisation:
escaped unreserved characters decoded, other escapes in upper-case hex, literal bytes
outside the URL path set percent-encoded, dot segments removed, and (type "cloudflare")
``\\`` turned into ``/`` and ``//`` merged. :func:`normalized_path` writes a policy path
in that form. ``%2F`` is not decoded there, yet the app decodes it (``/api%2Fitems`` reaches
the handler of ``/api/items``), so :func:`path_spellings` also lists ``%2F`` in place of
each of the policy path's own slashes after the leading one (the first
``MAX_SLASH_SPELLINGS``), and an exact path with one trailing ``/`` or ``%2F``, each also
followed by ``%0A``: a Starlette route's ``$`` matches before a final newline, so
``/login%0A`` runs the handler of ``/login`` in an app without applimit's middleware (which
refuses every path with a control character, as the Worker does).
:func:`fitted_expression` drops spellings (the ``%2F`` of later slashes first, the trailing
ones last) when the expression would pass 4,096 characters.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from edgegen_policy import AuthenticatedWhen, Matcher

from .._capabilities import COOKIES, HEADERS, HOST, MAX_EXPRESSION_LENGTH, METHOD, PATH

# The slashes after the leading one, per policy path or prefix, whose %2F spelling the rule
# matches too: 2**3 = 8 spellings of a path at most (24 for an exact path, with the
# trailing / and %2F), so that a few paths stay well within the length limit.
MAX_SLASH_SPELLINGS = 3
ENCODED_SLASH = "%2F"
# A final newline, which a Starlette route's "$" lets through (the rule cannot refuse it).
ENCODED_NEWLINE = "%0A"
EXACT_ENDINGS = ("", "/", ENCODED_SLASH)
# What Cloudflare's URL normalisation leaves literal in a path (RFC 3986 unreserved and
# reserved characters); every other byte is percent-encoded with upper-case hex. "%" is
# not among them: a policy path holds no escapes, so its "%" is a literal one, "%25".
_NORMALIZED_LITERAL = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:/?#[]@!$&'()*+,;="
)


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


def cookie_present(name: str, *, valued: bool = False) -> Expr:
    """The cookie is sent (with any value); ``valued``: with a non-empty value, as
    :func:`header_present` tests a header (a key counted per its value, where an empty
    value is no key: the Worker counts such a request per client IP too).

    ``len`` of the cookie's array of values; a comparison on an absent cookie is false,
    so this is true exactly when the cookie appears at least once.
    """
    if valued:
        return Expr(f"any(len({COOKIES}[{string(name)}][*])[*] gt 0)")
    return Expr(f"len({COOKIES}[{string(name)}]) gt 0")


@dataclass(frozen=True, slots=True)
class Spellings:
    """Which spellings of the policy's paths an expression matches besides the plain one.

    ``slashes``: how many of each path's slashes after the leading one may also be ``%2F``;
    ``trailing``: exact paths also with one trailing ``/`` or ``%2F``, and each followed by
    ``%0A`` (an encoded final newline).
    """

    slashes: int = MAX_SLASH_SPELLINGS
    trailing: bool = True

    @property
    def complete(self) -> bool:
        """True when nothing was left out to fit the length limit."""
        return self.slashes == MAX_SLASH_SPELLINGS and self.trailing


ALL_SPELLINGS = Spellings()
# Tried in this order until the expression fits in 4,096 characters.
SPELLING_STEPS = (
    *(Spellings(n) for n in range(MAX_SLASH_SPELLINGS, -1, -1)),
    Spellings(0, trailing=False),
)


def normalized_path(path: str) -> str:
    """A decoded path or prefix from the policy as the normalised request path holds it.

    ``/café`` becomes ``/caf%C3%A9``, ``/a b`` ``/a%20b``, ``/a|b`` ``/a%7Cb``, ``/100%``
    ``/100%25``; unreserved and reserved characters stay.
    """
    try:
        data = path.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(path[exc.start])
        raise ExpressionError(
            f"{path!r} contains the character U+{code:04X}, which a rule expression cannot "
            "hold; remove it"
        ) from None
    return "".join(chr(b) if b in _NORMALIZED_LITERAL else f"%{b:02X}" for b in data)


def path_spellings(path: str, *, exact: bool, spellings: Spellings = ALL_SPELLINGS) -> list[str]:
    """The spellings of a policy path (``exact``) or prefix a rule compares the path with.

    The normalised form, with ``%2F`` for any of its first ``spellings.slashes`` slashes
    after the leading one (the app decodes ``%2F``; Cloudflare's normalisation does not); an
    exact path also with one trailing ``/`` or ``%2F`` (the app reads ``/login/`` as
    ``/login``), and each of those followed by ``%0A``. The plain spelling comes first.
    """
    encoded = normalized_path(path)
    head, pieces = encoded[:1], encoded[1:].split("/")
    inner = len(pieces) - 1
    varied = min(spellings.slashes, inner)
    out: list[str] = []
    for choice in itertools.product(("/", ENCODED_SLASH), repeat=varied):
        separators = (*choice, *("/",) * (inner - varied))
        text = head + pieces[0] + "".join(map("".join, zip(separators, pieces[1:], strict=True)))
        if exact and spellings.trailing:
            out.extend(text + ending for ending in EXACT_ENDINGS)
            out.extend(text + ending + ENCODED_NEWLINE for ending in EXACT_ENDINGS)
        else:
            out.append(text)
    return list(dict.fromkeys(out))


def path_condition(matcher: Matcher, spellings: Spellings = ALL_SPELLINGS) -> Expr | None:
    """Exact paths OR prefixes, in every listed spelling; None when the matcher takes every
    path."""
    parts: list[Expr] = []
    if matcher.paths:
        values = {
            s for p in matcher.paths for s in path_spellings(p, exact=True, spellings=spellings)
        }
        parts.append(one_of(PATH, sorted(values)))
    for prefix in matcher.path_prefixes:
        parts.extend(
            starts_with(PATH, spelling)
            for spelling in path_spellings(prefix, exact=False, spellings=spellings)
        )
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


def authenticated(when: AuthenticatedWhen, *, valued: bool = False) -> Expr | None:
    """The request carries a listed credential; None when no credential is listed.
    ``valued``: a cookie counts only with a non-empty value (:func:`cookie_present`)."""
    parts = [header_present(h) for h in when.headers]
    parts.extend(cookie_present(c, valued=valued) for c in when.cookies)
    return any_of(parts) if parts else None


def matcher_expression(
    matcher: Matcher,
    unauthenticated: AuthenticatedWhen | None = None,
    *,
    credentialed: AuthenticatedWhen | None = None,
    spellings: Spellings = ALL_SPELLINGS,
    valued: bool = False,
) -> Expr:
    """The expression for a policy matcher, optionally limited to the requests without
    (``unauthenticated``) or with (``credentialed``) one of the listed credentials.

    Means the same as ``Matcher.matches_raw`` on the normalised path: (exact paths OR
    prefixes) AND methods AND hosts.
    """
    parts = [
        part
        for part in (
            path_condition(matcher, spellings),
            method_condition(matcher),
            host_condition(matcher),
        )
        if part is not None
    ]
    if unauthenticated is not None:
        credentials = authenticated(unauthenticated, valued=valued)
        if credentials is not None:
            parts.append(not_(credentials))
    if credentialed is not None:
        credentials = authenticated(credentialed, valued=valued)
        if credentials is not None:
            parts.append(credentials)
    return all_of(parts)


def fitted_expression(
    matcher: Matcher,
    unauthenticated: AuthenticatedWhen | None = None,
    *,
    credentialed: AuthenticatedWhen | None = None,
    valued: bool = False,
) -> tuple[str, Spellings]:
    """The expression text with as many path spellings as fit in 4,096 characters.

    Returns the text and the spellings it kept; ExpressionError when even the plain
    spellings are too long.
    """
    expr = TRUE
    for spellings in SPELLING_STEPS:
        expr = matcher_expression(
            matcher, unauthenticated, credentialed=credentialed, spellings=spellings, valued=valued
        )
        if len(expr.text) <= MAX_EXPRESSION_LENGTH:
            return expr.text, spellings
    return render(expr), SPELLING_STEPS[-1]


# The response field a counting expression reads (rate limiting parameters page: "the
# counting expression can include response fields"); never usable in a rule's expression.
RESPONSE_CODE = "http.response.code"


def status_condition(ranges: Sequence[tuple[int, int]]) -> Expr:
    """``http.response.code`` in a policy's ``count_when`` statuses: ``eq 401`` for one,
    else an inline set whose ranges are written ``500..599`` (integer ranges in sets)."""
    items = [str(low) if low == high else f"{low}..{high}" for low, high in ranges]
    if not items:
        raise ExpressionError("count_when lists no status")
    if len(items) == 1 and ".." not in items[0]:
        return Expr(f"{RESPONSE_CODE} eq {items[0]}")
    return Expr(f"{RESPONSE_CODE} in {{{' '.join(items)}}}")


def counting_expression(match: str, ranges: Sequence[tuple[int, int]]) -> str:
    """The counting expression of a rule whose ``count_when`` lists ``ranges``.

    A counting expression does not extend the rule's matching expression, it replaces it
    (rate limiting parameters page: "you may wish to include the matching expression in the
    counting expression"), so it carries the match too: otherwise an answer of that status
    on any URL of the zone would count. ExpressionError when over 4,096 characters.
    """
    status = status_condition(ranges)
    text = status.text if match == TRUE.text else f"({match}) and {status.text}"
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(
            f"the counting expression (the match and count_when's statuses) is {len(text):,} "
            f"characters long and Cloudflare allows {MAX_EXPRESSION_LENGTH:,}"
        )
    return text


def render(expr: Expr) -> str:
    """The final expression text; ExpressionError when it exceeds 4,096 characters."""
    if len(expr.text) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(
            f"the rule expression is {len(expr.text):,} characters long and Cloudflare allows "
            f"{MAX_EXPRESSION_LENGTH:,}"
        )
    return expr.text
