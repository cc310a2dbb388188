"""What edgegen says about the Cloudflare API: error wording and redaction. Pure.

Every error names the request in words (``the http_ratelimit rules of zone ...``) and the
fix. Nothing the server says is quoted verbatim: only the envelope's error codes, messages
and pointers, at most ``MAX_QUOTED_ERRORS`` of them, each cut to ``MAX_QUOTED_CHARS``, with
the API token removed in any case or encoding it could take (percent-encoded, base64, hex,
JSON or HTML escapes) by ``Redactor``, or the whole message withheld. A URL is shown with
a proxy's user and password as ``***`` (``shown_url``).
"""

from __future__ import annotations

import base64
import binascii
import html
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus, unquote, unquote_plus

from ..errors import CloudflareAPIError, ErrorDetail

DEFAULT_BASE_URL = "https://api.cloudflare.com/client/v4"
BASE_URL_ENV = "CLOUDFLARE_API_BASE_URL"
# The proxy requests to an https:// API base go through (the environment's HTTP_PROXY,
# HTTPS_PROXY and ALL_PROXY are never used).
PROXY_ENV = "EDGEGEN_PROXY"
PHASE = "http_ratelimit"
# The most of one message from the server that an error quotes, and the most messages.
MAX_QUOTED_CHARS = 300
MAX_QUOTED_ERRORS = 100
MAYBE_DONE = "; Cloudflare may or may not have made this change: run edgegen plan to see"
# What to check when no answer came.
CHECK_NETWORK = (
    f"check the network and a proxy set in {BASE_URL_ENV} or {PROXY_ENV} (edgegen never "
    "uses HTTP_PROXY, HTTPS_PROXY or ALL_PROXY), and run again"
)


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


# --- what a request is about -----------------------------------------------------------


def describe_path(path: str) -> str:
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


def permission_hint(path: str) -> str:
    """The token permission a request to ``path`` needs."""
    if "/rulesets/" in path:
        return "Zone > Zone WAF > Edit"
    if "/workers/routes" in path:
        return "Zone > Workers Routes > Edit"
    if "/workers/scripts/" in path:
        return "Account > Workers Scripts > Edit"
    if path.endswith("/url_normalization"):
        return "Zone > Zone Settings > Read"
    return "the permission this request needs"


def size(count: int) -> str:
    """A byte count as people say it: ``16 MiB``, ``512 KiB``."""
    for unit, step in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= step:
            return f"{count / step:g} {unit}"
    return f"{count} bytes"


# --- the envelope's errors -------------------------------------------------------------


def error_details(body: Any) -> tuple[ErrorDetail, ...]:
    """The entries of an envelope's ``errors``, as sent (not yet fit to quote)."""
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


def quoted_details(body: Any, redact: Redactor) -> tuple[ErrorDetail, ...]:
    """The envelope's errors fit to quote: the token removed from anything the server said
    (a proxy might echo the Authorization header into a message), each cut short, at most
    ``MAX_QUOTED_ERRORS`` of them and a count of the rest."""
    found = error_details(body)
    out = [
        ErrorDetail(e.code, redact(e.message), redact(e.pointer) if e.pointer else e.pointer)
        for e in found[:MAX_QUOTED_ERRORS]
    ]
    if len(found) > MAX_QUOTED_ERRORS:
        out.append(ErrorDetail(None, f"and {len(found) - MAX_QUOTED_ERRORS:,} more errors"))
    return tuple(out)


def _summary(errors: Iterable[ErrorDetail]) -> str:
    parts = []
    for error in errors:
        text = f"code {error.code}: {error.message}" if error.code is not None else error.message
        if error.pointer:
            text += f" (at {error.pointer})"
        parts.append(text)
    return "; ".join(parts)


# --- the errors ------------------------------------------------------------------------


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
    what = describe_path(path)
    said = f": {_summary(errors)}" if errors else ""
    if status == 401:
        message = (
            f"Cloudflare did not accept the API token for {method} {what} (HTTP 401{said}); "
            "check that CLOUDFLARE_API_TOKEN (or --token-file) holds a valid, unexpired token"
        )
    elif status == 403:
        message = (
            f"the API token may not {method} {what} (HTTP 403{said}); give the token "
            f"{permission_hint(path)}, or use a token for the right account and zone"
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
        message += MAYBE_DONE
    return CloudflareAPIError(
        message,
        method=method,
        path=path,
        status=status,
        errors=errors,
        retry_after=retry_after,
        ambiguous=ambiguous,
    )


def not_envelope(
    method: str, path: str, status: int, *, base_url: str, ambiguous: bool
) -> CloudflareAPIError:
    """The error for an answer that is not a Cloudflare envelope (a proxy's page)."""
    return CloudflareAPIError(
        f"{method} {describe_path(path)} got HTTP {status} with a body that is not a "
        f"Cloudflare API response (from {base_url}); if {BASE_URL_ENV} points at a proxy, "
        "check that it forwards to the Cloudflare API",
        method=method,
        path=path,
        status=status,
        ambiguous=ambiguous,
        enveloped=False,
    )


def bad_result(method: str, path: str, expected: str) -> CloudflareAPIError:
    """The error for a 2xx answer whose result is not shaped as ``expected``."""
    return CloudflareAPIError(
        f"{method} {describe_path(path)} answered, but not with {expected}; the API may have "
        "changed or a proxy altered the answer: nothing was written; report this with the "
        "request above",
        method=method,
        path=path,
        status=200,
    )


def out_of_time(
    method: str,
    path: str,
    attempts: int,
    *,
    base_url: str,
    command_deadline: float,
    ambiguous: bool,
) -> CloudflareAPIError:
    """The error when the deadline of one command for the API has run out."""
    message = (
        f"gave up on {method} {describe_path(path)} at {base_url} after {attempts} "
        f"attempt(s): the {command_deadline:g} s deadline of one command for the Cloudflare "
        f"API ran out; {CHECK_NETWORK}"
    )
    if ambiguous:
        message += MAYBE_DONE
    return CloudflareAPIError(message, method=method, path=path, status=None, ambiguous=ambiguous)


def no_answer(
    method: str,
    path: str,
    attempts: int,
    *,
    kind: str,
    name: str,
    detail: str,
    status: int | None,
    base_url: str,
    request_deadline: float,
    max_response_bytes: int,
    ambiguous: bool,
) -> CloudflareAPIError:
    """The error when the last try got no usable answer.

    ``kind`` says why: ``too_large`` (over ``max_response_bytes``), ``undecodable``
    (``detail`` ``Content-Encoding``: compressed), ``deadline`` (no full answer within
    ``request_deadline``), or no answer at all (``name`` is the exception's class).
    """
    what = f"{method} {describe_path(path)}"
    if kind == "too_large":
        message = (
            f"{what} got an answer larger than {size(max_response_bytes)} from "
            f"{base_url}, which no Cloudflare API answer is; it was not read. "
            f"If {BASE_URL_ENV} points at a proxy, check that it forwards to the "
            "Cloudflare API"
        )
    elif kind == "undecodable" and detail == "Content-Encoding":
        message = (
            f"{what} got a compressed answer (Content-Encoding) from {base_url} though "
            f"edgegen asks for none; it was not read. If {BASE_URL_ENV} points at a proxy, "
            "make it pass answers on unchanged"
        )
    elif kind == "deadline":
        message = (
            f"no full answer from Cloudflare at {base_url} for {what} within the request "
            f"deadline of {request_deadline:g} s, after {attempts} attempt(s); {CHECK_NETWORK}"
        )
    else:
        message = (
            f"could not get an answer from Cloudflare at {base_url} for {what} after "
            f"{attempts} attempt(s) ({name}); {CHECK_NETWORK}"
        )
    if ambiguous:
        message += MAYBE_DONE
    return CloudflareAPIError(
        message,
        method=method,
        path=path,
        status=status,
        ambiguous=ambiguous,
        enveloped=status is None,
    )
