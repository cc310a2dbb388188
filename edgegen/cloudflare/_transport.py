"""The transport: the only module in edgegen that talks HTTP.

``Transport.send`` sends one request to the Cloudflare API and returns a 2xx answer read in
full, or raises one ``CloudflareAPIError``; ``Transport.call`` also unwraps Cloudflare's v4
envelope (``{"success", "errors", "messages", "result"}``) into its ``result``. It adds the
token (an ``httpx.Auth`` flow, so the token is in no client attribute, log line or
exception), applies explicit timeouts, and retries as ``_retry.decide`` says: it only
loops, sending, waiting and raising.

Each try has a wall-clock deadline (``REQUEST_DEADLINE``), answer included: httpx's
timeouts are per socket read, so a server sending one byte a second would otherwise hold a
request for as long as it likes. The try runs in a worker thread that reads the answer in
chunks, checking the time and the size (at most ``MAX_RESPONSE_BYTES``); the caller stops
waiting at the deadline whatever the worker is doing (a trickle of headers, a hung DNS
lookup). All tries and waits of one transport (one command) share ``COMMAND_DEADLINE``.
Answers are asked for without compression (a zip bomb passes any size cap), and one that
comes compressed anyway is refused.

The token is only sent over https:// (or http:// to this machine's loopback address):
``check_base_url``. No proxy is taken from the environment (``HTTP_PROXY``, ``HTTPS_PROXY``,
``ALL_PROXY`` are ignored): httpx would send a request to an http:// base, Authorization
header included, to such a proxy in clear text. A proxy is an explicit choice
(``EDGEGEN_PROXY``, or ``proxy=``: ``check_proxy_url``), used only for a base that is not
loopback, which is then https://, so the request travels inside a CONNECT tunnel and the
proxy sees only where it goes.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from .. import _json
from ..errors import CloudflareAPIError, UsageError
from . import _messages, _retry
from ._messages import BASE_URL_ENV, DEFAULT_BASE_URL, PROXY_ENV, Redactor, shown_url
from ._retry import RetryPolicy
from ._token import Token

USER_AGENT = "edgegen/0.1"
# Reads are small; a script upload may take a while on a slow link.
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# The most one try of a request may take, answer included (wall clock, not per read).
REQUEST_DEADLINE = 60.0
# The most one transport (one command) may spend on the API, tries and waits included; time
# spent elsewhere (apply waiting for its question to be answered) does not count.
COMMAND_DEADLINE = 300.0
# The largest answer read (Cloudflare's are kilobytes; a Worker's content a few MB).
MAX_RESPONSE_BYTES = 16 * 2**20
# How long after a try's deadline the caller gives up on the thread running it.
_GRACE = 0.25


# --- where the token may go ------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether a URL's host is this machine: 127.0.0.0/8, ::1 or localhost."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def check_base_url(url: str) -> str:
    """``url`` without a trailing ``/`` if the API token may be sent to it; else UsageError.

    https:// only, except http:// to a loopback address (a local proxy or test server):
    anywhere else the token would travel in clear text. No user, password, query or
    fragment: they would never be sent as meant, only logged.
    """
    try:
        parts = urlsplit(url)
        httpx.URL(url)
        host = parts.hostname or ""
    except (httpx.InvalidURL, ValueError, TypeError):
        parts, host = None, ""
    if parts is None or parts.scheme not in ("https", "http") or not host:
        raise UsageError(
            f"{BASE_URL_ENV} is {shown_url(url)!r}, which is not an http(s) URL; set it like "
            f"{DEFAULT_BASE_URL} or unset it"
        )
    if "@" in parts.netloc:
        # The Authorization header carries the API token, so a user and password here would
        # never be sent; they would only show up in logs.
        raise UsageError(
            f"{BASE_URL_ENV} is {shown_url(url)!r}: it holds a user name or password, which "
            "edgegen does not send (the API token is its credential); remove them from the URL"
        )
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise UsageError(
            f"{BASE_URL_ENV} is {shown_url(url)!r}: it holds a query or fragment, which "
            "requests to the API would not keep; remove everything from the '?' or '#'"
        )
    if parts.scheme == "http" and not is_loopback(host):
        raise UsageError(
            f"{BASE_URL_ENV} is {shown_url(url)!r}: with http:// the API token would travel "
            "in clear text; use https:// (plain http:// is only for this machine: "
            "127.0.0.1, ::1 or localhost)"
        )
    return url.rstrip("/")


def base_url_from_env(env: Mapping[str, str]) -> str:
    """``CLOUDFLARE_API_BASE_URL`` (e.g. a proxy) or the public API (see ``check_base_url``)."""
    return check_base_url(env.get(BASE_URL_ENV, "").strip() or DEFAULT_BASE_URL)


def check_proxy_url(url: str) -> str:
    """``url`` without a trailing ``/`` if it can be the proxy requests go through; else
    UsageError (which shows the URL with its password as ``***``).

    An http:// or https:// proxy with a host and perhaps a port and a user and password
    (the proxy's own credentials, sent to it in ``Proxy-Authorization``); no path, query or
    fragment, which a proxy URL does not use. The API token never goes to the proxy: the
    proxy only carries https:// requests, as a CONNECT tunnel (see ``Transport``).
    """
    try:
        parts = urlsplit(url)
        httpx.URL(url)
        host = parts.hostname or ""
        # A port that is not a number, or out of range, raises ValueError here.
        port = parts.port
    except (httpx.InvalidURL, ValueError, TypeError):
        parts, host, port = None, "", None
    if parts is None or parts.scheme not in ("http", "https") or not host or port == 0:
        raise UsageError(
            f"{PROXY_ENV} is {shown_url(url)!r}, which is not an http(s) proxy URL; set it "
            "like http://proxy.example:3128 (http:// or https://, a host, perhaps a port) "
            "or unset it"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment or url.endswith(("?", "#")):
        raise UsageError(
            f"{PROXY_ENV} is {shown_url(url)!r}: a proxy URL has no path, query or fragment; "
            "give only the scheme, host and port, like http://proxy.example:3128"
        )
    return url.rstrip("/")


def proxy_from_env(env: Mapping[str, str]) -> str | None:
    """``EDGEGEN_PROXY`` (see ``check_proxy_url``), or None when it is unset or empty."""
    value = env.get(PROXY_ENV, "").strip()
    return check_proxy_url(value) if value else None


def _proxied(base_url: str, proxy: str | None) -> str | None:
    """The proxy that requests to ``base_url`` go through: none for this machine.

    The base URL has passed ``check_base_url``, so one that is not loopback is https://:
    through the proxy its requests travel in a CONNECT tunnel, and the proxy never sees the
    token. A loopback base (the only one http:// may be) is reached directly, never through
    a proxy, which would see an http:// request and its token in clear text.
    """
    if proxy is None or is_loopback(urlsplit(base_url).hostname or ""):
        return None
    return proxy


class _BearerAuth(httpx.Auth):
    """Adds ``Authorization: Bearer`` to each request as it is sent, and nowhere else."""

    def __init__(self, token: Token) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token.reveal()}"
        yield request


# --- one try ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a multipart/form-data body."""

    name: str
    content: bytes
    content_type: str
    filename: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer read in full: status, headers and body (at most the size cap)."""

    status_code: int
    headers: httpx.Headers
    content: bytes

    @property
    def is_success(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status_code < 300


@dataclass(frozen=True, slots=True)
class _Failed:
    """Why a try got no usable answer.

    ``kind``: ``unsent`` (the connection never opened: safe to repeat), ``unanswered``
    (sent, no answer), ``deadline`` (no full answer in time), ``undecodable`` (an answer
    edgegen cannot read), ``too_large`` (over the size cap). ``name`` is the class of the
    exception behind it (never the exception, which holds the request and so the token).
    """

    kind: Literal["unsent", "unanswered", "deadline", "undecodable", "too_large"]
    name: str = ""
    status: int | None = None
    detail: str = ""


def _exchange(
    http: httpx.Client,
    *,
    method: str,
    path: str,
    params: tuple[tuple[str, str], ...],
    json_body: Any,
    files: Any,
    deadline: float,
    cap: int,
) -> Reply | _Failed:
    """One try: send, then read the answer in chunks until it ends, passes ``cap`` bytes
    or the ``deadline`` (``time.monotonic``) passes. Runs in its own thread."""
    try:
        with http.stream(
            method, path, params=list(params) or None, json=json_body, files=files
        ) as response:
            status = response.status_code
            encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                return _Failed("undecodable", "", status, "Content-Encoding")
            declared = response.headers.get("Content-Length", "").strip()
            if declared.isascii() and declared.isdigit() and int(declared) > cap:
                return _Failed("too_large", "", status)
            chunks: list[bytes] = []
            size = 0
            # With no Content-Encoding, iter_bytes yields the bytes as they came.
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > cap:
                    return _Failed("too_large", "", status)
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    return _Failed("deadline")
            return Reply(status, response.headers, b"".join(chunks))
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        return _Failed("unsent", type(exc).__name__)
    except httpx.ProxyError as exc:
        # The proxy refused the CONNECT tunnel: the request never reached Cloudflare.
        return _Failed("unsent", type(exc).__name__)
    except httpx.DecodingError as exc:
        return _Failed("undecodable", type(exc).__name__)
    except httpx.TransportError as exc:
        return _Failed("unanswered", type(exc).__name__)


def _tried(outcome: Reply | _Failed, cut_short: bool) -> _retry.Tried:
    """What a try gave, as the retry decision sees it (``cut_short``: the try had less than
    a full request deadline)."""
    if isinstance(outcome, Reply):
        retry_after = _retry.parse_retry_after(outcome.headers.get("Retry-After"))
        return _retry.Tried("answer", outcome.status_code, retry_after)
    if outcome.kind == "unsent":
        return _retry.Tried("unsent")
    if outcome.kind == "unanswered":
        return _retry.Tried("unanswered")
    if outcome.kind == "deadline":
        return _retry.Tried("deadline", cut_short=cut_short)
    return _retry.Tried("unusable")


def _json_or_none(reply: Reply) -> Any:
    """The body as JSON, or None when it is not JSON edgegen can use (see ``_json``)."""
    try:
        return _json.loads(reply.content)
    except ValueError:
        return None


def _is_envelope(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("success"), bool)


# --- the transport ---------------------------------------------------------------------


class Transport:
    """Sends requests to the Cloudflare API with the token, deadlines and retries.

    ``transport`` replaces the network (tests pass ``httpx.MockTransport`` or use respx);
    ``proxy`` is the proxy https:// requests go through (``check_proxy_url``; never for a
    loopback base, and not with ``transport``, which replaces the network and the proxy);
    ``sleep`` waits between tries and ``jitter(low, high)`` draws a backoff wait.
    ``request_deadline`` and ``command_deadline`` (seconds) and ``max_response_bytes``
    default to ``REQUEST_DEADLINE``, ``COMMAND_DEADLINE`` and ``MAX_RESPONSE_BYTES``.
    """

    def __init__(
        self,
        token: Token,
        *,
        sleep: Callable[[float], None],
        jitter: _retry.Jitter,
        base_url: str = DEFAULT_BASE_URL,
        transport: httpx.BaseTransport | None = None,
        proxy: str | None = None,
        timeout: httpx.Timeout | None = None,
        retry: RetryPolicy | None = None,
        request_deadline: float | None = None,
        command_deadline: float | None = None,
        max_response_bytes: int | None = None,
    ) -> None:
        self.base_url = check_base_url(base_url)
        self.proxy = _proxied(self.base_url, check_proxy_url(proxy) if proxy else None)
        # The base URL as messages show it: a proxy's password is never printed.
        self.shown_base_url = shown_url(self.base_url)
        # Where requests go, as errors say it: the base URL, and the proxy if there is one.
        self.shown_route = self.shown_base_url
        if self.proxy is not None:
            self.shown_route += f" (through the proxy {shown_url(self.proxy)})"
        self.redact = Redactor(token.reveal())
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._jitter = jitter
        self.request_deadline = request_deadline or REQUEST_DEADLINE
        self.command_deadline = command_deadline or COMMAND_DEADLINE
        self.max_response_bytes = max_response_bytes or MAX_RESPONSE_BYTES
        # Seconds spent on the API so far: tries and waits between them.
        self.spent = 0.0
        self._given_transport = transport
        self._options: dict[str, Any] = {
            "base_url": self.base_url,
            "auth": _BearerAuth(token),
            "timeout": timeout or DEFAULT_TIMEOUT,
            "headers": {
                "User-Agent": USER_AGENT,
                "Accept": "application/json",
                "Accept-Encoding": "identity",
            },
            "follow_redirects": False,
            # No proxy from the environment reaches the client: a proxy is only the one
            # given (see the module's docstring).
            "trust_env": False,
        }
        self._http = self._new_client()

    def _new_client(self) -> httpx.Client:
        """A client of the API, each with its own connection pool (or the given transport).

        The transport is always explicit, so httpx reads no proxy from the environment;
        the one setting it still reads there is a CA bundle (``SSL_CERT_FILE``,
        ``SSL_CERT_DIR``), which only decides which servers are trusted.
        """
        transport = self._given_transport or httpx.HTTPTransport(proxy=self.proxy, trust_env=True)
        return httpx.Client(transport=transport, **self._options)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    @property
    def time_left(self) -> float:
        """Seconds this transport may still spend on the API."""
        return self.command_deadline - self.spent

    def _attempt(
        self, exchange: Callable[[httpx.Client, float], Reply | _Failed], budget: float
    ) -> Reply | _Failed:
        """One try, ``exchange(http, deadline)``, in a worker thread, waited for until
        ``budget`` seconds have passed.

        A try still running then is abandoned: its client is closed (which ends its reads)
        and this transport carries on with a new one.
        """
        started = time.monotonic()
        deadline = started + budget
        http = self._http
        outcome: list[Reply | _Failed | BaseException] = []
        finished = threading.Event()

        def work() -> None:
            try:
                outcome.append(exchange(http, deadline))
            except BaseException as exc:  # handed to the caller, or dropped once it left
                outcome.append(exc)
            finally:
                finished.set()

        thread = threading.Thread(target=work, name="edgegen-request", daemon=True)
        thread.start()
        try:
            done = finished.wait(budget + _GRACE)
        finally:
            self.spent += time.monotonic() - started
        if not done:
            self._http = self._new_client()
            http.close()
            return _Failed("deadline")
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def send(
        self,
        method: str,
        path: str,
        *,
        params: tuple[tuple[str, str], ...] = (),
        json_body: Any = None,
        parts: tuple[Part, ...] = (),
        query: bool = False,
    ) -> Reply:
        """Send with retries; returns a 2xx answer, else raises CloudflareAPIError.
        ``query``: whatever its method, the request only reads (a GraphQL query), so it is
        retried as a GET is and no failure of it may have changed anything."""
        request = (
            _retry.RetryRequest(True, False) if query else _retry.RetryRequest.of(method, params)
        )
        files = (
            [(p.name, (p.filename, p.content, p.content_type)) for p in parts] if parts else None
        )
        cap = self.max_response_bytes

        def exchange(http: httpx.Client, deadline: float) -> Reply | _Failed:
            return _exchange(
                http,
                method=method,
                path=path,
                params=params,
                json_body=json_body,
                files=files,
                deadline=deadline,
                cap=cap,
            )

        retry = 0
        # Whether a try so far may have been acted on (its answer was lost or a 5xx).
        maybe_done = False
        while True:
            if self.time_left <= 0:
                raise self._out_of_time(method, path, retry, ambiguous=maybe_done)
            budget = min(self.request_deadline, self.time_left)
            outcome = self._attempt(exchange, budget)
            tried = _tried(outcome, cut_short=budget < self.request_deadline)
            decision = _retry.decide(
                self.retry, request, retry, tried, maybe_done=maybe_done, jitter=self._jitter
            )
            retry += 1
            maybe_done = decision.maybe_done
            if decision.action == "done" and isinstance(outcome, Reply):
                return outcome
            if decision.action == "give_up":
                raise self._out_of_time(method, path, retry, ambiguous=decision.ambiguous)
            if decision.action == "fail":
                if isinstance(outcome, Reply):
                    raise self._refused(method, path, outcome, tried.retry_after, request.changes)
                raise _messages.no_answer(
                    method,
                    path,
                    retry,
                    kind=outcome.kind,
                    name=outcome.name,
                    detail=outcome.detail,
                    status=outcome.status,
                    base_url=self.shown_route,
                    request_deadline=self.request_deadline,
                    max_response_bytes=self.max_response_bytes,
                    ambiguous=decision.ambiguous,
                )
            # Wait before the next try, unless that would pass the command's deadline.
            if decision.wait >= self.time_left:
                raise self._out_of_time(method, path, retry, ambiguous=maybe_done)
            self._sleep(decision.wait)
            self.spent += decision.wait

    def call(
        self,
        method: str,
        path: str,
        *,
        params: tuple[tuple[str, str], ...] = (),
        json_body: Any = None,
        parts: tuple[Part, ...] = (),
    ) -> Any:
        """Send and unwrap the 2xx envelope: its ``result``, or an error when ``success`` is
        not true (or the answer is not an envelope)."""
        reply = self.send(method, path, params=params, json_body=json_body, parts=parts)
        body = _json_or_none(reply)
        if not _is_envelope(body):
            raise _messages.not_envelope(
                method,
                path,
                reply.status_code,
                base_url=self.shown_route,
                ambiguous=_retry.changes(method, params),
            )
        assert isinstance(body, dict)
        if body["success"] is not True:
            details = _messages.quoted_details(body, self.redact)
            raise _messages.api_error(method, path, reply.status_code, details, None)
        return body.get("result")

    def _refused(
        self, method: str, path: str, reply: Reply, retry_after: float | None, changes: bool
    ) -> CloudflareAPIError:
        """The error for a final answer that is not a 2xx: Cloudflare's, or a proxy's page
        (a write answered with a 5xx, or by something else, may have been made)."""
        body = _json_or_none(reply)
        if not _is_envelope(body):
            return _messages.not_envelope(
                method, path, reply.status_code, base_url=self.shown_route, ambiguous=changes
            )
        return _messages.api_error(
            method,
            path,
            reply.status_code,
            _messages.quoted_details(body, self.redact),
            retry_after,
            ambiguous=changes and reply.status_code >= 500,
        )

    def _out_of_time(
        self, method: str, path: str, attempts: int, *, ambiguous: bool
    ) -> CloudflareAPIError:
        return _messages.out_of_time(
            method,
            path,
            attempts,
            base_url=self.shown_route,
            command_deadline=self.command_deadline,
            ambiguous=ambiguous,
        )
