"""The ``logpush`` format: Cloudflare Logpush ``http_requests`` NDJSON, any
``timestamp_format`` (``unixnano``, ``unix``, ``rfc3339``), with the ``RequestHeaders``
and ``Cookies`` custom fields when the job logs them."""

from __future__ import annotations

from ..replay._types import Record
from ._fields import (
    Malformed,
    Parser,
    digits,
    host_name,
    load_object,
    optional_text,
    path_of,
    rfc3339_us,
    seconds_us,
    shown,
    status_code,
    text_field,
    tier_of,
)
from ._options import TrafficOptions


def _epoch_number_us(value: int) -> int:
    """An integer epoch time in seconds, ms, µs or ns (told by its size) -> µs.

    Logpush writes seconds (``unix``) or nanoseconds (``unixnano``, the default); the sizes
    do not overlap for any time between 1973 and 5138.
    """
    if value < 100_000_000_000:
        return value * 1_000_000
    if value < 100_000_000_000_000:
        return value * 1_000
    if value < 100_000_000_000_000_000:
        return value
    return value // 1_000


def _logpush_time_us(value: object) -> int:
    """``EdgeStartTimestamp`` in any of Logpush's timestamp formats -> µs."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return _epoch_number_us(value)
    if isinstance(value, str) and digits(value):
        return _epoch_number_us(int(value))
    if isinstance(value, float):
        return seconds_us(value)
    if isinstance(value, str) and value:
        return rfc3339_us(value)
    raise Malformed("timestamp", f"EdgeStartTimestamp {shown(value)} is not a time")


def logpush_parser(user_from: tuple[str, str] | None, options: TrafficOptions) -> Parser:
    """The parser of Logpush lines, the user from the header, cookie or field ``user_from``
    names."""
    auth_headers = tuple(h.lower() for h in options.authenticated_headers)
    auth_cookies = tuple(options.authenticated_cookies)
    tiers, default_tier, forced = options.tiers, options.default_tier, options.authenticated
    kind, name = user_from if user_from is not None else ("", "")

    def parse(line: str) -> Record:
        obj = load_object(line)
        if "EdgeStartTimestamp" not in obj:
            raise Malformed("missing field", "no 'EdgeStartTimestamp'")
        at = _logpush_time_us(obj["EdgeStartTimestamp"])
        path = obj.get("ClientRequestPath")
        if not (isinstance(path, str) and path):
            path = path_of(text_field(obj, "ClientRequestURI"))
        headers = obj.get("RequestHeaders")
        cookies = obj.get("Cookies")
        if not isinstance(headers, dict):
            headers = None
        if not isinstance(cookies, dict):
            cookies = None
        source = headers if kind == "header" else cookies if kind == "cookie" else obj
        user = optional_text(source.get(name)) if kind and source else None
        authenticated = forced
        if forced is None and (headers is not None or cookies is not None):
            # The job logs these fields: a credential absent from them was not sent.
            authenticated = bool(headers and any(headers.get(h) for h in auth_headers)) or bool(
                cookies and any(cookies.get(c) for c in auth_cookies)
            )
        # The origin's answer is what a limit with count_when counts; a response the edge
        # gave itself (the cache, a refusal) has no origin status (0), so the edge's.
        status = status_code(obj.get("OriginResponseStatus")) or status_code(
            obj.get("EdgeResponseStatus")
        )
        colo = obj.get("EdgeColoCode")
        return Record(
            at,
            text_field(obj, "ClientRequestMethod").upper(),
            host_name(text_field(obj, "ClientRequestHost", required=False)),
            path,
            text_field(obj, "ClientIP"),
            user,
            tier_of(None, user, tiers, default_tier),
            authenticated,
            colo if isinstance(colo, str) and colo else None,
            status,
        )

    return parse
