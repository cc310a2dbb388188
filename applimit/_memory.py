"""The ``memory://`` backend: the limiter's script, run on Python objects in this process.

For tests and single-process tools that should not need a Redis server. Only the wire is
replaced: the core still builds the same :class:`~applimit._calls.ScriptCall` objects
(``hit``, ``peek``, ``refund``, the ARGV layout of ``decide.lua``) and parses the same
replies, so the decision flow, the denial cache, approximate mode and every reply parser
are the ones that run against Redis. :class:`MemoryStore` executes a call the way
``applimit/lua/decide.lua`` does: phase 1 checks every limit without writing, phase 2 (a
hit that every enforced check admits) applies the checks that passed, and the reply is
``[now, n, allowed, consumed, remaining, reset µs, retry µs, ...]``. The algorithms'
arithmetic and decide.lua's two phases are ``edgegen_policy``'s (``ALGORITHMS``,
``decide``: the Lua stated once in Python, which edgegen's replay decides with too); this
module keeps what Redis does around them: keys, values and their TTLs. The contract and
property suites run on both backends to keep them equal.

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Protocol

import redis.exceptions
from edgegen_policy import AFTER, ALGORITHMS, AlgorithmModel, Quota, Verdict, decide

from ._calls import ScriptCall
from ._errors import CLOSED, ApplimitError

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


def _ttl_ms(end: int, now: int, slack_ms: int) -> int:
    """The PEXPIRE (ms from now) that ends the key at ``end`` µs: the end of an expiry
    cell (common.lua's cell_ttl_ms), or a quota's period and grace (quota.lua)."""
    return -(-(end - now) // 1000) + slack_ms


@dataclass(slots=True)
class _Check:
    """One check of a call, as decide.lua reads it from ARGV."""

    algorithm: AlgorithmModel[Any, Any]
    quota: Quota
    cost: int
    # decide.lua's flags: SHADOW and AFTER of edgegen_policy._algorithms.
    flags: int


class _Holder(Protocol):
    """A limiter on a store: it keeps local answers (denial cache, approximate counts) that
    must go when the store is cleared."""

    def forget_local(self) -> None:
        """Drop every local answer."""

    def overrides_changed(self) -> None:
        """Read the store's overrides again."""


class MemoryStore:
    """Keys and their values, and the execution of the limiter's script calls on them."""

    def __init__(self) -> None:
        # The limiters deciding on this store (weakly: a store outlives its limiters).
        self._holders: weakref.WeakSet[_Holder] = weakref.WeakSet()
        # Key -> its value (edgegen_policy's Tat, Window or Log).
        self._data: dict[str, object] = {}
        # Key -> when it expires, in the script's µs (no entry: no TTL).
        self._expiry: dict[str, int] = {}
        self._lock = threading.Lock()
        #: How many script calls the store has run (tests count them as they count
        #: Redis' commandstats).
        self.calls = 0
        # The run-time overrides (_override_store.MemorySource): field -> JSON, the count
        # of changes, and the audit trail.
        self.overrides: dict[str, str] = {}
        self.override_version = 0
        self.override_log: list[Any] = []
        self.override_lock = threading.Lock()

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
        with self.override_lock:
            self.overrides.clear()
            self.override_log.clear()
            self.override_version += 1
        for holder in list(self._holders):
            holder.forget_local()
        self.overrides_changed()

    def overrides_changed(self) -> None:
        """Tell the limiters on the store that its overrides changed: they read them at once."""
        for holder in list(self._holders):
            holder.overrides_changed()

    def delete(self, keys: Sequence[str]) -> None:
        """DEL ``keys``."""
        with self._lock:
            for key in keys:
                self._del(key)

    def keys(self, pattern: str = "*") -> list[str]:
        """The keys that match the glob ``pattern`` (KEYS), expired ones included until
        they are next read."""
        with self._lock:
            return [key for key in self._data if fnmatchcase(key, pattern)]

    def value(self, key: str) -> object:
        """The value held at ``key``, None without one (for tests that look at the state)."""
        with self._lock:
            return self._data.get(key)

    def _get(self, key: str, now: int) -> object:
        expires = self._expiry.get(key)
        if expires is not None and expires <= now:
            self._del(key)
            return None
        return self._data.get(key)

    def _del(self, key: str) -> None:
        self._data.pop(key, None)
        self._expiry.pop(key, None)

    def _sweep(self, now: int) -> None:
        """Drop every expired key (Redis' active expiry)."""
        gone = [key for key, at in self._expiry.items() if at <= now]
        for key in gone:
            self._del(key)

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
                    self._refund(key, check, now, nonce)
                return [now, n]
            hit = mode == "hit"
            passed, verdicts = decide(
                [
                    (_Slot(self, check, nonce, slack_ms), key, check.cost, check.flags)
                    for key, check in zip(call.keys, checks, strict=True)
                ],
                now,
                hit=hit,
            )
        out: list[int] = [now, n]
        for v, check in zip(verdicts, checks, strict=True):
            consumed = hit and passed and v.allowed and not check.flags & AFTER
            out += (int(v.allowed), int(consumed), v.remaining, v.reset, v.retry)
        return out

    def _refund(self, key: str, check: _Check, now: int, nonce: str) -> None:
        """Undo the apply of ``check`` at ``now`` with ``nonce``; the TTL stays."""
        value = self._get(key, now)
        if not isinstance(value, check.algorithm.value_type):
            return
        left = check.algorithm.refund(value, now, check.quota, check.cost, nonce)
        if left is None:
            # As Redis deletes a key whose value is emptied.
            self._del(key)
        else:
            self._data[key] = left


class _Slot:
    """One check of one call on a store, as :func:`edgegen_policy.decide` reads and
    writes it: the algorithm's phase 1 on the key's value, and phase 2 with the TTL its
    Lua sets (PEXPIRE on a new expiry cell, else KEEPTTL)."""

    __slots__ = ("check", "nonce", "slack_ms", "store")

    def __init__(self, store: MemoryStore, check: _Check, nonce: str, slack_ms: int) -> None:
        self.store = store
        self.check = check
        self.nonce = nonce
        self.slack_ms = slack_ms

    def _value(self, key: str, now: int) -> Any:
        value = self.store._get(key, now)
        return value if isinstance(value, self.check.algorithm.value_type) else None

    def peek(self, key: str, now: int, cost: int) -> Verdict:
        """Phase 1: the check on the key's value; nothing changes."""
        check = self.check
        result: Verdict = check.algorithm.check(self._value(key, now), now, check.quota, cost)
        return result

    def record(self, key: str, verdict: Verdict, now: int, cost: int) -> None:
        """Phase 2: the new value, and a new TTL when it needs one."""
        store, check = self.store, self.check
        algorithm, quota = check.algorithm, check.quota
        value = algorithm.apply(self._value(key, now), verdict, now, quota, cost, nonce=self.nonce)
        store._data[key] = value
        cell = algorithm.expiry(value, verdict, quota)
        if cell is not None:
            ttl_ms = _ttl_ms(algorithm.expires_at(cell, quota), now, self.slack_ms)
            if ttl_ms <= 0:
                # As in Redis: a TTL in the past deletes the key.
                store._del(key)
            else:
                store._expiry[key] = now + ttl_ms * 1000


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
        name, limit, period, cost, burst, flags = match.groups()
        algorithm = ALGORITHMS.get(name)
        if algorithm is None:
            return redis.exceptions.ResponseError(f"applimit: unknown algorithm {name}")
        quota = Quota(int(limit), int(period), int(burst))
        checks.append(_Check(algorithm, quota, int(cost), int(flags)))
    return checks


# A check's spec, as common.lua's spec_of matches it ([0-9], not \d: Lua's %d is ASCII).
_SPEC = re.compile(r"([a-z_]+) ([0-9]+) ([0-9]+) ([0-9]+) ([0-9]+) ([0-3])")


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
