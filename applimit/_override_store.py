"""Where run-time overrides live, how every instance reads them, and their audit trail.

In Redis, three keys with one hash tag (one slot on Redis Cluster, so one script writes
them together)::

    <prefix>:{overrides}:all       HASH   field (limit, kind, value) -> the override's JSON
    <prefix>:{overrides}:version   STRING counter, raised by every change (never expires)
    <prefix>:{overrides}:log       STREAM one entry per change: op, who, when, what, why

A change is one script (:data:`_CHANGE`): it writes or deletes the field, drops overrides
that have expired, sets the hash to expire with the last of them, raises the version and
appends to the log, atomically. A reader (:class:`Feed`, a thread per limiter) reads the
version every ``refresh`` seconds and the hash only when the version moved (or when an
override it holds has expired), so an unchanged set costs one GET per interval per
process, and no decision ever waits for it. ``memory://`` keeps the same three things in
its store (:class:`MemorySource`) and tells the limiters on it at once.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import _memory
from ._arguments import check_rule
from ._errors import REDIS_FAILURES, ConfigurationError, InvalidArgumentError
from ._overrides import (
    MAX_BY,
    MAX_LIFETIME,
    MAX_REASON,
    MAX_SKEW,
    Override,
    checked,
    counted_kind,
    in_bounds,
    next_expiry,
    parse,
    text_argument,
)
from ._rules import CompiledPolicy

log = logging.getLogger("applimit")

# The stream keeps about this many changes (XADD MAXLEN ~).
LOG_LENGTH = 10_000
# How often each instance reads the overrides by default, in seconds: the bound within
# which a change made anywhere reaches every instance's decisions.
DEFAULT_REFRESH = 5.0
# The longest refresh interval a limiter takes, in seconds.
MAX_REFRESH = 300.0

_CHANGE = """
-- KEYS[1] the hash of overrides, KEYS[2] the version, KEYS[3] the log stream.
-- ARGV: op ('set' or 'remove'), field, document ('' for remove), by, reason,
--       now in ms, the stream's length, the latest expiry a set could write in ms.
-- Returns the new version, or 0 when a remove found nothing (nothing written).
local op, field, doc = ARGV[1], ARGV[2], ARGV[3]
local now, furthest = tonumber(ARGV[6]), tonumber(ARGV[8])
-- Strict JSON, as Python reads it: no hex, leading zeros, Infinity or NaN.
local json = cjson.new()
json.decode_invalid_numbers(false)
if op == 'set' then
  redis.call('HSET', KEYS[1], field, doc)
else
  doc = redis.call('HGET', KEYS[1], field)
  if not doc then return 0 end
  redis.call('HDEL', KEYS[1], field)
end
local all = redis.call('HGETALL', KEYS[1])
local latest = 0
for i = 1, #all, 2 do
  local ok, parsed = pcall(json.decode, all[i + 1])
  local expires = ok and type(parsed) == 'table' and parsed['expires']
  -- Not an object with a numeric expiry, expired, or further than any set writes (by
  -- hand): as _kept does for memory://.
  if type(expires) ~= 'number' or expires ~= expires or expires * 1000 <= now
      or expires * 1000 > furthest then
    redis.call('HDEL', KEYS[1], all[i])
  elseif expires * 1000 > latest then
    latest = expires * 1000
  end
end
if latest > 0 then
  -- As digits: a Lua number past 1e14 would be sent in exponent form, which Redis refuses.
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.ceil(latest) + 1000))
end
local version = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', 'op', op, 'override', doc,
  'by', ARGV[4], 'reason', ARGV[5], 'at', ARGV[6], 'version', version)
return version
"""


def keys(prefix: str) -> tuple[str, str, str]:
    """The hash, version and log keys of ``prefix`` (one hash tag: one slot)."""
    return (
        f"{prefix}:{{overrides}}:all",
        f"{prefix}:{{overrides}}:version",
        f"{prefix}:{{overrides}}:log",
    )


@dataclass(frozen=True, slots=True)
class OverrideChange:
    """One entry of the audit trail: ``op`` (set, remove) of ``override`` by ``by``, at
    ``at`` (Unix seconds), for ``reason``; ``id`` is the stream entry's id."""

    id: str
    op: str
    override: Override | None
    by: str
    reason: str
    at: float
    version: int

    def document(self) -> dict[str, Any]:
        """The change as a JSON object (``applimit override log --format json``)."""
        return {
            "id": self.id,
            "op": self.op,
            "override": None if self.override is None else self.override.document(),
            "by": self.by,
            "reason": self.reason,
            "at": self.at,
            "version": self.version,
        }


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _change(entry_id: object, fields: dict[Any, Any]) -> OverrideChange:
    got = {_text(k): _text(v) for k, v in fields.items()}
    try:
        override: Override | None = parse(got.get("override", ""))
    except ValueError:
        override = None
    return OverrideChange(
        id=_text(entry_id),
        op=got.get("op", ""),
        override=override,
        by=got.get("by", ""),
        reason=got.get("reason", ""),
        at=int(got.get("at", "0") or 0) / 1000,
        version=int(got.get("version", "0") or 0),
    )


def _parsed(raw: dict[Any, Any]) -> list[Override]:
    """The overrides of the hash ``raw`` (field -> document); a document that does not
    read, or that names another identity than its field (no set writes one), is skipped."""
    found = []
    for field, value in raw.items():
        name = _text(field)
        try:
            override = parse(value)
        except ValueError:
            override = None
        if override is None or override.field != name:
            # Written by something else, or by a later format: skipped, and said once.
            log.warning("applimit: an override in Redis could not be read; it is ignored")
            continue
        found.append(override)
    return found


class Source(Protocol):
    """Where the run-time overrides are: Redis, or a ``memory://`` store."""

    def version(self) -> bytes | None:
        """The version of the set of overrides (None: none was ever set)."""

    def load(self) -> list[Override]:
        """Every override stored, expired ones included."""

    def change(self, op: str, override: Override, by: str, reason: str) -> int:
        """Set or remove ``override``, log it; the new version, or 0 when nothing changed."""

    def changes(self, count: int) -> list[OverrideChange]:
        """The last ``count`` changes, newest first."""

    def close(self) -> None:
        """Release the connections."""

    def forked(self) -> None:
        """In a forked child: forget what the parent held (locks)."""


class RedisSource:
    """The overrides in Redis, through a plain redis-py client of their own (made on first
    use, with the limiter's settings and timeout)."""

    def __init__(self, factory: Callable[[], Any], prefix: str) -> None:
        self._factory = factory
        self._client: Any = None
        self._script: Any = None
        self._lock = threading.Lock()
        self.all, self.version_key, self.log = keys(prefix)

    def _redis(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._factory()
                self._script = self._client.register_script(_CHANGE)
            return self._client

    def version(self) -> bytes | None:
        """GET the version."""
        found = self._redis().get(self.version_key)
        return None if found is None else bytes(found)

    def load(self) -> list[Override]:
        """HGETALL the overrides."""
        return _parsed(self._redis().hgetall(self.all))

    def change(self, op: str, override: Override, by: str, reason: str) -> int:
        """Run the change script."""
        self._redis()
        document = json.dumps(override.document()) if op == "set" else ""
        now_ms = round(time.time() * 1000)
        furthest = now_ms + round((MAX_LIFETIME + MAX_SKEW) * 1000)
        return int(
            self._script(
                keys=[self.all, self.version_key, self.log],
                args=[op, override.field, document, by, reason, now_ms, LOG_LENGTH, furthest],
            )
        )

    def changes(self, count: int) -> list[OverrideChange]:
        """XREVRANGE the log."""
        return [_change(i, f) for i, f in self._redis().xrevrange(self.log, count=count)]

    def forked(self) -> None:
        """A fresh lock; redis-py's pools reconnect in a child by themselves."""
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the client, if one was made."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def _no_constant(name: str) -> Any:
    # NaN and Infinity are not JSON: the change script's strict reader refuses them too.
    raise ValueError(f"{name} is not a JSON number")


def _kept(text: str, now: float) -> bool:
    """Whether a change keeps a stored document, as _CHANGE decides in Redis: a JSON object
    whose expiry is a number, in the future and no further than a set writes. (One that is
    otherwise unreadable is skipped by readers, and stays until removed.)"""
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return False
    expires = raw.get("expires") if isinstance(raw, dict) else None
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        return False
    return in_bounds(expires, now)


class MemorySource:
    """The overrides of a ``memory://`` store: in the store, told to its limiters at once."""

    def __init__(self, store: _memory.MemoryStore) -> None:
        self.store = store

    def version(self) -> bytes | None:
        """The store's count of changes."""
        return str(self.store.override_version).encode()

    def load(self) -> list[Override]:
        """The store's overrides."""
        with self.store.override_lock:
            return _parsed(dict(self.store.overrides))

    def change(self, op: str, override: Override, by: str, reason: str) -> int:
        """OverrideChange the store's overrides, log it, and tell the limiters on the store."""
        store = self.store
        now = time.time()
        with store.override_lock:
            field = override.field
            document = store.overrides.get(field)
            if op == "set":
                document = store.overrides[field] = json.dumps(override.document())
            elif document is None:
                return 0
            else:
                del store.overrides[field]
            for name, text in list(store.overrides.items()):
                if not _kept(text, now):
                    del store.overrides[name]
            store.override_version += 1
            store.override_log.append(
                OverrideChange(
                    id=f"{round(now * 1000)}-{store.override_version}",
                    op=op,
                    override=parse(document),
                    by=by,
                    reason=reason,
                    at=now,
                    version=store.override_version,
                )
            )
            del store.override_log[:-LOG_LENGTH]
            version = store.override_version
        store.overrides_changed()
        return version

    def changes(self, count: int) -> list[OverrideChange]:
        """The store's last changes."""
        with self.store.override_lock:
            return list(reversed(self.store.override_log[-count:])) if count > 0 else []

    def close(self) -> None:
        """Nothing to release."""

    def forked(self) -> None:
        """Nothing held."""


# The feeds whose thread runs, to start again in a forked child.
_RUNNING: weakref.WeakSet[Feed] = weakref.WeakSet()


def _restart_after_fork() -> None:
    for feed in list(_RUNNING):
        feed._after_fork()


os.register_at_fork(after_in_child=_restart_after_fork)


class Feed:
    """Keeps a limiter's overrides current: reads ``source`` every ``interval`` seconds in
    a daemon thread, and hands each new set to ``apply``.

    ``apply`` is held weakly (a bound method of the limiter): the thread ends when the
    limiter is gone, or at :meth:`stop`. A failed read keeps the overrides held (logged
    once per outage); the ones that expire meanwhile still end on time, as ``apply`` is
    called again at the first expiry (``wall`` is the clock expiries are read on).
    """

    def __init__(
        self,
        source: Source,
        apply: Callable[[Sequence[Override]], None],
        *,
        interval: float,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self._apply = weakref.WeakMethod(apply)
        self.interval = interval
        self._wall = wall
        self._version: bytes | None = None
        self._held: list[Override] = []
        self._next = float("inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        """Start the thread (its first read is at once)."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="applimit-overrides", daemon=True
            )
            self._thread.start()
            _RUNNING.add(self)

    def _after_fork(self) -> None:
        """In a forked child (a pre-forking server that built the limiter first): no
        thread came along, so start one; the locks may have been held at the fork."""
        if self._thread is None:
            return
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self.source.forked()
        self.start()

    def stop(self) -> None:
        """End the thread and release the source's connections."""
        _RUNNING.discard(self)
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self.source.close()

    def _run(self) -> None:
        stop = self._stop
        while True:
            try:
                if not self.poll(quiet=True):
                    return
            except Exception:
                # The thread must outlive a bug in one read: the next may succeed.
                log.exception("applimit: reading the overrides failed; trying again")
            if stop.wait(self.interval):
                return

    def poll(self, *, quiet: bool = False, force: bool = False) -> bool:
        """Read the version, and the overrides when it moved; False when the limiter is
        gone. ``quiet``: a failure is logged, not raised."""
        with self._lock:
            try:
                version = self.source.version()
                now = self._wall()
                if force or version != self._version or now >= self._next:
                    if version != self._version or force:
                        self._held = self.source.load()
                    self._version = version
                    self._next = next_expiry(self._held, now)
                    apply = self._apply()
                    if apply is None:
                        return False
                    apply(self._held)
                self._failing = False
            except REDIS_FAILURES:
                if not quiet:
                    raise
                if not self._failing:
                    log.warning(
                        "applimit: the overrides could not be read from Redis; the ones "
                        "read before stay in force until they expire"
                    )
                self._failing = True
        return self._apply() is not None


class _Holder(Protocol):
    """What the API reads of a limiter (``LimiterBase``)."""

    compiled: CompiledPolicy
    override_source: Source | None
    override_feed: Feed | None
    override_refresh: float | None

    def overrides_in_force(self) -> list[Override]:
        """The overrides the limiter decides with now."""

    def _use_overrides(self, runtime: Sequence[Override]) -> None: ...


def _expiry(ttl: float | None, expires: float | datetime.datetime | None, now: float) -> float:
    if (ttl is None) == (expires is None):
        raise InvalidArgumentError("ttl", "give one of ttl= (seconds) or expires= (a time).")
    if ttl is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, int | float):
            raise InvalidArgumentError("ttl", "ttl must be a number of seconds.")
        return now + ttl
    if isinstance(expires, datetime.datetime):
        if expires.tzinfo is None:
            raise InvalidArgumentError("expires", "expires must be a time with its zone (UTC).")
        return expires.timestamp()
    return expires  # type: ignore[return-value]


class Overrides:
    """Run-time overrides of a :class:`~applimit.Limiter`: ``limiter.overrides``.

    ``set`` and ``remove`` write Redis (or the ``memory://`` store) and the audit trail
    in one step, and this limiter decides with the change at once; the app's other
    instances do within their ``app.override_refresh``. ``identity`` is what the limit
    counts: the user id, or the value of its app key (``acme`` for ``per: org``).
    """

    def __init__(self, limiter: _Holder) -> None:
        self._limiter = limiter

    def _source(self, writing: bool) -> Source:
        limiter = self._limiter
        if limiter.override_source is None:
            raise ConfigurationError(
                "this limiter is disabled (enabled=False): it has no overrides."
            )
        if writing and limiter.override_refresh is None:
            raise ConfigurationError(
                "the app does not read run-time overrides: its policy has no "
                "app.override_refresh (e.g. override_refresh: 5s), so an override set now "
                "would change nothing. Add it, or write the override under overrides: in "
                "the policy."
            )
        return limiter.override_source

    def set(
        self,
        limit: str,
        identity: str,
        *,
        rates: Sequence[str] | None = None,
        reason: str,
        by: str,
        ttl: float | None = None,
        expires: float | datetime.datetime | None = None,
        quotas: Mapping[str, int] | None = None,
        concurrency: int | None = None,
    ) -> Override:
        """Give ``identity`` its own ``rates`` (``["1000/1m"]``), calendar ``quotas``
        (``{"month": 2000000}``, on a limit that has quotas) or ``concurrency`` for
        ``limit``, each replacing its tier's (what is not given stays the tier's), until
        ``expires`` (Unix seconds or an aware datetime), or for ``ttl`` seconds; ``reason``
        and ``by`` go to the audit trail. Replaces the identity's earlier override."""
        source = self._source(writing=True)
        now = time.time()
        rule = check_rule(self._limiter.compiled, limit)
        override = checked(
            self._limiter.compiled,
            limit,
            kind=counted_kind(rule),
            value=identity,
            rates=rates,
            expires=_expiry(ttl, expires, now),
            reason=reason,
            by=by,
            now=now,
            quotas=quotas,
            concurrency=concurrency,
        )
        source.change("set", override, override.by, override.reason)
        self.refresh()
        return override

    def remove(self, limit: str, identity: str, *, by: str, reason: str) -> bool:
        """End ``identity``'s override of ``limit``: its tier's rates apply again. False
        when it had none (nothing is logged then)."""
        source = self._source(writing=True)
        rule = check_rule(self._limiter.compiled, limit)
        kind = counted_kind(rule) or ""
        probe = Override(
            limit=rule.name, kind=kind, value=str(identity), rates=(), expires=0.0, reason=""
        )
        who = text_argument("by", by, MAX_BY)
        why = text_argument("reason", reason, MAX_REASON)
        done = source.change("remove", probe, who, why) > 0
        self.refresh()
        return done

    def stored(self) -> list[Override]:
        """Every run-time override stored (expired ones that no change has dropped yet
        included), by limit."""
        return sorted(self._source(writing=False).load(), key=lambda o: (o.limit, o.kind, o.value))

    def in_force(self) -> list[Override]:
        """The overrides this instance decides with now: the run-time ones it last read
        and the file's, by limit."""
        return self._limiter.overrides_in_force()

    def log(self, count: int = 100) -> list[OverrideChange]:
        """The last ``count`` changes of the run-time overrides, newest first."""
        return self._source(writing=False).changes(count)

    def refresh(self) -> None:
        """Read the run-time overrides now (instead of at the next interval)."""
        feed = self._limiter.override_feed
        if feed is not None:
            feed.poll(force=True)


class AsyncOverrides:
    """Run-time overrides of an :class:`~applimit.AsyncLimiter`: as :class:`Overrides`,
    awaited (Redis is written and read in a worker thread)."""

    def __init__(self, limiter: _Holder) -> None:
        self._sync = Overrides(limiter)

    async def set(
        self,
        limit: str,
        identity: str,
        *,
        rates: Sequence[str] | None = None,
        reason: str,
        by: str,
        ttl: float | None = None,
        expires: float | datetime.datetime | None = None,
        quotas: Mapping[str, int] | None = None,
        concurrency: int | None = None,
    ) -> Override:
        """As :meth:`Overrides.set`."""
        return await asyncio.to_thread(
            self._sync.set,
            limit,
            identity,
            rates=rates,
            reason=reason,
            by=by,
            ttl=ttl,
            expires=expires,
            quotas=quotas,
            concurrency=concurrency,
        )

    async def remove(self, limit: str, identity: str, *, by: str, reason: str) -> bool:
        """As :meth:`Overrides.remove`."""
        return await asyncio.to_thread(self._sync.remove, limit, identity, by=by, reason=reason)

    async def stored(self) -> list[Override]:
        """As :meth:`Overrides.stored`."""
        return await asyncio.to_thread(self._sync.stored)

    def in_force(self) -> list[Override]:
        """As :meth:`Overrides.in_force` (local: no I/O)."""
        return self._sync.in_force()

    async def log(self, count: int = 100) -> list[OverrideChange]:
        """As :meth:`Overrides.log`."""
        return await asyncio.to_thread(self._sync.log, count)

    async def refresh(self) -> None:
        """As :meth:`Overrides.refresh`."""
        await asyncio.to_thread(self._sync.refresh)
