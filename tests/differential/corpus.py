"""The corpus: request spellings drawn by Hypothesis from the policy's matchers.

Every spelling starts from a path the policy or the apps name (each limit's exact paths, each
prefix with a drawn tail, each route with its parameters filled in, and a few near misses)
and is then respelled by one kind of transformation, or a mix of several:

- percent-escapes of unreserved letters, digits and ``-._~``, of reserved characters, of
  ``/`` as ``%2F``/``%2f``, of non-ASCII UTF-8, and invalid UTF-8 (``%FF``, ``%C0%AF``...),
  each escape in upper, lower or mixed hex;
- dot segments (``/./``, ``/x/../``, ``%2e``, ``%2E%2e``), repeated and trailing slashes,
  letter case, backslashes (raw and ``%5C``), raw UTF-8 in the target, and queries;

with a method (GET, HEAD, POST and others, also in lower case), a Host spelling (case,
trailing dot, port, subdomains of the policy's hosts, near misses) and a client IP (IPv4, and
IPv6 in many spellings, several addresses in each /64, IPv4-mapped).

Besides the drawn kinds, whole classes are enumerated, not drawn (:func:`enumerated`): every
byte from 0x00 to 0xFF percent-escaped at the end of each claimed route; every C0 control
character and DEL, escaped in upper and lower hex, at every position of those routes (first,
middle, around each slash, after a trailing slash, before a query); and the Unicode line
terminators and invisible characters a router might read specially (NEL, LINE and PARAGRAPH
SEPARATOR, BOM, NBSP...), escaped and raw, at the end and in the middle.

The draw is deterministic: each kind is one ``@given`` run with ``derandomize=True`` and no
database, so every run of the suite sends the same corpus (:func:`corpus_digest` names it).
Hypothesis always tries the simplest possible input first; the second, random draw of each
run is kept. The spellings that were once known bypasses are always included
(:data:`KNOWN`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

import edgegen_policy as policy
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from . import spec

T = TypeVar("T")

# Spellings per kind of transformation (one Hypothesis run each).
PER_KIND = 85
UNRESERVED = string.ascii_letters + string.digits + "-._~"
SUB_DELIMS = "!$&'()*+,;="
# Characters of drawn path segments: mostly plain, some reserved, some non-ASCII.
SEGMENT_CHARS = string.ascii_lowercase + string.digits + "-_~" + "é" + "ü" + "€" + "😀" + ":@;=+,"
NON_ASCII = ("é", "ü", "€", "😀", "ß", "\u00a0")
INVALID_UTF8 = ("%FF", "%fe", "%C3%28", "%80", "%C3", "%ED%A0%80", "%C0%AF", "%c0%ae", "%E2%82")
DOT_SEGMENTS = ("%2e", "%2E", ".")
DOTDOT_SEGMENTS = ("..", "%2e%2e", "%2E%2e", "%2e%2E", "%2E%2E", ".%2e", "%2E.")
QUERIES = (
    "",
    "q=1",
    "next=/login",
    "a=%2F..%2Flogin",
    "x=../../api/items",
    "q=caf%C3%A9",
    "%3F=%26",
    "q=1#frag",
    "a=1&a=2",
)
METHODS = (
    "GET",
    "GET",
    "GET",
    "POST",
    "POST",
    "POST",
    "HEAD",
    "HEAD",
    "PUT",
    "DELETE",
    "PATCH",
    "OPTIONS",
    "get",
    "post",
    "head",
)


@dataclass(frozen=True)
class Spelling:
    """One request of the corpus. ``target`` is sent as UTF-8 bytes, exactly as written."""

    method: str
    target: str
    host: str
    ip: str
    kind: str

    @property
    def target_bytes(self) -> bytes:
        """The request target as it goes on the wire."""
        return self.target.encode("utf-8")

    @property
    def line(self) -> str:
        """``METHOD target``, for tables."""
        return f"{self.method} {self.target}"

    @property
    def path(self) -> str:
        """The target without its query."""
        return self.target.split("?", 1)[0]


# The spellings that were bypasses of the app layer when the suite was written.
KNOWN = (
    Spelling("POST", "/l%6Fgin", "api.example.com", "203.0.113.7", "known"),
    Spelling("GET", "/%61pi/items", "api.example.com", "203.0.113.7", "known"),
    Spelling("GET", "/api%2Fitems", "api.example.com", "203.0.113.7", "known"),
    Spelling("GET", "//api/items", "api.example.com", "203.0.113.7", "known"),
    Spelling("HEAD", "/api/items", "api.example.com", "203.0.113.7", "known"),
    Spelling("GET", "/api/items/..%2F..%2Flogin", "api.example.com", "203.0.113.7", "known"),
    Spelling("POST", "/api/x/../../login", "api.example.com", "203.0.113.7", "known"),
    Spelling("GET", "/caf%C3%A9", "api.example.com", "203.0.113.7", "known"),
    Spelling("GET", "/caf%c3%a9", "api.example.com", "203.0.113.7", "known"),
    Spelling("POST", "/webhooks/x", "HOOKS.example.com.:8443", "203.0.113.7", "known"),
    Spelling("GET", "/api/items", "api.example.com", "2001:db8:1:2::10", "known"),
    Spelling("GET", "/api/items", "api.example.com", "2001:db8:1:2:abcd:ef01:2345:6789", "known"),
    Spelling("GET", "/api/items", "api.example.com", "2001:DB8:1:2::10", "known"),
    Spelling("GET", "/api/items", "api.example.com", "::ffff:203.0.113.7", "known"),
)


# --- where spellings start: the policy's matchers and the apps' routes --------------------


# Strategies are built once: building one per draw costs more than drawing from it.
SEGMENT = st.text(st.sampled_from(SEGMENT_CHARS), min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..")
)
TAIL = st.lists(SEGMENT, min_size=1, max_size=3).map("/".join)


def _route_head(template: str) -> str:
    return template.split("{", 1)[0]


# Methods for a path no route or limit names: what the apps route most.
ROUTED_METHODS = ("GET", "HEAD", "POST")


@dataclass(frozen=True)
class Sources:
    """Where spellings start: exact paths, prefixes, filled-in routes and near misses, each
    with the methods the policy's matchers and the routes name for it."""

    limit_paths: tuple[str, ...]
    exact: tuple[str, ...]
    prefixes: tuple[str, ...]
    routes: tuple[str, ...]
    near: tuple[str, ...]
    methods: dict[str, tuple[str, ...]]


@cache
def sources(text: str) -> Sources:
    """The sources of the policy (given as its text) and of the routes."""
    loaded = policy.loads(text)
    exact: set[str] = set()
    prefixes: set[str] = set()
    methods: dict[str, list[str]] = {}
    limit_paths = sorted({p for limit in loaded.limits for p in limit.match.matcher().paths})
    for limit in loaded.limits:
        matcher = limit.match.matcher()
        exact.update(matcher.paths)
        prefixes.update(matcher.path_prefixes)
        for path in (*matcher.paths, *matcher.path_prefixes):
            methods.setdefault(path, []).extend(sorted(matcher.methods - {"HEAD"}))
    for route in spec.ROUTES:
        head = _route_head(route.template)
        if head == route.template:
            exact.add(head)
        else:
            prefixes.add(head)
        methods.setdefault(head, []).extend(route.methods)
    near = {path + "x" for path in exact if path != "/"}
    near |= {prefix.rstrip("/") for prefix in prefixes}
    near |= {prefix.rstrip("/") + "x/" for prefix in prefixes}
    return Sources(
        limit_paths=tuple(limit_paths),
        exact=tuple(sorted(exact)),
        prefixes=tuple(sorted(prefixes)),
        routes=tuple(r.template for r in spec.ROUTES if "{" in r.template),
        near=tuple(sorted(near - exact)),
        methods={path: tuple(found) for path, found in sorted(methods.items()) if found},
    )


def _fill(template: str, draw: st.DrawFn) -> str:
    """A route template with its parameters drawn: one segment, or a tail for ``:path``."""
    head, _, rest = template.partition("{")
    return head + draw(TAIL if rest.startswith("rest:path") else SEGMENT)


@cache
def base_paths(text: str) -> st.SearchStrategy[tuple[str, tuple[str, ...]]]:
    """A decoded path the policy (text) or the routes name, or a near miss; and the methods
    the matchers and routes of its exact path or prefix name (ROUTED_METHODS if none)."""
    return _base_paths(sources(text))


@st.composite
def _base_paths(draw: st.DrawFn, found: Sources) -> tuple[str, tuple[str, ...]]:
    how = pick(
        draw, ("limit", "limit", "exact", "route", "route", "prefix", "prefix/", "bare", "near")
    )
    if how == "limit":
        head = path = pick(draw, found.limit_paths)
    elif how == "exact":
        head = path = pick(draw, found.exact)
    elif how == "route":
        template = pick(draw, found.routes)
        head, path = _route_head(template), _fill(template, draw)
    elif how == "near":
        head = path = pick(draw, found.near)
    else:
        head = pick(draw, found.prefixes)
        path = head if how == "bare" else head + draw(TAIL) + ("/" if how == "prefix/" else "")
    return path, found.methods.get(head, ROUTED_METHODS)


# --- respelling a path --------------------------------------------------------------------


def _escape(char: str, case: str) -> str:
    text = "".join(f"%{b:02X}" for b in char.encode("utf-8"))
    if case == "lower":
        return text.lower()
    if case == "mixed":
        return "".join(c.lower() if i % 2 else c for i, c in enumerate(text))
    return text


def pick(draw: st.DrawFn, options: Sequence[T]) -> T:
    """One of ``options``, its index drawn by Hypothesis (like ``sampled_from``, without
    building a strategy per draw)."""
    return options[draw(st.integers(0, len(options) - 1))]


def _hex_case(draw: st.DrawFn) -> str:
    return pick(draw, ("upper", "lower", "mixed"))


def _on_wire(path: str, *, keep_utf8: bool) -> str:
    """Escape what cannot go on the wire as it is (space, controls, and non-ASCII unless
    ``keep_utf8``), in upper-case hex."""
    return "".join(
        c if 0x21 <= ord(c) < 0x7F or (keep_utf8 and ord(c) > 0x7F) else _escape(c, "upper")
        for c in path
    )


def _positions(draw: st.DrawFn, text: str, wanted: Callable[[str], bool]) -> list[int]:
    candidates = [i for i, c in enumerate(text) if wanted(c)]
    if not candidates:
        return []
    picks = draw(st.lists(st.integers(0, len(candidates) - 1), min_size=1, max_size=4))
    return [candidates[p] for p in picks]


def _boundaries(path: str) -> list[int]:
    """Indexes of the slashes of a path (where a segment may be inserted)."""
    return [i for i, c in enumerate(path) if c == "/"] or [0]


def escape_unreserved(draw: st.DrawFn, path: str) -> str:
    picked = set(_positions(draw, path, lambda c: c in UNRESERVED))
    case = _hex_case(draw)
    return "".join(_escape(c, case) if i in picked else c for i, c in enumerate(path))


def escape_reserved(draw: st.DrawFn, path: str) -> str:
    how = pick(draw, ("insert-escaped", "insert-literal", "escape-existing"))
    if how == "escape-existing":
        picked = set(_positions(draw, path, lambda c: c in SUB_DELIMS + ":@" or c in UNRESERVED))
        return "".join(
            _escape(c, _hex_case(draw)) if i in picked else c for i, c in enumerate(path)
        )
    char = pick(draw, SUB_DELIMS + ":@?#% ")
    spelled = _escape(char, _hex_case(draw)) if how == "insert-escaped" or char in "?# %" else char
    at = draw(st.integers(1, len(path)))
    return path[:at] + spelled + path[at:]


def escape_slash(draw: st.DrawFn, path: str) -> str:
    picked = set(_positions(draw, path[1:], lambda c: c == "/"))
    if not picked:
        return path + pick(draw, ("%2F", "%2f")) + "x"
    return path[0] + "".join(
        pick(draw, ("%2F", "%2f")) if i in picked else c for i, c in enumerate(path[1:])
    )


def utf8(draw: st.DrawFn, path: str) -> str:
    if not any(ord(c) > 0x7F for c in path) or draw(st.booleans()):
        at = draw(st.integers(1, len(path)))
        path = path[:at] + pick(draw, NON_ASCII) + path[at:]
    if draw(st.integers(0, 3)) == 0:
        return path  # raw UTF-8 in the request target
    case = _hex_case(draw)
    return "".join(_escape(c, case) if ord(c) > 0x7F else c for c in path)


def invalid_utf8(draw: st.DrawFn, path: str) -> str:
    bad = pick(draw, INVALID_UTF8)
    at = draw(st.integers(1, len(path)))
    if draw(st.booleans()) and at < len(path) and path[at] != "/":
        return path[:at] + bad + path[at + 1 :]
    return path[:at] + bad + path[at:]


def dot_segments(draw: st.DrawFn, path: str) -> str:
    at = pick(draw, _boundaries(path))
    how = pick(draw, ("dot", "dotdot", "escape-root", "detour"))
    if how == "dot":
        insert = "/" + pick(draw, DOT_SEGMENTS)
    elif how == "dotdot":
        insert = "/" + draw(SEGMENT) + "/" + pick(draw, DOTDOT_SEGMENTS)
    elif how == "escape-root":
        # Climbing above the root: RFC 3986 stops there.
        insert = "/" + pick(draw, DOTDOT_SEGMENTS)
    else:
        # Through another route's prefix and back: /static/../api/items.
        other = pick(draw, ("/static", "/api", "/webhooks", "/api/items", "/login"))
        insert = other + "/" + pick(draw, DOTDOT_SEGMENTS)
        at = 0
    return path[:at] + insert + path[at:]


def slashes(draw: st.DrawFn, path: str) -> str:
    picked = set(_positions(draw, path, lambda c: c == "/"))
    return "".join(pick(draw, ("//", "///")) if i in picked else c for i, c in enumerate(path))


def trailing(draw: st.DrawFn, path: str) -> str:
    return path + pick(draw, ("/", "//", "/.", "/%2e", "/./", "/..", "/%2E%2e", ";"))


def case(draw: st.DrawFn, path: str) -> str:
    picked = set(_positions(draw, path, str.isalpha))
    if draw(st.booleans()):
        return path.upper()
    return "".join(c.swapcase() if i in picked else c for i, c in enumerate(path))


def backslash(draw: st.DrawFn, path: str) -> str:
    picked = set(_positions(draw, path, lambda c: c == "/"))
    return "".join(
        pick(draw, ("\\", "%5C", "%5c")) if i in picked else c for i, c in enumerate(path)
    )


def query(draw: st.DrawFn, path: str) -> str:
    return path + "?" + pick(draw, QUERIES)


TRANSFORMS: dict[str, Callable[[st.DrawFn, str], str]] = {
    "escape-unreserved": escape_unreserved,
    "escape-reserved": escape_reserved,
    "escape-slash": escape_slash,
    "utf8": utf8,
    "invalid-utf8": invalid_utf8,
    "dot-segments": dot_segments,
    "slashes": slashes,
    "trailing": trailing,
    "case": case,
    "backslash": backslash,
    "query": query,
}
KINDS = ("plain", *TRANSFORMS, "mixed")


# --- whole classes, enumerated -------------------------------------------------------------

# The routes a limit claims, one request each: (path, method, host).
CLAIMED = (
    ("/login", "POST", "api.example.com"),
    ("/api/items", "GET", "api.example.com"),
    ("/api/search", "POST", "api.example.com"),
    ("/café", "GET", "api.example.com"),
    ("/api/v1/exports/x", "GET", "api.example.com"),
    ("/webhooks/x", "POST", "hooks.example.com"),
)
CONTROL_CODES = (*range(0x20), 0x7F)
# Line terminators and invisible characters beyond C0: NEL, LINE and PARAGRAPH SEPARATOR,
# NBSP, BOM, ZERO WIDTH SPACE, MONGOLIAN VOWEL SEPARATOR, the C1 controls' ends.
TERMINATORS = (
    "\u0085",
    "\u2028",
    "\u2029",
    "\u00a0",
    "\ufeff",
    "\u200b",
    "\u180e",
    "\u0080",
    "\u009f",
)
ENUMERATED_KINDS = ("every-byte", "controls", "terminators")


def _control_positions(path: str, char: str) -> list[str]:
    """``path`` with ``char`` inserted at every position a router could read specially."""
    slashes = (i for i, c in enumerate(path) if c == "/" and i > 0)
    spots = sorted({1, len(path), len(path) // 2, *slashes})
    out = [path[:at] + char + path[at:] for at in spots]
    out += [path + "/" + char, path + char + "?x=1", path + char + "/"]
    return list(dict.fromkeys(out))


def enumerated() -> tuple[Spelling, ...]:
    """The enumerated classes (see the module docstring), each spelling once."""
    out: list[Spelling] = []
    for index, (path, method, host) in enumerate(CLAIMED):
        wire = _on_wire(path, keep_utf8=False)
        for byte in range(0x100):
            ip = IPV4[(byte + index) % len(IPV4)]
            out.append(Spelling(method, f"{wire}%{byte:02X}", host, ip, "every-byte"))
        for code in CONTROL_CODES:
            for escape in dict.fromkeys((f"%{code:02X}", f"%{code:02x}")):
                for spelled in _control_positions(wire, escape):
                    out.append(Spelling(method, spelled, host, IPV4[code % len(IPV4)], "controls"))
        for char in TERMINATORS:
            for spelled in _control_positions(path, char)[:3]:
                out.append(Spelling(method, spelled, host, IPV4[0], "terminators:raw"))
                escaped = _on_wire(spelled, keep_utf8=False)
                out.append(Spelling(method, escaped, host, IPV4[1], "terminators:escaped"))
    unique = {(s.method, s.target, s.host): s for s in reversed(out)}
    return tuple(s for s in out if unique[s.method, s.target, s.host] is s)


# --- hosts and client IPs -----------------------------------------------------------------

IPV4 = ("203.0.113.7", "198.51.100.23", "192.0.2.200")
IPV6_NETWORKS = ("2001:db8:1:2::", "2001:db8:1:3::", "2001:db8:ffff:0::", "fd00:a:b:c::")
INTERFACE_IDS = (0x1, 0x10, 0xABCD_EF01_2345_6789, 0x0200_5EFF_FE00_5301, 0xFFFF_FFFF_FFFF_FFFF)


def _ipv6_spelling(address: ipaddress.IPv6Address, style: str) -> str:
    if style == "exploded":
        return address.exploded
    if style == "exploded-upper":
        return address.exploded.upper()
    if style == "no-zero-pad":
        return ":".join(f"{int(g, 16):x}" for g in address.exploded.split(":"))
    if style == "upper":
        return str(address).upper()
    return str(address)


@st.composite
def client_ips(draw: st.DrawFn) -> str:
    """A client address: IPv4, IPv6 in several spellings, or IPv4-mapped IPv6."""
    family = pick(draw, ("ipv4", "ipv6", "ipv6", "ipv6", "mapped"))
    if family == "ipv4":
        return pick(draw, IPV4)
    if family == "mapped":
        v4 = pick(draw, IPV4)
        octets = [int(o) for o in v4.split(".")]
        return pick(
            draw,
            (
                f"::ffff:{v4}",
                f"::FFFF:{v4}",
                f"0:0:0:0:0:ffff:{v4}",
                f"::ffff:{octets[0] << 8 | octets[1]:x}:{octets[2] << 8 | octets[3]:x}",
            ),
        )
    network = ipaddress.IPv6Address(pick(draw, IPV6_NETWORKS))
    address = ipaddress.IPv6Address(int(network) | pick(draw, INTERFACE_IDS))
    style = pick(draw, ("short", "short", "exploded", "exploded-upper", "no-zero-pad"))
    return _ipv6_spelling(address, style if style != "short" else pick(draw, ("short", "upper")))


HOST_NAMES = ("api.example.com", "hooks.example.com", "www.example.com", "127.0.0.1")


@st.composite
def hosts(draw: st.DrawFn, *, webhooks: bool) -> str:
    """A Host header: a name (the policy's hosts favoured on webhook paths) in some spelling."""
    if webhooks and draw(st.integers(0, 3)) > 0:
        pattern = pick(draw, spec.WEBHOOK_HOSTS)
        if pattern.startswith("*."):
            labels = [pick(draw, ("a", "x", "b-2", "deep")) for _ in range(draw(st.integers(1, 2)))]
            name = ".".join(labels) + pattern[1:]
        else:
            name = pattern
        name = pick(draw, (name, name, "bad" + name, name + ".evil.test"))
    else:
        name = pick(draw, HOST_NAMES)
    spelled = pick(draw, ("lower", "upper", "title"))
    if spelled == "upper":
        name = name.upper()
    elif spelled == "title":
        name = ".".join(label.capitalize() for label in name.split("."))
    if draw(st.integers(0, 3)) == 0:
        name += "."
    if draw(st.integers(0, 3)) == 0:
        name += ":" + pick(draw, ("443", "8443", "80"))
    return name


CLIENT_IPS = client_ips()
HOST_SPELLINGS = hosts(webhooks=False)
WEBHOOK_HOST_SPELLINGS = hosts(webhooks=True)


# --- whole spellings ----------------------------------------------------------------------


@st.composite
def spellings(draw: st.DrawFn, kind: str, policy_text: str) -> Spelling:
    """One spelling of ``kind`` (a key of TRANSFORMS, ``plain`` or ``mixed``)."""
    path, methods = draw(base_paths(policy_text))
    if kind == "mixed":
        names = [pick(draw, tuple(TRANSFORMS)) for _ in range(draw(st.integers(2, 4)))]
        for name in names:
            path = TRANSFORMS[name](draw, path)
        tag = "mixed:" + "+".join(names)
    else:
        if kind != "plain":
            path = TRANSFORMS[kind](draw, path)
        tag = kind
    # Raw UTF-8 stays only where the utf8 transformation left it; elsewhere it is escaped.
    target = _on_wire(path, keep_utf8="utf8" in tag)
    webhooks = "webhooks" in path.lower()
    # Mostly a method the path's matchers and routes name (so that handlers run),
    # sometimes any of METHODS.
    method = pick(draw, methods if draw(st.integers(0, 3)) else METHODS)
    host = draw(WEBHOOK_HOST_SPELLINGS if webhooks else HOST_SPELLINGS)
    return Spelling(method, target, host, draw(CLIENT_IPS), tag)


def _draw_one(strategy: st.SearchStrategy[list[Spelling]]) -> list[Spelling]:
    """The second (random) example of a derandomized run: the first is the simplest input."""
    drawn: list[list[Spelling]] = []

    @settings(
        max_examples=2,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(strategy)
    def run(value: list[Spelling]) -> None:
        drawn.append(value)

    run()
    assert drawn, "Hypothesis drew no corpus"
    return drawn[-1]


def build_corpus(policy_text: str, per_kind: int = PER_KIND) -> tuple[Spelling, ...]:
    """The whole corpus: the known spellings, ``per_kind`` distinct spellings of each drawn
    kind, then the enumerated classes."""
    out: list[Spelling] = list(KNOWN)
    seen = set(out)
    for kind in KINDS:
        strategy = st.lists(
            spellings(kind, policy_text),
            min_size=per_kind,
            max_size=per_kind,
            unique_by=lambda s: (s.method, s.target, s.host),
        )
        for spelling in _draw_one(strategy):
            if spelling not in seen:
                seen.add(spelling)
                out.append(spelling)
    sent = {(s.method, s.target, s.host) for s in out}
    out.extend(s for s in enumerated() if (s.method, s.target, s.host) not in sent)
    return tuple(out)


def corpus_digest(corpus: tuple[Spelling, ...]) -> str:
    """A short digest of the corpus, to show that two runs sent the same requests."""
    digest = hashlib.sha256()
    for s in corpus:
        digest.update(repr((s.method, s.target, s.host, s.ip)).encode("utf-8"))
    return digest.hexdigest()[:16]
