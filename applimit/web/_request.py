"""Who is calling and what they ask: request facts in, framework-free.

:class:`RequestInfo` is what the middleware knows about a request (method, normalised path,
host, headers, the direct peer), built from an ASGI scope or a WSGI environ;
``identify(request) -> Caller | None`` is the app's own authentication: who is calling
(:class:`Caller`), and their tier; ``None`` means anonymous. No I/O, no web framework.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from types import MappingProxyType
from typing import Any, Literal

from edgegen_policy import KeyName, decode_path, normalize_host

from .._frozen import fast_constructor
from .._memo import Memo

# A caller without keys (most callers) shares this one: identify() runs for every request.
NO_KEYS: Mapping[str, str] = MappingProxyType({})


# init=False: Caller's own __init__ below, which every request's identify() runs. The
# generated one would set each field through object.__setattr__ (frozen), make a dict for
# the default keys, then call __post_init__ to check and set them again.
@dataclass(frozen=True, slots=True, init=False)
class Caller:
    """An authenticated caller, as the app's own auth sees it.

    ``user`` is the stable id that ``per: user`` limits count by; ``tier`` names one of the
    policy's tiers (``None``: the lowest tier). ``keys`` holds the caller's other keys that
    limits may count by, by name: ``Caller("alice", "pro", keys={"org": "acme"})`` is counted
    per organisation by ``per: org`` limits (and per user by the others). A ``per: org``
    limit counts a caller without an ``org`` key by client IP, like an anonymous caller.
    """

    user: str
    tier: str | None = None
    keys: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __init__(
        self, user: str, tier: str | None = None, keys: Mapping[str, str] = NO_KEYS
    ) -> None:
        # Checked here, in the app's identify(), where a bug is easy to find: an empty id
        # would make every such caller share one quota.
        if not isinstance(user, str) or not user:
            raise ValueError(
                f"Caller.user must be a non-empty str (the user's stable id), not {user!r}"
            )
        _set_user(self, user)
        _set_tier(self, tier)
        if keys is NO_KEYS:
            _set_keys(self, NO_KEYS)
            return
        # A dict skips the Mapping ABC's isinstance, the costlier check.
        if type(keys) is not dict and not isinstance(keys, Mapping):
            raise ValueError(
                f"Caller.keys must be a mapping of key names to values, not "
                f"{type(keys).__name__}; e.g. keys={{'org': org_id}}"
            )
        for name, value in keys.items():
            # A name a limit's per: can use: a lower-case identifier, not user or ip (which
            # are Caller.user and the client address), as the policy's lint requires.
            if not isinstance(name, str) or not KeyName(name).valid:
                raise ValueError(
                    f"Caller.keys has the key name {name!r}; a key name is what a limit's "
                    "per: names: a lower-case identifier (e.g. org), not user or ip, which "
                    "are Caller.user and the client address"
                )
            # An empty value would make every such caller share one quota, as an empty user.
            if not isinstance(value, str) or not value:
                raise ValueError(
                    f"Caller.keys[{name!r}] must be a non-empty str, not {value!r}; convert "
                    "it, e.g. str(org.id), or leave the key out (the caller is then counted "
                    "by client IP)"
                )
        # A copy that cannot change: the caller is frozen, its keys too.
        _set_keys(self, MappingProxyType(dict(keys)) if keys else NO_KEYS)

    def __post_init__(self) -> None:
        # Only a dataclass subclass's generated __init__ calls this, having set the fields
        # itself: they are checked, and the keys frozen, as Caller's own __init__ does.
        Caller.__init__(self, self.user, self.tier, self.keys)


# The slots' own setters: what object.__setattr__ reaches on a frozen instance, without
# the call through it.
_set_user, _set_tier, _set_keys = (
    getattr(Caller, name).__set__ for name in ("user", "tier", "keys")
)


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the rate limiter knows about one HTTP request, independent of the framework.

    ``path`` is the path the app's router matches: decoded (ASGI ``path``, WSGI
    ``SCRIPT_NAME`` + ``PATH_INFO`` read as UTF-8), so ``/l%6Fgin`` is ``/login`` here as it
    is to the router. The limiter checks it in every form of ``policy.request_paths`` (also
    with ``//`` merged and dot segments resolved), so a spelling the app serves is never a
    spelling the limits miss. ``mount`` is the prefix the server took off before routing
    (WSGI ``SCRIPT_NAME``, ASGI ``root_path``; part of ``path``): the router matches the path
    without it, the edge the whole path, so the limits are checked on both. A path holding a
    control character is refused with 400 by every middleware (:func:`bad_path`).
    ``raw_path`` is the target as sent, for logs. ``headers`` holds lower-case names in
    arrival order. ``native`` is the ASGI scope or the WSGI environ, for ``identify``
    functions that need more (a Starlette ``Request(info.native)``, a Flask session...).
    """

    method: str
    path: str
    raw_path: str
    host: str
    headers: tuple[tuple[str, str], ...]
    peer: str | None
    query_string: str = ""
    kind: Literal["asgi", "wsgi", "other"] = "other"
    native: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    mount: str = ""

    @classmethod
    def from_asgi(cls, scope: Mapping[str, Any]) -> RequestInfo:
        """Build from an ASGI ``http`` scope; ``path`` is the scope's decoded ``path``."""
        name_of = _NAME_OF
        found: list[tuple[str, str]] = []
        for raw_name, value in scope.get("headers", ()):
            name = name_of.get(raw_name) if type(raw_name) is bytes else None
            if name is None:
                name = _header_name(raw_name)
            found.append((name, bytes(value).decode("latin-1")))
        headers = tuple(found)
        path = scope.get("path")
        raw = scope.get("raw_path")
        raw_path = bytes(raw).decode("latin-1") if raw else ""
        if not isinstance(path, str) or not path:
            # A server that leaves out the decoded path: decode the raw target as routers do.
            path = decode_path(_origin_form(raw_path)) if raw_path else "/"
        client = scope.get("client")
        peer = str(client[0]) if client else None
        host = _first(headers, "host") or _server_host(scope.get("server"))
        return _request_info(
            str(scope.get("method", "GET")).upper(),
            path,
            raw_path or path,
            normalize_host(host),
            headers,
            peer,
            bytes(scope.get("query_string", b"")).decode("latin-1"),
            "asgi",
            scope,
            _root_path(scope.get("root_path"), path),
        )

    @classmethod
    def from_wsgi(cls, environ: Mapping[str, Any]) -> RequestInfo:
        """Build from a WSGI environ; ``path`` is ``SCRIPT_NAME + PATH_INFO`` as UTF-8."""
        headers: list[tuple[str, str]] = []
        header_of = _HEADER_OF
        for key, value in environ.items():
            entry = header_of.get(key)
            if entry is None:
                entry = _header_of(key)
            if entry is not _NOT_A_HEADER and (value or entry[1]):
                headers.append((entry[0], value if type(value) is str else str(value)))
        # PEP 3333: PATH_INFO holds the decoded bytes as latin-1 characters; routers such as
        # werkzeug's read those bytes as UTF-8, and so does the limiter.
        script_name = str(environ.get("SCRIPT_NAME", ""))
        wsgi_path = script_name + str(environ.get("PATH_INFO", ""))
        path = wsgi_path.encode("latin-1", "replace").decode("utf-8", "replace") or "/"
        # What the router matches is PATH_INFO alone; gunicorn also takes SCRIPT_NAME from a
        # client's header (from forwarded_allow_ips), so both are checked.
        mount = (
            script_name.encode("latin-1", "replace").decode("utf-8", "replace")
            if script_name
            else ""
        )
        # gunicorn sets RAW_URI, uWSGI and waitress REQUEST_URI: the target as sent.
        raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
        raw_path = _origin_form(str(raw).split("?", 1)[0]) if raw else path
        found = tuple(headers)
        host = _first(found, "host") or str(environ.get("SERVER_NAME", ""))
        return _request_info(
            str(environ.get("REQUEST_METHOD", "GET")).upper(),
            path,
            raw_path,
            normalize_host(host),
            found,
            str(environ["REMOTE_ADDR"]) if environ.get("REMOTE_ADDR") else None,
            str(environ.get("QUERY_STRING", "")),
            "wsgi",
            environ,
            mount if path.startswith(mount) else "",
        )

    def header(self, name: str) -> str | None:
        """The first value of a header (case-insensitive), or None."""
        return _first(self.headers, name.lower())

    def header_values(self, name: str) -> list[str]:
        """Every value of a header (case-insensitive), in arrival order."""
        wanted = name.lower()
        return [value for key, value in self.headers if key == wanted]

    def cookie(self, name: str) -> str | None:
        """The value of one cookie, or None (a malformed Cookie header counts as none)."""
        for value in self.header_values("cookie"):
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value)
            except CookieError:
                continue
            if name in jar:
                return jar[name].value
        return None

    def bearer_token(self) -> str | None:
        """The token of an ``Authorization: Bearer <token>`` header, or None."""
        value = self.header("authorization")
        if not value:
            return None
        scheme, _, token = value.strip().partition(" ")
        token = token.strip()
        return token if scheme.lower() == "bearer" and token else None


# Header names as an ASGI server sends them (bytes) -> as RequestInfo keeps them (lower-
# case str), remembered: the same few names come with every request. Bounded, as the
# names are the client's to choose.
_NAME_OF_LIMIT = 1024
_NAMES: Memo[bytes, str] = Memo(_NAME_OF_LIMIT)
_NAME_OF = _NAMES.entries  # read for every header of every request


def _header_name(raw: bytes | bytearray) -> str:
    """A header name of an ASGI scope as a lower-case str (latin-1), remembered."""
    name = bytes(raw).decode("latin-1").lower()
    if type(raw) is bytes:
        _NAMES.keep(raw, name)
    return name


# What each WSGI environ key is (see _header_of), remembered: a server sends the same few
# dozen keys with every request, and translating each name cost more than the rest of
# from_wsgi. Bounded, as the header names are the client's to choose.
_HEADER_OF_LIMIT = 1024
_ENVIRON_KEYS: Memo[str, tuple[str, bool]] = Memo(_HEADER_OF_LIMIT)
_HEADER_OF = _ENVIRON_KEYS.entries  # read for every key of every environ
_NOT_A_HEADER = ("", False)


def _header_of(key: str) -> tuple[str, bool]:
    """The header an environ key carries, as (name, kept when empty), or _NOT_A_HEADER.
    Every ``HTTP_*`` key is a header, and CONTENT_TYPE and CONTENT_LENGTH are when set
    (CGI sets them empty for a request without a body)."""
    if key.startswith("HTTP_"):
        entry = (key[5:].replace("_", "-").lower(), True)
    elif key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        entry = (key.replace("_", "-").lower(), False)
    else:
        entry = _NOT_A_HEADER
    _ENVIRON_KEYS.keep(key, entry)
    return entry


def _origin_form(target: str) -> str:
    """The path of a request target, also when a client sent the absolute form
    (``GET http://host/path``), which servers must accept and some pass on as it came."""
    lowered = target[:8].lower()
    if lowered.startswith(("http://", "https://")):
        rest = target.split("//", 1)[1]
        slash = rest.find("/")
        return rest[slash:] if slash >= 0 else "/"
    return target


# ``RequestInfo(...)`` with every field given in order, built without a call per field (see
# _frozen): from_asgi and from_wsgi build one for every request.
_request_info = fast_constructor(RequestInfo)


def _root_path(root: object, path: str) -> str:
    """An ASGI ``root_path`` that ``path`` starts with (as Starlette routes ``path`` without
    it), or ""."""
    if not root or not isinstance(root, str) or not path.startswith(root):
        return ""
    return root


def _first(headers: tuple[tuple[str, str], ...], name: str) -> str | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def _server_host(server: object) -> str:
    if isinstance(server, (tuple, list)) and server:
        return str(server[0])
    return ""


Identify = Callable[[RequestInfo], "Caller | Awaitable[Caller | None] | None"]
"""The app's ``identify(request)``: a Caller, or None for anonymous (may be async in ASGI)."""


def _checked(result: object) -> Caller | None:
    if result is None or isinstance(result, Caller):
        return result
    raise TypeError(
        f"identify() returned {type(result).__name__}; return applimit.Caller(user, tier) "
        "for a known caller or None for an anonymous one"
    )


async def identified(result: object) -> Caller | None:
    """What an ``identify`` returned, awaited when it is awaitable, checked."""
    if inspect.isawaitable(result):
        result = await result
    return _checked(result)


async def identify_async(identify: Identify | None, request: RequestInfo) -> Caller | None:
    """Run ``identify`` (a plain or a coroutine function) for an async shell."""
    if identify is None:
        return None
    result = identify(request)
    if result is None or type(result) is Caller:
        # The commonest answers, known without inspect.isawaitable's ABC check.
        return result
    if inspect.isawaitable(result):
        result = await result
    return _checked(result)


def identify_sync(identify: Identify | None, request: RequestInfo) -> Caller | None:
    """Run ``identify`` for a sync shell; a coroutine function cannot be awaited there."""
    if identify is None:
        return None
    result = identify(request)
    if result is None or type(result) is Caller:
        # The commonest answers, known without inspect.isawaitable's ABC check.
        return result
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited: close it, or Python warns about it
        raise TypeError(
            "identify() is async, but a WSGI app cannot await it; pass a plain function"
        )
    return _checked(result)


def anonymous_identity(ip: str) -> str:
    """A label for an anonymous caller, kept for code written against earlier versions.

    Keys no longer use it: ``hit(name, None, ip=...)`` counts an anonymous caller in the
    same bucket ``check_request`` uses, and a user id (this label included) is always
    counted as a user, so no identity string can reach another kind's bucket.
    """
    return f"anonymous-ip:{ip}"


def is_preflight(request: RequestInfo) -> bool:
    """True for a CORS preflight: ``OPTIONS`` with ``Origin`` and
    ``Access-Control-Request-Method``.

    The browser sends it on its own before the real request; the middleware neither counts
    nor refuses it, so the answer is the CORS middleware's (in either order) and the real
    request is the one counted.
    """
    return (
        request.method == "OPTIONS"
        and request.header("origin") is not None
        and request.header("access-control-request-method") is not None
    )
