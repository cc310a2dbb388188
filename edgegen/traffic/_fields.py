"""What the formats share: a line that is no record (:class:`Malformed`), the parser
type, and the values they read alike: times, hosts, paths, flags, statuses, text fields,
JSON objects and rows of named columns. A value that is no time, no number or no
printable text is malformed; an example quotes only the value at fault (:func:`shown`),
cut before any query string and short, so credentials in a log do not reach a report."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from ..replay._types import Record
from ._options import TrafficOptions

# The characters of a value an example quotes, at most.
_SHOWN_CHARS = 40

# Record times must lie from the Unix epoch to the end of the year 9999 (what a datetime
# holds); any other time is malformed "timestamp", never an overflow later on.
MAX_TIME_US: Final = 253_402_300_799_999_999

# A number read from text (unix seconds, a status code) has at most this many digits.
MAX_DIGITS = 20

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


class Malformed(Exception):
    """One line is not a record: ``reason`` is the counted kind, ``detail`` the rest."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


# A parser turns one line (no newline) into a record, None for a line to skip, or raises
# Malformed.
Parser = Callable[[str], Record | None]


def shown(value: object) -> str:
    """A logged value as a report may quote it: before any query string (where tokens
    travel), with anything credential-like cut, and short. A JSON list or object is named,
    not printed (it may be nested deeper than repr() can go)."""
    if isinstance(value, dict | list):
        return "a JSON object" if isinstance(value, dict) else "a JSON list"
    text = str(value)[: 4 * _SHOWN_CHARS]
    text = text.split("?", 1)[0]
    text = _SECRETISH.sub(r"\1<redacted>", text)
    if len(text) > _SHOWN_CHARS:
        text = text[:_SHOWN_CHARS] + "..."
    return repr(text)


# A header or cookie that may carry a credential, with whatever follows it on the line.
_SECRETISH = re.compile(r"(?i)((?:authorization|cookie|bearer|basic|token|session)\W*).*")


def host_name(raw: str) -> str:
    """Lower case, without a port (``[::1]:8443`` -> ``[::1]``)."""
    host = raw.lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end > 0 else host
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def tier_of(
    logged: str | None, user: str | None, tiers: Mapping[str, str], default: str | None
) -> str | None:
    """A record's tier: the logged one, else the tiers file's entry for its user, else the
    default."""
    if logged:
        return logged
    if user is not None and tiers:
        return tiers.get(user, default)
    return default


_TRUE = frozenset(("1", "true", "yes", "y", "t"))
_FALSE = frozenset(("0", "false", "no", "n", "f"))


def flag(value: object) -> bool | None:
    """An ``authenticated`` column's value; empty is unknown."""
    if value is None or isinstance(value, bool):
        return value
    if type(value) is not str and not isinstance(value, int | float):
        raise Malformed("authenticated", f"{shown(value)} is not true or false")
    text = str(value).strip().lower()
    if not text or text == "-":
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise Malformed("authenticated", f"{shown(value)} is not true or false")


def digits(text: str) -> bool:
    """Whether ``text`` is a whole number int() takes at once: ASCII digits (``isdigit``
    also says yes to "²", which int() refuses), not too many of them."""
    return text.isdigit() and text.isascii() and len(text) <= MAX_DIGITS


def rfc3339_us(text: str) -> int:
    """``2026-12-03T08:00:00.5Z`` -> µs; an offset is required (a local time is a guess)."""
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None:
            raise Malformed("timestamp", f"{shown(text)} has no UTC offset (add Z or +00:00)")
        # The offset may carry the year 1 before the epoch's calendar begins.
        return (when - EPOCH) // MICROSECOND
    except (ValueError, OverflowError):
        raise Malformed("timestamp", f"{shown(text)} is not an RFC 3339 time") from None


def unix_us(text: str) -> int:
    """``1764748800.123456`` (unix seconds, any fraction) -> µs, exactly."""
    whole, _, frac = text.partition(".")
    if not (whole.isdigit() and whole.isascii() and len(whole) <= MAX_DIGITS) or (
        frac and not (frac.isdigit() and frac.isascii())
    ):
        raise Malformed("timestamp", f"{shown(text)} is not unix seconds or RFC 3339")
    return int(whole) * 1_000_000 + (int((frac + "000000")[:6]) if frac else 0)


def seconds_us(value: float) -> int:
    """Unix seconds as a JSON number with a fraction -> µs; never an overflow (infinity,
    ``1e400``) or NaN, which are malformed."""
    if not 0 <= value <= MAX_TIME_US / 1_000_000:
        raise Malformed("timestamp", f"{shown(value)} is not a time from 1970 to 9999")
    return round(value * 1_000_000)


def time_us(value: object) -> int:
    """A named column's or JSON field's time: unix seconds (number or text) or RFC 3339."""
    if type(value) is str and len(value) > 10 and value[10] in "Tt ":
        return rfc3339_us(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value * 1_000_000
    if isinstance(value, float):
        return seconds_us(value)
    if isinstance(value, str) and value:
        if value[0].isdigit() and "-" not in value and ":" not in value:
            return unix_us(value)
        return rfc3339_us(value)
    raise Malformed("timestamp", f"{shown(value)} is not a time")


def path_of(target: str) -> str:
    """The path part of a logged target: no query, no fragment."""
    cut = target.find("?")
    if cut >= 0:
        target = target[:cut]
    cut = target.find("#")
    return target[:cut] if cut >= 0 else target


def text_field(obj: Mapping[str, Any], key: str, *, required: bool = True) -> str:
    """The text at ``key`` of a JSON object; "" for a missing one that is not ``required``."""
    value = obj.get(key)
    if isinstance(value, str) and value:
        return value
    if value is None or value == "":
        if required:
            raise Malformed("missing field", f"no {key!r}")
        return ""
    raise Malformed("field type", f"{key!r} is not text")


_decode = json.JSONDecoder().raw_decode


def load_object(line: str) -> dict[str, Any]:
    """A line as a JSON object; malformed when it is not one, or holds text no report could
    print."""
    try:
        obj, end = _decode(line)
        if end != len(line) and line[end:].strip():
            raise json.JSONDecodeError("extra data after the object", line, end)
    except (ValueError, RecursionError) as exc:
        # The position, not the text: the line may hold headers and cookies. Nesting deeper
        # than the decoder recurses is as malformed as a missing brace.
        pos = getattr(exc, "colno", None)
        at = f" (column {pos})" if pos else ""
        raise Malformed("not JSON", f"the line is not a JSON object{at}") from None
    if not isinstance(obj, dict):
        raise Malformed("not JSON", "the line is JSON but not an object")
    if "\\u" in line and _lone_surrogate(obj):
        # Only a \u escape of half a surrogate pair can make one (the text was decoded
        # with replacement); it cannot be written as UTF-8, so no report could print it.
        raise Malformed("encoding", "a \\uD800-\\uDFFF escape that is half of a pair")
    return obj


def _lone_surrogate(obj: object) -> bool:
    """Whether any text of a decoded JSON value (keys included) holds a lone surrogate.
    A loop, not recursion: the value may be nested as deep as the decoder went."""
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def optional_text(value: object) -> str | None:
    """A value as text, None when it is missing, empty or ``-``."""
    if value is None:
        return None
    if isinstance(value, bool | dict | list):
        raise Malformed("field type", f"{shown(value)} is not text")
    text = str(value)
    return text if text and text != "-" else None


def status_code(value: object) -> int | None:
    """A logged status code, None when it is missing, ``-`` or 0."""
    if value is None or value in ("", "-"):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value or None
    if isinstance(value, str) and value.isdigit() and value.isascii() and len(value) < 10:
        return int(value) or None
    raise Malformed("status", f"{shown(value)} is not a status code")


REQUIRED_COLUMNS: Final = ("timestamp", "method", "path", "ip")


def _required(row: Mapping[str, Any]) -> tuple[object, str, str, str]:
    """The timestamp, method, path and ip every named row must have."""
    try:
        when, method, path, ip = row["timestamp"], row["method"], row["path"], row["ip"]
    except KeyError as exc:
        raise Malformed("missing field", f"no {exc.args[0]!r}") from None
    if type(method) is not str or type(path) is not str or type(ip) is not str:
        raise Malformed("field type", "'method', 'path' and 'ip' must be text")
    if not (method and path and ip):
        raise Malformed("missing field", "'method', 'path' and 'ip' must not be empty")
    return when, method, path, ip


def named_record(row: Mapping[str, Any], user_key: str, options: TrafficOptions) -> Record:
    """A record from named values (a JSON object, or a CSV row as text)."""
    when, method, path, ip = _required(row)
    host = row.get("host") or ""
    if type(host) is not str:
        raise Malformed("field type", "'host' is not text")
    user = row.get(user_key)
    if user is not None and (type(user) is not str or not user or user == "-"):
        user = optional_text(user)
    tier = row.get("tier")
    if tier is not None and (type(tier) is not str or not tier or tier == "-"):
        tier = optional_text(tier)
    colo = row.get("colo")
    if colo is not None and (type(colo) is not str or not colo or colo == "-"):
        colo = optional_text(colo)
    authenticated = options.authenticated
    if authenticated is None:
        authenticated = row.get("authenticated")
        if authenticated is not None and type(authenticated) is not bool:
            authenticated = flag(authenticated)
    status = row.get("status")
    if status is not None and type(status) is not int:
        status = status_code(status)
    return Record(
        time_us(when),
        method.upper(),
        # The calls only for the values that need them: most hold no port and no query.
        host_name(host) if ":" in host else host.lower(),
        path_of(path) if "?" in path or "#" in path else path,
        ip,
        user,
        tier or tier_of(None, user, options.tiers, options.default_tier),
        authenticated,
        colo,
        status or None,
    )
