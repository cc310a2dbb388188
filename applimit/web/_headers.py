"""What a response says about the limits: RateLimit headers and problem documents.

Headers follow draft-ietf-httpapi-ratelimit-headers (revision 10): ``RateLimit-Policy`` is a
structured-field List of ``"name";q=<quota>;w=<window seconds>`` items, ``RateLimit`` a List of
``"name";r=<remaining>;t=<seconds until more quota>`` items (one :class:`PolicyItem` each).
A calendar quota's item is named ``"limit/period"`` (``"api/month";q=50000;w=2592000``): its
``w`` is the current period's length, its ``t`` the seconds until the period ends.
A refusal's body is an RFC 9457 problem document (:func:`problem_body`). docs/web.md
describes every choice (which items appear when, rounding, shadow limits, a Redis outage).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from edgegen_policy import CALENDAR, header_key
from edgegen_policy import QUOTA_EXCEEDED as _QUOTA_EXCEEDED

from .._decision import LimitResult

# The problem type of a refusal: the Worker's too (edgegen_policy/_http.py), so one client
# sees one.
QUOTA_EXCEEDED: Final = _QUOTA_EXCEEDED

# What a calendar quota's results carry as their algorithm, before the period's name.
_QUOTA_PREFIX = CALENDAR + ":"

TEMPORARY_REDUCED_CAPACITY = (
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)
PROBLEM_JSON = "application/problem+json"


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
    # A calendar quota's period (``month``), or "" for a rate.
    period: str = ""

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


def quota_period(result: LimitResult) -> str:
    """The period of a calendar quota's result (its algorithm is ``quota:month``), or ""
    for a rate's."""
    algorithm = result.algorithm
    return algorithm[len(_QUOTA_PREFIX) :] if algorithm.startswith(_QUOTA_PREFIX) else ""


def seconds_text(count: int) -> str:
    """``1 second``, ``2 seconds``: the count in the problem's prose."""
    return f"{count} second" if count == 1 else f"{count} seconds"


def denied_delay(result: LimitResult) -> int:
    """``t`` of a violated policy: seconds until enough quota is back for this request.

    When the request can never fit (a cost above the quota) there is no such time; one
    window is what the client is told, so that it does not retry in a tight loop.
    """
    wait = result.retry_after
    if wait is None or not math.isfinite(wait):
        wait = result.window
    return max(1, delay_seconds(wait))


def binding_item(items: Sequence[PolicyItem]) -> PolicyItem | None:
    """The most restrictive item: fewest remaining, then the longest wait."""
    if not items:
        return None
    return min(items, key=lambda i: (i.remaining, -i.reset))


def period_text(window: float) -> str:
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
