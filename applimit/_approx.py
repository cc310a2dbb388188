"""Approximate mode: requests counted locally and sent to Redis in batches.

For a limit with ``mode: approximate`` each limiter instance keeps, per state key and tier,
the last result Redis gave (its ``remaining``) and a *pending* count: requests this
instance admitted that Redis has not counted yet. A ``hit`` whose every check is
approximate is admitted locally when, for every check, the last known remaining minus the
pending count still fits the cost, the pending count stays below ``sync_every``, and less
than ``sync_interval`` has passed since that key last synced. Otherwise the instance
*syncs*: it sends the script one call with cost = pending + the request's cost per check
(one atomic batch), and the reply refreshes what it knows.

When the batch is denied (the limit is exhausted, or nearly), the pending requests were
already admitted and must still be counted: the instance sends what fits of them (the
reply's ``remaining``) as a second call, keeps any rest as pending (a debt paid by the
next sync, which is denied until it fits), and when nothing is left pending asks Redis
about the request alone, so a denial is Redis' own answer. A request that also matches an
exact limit, a ``peek`` and a ``reset`` go to Redis as in exact mode.

Bound (docs/applimit.md): pending never exceeds ``sync_every - 1`` requests (cost units)
per key and instance, so at any moment K instances hold at most K x (sync_every - 1)
admitted requests Redis has not counted; every one of them is counted later. Per window
of the limit the requests admitted beyond what Redis allows are therefore at most
K x (sync_every - 1).

Overshoot: pending requests that a denied batch shows did not fit (Redis' room was
smaller than what this instance had admitted) were admitted over the limit. Each is
reported once, through ``overshoot(limit, tier, count)``, when a sync first finds it over;
it stays pending as a *debt* (``_Entry.debt``) so a later sync that still cannot count it
does not report it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ._core import Check, Core, Prepared
from ._decision import Decision, LimitResult, combine, make_result, single

# Entries beyond this many are dropped (oldest sync first would need ordering; the cache
# starts over, which only costs Redis calls and forgets at most sync_every - 1 per key).
MAX_ENTRIES = 100_000


@dataclass(slots=True)
class _Entry:
    """What this instance knows of one (state key, tier)."""

    result: LimitResult | None = None
    synced: float = float("-inf")
    pending: int = 0
    # The part of ``pending`` already reported as overshoot (the oldest part).
    debt: int = 0


@dataclass(frozen=True, slots=True)
class Sync:
    """A sync to run: ``batch`` carries the pending counts ``taken`` plus the request."""

    prepared: Prepared
    batch: Prepared
    taken: tuple[int, ...]
    sent: float
    # The debts among ``taken`` (already reported as overshoot).
    debts: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Flush:
    """After a denied batch: the pending requests that still fit, and what stays pending."""

    sync: Sync
    prepared: Prepared | None
    left: tuple[int, ...] = field(default=())
    fits: tuple[int, ...] = field(default=())


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

    @staticmethod
    def applies(prepared: Prepared) -> bool:
        """True for a ``hit`` whose every check is of an approximate limit."""
        return (
            prepared.operation == "hit"
            and bool(prepared.checks)
            and all(c.rule.approximate for c in prepared.checks)
        )

    def begin(self, prepared: Prepared) -> Decision | Sync:
        """A local decision, or the sync to run (pending counts are taken out meanwhile)."""
        now = self.clock()
        cost = prepared.cost
        with self._lock:
            if len(prepared.checks) == 1:
                # One check (most limits) that fits: what the loop below does for one,
                # without its lists and generator (about 1 µs of a local decision's ~16).
                # When it does not fit, the loop below takes it from the start.
                only = prepared.checks[0]
                entry = self._entry(only)
                if self._fits(only, entry, cost, now):
                    entry.pending += cost
                    return single(self._local(entry, now))
            entries = [self._entry(c) for c in prepared.checks]
            if all(
                self._fits(c, e, cost, now) for c, e in zip(prepared.checks, entries, strict=True)
            ):
                results = []
                for entry in entries:
                    entry.pending += cost
                    results.append(self._local(entry, now))
                return combine(results)
            taken = tuple(e.pending for e in entries)
            debts = tuple(e.debt for e in entries)
            for entry in entries:
                # Counted by the batch from now on: the local view stays as low as it was.
                if entry.result is not None:
                    entry.result = replace(
                        entry.result, remaining=max(0, entry.result.remaining - entry.pending)
                    )
                entry.pending = 0
                entry.debt = 0
        if not any(taken):
            return Sync(prepared, prepared, taken, now, debts)
        checks = [replace(c, cost=c.cost + p) for c, p in zip(prepared.checks, taken, strict=True)]
        return Sync(prepared, self.core.prepare("hit", checks), taken, now, debts)

    def settle(self, sync: Sync, decision: Decision) -> Flush | None:
        """Take in the batch's decision; a Flush when pending requests are left to count."""
        if decision.degraded:
            self._restore(sync.prepared.checks, sync.taken, sync.debts)
            return None
        self._learn(sync.prepared.checks, decision, sync.sent)
        if decision.allowed or not any(sync.taken):
            return None
        fits = []
        left = []
        for p, result in zip(sync.taken, decision.results, strict=True):
            n = p if result.shadow else min(p, result.remaining)
            fits.append(n)
            left.append(p - n)
        checks = [
            replace(c, cost=n) for c, n in zip(sync.prepared.checks, fits, strict=True) if n > 0
        ]
        flush = self.core.prepare("hit", checks) if checks else None
        return Flush(sync, flush, tuple(left), tuple(fits))

    def flushed(self, flush: Flush, decision: Decision | None) -> bool:
        """Take in the flush's outcome; True when nothing is left pending (ask Redis)."""
        sync = flush.sync
        checks = sync.prepared.checks
        left = flush.left
        # What the flush counted: what fit, unless it was not counted.
        counted = flush.fits
        over = left
        if flush.prepared is not None and decision is not None:
            if decision.degraded:
                # Redis did not answer (an allowed degraded decision counted nothing
                # either): all of it stays pending; only what the batch showed did not
                # fit is known to be over.
                left, counted = sync.taken, (0,) * len(left)
            elif not decision.allowed:
                # Others took the room meanwhile: nothing was counted and all of it is
                # over the limit.
                left = over = sync.taken
                counted = (0,) * len(left)
        # The debt left unpaid is the oldest part of what was not counted; the rest of
        # what is over was admitted since the last sync and is reported now.
        kept = tuple(max(0, d - c) for d, c in zip(sync.debts, counted, strict=True))
        debts = tuple(max(o, k) for o, k in zip(over, kept, strict=True))
        self._restore(checks, left, debts)
        self._report(checks, [d - k for d, k in zip(debts, kept, strict=True)])
        return not any(left)

    def learn(self, prepared: Prepared, decision: Decision) -> None:
        """Take in an exact decision about ``prepared`` (the request alone)."""
        if not decision.degraded:
            self._learn(prepared.checks, decision, self.clock())

    def forget(self, keys: list[str], tiers: tuple[str, ...]) -> None:
        """Drop the entries of ``keys`` (after a local ``reset()``)."""
        with self._lock:
            for key in keys:
                for tier in tiers:
                    self._entries.pop((key, tier), None)

    # -- internals ----------------------------------------------------------------------

    def _entry(self, check: Check) -> _Entry:
        key = (check.key, check.tier)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries = {k: e for k, e in self._entries.items() if e.pending}
                if len(self._entries) >= MAX_ENTRIES:
                    self._entries = {}
            entry = self._entries[key] = _Entry()
        return entry

    @staticmethod
    def _fits(check: Check, entry: _Entry, cost: int, now: float) -> bool:
        rule = check.rule
        # (A nanosecond of slack: seconds as floats can round an exact interval down.)
        if entry.result is None or now - entry.synced >= rule.sync_interval - 1e-9:
            return False
        if entry.pending + cost >= rule.sync_every:
            return False
        if entry.result.shadow:
            return True
        return entry.result.remaining - entry.pending >= cost

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
            max(0, result.remaining - entry.pending),
            max(0.0, result.reset_after - (now - entry.synced)),
            None,
            result.shadow,
        )

    def _learn(self, checks: tuple[Check, ...], decision: Decision, sent: float) -> None:
        with self._lock:
            for check, result in zip(checks, decision.results, strict=True):
                entry = self._entry(check)
                entry.result = result
                entry.synced = sent

    def _restore(
        self, checks: tuple[Check, ...], counts: tuple[int, ...], debts: tuple[int, ...]
    ) -> None:
        with self._lock:
            for check, n, debt in zip(checks, counts, debts, strict=True):
                if n:
                    entry = self._entry(check)
                    entry.pending += n
                    entry.debt += min(n, debt)

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
