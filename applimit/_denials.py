"""The "denied until" cache: repeated requests of an identity that is over a limit are
answered by the instance itself until the limit's retry time, without a Redis call.

It is exact: a request is answered locally only when Redis would deny it too. A denied
request changes nothing in Redis (the script writes only when every enforced check
passes), and other traffic can only consume, never give back, so a rate that cannot fit a
request of cost 1 until time T still cannot at any earlier time. Only cost-1 decisions are
cached and answered: a denial at cost 1 says when one more request fits, and until then
the denying rate's ``remaining`` is 0, so every number of a local answer is what Redis
would have said (the wait and the reset shrink with time, the count stays). The other
rates of a locally answered decision keep the counts the denial reported.

What the cache cannot see: a ``reset()`` made by another instance (this instance keeps
denying until the cached retry time; a ``reset()`` here clears its own entries), and on
Redis Cluster the refunds of requests split over several hash slots, which do give
capacity back; the limiter therefore disables the cache on a cluster whose policy mixes
per-IP and per-user limits (the only way a request spans slots).

Times: the wait is measured from the moment the request was sent, which is no later (by
the server's clock) than the script's ``now``, so the cached expiry is never late; caching
it slightly early only costs a Redis call. With real clocks the expiry is moved earlier by
a margin that covers the local monotonic clock and the server's clock running at slightly
different rates (NTP slews clocks by at most 500 ppm).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from ._decision import Decision, LimitResult, combine
from ._replies import Prepared

# The cache holds at most this many (key, tier) entries; when full, expired entries are
# dropped, and if that is not enough the cache starts over (which only costs Redis calls).
MAX_ENTRIES = 100_000
# Clock-rate margin with real clocks: a fixed part plus a share of the wait.
_MARGIN_FIXED = 0.001
_MARGIN_RATE = 0.001
_MARGIN_EXACT = 1e-6


@dataclass(frozen=True, slots=True)
class _Entry:
    """What the last cost-1 denial said about one check, and until when it holds."""

    result: LimitResult
    sent: float
    until: float
    denies: bool


class DenialCache:
    """Per (state key, tier): the result of the last cost-1 denial, while it still holds."""

    def __init__(self, clock: Callable[[], float], *, exact_clock: bool) -> None:
        """``clock`` gives seconds; ``exact_clock`` (a test clock, which is also the script's
        time) needs no margin."""
        self.clock = clock
        self._exact = exact_clock
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._lock = threading.Lock()

    def answer(self, prepared: Prepared) -> Decision | None:
        """The decision Redis would give, if the cache knows it; else None."""
        if not self._entries or any(c.cost != 1 for c in prepared.checks):
            return None
        now = self.clock()
        entries = self._entries
        results: list[LimitResult] = []
        denied = False
        for check in prepared.checks:
            entry = entries.get((check.key, check.tier))
            if entry is None or entry.until <= now:
                return None
            denied = denied or entry.denies
            results.append(_aged(entry, now))
        if not denied:
            return None
        return combine(results)

    def record(self, prepared: Prepared, decision: Decision, sent: float) -> None:
        """Remember a cost-1 denial made from Redis' replies (sent at ``sent``)."""
        if decision.allowed or decision.degraded or any(c.cost != 1 for c in prepared.checks):
            return
        if any(c.block.lease for c in prepared.checks):
            # A concurrency limit frees when a request ends, which no clock foresees: such
            # a denial is never answered locally.
            return
        until = -math.inf
        for result in decision.results:
            if result.allowed or result.shadow or result.retry_after is None:
                continue
            until = max(until, sent + result.retry_after - self._margin(result.retry_after))
        if until <= sent:
            return
        with self._lock:
            if len(self._entries) >= MAX_ENTRIES:
                self._prune()
            for check, result in zip(prepared.checks, decision.results, strict=True):
                denies = not result.allowed and not result.shadow
                end = until
                if denies and result.retry_after is not None:
                    end = sent + result.retry_after - self._margin(result.retry_after)
                if end > sent:
                    self._entries[(check.key, check.tier)] = _Entry(result, sent, end, denies)

    def forget(self, keys: list[str], tiers: tuple[str, ...]) -> None:
        """Drop the entries of ``keys`` (after a local ``reset()``)."""
        with self._lock:
            for key in keys:
                for tier in tiers:
                    self._entries.pop((key, tier), None)

    def _margin(self, wait: float) -> float:
        if math.isinf(wait):
            return 0.0
        if self._exact:
            # The script's time is the test clock's, but seconds as floats can round up.
            return _MARGIN_EXACT
        return _MARGIN_FIXED + _MARGIN_RATE * wait

    def _prune(self) -> None:
        now = self.clock()
        live = {k: e for k, e in self._entries.items() if e.until > now}
        self._entries = live if len(live) < MAX_ENTRIES else {}


def _aged(entry: _Entry, now: float) -> LimitResult:
    """The entry's result as of ``now``: waits and resets shrink, nothing is consumed."""
    result = entry.result
    elapsed = now - entry.sent
    retry = result.retry_after
    if retry is not None:
        retry = max(0.0, retry - elapsed)
    return replace(
        result,
        consumed=False,
        reset_after=max(0.0, result.reset_after - elapsed),
        retry_after=retry,
    )
