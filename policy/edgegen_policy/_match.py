"""Request matching: one meaning for `match:` at the edge, in the Worker and in the app.

A matcher selects requests by path (exact paths or path prefixes), method and host. Empty
criteria match everything. Paths and prefixes combine with OR; path, method and host combine
with AND. A limit that lists GET also matches HEAD: every framework answers HEAD with the GET
handler, so the handler runs all the same. Hosts are compared case-insensitively without
the port and trailing dots; ``*.example.com`` matches every subdomain of example.com but not
example.com itself.

**The path a limit sees is the path the app serves.** A router matches the *decoded* path
(ASGI ``path``, WSGI ``PATH_INFO``), so ``/l%6Fgin`` and ``/api%2Fitems`` reach the handlers
of ``/login`` and ``/api/items``; proxies in front of the app (nginx, Cloudflare) may also
merge ``//`` and resolve ``.``/``..``. :func:`request_paths` therefore gives the forms a
request path is checked in, and a limit counts the request when any form matches:

1. the path as the router sees it (percent-decoded once, as UTF-8; the query dropped);
2. its canonical form: ``\\`` read as ``/``, runs of ``/`` merged into one, ``.`` and ``..``
   segments resolved (RFC 3986 section 5.2.4);
3. when the decoded path ends in a newline, both forms again without it: a route's regular
   expression ends in ``$``, which in Python also matches before a final ``\n``, so Starlette
   runs the handler of ``/login`` for ``/login%0A``. No resource is named with a control
   character, so the middlewares and the Worker refuse every such path outright (400,
   :func:`has_control_character`); this form keeps every other user of the matcher
   (``check_request``, replay, the rules) counting what such a router serves;
4. with a *mount* (WSGI ``SCRIPT_NAME``, ASGI ``root_path``: a prefix the server takes off
   before routing, which gunicorn also takes from a client's ``SCRIPT_NAME`` header), the
   path without the mount as well, in every form above: the router matches that one, while
   the edge sees the whole path.

Counting a request under both forms can only over-count an odd spelling that the app
serves as a 404 anyway; it never lets a served spelling through uncounted. Comparison is
case-sensitive (routers are). ``%2F`` is decoded to ``/`` like every other escape, because
ASGI and WSGI hand the router the decoded path, where the two are the same. An exact path
also matches with one trailing slash more or less (``/login`` and ``/login/``), since
routers with slash redirects or ``strict_slashes=False`` serve both. docs/edge.md states
what Cloudflare's rules and the Worker see; the Worker runs a port of this module's
functions (workers/templates/limiter.js), and tests/test_differential.py holds every layer to
the same answers.

This module is pure and has no dependency on pydantic, so the app's hot path can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

# Characters WHATWG's URL parser leaves unescaped in a path; everything else is
# percent-encoded, so a path compares the same here as in the Worker's `new URL()`. The
# current URL standard (and workerd) encodes "^" in paths too, though older parsers (Node
# 20's) do not: workerd is the one the Worker runs in.
_PATH_SAFE = frozenset(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:@/%[]\\|"
)
_DOT_SEGMENTS = {".", "%2e", "%2E"}
_DOTDOT_SEGMENTS = {"..", ".%2e", ".%2E", "%2e.", "%2E.", "%2e%2e", "%2E%2E", "%2e%2E", "%2E%2e"}
MAX_PATH_LENGTH = 16_384
# WHATWG's URL parser deletes every ASCII tab and newline from its input, and trims C0
# controls and spaces from both ends, before it looks at the path.
_TAB_OR_NEWLINE = b"\t\n\r"
_C0_OR_SPACE = bytes(range(0x21))


def _utf8(raw: str) -> bytes:
    """Encode like a JavaScript string becomes a URL: lone surrogates turn into U+FFFD.

    Surrogate escapes (U+DC80..U+DCFF, how Python carries undecodable bytes in a str) stay
    the bytes they stand for.
    """
    try:
        return raw.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        cleaned = "".join(
            "\ufffd" if 0xD800 <= ord(c) <= 0xDFFF and not 0xDC80 <= ord(c) <= 0xDCFF else c
            for c in raw
        )
        return cleaned.encode("utf-8", "surrogateescape")


# C0 controls and DEL: what no resource name holds, and what routers disagree about.
_CONTROLS = re.compile("[\x00-\x1f\x7f]")


def has_control_character(path: str) -> bool:
    """True when a (decoded) path holds a C0 control character or DEL (U+0000-U+001F, U+007F).

    The app's middlewares and the Worker refuse such a request with 400 before anything else:
    routers read them each their own way (a Starlette route's ``$`` matches before a final
    newline), so no spelling of the class can reach a handler the limits do not count.
    """
    return _CONTROLS.search(path) is not None


# Paths made only of bytes of the path set (nearly all) skip the per-byte loop.
_ALL_PATH_SAFE = re.compile(b"[" + re.escape(bytes(sorted(_PATH_SAFE))) + b"]*")


def _percent_encode(data: bytes) -> str:
    """Percent-encode the bytes outside the URL path set and treat ``\\`` as ``/``."""
    if _ALL_PATH_SAFE.fullmatch(data):
        return data.decode("ascii").replace("\\", "/")
    encoded = "".join(chr(b) if b in _PATH_SAFE else f"%{b:02X}" for b in data)
    return encoded.replace("\\", "/")


# A path that normalisation leaves as it is: absolute, only bytes of the path set but the
# percent sign and the backslash (so nothing to keep or turn), hence no query or fragment
# either. With no "/." in it, it has no dot segments. Most request paths are such paths.
_PLAIN_PATH = re.compile(
    "/[" + re.escape(bytes(sorted(_PATH_SAFE - set(b"%\\"))).decode("ascii")) + "]*"
)


def normalize_path(raw: str | bytes) -> str:
    """Return the path part of a request target the way the Worker's ``new URL()`` sees it.

    Drops query and fragment, deletes tabs and newlines and trims trailing controls and
    spaces (as the WHATWG URL parser does), makes the path absolute, resolves ``.`` and
    ``..`` segments (also written ``%2e``), treats ``\\`` as ``/`` and percent-encodes bytes
    outside the URL path set. Double slashes are kept and existing percent-escapes are left
    as written. Never raises: undecodable bytes are percent-encoded.
    """
    if (
        isinstance(raw, str)
        and len(raw) <= MAX_PATH_LENGTH * 3
        and "/." not in raw
        and _PLAIN_PATH.fullmatch(raw)
    ):
        return raw
    return _normalize(raw)


def _normalize(raw: str | bytes) -> str:
    """:func:`normalize_path` for any input, without the shortcut for plain paths."""
    data = _utf8(raw) if isinstance(raw, str) else bytes(raw)
    data = data[: MAX_PATH_LENGTH * 3]
    data = data.translate(None, _TAB_OR_NEWLINE).strip(_C0_OR_SPACE)
    for sep in (b"?", b"#"):
        cut = data.find(sep)
        if cut >= 0:
            data = data[:cut]
    encoded = _percent_encode(data)
    if not encoded.startswith("/"):
        encoded = "/" + encoded
    out: list[str] = []
    segments = encoded.split("/")[1:]
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment in _DOT_SEGMENTS:
            if last:
                out.append("")
            continue
        if segment in _DOTDOT_SEGMENTS:
            if out:
                out.pop()
            if last:
                out.append("")
            continue
        out.append(segment)
    return "/" + "/".join(out)


def encode_policy_path(path: str) -> str:
    """A path or prefix from the policy in the form requests are compared in.

    Percent-encodes what a request path can never contain literally (non-ASCII, spaces,
    quotes, ...) so that ``/café`` in the policy matches the request path ``/caf%C3%A9``;
    dot segments are left alone, since a prefix like ``/a/`` must stay a prefix.
    """
    return _percent_encode(_utf8(path))


# A path with none of these needs no work: nothing to decode, merge, resolve or turn.
_PLAIN_ROUTE = re.compile(r"(?:/[^%\\/?#\x00-\x1f\x7f]+)*/?")
_SLASHES = re.compile(r"/{2,}")


def canonical_path(path: str) -> str:
    """A decoded path in canonical form: ``\\`` as ``/``, ``//`` merged, dot segments resolved.

    The input is already percent-decoded (as a router sees it); the output starts with
    ``/`` and keeps a trailing slash (``/a/b/..`` gives ``/a/``, as RFC 3986 does).
    """
    text = _SLASHES.sub("/", path.replace("\\", "/"))
    if not text.startswith("/"):
        text = "/" + text
    if "/." not in text:
        return text
    out: list[str] = []
    segments = text.split("/")[1:]
    last = len(segments) - 1
    for index, segment in enumerate(segments):
        if segment == ".":
            if index == last:
                out.append("")
            continue
        if segment == "..":
            if out:
                out.pop()
            if index == last:
                out.append("")
            continue
        out.append(segment)
    return "/" + "/".join(out)


def decode_path(target: str) -> str:
    """The path of a request target as a router sees it: query dropped, escapes decoded.

    Decodes every ``%XX`` once, as UTF-8 with invalid bytes replaced by U+FFFD (what
    uvicorn and werkzeug do); ``%2F`` becomes ``/`` like any other escape.
    """
    cut = len(target)
    for sep in ("?", "#"):
        found = target.find(sep)
        if 0 <= found < cut:
            cut = found
    path = target[:cut]
    return unquote(path) if "%" in path else path


def request_paths(path: str, mount: str = "") -> tuple[str, ...]:
    """Every form of a request path that limits are checked against (one or more).

    ``path`` is what the app has: the decoded path its router matches (ASGI ``path``) or the
    raw target (``raw_path``, with or without its query). Decoding an already decoded path
    again can only add a form, never lose the router's own: the router's input is always
    one of the forms, then its decoded form, then the canonical form of that; a decoded path
    that ends in a newline also without it. ``mount`` is the prefix the server took off
    before routing (WSGI ``SCRIPT_NAME``, ASGI ``root_path``), already part of ``path``:
    the forms of the path without it are added.
    """
    path = path[: MAX_PATH_LENGTH * 3]
    if not mount and path.startswith("/") and "/." not in path and _PLAIN_ROUTE.fullmatch(path):
        return (path,)
    forms = _forms(path, [])
    if mount and path.startswith(mount):
        _forms(path[len(mount) :] or "/", forms)
    return tuple(forms)


def _forms(path: str, forms: list[str]) -> list[str]:
    """Add the forms of one path (see :func:`request_paths`) to ``forms``, without repeats."""
    decoded = decode_path(path)
    found = [path, decoded, canonical_path(decoded)]
    if decoded.endswith("\n"):
        routed = decoded[:-1]
        found += [routed, canonical_path(routed)]
    for form in found:
        if form not in forms:
            forms.append(form)
    return forms


def _exact_key(path: str) -> str:
    """An exact path without its one trailing slash (``/`` stays ``/``)."""
    return path[:-1] if len(path) > 1 and path.endswith("/") else path


def policy_path(path: str) -> str:
    """A path or prefix from the policy in the form request paths are compared in (decoded).

    Policy paths are written as the router declares them (``/café``, not ``/caf%C3%A9``).
    """
    return path


def normalize_host(raw: str | None) -> str:
    """Lower-case a Host header value and strip its port (IPv6 brackets kept)."""
    if not raw:
        return ""
    host = raw.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end >= 0 else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def host_matches(pattern: str, host: str) -> bool:
    """True when a normalised host matches a policy host (exact, or ``*.`` wildcard)."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


@dataclass(frozen=True, slots=True)
class Matcher:
    """A compiled `match:` block. Build it with ``Matcher.create`` or from a policy limit."""

    paths: frozenset[str] = frozenset()
    path_prefixes: tuple[str, ...] = ()
    methods: frozenset[str] = frozenset()
    hosts: tuple[str, ...] = ()

    @classmethod
    def create(
        cls,
        *,
        paths: tuple[str, ...] | list[str] = (),
        path_prefixes: tuple[str, ...] | list[str] = (),
        methods: tuple[str, ...] | list[str] = (),
        hosts: tuple[str, ...] | list[str] = (),
    ) -> Matcher:
        """Build a matcher: methods upper case (HEAD added to GET), hosts lower case.

        Exact paths are kept without a trailing slash (``/`` aside) and compared that way,
        so ``/login`` and ``/login/`` are one path.
        """
        upper = {m.upper() for m in methods}
        if "GET" in upper:
            upper.add("HEAD")
        return cls(
            paths=frozenset(_exact_key(policy_path(p)) for p in paths),
            path_prefixes=tuple(dict.fromkeys(policy_path(p) for p in path_prefixes)),
            methods=frozenset(upper),
            hosts=tuple(h.lower() for h in hosts),
        )

    @property
    def matches_all_paths(self) -> bool:
        """True when the matcher puts no condition on the path."""
        return not self.paths and not self.path_prefixes

    def matches(self, method: str, path: str, host: str | None = None) -> bool:
        """Decide whether a request matches; ``path`` is one form from :func:`request_paths`."""
        return self.matches_any(method, (path,), host)

    def matches_any(self, method: str, paths: tuple[str, ...], host: str | None = None) -> bool:
        """Decide whether a request matches in any of its path forms (:func:`request_paths`)."""
        if self.methods and method.upper() not in self.methods:
            return False
        if self.hosts:
            name = normalize_host(host)
            if not any(host_matches(p, name) for p in self.hosts):
                return False
        # Inlined (no generator, no property): this runs for every limit of every request.
        prefixes, exact = self.path_prefixes, self.paths
        if not prefixes and not exact:
            return True
        for path in paths:  # noqa: SIM110 (a generator costs more, per limit and request)
            # str.startswith takes a tuple: one C call for every prefix.
            if path.startswith(prefixes) or _exact_key(path) in exact:
                return True
        return False

    def matches_path(self, path: str) -> bool:
        """Decide the path part alone, for one form of the path."""
        if self.matches_all_paths:
            return True
        # str.startswith takes a tuple: one C call for every prefix.
        return path.startswith(self.path_prefixes) or _exact_key(path) in self.paths

    def matches_raw(self, method: str, raw_target: str, host: str | None = None) -> bool:
        """Like ``matches`` for a raw request target (path and query), in all its forms."""
        return self.matches_any(method, request_paths(raw_target), host)

    def overlaps(self, other: Matcher) -> bool:
        """True when some request could match both matchers (a conservative check)."""
        if self.methods and other.methods and not (self.methods & other.methods):
            return False
        if self.hosts and other.hosts and not _hosts_overlap(self.hosts, other.hosts):
            return False
        if self.matches_all_paths or other.matches_all_paths:
            return True
        if any(other.matches_path(path) for path in self.paths):
            return True
        if any(self.matches_path(path) for path in other.paths):
            return True
        return any(
            a.startswith(b) or b.startswith(a)
            for a in self.path_prefixes
            for b in other.path_prefixes
        )

    def covers(self, other: Matcher) -> bool:
        """True when every request ``other`` matches is also matched by this matcher."""
        if self.methods and not (other.methods and other.methods <= self.methods):
            return False
        if self.hosts and not (
            other.hosts
            and all(any(host_matches(p, h) or p == h for p in self.hosts) for h in other.hosts)
        ):
            return False
        if self.matches_all_paths:
            return True
        if other.matches_all_paths:
            return False
        return all(self.matches_path(p) for p in other.paths) and all(
            any(prefix.startswith(mine) for mine in self.path_prefixes)
            for prefix in other.path_prefixes
        )

    def same_as(self, other: Matcher) -> bool:
        """True when both matchers select exactly the same requests, as written."""
        return (
            self.paths == other.paths
            and set(self.path_prefixes) == set(other.path_prefixes)
            and self.methods == other.methods
            and set(self.hosts) == set(other.hosts)
        )


def _hosts_overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    for x in a:
        for y in b:
            if x == y:
                return True
            if x.startswith("*.") and (host_matches(x, y) or y.endswith(x[1:])):
                return True
            if y.startswith("*.") and (host_matches(y, x) or x.endswith(y[1:])):
                return True
    return False
