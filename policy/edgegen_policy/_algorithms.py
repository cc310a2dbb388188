"""The app's limiting algorithms as integer arithmetic: gcra, sliding_window, sliding_log,
and the counter of calendar quotas.

What applimit's scripts (``applimit/lua/{decide,common,gcra,sliding_window,
sliding_log,quota}.lua``) compute, stated once in Python for everything that must decide as they
do without Redis: applimit's in-process ``memory://`` store and edgegen's replay. Pure: a
key's state is a value passed in and handed back; where values live, when they expire and
when they are forgotten is the caller's.

Every time is an integer number of µs and every count an integer, as in the scripts: ``//``
is their ``idiv`` (an exact floor), :func:`cdiv` their ``cdiv``, and every comparison is the
one they make. A check's numbers are a :class:`Quota` (the script's ``c``, less the cost).
Each algorithm is an :class:`AlgorithmModel` (:data:`ALGORITHMS`, by name) whose methods
are the functions its Lua file registers in ``ALG``, and two more:

- ``check``: phase 1 of decide.lua, reads only. The :class:`Verdict` says whether ``cost``
  fits and the reply's numbers (remaining, reset, retry), and carries what ``apply`` needs
  (the script's ``st``);
- ``apply``: phase 2, the value after an admitted cost (changed in place when there is
  one); the verdict's ``remaining`` and ``reset`` become the numbers after it;
- ``refund``: an earlier ``apply`` made at ``now`` with ``nonce`` undone;
- ``expiry``: after an apply, the cell of the expiry grid (common.lua) the key must live to
  the end of, or None when the TTL an earlier apply set still holds;
- ``idle``: whether a value can no longer change any decision at ``now`` or later.

:func:`decide` is decide.lua's two phases over the checks of one request. The rate rules
are here too: a tier's rates are checked through ``checked_rates`` (one per period, the
smaller limit), a period is counted in µs (:func:`period_us`), and gcra's burst defaults to
the rate's limit (:func:`burst_for`); :meth:`Quota.of` applies them.

What the scripts do that this module leaves out, because no answer depends on it: members
written by applimit 0.1 (converted by the scripts on first read), and the sliding log's
rebase of starts past 2^50 (Python's integers stay exact).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ._vocab import Algorithm, Rate

# The retry values "admitted, no wait" and "can never be admitted" (common.lua).
NONE = -1
NEVER = -2
# How often, in units admitted, a sliding log trims the entries that left its window
# (sliding_log.lua's TRIM_EVERY; the limit itself when smaller).
TRIM_EVERY = 16

_US_PER_MS = 1_000


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers (common.lua's cdiv; ``//`` is already its exact idiv)."""
    return -(-a // b)


def expiry_cell(t: int, g: int) -> int:
    """The cell of a grid of ``g`` µs that the time ``t`` expires in (common.lua): a key
    whose state matters until ``t`` lives to the end of that cell."""
    return t // g + 1


def period_us(rate: Rate) -> int:
    """A rate's period in µs, as applimit sends it to the script and the models count it."""
    return rate.period.ms * _US_PER_MS


def burst_for(algorithm: str, burst: int | None, limit: int) -> int:
    """The burst a check of ``algorithm`` counts with: gcra's bucket holds ``burst``
    requests, or the rate's ``limit`` when the policy sets none; the other algorithms have
    no burst (0, as the script's spec carries it)."""
    if algorithm == Algorithm.GCRA:
        return limit if burst is None else burst
    return 0


@dataclass(frozen=True, slots=True)
class Quota:
    """A check's numbers as the algorithms count them: ``limit`` units per ``period`` µs,
    and gcra's ``burst`` (0 for the others)."""

    limit: int
    period: int
    burst: int = 0

    @classmethod
    def of(cls, algorithm: str, rate: Rate, burst: int | None = None) -> Quota:
        """The quota of one rate of a limit of ``algorithm`` whose policy sets ``burst``."""
        return cls(rate.limit, period_us(rate), burst_for(algorithm, burst, rate.limit))


@dataclass(slots=True)
class Verdict:
    """What a check found (the script's ``st``): whether the cost fits (``allowed``), and the
    reply's numbers: ``remaining``, ``reset`` (µs until the state is back to empty),
    ``retry`` (µs until the cost fits; :data:`NONE` when allowed, :data:`NEVER` when it never
    can)."""

    allowed: bool
    remaining: int
    reset: int
    retry: int


V = TypeVar("V")
F = TypeVar("F", bound=Verdict)


class AlgorithmModel(ABC, Generic[V, F]):
    """One algorithm's arithmetic over one key's value of type ``V`` (see the module's
    docstring)."""

    #: The type of the values this algorithm keeps; a store holding another type at the
    #: key treats it as no value.
    value_type: type[V]

    @abstractmethod
    def check(self, value: V | None, now: int, quota: Quota, cost: int) -> F:
        """Phase 1: what ``cost`` finds at ``now``; nothing changes."""

    @abstractmethod
    def apply(
        self, value: V | None, verdict: F, now: int, quota: Quota, cost: int, *, nonce: str = ""
    ) -> V:
        """Phase 2: the value once the ``cost`` that ``verdict`` admitted is counted
        (``nonce`` names the request, for a refund)."""

    @abstractmethod
    def refund(self, value: V, now: int, quota: Quota, cost: int, nonce: str) -> V | None:
        """The value once an apply made at ``now`` with ``nonce`` is undone (None: empty)."""

    @abstractmethod
    def expiry(self, value: V, verdict: F, quota: Quota) -> int | None:
        """After an apply: the expiry cell (of a grid of the period) the key must live to
        the end of, or None when the one set before still holds (the script keeps the
        TTL)."""

    @abstractmethod
    def idle(self, value: V, now: int, quota: Quota) -> bool:
        """Whether ``value`` can no longer change a decision at ``now`` or later: it then
        decides as no value (the scripts' keys expire some time after)."""

    def expires_at(self, cell: int, quota: Quota) -> int:
        """When a key whose :meth:`expiry` is ``cell`` expires, in µs: the end of that cell
        of a grid of the period (common.lua's ``cell_ttl_ms``)."""
        return cell * quota.period


# --- gcra.lua ----------------------------------------------------------------------------


@dataclass(slots=True)
class Tat:
    """A gcra value: the theoretical arrival time, ``tat + frac / limit`` µs."""

    tat: int
    frac: int


@dataclass(slots=True)
class GcraVerdict(Verdict):
    """gcra's ``st``: how far ahead of now the TAT is once the cost is counted (µs x
    limit), and the stored TAT's whole µs (None without a value)."""

    after: int
    tat: int | None


class Gcra(AlgorithmModel[Tat, GcraVerdict]):
    """The generic cell rate algorithm, a token bucket kept as one timestamp. In units of
    µs x limit the emission interval is the period and the bucket holds burst x period, so
    every comparison is between exact integers."""

    value_type = Tat

    def check(self, value: Tat | None, now: int, quota: Quota, cost: int) -> GcraVerdict:
        """Phase 1 (gcra_check)."""
        limit, period, burst = quota.limit, quota.period, quota.burst
        ahead = 0
        tat = None
        if value is not None:
            tat = value.tat
            ahead = (tat - now) * limit + value.frac
            if ahead < 0:  # noqa: PLR1730 (cheaper than max() on the replay's every request)
                ahead = 0
        capacity = burst * period
        after = ahead + cost * period
        allowed = after <= capacity
        retry = NONE
        if not allowed:
            retry = NEVER if cost > burst else cdiv(after - capacity, limit)
        remaining = (capacity - ahead) // period
        # -(-a // b) is cdiv, written out: a call less on every request.
        return GcraVerdict(allowed, remaining, -(-ahead // limit), retry, after, tat)

    def apply(
        self,
        value: Tat | None,
        verdict: GcraVerdict,
        now: int,
        quota: Quota,
        cost: int,
        *,
        nonce: str = "",
    ) -> Tat:
        """Phase 2 (gcra_apply): the TAT moves on by the cost's emission intervals."""
        limit, after = quota.limit, verdict.after
        whole = after // limit
        if value is None:
            value = Tat(now + whole, after - whole * limit)
        else:
            value.tat, value.frac = now + whole, after - whole * limit
        verdict.remaining = (quota.burst * quota.period - after) // quota.period
        verdict.reset = -(-after // limit)  # cdiv
        return value

    def refund(self, value: Tat, now: int, quota: Quota, cost: int, nonce: str) -> Tat | None:
        """gcra_refund: the TAT moves back by what the apply at ``now`` added, never
        before ``now``."""
        limit = quota.limit
        ahead = (value.tat - now) * limit + value.frac - cost * quota.period
        if ahead <= 0:
            return None
        whole = ahead // limit
        value.tat, value.frac = now + whole, ahead - whole * limit
        return value

    def expiry(self, value: Tat, verdict: GcraVerdict, quota: Quota) -> int | None:
        """The key lives until the TAT, rounded up to a whole µs."""
        cell = expiry_cell(value.tat + 1, quota.period)
        if verdict.tat is not None and expiry_cell(verdict.tat + 1, quota.period) == cell:
            return None
        return cell

    def idle(self, value: Tat, now: int, quota: Quota) -> bool:
        """Once the TAT has passed, a key decides as one never seen."""
        return (value.tat - now) * quota.limit + value.frac <= 0


# --- sliding_window.lua ------------------------------------------------------------------


@dataclass(slots=True)
class Window:
    """A sliding window's value: ``w`` the current fixed window's index (time // period),
    ``c`` its count, ``p`` the previous window's."""

    w: int
    c: int
    p: int


@dataclass(slots=True)
class WindowVerdict(Verdict):
    """sliding_window's ``st``: the window counted in, the stored one (None without a
    value), both counts, and the µs elapsed in the window."""

    window: int
    stored: int | None
    cur: int
    prev: int
    elapsed: int


def _window_retry(quota: Quota, cost: int, cur: int, prev: int, elapsed: int) -> int:
    """µs until ``cost`` fits in a sliding window that refused it, if nothing else comes."""
    limit, period = quota.limit, quota.period
    if cost > limit:
        return NEVER
    room = limit - cur - cost
    if room >= 0 and prev > 0:
        # Fits later in this window, once the previous window weighs less.
        return period - (room * period) // prev - elapsed
    # Fits only in the next window, where this one's count is the weighted one.
    at = max(0, period - ((limit - cost) * period) // cur)
    return period - elapsed + at


class SlidingWindow(AlgorithmModel[Window, WindowVerdict]):
    """The two-counter approximation of a sliding window: the estimate of the last period
    is p x (period - elapsed) / period + c, compared multiplied by the period."""

    value_type = Window

    def check(self, value: Window | None, now: int, quota: Quota, cost: int) -> WindowVerdict:
        """Phase 1 (sw_check)."""
        period = quota.period
        window = now // period
        stored = None
        cur = prev = 0
        if value is not None:
            stored = value.w
            if stored == window:
                cur, prev = value.c, value.p
            elif stored == window - 1:
                prev = value.c
            elif stored > window:
                # The clock went back across a window edge: keep counting in the stored
                # window, the previous one at full weight (the conservative reading).
                window = stored
                cur, prev = value.c, value.p
        elapsed = now - window * period
        if elapsed < 0:  # noqa: PLR1730 (cheaper than max() on the replay's every request)
            elapsed = 0
        used = prev * (period - elapsed) + cur * period
        full = quota.limit * period
        allowed = used + cost * period <= full
        retry = NONE if allowed else _window_retry(quota, cost, cur, prev, elapsed)
        reset = 0
        if cur > 0:
            reset = 2 * period - elapsed
        elif prev > 0:
            reset = period - elapsed
        remaining = max(0, (full - used) // period)
        return WindowVerdict(allowed, remaining, reset, retry, window, stored, cur, prev, elapsed)

    def apply(
        self,
        value: Window | None,
        verdict: WindowVerdict,
        now: int,
        quota: Quota,
        cost: int,
        *,
        nonce: str = "",
    ) -> Window:
        """Phase 2 (sw_apply): the cost is added to the window counted in."""
        period = quota.period
        verdict.cur += cost
        if value is None:
            value = Window(verdict.window, verdict.cur, verdict.prev)
        else:
            value.w, value.c, value.p = verdict.window, verdict.cur, verdict.prev
        used = verdict.prev * (period - verdict.elapsed) + verdict.cur * period
        verdict.remaining = max(0, (quota.limit * period - used) // period)
        verdict.reset = 2 * period - verdict.elapsed
        return value

    def refund(self, value: Window, now: int, quota: Quota, cost: int, nonce: str) -> Window | None:
        """sw_refund: the cost comes off the window of ``now``, which may since have
        become the previous one; never below 0."""
        window = now // quota.period
        if value.w == window:
            value.c = max(0, value.c - cost)
        elif value.w == window + 1:
            value.p = max(0, value.p - cost)
        return value

    def expiry(self, value: Window, verdict: WindowVerdict, quota: Quota) -> int | None:
        """A count weighs until the end of the next window: set once per window, by its
        first write."""
        if verdict.stored == verdict.window:
            return None
        return verdict.window + 2

    def idle(self, value: Window, now: int, quota: Quota) -> bool:
        """Counts written two or more windows ago weigh nothing."""
        return value.w < now // quota.period - 1


# --- sliding_log.lua ---------------------------------------------------------------------


@dataclass(slots=True)
class Log:
    """A sliding log (Redis: a sorted set): ``scores[i]`` is entry i's admission time,
    ``entries[i]`` its (start, cost, nonce), ``start`` the units admitted before it. Scores
    never decrease, so list order is the sorted set's order (by score, then by start)."""

    scores: list[int] = field(default_factory=list)
    entries: list[tuple[int, int, str]] = field(default_factory=list)


@dataclass(slots=True)
class LogVerdict(Verdict):
    """sliding_log's ``st``: the newest entry's score (None without one), the window's
    floor, whether everything held has left it (``trim``), where the next entry starts,
    and the units in the window."""

    newest: int | None
    floor: int
    trim: bool
    start: int
    count: int


def _log_retry(log: Log, first: int, need: int) -> int:
    """When a request fits that needs ``need`` of the units in the window (from rank
    ``first``) to leave: the score of the oldest entry whose start + cost reaches the
    first's start + ``need`` (log_reaching, a binary search: start + cost grows with the
    rank)."""
    first_start, first_cost, _ = log.entries[first]
    if first_cost >= need:
        return log.scores[first]
    target = first_start + need
    lo, hi = first + 1, len(log.scores) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        start, cost, _ = log.entries[mid]
        if start + cost >= target:
            hi = mid
        else:
            lo = mid + 1
    return log.scores[lo]


class SlidingLog(AlgorithmModel[Log, LogVerdict]):
    """The exact sliding-window log: one entry per admitted request, the window
    (now - period, now]; the units in it are the newest entry's start + cost minus the
    oldest in-window entry's start."""

    value_type = Log

    def check(self, value: Log | None, now: int, quota: Quota, cost: int) -> LogVerdict:
        """Phase 1 (log_check)."""
        limit, period = quota.limit, quota.period
        floor = now - period
        newest = None
        trim = False
        start = count = first = reset = 0
        if value is not None and value.scores:
            newest = value.scores[-1]
            if newest > floor:
                last, units, _ = value.entries[-1]
                start = last + units
                # The window's oldest entry; entries before it may remain (see apply).
                first = bisect_right(value.scores, floor)
                count = start - value.entries[first][0]
                if count > 0:
                    reset = newest + period - now
            else:
                trim = True
        allowed = cost <= limit - count
        retry = NONE
        if cost > limit:
            retry = NEVER
        elif not allowed:
            assert value is not None  # count > 0: there are entries
            retry = _log_retry(value, first, count + cost - limit) + period - now
        return LogVerdict(allowed, limit - count, reset, retry, newest, floor, trim, start, count)

    def apply(
        self,
        value: Log | None,
        verdict: LogVerdict,
        now: int,
        quota: Quota,
        cost: int,
        *,
        nonce: str = "",
    ) -> Log:
        """Phase 2 (log_apply): the entry is added, scored no earlier than the newest (so
        list order stays admission order); the entries that left the window are trimmed
        when nothing else is in it, and else each time the starts cross a multiple of
        :data:`TRIM_EVERY` units (of the limit, when smaller)."""
        newest = verdict.newest
        score = newest if newest is not None and newest > now else now
        if value is None:
            value = Log()
        value.scores.append(score)
        value.entries.append((verdict.start, cost, nonce))
        every = min(TRIM_EVERY, quota.limit)
        if verdict.trim or (verdict.start + cost) // every != verdict.start // every:
            gone = bisect_right(value.scores, verdict.floor)
            del value.scores[:gone], value.entries[:gone]
        verdict.count += cost
        verdict.remaining = quota.limit - verdict.count
        verdict.reset = score + quota.period - now
        return value

    def refund(self, value: Log, now: int, quota: Quota, cost: int, nonce: str) -> Log | None:
        """log_refund: the entry of ``nonce`` scored ``now`` or later goes; those after
        it start its cost earlier."""
        entries = value.entries
        for rank in range(bisect_right(value.scores, now - 1), len(entries)):
            _, units, tail = entries[rank]
            if tail == nonce:
                del value.scores[rank], entries[rank]
                for later in range(rank, len(entries)):
                    start, more, other = entries[later]
                    entries[later] = (start - units, more, other)
                break
        return value if value.scores else None

    def expiry(self, value: Log, verdict: LogVerdict, quota: Quota) -> int | None:
        """The key lives until its newest entry leaves the window."""
        period = quota.period
        cell = expiry_cell(value.scores[-1] + period, period)
        newest = verdict.newest
        if newest is not None and expiry_cell(newest + period, period) == cell:
            return None
        return cell

    def idle(self, value: Log, now: int, quota: Quota) -> bool:
        """Once its newest entry has left the window, a log counts nothing."""
        return not value.scores or value.scores[-1] <= now - quota.period


# --- quota.lua ---------------------------------------------------------------------------

# How long a quota's counter outlives its period, in µs (quota.lua's GRACE_MS): a request
# the app's clock places just before the end may reach Redis just after it, and must still
# find the period's count.
QUOTA_GRACE_US = 60_000_000
#: The algorithm name of a calendar quota's checks in the script's specs.
CALENDAR = "quota"


@dataclass(slots=True)
class Count:
    """A calendar quota's value: the units counted in its period."""

    count: int


@dataclass(slots=True)
class CountVerdict(Verdict):
    """quota's ``st``: the count before this request."""

    used: int


class CalendarQuota(AlgorithmModel[Count, CountVerdict]):
    """A counter per calendar period: ``limit`` units from the period's start to its end.

    A quota's check carries absolute times where the rates carry lengths: its
    :class:`Quota`'s ``period`` is the period's end and ``burst`` its start (µs since the
    epoch), as the script's spec does. The key names the period's start, so a new period
    counts on a new key; the key expires :data:`QUOTA_GRACE_US` after the end."""

    value_type = Count

    def check(self, value: Count | None, now: int, quota: Quota, cost: int) -> CountVerdict:
        """Phase 1 (quota_check): the cost fits while the count stays within the limit;
        a refused request waits for the period's end (never, when it exceeds the limit)."""
        used = 0 if value is None else value.count
        left = quota.limit - used
        end, start = quota.period, quota.burst
        reset = end - max(now, start)
        reset = max(reset, 0)
        allowed = cost <= left
        retry = NONE
        if not allowed:
            retry = NEVER if cost > quota.limit else reset
        return CountVerdict(allowed, max(left, 0), reset, retry, used)

    def apply(
        self,
        value: Count | None,
        verdict: CountVerdict,
        now: int,
        quota: Quota,
        cost: int,
        *,
        nonce: str = "",
    ) -> Count:
        """Phase 2 (quota_apply): INCRBY the cost."""
        if value is None:
            value = Count(0)
        value.count += cost
        verdict.remaining = max(quota.limit - value.count, 0)
        return value

    def refund(self, value: Count, now: int, quota: Quota, cost: int, nonce: str) -> Count | None:
        """quota_refund: DECRBY the cost; an emptied counter is deleted."""
        value.count -= cost
        return value if value.count > 0 else None

    def expiry(self, value: Count, verdict: CountVerdict, quota: Quota) -> int | None:
        """A new counter gets its TTL (the period's end and the grace); one that counted
        before keeps it."""
        return 1 if verdict.used == 0 else None

    def expires_at(self, cell: int, quota: Quota) -> int:
        """The period's end, and the grace."""
        return quota.period + QUOTA_GRACE_US

    def idle(self, value: Count, now: int, quota: Quota) -> bool:
        """Once the grace after its period has passed, no request counts in it."""
        return now >= quota.period + QUOTA_GRACE_US


GCRA = Gcra()
SLIDING_WINDOW = SlidingWindow()
SLIDING_LOG = SlidingLog()
CALENDAR_QUOTA = CalendarQuota()

#: Every algorithm's model by name (an :class:`~edgegen_policy.Algorithm` or its text).
# --- lease.lua ---------------------------------------------------------------------------

# A refused lease's retry in µs (lease.lua's LEASE_RETRY): a lease comes back when a
# request ends, which nothing can know; clients are told to try again in a second.
LEASE_RETRY = 1_000_000
# The name of the concurrency limit's algorithm in a check's spec (not a policy algorithm:
# a limit's concurrency adds one such check).
LEASE = "lease"


@dataclass(slots=True)
class Leases:
    """The leases held (Redis: a sorted set): each request's nonce and when it runs out."""

    ends: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class LeaseVerdict(Verdict):
    """lease's ``st``: the verdict alone (apply reads the time)."""


class Lease(AlgorithmModel[Leases, LeaseVerdict]):
    """A concurrency limit: at most ``limit`` leases at once, each running out ``period``
    µs after its request was admitted unless given back first. Cost is not read: a
    request holds one lease."""

    value_type = Leases

    def check(self, value: Leases | None, now: int, quota: Quota, cost: int) -> LeaseVerdict:
        """Phase 1 (lease_check): the leases that have not run out."""
        held = 0 if value is None else sum(1 for end in value.ends.values() if end > now)
        if held < quota.limit:
            return LeaseVerdict(True, quota.limit - held, 0, NONE)
        return LeaseVerdict(False, 0, 0, LEASE_RETRY)

    def apply(
        self,
        value: Leases | None,
        verdict: LeaseVerdict,
        now: int,
        quota: Quota,
        cost: int,
        *,
        nonce: str = "",
    ) -> Leases:
        """Phase 2 (lease_apply): the leases that ran out go, this request's is added."""
        held = {key: end for key, end in (value.ends if value else {}).items() if end > now}
        held[nonce] = now + quota.period
        verdict.remaining -= 1
        return Leases(held)

    def refund(self, value: Leases, now: int, quota: Quota, cost: int, nonce: str) -> Leases | None:
        """The lease of the request named ``nonce`` given back (lease_refund)."""
        left = {key: end for key, end in value.ends.items() if key != nonce}
        return Leases(left) if left else None

    def expiry(self, value: Leases, verdict: LeaseVerdict, quota: Quota) -> int | None:
        """The cell the newest lease's end falls in (the script sets it on every apply)."""
        return expiry_cell(max(value.ends.values()), quota.period)

    def idle(self, value: Leases, now: int, quota: Quota) -> bool:
        """No lease is held any more."""
        return all(end <= now for end in value.ends.values())


LEASES = Lease()

ALGORITHMS: Mapping[str, AlgorithmModel[Any, Any]] = {
    Algorithm.GCRA: GCRA,
    Algorithm.SLIDING_WINDOW: SLIDING_WINDOW,
    Algorithm.SLIDING_LOG: SLIDING_LOG,
    LEASE: LEASES,
    # Not a policy algorithm: the checks of a tier's calendar quotas, beside its rates.
    CALENDAR: CALENDAR_QUOTA,
}


# --- decide.lua --------------------------------------------------------------------------

K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)
K = TypeVar("K", bound=Hashable)


class Counter(Protocol[K_contra]):
    """Where one check's values live: one rate of one limit, for every key it counts."""

    def peek(self, key: K_contra, now: int, cost: int) -> Verdict:
        """Phase 1 for ``key``: what ``cost`` finds at ``now``; nothing changes."""
        ...

    def record(self, key: K_contra, verdict: Verdict, now: int, cost: int) -> None:
        """Phase 2 for ``key``: count the ``cost`` that ``verdict`` admitted."""
        ...


# A check's flags (decide.lua's last spec field): a shadow check never refuses; an AFTER
# check (a count_when limit checked before the response) is never applied by a hit.
SHADOW = 1
AFTER = 2


def decide(
    checks: Sequence[tuple[Counter[K], K, int, int]], now: int, *, hit: bool = True
) -> tuple[bool, list[Verdict]]:
    """decide.lua's two phases over one request's checks, each (counter, key, cost,
    flags): phase 1 checks them all without writing; the request is admitted when no
    enforced check refuses. Phase 2, for a ``hit`` that is admitted, applies every check
    that admitted on its own: the enforced ones, and the shadow ones that would have
    admitted (a shadow check counts the traffic that gets through). A refused request
    changes nothing. ``flags`` (a bool is read as 1 or 0): ``SHADOW`` never refuses;
    ``AFTER`` (a ``count_when`` limit before the response) is checked and never applied,
    as its count comes after the answer. Returns whether it was admitted, and each check's
    verdict: a check was applied (the script's ``consumed``) when ``hit``, admitted,
    allowed and not ``AFTER``."""
    verdicts: list[Verdict] = []
    passed = True
    for counter, key, cost, flags in checks:
        verdict = counter.peek(key, now, cost)
        verdicts.append(verdict)
        if not verdict.allowed and not flags & SHADOW:
            passed = False
    if hit and passed:
        for index, (counter, key, cost, flags) in enumerate(checks):
            verdict = verdicts[index]
            if verdict.allowed and not flags & AFTER:
                counter.record(key, verdict, now, cost)
    return passed, verdicts
