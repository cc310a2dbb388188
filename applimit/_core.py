"""The limiter's core: no I/O, shared by ``Limiter`` and ``AsyncLimiter``.

At start-up :func:`compile_policy` turns the pydantic policy into plain frozen
:class:`AppRule` objects; the hot path never touches pydantic. For each call the core
turns a request into a :class:`Prepared` plan: the checks to run (one per rate of every
limit that applies), grouped into script calls (keys and arguments for EVALSHA), and then
turns the replies into a :class:`~applimit.Decision`. The shells only run the calls.

All the checks of one call go into one script call, which decides them atomically. The
one exception is Redis Cluster when one request's limits count different identities (a
per-IP limit and a per-user limit, or a per-user and a ``per: org`` limit): their keys live
in different slots, so there is one call per slot, and when the request is denied after
some of them consumed, the plan adds refund calls that give the consumption back (see
docs/applimit.md).
"""

from __future__ import annotations

import functools
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

from edgegen_policy import (
    Algorithm,
    AppKey,
    Layer,
    Matcher,
    Mode,
    OnRedisError,
    Policy,
    Rate,
    checked_rates,
    ip_bucket,
    request_paths,
)
from edgegen_policy import check as check_policy
from redis.crc import key_slot

from . import _keys
from ._decision import Decision, LimitResult, combine, make_result, single
from ._errors import ConfigurationError, InvalidArgumentError, UnknownLimitError, UnknownTierError

# What a decision does: hit consumes, peek only reads (the script also knows "refund",
# which only a denied decision's follow-up calls use).
Operation = Literal["hit", "peek"]

# The key suffix of each algorithm: a policy that switches a limit's algorithm starts on
# fresh keys instead of reading another algorithm's state (which would be WRONGTYPE).
_KEY_SUFFIX = {
    Algorithm.SLIDING_LOG: "log",
    Algorithm.SLIDING_WINDOW: "sw",
    Algorithm.GCRA: "gcra",
}
MAX_COST = 1_000_000_000
# Under a test clock the script's time does not run with the server's, so expiry (which
# does) is pushed out by this much: state the fake clock still needs is never dropped.
TEST_CLOCK_TTL_SLACK_MS = 600_000
# The nonces' generator: private, so an app that seeds the `random` module (or every
# worker seeding it alike) cannot make two limiters' nonces repeat; seeded from the OS, and
# again in every forked child, so processes never share a sequence.
_NONCES = random.Random()
os.register_at_fork(after_in_child=_NONCES.seed)
_NONE = -1
_NEVER = -2
_REPLY_HEAD = 2
_REPLY_FIELDS = 5
# The length of a reply to one check.
_ONE_CHECK = _REPLY_HEAD + _REPLY_FIELDS
# What built-in limits count by (AppRule.kind), as plain strings for the hot path.
_USER_KIND = AppKey.USER.value
_IP_KIND = AppKey.IP.value
# Approximate mode's defaults: sync after this many requests, or this many seconds.
DEFAULT_SYNC_EVERY = 10
DEFAULT_SYNC_INTERVAL = 0.1


@dataclass(frozen=True, slots=True)
class RateSpec:
    """One rate of a tier: ``quota`` requests per ``period_us`` microseconds."""

    quota: int
    period_us: int
    period_text: str

    @property
    def window(self) -> float:
        """The period in seconds."""
        return self.period_us / 1_000_000


@dataclass(frozen=True, slots=True)
class AppRule:
    """The app part of one policy limit, as plain values for the hot path."""

    name: str
    key_name: str
    per_ip: bool
    algorithm: str
    key_suffix: str
    burst: int | None
    shadow: bool
    fail_open: bool
    matcher: Matcher
    tiers: Mapping[str, tuple[RateSpec, ...]]
    # The app key the limit counts by (``per: org``), or None for per user and per IP.
    per_key: str | None = None

    @property
    def kind(self) -> str:
        """What the limit counts by: ``user``, ``ip`` or the name of an app key."""
        if self.per_key is not None:
            return self.per_key
        return _IP_KIND if self.per_ip else _USER_KIND

    approximate: bool = False
    sync_every: int = 1
    sync_interval: float = 0.0
    # False: only hit/peek/reset name it; check_request (the middleware) never applies it.
    middleware: bool = True


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """What the limiter needs of a policy: its app limits, tiers and settings."""

    rules: tuple[AppRule, ...]
    by_name: Mapping[str, AppRule]
    edge_only: frozenset[str]
    tiers: tuple[str, ...]
    key_prefix: str
    timeout: float
    redis_url: str
    # IPv6 clients are counted per network of this prefix length (policy clients:).
    ipv6_prefix: int = 64


def _rates(rates: Iterable[Rate]) -> tuple[RateSpec, ...]:
    """Rates of one tier as plain values, one per period (``checked_rates``: for equal
    periods the smaller quota decides alone)."""
    return tuple(
        RateSpec(quota=r.limit, period_us=r.period.ms * 1000, period_text=str(r.period))
        for r in checked_rates(rates)
    )


def compile_policy(policy: Policy) -> CompiledPolicy:
    """Convert the policy into plain frozen values; ConfigurationError when it cannot work."""
    # The one validity gate (policy.check): what stops the app is decided there, for
    # edgegen validate and for the limiter alike (duplicate names, unknown tiers, ...).
    stopping = check_policy(policy).stopping(Layer.APP)
    if stopping:
        raise ConfigurationError(
            "the policy cannot be enforced by the app: " + "; ".join(d.format() for d in stopping)
        )
    rules: list[AppRule] = []
    edge_only: set[str] = set()
    known_tiers = tuple(policy.tiers)
    for limit in policy.limits:
        app = limit.app
        if app is None:
            edge_only.add(limit.name)
            continue
        on_error = app.on_redis_error or policy.app.on_redis_error
        tiers = {tier: _rates(rates) for tier, rates in app.tiers.items()}
        rules.append(
            AppRule(
                name=limit.name,
                key_name=_keys.limit_component(limit.name),
                per_ip=app.per is AppKey.IP,
                algorithm=app.algorithm.value,
                key_suffix=_KEY_SUFFIX[app.algorithm],
                burst=app.burst,
                shadow=not app.enforce,
                fail_open=on_error is OnRedisError.ALLOW,
                matcher=limit.match.matcher(),
                tiers=MappingProxyType(tiers),
                # A key of the app's own (policy KeyName); the lint pass (L005) has already
                # stopped a name that cannot be used.
                per_key=None if isinstance(app.per, AppKey) else str(app.per),
                approximate=app.mode is Mode.APPROXIMATE,
                sync_every=app.sync_every or DEFAULT_SYNC_EVERY,
                sync_interval=(
                    app.sync_interval.ms / 1000
                    if app.sync_interval is not None
                    else DEFAULT_SYNC_INTERVAL
                ),
                middleware=app.middleware,
            )
        )
    return CompiledPolicy(
        rules=tuple(rules),
        by_name=MappingProxyType({r.name: r for r in rules}),
        edge_only=frozenset(edge_only),
        tiers=known_tiers,
        key_prefix=policy.app.key_prefix,
        timeout=policy.app.timeout.ms / 1000,
        redis_url=policy.app.redis_url,
        ipv6_prefix=policy.clients.ipv6_prefix,
    )


# Built for every decision: plain slotted dataclasses, not frozen ones, whose __init__ pays
# an object.__setattr__ per field. Nothing changes them after construction.
@dataclass(slots=True)
class Check:
    """One rate of one limit for one identity: one key in one script call."""

    rule: AppRule
    tier: str
    rate: RateSpec
    key: str
    cost: int
    block: _Block

    def spec(self) -> str:
        """This check's script argument, its spec (see decide.lua)."""
        block = self.block
        if self.cost == 1:
            return block.spec_cost_1
        return f"{block.head}{self.cost}{block.tail}"


@dataclass(frozen=True, slots=True)
class _Block:
    """What one rate of one limit and tier sends with every call, encoded once.

    ``key_tail`` ends the state key after the hash tag; ``head`` and ``tail`` are the
    check's spec (its one script argument, see decide.lua) before and after the cost;
    ``result_head`` the fixed fields of the block's LimitResult (limit, tier, algorithm,
    quota, window, shadow).
    """

    rate: RateSpec
    key_head: str
    key_tail: str
    head: str
    tail: str
    result_head: tuple[str, str, str, int, float, bool]
    spec_cost_1: str = ""
    packed_cost_1: bytes = b""

    def __post_init__(self) -> None:
        # The spec of a request of cost 1, nearly every request's, made once, and its
        # RESP encoding (see ScriptCall.packed).
        spec = f"{self.head}1{self.tail}"
        object.__setattr__(self, "spec_cost_1", spec)
        object.__setattr__(self, "packed_cost_1", bulk(spec))


def _blocks(prefix: str, rule: AppRule, tier: str) -> tuple[_Block, ...]:
    """The encoded blocks of ``rule`` for ``tier``: one per rate (none if it has none)."""
    out = []
    for rate in rule.tiers.get(tier, ()):
        burst = rule.burst if rule.burst is not None else rate.quota
        out.append(
            _Block(
                rate=rate,
                key_head=f"{prefix}:{rule.key_name}:{{",
                key_tail=f"}}:{rate.period_text}:{rule.key_suffix}",
                head=f"{rule.algorithm} {rate.quota} {rate.period_us} ",
                tail=(
                    f" {burst if rule.algorithm == Algorithm.GCRA else 0} {1 if rule.shadow else 0}"
                ),
                # The first fields of every LimitResult of this block, in their order.
                result_head=(rule.name, tier, rule.algorithm, rate.quota, rate.window, rule.shadow),
            )
        )
    return tuple(out)


@dataclass(slots=True)
class ScriptCall:
    """One call of the limiter's script: its keys, its arguments, and on Redis Cluster
    the hash slot of its keys (which tells the shell which node's breaker applies).

    ``packed`` is the number of keys, the keys and the arguments as RESP bulk strings, in
    order, when the core encoded them: a wire then only puts the command's head before it
    (``_protocol.pack``). Most of those bytes are the same for every request of a limit
    and tier, so they are encoded once (``_Block.packed_cost_1``); hiredis' packer
    formats every argument's length with ``sprintf``, which cost a seventh of a sync
    decision. Empty: the wire packs ``keys`` and ``args`` itself.
    """

    keys: tuple[str, ...]
    args: tuple[str, ...]
    slot: int | None = None
    packed: bytes = b""


def bulk(value: str) -> bytes:
    """``value`` as a RESP bulk string, UTF-8 encoded as hiredis encodes a str."""
    data = value.encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


# The operations' bulk strings, and an empty one (``now`` without a test clock).
_OPERATION_BULKS = {name: bulk(name) for name in ("hit", "peek", "refund")}
_EMPTY_BULK = bulk("")
# "1": the number of keys, and the number of checks, of a call with one check.
_ONE_BULK = bulk("1")
# The slacks a Core sends (see Core.__init__), encoded once.
_SLACK_BULKS = {slack: bulk(slack) for slack in ("0", str(TEST_CLOCK_TTL_SLACK_MS))}


def _lead(operation: str, now: str, nonce: str, slack: str) -> bytes:
    """The encoded arguments every call of a plan starts with: operation, now, nonce,
    slack (see decide.lua)."""
    # The nonce is ASCII (hex digits, or empty): as many bytes as characters.
    return b"%b%b$%d\r\n%b\r\n%b" % (
        _OPERATION_BULKS[operation],
        bulk(now) if now else _EMPTY_BULK,
        len(nonce),
        nonce.encode(),
        _SLACK_BULKS.get(slack) or bulk(slack),
    )


def _one_call(
    operation: Operation | Literal["refund"],
    check: Check,
    now: str,
    nonce: str,
    slack: str,
    *,
    slot: int | None = None,
) -> ScriptCall:
    """The call running one check: its key, the lead (``_lead``'s four arguments) and the
    check packed in one format; most decisions' call."""
    block = check.block
    key = check.key
    encoded = key.encode()
    if check.cost == 1:
        spec = block.spec_cost_1
        packed_spec = block.packed_cost_1
    else:
        spec = check.spec()
        packed_spec = bulk(spec)
    return ScriptCall(
        (key,),
        (operation, now, nonce, slack, "1", spec),
        slot,
        # numkeys, the key, then _lead's four arguments (the nonce is ASCII), n, the check.
        b"%b$%d\r\n%b\r\n%b%b$%d\r\n%b\r\n%b%b%b"
        % (
            _ONE_BULK,
            len(encoded),
            encoded,
            _OPERATION_BULKS[operation],
            bulk(now) if now else _EMPTY_BULK,
            len(nonce),
            nonce.encode(),
            _SLACK_BULKS.get(slack) or bulk(slack),
            _ONE_BULK,
            packed_spec,
        ),
    )


def wrote(call: ScriptCall, reply: object) -> bool:
    """Whether the script call consumed anything (a hit whose reply says so): what ends an
    outage in which Redis refused writes (see _breaker.py)."""
    # The reply is {now, n, then per check: allowed, consumed, ...}: consumed at 3, 8, ...
    return call.args[0] == "hit" and isinstance(reply, list) and any(reply[3::_REPLY_FIELDS])


def _script_call(
    operation: Operation | Literal["refund"],
    checks: Sequence[Check],
    *,
    now: str,
    nonce: str,
    slack: str,
    slot: int | None,
    lead: bytes,
) -> ScriptCall:
    """The call running ``checks``; ``lead`` is ``_lead(operation, now, nonce, slack)``,
    encoded once for every call of a plan (a call of one check packs its own)."""
    if len(checks) == 1:
        # One rate of one limit (most decisions): no list to build.
        return _one_call(operation, checks[0], now, nonce, slack, slot=slot)
    return _CallParts.of(checks).call(operation, now, nonce, slack, slot=slot, lead=lead)


@dataclass(slots=True)
class _CallParts:
    """What a call of several checks sends around its lead (see ``_lead``), encoded: the
    same for every call of those checks, so a remembered plan keeps it (``_Planned``).
    Never changed once made; not frozen because it is also made for every call of a plan
    that is not remembered, and a frozen dataclass sets each field the slow way."""

    keys: tuple[str, ...]
    # numkeys and the keys, as RESP bulk strings: what comes before the lead.
    head: bytes
    # n and each check's spec: the arguments after the lead, as text and as RESP.
    args: tuple[str, ...]
    tail: bytes

    @classmethod
    def of(cls, checks: Sequence[Check]) -> _CallParts:
        """The parts of a call of ``checks`` (two or more)."""
        count = str(len(checks))
        head: list[bytes] = [bulk(count)]
        head.extend([bulk(check.key) for check in checks])
        args: list[str] = [count]
        tail: list[bytes] = [bulk(count)]
        for check in checks:
            if check.cost == 1:
                args.append(check.block.spec_cost_1)
                tail.append(check.block.packed_cost_1)
            else:
                spec = check.spec()
                args.append(spec)
                tail.append(bulk(spec))
        return cls(
            tuple([check.key for check in checks]), b"".join(head), tuple(args), b"".join(tail)
        )

    def call(
        self,
        operation: Operation | Literal["refund"],
        now: str,
        nonce: str,
        slack: str,
        *,
        slot: int | None,
        lead: bytes,
    ) -> ScriptCall:
        """The call with this lead (``_lead(operation, now, nonce, slack)``)."""
        return ScriptCall(
            self.keys,
            (operation, now, nonce, slack, *self.args),
            slot,
            self.head + lead + self.tail,
        )


@dataclass(frozen=True, slots=True)
class _Planned:
    """A remembered request plan (``Core.for_request``): its checks and, for a call of
    several checks on one server, that call's parts, so that a request only encodes its
    own lead (the nonce)."""

    checks: tuple[Check, ...]
    parts: _CallParts | None


@dataclass(slots=True)
class Prepared:
    """The plan for one decision: script calls to run, then :meth:`decide` on the replies."""

    operation: Operation
    checks: tuple[Check, ...]
    groups: tuple[tuple[int, ...], ...]
    calls: tuple[ScriptCall, ...]
    nonce: str
    slack: str

    @property
    def cost(self) -> int:
        """The cost of the request (every check of one plan has the same)."""
        return self.checks[0].cost if self.checks else 0

    def decide(self, replies: Sequence[object]) -> tuple[Decision, tuple[ScriptCall, ...]]:
        """The decision for the replies of ``calls`` (in order), and any refund calls.

        Refunds exist only when the checks were split over several calls (Redis Cluster,
        several identities) and the request is denied although some calls consumed; the
        shell runs them after answering, and their failure changes nothing in the decision.
        """
        count = len(replies)
        if count != len(self.calls):
            raise ValueError(f"expected {len(self.calls)} replies, got {count}")
        if count == 1:
            # One call (every decision but a cluster's that spans identities): its checks
            # in order, no refunds.
            checks = self.checks
            if len(checks) == 1:
                # One check (most decisions): its result is the decision's binding one.
                values = _int_list(replies[0], _ONE_CHECK)
                return single(self._result(checks[0], values, _REPLY_HEAD)), ()
            values = _int_list(replies[0], _REPLY_HEAD + _REPLY_FIELDS * len(checks))
            make = self._result
            return combine(
                [
                    make(check, values, at)
                    for check, at in zip(
                        self.checks, range(_REPLY_HEAD, len(values), _REPLY_FIELDS), strict=True
                    )
                ]
            ), ()
        results: list[LimitResult | None] = [None] * len(self.checks)
        times: list[int] = []
        for group, reply in zip(self.groups, replies, strict=True):
            values = _int_list(reply, _REPLY_HEAD + _REPLY_FIELDS * len(group))
            times.append(values[0])
            for j, index in enumerate(group):
                results[index] = self._result(
                    self.checks[index], values, _REPLY_HEAD + _REPLY_FIELDS * j
                )
        final = [r for r in results if r is not None]
        if len(final) != len(self.checks):
            raise ValueError("the replies do not cover every check of the plan")
        decision = combine(final)
        refunds: list[ScriptCall] = []
        if not decision.allowed and len(self.groups) > 1:
            for group, call, now in zip(self.groups, self.calls, times, strict=True):
                spent = [i for i in group if final[i].consumed]
                if not spent:
                    continue
                refund_now = str(now)
                refunds.append(
                    _script_call(
                        "refund",
                        [self.checks[i] for i in spent],
                        now=refund_now,
                        nonce=self.nonce,
                        slack="0",
                        slot=call.slot,
                        lead=_lead("refund", refund_now, self.nonce, "0"),
                    )
                )
                for i in spent:
                    final[i] = _given_back(final[i], self.checks[i].cost)
            decision = combine(final)
        return decision, tuple(refunds)

    def degraded(self, retry_after: float) -> Decision:
        """The decision when Redis cannot answer: each limit's on_redis_error decides."""
        results = [
            LimitResult(
                name=c.rule.name,
                tier=c.tier,
                algorithm=c.rule.algorithm,
                quota=c.rate.quota,
                window=c.rate.window,
                allowed=c.rule.fail_open,
                consumed=False,
                remaining=0,
                reset_after=0.0,
                retry_after=None if c.rule.fail_open else retry_after,
                shadow=c.rule.shadow,
            )
            for c in self.checks
        ]
        return combine(results, degraded=True)

    @staticmethod
    def _result(check: Check, values: Sequence[int], at: int) -> LimitResult:
        """One check's result from its five reply values, ``values[at:at + 5]`` (see
        decide.lua)."""
        allowed = values[at]
        remaining = values[at + 2]
        reset = values[at + 3]
        retry = values[at + 4]
        retry_after: float | None
        if allowed or retry == _NONE:
            retry_after = None
        elif retry == _NEVER:
            retry_after = math.inf
        else:
            retry_after = retry / 1_000_000 if retry > 0 else 0.0
        name, tier, algorithm, quota, window, shadow = check.block.result_head
        return make_result(
            name,
            tier,
            algorithm,
            quota,
            window,
            allowed == 1,
            values[at + 1] == 1,
            remaining if remaining > 0 else 0,
            reset / 1_000_000 if reset > 0 else 0.0,
            retry_after,
            shadow,
        )


def _given_back(result: LimitResult, cost: int) -> LimitResult:
    """A result whose consumption a refund undid."""
    return replace(result, consumed=False, remaining=min(result.quota, result.remaining + cost))


@functools.cache
def _one_group(count: int) -> tuple[tuple[int, ...], ...]:
    """The groups of a plan whose ``count`` checks are all in one call."""
    return (tuple(range(count)),)


_ONE_GROUP = _one_group(1)


def _int_list(reply: Any, length: int) -> Sequence[int]:
    """The script's reply as integers; ValueError when it is not the expected shape."""
    if not isinstance(reply, (list, tuple)) or len(reply) != length:
        raise ValueError(f"the limiter script replied {reply!r}; expected {length} integers")
    try:
        # One C loop: sum() refuses the bytes, None and lists a reply might hold instead
        # (RESP2 has no floats or booleans to let through).
        sum(reply)
    except TypeError:
        raise ValueError(f"the limiter script replied {reply!r}; expected integers") from None
    # Read, never changed: no copy (and no typing.cast, a call of its own on every reply).
    values: Sequence[int] = reply
    return values


# Entries of Core's memo of matching limits (see Core.matching), and the longest path
# and host (in characters) it keeps: at most some 4096 * 1.3 KiB of keys.
_MATCHING_CACHE = 4096
# for_limit's planned checks: at most this many (user, limit, tier, cost), and identities
# no longer than this (a longer one is planned anew every call, as before).
_PLANNED_CACHE = 4096
_PLANNED_IDENTITY = 256
# for_request's planned checks: as many, and client addresses no longer than this (an
# IPv6 address with a zone is at most 45 + a few characters; longer is no address).
_PLANNED_IP = 64
# Distinct sets of matching limits given a key of their own (see _Group); a policy's
# matchers make a handful, so this bound is never reached in practice.
_GROUPS = 1024
# How often a full memo may start over, in seconds.
_MEMO_RESET = 60.0
_K = TypeVar("_K")
_V = TypeVar("_V")


class _Memo(Generic[_K, _V]):
    """A bounded memo of the core's (read with ``entries.get``, filled with :meth:`keep`).

    When full it keeps nothing more, and starts over at most once every ``_MEMO_RESET``
    seconds. Emptying it whenever it filled would churn when more keys are in use than it
    holds (more active users than entries, ids in paths): every call would plan afresh and
    keep its plan, and the plans, living past a few collections of the young generation,
    would keep the cyclic garbage collector running full collections (measured: an async
    decision with 10,000 identities took half as much CPU again as without the memo).
    """

    __slots__ = ("entries", "size", "until")

    def __init__(self, size: int) -> None:
        self.entries: dict[_K, _V] = {}
        self.size = size
        self.until = 0.0

    def keep(self, key: _K, value: _V) -> None:
        entries = self.entries
        if len(entries) >= self.size:
            now = time.monotonic()
            if now < self.until:
                return
            entries.clear()
            self.until = now + _MEMO_RESET
        entries[key] = value


_MATCHING_PATH = 1024
_MATCHING_HOST = 255  # a DNS name is at most 253 characters, a port adds a few


class _Group:
    """The limits that match a request (Core.matching): one object per distinct set, so
    that the plans of requests to different paths that match the same limits are
    remembered once (for_request's memo is keyed by the object, hashed by identity).

    ``by_ip``: whether a plan of this set can depend on the client address when the
    caller is a user (a per-IP limit, or a ``per:`` key limit, which counts a caller
    without the key by address); ``keyed``: whether the set has its key (it is interned);
    past _GROUPS sets one does not, and the plans of its requests are not remembered.
    """

    __slots__ = ("by_ip", "keyed", "rules")

    def __init__(self, rules: tuple[AppRule, ...], keyed: bool) -> None:
        self.rules = rules
        self.by_ip = any(rule.per_ip or rule.per_key is not None for rule in rules)
        self.keyed = keyed


class Core:
    """Builds plans from requests and decisions from replies; holds no connection."""

    def __init__(
        self,
        compiled: CompiledPolicy,
        *,
        cluster: bool,
        test_clock: Callable[[], float] | None = None,
    ) -> None:
        """``cluster`` splits checks by hash slot; ``test_clock`` replaces server time (tests)."""
        self.policy = compiled
        self.cluster = cluster
        self._test_clock = test_clock
        self._slack = str(TEST_CLOCK_TTL_SLACK_MS) if test_clock is not None else "0"
        # Each (limit, tier)'s keys and arguments, encoded on first use (policy-bounded).
        self._blocks: dict[tuple[str, str], tuple[_Block, ...]] = {}
        # The middleware's limits that match a (method, path, host, mount), every tier: the
        # middleware asks matches() before identify() and check_request() after it, and
        # both read this instead of decoding the path and walking the matchers twice.
        # Bounded (see _Memo), so a stream of unique paths costs a lookup, never memory.
        self._matching: _Memo[tuple[str, str, str | None, str], _Group] = _Memo(_MATCHING_CACHE)
        # One _Group per distinct set of matching limits (by their names), kept for the
        # limiter's life: the plan memo below holds them as keys.
        self._groups: dict[tuple[str, ...], _Group] = {}
        # The checks of for_limit's commonest calls (a user, a limit by name, a tier, a
        # cost), planned once: the rule, tier and cost checks, the identity's escaping and
        # the keys are the same for every call of a user. Bounded like the matching memo:
        # a stream of new identities costs a lookup, never memory.
        self._planned: _Memo[tuple[str, str, str | None, int], tuple[Check, ...]] = _Memo(
            _PLANNED_CACHE
        )
        # For the calls that memo does not hold (see _plan_user): a per-user limit's rule
        # and tier by (name, tier as passed); only names and tiers that resolved are kept,
        # so the policy bounds it.
        self._user_shapes: dict[tuple[str, str | None], tuple[AppRule, str]] = {}
        # for_request's the same way, per (set of matching limits, user or None, client
        # address where the set counts by it, tier, cost): what the middleware asks.
        self._requested: _Memo[tuple[_Group, str | None, str | None, str | None, int], _Planned] = (
            _Memo(_PLANNED_CACHE)
        )

    def matching(
        self, method: str, path: str, host: str | None, mount: str = ""
    ) -> tuple[AppRule, ...]:
        """The limits the middleware applies that match this request, in policy order
        (every tier: the tier is applied by the caller). Pure, and remembered."""
        return self._match(method, path, host, mount).rules

    def _match(self, method: str, path: str, host: str | None, mount: str = "") -> _Group:
        key = (method, path, host, mount)
        found = self._matching.entries.get(key)
        if found is None:
            # The router's path and its canonical form (with and without the mount): a
            # limit counts the request in any form.
            forms = request_paths(path, mount)
            rules = tuple(
                rule
                for rule in self.policy.rules
                if rule.middleware and rule.matcher.matches_any(method, forms, host)
            )
            names = tuple(rule.name for rule in rules)
            found = self._groups.get(names)
            if found is None:
                found = _Group(rules, keyed=len(self._groups) < _GROUPS)
                if found.keyed:
                    self._groups[names] = found
            # Long paths and hosts (both the client's to choose) are not kept: the memo's
            # memory stays bounded by its entries.
            if (
                len(path) <= _MATCHING_PATH
                and len(mount) <= _MATCHING_PATH
                and (host is None or len(host) <= _MATCHING_HOST)
            ):
                self._matching.keep(key, found)
        return found

    # -- argument checks ----------------------------------------------------------------
    # Core takes what a caller passed as a limit's name, tier=, identity, ip=, keys= and
    # cost= as ``object``, not as the limiters document it, until these checks: a build
    # compiled with mypyc (setup.py) checks every typed argument on entry, and would raise a
    # bare TypeError before the checks could say what is wrong and how to fix it. The errors
    # show a value of the wrong type as it was given: through a variable typed Any, which
    # mypyc does not check (it checks a cast()).

    def tier(self, tier: object) -> str:
        """The tier to use: the given one if the policy lists it, else the lowest one."""
        if tier is None:
            return self.policy.tiers[0]
        if not isinstance(tier, str) or tier not in self.policy.tiers:
            given: Any = tier
            raise UnknownTierError(given, self.policy.tiers)
        return tier

    def rule(self, name: object) -> AppRule:
        """The app limit called ``name``; UnknownLimitError names the ones that exist."""
        rule = self.policy.by_name.get(name) if isinstance(name, str) else None
        if rule is None:
            given: Any = name
            raise UnknownLimitError(
                given, self.policy.by_name, edge_only=name in self.policy.edge_only
            )
        return rule

    @staticmethod
    def cost(cost: object) -> int:
        """``cost`` checked: a whole number from 1 to a billion."""
        if isinstance(cost, bool) or not isinstance(cost, int):
            raise InvalidArgumentError(
                "cost", f"cost must be a whole number of requests, not {cost!r}."
            )
        if not 1 <= cost <= MAX_COST:
            raise InvalidArgumentError(
                "cost",
                f"cost {cost} is out of range; a request costs from 1 to {MAX_COST:,} "
                "(use peek() to look without consuming).",
            )
        return cost

    @staticmethod
    def _identity(identity: object, argument: str) -> str:
        if not isinstance(identity, str):
            raise InvalidArgumentError(
                argument,
                f"{argument} must be a str, not {type(identity).__name__}; convert it, "
                f"e.g. str(user.id).",
            )
        if not identity:
            raise InvalidArgumentError(
                argument,
                f"{argument} is empty; every caller with an empty {argument} would share "
                "one quota. Pass the user's id, or None with ip= for anonymous callers.",
            )
        return identity

    @staticmethod
    def keys(identity: object, keys: object) -> Mapping[str, object] | None:
        """The app keys of a call (``keys=``, checked), or None."""
        if keys is not None:
            # A dict, and the read-only view a Caller keeps, skip the Mapping ABC's
            # isinstance: for a mappingproxy (registered with the ABC, not a subclass)
            # it runs the ABC's whole subclass check every time.
            if (
                type(keys) is not dict
                and type(keys) is not MappingProxyType
                and not isinstance(keys, Mapping)
            ):
                raise InvalidArgumentError(
                    "keys",
                    f"keys must be a mapping of key names to values, not "
                    f"{type(keys).__name__}; e.g. keys={{'org': org.id}}.",
                )
            return keys
        return None

    def _key_value(self, rule: AppRule, keys: Mapping[str, object] | None) -> str | None:
        """The value of the app key ``rule`` counts by, checked; None when it is missing."""
        assert rule.per_key is not None
        value = keys.get(rule.per_key) if keys else None
        if value is None:
            return None
        return self._identity(value, f"keys[{rule.per_key!r}]")

    def _tag(
        self,
        rule: AppRule,
        identity: object,
        ip: object,
        keys: Mapping[str, object] | None = None,
    ) -> str:
        """The hash-tag content ``check_request`` counts ``rule`` by: the user, the app key
        it names (``per: org``), or the client address for a per-IP limit and a caller
        without what the limit counts (an anonymous caller, or one whose identify returned
        no such key: counting by address keeps such callers limited, never unlimited)."""
        if rule.per_key is not None:
            value = self._key_value(rule, keys)
            if value is not None:
                return _keys.identity_tag(_keys.named_kind(rule.per_key), value)
            return self._ip_tag(rule, ip)
        if not rule.per_ip and identity is not None:
            return _keys.identity_tag(_keys.USER, self._identity(identity, "identity"))
        return self._ip_tag(rule, ip)

    def _limit_tag(
        self,
        rule: AppRule,
        identity: object,
        ip: object,
        keys: object = None,
    ) -> str:
        """What ``hit``/``peek``/``reset`` count ``rule`` by: as ``check_request`` does.
        A per-IP limit takes the address only as ``ip=``: an identity in its place would
        be counted as an address, and a user who may choose their own name (a login form's
        username) could then exhaust the quota of any address they spell. Likewise a
        ``per: org`` limit takes the organisation only in ``keys=``, never as the identity."""
        if keys is None and rule.per_key is None and not rule.per_ip and type(identity) is str:
            # A user counted by a per-user limit (most calls): what the steps below give
            # for it, without the ones that do not apply.
            return _keys.identity_tag(_keys.USER, self._identity(identity, "identity"))
        if rule.per_ip and ip is None and identity is not None:
            raise InvalidArgumentError(
                "ip",
                f"limit {rule.name!r} counts per client IP, and hit/peek/reset take the "
                f"address only as ip=, never as the identity; call "
                f"hit({rule.name!r}, None, ip=client_address).",
            )
        checked = self.keys(identity, keys)
        if rule.per_key is not None and ip is None and self._key_value(rule, checked) is None:
            raise InvalidArgumentError(
                "keys",
                f"limit {rule.name!r} counts per {rule.per_key}, but no keys["
                f"{rule.per_key!r}] was given; call hit({rule.name!r}, user, "
                f"keys={{{rule.per_key!r}: value}}), or pass ip= to count a caller without "
                f"one by address (as check_request does).",
            )
        return self._tag(rule, identity, ip, checked)

    def _ip_tag(self, rule: AppRule, ip: object) -> str:
        """A client address as a tag of kind ``i``: IPv4 per address, IPv6 per network of
        the policy's ``clients.ipv6_prefix`` (policy.ip_bucket)."""
        if ip is None:
            if rule.per_ip:
                what = "counts per client IP"
            elif rule.per_key is not None:
                what = f"counts callers without keys[{rule.per_key!r}] by IP"
            else:
                what = "counts anonymous callers by IP"
            raise InvalidArgumentError(
                "ip",
                f"limit {rule.name!r} {what}, but no ip= was given; pass the client's "
                "address (the middleware does).",
            )
        address = self._identity(ip, "ip")
        return _keys.identity_tag(_keys.IP, ip_bucket(address, self.policy.ipv6_prefix))

    # -- plans ----------------------------------------------------------------------------

    def checks(self, rule: AppRule, tier: str, tag: str, cost: int) -> list[Check]:
        """The checks of ``rule`` for ``tier``: one per rate (none if the tier has none)."""
        blocks = self._blocks.get((rule.name, tier))
        if blocks is None:
            blocks = _blocks(self.policy.key_prefix, rule, tier)
            self._blocks[(rule.name, tier)] = blocks
        # Positional, in field order (rule, tier, rate, key, cost, block): cheaper per call.
        if len(blocks) == 1:
            # One rate (most limits): its check without a comprehension.
            block = blocks[0]
            return [
                Check(rule, tier, block.rate, block.key_head + tag + block.key_tail, cost, block)
            ]
        return [
            Check(rule, tier, block.rate, block.key_head + tag + block.key_tail, cost, block)
            for block in blocks
        ]

    def for_limit(
        self,
        operation: Operation,
        name: object,
        identity: object,
        tier: object,
        cost: object,
        *,
        ip: object = None,
        keys: object = None,
    ) -> Prepared:
        """The plan for ``hit``/``peek`` of one named limit: for the user ``identity``, or
        with identity None for an anonymous caller at ``ip``; ``keys`` for a limit that
        counts by an app key (see _limit_tag)."""
        if (
            keys is None
            and ip is None
            and type(identity) is str
            and type(name) is str
            and type(cost) is int
            and (tier is None or type(tier) is str)
            and len(identity) <= _PLANNED_IDENTITY
        ):
            # A user's call of a limit by name (most calls): its checks as planned before.
            memo = (name, identity, tier, cost)
            planned = self._planned.entries.get(memo)
            if planned is None:
                planned = self._plan_user(name, identity, tier, cost)
                self._planned.keep(memo, planned)
            return self.prepare(operation, planned)
        return self.prepare(
            operation, self._checks_of(name, identity, tier, cost, ip=ip, keys=keys)
        )

    def _plan_user(
        self, name: str, identity: str, tier: str | None, cost: int
    ) -> tuple[Check, ...]:
        """The checks of a user's call that for_limit's memo does not hold (more active
        users than it keeps): the limit's rule and tier are looked up and checked once per
        (limit, tier as passed), so such a call costs the identity's tag and its checks,
        not every argument's lookup and check again (docs/benchmarks-compare.md, "Why each
        speed trick stays").
        Anything unusual (a limit that counts by IP or by an app key, an empty identity, a
        cost out of range) takes _checks_of, which raises what it must."""
        shape = self._user_shapes.get((name, tier))
        if shape is None or not identity or not 1 <= cost <= MAX_COST:
            checks = tuple(self._checks_of(name, identity, tier, cost, ip=None, keys=None))
            # Every argument passed: the limit counts by the identity (one that counts
            # by IP or by an app key has raised, without ip= and keys=).
            self._user_shapes[(name, tier)] = (self.rule(name), self.tier(tier))
            return checks
        rule, resolved = shape
        return tuple(self.checks(rule, resolved, _keys.identity_tag(_keys.USER, identity), cost))

    def _checks_of(
        self,
        name: object,
        identity: object,
        tier: object,
        cost: object,
        *,
        ip: object,
        keys: object,
    ) -> list[Check]:
        """The checks of ``for_limit``, every argument checked."""
        rule = self.rule(name)
        resolved = self.tier(tier)
        counted = self.cost(cost)
        tag = self._limit_tag(rule, identity, ip, keys)
        return self.checks(rule, resolved, tag, counted)

    def for_request(
        self,
        operation: Operation,
        method: str,
        path: str,
        identity: object,
        *,
        tier: object,
        cost: object,
        ip: object,
        host: str | None,
        keys: object = None,
        mount: str = "",
    ) -> Prepared:
        """The plan for ``check_request``: every limit whose matcher applies, each counted
        by what it names (the user, the client IP, or an app key from ``keys``)."""
        group = self._match(method, path, host, mount)
        if (
            (keys is None or (not keys and (type(keys) is dict or type(keys) is MappingProxyType)))
            and group.keyed
            and (identity is None or (type(identity) is str and len(identity) <= _PLANNED_IDENTITY))
            and (ip is None or (type(ip) is str and len(ip) <= _PLANNED_IP))
            and type(cost) is int
            and (tier is None or type(tier) is str)
        ):
            # A request without app keys (most requests): its checks as planned before for
            # the same limits, caller, tier and cost. The address is part of the key only
            # where a plan can depend on it: an anonymous caller's, or a set with a limit
            # that counts by address.
            memo = (
                group,
                identity,
                ip if identity is None or group.by_ip else None,
                tier,
                cost,
            )
            planned = self._requested.entries.get(memo)
            if planned is None:
                checks = tuple(
                    self._request_checks(group, identity, tier=tier, cost=cost, ip=ip, keys=None)
                )
                parts = _CallParts.of(checks) if len(checks) > 1 and not self.cluster else None
                planned = _Planned(checks, parts)
                self._requested.keep(memo, planned)
            return self.prepare(operation, planned.checks, planned.parts)
        return self.prepare(
            operation,
            self._request_checks(group, identity, tier=tier, cost=cost, ip=ip, keys=keys),
        )

    def _request_checks(
        self,
        group: _Group,
        identity: object,
        *,
        tier: object,
        cost: object,
        ip: object,
        keys: object,
    ) -> list[Check]:
        """The checks of ``for_request``, every argument checked."""
        resolved = self.tier(tier)
        counted = self.cost(cost)
        checked = self.keys(identity, keys)
        checks: list[Check] = []
        # The tag of each kind of identity (user, ip, an app key), made once however many
        # limits use it.
        tags: dict[str | None, str] = {}
        for rule in group.rules:
            if resolved not in rule.tiers:
                continue
            # None: by address (per: ip, or an anonymous caller of a per-user limit).
            kind = rule.per_key
            if kind is None and not (rule.per_ip or identity is None):
                kind = _USER_KIND
            tag = tags.get(kind)
            if tag is None:
                tag = tags[kind] = self._tag(rule, identity, ip, checked)
            blocks = self._blocks.get((rule.name, resolved))
            if blocks is None:
                checks.extend(self.checks(rule, resolved, tag, counted))
                continue
            # What self.checks does, inlined: this loop runs for every request.
            for block in blocks:
                checks.append(
                    Check(
                        rule,
                        resolved,
                        block.rate,
                        block.key_head + tag + block.key_tail,
                        counted,
                        block,
                    )
                )
        return checks

    def prepare(
        self, operation: Operation, checks: Sequence[Check], parts: _CallParts | None = None
    ) -> Prepared:
        """Group ``checks`` into script calls: one, or one per hash slot on Redis Cluster.
        ``parts``: the encoded parts of a one-server call of these checks, when a
        remembered plan kept them (``Core.for_request``)."""
        now = "" if self._test_clock is None else str(round(self._test_clock() * 1_000_000))
        # The nonce names sliding-log entries: unique per call, so two requests in the same
        # microsecond never merge into one entry. 48 bits of the limiter's own generator
        # (see _NONCES), which spares a system call per decision (os.urandom), as twelve
        # hex digits made in C by bytes.hex() (docs/benchmarks-compare.md, "Why each
        # speed trick stays").
        nonce = _NONCES.getrandbits(48).to_bytes(6, "little").hex() if operation == "hit" else ""
        if not self.cluster:
            # One server: every check in one call.
            if len(checks) == 1:
                return Prepared(
                    operation,
                    tuple(checks),
                    _ONE_GROUP,
                    (_one_call(operation, checks[0], now, nonce, self._slack),),
                    nonce,
                    self._slack,
                )
            if not checks:
                return Prepared(operation, (), (), (), nonce, self._slack)
            call = (parts or _CallParts.of(checks)).call(
                operation,
                now,
                nonce,
                self._slack,
                slot=None,
                lead=_lead(operation, now, nonce, self._slack),
            )
            return Prepared(
                operation, tuple(checks), _one_group(len(checks)), (call,), nonce, self._slack
            )
        by_slot: dict[int, list[int]] = {}
        for index, check in enumerate(checks):
            by_slot.setdefault(key_slot(check.key.encode()), []).append(index)
        groups = tuple(tuple(g) for g in by_slot.values())
        slots = list(by_slot)
        lead = _lead(operation, now, nonce, self._slack)
        calls = tuple(
            _script_call(
                operation,
                [checks[i] for i in group],
                now=now,
                nonce=nonce,
                slack=self._slack,
                slot=slot,
                lead=lead,
            )
            for group, slot in zip(groups, slots, strict=True)
        )
        return Prepared(operation, tuple(checks), groups, calls, nonce, self._slack)

    def reset_keys(
        self,
        name: object,
        identity: object,
        tier: object,
        *,
        ip: object = None,
        keys: object = None,
    ) -> list[str]:
        """Every key of limit ``name`` for ``identity`` (or the anonymous caller at ``ip``,
        or the app key in ``keys``): one tier's, or every tier's."""
        rule = self.rule(name)
        tag = self._limit_tag(rule, identity, ip, keys)
        tiers = [self.tier(tier)] if tier is not None else list(rule.tiers)
        found = {c.key: None for t in tiers for c in self.checks(rule, t, tag, 1)}
        return list(found)
