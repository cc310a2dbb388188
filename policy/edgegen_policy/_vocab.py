"""The policy's vocabulary: durations, rates, algorithms, actions and plans.

Defined once here so that the edge compiler and the in-app limiter mean the same thing by
the same words. Values are small frozen objects with a canonical string form, which is also
how they are written in the policy file and in JSON.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

# Units a duration may use, in milliseconds. "m" is minutes: rates are about requests per
# minute far more often than per month, and months have no fixed length anyway.
_UNITS_MS: dict[str, int] = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# re.ASCII: \d and \s are the ASCII ones, as in the JSON Schema's patterns (ECMAScript), so
# an editor and the loader agree: "١٠s" (Arabic-Indic digits) is no duration to either.
_DURATION_RE = re.compile(r"^\s*(?P<n>\d{1,12})?\s*(?P<unit>ms|s|m|h|d)\s*$", re.ASCII)
_RATE_RE = re.compile(r"^\s*(?P<limit>\d{1,12})\s*/\s*(?P<period>[^/]+?)\s*$", re.ASCII)
# Common spellings people try, mapped to the unit we want them to write.
_UNIT_HINTS: dict[str, str] = {
    "msec": "ms",
    "millisecond": "ms",
    "milliseconds": "ms",
    "sec": "s",
    "secs": "s",
    "second": "s",
    "seconds": "s",
    "min": "m",
    "mins": "m",
    "minute": "m",
    "minutes": "m",
    "hr": "h",
    "hrs": "h",
    "hour": "h",
    "hours": "h",
    "day": "d",
    "days": "d",
}
MAX_LIMIT = 1_000_000_000
MAX_DURATION_MS = 366 * 86_400_000


def _format_ms(ms: int) -> str:
    """Canonical text of a duration: the largest unit that divides it exactly."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _duration_hint(text: str) -> str:
    match = re.match(r"^\s*(\d*)\s*([a-zA-Z]+)\s*$", text, re.ASCII)
    if match and match.group(2).lower() in _UNIT_HINTS:
        return f"{match.group(1) or '1'}{_UNIT_HINTS[match.group(2).lower()]}"
    return "10s"


class _Text(ABC):
    """Pydantic hooks for a value written as text: ``parse`` validates, ``str`` serialises."""

    __slots__ = ()
    JSON_SCHEMA: ClassVar[dict[str, Any]]

    @classmethod
    @abstractmethod
    def parse(cls, value: object) -> Any:
        """Turn text (or an instance) into an instance; ValueError says how to write it."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse, serialization=core_schema.to_string_ser_schema()
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return dict(cls.JSON_SCHEMA)


@dataclass(frozen=True, slots=True, order=True)
class Duration(_Text):
    """A length of time, held in whole milliseconds (``50ms``, ``10s``, ``1m``, ``1h``, ``1d``)."""

    ms: int

    UNITS: ClassVar[tuple[str, ...]] = tuple(_UNITS_MS)

    @classmethod
    def parse(cls, value: object) -> Duration:
        """Parse ``"10s"``-style text (or a whole number of seconds) into a Duration.

        Raises ValueError with a message that says how to write it.
        """
        if isinstance(value, Duration):
            return value
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError(f"{value!r} is not a duration; write it like 10s, 500ms or 1m")
        if isinstance(value, int):
            ms = value * 1000
        else:
            match = _DURATION_RE.match(value)
            if not match:
                hint = _duration_hint(value)
                raise ValueError(
                    f"{value!r} is not a duration; write it like {hint} (units: ms, s, m, h, d)"
                )
            ms = int(match.group("n") or "1") * _UNITS_MS[match.group("unit")]
        if ms <= 0:
            raise ValueError(f"{value!r} is not a positive duration; use at least 1ms")
        if ms > MAX_DURATION_MS:
            raise ValueError(f"{value!r} is longer than a year; use at most 366d")
        return cls(ms)

    @property
    def seconds(self) -> float:
        """The duration in seconds (may be fractional)."""
        return self.ms / 1000

    @property
    def whole_seconds(self) -> int | None:
        """The duration in seconds when it is a whole number of them, else None."""
        return self.ms // 1000 if self.ms % 1000 == 0 else None

    def __str__(self) -> str:
        return _format_ms(self.ms)

    # What ``parse`` takes: text as _DURATION_RE reads it, or a whole number of seconds.
    JSON_SCHEMA: ClassVar[dict[str, Any]] = {
        "anyOf": [
            {"type": "string", "pattern": r"^\s*\d{0,12}\s*(ms|s|m|h|d)\s*$"},
            {"type": "integer", "minimum": 1, "maximum": MAX_DURATION_MS // 1000},
        ],
        "description": "A duration: a whole number and a unit (ms, s, m, h, d), e.g. 10s; "
        "a bare number is seconds",
        "examples": ["50ms", "10s", "1m", "1h"],
    }


@dataclass(frozen=True, slots=True)
class Rate(_Text):
    """``limit`` requests per ``period``: written ``100/1m``, ``5/10s``, ``20000/1h``."""

    limit: int
    period: Duration

    @classmethod
    def parse(cls, value: object) -> Rate:
        """Parse ``"100/1m"``-style text into a Rate; ValueError says how to write it."""
        if isinstance(value, Rate):
            return value
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not a rate; write it like 100/1m (a string)")
        match = _RATE_RE.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a rate; write it like 100/1m")
        limit = int(match.group("limit"))
        period_text = match.group("period")
        if not _DURATION_RE.match(period_text):
            hint = _duration_hint(period_text)
            raise ValueError(f"{value!r} is not a rate; write it like {limit}/{hint}")
        period = Duration.parse(period_text)
        if limit < 1:
            raise ValueError(f"{value!r} allows nothing; a rate's limit must be at least 1")
        if limit > MAX_LIMIT:
            raise ValueError(f"{value!r} has a limit above {MAX_LIMIT:,}; use a longer period")
        return cls(limit, period)

    @property
    def per_second(self) -> float:
        """Requests per second, for comparing rates with different periods."""
        return self.limit / self.period.seconds

    def __str__(self) -> str:
        return f"{self.limit}/{self.period}"

    JSON_SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "string",
        # What ``parse`` takes: _RATE_RE around a period as _DURATION_RE reads it.
        "pattern": r"^\s*\d{1,12}\s*/\s*\d{0,12}\s*(ms|s|m|h|d)\s*$",
        "description": "Requests per period, e.g. 100/1m or 5/10s",
        "examples": ["100/1m", "5/10s", "20000/1h"],
    }


def checked_rates(rates: Iterable[Rate]) -> tuple[Rate, ...]:
    """The rates of one tier that are checked: of two with the same period only the smaller
    limit, which alone decides (the larger can never refuse first). One per period, in the
    order each period first appears. The one statement of the rule: the app's limiter, its
    in-process store and the replay's models all take their rates through it."""
    best: dict[int, Rate] = {}
    for rate in rates:
        seen = best.get(rate.period.ms)
        if seen is None or rate.limit < seen.limit:
            best[rate.period.ms] = rate
    return tuple(best.values())


class Algorithm(StrEnum):
    """How the app counts: exact log, constant-memory approximation, or GCRA."""

    SLIDING_LOG = "sliding_log"
    SLIDING_WINDOW = "sliding_window"
    GCRA = "gcra"


class Action(StrEnum):
    """What Cloudflare does to a client over an edge limit."""

    BLOCK = "block"
    MANAGED_CHALLENGE = "managed_challenge"
    JS_CHALLENGE = "js_challenge"
    CHALLENGE = "challenge"
    LOG = "log"


class CloudflarePlan(StrEnum):
    """The Cloudflare plan of the zone, which decides what edge rules can express."""

    FREE = "free"
    PRO = "pro"
    BUSINESS = "business"
    ENTERPRISE = "enterprise"
    ENTERPRISE_ARL = "enterprise-arl"


class OnRedisError(StrEnum):
    """The written decision for when Redis cannot answer: fail open or fail closed."""

    ALLOW = "allow"
    DENY = "deny"


class EdgeKey(StrEnum):
    """What an edge limit counts by, when it counts by address.

    ``ip`` is the client address; ``ip_nat`` is Cloudflare's "IP with NAT support"
    (``cf.unique_visitor_id``), which tells apart clients behind one address. A limit may
    also count by a header, a cookie or a JWT claim (``HeaderKey``, ``CookieKey``,
    ``JwtKey`` in the model).
    """

    IP = "ip"
    IP_NAT = "ip_nat"


class AppKey(StrEnum):
    """What an app limit counts by: the authenticated user, or the client IP.

    These are the built-in keys; ``per:`` may also name a key of the app's own
    (:class:`KeyName`), such as an organisation or an API key, that ``identify`` returns.
    """

    USER = "user"
    IP = "ip"


# A key name of the app's own: a lower-case identifier, short enough to keep Redis keys short.
KEY_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class KeyName(str):
    """A key of the app's own that an app limit counts by (``per: org``).

    The loader takes any string here, so that the lint pass (L005) can say, at the field's
    line, why a name cannot be used (not a lower-case identifier, or a built-in key spelled
    in another case). ``value`` reads as it does on :class:`AppKey`, so code that prints
    ``limit.app.per.value`` works for both.
    """

    __slots__ = ()

    @property
    def value(self) -> str:
        """The name as written in the policy."""
        return str(self)

    @property
    def valid(self) -> bool:
        """Whether the name is a lower-case identifier of at most 32 characters that is not
        a built-in key (``user``, ``ip``) in any case."""
        return bool(KEY_NAME_RE.match(self)) and self.lower() not in set(AppKey)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.str_schema(strict=True),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )


class EdgeTarget(StrEnum):
    """Where an edge limit should run: chosen by plan (auto), or forced."""

    AUTO = "auto"
    RULE = "rule"
    WORKER = "worker"


class Mode(StrEnum):
    """Exact (every decision in Redis) or approximate (local counts synced periodically)."""

    EXACT = "exact"
    APPROXIMATE = "approximate"


HTTP_METHODS: frozenset[str] = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "PURGE"}
)
