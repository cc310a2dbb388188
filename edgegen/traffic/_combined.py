"""The ``combined`` format: nginx/Apache combined (or common) log lines, optionally
followed by ``name=value`` or ``name="value"`` fields appended in nginx's
``log_format``. Appended ``host``, ``tier``, ``msec`` (nginx ``$msec``: sub-second
time) and ``authenticated`` are understood; the user is ``%u`` unless ``user_from``
names an appended field."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Final

from ..replay._types import Record
from ._fields import (
    EPOCH,
    MICROSECOND,
    Malformed,
    Parser,
    flag,
    host_name,
    path_of,
    shown,
    status_code,
    tier_of,
    unix_us,
)
from ._options import TrafficOptions

_MONTHS: Final = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}

# %h %l %u [%t] "%r" %>s %b, then "%{Referer}i" "%{User-agent}i" (combined) and appended
# fields. Quoted parts may hold backslash escapes (Apache \", nginx \x22). Every pattern
# runs in time linear in the line: the repeats are possessive, and an appended field's
# name must begin a run of name characters (after a space or a quote), so a long run with
# no "=" after it is scanned once, not again from each of its characters.
_QUOTED = r'"([^"\\]*+(?:\\.[^"\\]*+)*+)"'
_COMBINED = re.compile(
    rf"(\S+) (\S+) (\S+) \[([^\]]*)\] {_QUOTED} (\S+) (\S+)(?: {_QUOTED} {_QUOTED})?(.*)"
)
_APPENDED = re.compile(rf"(?<![\w.-])([A-Za-z_][\w.-]*+)=(?:{_QUOTED}|(\S*))")
_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|.)")


def looks_combined(line: str) -> bool:
    """Whether a line has the combined log layout (how the format is told)."""
    return _COMBINED.match(line) is not None


def _unescape(text: str) -> str:
    """nginx's and Apache's escapes (``\\x22``, ``\\"``, ``\\\\``) -> the logged text."""
    if "\\" not in text:
        return text
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(text):
        out += text[pos : m.start()].encode()
        code = m.group(1)
        out += bytes((int(code[1:], 16),)) if len(code) == 3 else code.encode()
        pos = m.end()
    out += text[pos:].encode()
    return out.decode("utf-8", "replace")


def _clf_time_us(text: str) -> int:
    """``10/Oct/2000:13:55:36 -0700`` -> µs (the offset honoured)."""
    try:
        if len(text) != 26 or text[2] != "/" or text[6] != "/" or text[20] != " ":
            raise ValueError(text)
        sign = {"+": 1, "-": -1}[text[21]]
        offset = timedelta(hours=int(text[22:24]), minutes=int(text[24:26]))
        when = datetime(
            int(text[7:11]),
            _MONTHS[text[3:6]],
            int(text[0:2]),
            int(text[12:14]),
            int(text[15:17]),
            int(text[18:20]),
            tzinfo=timezone(sign * offset),
        )
        # The offset may carry the year 1 before the epoch's calendar begins.
        return (when - EPOCH) // MICROSECOND
    except (ValueError, KeyError, OverflowError):
        raise Malformed("timestamp", f"[{shown(text)}] is not a log time") from None


def _request_line(line: str) -> tuple[str, str, str]:
    """``GET /a?b HTTP/1.1`` -> method, path (and the host of an absolute target)."""
    parts = line.split(" ")
    if len(parts) == 3:
        method, target, protocol = parts
        if not protocol.startswith("HTTP/"):
            raise Malformed("request line", f"{shown(line)} is not a request")
    elif len(parts) == 2:  # HTTP/0.9: no protocol
        method, target = parts
    else:
        raise Malformed("request line", f"{shown(line)} is not a request")
    if not (method.isalpha() and method.isascii()):
        raise Malformed("request line", f"{shown(line)} is not a request")
    if target.startswith("/"):
        return method.upper(), path_of(target), ""
    if target == "*":
        return method.upper(), "*", ""
    lowered = target[:8].lower()
    if lowered.startswith(("http://", "https://")):
        # An absolute-form target (a request to a proxy): its host, then the path.
        rest = target.split("://", 1)[1]
        slash = rest.find("/")
        host = rest if slash < 0 else rest[:slash]
        path = "/" if slash < 0 else path_of(rest[slash:])
        return method.upper(), path, host_name(host)
    raise Malformed("request line", f"{shown(line)} has no path")


def _appended(rest: str) -> dict[str, str]:
    """The ``name=value`` and ``name="value"`` fields after the combined part."""
    if not rest:
        return {}
    # findall gives "" for the alternative that did not match: a quoted value, or a bare one.
    return {k: _unescape(q or v) for k, q, v in _APPENDED.findall(rest)}


def _combined_parts(line: str) -> tuple[str, str, str, str, str, str]:
    """ip, %u, time, request line, status and what follows (appended fields).

    Most lines hold no backslash escape, so splitting on quotes takes them apart; any other
    line goes through the regular expression, which also says what is malformed.
    """
    if "\\" not in line:
        parts = line.split('"')
        if len(parts) >= 3:
            head = parts[0].split(" ", 3)
            middle = parts[2].split()
            if (
                len(head) == 4
                and len(middle) == 2
                and head[3].startswith("[")
                and head[3].endswith("] ")
                and "]" not in head[3][1:-2]
            ):
                if len(parts) == 3:
                    return head[0], head[2], head[3][1:-2], parts[1], middle[0], ""
                if len(parts) >= 6 and parts[4] == " " and parts[2].endswith(" "):
                    rest = '"'.join(parts[6:])
                    return head[0], head[2], head[3][1:-2], parts[1], middle[0], rest
    m = _COMBINED.match(line)
    if m is None:
        raise Malformed("not a log line", "it does not have the combined log layout")
    ip, _, remote_user, when, request, status, _, _, _, rest = m.groups()
    return ip, remote_user, when, request, status, rest


def combined_parser(user_from: tuple[str, str] | None, options: TrafficOptions) -> Parser:
    """The parser of combined log lines, the user from ``%u`` or from the appended field
    ``user_from`` names."""
    user_field = user_from[1] if user_from is not None else None
    tiers, default_tier, forced = options.tiers, options.default_tier, options.authenticated
    # Log times repeat for every request of a second: parse each distinct text once.
    last_time, last_us = "", 0

    def parse(line: str) -> Record:
        nonlocal last_time, last_us
        ip, remote_user, when, request, status, rest = _combined_parts(line)
        if when != last_time:
            last_us = _clf_time_us(when)
            last_time = when
        at = last_us
        method, path, host = _request_line(_unescape(request) if "\\" in request else request)
        user = None if remote_user == "-" else _unescape(remote_user)
        tier = authenticated = None
        if rest or user_field is not None:
            fields = _appended(rest)
            given = fields.get("host")
            if given and given != "-" and not host:
                host = host_name(given)
            given = fields.get("tier")
            tier = given if given and given != "-" else None
            if "msec" in fields:
                at = unix_us(fields["msec"])
            if "authenticated" in fields:
                authenticated = flag(fields["authenticated"])
            if user_field is not None:
                given = fields.get(user_field)
                user = given if given and given != "-" else None
        if forced is not None:
            authenticated = forced
        return Record(
            at,
            method,
            host,
            path,
            ip,
            user,
            tier_of(tier, user, tiers, default_tier),
            authenticated,
            None,
            status_code(status),
        )

    return parse
