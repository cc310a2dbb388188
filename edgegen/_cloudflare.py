"""The Cloudflare API client: the only module in edgegen that talks HTTP.

Every call goes through ``Client._send``, which adds the token, applies explicit timeouts,
retries what is safe to retry, and unwraps Cloudflare's v4 envelope
(``{"success", "errors", "messages", "result"}``) into the result or one
``CloudflareAPIError`` carrying the HTTP status, Cloudflare's error codes, messages and JSON
pointers, and ``Retry-After``.

Each try has a wall-clock deadline (``REQUEST_DEADLINE``), answer included: httpx's
timeouts are per socket read, so a server sending one byte a second would otherwise hold a
request for as long as it likes. The try runs in a worker thread that reads the answer in
chunks, checking the time and the size (at most ``MAX_RESPONSE_BYTES``); the caller stops
waiting at the deadline whatever the worker is doing (a trickle of headers, a hung DNS
lookup). All tries and waits of one client (one command) share ``COMMAND_DEADLINE``.
Answers are asked for without compression (a zip bomb passes any size cap), and one that
comes compressed anyway is refused.

Retries follow Cloudflare's own SDK: 429, 408, 409 and 5xx are retried, honouring
``Retry-After`` up to 60 s, else exponential backoff (0.5 s doubling, cap 8 s) with full
jitter. A request that is not idempotent (POST) is only retried when Cloudflare certainly did
not act on it (429, or a connection that never opened); otherwise the error is marked
``ambiguous`` so that apply can say the write may or may not have happened.

Writes are first built as ``Write`` values (method, path, body) and then sent, so that
``apply --dry-run`` prints exactly the requests it would have sent.

The token is held by ``Token``, whose ``repr`` and ``str`` never show it; it is added to
each request by an ``httpx.Auth`` flow, so it is in no client attribute, no log line and no
exception message. It is only sent over https:// (or http:// to this machine's loopback
address). Nothing the server says is quoted verbatim: only the envelope's error messages and
pointers, cut short, with the token removed in any case or encoding it could take
(percent-encoded, base64, hex, JSON escapes), or the whole message withheld.
"""

from __future__ import annotations

import base64
import binascii
import email.parser
import email.policy
import email.utils
import hashlib
import html
import ipaddress
import json
import random
import re
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit

import httpx

from . import _json
from .errors import CloudflareAPIError, ErrorDetail, UsageError

DEFAULT_BASE_URL = "https://api.cloudflare.com/client/v4"
TOKEN_ENV = "CLOUDFLARE_API_TOKEN"
BASE_URL_ENV = "CLOUDFLARE_API_BASE_URL"
PHASE = "http_ratelimit"
USER_AGENT = "edgegen/0.1"
# Cloudflare's error codes this client gives a meaning to (all others are passed through).
ENTRYPOINT_NOT_FOUND = 10003
SCRIPT_NOT_FOUND = 10007
# Reads are small; a script upload may take a while on a slow link.
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# The most one try of a request may take, answer included (wall clock, not per read).
REQUEST_DEADLINE = 60.0
# The most one client (one command) may spend on the API, tries and waits included; time
# spent elsewhere (apply waiting for its question to be answered) does not count.
COMMAND_DEADLINE = 300.0
# The largest answer read (Cloudflare's are kilobytes; a Worker's content a few MB).
MAX_RESPONSE_BYTES = 16 * 2**20
# How long after a try's deadline the caller gives up on the thread running it.
_GRACE = 0.25
# The most of one message from the server that an error quotes, and the most messages.
MAX_QUOTED_CHARS = 300
MAX_QUOTED_ERRORS = 100
_IDEMPOTENT = frozenset({"GET", "PUT", "DELETE"})
_RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
_MODULE_TYPE = "application/javascript+module"
# A token file is read up to this size (Cloudflare's tokens are 40 characters).
MAX_TOKEN_FILE_BYTES = 4096
# The longest Retry-After kept as given (a day); longer ones are read as this.
MAX_RETRY_AFTER = 86_400


class Token:
    """An API token that never shows itself: ``repr``, ``str`` and format give ``***``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        value = value.strip()
        if not value:
            raise UsageError(
                "the Cloudflare API token is empty; put the token in CLOUDFLARE_API_TOKEN or "
                "in the file given to --token-file"
            )
        if any(c.isspace() or ord(c) < 0x21 or ord(c) > 0x7E for c in value):
            # Never echo the value: say only what is wrong with it.
            raise UsageError(
                "the Cloudflare API token contains spaces, line breaks or non-ASCII "
                "characters; copy the token again, with nothing around it"
            )
        self._value = value

    def reveal(self) -> str:
        """The token itself; only the Authorization header may use it."""
        return self._value

    def __repr__(self) -> str:
        return "Token('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce__(self) -> Any:
        raise TypeError("an API token cannot be pickled or copied out of the process")

    @classmethod
    def _from_file(cls, token_file: str) -> Token:
        """The token in a file. Errors name the file and never hold its content: each is
        raised outside the ``except`` that caught the cause, so no ``__context__`` keeps
        the bytes read."""
        reason = None
        try:
            # Read no more than a token could be: /dev/zero must not fill the memory.
            with Path(token_file).open("rb") as handle:
                data = handle.read(MAX_TOKEN_FILE_BYTES + 1)
        except FileNotFoundError:
            reason = "missing"
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
        except ValueError:
            reason = "the path holds a NUL byte"
        if reason == "missing":
            raise UsageError(
                f"the token file {token_file} does not exist; give the path of a file "
                "holding only the API token"
            )
        text = None
        if reason is None:
            if len(data) > MAX_TOKEN_FILE_BYTES:
                raise UsageError(
                    f"the token file {token_file} is longer than {MAX_TOKEN_FILE_BYTES:,} "
                    "bytes, which no API token is; give a file holding only the token"
                )
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                reason = "it is not UTF-8 text"
        if text is None:
            raise UsageError(
                f"cannot read the token file {token_file} ({reason}); give a readable "
                "file holding only the API token"
            )
        problem = None
        try:
            return cls(text)
        except UsageError as exc:
            problem = str(exc)
        raise UsageError(f"the token file {token_file} holds no usable token: {problem}")

    @classmethod
    def from_env(cls, env: Mapping[str, str], token_file: str | None = None) -> Token:
        """The token from ``--token-file`` if given, else from ``CLOUDFLARE_API_TOKEN``.

        Raises UsageError (naming the variable or file, never the token) when there is none.
        """
        if token_file is not None:
            return cls._from_file(token_file)
        value = env.get(TOKEN_ENV, "")
        if not value.strip():
            raise UsageError(
                f"no Cloudflare API token: set {TOKEN_ENV} or pass --token-file FILE "
                "(to plan without access to the zone, pull its state and use plan --state)"
            )
        return cls(value)


def shown_url(url: str) -> str:
    """A URL fit to print: a user name and password in it (a proxy's) become ``***``.

    Everything up to the last ``@`` after the scheme is taken as user information, so a
    password holding ``/`` or ``?`` is masked too; a query is not shown.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    rest = re.split(r"[?#]", rest, maxsplit=1)[0] + ("?***" if "?" in rest else "")
    return f"{scheme}{sep}{rest}"


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


# --- the token in what the server says -------------------------------------------------

_WITHHELD = "(message withheld: it quoted the API token)"
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{12,}")
_HEX_RUN = re.compile(r"[0-9A-Fa-f]{16,}")
_JSON_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|[\"\\/bfnrt])")
_JSON_CHARS = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _json_unescape(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if code.startswith("u"):
            return chr(int(code[1:], 16))
        return _JSON_CHARS.get(code, code)

    return _JSON_ESCAPE.sub(one, text)


def _decodings(text: str) -> list[str]:
    """``text`` decoded each way a quoted token could be encoded (one level)."""
    views = [unquote(text), unquote_plus(text), _json_unescape(text), html.unescape(text)]
    for run in _BASE64_RUN.findall(text):
        standard = run.replace("-", "+").replace("_", "/")
        for start in range(4):
            piece = standard[start:]
            piece = piece[: len(piece) - len(piece) % 4]
            try:
                views.append(base64.b64decode(piece).decode("latin-1"))
            except (binascii.Error, ValueError):
                continue
    for run in _HEX_RUN.findall(text):
        for start in range(2):
            piece = run[start:]
            piece = piece[: len(piece) - len(piece) % 2]
            views.append(bytes.fromhex(piece).decode("latin-1"))
    return views


class Redactor:
    """Removes a secret from text a server sent, in any case or encoding.

    Known forms (as is, percent- and form-encoded, base64, hex, in any case) become
    ``***``; if any 12-character piece of the secret can still be read in the text or one
    of its decodings (two levels deep), the whole text is withheld.
    """

    def __init__(self, secret: str) -> None:
        raw = secret.encode("utf-8")
        forms = {
            secret,
            quote(secret, safe=""),
            quote_plus(secret),
            base64.b64encode(raw).decode().rstrip("="),
            base64.urlsafe_b64encode(raw).decode().rstrip("="),
            raw.hex(),
        }
        self._pattern = re.compile(
            "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)), re.IGNORECASE
        )
        lowered = secret.lower()
        width = min(12, len(lowered))
        self._pieces = {lowered[i : i + width] for i in range(len(lowered) - width + 1)}

    def mentions(self, text: str) -> bool:
        """Whether any piece of the secret can be read in ``text`` or its decodings."""
        level = [text]
        for _ in range(3):
            if any(piece in view.lower() for view in level for piece in self._pieces):
                return True
            level = [decoded for view in level for decoded in _decodings(view)]
        return False

    def __call__(self, text: str, limit: int = MAX_QUOTED_CHARS) -> str:
        """``text`` without the secret, at most ``limit`` characters long."""
        cleaned = self._pattern.sub("***", text)
        if len(cleaned) > limit:
            cleaned = cleaned[: limit - 3] + "..."
        return _WITHHELD if self.mentions(cleaned) else cleaned


class _BearerAuth(httpx.Auth):
    """Adds ``Authorization: Bearer`` to each request as it is sent, and nowhere else."""

    def __init__(self, token: Token) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token.reveal()}"
        yield request


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry. ``attempts`` counts the first try too."""

    attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def backoff(self, retry: int, jitter: Callable[[float, float], float]) -> float:
        """Full jitter: a random wait between 0 and the capped exponential delay."""
        return jitter(0.0, min(self.max_delay, self.base_delay * 2**retry))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date), or None.

    Anything else (``-1``, ``1.5``, ``1e309``, digits of other scripts) is None: the
    client then backs off as if no header came. A number of seconds too large to be meant
    is kept as ``MAX_RETRY_AFTER``, which is more than any retry waits for.
    """
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        digits = text.lstrip("0") or "0"
        if len(digits) > 6:
            return float(MAX_RETRY_AFTER)
        return float(min(int(digits), MAX_RETRY_AFTER))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(float(MAX_RETRY_AFTER), max(0.0, seconds))


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a multipart/form-data body."""

    name: str
    content: bytes
    content_type: str
    filename: str | None = None


@dataclass(frozen=True, slots=True)
class Write:
    """A request that changes the zone, built before it is sent (``--dry-run`` prints it).

    ``what`` says in words what it does, e.g. ``update the http_ratelimit rules``.
    """

    method: str
    path: str
    what: str
    params: tuple[tuple[str, str], ...] = ()
    json_body: Any = None
    parts: tuple[Part, ...] = ()

    def describe(self, base_url: str) -> str:
        """The request as text: method, URL and body (multipart parts by name and size)."""
        query = "&".join(f"{k}={v}" for k, v in self.params)
        lines = [f"{self.method} {base_url}{self.path}{'?' + query if query else ''}"]
        if self.json_body is not None:
            lines.append(json.dumps(self.json_body, indent=2, ensure_ascii=False))
        for part in self.parts:
            if part.content_type == "application/json":
                lines.append(f'part "{part.name}" ({part.content_type}):')
                lines.append(json.dumps(json.loads(part.content), indent=2, ensure_ascii=False))
            else:
                lines.append(
                    f'part "{part.name}" ({part.content_type}, {len(part.content):,} bytes, '
                    f"sha256 {_sha256(part.content)})"
                )
        return "\n".join(lines)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Ruleset:
    """A zone's phase entrypoint ruleset as Cloudflare returns it."""

    id: str
    version: str
    description: str
    rules: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class ScriptSettings:
    """A Worker script's settings: its bindings and compatibility date."""

    bindings: tuple[dict[str, Any], ...]
    compatibility_date: str | None


@dataclass(frozen=True, slots=True)
class ScriptContent:
    """A Worker script's modules (name -> bytes) and which one is the entry point."""

    main_module: str
    modules: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UrlNormalization:
    """A zone's URL normalisation setting: ``scope`` (``incoming``, ``both`` or ``none``:
    which URLs are normalised) and ``type`` (``cloudflare`` or ``rfc3986``)."""

    scope: str
    type: str


@dataclass(frozen=True, slots=True)
class Route:
    """A Worker route of a zone: a URL pattern and the script it runs (None: no Worker)."""

    id: str
    pattern: str
    script: str | None


def _describe_path(path: str) -> str:
    """What an API path is about, in words, for error messages."""
    parts = path.strip("/").split("/")
    if path.endswith(f"/rulesets/phases/{PHASE}/entrypoint"):
        return f"the {PHASE} rules of zone {parts[1]}"
    if "/workers/routes" in path:
        return f"the Worker routes of zone {parts[1]}"
    if "/workers/scripts/" in path:
        return f"the Worker script {parts[4]!r} of account {parts[1]}"
    if path.endswith("/url_normalization"):
        return f"the URL normalisation setting of zone {parts[1]}"
    return path


def _permission_hint(path: str) -> str:
    if "/rulesets/" in path:
        return "Zone > Zone WAF > Edit"
    if "/workers/routes" in path:
        return "Zone > Workers Routes > Edit"
    if "/workers/scripts/" in path:
        return "Account > Workers Scripts > Edit"
    if path.endswith("/url_normalization"):
        return "Zone > Zone Settings > Read"
    return "the permission this request needs"


def _error_details(body: Any) -> tuple[ErrorDetail, ...]:
    if not isinstance(body, dict):
        return ()
    out: list[ErrorDetail] = []
    errors = body.get("errors")
    for item in errors if isinstance(errors, list) else ():
        if not isinstance(item, dict):
            continue
        code = item.get("code")
        source = item.get("source")
        pointer = source.get("pointer") if isinstance(source, dict) else None
        out.append(
            ErrorDetail(
                code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                message=str(item.get("message", "")),
                pointer=pointer if isinstance(pointer, str) else None,
            )
        )
    return tuple(out)


def _summary(errors: Iterable[ErrorDetail]) -> str:
    parts = []
    for error in errors:
        text = f"code {error.code}: {error.message}" if error.code is not None else error.message
        if error.pointer:
            text += f" (at {error.pointer})"
        parts.append(text)
    return "; ".join(parts)


def api_error(
    method: str,
    path: str,
    status: int,
    errors: tuple[ErrorDetail, ...],
    retry_after: float | None,
    *,
    ambiguous: bool = False,
) -> CloudflareAPIError:
    """The error for a refused request, with a message that names the fix."""
    what = _describe_path(path)
    said = f": {_summary(errors)}" if errors else ""
    if status == 401:
        message = (
            f"Cloudflare did not accept the API token for {method} {what} (HTTP 401{said}); "
            "check that CLOUDFLARE_API_TOKEN (or --token-file) holds a valid, unexpired token"
        )
    elif status == 403:
        message = (
            f"the API token may not {method} {what} (HTTP 403{said}); give the token "
            f"{_permission_hint(path)}, or use a token for the right account and zone"
        )
    elif status == 429:
        wait = f" Cloudflare asks to wait {retry_after:g} s." if retry_after is not None else ""
        message = (
            f"Cloudflare's API limit was reached on {method} {what} (HTTP 429{said});{wait} "
            "the limit is 1,200 requests per 5 minutes per token; wait and run again"
        )
    elif status >= 500:
        message = (
            f"Cloudflare failed to answer {method} {what} (HTTP {status}{said}); this is on "
            "Cloudflare's side: try again later, and check https://www.cloudflarestatus.com"
        )
    elif status == 404:
        message = (
            f"Cloudflare found nothing at {method} {what} (HTTP 404{said}); check the zone id, "
            "account id and Worker name in the policy"
        )
    else:
        message = (
            f"Cloudflare refused {method} {what} (HTTP {status}{said}); fix what it names "
            "and run again"
        )
    if ambiguous:
        message += "; Cloudflare may or may not have made this change: run edgegen plan to see"
    return CloudflareAPIError(
        message,
        method=method,
        path=path,
        status=status,
        errors=errors,
        retry_after=retry_after,
        ambiguous=ambiguous,
    )


def _sleep(seconds: float) -> None:
    """Wait between retries (tests replace it, so no test ever really sleeps)."""
    time.sleep(seconds)


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

    kind: str
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
    except httpx.DecodingError as exc:
        return _Failed("undecodable", type(exc).__name__)
    except httpx.TransportError as exc:
        return _Failed("unanswered", type(exc).__name__)


class Client:
    """A synchronous Cloudflare API client for the endpoints edgegen uses.

    ``transport`` replaces the network (tests pass ``httpx.MockTransport`` or use respx),
    ``sleep`` and ``jitter`` replace waiting and randomness. ``request_deadline`` and
    ``command_deadline`` (seconds) and ``max_response_bytes`` default to the module's
    ``REQUEST_DEADLINE``, ``COMMAND_DEADLINE`` and ``MAX_RESPONSE_BYTES``. Use it as a
    context manager, or call ``close``.
    """

    def __init__(
        self,
        token: Token,
        *,
        base_url: str = DEFAULT_BASE_URL,
        transport: httpx.BaseTransport | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] | None = None,
        jitter: Callable[[float, float], float] | None = None,
        request_deadline: float | None = None,
        command_deadline: float | None = None,
        max_response_bytes: int | None = None,
    ) -> None:
        self.base_url = check_base_url(base_url)
        # The base URL as messages show it: a proxy's password is never printed.
        self.shown_base_url = shown_url(self.base_url)
        self._token = token
        self._redact = Redactor(token.reveal())
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._jitter = jitter or random.uniform
        self.request_deadline = request_deadline or REQUEST_DEADLINE
        self.command_deadline = command_deadline or COMMAND_DEADLINE
        self.max_response_bytes = max_response_bytes or MAX_RESPONSE_BYTES
        # Seconds spent on the API so far: tries and waits between them.
        self.spent = 0.0
        self._options: dict[str, Any] = {
            "base_url": self.base_url,
            "auth": _BearerAuth(token),
            "transport": transport,
            "timeout": timeout,
            "headers": {
                "User-Agent": USER_AGENT,
                "Accept": "application/json",
                "Accept-Encoding": "identity",
            },
            "follow_redirects": False,
        }
        self._http = httpx.Client(**self._options)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, token_file: str | None = None, **options: Any
    ) -> Client:
        """A client with the token and base URL from the environment (or ``--token-file``)."""
        return cls(Token.from_env(env, token_file), base_url=base_url_from_env(env), **options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __repr__(self) -> str:
        return f"Client(base_url={self.shown_base_url!r})"

    def redact(self, text: str) -> str:
        """Text from the server, fit to quote: without the token, cut short."""
        return self._redact(text)

    # --- the one place requests are sent -----------------------------------------------

    @property
    def time_left(self) -> float:
        """Seconds this client may still spend on the API."""
        return self.command_deadline - self.spent

    def _wait(self, seconds: float) -> None:
        if self._sleep is not None:
            self._sleep(seconds)
        else:
            _sleep(seconds)
        self.spent += seconds

    def _attempt(
        self, exchange: Callable[[httpx.Client, float], Reply | _Failed], budget: float
    ) -> Reply | _Failed:
        """One try, ``exchange(http, deadline)``, in a worker thread, waited for until
        ``budget`` seconds have passed.

        A try still running then is abandoned: its client is closed (which ends its reads)
        and this client carries on with a new one.
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
            self._http = httpx.Client(**self._options)
            http.close()
            return _Failed("deadline")
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: tuple[tuple[str, str], ...] = (),
        json_body: Any = None,
        parts: tuple[Part, ...] = (),
    ) -> Reply:
        """Send with retries; returns a 2xx answer, else raises CloudflareAPIError."""
        idempotent = method in _IDEMPOTENT
        # Whether a failure may leave a change behind: not for reads, nor for Cloudflare's
        # ?dry_run=true, which only validates.
        changes = _changes(method, params)
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
            last = retry + 1 >= self.retry.attempts
            if self.time_left <= 0:
                raise self._out_of_time(method, path, retry, ambiguous=maybe_done)
            budget = min(self.request_deadline, self.time_left)
            outcome = self._attempt(exchange, budget)
            failure: CloudflareAPIError | None = None
            if isinstance(outcome, _Failed):
                if outcome.kind == "unsent":
                    # The request never left this machine: safe to retry whatever it is.
                    if last:
                        failure = self._transport_error(method, path, outcome, retry + 1, False)
                elif outcome.kind in ("unanswered", "deadline"):
                    # Sent, but no (full) answer: a write may or may not have happened.
                    maybe_done = maybe_done or changes
                    if outcome.kind == "deadline" and budget < self.request_deadline:
                        raise self._out_of_time(method, path, retry + 1, ambiguous=maybe_done)
                    if last or not idempotent:
                        failure = self._transport_error(
                            method, path, outcome, retry + 1, maybe_done
                        )
                else:
                    # An answer that cannot be used (compressed, too large): not worth
                    # repeating. The server answered, so a write may have been made.
                    failure = self._transport_error(method, path, outcome, retry + 1, changes)
            else:
                response = outcome
                if response.is_success:
                    return response
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                retryable = response.status_code in _RETRY_STATUSES and (
                    idempotent or response.status_code == 429
                )
                too_long = retry_after is not None and retry_after > self.retry.max_retry_after
                if not retryable or last or too_long:
                    body = _json_or_none(response)
                    if not _is_envelope(body):
                        raise self._not_envelope(method, path, response, ambiguous=changes)
                    ambiguous = changes and response.status_code >= 500
                    raise api_error(
                        method,
                        path,
                        response.status_code,
                        self._details(body),
                        retry_after,
                        ambiguous=ambiguous,
                    )
                maybe_done = maybe_done or (changes and response.status_code >= 500)
                if retry_after is not None:
                    self._pause(retry_after, method, path, retry + 1, maybe_done)
                    retry += 1
                    continue
            if failure is not None:
                raise failure
            self._pause(
                self.retry.backoff(retry, self._jitter), method, path, retry + 1, maybe_done
            )
            retry += 1

    def _pause(
        self, seconds: float, method: str, path: str, attempts: int, maybe_done: bool
    ) -> None:
        """Wait before the next try, unless that would pass the command's deadline."""
        if seconds >= self.time_left:
            raise self._out_of_time(method, path, attempts, ambiguous=maybe_done)
        self._wait(seconds)

    def _details(self, body: Any) -> tuple[ErrorDetail, ...]:
        """The envelope's errors, with the token removed from anything the server said
        (a proxy might echo the Authorization header into a message), cut short."""
        found = _error_details(body)
        out = [
            ErrorDetail(
                e.code,
                self._redact(e.message),
                self._redact(e.pointer) if e.pointer else e.pointer,
            )
            for e in found[:MAX_QUOTED_ERRORS]
        ]
        if len(found) > MAX_QUOTED_ERRORS:
            out.append(ErrorDetail(None, f"and {len(found) - MAX_QUOTED_ERRORS:,} more errors"))
        return tuple(out)

    def _out_of_time(
        self, method: str, path: str, attempts: int, *, ambiguous: bool
    ) -> CloudflareAPIError:
        message = (
            f"gave up on {method} {_describe_path(path)} at {self.shown_base_url} after "
            f"{attempts} attempt(s): the {self.command_deadline:g} s deadline of one command "
            f"for the Cloudflare API ran out; check the network and a proxy set in "
            f"{BASE_URL_ENV}, and run again"
        )
        if ambiguous:
            message += "; Cloudflare may or may not have made this change: run edgegen plan to see"
        return CloudflareAPIError(
            message, method=method, path=path, status=None, ambiguous=ambiguous
        )

    def _transport_error(
        self, method: str, path: str, failed: _Failed, attempts: int, ambiguous: bool
    ) -> CloudflareAPIError:
        what = f"{method} {_describe_path(path)}"
        status = failed.status
        if failed.kind == "too_large":
            message = (
                f"{what} got an answer larger than {_size(self.max_response_bytes)} from "
                f"{self.shown_base_url}, which no Cloudflare API answer is; it was not read. "
                f"If {BASE_URL_ENV} points at a proxy, check that it forwards to the "
                "Cloudflare API"
            )
        elif failed.kind == "undecodable" and failed.detail == "Content-Encoding":
            message = (
                f"{what} got a compressed answer (Content-Encoding) from "
                f"{self.shown_base_url} though edgegen asks for none; it was not read. If "
                f"{BASE_URL_ENV} points at a proxy, make it pass answers on unchanged"
            )
        elif failed.kind == "deadline":
            message = (
                f"no full answer from Cloudflare at {self.shown_base_url} for {what} within "
                f"the request deadline of {self.request_deadline:g} s, after {attempts} "
                f"attempt(s); check the network, a proxy set in {BASE_URL_ENV}, and run again"
            )
        else:
            message = (
                f"could not get an answer from Cloudflare at {self.shown_base_url} for "
                f"{what} after {attempts} attempt(s) ({failed.name}); check the network, a "
                f"proxy set in {BASE_URL_ENV}, and run again"
            )
        if ambiguous:
            message += "; Cloudflare may or may not have made this change: run edgegen plan to see"
        return CloudflareAPIError(
            message,
            method=method,
            path=path,
            status=status,
            ambiguous=ambiguous,
            enveloped=status is None,
        )

    def _not_envelope(
        self, method: str, path: str, response: Reply, *, ambiguous: bool
    ) -> CloudflareAPIError:
        return CloudflareAPIError(
            f"{method} {_describe_path(path)} got HTTP {response.status_code} with a body that "
            f"is not a Cloudflare API response (from {self.shown_base_url}); if "
            f"{BASE_URL_ENV} points at a proxy, check that it forwards to the Cloudflare API",
            method=method,
            path=path,
            status=response.status_code,
            ambiguous=ambiguous,
            enveloped=False,
        )

    def _result(
        self, method: str, path: str, response: Reply, params: tuple[tuple[str, str], ...] = ()
    ) -> Any:
        """Unwrap a 2xx envelope: its ``result``, or an error when ``success`` is not true."""
        body = _json_or_none(response)
        if not _is_envelope(body):
            raise self._not_envelope(method, path, response, ambiguous=_changes(method, params))
        assert isinstance(body, dict)
        if body["success"] is not True:
            raise api_error(method, path, response.status_code, self._details(body), None)
        return body.get("result")

    def _call(
        self, method: str, path: str, *, params: tuple[tuple[str, str], ...] = (), **kwargs: Any
    ) -> Any:
        reply = self._send(method, path, params=params, **kwargs)
        return self._result(method, path, reply, params)

    def _get_or_none(self, path: str, missing_code: int) -> Any:
        """GET, returning None only when Cloudflare clearly says the thing does not exist.

        A 404 whose envelope names another code (e.g. an unknown zone) or a 404 that is not
        a Cloudflare envelope at all (a proxy) is an error, not "missing": treating it as
        missing could make apply delete rules that are really there.
        """
        try:
            return self._call("GET", path)
        except CloudflareAPIError as exc:
            if _means_missing(exc, missing_code):
                return None
            raise

    # --- reads -------------------------------------------------------------------------

    @staticmethod
    def entrypoint_path(zone_id: str) -> str:
        """The path of a zone's http_ratelimit entrypoint."""
        return f"/zones/{quote(zone_id, safe='')}/rulesets/phases/{PHASE}/entrypoint"

    def get_entrypoint(self, zone_id: str) -> Ruleset | None:
        """The zone's http_ratelimit entrypoint, or None when the zone has none yet."""
        path = self.entrypoint_path(zone_id)
        result = self._get_or_none(path, ENTRYPOINT_NOT_FOUND)
        if result is None:
            return None
        return parse_ruleset(result, "GET", path)

    def get_script_settings(self, account_id: str, name: str) -> ScriptSettings | None:
        """A Worker script's bindings and compatibility date, or None if there is no script."""
        path = f"{self.script_path(account_id, name)}/settings"
        result = self._get_or_none(path, SCRIPT_NOT_FOUND)
        if result is None:
            return None
        if not isinstance(result, dict) or not isinstance(result.get("bindings", []), list):
            raise _bad_result("GET", path, "settings with a list of bindings")
        bindings = tuple(b for b in result.get("bindings") or () if isinstance(b, dict))
        date = result.get("compatibility_date")
        return ScriptSettings(bindings, date if isinstance(date, str) else None)

    def get_script_content(self, account_id: str, name: str) -> ScriptContent | None:
        """A Worker script's modules, or None if there is no script.

        Cloudflare answers with multipart/form-data (one part per module) for module
        Workers, naming the entry point in ``CF-Entrypoint``, and with the raw script for
        service-worker scripts.
        """
        path = f"{self.script_path(account_id, name)}/content/v2"
        try:
            response = self._send("GET", path)
        except CloudflareAPIError as exc:
            if _means_missing(exc, SCRIPT_NOT_FOUND):
                return None
            raise
        entry = response.headers.get("CF-Entrypoint")
        content_type = response.headers.get("Content-Type", "")
        if content_type.startswith("multipart/"):
            modules = parse_multipart(content_type, response.content)
            if not modules:
                raise _bad_result("GET", path, "a multipart body with at least one module")
            main = entry or next(iter(modules))
            if main not in modules:
                raise _bad_result(
                    "GET", path, f"a module named {self.redact(main)!r} (CF-Entrypoint)"
                )
            return ScriptContent(main, modules)
        return ScriptContent(entry or "worker.js", {entry or "worker.js": response.content})

    @staticmethod
    def script_path(account_id: str, name: str) -> str:
        """The path of a Worker script."""
        return f"/accounts/{quote(account_id, safe='')}/workers/scripts/{quote(name, safe='')}"

    @staticmethod
    def routes_path(zone_id: str) -> str:
        """The path of a zone's Worker routes."""
        return f"/zones/{quote(zone_id, safe='')}/workers/routes"

    def list_routes(self, zone_id: str) -> tuple[Route, ...]:
        """Every Worker route of the zone."""
        path = self.routes_path(zone_id)
        result = self._call("GET", path)
        if not isinstance(result, list):
            raise _bad_result("GET", path, "a list of routes")
        return tuple(parse_route(item, "GET", path) for item in result)

    @staticmethod
    def url_normalization_path(zone_id: str) -> str:
        """The path of a zone's URL normalisation setting."""
        return f"/zones/{quote(zone_id, safe='')}/url_normalization"

    def get_url_normalization(self, zone_id: str) -> UrlNormalization:
        """How the zone normalises URLs before rules and Workers see them.

        Needs Zone > Zone Settings > Read: a token without it gets a CloudflareAPIError with
        status 403, which callers may treat as "unknown".
        """
        path = self.url_normalization_path(zone_id)
        result = self._call("GET", path)
        if not isinstance(result, dict):
            raise _bad_result("GET", path, "a URL normalisation setting")
        scope, kind = result.get("scope"), result.get("type")
        if not isinstance(scope, str) or not isinstance(kind, str):
            raise _bad_result("GET", path, "a setting with a scope and a type")
        return UrlNormalization(self.redact(scope), self.redact(kind))

    # --- writes ------------------------------------------------------------------------

    def put_entrypoint_write(
        self, zone_id: str, body: dict[str, Any], *, dry_run: bool = False
    ) -> Write:
        """Replace the zone's rate limiting rules (``dry_run``: only validate them)."""
        return Write(
            "PUT",
            self.entrypoint_path(zone_id),
            f"{'validate' if dry_run else 'update'} the {PHASE} rules of zone {zone_id}",
            params=(("dry_run", "true"),) if dry_run else (),
            json_body=body,
        )

    def put_script_write(
        self, account_id: str, name: str, metadata: dict[str, Any], modules: Mapping[str, str]
    ) -> Write:
        """Upload a module Worker: a ``metadata`` part and one part per module."""
        parts = [Part("metadata", json.dumps(metadata).encode("utf-8"), "application/json")]
        parts.extend(
            Part(module, source.encode("utf-8"), _MODULE_TYPE, filename=module)
            for module, source in modules.items()
        )
        return Write(
            "PUT",
            self.script_path(account_id, name),
            f"upload the Worker {name}",
            parts=tuple(parts),
        )

    def create_route_write(self, zone_id: str, pattern: str, script: str) -> Write:
        """Add a Worker route."""
        return Write(
            "POST",
            self.routes_path(zone_id),
            f"add the route {pattern} -> {script}",
            json_body={"pattern": pattern, "script": script},
        )

    def delete_route_write(self, zone_id: str, route_id: str, pattern: str) -> Write:
        """Remove a Worker route."""
        return Write(
            "DELETE",
            f"{self.routes_path(zone_id)}/{quote(route_id, safe='')}",
            f"remove the route {pattern}",
        )

    def send(self, write: Write) -> Any:
        """Send a write and return Cloudflare's ``result``.

        Deleting a route that is already gone counts as done: the zone is as wanted.
        """
        try:
            return self._call(
                write.method,
                write.path,
                params=write.params,
                json_body=write.json_body,
                parts=write.parts,
            )
        except CloudflareAPIError as exc:
            if write.method == "DELETE" and exc.status == 404:
                return None
            raise


def _changes(method: str, params: Iterable[tuple[str, str]]) -> bool:
    """Whether a request may change the zone: not a read, nor Cloudflare's ``?dry_run=true``."""
    return method != "GET" and ("dry_run", "true") not in tuple(params)


def _means_missing(exc: CloudflareAPIError, missing_code: int) -> bool:
    """A 404 in Cloudflare's envelope with no code or the code for "does not exist"."""
    return exc.status == 404 and exc.enveloped and (not exc.codes or missing_code in exc.codes)


def _size(count: int) -> str:
    """A byte count as people say it: ``16 MiB``, ``512 KiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:g} {unit}"
    return f"{count} bytes"


def _json_or_none(response: Reply) -> Any:
    """The body as JSON, or None when it is not JSON edgegen can use (see ``_json``)."""
    try:
        return _json.loads(response.content)
    except ValueError:
        return None


def _is_envelope(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("success"), bool)


def _bad_result(method: str, path: str, expected: str) -> CloudflareAPIError:
    return CloudflareAPIError(
        f"{method} {_describe_path(path)} answered, but not with {expected}; the API may have "
        "changed or a proxy altered the answer: nothing was written; report this with the "
        "request above",
        method=method,
        path=path,
        status=200,
    )


def parse_ruleset(result: Any, method: str, path: str) -> Ruleset:
    """A Ruleset from an entrypoint result; an error if it is not shaped like one."""
    if not isinstance(result, dict) or not isinstance(result.get("rules", []), list):
        raise _bad_result(method, path, "a ruleset with a list of rules")
    rules = result.get("rules") or []
    if not all(isinstance(rule, dict) for rule in rules):
        raise _bad_result(method, path, "a ruleset whose rules are objects")
    return Ruleset(
        id=str(result.get("id", "")),
        version=str(result.get("version", "")),
        description=str(result.get("description", "")),
        rules=tuple(rules),
    )


def parse_route(item: Any, method: str, path: str) -> Route:
    """A Route from a routes result item."""
    if not isinstance(item, dict) or not isinstance(item.get("pattern"), str):
        raise _bad_result(method, path, "routes with a pattern")
    script = item.get("script")
    if script is not None and not isinstance(script, str):
        raise _bad_result(method, path, "routes whose script is a name")
    return Route(str(item.get("id", "")), item["pattern"], script if script else None)


def parse_multipart(content_type: str, body: bytes) -> dict[str, bytes]:
    """Part name -> bytes of a multipart/form-data body (the standard library's parser)."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    out: dict[str, bytes] = {}
    if not message.is_multipart():
        return out
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            out[name] = payload
    return out
