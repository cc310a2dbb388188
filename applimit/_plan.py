"""Planning: a request in, a :class:`~applimit._replies.Prepared` plan out. No I/O.

:class:`Core` turns each call of a limiter into the checks to run (one per rate of every
limit that applies), grouped into script calls; the shells only run the calls, and the
plan's :meth:`~applimit._replies.Prepared.decide` turns the replies into the decision.
``Core.for_limit`` plans ``hit`` and ``peek`` of one limit by name, ``Core.for_request``
plans ``check_request`` (every limit whose matcher applies). What is the same from call to
call is remembered, each in a bounded :class:`~applimit._memo.Memo`: a user's plan of a
limit, a request's plan per set of matching limits, the limits that match a path, and
each limit and tier's encoded rates.

All the checks of one call go into one script call, which decides them atomically. The
one exception is Redis Cluster when one request's limits count different identities (a
per-IP limit and a per-user limit, or a per-user and a ``per: org`` limit): their keys live
in different slots, so there is one call per slot, and when the request is denied after
some of them consumed, the plan adds refund calls that give the consumption back (see
docs/applimit.md).

Compiled by mypyc (setup.py), with the modules it builds on: ``_rules`` (the compiled
policy), ``_arguments`` (the checks of what callers pass), ``_calls`` (what a plan sends,
encoded), ``_replies`` (the plan and its replies) and ``_memo``.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from edgegen_policy import OVERRIDE_TIER, request_paths
from redis.crc import key_slot

from . import _keys
from ._arguments import (
    MAX_COST,
    check_cost,
    check_counted_later,
    check_keys,
    check_rule,
    check_status,
    check_tier,
    limit_tag,
    request_tag,
)
from ._calls import (
    TEST_CLOCK_TTL_SLACK_MS,
    Block,
    CallParts,
    Check,
    Operation,
    blocks,
    encoded_lead,
    one_call,
    script_call,
)
from ._memo import Memo
from ._overrides import Applied
from ._periods import Periods
from ._replies import Prepared
from ._rules import USER_KIND, AppRule, CompiledPolicy

# The nonces' generator: private, so an app that seeds the `random` module (or every
# worker seeding it alike) cannot make two limiters' nonces repeat; seeded from the OS, and
# again in every forked child, so processes never share a sequence.
_NONCES = random.Random()
os.register_at_fork(after_in_child=_NONCES.seed)

# The groups of a one-server plan of n checks (every check in one call), for n below
# _ONE_GROUPS_UP_TO; a plan of more checks makes its own.
_ONE_GROUPS_UP_TO = 64
_ONE_GROUPS: tuple[tuple[tuple[int, ...], ...], ...] = tuple(
    (tuple(range(count)),) for count in range(_ONE_GROUPS_UP_TO)
)
_ONE_GROUP = _ONE_GROUPS[1]

# Entries of Core's memo of matching limits (see Core.matching), and the longest path
# and host (in characters) it keeps: at most some 4096 * 1.3 KiB of keys.
_MATCHING_CACHE = 4096
_MATCHING_PATH = 1024
_MATCHING_HOST = 255  # a DNS name is at most 253 characters, a port adds a few
# for_limit's planned checks: at most this many (user, limit, tier, cost), and identities
# no longer than this (a longer one is planned anew every call).
_PLANNED_CACHE = 4096
_PLANNED_IDENTITY = 256
# for_request's planned checks: as many, and client addresses no longer than this (an
# IPv6 address with a zone is at most 45 + a few characters; longer is no address).
_PLANNED_IP = 64
# Distinct sets of matching limits given a key of their own (see _Group); a policy's
# matchers make a handful, so this bound is never reached in practice.
_GROUPS = 1024


@dataclass(frozen=True, slots=True)
class _Shape:
    """One limit and tier, as a call names them: the rule, the tier it resolves to, and
    its rates as every call sends them (``Block``). ``by_user``: the limit counts by the
    user (not per IP, not by an app key), so a user's call can be planned from it alone."""

    rule: AppRule
    tier: str
    blocks: tuple[Block, ...]
    by_user: bool


@dataclass(frozen=True, slots=True)
class RequestMatch:
    """The app limits the middleware applies that match a request (``Limiter.match``).

    ``limits``: their names, in policy order, whatever the tier (the tier is known only
    once the app has identified the caller). ``counts_responses``: one of them has
    ``count_when``, so the response must be recorded (``record_request``) once its status
    is known. Where no limit matches there is no match (None), so a match is always true.
    """

    limits: tuple[str, ...]
    counts_responses: bool


class _Group:
    """The limits that match a request (Core.matching): one object per distinct set, so
    that the plans of requests to different paths that match the same limits are
    remembered once (for_request's memo is keyed by the object, hashed by identity).

    ``by_ip``: whether a plan of this set can depend on the client address when the
    caller is a user (a per-IP limit, or a ``per:`` key limit, which counts a caller
    without the key by address); ``keyed``: whether the set has its key (it is interned);
    one made while the memo of sets keeps no more does not, and the plans of its requests
    are not remembered. ``found``: the set as ``Core.request_match`` answers it, made once.
    """

    __slots__ = ("by_ip", "found", "keyed", "rules")

    def __init__(self, rules: tuple[AppRule, ...]) -> None:
        self.rules = rules
        self.by_ip = any(rule.per_ip or rule.per_key is not None for rule in rules)
        self.keyed = False
        # counts_responses: a count_when limit is among them, so the response must be
        # recorded.
        self.found: RequestMatch | None = (
            RequestMatch(tuple(rule.name for rule in rules), any(rule.count_when for rule in rules))
            if rules
            else None
        )


@dataclass(frozen=True, slots=True)
class _Planned:
    """A remembered request plan (``Core.for_request``): its checks and, for a call of
    several checks on one server, that call's parts, so that a request only encodes its
    own lead (the nonce)."""

    checks: tuple[Check, ...]
    parts: CallParts | None


class Core:
    """Builds plans from requests; holds no connection."""

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
        # Each (limit, tier as passed)'s rule, resolved tier and encoded rates, made on
        # first use (only for a limit and tier that resolved: the memo's bound is every
        # pair the policy has). for_limit's memo below misses when more users are active
        # than it holds; such a call is planned from its limit's shape, with its rule and
        # tier looked up and checked once (see _plan_user).
        self._shapes: Memo[tuple[str, str | None], _Shape] = Memo(
            len(compiled.rules) * (len(compiled.tiers) + 1) or 1
        )
        # The blocks record() counts a count_when limit with (its tier's rates without the
        # "after" flag), per (limit, resolved tier); made on first use.
        self._record_blocks: Memo[tuple[str, str], tuple[Block, ...]] = Memo(
            len(compiled.rules) * len(compiled.tiers) or 1
        )
        # The middleware's limits that match a (method, path, host, mount), every tier: the
        # middleware asks match() before identify() and check_request() after it, and
        # both read this instead of decoding the path and walking the matchers twice.
        self._matching: Memo[tuple[str, str, str | None, str], _Group] = Memo(_MATCHING_CACHE)
        # One _Group per distinct set of matching limits (by their names): the plan memo
        # of for_request holds them as keys.
        self._groups: Memo[tuple[str, ...], _Group] = Memo(_GROUPS)
        # The checks of for_limit's commonest calls (a user, a limit by name, a tier, a
        # cost), planned once: the rule, tier and cost checks, the identity's escaping and
        # the keys are the same for every call of a user.
        self._planned: Memo[tuple[str, str, str | None, int], tuple[Check, ...]] = Memo(
            _PLANNED_CACHE
        )
        # for_request's the same way, per (set of matching limits, user or None, client
        # address where the set counts by it, tier, cost): what the middleware asks.
        self._requested: Memo[tuple[_Group, str | None, str | None, str | None, int], _Planned] = (
            Memo(_PLANNED_CACHE)
        )
        # The overrides in force, by (limit, hash tag), and the limits they are of. The
        # shapes of those limits are kept apart (_own_shapes), never in _shapes: every
        # path that plans from a shape it found in _shapes (_plan_user, _request_checks)
        # asks checks() instead for them, so no path of a limit without overrides reads
        # the overrides at all. use_overrides replaces them and forgets the remembered
        # plans; ``generation`` counts the replacements, so that a plan made from the old
        # ones is not remembered.
        self.overrides: Mapping[tuple[str, str], Applied] = MappingProxyType({})
        self._overridden_limits: frozenset[str] = frozenset()
        self._own_shapes: dict[tuple[str, str | None], _Shape] = {}
        self.generation = 0

    def use_overrides(self, overrides: Mapping[tuple[str, str], Applied]) -> None:
        """Plan with ``overrides`` from now on (``_overrides.table``), forgetting every plan
        remembered with the ones before."""
        # In this order: a plan or shape made meanwhile is kept before its maker reads the
        # generation (or the overridden limits) again, so either that reading sees the
        # change or the clearing below comes after the keeping.
        self.overrides = overrides
        limits = self._overridden_limits = frozenset(name for name, _ in overrides)
        self.generation += 1
        self._own_shapes = {}
        shapes = self._shapes.entries
        for key in [key for key, shape in list(shapes.items()) if shape.rule.name in limits]:
            shapes.pop(key, None)
        self._planned.entries.clear()
        self._requested.entries.clear()

    def matching(
        self, method: str, path: str, host: str | None, mount: str = ""
    ) -> tuple[AppRule, ...]:
        """The limits the middleware applies that match this request, in policy order
        (every tier: the tier is applied by the caller). Pure, and remembered."""
        return self._match(method, path, host, mount).rules

    def request_match(
        self, method: str, path: str, host: str | None, mount: str = ""
    ) -> RequestMatch | None:
        """The limits the middleware applies that match this request, and whether one of
        them counts responses; None when none matches. Pure, and remembered (the lookup
        ``matching`` makes)."""
        return self._match(method, path, host, mount).found

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
            found = self._groups.entries.get(names)
            if found is None:
                found = _Group(rules)
                found.keyed = self._groups.keep(names, found)
            # Long paths and hosts (both the client's to choose) are not kept: the memo's
            # memory stays bounded by its entries.
            if (
                len(path) <= _MATCHING_PATH
                and len(mount) <= _MATCHING_PATH
                and (host is None or len(host) <= _MATCHING_HOST)
            ):
                self._matching.keep(key, found)
        return found

    def tier(self, tier: object) -> str:
        """The tier to use: the given one if the policy lists it, else the lowest one."""
        return check_tier(self.policy, tier)

    def rule(self, name: object) -> AppRule:
        """The app limit called ``name``; UnknownLimitError names the ones that exist."""
        return check_rule(self.policy, name)

    def _shape(self, key: tuple[str, str | None], rule: AppRule, tier: str) -> _Shape:
        """The shape of ``rule`` for the resolved ``tier``, remembered under ``key``."""
        shape = _Shape(
            rule,
            tier,
            blocks(self.policy.key_prefix, rule, tier),
            rule.per_key is None and not rule.per_ip,
        )
        if rule.name in self._overridden_limits:
            self._own_shapes[key] = shape
            return shape
        self._shapes.keep(key, shape)
        if rule.name in self._overridden_limits:
            # Overridden meanwhile (use_overrides): kept first, dropped after.
            self._shapes.entries.pop(key, None)
        return shape

    def checks(self, rule: AppRule, tier: str, tag: str, cost: int) -> list[Check]:
        """The checks of ``rule`` for ``tier``: one per rate (none if the tier has none)."""
        shape = self._shapes.entries.get((rule.name, tier))
        if shape is None:
            if rule.name in self._overridden_limits:
                return self._own_checks(rule, tier, tag, cost)
            shape = self._shape((rule.name, tier), rule, tier)
        found = shape.blocks
        # Positional, in field order (rule, tier, rate, key, cost, block): cheaper per call.
        if len(found) == 1:
            # One rate (most limits): its check without a comprehension.
            block = found[0]
            return [
                Check(rule, tier, block.rate, block.key_head + tag + block.key_tail, cost, block)
            ]
        return [
            Check(rule, tier, block.rate, block.key_head + tag + block.key_tail, cost, block)
            for block in found
        ]

    def _own_checks(self, rule: AppRule, tier: str, tag: str, cost: int) -> list[Check]:
        """The checks of ``rule``, a limit with overrides: the identity's override where it
        has one (and the tier has the limit), else the tier's."""
        shape = self._own_shapes.get((rule.name, tier)) or self._shape(
            (rule.name, tier), rule, tier
        )
        own = self.overrides.get((rule.name, tag)) if _has(rule, tier) else None
        return _with_override(rule, tier, tag, cost, found=shape.blocks, own=own, record=False)

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
        counts by an app key (see ``_arguments.limit_tag``)."""
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
                generation = self.generation
                planned = self._plan_user(name, identity, tier, cost)
                self._planned.keep(memo, planned)
                if generation != self.generation:
                    # Overrides changed while it was planned (use_overrides): kept first,
                    # then dropped here or by use_overrides' own clearing, whichever is later.
                    self._planned.entries.pop(memo, None)
            return self.prepare(operation, planned)
        return self.prepare(
            operation,
            self._keyed(self._checks_of(name, identity, tier, cost, ip=ip, keys=keys), keys),
        )

    def _plan_user(
        self, name: str, identity: str, tier: str | None, cost: int
    ) -> tuple[Check, ...]:
        """The checks of a user's call that for_limit's memo does not hold (more active
        users than it keeps): planned from the limit's shape, whose rule and tier were
        looked up and checked once per (limit, tier as passed), so such a call costs the
        identity's tag and its checks, not every argument's lookup and check again
        (docs/benchmarks-compare.md, "Why each speed trick stays").
        Anything unusual (a limit that counts by IP or by an app key, an empty identity, a
        cost out of range) takes _checks_of, which raises what it must."""
        shape = self._shapes.entries.get((name, tier))
        if shape is None or not shape.by_user or not identity or not 1 <= cost <= MAX_COST:
            checks = tuple(self._checks_of(name, identity, tier, cost, ip=None, keys=None))
            # Every argument passed: the limit counts by the identity (one that counts by
            # IP or by an app key has raised, without ip= and keys=).
            if shape is None:
                self._shape((name, tier), self.rule(name), self.tier(tier))
            return checks
        rule, resolved = shape.rule, shape.tier
        tag = _keys.identity_tag(_keys.USER, identity)
        return tuple(
            [
                Check(
                    rule, resolved, block.rate, block.key_head + tag + block.key_tail, cost, block
                )
                for block in shape.blocks
            ]
        )

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
        policy = self.policy
        rule = check_rule(policy, name)
        resolved = check_tier(policy, tier)
        counted = check_cost(cost)
        tag = limit_tag(policy, rule, identity, ip, keys)
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
                generation = self.generation
                checks = tuple(
                    self._request_checks(
                        group.rules, identity, tier=tier, cost=cost, ip=ip, keys=None
                    )
                )
                parts = CallParts.of(checks) if len(checks) > 1 and not self.cluster else None
                planned = _Planned(checks, parts)
                self._requested.keep(memo, planned)
                if generation != self.generation:
                    self._requested.entries.pop(memo, None)
            return self.prepare(operation, planned.checks, planned.parts)
        return self.prepare(
            operation,
            self._keyed(
                self._request_checks(group.rules, identity, tier=tier, cost=cost, ip=ip, keys=keys),
                keys,
            ),
        )

    def _request_checks(
        self,
        rules: Sequence[AppRule],
        identity: object,
        *,
        tier: object,
        cost: object,
        ip: object,
        keys: object,
        record: bool = False,
    ) -> list[Check]:
        """The checks of ``for_request`` (``record``: of ``for_record_request``), every
        argument checked."""
        policy = self.policy
        resolved = check_tier(policy, tier)
        counted = check_cost(cost)
        checked = check_keys(keys)
        shapes = self._shapes.entries
        checks: list[Check] = []
        # The tag of each kind of identity (user, ip, an app key), made once however many
        # limits use it.
        tags: dict[str | None, str] = {}
        for rule in rules:
            if resolved not in rule.tiers:
                continue
            # None: by address (per: ip, or an anonymous caller of a per-user limit).
            kind = rule.per_key
            if kind is None and not (rule.per_ip or identity is None):
                kind = USER_KIND
            tag = tags.get(kind)
            if tag is None:
                tag = tags[kind] = request_tag(policy, rule, identity, ip, checked)
            if record:
                checks.extend(self._recorded(rule, resolved, tag, counted))
                continue
            shape = shapes.get((rule.name, resolved))
            if shape is None:
                checks.extend(self.checks(rule, resolved, tag, counted))
                continue
            # What self.checks does, inlined: this loop runs for every request.
            for block in shape.blocks:
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

    def for_record(
        self,
        name: object,
        identity: object,
        status: object,
        *,
        tier: object,
        cost: object,
        ip: object = None,
        keys: object = None,
    ) -> Prepared | None:
        """The plan that counts a response of ``status`` against the count_when limit
        ``name`` (``record``), or None when that status does not count. Identity, ``ip``
        and ``keys`` name the caller as for ``for_limit``."""
        policy = self.policy
        rule = check_counted_later(check_rule(policy, name))
        resolved = check_tier(policy, tier)
        counted = check_cost(cost)
        tag = limit_tag(policy, rule, identity, ip, keys)
        if not rule.counts(check_status(status)):
            return None
        return self.prepare("hit", self._keyed(self._recorded(rule, resolved, tag, counted), keys))

    def for_record_request(
        self,
        method: str,
        path: str,
        identity: object,
        status: object,
        *,
        tier: object,
        cost: object,
        ip: object,
        host: str | None,
        keys: object = None,
        mount: str = "",
    ) -> Prepared | None:
        """The plan that counts a response of ``status`` against every count_when limit
        that ``check_request`` checked for this request (``record_request``), or None when
        none counts it. Only count_when limits are counted: ``check_request`` has counted
        the others."""
        checked = check_status(status)
        group = self._match(method, path, host, mount)
        rules = [rule for rule in group.rules if rule.counts(checked)]
        if not rules:
            return None
        checks = self._request_checks(
            rules, identity, tier=tier, cost=cost, ip=ip, keys=keys, record=True
        )
        return self.prepare("hit", self._keyed(checks, keys)) if checks else None

    def _recorded(self, rule: AppRule, tier: str, tag: str, cost: int) -> list[Check]:
        """The checks that count a response against count_when ``rule`` for ``tier``."""
        found = self._record_blocks.entries.get((rule.name, tier))
        if found is None:
            found = blocks(self.policy.key_prefix, rule, tier, record=True)
            self._record_blocks.keep((rule.name, tier), found)
        # As for a hit: the override applies where the tier has the limit, which a tier of
        # concurrency alone has, though a record takes no lease (no blocks found).
        own = (
            self.overrides.get((rule.name, tag))
            if rule.name in self._overridden_limits and _has(rule, tier)
            else None
        )
        return _with_override(rule, tier, tag, cost, found=found, own=own, record=True)

    def prepare(
        self, operation: Operation, checks: Sequence[Check], parts: CallParts | None = None
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
            count = len(checks)
            if count == 1:
                return Prepared(
                    operation,
                    tuple(checks),
                    _ONE_GROUP,
                    (one_call(operation, checks[0], now, nonce, self._slack),),
                    nonce,
                    self._slack,
                )
            if not checks:
                return Prepared(operation, (), (), (), nonce, self._slack)
            call = (parts or CallParts.of(checks)).call(
                operation,
                now,
                nonce,
                self._slack,
                slot=None,
                lead=encoded_lead(operation, now, nonce, self._slack),
            )
            one = _ONE_GROUPS[count] if count < _ONE_GROUPS_UP_TO else (tuple(range(count)),)
            return Prepared(operation, tuple(checks), one, (call,), nonce, self._slack)
        by_slot: dict[int, list[int]] = {}
        for index, check in enumerate(checks):
            by_slot.setdefault(key_slot(check.key.encode()), []).append(index)
        groups = tuple(tuple(g) for g in by_slot.values())
        slots = list(by_slot)
        lead = encoded_lead(operation, now, nonce, self._slack)
        calls = tuple(
            script_call(
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

    def _keyed(self, checks: Sequence[Check], keys: object) -> Sequence[Check]:
        """The checks of a call that passed app keys, as its plan runs them: here as they
        are (a policy without calendar quotas; see QuotaCore)."""
        return checks

    def _known(self, checks: list[Check], keys: object) -> list[Check]:
        """The keys ``reset_keys`` deletes: here the checks' own (see QuotaCore)."""
        return checks

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
        policy = self.policy
        rule = check_rule(policy, name)
        tag = limit_tag(policy, rule, identity, ip, keys)
        tiers = [check_tier(policy, tier)] if tier is not None else _tiers_of(rule)
        # The tiers' own blocks, those an override replaces included, and the override's.
        checks = [
            Check(rule, t, b.rate, b.key_head + tag + b.key_tail, 1, b)
            for t in tiers
            for b in blocks(policy.key_prefix, rule, t)
        ]
        own = self.overrides.get((rule.name, tag))
        for block in own.blocks if own is not None else ():
            checks.append(
                Check(
                    rule, OVERRIDE_TIER, block.rate, block.key_head + tag + block.key_tail, 1, block
                )
            )
        return list({c.key: None for c in self._known(checks, keys)})

    def keys_of(self, rule: AppRule, tiers: Sequence[str], tag: str) -> list[str]:
        """The keys of ``rule`` for the identity of ``tag`` under ``tiers`` (an override's
        are its blocks'); a calendar quota's without its period: a cached denial is
        answered only when every check of the decision has one, and a limit with quotas
        has rates, whose keys these hold."""
        found: dict[str, None] = {}
        for each in tiers:
            shape = self._shapes.entries.get((rule.name, each))
            if shape is None:
                shape = self._shape((rule.name, each), rule, each)
            for block in shape.blocks:
                found[block.key_head + tag + block.key_tail] = None
        return list(found)


def _has(rule: AppRule, tier: str) -> bool:
    """Whether ``tier`` has ``rule`` at all: rates (quotas need them) or concurrency."""
    return bool(rule.tiers.get(tier)) or tier in rule.concurrency


def _tiers_of(rule: AppRule) -> list[str]:
    """The tiers that have ``rule`` (:func:`_has`), rates first."""
    return [*rule.tiers, *(t for t in rule.concurrency if t not in rule.tiers)]


def _with_override(
    rule: AppRule,
    tier: str,
    tag: str,
    cost: int,
    *,
    found: Sequence[Block],
    own: Applied | None,
    record: bool,
) -> list[Check]:
    """The checks of ``rule`` for ``tier`` from its blocks ``found``, with the identity's
    override ``own`` (if any) in place of the kinds of block it gives."""
    if own is None:
        return [Check(rule, tier, b.rate, b.key_head + tag + b.key_tail, cost, b) for b in found]
    return [
        Check(rule, name, b.rate, b.key_head + tag + b.key_tail, cost, b)
        for name, b in own.merged(found, tier, record=record)
    ]


class QuotaCore(Core):
    """The core of a policy with calendar quotas: each plan's quota checks are given the
    period of the call's time (``_periods.Periods``) before they are grouped into calls.
    A policy without quotas gets :class:`Core` (``make_core``), whose plans pay nothing
    for this."""

    def __init__(
        self,
        compiled: CompiledPolicy,
        *,
        cluster: bool,
        test_clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        """As :class:`Core`; ``wall_clock`` (seconds) places calls in their periods when
        there is no test clock: the memory:// store's clock, which tests may move (the
        pytest plugin's ``applimit_clock``), else this machine's."""
        super().__init__(compiled, cluster=cluster, test_clock=test_clock)
        self._wall_clock = wall_clock
        self._periods = Periods()
        # A remembered plan's checks (for_limit's, for_request's) dated, by the plan's id,
        # until one of its periods ends: (the plan, from, until, dated checks, their
        # call's parts). The plan is kept to make its id unique while the entry lives.
        self._dated: Memo[
            int, tuple[Sequence[Check], int, int, tuple[Check, ...], CallParts | None]
        ] = Memo(_PLANNED_CACHE)

    def _quota_time(self) -> int:
        """The time that places a request in its quotas' periods, in µs: the test clock's
        (the script's), else this machine's. The rates read Redis' clock; app servers kept
        by NTP differ from it by far less than a quota's grace (quota.lua)."""
        clock = self._test_clock or self._wall_clock
        return time.time_ns() // 1000 if clock is None else round(clock() * 1_000_000)

    def prepare(
        self, operation: Operation, checks: Sequence[Check], parts: CallParts | None = None
    ) -> Prepared:
        """As :meth:`Core.prepare`, the quota checks dated first (a call without app keys:
        a billing quota raises InvalidArgumentError); a remembered call's parts do not
        hold the period, so they are not used then."""
        at = self._quota_time()
        found = self._dated.entries.get(id(checks))
        if found is not None and found[0] is checks and found[1] <= at < found[2]:
            return super().prepare(operation, found[3], found[4])
        span = self._periods.span(checks, None, at)
        if span is None:
            return super().prepare(operation, checks, parts)
        dated, first, last = span
        parts = CallParts.of(dated) if len(dated) > 1 and not self.cluster else None
        if type(checks) is tuple:
            # A remembered plan (a tuple; the other plans are lists made per call).
            self._dated.keep(id(checks), (checks, first, last, dated, parts))
        return super().prepare(operation, dated, parts)

    def _keyed(self, checks: Sequence[Check], keys: object) -> Sequence[Check]:
        """The quota checks dated, a billing quota's from the billing day in ``keys``."""
        dated = self._periods.date(checks, keys, self._quota_time())
        return checks if dated is None else dated

    def _known(self, checks: list[Check], keys: object) -> list[Check]:
        """The quotas' counters of the current periods; a billing quota's only when
        ``keys`` gives the billing day."""
        return self._periods.date_known(checks, keys, self._quota_time())


def make_core(
    compiled: CompiledPolicy,
    *,
    cluster: bool,
    test_clock: Callable[[], float] | None = None,
    wall_clock: Callable[[], float] | None = None,
) -> Core:
    """The core for ``compiled``: a :class:`QuotaCore` (with ``wall_clock``) when a limit
    has calendar quotas."""
    if any(rule.quotas for rule in compiled.rules):
        return QuotaCore(compiled, cluster=cluster, test_clock=test_clock, wall_clock=wall_clock)
    return Core(compiled, cluster=cluster, test_clock=test_clock)
