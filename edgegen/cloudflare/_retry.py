"""When to try a Cloudflare API request again, and how long to wait first. Pure: no I/O.

Retry as a value (redis-py's ``Retry`` and ``Backoff``): ``RetryPolicy`` says how often and
how long; ``decide`` looks at what one try gave (``Tried``) and returns a ``Decision``; the
transport only loops, sending, waiting and raising as told.

The rules follow Cloudflare's own SDK: 429, 408, 409 and 5xx are retried, honouring
``Retry-After`` up to ``RetryPolicy.max_retry_after`` (a longer one fails at once), else
exponential backoff (0.5 s doubling, cap 8 s) with full jitter. A request that is not
idempotent (POST) is only retried when Cloudflare certainly did not act on it (a 429, or a
connection that never opened); a write whose outcome is unknown is marked ``ambiguous``.
"""

from __future__ import annotations

import email.utils
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

IDEMPOTENT = frozenset({"GET", "PUT", "DELETE"})
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
# The longest Retry-After kept as given (a day); longer ones are read as this.
MAX_RETRY_AFTER = 86_400

Jitter = Callable[[float, float], float]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry. ``attempts`` counts the first try too."""

    attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def backoff(self, retry: int, jitter: Jitter) -> float:
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


def changes(method: str, params: Iterable[tuple[str, str]]) -> bool:
    """Whether a request may change the zone: not a read, nor Cloudflare's ``?dry_run=true``."""
    return method != "GET" and ("dry_run", "true") not in tuple(params)


@dataclass(frozen=True, slots=True)
class RetryRequest:
    """What matters about a request for retrying it: whether sending it twice is the same
    as once (``idempotent``) and whether it may change the zone (``changes``)."""

    idempotent: bool
    changes: bool

    @classmethod
    def of(cls, method: str, params: Iterable[tuple[str, str]] = ()) -> RetryRequest:
        """The request ``method`` with query ``params``."""
        return cls(method in IDEMPOTENT, changes(method, params))


@dataclass(frozen=True, slots=True)
class Tried:
    """What one try gave.

    ``kind``: ``answer`` (an answer read in full, with ``status`` and ``retry_after``),
    ``unsent`` (the connection never opened), ``unanswered`` (sent, no answer),
    ``deadline`` (no full answer in time; ``cut_short`` when the try had less than a full
    request deadline because the command's deadline was near) or ``unusable`` (an answer
    edgegen will not read: compressed, or too large).
    """

    kind: Literal["answer", "unsent", "unanswered", "deadline", "unusable"]
    status: int | None = None
    retry_after: float | None = None
    cut_short: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after a try.

    ``action``: ``done`` (a 2xx answer: return it), ``retry`` (wait ``wait`` seconds, then
    try again), ``fail`` (raise the error this try gave) or ``give_up`` (the command's
    deadline ran out). ``ambiguous``: a failed write may have been made (for ``fail`` on
    a try without an answer, and ``give_up``; an answer's error says so itself).
    ``maybe_done``: whether any try so far may have been acted on, carried to the next.
    """

    action: Literal["done", "retry", "fail", "give_up"]
    wait: float = 0.0
    ambiguous: bool = False
    maybe_done: bool = False


def decide(
    policy: RetryPolicy,
    request: RetryRequest,
    retry: int,
    tried: Tried,
    *,
    maybe_done: bool,
    jitter: Jitter,
) -> Decision:
    """The decision after try number ``retry`` (counted from 0) of ``request``.

    ``maybe_done`` says whether an earlier try may have been acted on; ``jitter(low, high)``
    draws the backoff wait (called only when backing off).
    """
    last = retry + 1 >= policy.attempts
    if tried.kind == "answer":
        status = tried.status or 0
        if 200 <= status < 300:
            return Decision("done", maybe_done=maybe_done)
        retryable = status in RETRY_STATUSES and (request.idempotent or status == 429)
        too_long = tried.retry_after is not None and tried.retry_after > policy.max_retry_after
        if not retryable or last or too_long:
            return Decision("fail", maybe_done=maybe_done)
        maybe_done = maybe_done or (request.changes and status >= 500)
        if tried.retry_after is not None:
            return Decision("retry", tried.retry_after, maybe_done=maybe_done)
        return Decision("retry", policy.backoff(retry, jitter), maybe_done=maybe_done)
    if tried.kind == "unsent":
        # The request never left this machine: safe to retry whatever it is.
        if last:
            return Decision("fail", ambiguous=False, maybe_done=maybe_done)
        return Decision("retry", policy.backoff(retry, jitter), maybe_done=maybe_done)
    if tried.kind in ("unanswered", "deadline"):
        # Sent, but no (full) answer: a write may or may not have happened.
        maybe_done = maybe_done or request.changes
        if tried.kind == "deadline" and tried.cut_short:
            return Decision("give_up", ambiguous=maybe_done, maybe_done=maybe_done)
        if last or not request.idempotent:
            return Decision("fail", ambiguous=maybe_done, maybe_done=maybe_done)
        return Decision("retry", policy.backoff(retry, jitter), maybe_done=maybe_done)
    # An answer that cannot be used (compressed, too large): not worth repeating. The
    # server answered, so a write may have been made.
    return Decision("fail", ambiguous=request.changes, maybe_done=maybe_done)
