"""The framework-free part of the web integration: request facts in, an outcome out.

The ASGI and WSGI middleware, the FastAPI dependency and the decorator are thin shells over
this module. It does no I/O and imports no web framework:

- :class:`RequestInfo` is what the middleware knows about a request (method, normalised path,
  host, headers, the direct peer), built from an ASGI scope or a WSGI environ;
- ``identify(request) -> Caller | None`` is the app's own authentication: who is calling, and
  their tier; ``None`` means anonymous;
- :class:`TrustedProxies` turns the direct peer and the forwarding headers into the client IP;
- :class:`Gate` turns a :class:`~applimit.Decision` into the response headers, and into the
  refusal (status, headers, RFC 9457 problem body) when the request is denied; it also says
  what a failing ``identify`` means (``on_identify_error``), whether the app's
  ``exempt_when`` / ``exempt_caller`` spare a request (:data:`EXEMPT` is the Decision left
  for the app then), and what body the app's ``refusal`` function gives a refusal;
- :func:`middleware_gate` checks the middleware's options when it is built, so that a bad
  option stops the app at start-up with a :class:`~applimit.ConfigurationError` naming it.

Headers follow draft-ietf-httpapi-ratelimit-headers (revision 10): ``RateLimit-Policy`` is a
structured-field List of ``"name";q=<quota>;w=<window seconds>`` items, ``RateLimit`` a List of
``"name";r=<remaining>;t=<seconds until more quota>`` items. docs/web.md describes every choice
(which items appear when, rounding, shadow limits, a Redis outage).
"""

from __future__ import annotations

import inspect
import ipaddress
import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from types import MappingProxyType
from typing import Any, Final, Literal

from edgegen_policy import QUOTA_EXCEEDED as _QUOTA_EXCEEDED
from edgegen_policy import KeyName, decode_path, has_control_character, header_key, normalize_host

from ._arguments import MAX_COST
from ._decision import Decision, LimitResult
from ._errors import ConfigurationError, InvalidArgumentError
from ._frozen import fast_constructor
from ._memo import Memo

logger = logging.getLogger("applimit")

# The problem type of a refusal: the Worker's too (edgegen_policy/_http.py), so one client
# sees one.
QUOTA_EXCEEDED: Final = _QUOTA_EXCEEDED

TEMPORARY_REDUCED_CAPACITY = (
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)
PROBLEM_JSON = "application/problem+json"
# A trusted-proxies entry that trusts a peer without an address (a Unix domain socket).
UNIX_SOCKET = "unix"
# The client IP used when none can be determined (no peer address at all): such requests
# share one anonymous bucket rather than escaping the limit.
UNKNOWN_IP = "unknown"
# Direct peers whose client IP TrustedProxies remembers, at most (see client_ip).
MAX_KNOWN_PEERS = 4096
# Unknown tiers logged once each; past this many, further ones are not logged.
MAX_WARNED_TIERS = 64
# Rates whose RateLimit-Policy member a Gate keeps formatted, at most (see Gate._admitted).
_MEMBERS = 1024
# What a failing identify() means (Gate's on_identify_error): "raise" propagates the app's
# exception (a 500, as before this option existed), "anonymous" counts the caller by IP in
# the lowest tier, "refuse" answers 503 (the app's auth, not the client, is at fault).
OnIdentifyError = Literal["raise", "anonymous", "refuse"]
# Seconds a client is told to wait after a "refuse": an auth backend's failure is usually
# brief, and a client that retries at once would only add to its load.
IDENTIFY_RETRY_AFTER = 5
ON_IDENTIFY_ERROR: tuple[OnIdentifyError, ...] = ("raise", "anonymous", "refuse")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


# --- who is calling ----------------------------------------------------------------------


# A caller without keys (most callers) shares this one: identify() runs for every request.
_NO_KEYS: Mapping[str, str] = MappingProxyType({})


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
        self, user: str, tier: str | None = None, keys: Mapping[str, str] = _NO_KEYS
    ) -> None:
        # Checked here, in the app's identify(), where a bug is easy to find: an empty id
        # would make every such caller share one quota.
        if not isinstance(user, str) or not user:
            raise ValueError(
                f"Caller.user must be a non-empty str (the user's stable id), not {user!r}"
            )
        _set_user(self, user)
        _set_tier(self, tier)
        if keys is _NO_KEYS:
            _set_keys(self, _NO_KEYS)
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
        _set_keys(self, MappingProxyType(dict(keys)) if keys else _NO_KEYS)

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


# --- the client IP -----------------------------------------------------------------------


def parse_ip(text: str) -> Address | None:
    """Parse one address as written in a header or a peer field, or None.

    Accepts ``1.2.3.4``, ``1.2.3.4:5678``, ``::1``, ``[::1]:443`` and quoted values; an
    IPv4-mapped IPv6 address (``::ffff:1.2.3.4``) becomes the IPv4 address, so one client is
    one key whichever socket family the server used.
    """
    value = text.strip().strip('"')
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        value = value[1:end]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class TrustedProxies:
    """Which peers may tell us the client IP, and how to read it from them.

    ``trusted`` lists addresses or CIDR networks (``10.0.0.0/8``, ``::1``) of your own proxies
    and load balancers, plus ``"unix"`` to trust a peer on a Unix domain socket. The client IP
    is the direct peer unless that peer is trusted; then ``X-Forwarded-For`` is read right to
    left, skipping trusted hops, and the first untrusted address is the client. Addresses a
    client put in the header itself lie to the left of that point and are never reached.

    ``behind_cloudflare=True`` reads ``CF-Connecting-IP`` instead, but only from a trusted peer:
    list Cloudflare's ranges (https://www.cloudflare.com/ips/) or the load balancer that only
    Cloudflare can reach. Anyone else can send that header too.
    """

    def __init__(self, trusted: Iterable[str] = (), *, behind_cloudflare: bool = False) -> None:
        """Parse the trusted entries; ValueError names an entry that is not an address."""
        networks: list[Network] = []
        unix = False
        for entry in trusted:
            text = entry.strip()
            if text.lower() == UNIX_SOCKET:
                unix = True
                continue
            try:
                network = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ValueError(
                    f"trusted proxy {entry!r} is not an IP address or CIDR network; write it "
                    "like 10.0.0.0/8, 192.0.2.7 or ::1 (or 'unix' for a Unix socket peer)"
                ) from None
            networks.append(network)
        self._networks = tuple(networks)
        self._unix = unix
        self.behind_cloudflare = behind_cloudflare
        # Peers that decide the client IP alone (not trusted, or not an IP), and the answer:
        # a client sends many requests, and parsing its address with ipaddress for each
        # cost more than the rest of reading the request. Bounded, so a flood of addresses
        # cannot grow memory.
        self._peers: Memo[str, str] = Memo(MAX_KNOWN_PEERS)
        self._direct = self._peers.entries  # read for every request

    @property
    def networks(self) -> tuple[Network, ...]:
        """The trusted networks, parsed."""
        return self._networks

    def _remember(self, peer: str, client: str) -> str:
        """Note that ``peer`` alone makes ``client`` the client IP; return it."""
        self._peers.keep(peer, client)
        return client

    def trusts(self, address: Address | None) -> bool:
        """True when ``address`` is one of ours (None: a Unix socket peer)."""
        if address is None:
            return self._unix
        return any(address.version == net.version and address in net for net in self._networks)

    def client_ip(self, request: RequestInfo) -> str:
        """The client's IP as a canonical string (``UNKNOWN_IP`` when there is no peer)."""
        text = request.peer
        if text:
            known = self._direct.get(text)
            if known is not None:
                return known
        return self._resolve(request, text)

    def _resolve(self, request: RequestInfo, text: str | None) -> str:
        """:meth:`client_ip` for a peer not remembered: the peer ``text``, or the
        forwarding headers a trusted peer sent."""
        peer = parse_ip(text) if text else None
        if text and peer is None:
            # A peer that is not an IP (some test clients say "testclient"): it is still the
            # connection we talk to, and nothing vouches for headers behind it.
            return self._remember(text, text)
        if not self.trusts(peer):
            return self._remember(text, str(peer)) if text and peer is not None else UNKNOWN_IP
        if self.behind_cloudflare:
            cf = request.header("cf-connecting-ip")
            cf_ip = parse_ip(cf) if cf else None
            if cf_ip is not None:
                return str(cf_ip)
        hops: list[str] = []
        for value in request.header_values("x-forwarded-for"):
            hops.extend(value.split(","))
        nearest = peer
        for hop in reversed(hops):
            address = parse_ip(hop)
            if address is None:
                # A trusted proxy never writes garbage; stop at the nearest hop we can vouch
                # for rather than let an unparsable value become a fresh key per request.
                break
            if not self.trusts(address):
                return str(address)
            nearest = address
        return str(nearest) if nearest is not None else UNKNOWN_IP


# --- structured fields -------------------------------------------------------------------


def sf_string(text: str) -> str:
    """Serialize a limit name as the RFC 8941 sf-string that keys its RateLimit items: the
    one encoding the Worker writes too (``policy.header_key``: non-ASCII, controls and
    ``%`` percent-encoded, ``"`` and ``\\`` escaped), so a client sees one key per limit
    whichever layer answered."""
    return header_key(text)


def delay_seconds(seconds: float | None) -> int:
    """Seconds as a non-negative integer, rounded up, so a client never comes back early."""
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return 0
    # A float such as 2.0000000001 from ms arithmetic rounds up to 3: early is wrong, late is
    # merely conservative.
    return math.ceil(seconds)


@dataclass(frozen=True, slots=True)
class PolicyItem:
    """One item of RateLimit-Policy / RateLimit: one rate of one limit, as sent."""

    key: str
    limit: str
    quota: int
    window: float
    remaining: int
    reset: int
    allowed: bool

    @property
    def window_seconds(self) -> int | None:
        """``w``: whole seconds, or None for a sub-second or fractional window (not sent)."""
        whole = round(self.window)
        return whole if whole >= 1 and abs(self.window - whole) < 1e-9 else None

    def policy_member(self) -> str:
        """This item as a RateLimit-Policy list member."""
        text = f"{sf_string(self.key)};q={self.quota}"
        window = self.window_seconds
        return text if window is None else f"{text};w={window}"

    def limit_member(self) -> str:
        """This item as a RateLimit list member."""
        return f"{sf_string(self.key)};r={self.remaining};t={self.reset}"


# --- the outcome ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    """A response the middleware sends instead of calling the app.

    ``status`` is 429 (a limit refused), 503 (a limit failing closed, or a failing
    ``identify`` or exemption function under ``on_identify_error="refuse"``) or 400 (a path
    holding a control character). ``headers`` are the rate-limit headers
    (``RateLimit-Policy``, ``RateLimit``, ``Retry-After``) and the body's own; ``body`` is
    the RFC 9457 problem document. ``decision`` is the limiter's answer, None when nothing
    was decided (the 400, the 503 of a failing function). An app's ``refusal=`` function
    receives this default and may replace the body.
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    decision: Decision | None = None

    @property
    def retry_after(self) -> int | None:
        """The seconds of its ``Retry-After`` header, or None (a 400 has none)."""
        for name, value in self.headers:
            if name == "Retry-After":
                return int(value)
        return None


# Built for every request: a plain slotted dataclass, not a frozen one, whose __init__
# pays an object.__setattr__ per field. Nothing changes it after construction.
@dataclass(slots=True)
class Outcome:
    """What to do with a request: headers to add to the app's response, or a refusal."""

    headers: tuple[tuple[str, str], ...] = ()
    refusal: Refusal | None = None

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """``headers`` encoded for an ASGI ``http.response.start`` message."""
        return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers]


PASS = Outcome()
# The answer of an exemption (exempt_when, exempt_caller): pass the request to the app
# without counting it or adding headers. An Outcome of its own, so that shells can tell
# it from PASS.
EXEMPTED = Outcome()


class _Exempt(Decision):
    """The Decision left for the app when an exemption spared the request (``exempt_when``,
    ``exempt_caller``, a view marked exempt): allowed, nothing counted, no limit results.
    There is one, ``applimit.EXEMPT``: test it with ``decision is applimit.EXEMPT``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "applimit.EXEMPT"


EXEMPT: Final[Decision] = _Exempt(True, 0, 0, 0.0, None, None, (), False)

ExemptWhen = Callable[[RequestInfo, str], bool]
"""``exempt_when(request, client_ip) -> bool``: True spares the request (neither counted
nor refused, no headers); asked before ``identify``, for requests some limit matches.
``client_ip`` is the client's address as the limits count it (``trusted_proxies``
applied): a forwarding header a client wrote cannot make it an internal address."""

ExemptCaller = Callable[[RequestInfo, Caller], bool]
"""``exempt_caller(request, caller) -> bool``: True spares the request of an identified
caller; asked after ``identify``, only when it returned a :class:`Caller`."""

RefusalBody = tuple[bytes | str, str]
"""What a ``refusal=`` function returns: the body (``str`` is sent as UTF-8) and its
``Content-Type``."""

RenderRefusal = Callable[[RequestInfo, Refusal], RefusalBody | None]
"""``refusal(request, default) -> (body, content_type) | None``: the app's own body for a
429 or 503; None sends the default problem document. Status and rate-limit headers are
kept."""


# Built for every request, as Outcome is.
@dataclass(slots=True)
class Subject:
    """The arguments of one ``check_request`` call, resolved from a request and its caller."""

    identity: str | None
    tier: str
    ip: str
    # The caller's app keys (Caller.keys), passed as keys= wherever the identity goes.
    keys: Mapping[str, str]


class Gate:
    """Everything the middleware decides that is not I/O.

    ``legacy_headers`` adds ``X-RateLimit-Limit``/``-Remaining``/``-Reset`` (delta seconds)
    for the most restrictive item. ``tiers`` is the policy's tier list (least generous first),
    used to place anonymous callers and callers with no tier in the lowest one.

    ``exempt_when``, ``exempt_caller`` and ``refusal`` are the app's functions (see
    :meth:`exempts`, :meth:`exempts_caller` and :meth:`render`); a shell tests them for
    None before calling, so that an unset one costs nothing. Their first argument is what
    the shell gives them: the :class:`RequestInfo`, or (Django) the framework's request.
    """

    def __init__(
        self,
        *,
        tiers: Sequence[str],
        proxies: TrustedProxies | None = None,
        legacy_headers: bool = False,
        problem_type: str = QUOTA_EXCEEDED,
        on_identify_error: OnIdentifyError = "raise",
        exempt_when: Callable[[Any, str], bool] | None = None,
        exempt_caller: Callable[[Any, Caller], bool] | None = None,
        refusal: Callable[[Any, Refusal], RefusalBody | None] | None = None,
    ) -> None:
        """Configure the gate; ``tiers`` must not be empty."""
        if not tiers:
            raise ValueError("the policy lists no tiers; the gate needs at least one")
        if on_identify_error not in ON_IDENTIFY_ERROR:
            choices = ", ".join(repr(c) for c in ON_IDENTIFY_ERROR)
            raise ConfigurationError(
                f"on_identify_error is {on_identify_error!r}; use one of {choices}."
            )
        self.tiers = tuple(tiers)
        self.proxies = proxies or TrustedProxies()
        self.legacy_headers = legacy_headers
        self.problem_type = problem_type
        self.on_identify_error: OnIdentifyError = on_identify_error
        self.exempt_when = exempt_when
        self.exempt_caller = exempt_caller
        self.refusal = refusal
        # Tier names come from identify(), which may pass on what a client sent: remember a
        # bounded number of them, so a stream of invented tiers cannot grow memory.
        self._warned_tiers: set[str] = set()
        # Each (limit, quota, window)'s RateLimit-Policy member and its sf-string key, made
        # on first use: a limit's rate is fixed by the policy, so these are formatted once
        # instead of for every response (the policy's limits and tiers bound them; results
        # handed to outcome() by an app could hold others, hence the memo's bound).
        self._formatted: Memo[tuple[str, int, float], tuple[str, str]] = Memo(_MEMBERS)
        self._members = self._formatted.entries  # read for every admitted response

    @property
    def lowest_tier(self) -> str:
        """The least generous tier: anonymous callers are counted in it."""
        return self.tiers[0]

    def subject(self, request: RequestInfo, caller: Caller | None) -> Subject:
        """Who to count: the user and tier from ``identify``, or the client IP when anonymous.

        A tier the policy does not list is counted as the lowest tier (and logged once):
        an auth system that invents a tier must not lift the caller out of every limit.
        """
        ip = self.proxies.client_ip(request)
        if caller is None:
            return Subject(None, self.lowest_tier, ip, _NO_KEYS)
        # Typed as object: identify() is the app's code, and its tier may not be a str.
        claimed: object = caller.tier or self.lowest_tier
        if isinstance(claimed, str) and claimed in self.tiers:
            tier = claimed
        else:
            # A tier often comes from a token claim a client may shape: whatever it is (an
            # unknown name, a number, a list), it is logged and counted as the lowest tier.
            shown = (claimed if isinstance(claimed, str) else repr(claimed))[:64]
            if shown not in self._warned_tiers and len(self._warned_tiers) < MAX_WARNED_TIERS:
                self._warned_tiers.add(shown)
                logger.warning(
                    "identify() returned tier %r, which the policy does not list (%s); "
                    "counting the caller in the lowest tier %r",
                    shown,
                    ", ".join(self.tiers),
                    self.lowest_tier,
                    extra={"applimit_event": "unknown_tier", "tier": shown},
                )
            tier = self.lowest_tier
        identity = caller.user
        return Subject(identity, tier, ip, caller.keys)

    def identify_failed(self, request: RequestInfo, error: Exception) -> Outcome | None:
        """What ``on_identify_error`` makes of an exception raised by ``identify``.

        ``"raise"`` re-raises it (the caller of this method is inside ``except``);
        ``"anonymous"`` logs it and returns None: count the caller as anonymous, by IP;
        ``"refuse"`` logs it and returns a 503 refusal without consuming any quota.
        """
        return self._failed("identify", request, error)

    def exempts(self, request: RequestInfo, native: object) -> Outcome | None:
        """``exempt_when(native, client_ip)``: :data:`EXEMPTED` when it spares the request,
        None when not (or when unset). ``client_ip`` is the one the limits would count.

        An exception (or an answer other than True or False, which is a bug: an async
        function's coroutine would otherwise spare everyone) follows ``on_identify_error``
        as identify's does: ``"raise"`` re-raises, ``"anonymous"`` logs it and does not
        exempt (the request is counted as any other), ``"refuse"`` logs it and returns the
        503 refusal.
        """
        hook = self.exempt_when
        if hook is None:
            return None
        try:
            answer = _yes_or_no("exempt_when", hook(native, self.proxies.client_ip(request)))
        except Exception as error:
            return self._failed("exempt_when", request, error)
        return EXEMPTED if answer else None

    def exempts_caller(
        self, request: RequestInfo, native: object, caller: Caller
    ) -> Outcome | None:
        """``exempt_caller(native, caller)`` for an identified caller, as :meth:`exempts`."""
        hook = self.exempt_caller
        if hook is None:
            return None
        try:
            answer = _yes_or_no("exempt_caller", hook(native, caller))
        except Exception as error:
            return self._failed("exempt_caller", request, error)
        return EXEMPTED if answer else None

    def _failed(self, option: str, request: RequestInfo, error: Exception) -> Outcome | None:
        """``on_identify_error`` applied to an exception of the app's ``option`` function."""
        if self.on_identify_error == "raise":
            raise error
        if self.on_identify_error == "anonymous":
            meaning = (
                "counts the caller as anonymous"
                if option == "identify"
                else "does not exempt the request"
            )
        else:
            meaning = "refuses the request with 503"
        logger.error(
            "%s() raised on %s %s; on_identify_error=%r %s",
            option,
            request.method,
            request.raw_path,
            self.on_identify_error,
            meaning,
            exc_info=error,
            extra={
                "applimit_event": "identify_failed" if option == "identify" else "exempt_failed",
                "on_identify_error": self.on_identify_error,
                "error": type(error).__name__,
            },
        )
        if self.on_identify_error == "anonymous":
            return None
        what = "who is calling" if option == "identify" else "whether this request is rate limited"
        body = problem_body(
            type_=TEMPORARY_REDUCED_CAPACITY,
            title="Service Unavailable",
            status=503,
            detail=(
                f"The service cannot tell {what} right now; "
                f"retry in {_seconds(IDENTIFY_RETRY_AFTER)}."
            ),
            extra={"retry-after": IDENTIFY_RETRY_AFTER},
        )
        headers = (
            ("Retry-After", str(IDENTIFY_RETRY_AFTER)),
            ("Content-Type", PROBLEM_JSON),
            ("Content-Length", str(len(body))),
        )
        return Outcome(refusal=Refusal(status=503, headers=headers, body=body))

    def render(self, refusal: Refusal, request: RequestInfo, native: object) -> Refusal:
        """The refusal to send: ``refusal``, with the body of the app's ``refusal=``
        function (called with ``native`` and ``refusal``) when one is set.

        The status and every header but the body's own (``Content-Type``,
        ``Content-Length``) are kept: ``RateLimit-Policy``, ``RateLimit``, ``Retry-After``
        and ``X-RateLimit-*`` describe the refusal whatever the body says. A 400 (a path
        holding a control character) keeps its own body. The function answering None, or
        failing (raising, or an answer that is not ``(body, content_type)``), sends the
        default: a refusal must go out; a failure is logged with its traceback.
        """
        page = self.refusal
        if page is None or refusal.status == 400:
            return refusal
        try:
            answer = page(native, refusal)
            if answer is None:
                return refusal
            body, content_type = _refusal_body(answer)
        except Exception:
            logger.exception(
                "refusal() failed for the %d answer to %s %s; the default body is sent",
                refusal.status,
                request.method,
                request.raw_path,
                extra={"applimit_event": "refusal_failed", "status": refusal.status},
            )
            return refusal
        headers = [(k, v) for k, v in refusal.headers if k.lower() not in _BODY_HEADERS]
        headers += [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        return Refusal(refusal.status, tuple(headers), body, refusal.decision)

    # -- headers ----------------------------------------------------------------------------

    @staticmethod
    def items(results: Sequence[LimitResult]) -> list[PolicyItem]:
        """One header item per enforced rate; shadow limits are not advertised.

        A limit with one rate is named after the limit (``"api"``); a tier with several rates
        gets one item per rate, named ``limit/period`` (``"api/1m"``, ``"api/1h"``).
        """
        enforced = [r for r in results if not r.shadow]
        counts: dict[str, int] = {}
        for result in enforced:
            counts[result.name] = counts.get(result.name, 0) + 1
        items: list[PolicyItem] = []
        for result in enforced:
            key = result.name
            if counts[result.name] > 1:
                key = f"{result.name}/{_period_text(result.window)}"
            # Allowed: r units may be used within t (the full quota is back by then).
            # Denied: t is when this request would fit, which Retry-After never undercuts.
            reset = delay_seconds(result.reset_after) if result.allowed else _denied_delay(result)
            items.append(
                PolicyItem(
                    key=key,
                    limit=result.name,
                    quota=result.quota,
                    window=result.window,
                    # A GCRA burst above the quota can leave more than q; never advertise
                    # more than the policy's quota (the draft lets servers lower r).
                    remaining=min(max(0, result.remaining), result.quota),
                    reset=reset,
                    allowed=result.allowed,
                )
            )
        return items

    def outcome(self, decision: Decision, tier: str) -> Outcome:
        """The outcome of a decision of ``check_request`` (or ``hit``)."""
        results = decision.results
        if len(results) == 1 and decision.allowed and not decision.degraded:
            only = results[0]
            if only.allowed and not only.shadow:
                # Most responses: one enforced rate that admitted the request.
                return self._admitted(only)
        items = self.items(results)
        if decision.degraded:
            return self._degraded(decision, items)
        if not items:
            # Nothing enforced applies (no matching limit, or only shadow limits): shadow
            # limits never deny, so a denial here cannot come from them.
            return PASS
        policy = ("RateLimit-Policy", ", ".join(i.policy_member() for i in items))
        denied = [i for i in items if not i.allowed]
        if decision.allowed or not denied:
            headers = [policy, ("RateLimit", ", ".join(i.limit_member() for i in items))]
            headers += self._legacy(_binding(items))
            return Outcome(headers=tuple(headers))
        # Only the violated policies go into RateLimit on a refusal, so that Retry-After (the
        # largest of their waits) is never earlier than any reset parameter in the response.
        # At least 1: a refusal never says "retry now".
        retry = max(*(i.reset for i in denied), delay_seconds(decision.retry_after), 1)
        worst = max(denied, key=lambda i: i.reset)
        headers = [
            policy,
            ("RateLimit", ", ".join(i.limit_member() for i in denied)),
            ("Retry-After", str(retry)),
            *self._legacy(worst),
        ]
        body = problem_body(
            type_=self.problem_type,
            title="Too Many Requests",
            status=429,
            detail=(
                f"Rate limit {worst.limit!r} allows {worst.quota} requests per "
                f"{_period_text(worst.window)} for the {tier} tier; retry in {_seconds(retry)}."
            ),
            extra={
                "limit": worst.limit,
                "violated-policies": [i.key for i in denied],
                "retry-after": retry,
            },
        )
        headers.append(("Content-Type", PROBLEM_JSON))
        headers.append(("Content-Length", str(len(body))))
        return Outcome(
            refusal=Refusal(status=429, headers=tuple(headers), body=body, decision=decision)
        )

    def _admitted(self, result: LimitResult) -> Outcome:
        """What :meth:`outcome` makes of one enforced result that admits the request, with
        its policy member formatted once per limit and rate: the same headers, in the same
        order, as the general path's (a test holds the two to each other)."""
        member = self._members.get((result.name, result.quota, result.window))
        if member is None:
            item = PolicyItem(result.name, result.name, result.quota, result.window, 0, 0, True)
            member = (item.policy_member(), sf_string(result.name))
            self._formatted.keep((result.name, result.quota, result.window), member)
        policy, key = member
        quota = result.quota
        remaining = result.remaining
        # As items(): never below 0, never above the quota (a GCRA burst can exceed it).
        if remaining > quota:
            remaining = quota
        elif remaining < 0:
            remaining = 0
        reset = delay_seconds(result.reset_after)
        if self.legacy_headers:
            return Outcome(
                (
                    ("RateLimit-Policy", policy),
                    ("RateLimit", f"{key};r={remaining};t={reset}"),
                    ("X-RateLimit-Limit", str(quota)),
                    ("X-RateLimit-Remaining", str(remaining)),
                    ("X-RateLimit-Reset", str(reset)),
                ),
                None,
            )
        return Outcome(
            (
                ("RateLimit-Policy", policy),
                ("RateLimit", f"{key};r={remaining};t={reset}"),
            ),
            None,
        )

    def _legacy(self, item: PolicyItem | None) -> list[tuple[str, str]]:
        if not self.legacy_headers or item is None:
            return []
        return [
            ("X-RateLimit-Limit", str(item.quota)),
            ("X-RateLimit-Remaining", str(item.remaining)),
            ("X-RateLimit-Reset", str(item.reset)),
        ]

    def _degraded(self, decision: Decision, items: list[PolicyItem]) -> Outcome:
        """Redis could not answer: the failure policy already decided allow or deny.

        The remaining counts are unknown, so ``RateLimit`` is left out rather than invented;
        the static ``RateLimit-Policy`` still describes the quotas. A fail-closed refusal is a
        503 (the service, not the client, is at fault) with the draft's
        temporary-reduced-capacity problem type.
        """
        headers: list[tuple[str, str]] = []
        if items:
            headers.append(("RateLimit-Policy", ", ".join(i.policy_member() for i in items)))
        if decision.allowed:
            return Outcome(headers=tuple(headers))
        retry = max(1, delay_seconds(decision.retry_after))
        closed = [i.key for i in items if not i.allowed]
        body = problem_body(
            type_=TEMPORARY_REDUCED_CAPACITY,
            title="Service Unavailable",
            status=503,
            detail=(
                "The rate limiter cannot reach its store and this endpoint fails closed; "
                f"retry in {_seconds(retry)}."
            ),
            extra={"violated-policies": closed, "retry-after": retry},
        )
        headers += [
            ("Retry-After", str(retry)),
            ("Content-Type", PROBLEM_JSON),
            ("Content-Length", str(len(body))),
        ]
        return Outcome(
            refusal=Refusal(status=503, headers=tuple(headers), body=body, decision=decision)
        )


# The headers that describe a refusal's body, replaced with the body (Gate.render).
_BODY_HEADERS = frozenset({"content-type", "content-length"})


def _yes_or_no(option: str, answer: object) -> bool:
    """An exemption function's answer, which must be True or False: a coroutine (an async
    function given where a plain one is needed) or a forgotten return would otherwise be
    read as an answer, and a truthy one would spare every request."""
    if type(answer) is bool:
        return answer
    if inspect.iscoroutine(answer):
        answer.close()  # never awaited: close it, or Python warns about it
    raise TypeError(
        f"{option}() returned {type(answer).__name__}; return True to exempt the request "
        "(neither counted nor refused) or False to limit it, from a plain function"
    )


def _refusal_body(answer: object) -> tuple[bytes, str]:
    """A ``refusal=`` function's ``(body, content_type)``, checked; the body as bytes."""
    if inspect.iscoroutine(answer):
        answer.close()  # never awaited: close it, or Python warns about it
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise TypeError(
            f"refusal() returned {type(answer).__name__}; return (body, content_type), such "
            "as (html, 'text/html; charset=utf-8'), or None for the default problem body, "
            "from a plain function"
        )
    body, content_type = answer
    if isinstance(body, str):
        body = body.encode("utf-8")
    if not isinstance(body, bytes):
        raise TypeError(f"refusal() returned a body of {type(body).__name__}; use bytes or str")
    # A header value the app chose: printable ASCII only, so that it cannot end the header.
    if (
        not isinstance(content_type, str)
        or not content_type
        or not content_type.isascii()
        or not content_type.isprintable()
    ):
        raise ValueError(
            f"refusal() returned the content type {content_type!r}; use a media type such "
            "as 'text/html; charset=utf-8' (printable ASCII)"
        )
    return body, content_type


def _seconds(count: int) -> str:
    """``1 second``, ``2 seconds``: the count in the problem's prose."""
    return f"{count} second" if count == 1 else f"{count} seconds"


def _denied_delay(result: LimitResult) -> int:
    """``t`` of a violated policy: seconds until enough quota is back for this request.

    When the request can never fit (a cost above the quota) there is no such time; one
    window is what the client is told, so that it does not retry in a tight loop.
    """
    wait = result.retry_after
    if wait is None or not math.isfinite(wait):
        wait = result.window
    return max(1, delay_seconds(wait))


def _binding(items: Sequence[PolicyItem]) -> PolicyItem | None:
    """The most restrictive item: fewest remaining, then the longest wait."""
    if not items:
        return None
    return min(items, key=lambda i: (i.remaining, -i.reset))


def _period_text(window: float) -> str:
    """A window in the policy's own duration syntax (``1m``, ``10s``, ``500ms``)."""
    ms = round(window * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def problem_body(
    *, type_: str, title: str, status: int, detail: str, extra: Mapping[str, object]
) -> bytes:
    """An RFC 9457 problem document as UTF-8 JSON."""
    document: dict[str, object] = {
        "type": type_,
        "title": title,
        "status": status,
        "detail": detail,
    }
    document.update(extra)
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# --- the middleware's options ------------------------------------------------------------


Cost = Callable[[RequestInfo], int]
"""A request's cost, computed from the request (the middleware's ``cost=`` may be one)."""


def bad_path(request: RequestInfo) -> Refusal | None:
    """The 400 refusal for a request whose path holds a control character, or None.

    Every middleware and helper asks this first, before matching: routers read control
    characters each their own way (a Starlette route's ``$`` matches before a final
    newline, so ``/login%0A`` runs the handler of ``/login``), and no resource is named with
    one, so the whole class is refused rather than counted spelling by spelling. The
    generated Worker answers the same.
    """
    path = request.path
    if path.isprintable() or not has_control_character(path):
        return None
    found = next(c for c in path if ord(c) < 0x20 or ord(c) == 0x7F)
    body = problem_body(
        type_="about:blank",
        title="Bad Request",
        status=400,
        detail=(
            f"The request path holds the control character U+{ord(found):04X}, which no "
            "resource is named with; remove it."
        ),
        extra={},
    )
    headers = (
        ("Content-Type", PROBLEM_JSON),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
    )
    return Refusal(status=400, headers=headers, body=body)


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


def _option_error(owner: str, option: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"{owner} option {option}: {problem}")


def middleware_gate(
    owner: str,
    *,
    tiers: Sequence[str],
    identify: object,
    cost: object,
    trusted_proxies: object,
    behind_cloudflare: object,
    legacy_headers: object,
    problem_type: object,
    on_identify_error: object,
    exempt_when: object = None,
    exempt_caller: object = None,
    refusal: object = None,
) -> Gate:
    """The gate for a middleware (or dependency) called ``owner``, every option checked.

    Called from the constructor, so a mistake stops the app where it is configured, with a
    :class:`~applimit.ConfigurationError` that names the option and the fix, rather than
    failing (or, worse, passing) on every request later.
    """
    if identify is not None and not callable(identify):
        raise _option_error(
            owner, "identify", f"{identify!r} is not callable; pass a function or None."
        )
    if not callable(cost) and (
        isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST
    ):
        raise _option_error(
            owner,
            "cost",
            f"{cost!r} is not a cost; pass a whole number from 1 to {MAX_COST:,}, or a "
            "function of the request that returns one.",
        )
    if isinstance(trusted_proxies, (str, bytes)) or not isinstance(trusted_proxies, Iterable):
        raise _option_error(
            owner,
            "trusted_proxies",
            f"{trusted_proxies!r} is not a list; pass a list such as ['10.0.0.0/8'].",
        )
    entries = list(trusted_proxies)
    if not all(isinstance(entry, str) for entry in entries):
        raise _option_error(
            owner, "trusted_proxies", f"{entries!r} holds a value that is not a str."
        )
    cloudflare = _flag(owner, "behind_cloudflare", behind_cloudflare)
    legacy = _flag(owner, "legacy_headers", legacy_headers)
    if not isinstance(problem_type, str) or not problem_type:
        raise _option_error(
            owner, "problem_type", f"{problem_type!r} is not a URI; pass a non-empty str."
        )
    if on_identify_error not in ON_IDENTIFY_ERROR:
        choices = ", ".join(repr(c) for c in ON_IDENTIFY_ERROR)
        raise _option_error(
            owner, "on_identify_error", f"{on_identify_error!r} is not one of {choices}."
        )
    try:
        proxies = TrustedProxies(entries, behind_cloudflare=cloudflare)
    except ValueError as error:
        raise _option_error(owner, "trusted_proxies", str(error)) from None
    return Gate(
        tiers=tiers,
        proxies=proxies,
        legacy_headers=legacy,
        problem_type=problem_type,
        on_identify_error=on_identify_error,
        exempt_when=_plain_function(
            owner, "exempt_when", exempt_when, "(request, client_ip) -> bool"
        ),
        exempt_caller=_plain_function(
            owner, "exempt_caller", exempt_caller, "(request, caller) -> bool"
        ),
        refusal=_plain_function(
            owner, "refusal", refusal, "(request, refusal) -> (body, content_type) | None"
        ),
    )


def _plain_function(owner: str, option: str, value: object, shape: str) -> Any:
    """``value`` when it is None or a plain (not async) function; else the option's error.

    These functions run inside the decision, which does not await them: a coroutine
    function's answer would be a coroutine, not an answer.
    """
    if value is None:
        return None
    if not callable(value):
        raise _option_error(
            owner, option, f"{value!r} is not callable; pass a function {option}{shape} or None."
        )
    # An object whose __call__ is async is one too.
    if inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(type(value).__call__):
        raise _option_error(
            owner,
            option,
            f"{getattr(value, '__name__', value)!r} is an async function; pass a plain "
            f"function {option}{shape} (it runs inside the decision, which does not await it).",
        )
    return value


def _flag(owner: str, option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _option_error(owner, option, f"{value!r} is not True or False.")
    return value


def request_cost(cost: int | Cost, request: RequestInfo) -> int:
    """The cost of ``request``: ``cost`` itself, or what the function returns for it.

    A function's exceptions are the app's and propagate; a value that is not a cost is an
    :class:`~applimit.InvalidArgumentError` naming the function.
    """
    if not callable(cost):
        return cost
    value = cost(request)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COST:
        raise InvalidArgumentError(
            "cost",
            f"the cost function {getattr(cost, '__name__', cost)!r} returned {value!r} for "
            f"{request.method} {request.path}; return a whole number from 1 to {MAX_COST:,}.",
        )
    return value
