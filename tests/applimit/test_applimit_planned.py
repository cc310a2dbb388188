"""Core.for_limit's planned checks: a user's call of a limit by name is planned once and
remembered. The memo plans what planning afresh plans, for any arguments, never keeps a
call that was refused, and stays bounded however many identities it sees."""

from __future__ import annotations

import re
from typing import Any

import edgegen_policy as policy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applimit import ApplimitError
from applimit import _plan as planning
from applimit._plan import Core
from applimit._replies import Prepared
from applimit._rules import compile_policy

POLICY = policy.loads(
    """
version: 1
tiers: [free, pro]
limits:
  - name: api
    app: { tiers: { free: [100/1m, 1000/1h], pro: 1000/1m } }
  - name: log
    app: { algorithm: sliding_log, tiers: { free: 10/1s } }
  - name: by-ip
    app: { per: ip, tiers: { free: 5/1m } }
  - name: per-org
    app: { per: org, tiers: { free: 50/1m } }
"""
)


def _plan(prepared: Prepared) -> list[tuple[Any, ...]]:
    """What a plan sends, but for its nonce (new with every call)."""
    return [
        (call.keys, call.args[0], call.args[3:], call.slot, check.tier, check.cost)
        for call, check in zip(prepared.calls, prepared.checks, strict=False)
    ]


def _outcome(core: Core, *args: Any) -> object:
    try:
        return _plan(core.for_limit("hit", *args))
    except ApplimitError as error:
        return (type(error), str(error))


@settings(max_examples=400, deadline=None)
@given(
    name=st.sampled_from(["api", "log", "by-ip", "per-org", "nope"]),
    identity=st.one_of(
        st.sampled_from(["alice", "bob", "", "a b", "ü", "x" * 300]),
        st.text(max_size=12),
    ),
    tier=st.sampled_from([None, "free", "pro", "gold"]),
    cost=st.sampled_from([1, 3, 0, -1, 10**12]),
)
def test_planned_checks_are_what_planning_afresh_gives(
    name: str, identity: str, tier: str | None, cost: int
) -> None:
    """Twice through the memo (planned, then remembered) and once planned afresh by a core
    that has never seen the call: the same keys, arguments and checks, or the same
    refusal each time."""
    core = Core(compile_policy(POLICY), cluster=False)
    first = _outcome(core, name, identity, tier, cost)
    again = _outcome(core, name, identity, tier, cost)
    afresh = Core(compile_policy(POLICY), cluster=False)
    expected = _outcome(afresh, name, identity, tier, cost)
    assert first == again == expected
    refused = isinstance(first, tuple)
    # A refused call is never kept: it is refused again, with the same words.
    assert (len(core._planned.entries) == 0) == (
        refused or len(identity) > planning._PLANNED_IDENTITY
    )


def test_the_memo_is_bounded_and_takes_only_plain_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most _PLANNED_CACHE calls are kept (see Memo); a call with
    ip=, keys=, an identity longer than _PLANNED_IDENTITY or arguments of other types is
    planned afresh every time and never kept."""
    monkeypatch.setattr(planning, "_PLANNED_CACHE", 8)
    core = Core(compile_policy(POLICY), cluster=False)
    for index in range(100):
        core.for_limit("hit", "api", f"user-{index}", None, 1)
        assert 1 <= len(core._planned.entries) <= 8
    core._planned.entries.clear()
    core.for_limit("hit", "by-ip", None, None, 1, ip="203.0.113.9")
    core.for_limit("hit", "per-org", None, None, 1, keys={"org": "acme"})
    core.for_limit("hit", "api", "y" * (planning._PLANNED_IDENTITY + 1), None, 1)
    assert core._planned.entries == {}
    # The same user with ip= is counted as the user, planned afresh.
    with_ip = core.for_limit("hit", "api", "alice", None, 1, ip="203.0.113.9")
    plain = core.for_limit("hit", "api", "alice", None, 1)
    assert _plan(with_ip) == _plan(plain)
    assert list(core._planned.entries) == [("api", "alice", None, 1)]


def test_a_remembered_plan_is_a_new_call_every_time() -> None:
    """The checks are remembered, the call is not: every hit has a nonce of its own (the
    sliding log names its entries after it)."""
    core = Core(compile_policy(POLICY), cluster=False)
    nonces = {core.for_limit("hit", "log", "alice", None, 1).nonce for _ in range(50)}
    assert len(nonces) == 50
    # Twelve lower-case hex digits (48 bits): what the script's members end with, and what
    # tells an older version's members (which open with their nonce) from this one's.
    assert all(re.fullmatch(r"[0-9a-f]{12}", nonce) for nonce in nonces)
    # Every digit varies: no byte of the 48 bits is fixed or lost.
    assert all(len({nonce[i] for nonce in nonces}) > 1 for i in range(12))
    first = core.for_limit("hit", "log", "alice", None, 1)
    second = core.for_limit("hit", "log", "alice", None, 1)
    assert first.checks is second.checks
    assert first.calls[0].packed != second.calls[0].packed


_CALLS = st.tuples(
    st.sampled_from(["api", "log", "by-ip", "per-org", "nope"]),
    st.one_of(st.sampled_from(["alice", "bob", "", "a b", "ü", "x" * 40]), st.text(max_size=8)),
    st.sampled_from([None, "free", "pro", "gold"]),
    st.sampled_from([1, 3, 0, -1, 10**12]),
)


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(_CALLS, min_size=1, max_size=30))
def test_calls_the_full_memo_does_not_hold_plan_what_planning_afresh_gives(
    calls: list[tuple[str, str, str | None, int]],
) -> None:
    """With more users than the memo keeps, a call it does not hold is planned from the
    limit's remembered rule, tier and blocks (_plan_user): the same checks, or the same
    refusal, as a core that has never seen a call, whatever came before it."""
    core = Core(compile_policy(POLICY), cluster=False)
    # The memo full (and kept so for a minute): every call below is planned again.
    core._planned.size = 1
    core.for_limit("hit", "api", "filler", None, 1)
    for name, identity, tier, cost in calls:
        expected = _outcome(Core(compile_policy(POLICY), cluster=False), name, identity, tier, cost)
        assert _outcome(core, name, identity, tier, cost) == expected
    # Only the limits and tiers that resolved are remembered; here, counted by the user.
    assert all(name in ("api", "log") for name, _ in core._shapes.entries)
    assert all(tier in (None, "free", "pro") for _, tier in core._shapes.entries)


def test_a_limit_a_request_planned_is_not_a_users_call() -> None:
    """The shapes are shared with check_request's planning: a per-IP limit whose shape
    the middleware made is still refused to a user's hit without ip=, as afresh."""
    core = Core(compile_policy(POLICY), cluster=False)
    core._planned.size = 1
    core.for_limit("hit", "api", "filler", None, 1)
    core.for_limit("hit", "by-ip", None, "free", 1, ip="203.0.113.9")
    assert ("by-ip", "free") in core._shapes.entries
    afresh = _outcome(Core(compile_policy(POLICY), cluster=False), "by-ip", "alice", "free", 1)
    assert _outcome(core, "by-ip", "alice", "free", 1) == afresh
    assert isinstance(afresh, tuple) and afresh[0].__name__ == "InvalidArgumentError"
