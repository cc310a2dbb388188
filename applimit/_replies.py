"""A decision's plan as the shells run it, and what its replies make of it.

:class:`Prepared` is what ``Core.for_limit`` and ``Core.for_request`` return: the checks
of one decision and the script calls that run them. :meth:`Prepared.decide` turns the
calls' replies into the :class:`~applimit.Decision`, and into refund calls when a denied
request's checks were split over hash slots (Redis Cluster, several identities) and some
of them consumed; :meth:`Prepared.degraded` is the decision when Redis cannot answer.
:func:`wrote` says whether a call consumed anything (what ends an outage in which Redis
refused writes).

No I/O. Compiled by mypyc (setup.py): every decision passes through it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ._calls import Check, Operation, ScriptCall, encoded_lead, script_call
from ._decision import Decision, LimitResult, combine, leased, make_result, single

_NONE = -1
_NEVER = -2
_REPLY_HEAD = 2
_REPLY_FIELDS = 5
# The length of a reply to one check.
_ONE_CHECK = _REPLY_HEAD + _REPLY_FIELDS


def wrote(call: ScriptCall, reply: object) -> bool:
    """Whether the script call consumed anything (a hit whose reply says so): what ends an
    outage in which Redis refused writes (see _breaker.py)."""
    # The reply is {now, n, then per check: allowed, consumed, ...}: consumed at 3, 8, ...
    return call.args[0] == "hit" and isinstance(reply, list) and any(reply[3::_REPLY_FIELDS])


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

        ValueError when a reply is missing or is not the script's: the decider counts on
        it to find a failed call, whose outcome stands in the list in place of its reply.
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
                result = self._result(checks[0], values, _REPLY_HEAD)
                if checks[0].block.lease and result.consumed:
                    return self._leased(single(result), [result], values[0]), ()
                return single(result), ()
            values = _int_list(replies[0], _REPLY_HEAD + _REPLY_FIELDS * len(checks))
            make = self._result
            results = [
                make(check, values, at)
                for check, at in zip(
                    self.checks, range(_REPLY_HEAD, len(values), _REPLY_FIELDS), strict=True
                )
            ]
            decision = combine(results)
            if decision.allowed:
                return self._leased(decision, results, values[0]), ()
            return decision, ()
        return self._decide_slots(replies)

    def _decide_slots(self, replies: Sequence[object]) -> tuple[Decision, tuple[ScriptCall, ...]]:
        """:meth:`decide` for a plan of several calls (Redis Cluster, one per hash slot):
        a denied request gives back what the calls that admitted it consumed."""
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
                    script_call(
                        "refund",
                        [self.checks[i] for i in spent],
                        now=refund_now,
                        nonce=self.nonce,
                        slack="0",
                        slot=call.slot,
                        lead=encoded_lead("refund", refund_now, self.nonce, "0"),
                    )
                )
                for i in spent:
                    final[i] = _given_back(final[i], self.checks[i].cost)
            decision = combine(final)
        elif decision.allowed:
            decision = self._leased_by_slot(decision, final, times)
        return decision, tuple(refunds)

    def _leased(self, decision: Decision, results: Sequence[LimitResult], now: int) -> Decision:
        """``decision`` of one call, holding the leases its concurrency checks took, if
        any (see ``Leased``)."""
        for check in self.checks:
            if check.block.lease:
                break
        else:
            # No concurrency limit (nearly every plan): nothing to hold.
            return decision
        taken = [
            check
            for check, result in zip(self.checks, results, strict=True)
            if check.block.lease and result.consumed
        ]
        if not taken:
            return decision
        return leased(decision, (self._release(taken, now, self.calls[0].slot),))

    def _leased_by_slot(
        self, decision: Decision, results: Sequence[LimitResult], times: Sequence[int]
    ) -> Decision:
        """:meth:`_leased` for a decision of several calls (one per hash slot)."""
        releases = []
        for group, call, now in zip(self.groups, self.calls, times, strict=True):
            taken = [
                self.checks[i] for i in group if self.checks[i].block.lease and results[i].consumed
            ]
            if taken:
                releases.append(self._release(taken, now, call.slot))
        return leased(decision, tuple(releases)) if releases else decision

    def _release(self, checks: list[Check], now: int, slot: int | None) -> ScriptCall:
        """The refund call that gives back the leases of ``checks`` (this call's nonce)."""
        text = str(now)
        return script_call(
            "refund",
            checks,
            now=text,
            nonce=self.nonce,
            slack="0",
            slot=slot,
            lead=encoded_lead("refund", text, self.nonce, "0"),
        )

    def degraded(self, retry_after: float) -> Decision:
        """The decision when Redis cannot answer: each limit's on_redis_error decides."""
        results = [
            LimitResult(
                name=c.rule.name,
                tier=c.tier,
                # The block's: a calendar quota's says so (quota:month).
                algorithm=c.block.result_head[2],
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
