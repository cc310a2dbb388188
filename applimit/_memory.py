"""The ``memory://`` backend: the limiter's script, run on Python objects in this process.

For tests and single-process tools that should not need a Redis server. Only the wire is
replaced: the core still builds the same :class:`~applimit._core.ScriptCall` objects
(``hit``, ``peek``, ``refund``, the ARGV layout of ``decide.lua``) and parses the same
replies, so the decision flow, the denial cache, approximate mode and every reply parser
are the ones that run against Redis. :class:`MemoryStore` executes a call the way
``applimit/lua/decide.lua`` does: phase 1 checks every limit without writing, phase 2 (a
hit that every enforced check admits) applies the checks that passed, and the reply is
``[now, n, allowed, consumed, remaining, reset µs, retry µs, ...]``. The three algorithms
are ported from their Lua files line by line and keep the Lua names in comments, so a
change to one is easy to carry to the other; the contract and property suites run on
both backends to keep them equal.

What differs from Redis, on purpose:

- **One process.** A store lives in this process's memory: two processes, or two app
  servers, never share counts. ``memory://`` is for tests and development only.
- **Time.** Redis reads its own clock (TIME); the store reads :func:`now_us`: the
  process's ``time.time()`` unless a test installed another clock (:func:`use_clock`, what
  the pytest plugin's ``applimit_clock`` does). A limiter's ``test_clock`` passes its time
  in the call, as it does to Redis.
- **Expiry** counts in the script's time (the call's ``now``) rather than the server's
  wall clock. A key expires only once its state no longer changes any decision, so this
  changes no answer; it only bounds memory.
- **No older key formats.** The Lua converts members written by applimit 0.1; nothing
  older ever wrote to a store, so there is nothing to convert. Sliding-log starts are
  Python integers, which never lose precision, so they are never rebased.

Stores are named by the URL (``memory://`` is the process's default store,
``memory://name`` another one): limiters built on the same URL share counts, as they
would on one Redis. A store is thread-safe (one lock per call: a call is atomic, as a
script is in Redis); the async wire runs a call without awaiting, so it is atomic on its
event loop as well.
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Protocol

import redis.exceptions

from ._calls import ScriptCall
from ._errors import CLOSED, ApplimitError

NONE = -1  # "admitted, no wait" (common.lua)
NEVER = -2  # "can never be admitted"
# A store drops expired keys on access, and all of them every this many calls.
_SWEEP_EVERY = 1024

_Clock = Callable[[], float]
_clock: _Clock = time.time


def now_us() -> int:
    """The stores' time in integer microseconds: what Redis' TIME is to the script."""
    return round(_clock() * 1_000_000)


def now_seconds() -> float:
    """The stores' time in seconds (the limiter's local clock on this backend)."""
    return _clock()


@contextmanager
def use_clock(clock: _Clock) -> Iterator[None]:
    """Make ``clock`` (seconds, like ``time.time``) the time of every store while the
    block runs: the "server clock" of the memory backend, which tests move by hand."""
    global _clock
    previous, _clock = _clock, clock
    try:
        yield
    finally:
        _clock = previous


# --- common.lua ----------------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers (Python's // is already an exact floor: idiv)."""
    return -(-a // b)


def _expiry_cell(t: int, g: int) -> int:
    """The cell of a grid of ``g`` µs that the time ``t`` expires in."""
    return t // g + 1


def _cell_ttl_ms(cell: int, g: int, now: int, slack_ms: int) -> int:
    """The PEXPIRE (ms from now) that ends the key with cell ``cell`` of a grid of ``g``."""
    return _cdiv(cell * g - now, 1000) + slack_ms


@dataclass(slots=True)
class _Check:
    """One check of a call, as decide.lua reads it from ARGV."""

    algorithm: str
    limit: int
    period: int
    cost: int
    burst: int
    shadow: bool


@dataclass(slots=True)
class _State:
    """What a check found (decide.lua's ``st``); the algorithm's own fields in ``extra``."""

    allowed: int = 0
    consumed: int = 0
    remaining: int = 0
    reset: int = 0
    retry: int = NONE


# --- the values held per key ---------------------------------------------------------------


@dataclass(slots=True)
class _Log:
    """A sliding log (Redis: a sorted set). ``scores[i]`` is entry i's admission time;
    ``entries[i]`` its (start, cost, nonce). Scores never decrease, so list order is the
    sorted set's order (by score, then by start)."""

    scores: list[int] = field(default_factory=list)
    entries: list[tuple[int, int, str]] = field(default_factory=list)


@dataclass(slots=True)
class _Window:
    """A sliding window's hash: w (current window), c (its count), p (the previous one's)."""

    w: int
    c: int
    p: int


@dataclass(slots=True)
class _Tat:
    """A GCRA value: TAT = tat + frac / limit µs; ``grid`` is the leading-0 mark."""

    tat: int
    frac: int
    grid: bool


class _Holder(Protocol):
    """A limiter on a store: it keeps local answers (denial cache, approximate counts) that
    must go when the store is cleared."""

    def forget_local(self) -> None:
        """Drop every local answer."""


class MemoryStore:
    """Keys and their values, and the execution of the limiter's script calls on them."""

    def __init__(self) -> None:
        # The limiters deciding on this store (weakly: a store outlives its limiters).
        self._holders: weakref.WeakSet[_Holder] = weakref.WeakSet()
        self._data: dict[str, _Log | _Window | _Tat] = {}
        # Key -> when it expires, in the script's µs (no entry: no TTL).
        self._expiry: dict[str, int] = {}
        self._lock = threading.Lock()
        #: How many script calls the store has run (tests count them as they count
        #: Redis' commandstats).
        self.calls = 0

    # -- keys -----------------------------------------------------------------------------

    def attach(self, holder: _Holder) -> None:
        """Tell ``holder`` (a limiter) to drop its local answers when the store is cleared."""
        self._holders.add(holder)

    def clear(self) -> None:
        """Forget every key (FLUSHALL), and what the limiters on the store hold locally:
        a denial cached before the clear would otherwise outlive the count it came from."""
        with self._lock:
            self._data.clear()
            self._expiry.clear()
        for holder in list(self._holders):
            holder.forget_local()

    def delete(self, keys: Sequence[str]) -> None:
        """DEL ``keys``."""
        with self._lock:
            for key in keys:
                self._data.pop(key, None)
                self._expiry.pop(key, None)

    def keys(self, pattern: str = "*") -> list[str]:
        """The keys that match the glob ``pattern`` (KEYS), expired ones included until
        they are next read."""
        with self._lock:
            return [key for key in self._data if fnmatchcase(key, pattern)]

    def value(self, key: str) -> _Log | _Window | _Tat | None:
        """The value held at ``key`` (for tests that look at the state)."""
        with self._lock:
            return self._data.get(key)

    def _get(self, key: str, now: int) -> _Log | _Window | _Tat | None:
        expires = self._expiry.get(key)
        if expires is not None and expires <= now:
            del self._data[key], self._expiry[key]
            return None
        return self._data.get(key)

    def _set(self, key: str, value: _Log | _Window | _Tat, ttl_ms: int | None, now: int) -> None:
        """SET/HSET/ZADD, and PEXPIRE when ``ttl_ms`` is given (None: KEEPTTL)."""
        self._data[key] = value
        if ttl_ms is not None:
            self._pexpire(key, ttl_ms, now)

    def _pexpire(self, key: str, ttl_ms: int, now: int) -> None:
        if ttl_ms <= 0:
            # As in Redis: a TTL in the past deletes the key.
            self._data.pop(key, None)
            self._expiry.pop(key, None)
        else:
            self._expiry[key] = now + ttl_ms * 1000

    def _del(self, key: str) -> None:
        self._data.pop(key, None)
        self._expiry.pop(key, None)

    def _sweep(self, now: int) -> None:
        """Drop every expired key (Redis' active expiry)."""
        gone = [key for key, at in self._expiry.items() if at <= now]
        for key in gone:
            self._del(key)

    def _decide(
        self,
        keys: Sequence[str],
        checks: list[_Check],
        mode: str,
        *,
        now: int,
        nonce: str,
        slack_ms: int,
    ) -> list[_State]:
        """Phase 1, every check without writing; phase 2 (a hit that every enforced
        check admits), the writes of the checks that passed (shadow ones included)."""
        states: list[_State] = []
        passed = True
        for key, check in zip(keys, checks, strict=True):
            st = _ALGORITHMS[check.algorithm].check(self, key, now, check)
            states.append(st)
            if st.allowed == 0 and not check.shadow:
                passed = False
        if mode == "hit" and passed:
            for key, check, st in zip(keys, checks, states, strict=True):
                if st.allowed == 1:
                    _ALGORITHMS[check.algorithm].apply(
                        self, key, st, check, now=now, nonce=nonce, slack_ms=slack_ms
                    )
                    st.consumed = 1
        return states

    # -- decide.lua -----------------------------------------------------------------------

    def execute(self, call: ScriptCall) -> object:
        """The reply of one script call, or its error reply as a value (a
        ``redis.exceptions.ResponseError``, as a Redis wire hands it back)."""
        args = call.args
        mode = args[0]
        nonce = args[2]
        slack_ms = int(args[3])
        checks = _parse_checks(args)
        if isinstance(checks, BaseException):
            return checks
        n = len(checks)
        with self._lock:
            # Read under the lock, as TIME is read inside the script: calls are serial.
            now = int(args[1]) if args[1] != "" else now_us()
            self.calls += 1
            if self.calls % _SWEEP_EVERY == 0:
                self._sweep(now)
            if mode == "refund":
                for key, check in zip(call.keys, checks, strict=True):
                    _ALGORITHMS[check.algorithm].refund(self, key, now, check, nonce)
                return [now, n]
            states = self._decide(call.keys, checks, mode, now=now, nonce=nonce, slack_ms=slack_ms)
        out: list[int] = [now, n]
        for st in states:
            out += (st.allowed, st.consumed, st.remaining, st.reset, st.retry)
        return out


class _Algorithm(ABC):
    """What each algorithm file registers in ALG (see its Lua contract)."""

    @staticmethod
    @abstractmethod
    def check(store: MemoryStore, key: str, now: int, c: _Check) -> _State:
        """The check's state at ``now``, read only."""
        ...

    @staticmethod
    @abstractmethod
    def apply(
        store: MemoryStore, key: str, st: _State, c: _Check, *, now: int, nonce: str, slack_ms: int
    ) -> None:
        """Consume what ``check`` found to fit; ``st`` gets the numbers after it."""
        ...

    @staticmethod
    @abstractmethod
    def refund(store: MemoryStore, key: str, now: int, c: _Check, nonce: str) -> None:
        """Undo an earlier apply that used ``nonce`` at ``now``."""
        ...


def _parse_checks(args: tuple[str, ...]) -> list[_Check] | BaseException:
    """The checks of a call from their specs (decide.lua's ``checks``, common.lua's
    ``spec_of``), or the error reply for a malformed spec or an algorithm the script does
    not know."""
    checks: list[_Check] = []
    for spec in args[5 : 5 + int(args[4])]:
        match = _SPEC.fullmatch(spec)
        if match is None:
            # Redis turns line breaks in an error reply into spaces.
            shown = spec.replace("\r", " ").replace("\n", " ")
            return redis.exceptions.ResponseError(f"applimit: malformed check {shown}")
        algorithm, limit, period, cost, burst, shadow = match.groups()
        if algorithm not in _ALGORITHMS:
            return redis.exceptions.ResponseError(f"applimit: unknown algorithm {algorithm}")
        checks.append(
            _Check(algorithm, int(limit), int(period), int(cost), int(burst), shadow == "1")
        )
    return checks


# A check's spec, as common.lua's spec_of matches it ([0-9], not \d: Lua's %d is ASCII).
_SPEC = re.compile(r"([a-z_]+) ([0-9]+) ([0-9]+) ([0-9]+) ([0-9]+) ([01])")


# --- sliding_log.lua -----------------------------------------------------------------------


@dataclass(slots=True)
class _LogState(_State):
    newest: int | None = None
    grid: bool = False
    floor: int = 0
    trim: bool = False
    start: int = 0
    count: int = 0


# sliding_log.lua's TRIM_EVERY.
_TRIM_EVERY = 16


class _SlidingLog(_Algorithm):
    @staticmethod
    def check(store: MemoryStore, key: str, now: int, c: _Check) -> _State:
        floor = now - c.period
        st = _LogState(floor=floor)
        log = store._get(key, now)
        first_start = first_cost = first_score = first_rank = 0
        if isinstance(log, _Log) and log.scores:
            # Every member is this version's, so the TTL is on the grid (st.grid).
            st.newest, st.grid = log.scores[-1], True
            if st.newest > floor:
                start, cost, _ = log.entries[-1]
                st.start = start + cost
                # The window's oldest entry; entries before it may remain (see apply).
                first_rank = bisect_right(log.scores, floor)
                first_start, first_cost, _ = log.entries[first_rank]
                first_score = log.scores[first_rank]
                st.count = st.start - first_start
            else:
                st.trim = True
        count = st.count
        if c.cost <= c.limit - count:
            st.allowed = 1
        elif c.cost > c.limit:
            st.retry = NEVER
        else:
            # Fits once the oldest entry whose start + cost reaches first_start + need
            # has left the window (log_reaching: a binary search by rank).
            need = count + c.cost - c.limit
            at = first_score
            if first_cost < need:
                assert isinstance(log, _Log)
                lo, hi = first_rank + 1, len(log.scores) - 1
                target = first_start + need
                while lo < hi:
                    mid = (lo + hi) // 2
                    start, cost, _ = log.entries[mid]
                    if start + cost >= target:
                        hi = mid
                    else:
                        lo = mid + 1
                at = log.scores[lo]
            st.retry = at + c.period - now
        st.remaining = c.limit - count
        st.reset = 0
        if count > 0:
            assert st.newest is not None
            st.reset = st.newest + c.period - now
        return st

    @staticmethod
    def apply(
        store: MemoryStore, key: str, st: _State, c: _Check, *, now: int, nonce: str, slack_ms: int
    ) -> None:
        assert isinstance(st, _LogState)
        # Scored no earlier than the newest entry, so list order stays admission order.
        score = now
        if st.newest is not None and st.newest > now:
            score = st.newest
        log = store._get(key, now)
        if not isinstance(log, _Log):
            log = _Log()
            store._data[key] = log
        log.scores.append(score)
        log.entries.append((st.start, c.cost, nonce))
        # Everything at or before the window's floor (ZREMRANGEBYSCORE -inf floor), when
        # nothing else is in the window, and else each time the starts cross a multiple of
        # _TRIM_EVERY units (of the limit, when smaller), as sliding_log.lua trims.
        every = min(_TRIM_EVERY, c.limit)
        if st.trim or (st.start + c.cost) // every != st.start // every:
            gone = bisect_right(log.scores, st.floor)
            del log.scores[:gone], log.entries[:gone]
        st.count += c.cost
        st.remaining = c.limit - st.count
        st.reset = score + c.period - now
        cell = _expiry_cell(score + c.period, c.period)
        if not st.grid or st.newest is None or _expiry_cell(st.newest + c.period, c.period) != cell:
            store._pexpire(key, _cell_ttl_ms(cell, c.period, now, slack_ms), now)

    @staticmethod
    def refund(store: MemoryStore, key: str, now: int, c: _Check, nonce: str) -> None:
        log = store._get(key, now)
        if not isinstance(log, _Log):
            return
        # Entries scored `now` (the hit's time) or later; those after the refunded one
        # start `cost` units earlier once it is gone.
        first = bisect_right(log.scores, now - 1)
        for rank in range(first, len(log.entries)):
            _, cost, tail = log.entries[rank]
            if tail == nonce:
                del log.scores[rank], log.entries[rank]
                for later in range(rank, len(log.entries)):
                    s, units, t = log.entries[later]
                    log.entries[later] = (s - cost, units, t)
                break
        if not log.scores:
            # Redis deletes a sorted set whose last member goes.
            store._del(key)


# --- sliding_window.lua --------------------------------------------------------------------


@dataclass(slots=True)
class _WindowState(_State):
    window: int = 0
    stored: int | None = None
    cur: int = 0
    prev: int = 0
    elapsed: int = 0


class _SlidingWindow(_Algorithm):
    @staticmethod
    def check(store: MemoryStore, key: str, now: int, c: _Check) -> _State:
        period = c.period
        window = now // period
        value = store._get(key, now)
        stored = value.w if isinstance(value, _Window) else None
        cur = prev = 0
        if isinstance(value, _Window):
            if value.w == window:
                cur, prev = value.c, value.p
            elif value.w == window - 1:
                cur, prev = 0, value.c
            elif value.w > window:
                # The clock went back across a window edge: keep counting in the stored
                # window, the previous one at full weight.
                window = value.w
                cur, prev = value.c, value.p
        elapsed = max(0, now - window * period)
        used = prev * (period - elapsed) + cur * period
        full = c.limit * period
        st = _WindowState(window=window, stored=stored, cur=cur, prev=prev, elapsed=elapsed)
        if used + c.cost * period <= full:
            st.allowed = 1
        elif c.cost > c.limit:
            st.retry = NEVER
        else:
            room = c.limit - cur - c.cost
            if room >= 0 and prev > 0:
                st.retry = period - (room * period) // prev - elapsed
            else:
                at = max(0, period - ((c.limit - c.cost) * period) // cur)
                st.retry = period - elapsed + at
        st.remaining = max(0, (full - used) // period)
        st.reset = 0
        if cur > 0:
            st.reset = 2 * period - elapsed
        elif prev > 0:
            st.reset = period - elapsed
        return st

    @staticmethod
    def apply(
        store: MemoryStore, key: str, st: _State, c: _Check, *, now: int, nonce: str, slack_ms: int
    ) -> None:
        assert isinstance(st, _WindowState)
        period = c.period
        st.cur += c.cost
        ttl = None
        if st.stored != st.window:
            # The TTL is set once per window, by its first write.
            ttl = _cell_ttl_ms(st.window + 2, period, now, slack_ms)
        store._set(key, _Window(st.window, st.cur, st.prev), ttl, now)
        used = st.prev * (period - st.elapsed) + st.cur * period
        st.remaining = max(0, (c.limit * period - used) // period)
        st.reset = 2 * period - st.elapsed

    @staticmethod
    def refund(store: MemoryStore, key: str, now: int, c: _Check, nonce: str) -> None:
        window = now // c.period
        value = store._get(key, now)
        if not isinstance(value, _Window):
            return
        if value.w == window:
            value.c = max(0, value.c - c.cost)
        elif value.w == window + 1:
            value.p = max(0, value.p - c.cost)


# --- gcra.lua ------------------------------------------------------------------------------


@dataclass(slots=True)
class _GcraState(_State):
    ahead: int = 0
    after: int = 0
    tat: int | None = None


class _Gcra(_Algorithm):
    @staticmethod
    def _load(store: MemoryStore, key: str, now: int, c: _Check) -> tuple[int, int | None]:
        value = store._get(key, now)
        if not isinstance(value, _Tat):
            return 0, None
        ahead = (value.tat - now) * c.limit + value.frac
        tat = value.tat if value.grid else None
        return max(0, ahead), tat

    @staticmethod
    def check(store: MemoryStore, key: str, now: int, c: _Check) -> _State:
        ahead, tat = _Gcra._load(store, key, now, c)
        capacity = c.burst * c.period
        after = ahead + c.cost * c.period
        st = _GcraState(ahead=ahead, after=after, tat=tat)
        if after <= capacity:
            st.allowed = 1
        elif c.cost > c.burst:
            st.retry = NEVER
        else:
            st.retry = _cdiv(after - capacity, c.limit)
        st.remaining = (capacity - ahead) // c.period
        st.reset = _cdiv(ahead, c.limit)
        return st

    @staticmethod
    def apply(
        store: MemoryStore, key: str, st: _State, c: _Check, *, now: int, nonce: str, slack_ms: int
    ) -> None:
        assert isinstance(st, _GcraState)
        whole = st.after // c.limit
        frac = st.after - whole * c.limit
        tat = now + whole
        cell = _expiry_cell(tat + 1, c.period)
        ttl = None
        if st.tat is None or _expiry_cell(st.tat + 1, c.period) != cell:
            ttl = _cell_ttl_ms(cell, c.period, now, slack_ms)
        store._set(key, _Tat(tat, frac, True), ttl, now)
        st.remaining = (c.burst * c.period - st.after) // c.period
        st.reset = _cdiv(st.after, c.limit)

    @staticmethod
    def refund(store: MemoryStore, key: str, now: int, c: _Check, nonce: str) -> None:
        value = store._get(key, now)
        if not isinstance(value, _Tat):
            return
        ahead = (value.tat - now) * c.limit + value.frac - c.cost * c.period
        if ahead <= 0:
            store._del(key)
            return
        whole = ahead // c.limit
        # The TAT moves back and the TTL stays (KEEPTTL).
        store._data[key] = _Tat(now + whole, ahead - whole * c.limit, value.grid)


_ALGORITHMS: dict[str, type[_Algorithm]] = {
    "sliding_log": _SlidingLog,
    "sliding_window": _SlidingWindow,
    "gcra": _Gcra,
}


# --- stores by name ------------------------------------------------------------------------

_STORES: dict[str, MemoryStore] = {}
_STORES_LOCK = threading.Lock()


def store(name: str) -> MemoryStore:
    """The process's store called ``name`` (``""`` for ``memory://``), made on first use."""
    with _STORES_LOCK:
        found = _STORES.get(name)
        if found is None:
            found = _STORES[name] = MemoryStore()
        return found


def clear_all() -> None:
    """Forget every key of every named store (between tests)."""
    with _STORES_LOCK:
        stores = list(_STORES.values())
    for each in stores:
        each.clear()


# --- the wires -----------------------------------------------------------------------------


class _MemoryWireBase:
    """What the decision flow reads of a wire (see _flow.Transport): one "server"."""

    # The flow tells the breaker of each call's outcome (here: always a success).
    reports = False

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.closed = False

    @staticmethod
    def route(slot: int) -> str | None:
        """One store: no node to name."""
        return None

    @staticmethod
    def serving_nodes() -> set[str] | None:
        """One store: no slot map."""
        return None

    def _run(self, calls: Sequence[ScriptCall]) -> list[object]:
        if self.closed:
            raise ApplimitError(CLOSED)
        return [self.store.execute(call) for call in calls]

    def _delete(self, keys: Sequence[str]) -> None:
        if self.closed:
            raise ApplimitError(CLOSED)
        self.store.delete(keys)


class MemoryWire(_MemoryWireBase):
    """The sync limiter's wire to a :class:`MemoryStore`."""

    def run(self, calls: Sequence[ScriptCall]) -> list[object]:
        """The reply of each call, in order."""
        return self._run(calls)

    def delete(self, keys: Sequence[str]) -> None:
        """DEL ``keys`` (a reset)."""
        self._delete(keys)

    def close(self) -> None:
        """Close the wire; the store and its counts stay (as Redis' would)."""
        self.closed = True


class AsyncMemoryWire(_MemoryWireBase):
    """The async limiter's wire to a :class:`MemoryStore`: each call runs at once, without
    awaiting, so it is atomic on the event loop."""

    async def run(self, calls: Sequence[ScriptCall]) -> list[object]:
        """The reply of each call, in order."""
        return self._run(calls)

    async def delete(self, keys: Sequence[str]) -> None:
        """DEL ``keys`` (a reset)."""
        self._delete(keys)

    async def close(self) -> None:
        """Close the wire; the store and its counts stay."""
        self.closed = True
