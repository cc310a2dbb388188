"""Approximate mode: requests counted locally and sent to Redis in batches.

For a limit with ``mode: approximate`` each limiter instance keeps, per state key and tier,
the last result Redis gave (its ``remaining``), a *pending* count: requests this instance
admitted that it has not sent to Redis yet, and at most one *sync in flight*
(:class:`Flight`) with the pending units it *carries*: sent, but not yet known to be
counted. A ``hit`` whose every check is approximate is admitted locally when, for every
check, the pending and carried units plus the cost stay below ``sync_every``, the last
known remaining minus the pending units and all the sync in flight may take still fits
the cost, and less than ``sync_interval`` has passed since the key last synced.

Otherwise, with no sync in flight on its keys, the request *syncs*: one call with cost =
pending + the request's cost per check (one atomic batch), the pending units carried by
it until its reply says what Redis counted. A request that finds a sync in flight on one
of its keys waits for it to land when it may be answered locally afterwards (then
decides again), and otherwise (its cost is ``sync_every`` or more, the sync in flight
takes the last known room, or ``WAIT_ROUNDS`` syncs' worth of requests already wait for
it) goes to Redis on its own, carrying nothing: such a call cannot add to the bound.

When the batch is denied (the limit is exhausted, or nearly), the pending requests were
already admitted and must still be counted: the sync sends what fits of them (the
reply's ``remaining``) as a second call, keeps any rest as pending (a debt paid by the
next sync, which is denied until it fits), and when nothing is left pending asks Redis
about the request alone, so a denial is Redis' own answer. A request that also matches an
exact limit, a ``peek`` and a ``reset`` go to Redis as in exact mode.

Bound (docs/applimit.md): per key and instance, the units admitted locally that Redis is
not known to have counted (pending, debt included, plus those the sync in flight carries)
never exceed ``sync_every - 1``: only a local admission adds to them, and it must keep
them below ``sync_every``; a reply only takes away what its own sync carried, and what it
did not count goes back to pending. A sync whose decision is abandoned (a cancelled
task, an exception) gives what it carried back to pending unless its reply was taken in.
So at any moment K instances hold at most K x (sync_every - 1) admitted units Redis has
not counted, every one of them counted later, and per window of the limit the units
admitted beyond what Redis allows are at most K x (sync_every - 1), whatever the number of
threads or tasks deciding at once.

Overshoot: pending requests that a denied batch shows did not fit (Redis' room was
smaller than what this instance had admitted) were admitted over the limit. Each is
reported once, through ``overshoot(limit, tier, count)``, when a sync first finds it over;
it stays pending as a *debt* (``_Entry.debt``) so a later sync that still cannot count it
does not report it again. What a sync counts is taken from the pending units that are no
debt first, so that, while the window does not move, the units reported are exactly those
Redis never counts.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ._calls import Check
from ._decision import Decision, LimitResult, combine, make_result, single
from ._plan import Core
from ._replies import Prepared

# Entries beyond this many: those holding no uncounted units are dropped. Dropping one
# only costs a Redis call; the others are kept (their units must still be counted), and
# while they alone fill the cache a new key is decided by Redis, with no entry.
MAX_ENTRIES = 100_000
# While the cache is full of entries holding uncounted units, it looks for droppable ones
# again only once per this many keys refused (the look is a pass over every entry).
_PRUNE_EVERY = 1_000
# The most decisions that wait for one sync, in syncs' worth (sync_every - 1 each): about
# how many syncs' time the last of them may wait. The others go to Redis alone.
WAIT_ROUNDS = 4


class Flight:
    """A sync on its way to Redis, and the decisions waiting for it to land.

    A thread waits on :meth:`event`, a task on the event loop awaits :meth:`future`;
    both are woken when the sync's reply has been taken in (or it was abandoned).
    """

    __slots__ = ("_event", "_futures", "_lock", "landed", "waiting")

    def __init__(self, lock: threading.Lock) -> None:
        """``lock`` is the cache's: landing and waiting are atomic with its state."""
        self._lock = lock
        self.landed = False
        # Decisions told to wait for it (under the lock).
        self.waiting = 0
        self._event: threading.Event | None = None
        self._futures: list[asyncio.Future[None]] | None = None

    def event(self) -> threading.Event | None:
        """An event set when the sync lands, for a thread (None: it has landed)."""
        with self._lock:
            if self.landed:
                return None
            if self._event is None:
                self._event = threading.Event()
            return self._event

    def future(self) -> asyncio.Future[None] | None:
        """A future of the running loop resolved when the sync lands (None: it has)."""
        with self._lock:
            if self.landed:
                return None
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if self._futures is None:
                self._futures = []
            self._futures.append(future)
            return future

    def land(self) -> Callable[[], None] | None:
        """Mark it landed (under the cache's lock); what wakes its waiters, to call
        outside the lock."""
        self.landed = True
        event, futures = self._event, self._futures
        if event is None and futures is None:
            return None

        def wake() -> None:
            if event is not None:
                event.set()
            for future in futures or ():
                # A waiter that stopped waiting (cancelled, out of time) cancelled it.
                if not future.done():
                    future.set_result(None)

        return wake


@dataclass(slots=True)
class _Entry:
    """What this instance knows of one (state key, tier)."""

    result: LimitResult | None = None
    synced: float = float("-inf")
    pending: int = 0
    # The part of ``pending`` already reported as overshoot (the oldest part).
    debt: int = 0
    # The sync in flight on this key, if any (at most one), the pending units it carries
    # (admitted here, not yet known to be counted), and what it may take from the limit:
    # those plus its request's own cost.
    flight: Flight | None = None
    carried: int = 0
    claim: int = 0


@dataclass(frozen=True, slots=True)
class Sync:
    """A sync to run: ``batch`` carries the pending counts ``taken`` plus the request."""

    prepared: Prepared
    batch: Prepared
    taken: tuple[int, ...]
    sent: float
    # The debts among ``taken`` (already reported as overshoot).
    debts: tuple[int, ...]
    flight: Flight
    # The entries of ``prepared.checks``, in order: a reply lands on these, even if the
    # cache dropped them meanwhile (a reset).
    entries: tuple[_Entry, ...]


@dataclass(frozen=True, slots=True)
class Flush:
    """After a denied batch: the pending requests that still fit, and what stays pending."""

    sync: Sync
    prepared: Prepared | None
    left: tuple[int, ...] = field(default=())
    fits: tuple[int, ...] = field(default=())
    # Which of the sync's checks ``prepared`` holds (those with something that fits).
    index: tuple[int, ...] = field(default=())
    sent: float = 0.0


# What begin() answers: decide locally; run a sync; wait for a sync in flight; or ask
# Redis about the request alone (None).
Step = Decision | Sync | Flight | None


class ApproxCache:
    """Local pending counts and last known results, shared by both shells."""

    def __init__(
        self,
        core: Core,
        clock: Callable[[], float],
        overshoot: Callable[[str, str, int], None] | None = None,
    ) -> None:
        """``core`` builds the batch plans; ``clock`` gives seconds (the test clock in
        tests); ``overshoot(limit, tier, count)`` hears of requests a sync found were
        admitted over the limit (called outside the lock, never for a count of 0)."""
        self.core = core
        self.clock = clock
        self.overshoot = overshoot
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._lock = threading.Lock()
        # New keys refused while the cache was full (see _entry).
        self._refused = 0

    @staticmethod
    def applies(prepared: Prepared) -> bool:
        """True for a ``hit`` whose every check is of an approximate limit."""
        return (
            prepared.operation == "hit"
            and bool(prepared.checks)
            and all(c.rule.approximate for c in prepared.checks)
        )

    def begin(self, prepared: Prepared) -> Step:
        """A local decision; or the sync to run (the pending counts it carries move to
        its flight); or a sync in flight to wait for, then begin again; or None: ask
        Redis about the request alone."""
        now = self.clock()
        cost = prepared.cost
        checks = prepared.checks
        with self._lock:
            if len(checks) == 1:
                # One check (most limits) that fits: what the code below does for one,
                # without its lists and generators (docs/benchmarks-compare.md, "Why
                # each speed trick stays"). When it does not fit, the code below takes it
                # from the start.
                only = self._entry(checks[0])
                if only is not None and self._fits(checks[0], only, cost, now):
                    only.pending += cost
                    return single(self._local(only, now))
            found = [self._entry(c) for c in checks]
            entries = [e for e in found if e is not None]
            if len(entries) < len(found):
                return None
            pairs = list(zip(checks, entries, strict=True))
            if all(self._fits(c, e, cost, now) for c, e in pairs):
                results = []
                for entry in entries:
                    entry.pending += cost
                    results.append(self._local(entry, now))
                return combine(results)
            flight = next((e.flight for e in entries if e.flight is not None), None)
            if flight is not None:
                if flight.waiting < min(
                    WAIT_ROUNDS * (c.rule.sync_every - 1) for c in checks
                ) and all(self._worth_waiting(c, e, cost) for c, e in pairs):
                    flight.waiting += 1
                    return flight
                return None
            flight = Flight(self._lock)
            taken = tuple(e.pending for e in entries)
            debts = tuple(e.debt for e in entries)
            for check, entry in pairs:
                # Carried by the batch from now on: still uncounted, so still in the
                # bound, and its request's cost is what the batch may take as well.
                entry.flight = flight
                entry.carried = entry.pending
                entry.claim = entry.pending + check.cost
                entry.pending = 0
                entry.debt = 0
        batch = prepared
        if any(taken):
            batch = self.core.prepare(
                "hit", [replace(c, cost=c.cost + p) for c, p in zip(checks, taken, strict=True)]
            )
        return Sync(prepared, batch, taken, now, debts, flight, tuple(entries))

    def settle(self, sync: Sync, decision: Decision) -> Flush | None:
        """Take in the batch's decision; a Flush when pending requests are left to count
        (the sync is still in flight until :meth:`flushed`)."""
        if decision.degraded:
            # Redis did not answer: nothing is known to be counted.
            self._land(sync, sync.taken, sync.debts)
            return None
        with self._lock:
            for entry, result in zip(sync.entries, decision.results, strict=True):
                self._take_in(entry, result, sync.sent)
        if decision.allowed or not any(sync.taken):
            self._land(sync, (0,) * len(sync.taken), sync.debts)
            return None
        fits = []
        left = []
        for p, result in zip(sync.taken, decision.results, strict=True):
            n = p if result.shadow else min(p, result.remaining)
            fits.append(n)
            left.append(p - n)
        checks = sync.prepared.checks
        index = tuple(i for i, n in enumerate(fits) if n > 0)
        flush = (
            self.core.prepare("hit", [replace(checks[i], cost=fits[i]) for i in index])
            if index
            else None
        )
        return Flush(sync, flush, tuple(left), tuple(fits), index, self.clock())

    def flushed(self, flush: Flush, decision: Decision | None) -> bool:
        """Take in the flush's outcome (the sync lands); True when nothing is left
        pending (ask Redis)."""
        sync = flush.sync
        checks = sync.prepared.checks
        left = flush.left
        # What is known to be over the limit: what the batch showed did not fit.
        over = left
        if flush.prepared is not None and decision is not None:
            if decision.degraded:
                # Redis did not answer (an allowed degraded decision counted nothing
                # either): all of it stays pending.
                left = sync.taken
            else:
                with self._lock:
                    for i, result in zip(flush.index, decision.results, strict=True):
                        self._take_in(sync.entries[i], result, flush.sent)
                if not decision.allowed:
                    # Others took some of the room meanwhile: nothing was counted, and
                    # what does not fit in what they left is over the limit; the rest
                    # stays pending, for the next sync to count or find over.
                    beyond = list(left)
                    for i, result in zip(flush.index, decision.results, strict=True):
                        p = sync.taken[i]
                        beyond[i] = 0 if result.shadow else p - min(p, result.remaining)
                    left, over = sync.taken, tuple(beyond)
        # What was reported before (the debt) stays reported while it is pending: what was
        # counted is taken from the rest first, so a request is reported once, and only
        # while it is not counted; what is over beyond the debt is reported now.
        kept = tuple(min(d, n) for d, n in zip(sync.debts, left, strict=True))
        debts = tuple(max(o, k) for o, k in zip(over, kept, strict=True))
        self._land(sync, left, debts)
        self._report(checks, [d - k for d, k in zip(debts, kept, strict=True)])
        return not any(left)

    def abandon(self, sync: Sync) -> None:
        """The decision of ``sync`` stopped before its reply was taken in (a cancelled
        task, an exception): what it carried goes back to pending, to be counted by a
        later sync (if Redis had counted it already, it is counted twice: the limit errs
        towards denying, never past the bound)."""
        if not sync.flight.landed:
            self._land(sync, sync.taken, sync.debts)

    def learn(self, prepared: Prepared, decision: Decision, sent: float) -> None:
        """Take in an exact decision about ``prepared`` (the request alone), sent at
        ``sent`` (by this cache's clock)."""
        if decision.degraded:
            return
        with self._lock:
            for check, result in zip(prepared.checks, decision.results, strict=True):
                entry = self._entry(check)
                if entry is not None:
                    self._take_in(entry, result, sent)

    def forget(self, keys: list[str], tiers: tuple[str, ...]) -> None:
        """Drop the entries of ``keys`` (after a local ``reset()``)."""
        with self._lock:
            for key in keys:
                for tier in tiers:
                    self._entries.pop((key, tier), None)

    # -- internals ----------------------------------------------------------------------

    def _entry(self, check: Check) -> _Entry | None:
        """The entry of ``check``'s key (made if new); None when the cache is full of
        entries holding uncounted units."""
        key = (check.key, check.tier)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= MAX_ENTRIES:
                if self._refused % _PRUNE_EVERY == 0:
                    self._entries = {
                        k: e for k, e in self._entries.items() if e.pending or e.flight is not None
                    }
                if len(self._entries) >= MAX_ENTRIES:
                    self._refused += 1
                    return None
                self._refused = 0
            entry = self._entries[key] = _Entry()
        return entry

    @staticmethod
    def _fits(check: Check, entry: _Entry, cost: int, now: float) -> bool:
        rule = check.rule
        # (A nanosecond of slack: seconds as floats can round an exact interval down.)
        if entry.result is None or now - entry.synced >= rule.sync_interval - 1e-9:
            return False
        # The bound: what this key holds uncounted stays below sync_every.
        if entry.pending + entry.carried + cost >= rule.sync_every:
            return False
        if entry.result.shadow:
            return True
        return entry.result.remaining - entry.pending - entry.claim >= cost

    @staticmethod
    def _worth_waiting(check: Check, entry: _Entry, cost: int) -> bool:
        """Whether the request may be answered locally once the sync in flight lands:
        its cost is below ``sync_every`` and, as far as is known, the sync leaves room."""
        if cost >= check.rule.sync_every:
            return False
        result = entry.result
        if result is None or result.shadow:
            return True
        return result.remaining - entry.pending - entry.claim >= cost

    @staticmethod
    def _take_in(entry: _Entry, result: LimitResult, sent: float) -> None:
        """Keep ``result`` (under the lock) unless the entry holds one sent later."""
        if sent >= entry.synced:
            entry.result = result
            entry.synced = sent

    @staticmethod
    def _local(entry: _Entry, now: float) -> LimitResult:
        result = entry.result
        assert result is not None
        # Every field in order, built directly: dataclasses.replace() goes through the
        # frozen class's __init__ by keyword, about 3% of an approximate request's time
        # under uvicorn (py-spy), for a result made on nearly every request.
        return make_result(
            result.name,
            result.tier,
            result.algorithm,
            result.quota,
            result.window,
            True,
            True,
            max(0, result.remaining - entry.pending - entry.claim),
            max(0.0, result.reset_after - (now - entry.synced)),
            None,
            result.shadow,
        )

    def _land(self, sync: Sync, counts: Sequence[int], debts: Sequence[int]) -> None:
        """The sync lands: ``counts`` of what it carried (those Redis did not count) go
        back to pending, their ``debts`` with them, and whoever waits for it is woken."""
        flight = sync.flight
        with self._lock:
            if flight.landed:
                return
            for entry, n, debt in zip(sync.entries, counts, debts, strict=True):
                if n:
                    entry.pending += n
                    entry.debt += min(n, debt)
                if entry.flight is flight:
                    entry.flight = None
                    entry.carried = 0
                    entry.claim = 0
            wake = flight.land()
        if wake is not None:
            wake()

    def _report(self, checks: tuple[Check, ...], counts: Sequence[int]) -> None:
        """Tell ``overshoot`` of the requests newly found over each limit and tier. The
        rates of one tier hold the same requests: the most any of them found is the
        count (not their sum)."""
        report = self.overshoot
        if report is None or not any(counts):
            return
        found: dict[tuple[str, str], int] = {}
        for check, n in zip(checks, counts, strict=True):
            pair = (check.rule.name, check.tier)
            found[pair] = max(found.get(pair, 0), n)
        for (limit, tier), n in found.items():
            if n:
                report(limit, tier, n)
