"""The script calls as the core encodes them (``ScriptCall.packed``) are byte for byte the
commands hiredis packs from their keys and arguments, for every plan shape and command.

No Redis needed: hiredis' own packer is the reference. The contract suite sends the
encoded calls to real servers; this test says they are the same bytes as before.
"""

from __future__ import annotations

import edgegen_policy as policy
import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applimit._calls import _HEADS, EVAL, EVALSHA, FCALL, ScriptCall, pack, pack_calls
from applimit._plan import Core
from applimit._replies import Prepared
from applimit._rules import compile_policy

POLICY = policy.loads(
    """
version: 1
tiers: [free, pro]
app: {key_prefix: rl}
limits:
  - name: api
    match: {path_prefix: /api/}
    app: {tiers: {free: 100/1m, pro: [1000/1m, 20000/1h, 5000/1s]}}
  - name: login
    match: {path_prefix: /api/login}
    app: {per: ip, algorithm: gcra, burst: 5, tiers: {free: 10/1s, pro: 20/1s}}
  - name: org
    match: {path_prefix: /api/}
    app: {per: org, algorithm: sliding_log, enforce: false, tiers: {free: 50/1m}}
"""
)
COMMANDS = (FCALL, EVALSHA, EVAL)


def _reference(call: ScriptCall, how: bytes) -> bytes:
    """What hiredis packs for the call: the command before ScriptCall.packed existed."""
    args = (*_HEADS[how], len(call.keys), *call.keys, *call.args)
    return bytes(hiredis.pack_command(args))  # type: ignore[arg-type]


def _plans(core: Core, identity: str, cost: int) -> list[Prepared]:
    return [
        core.for_limit("hit", "api", identity, "free", cost),
        core.for_limit("peek", "api", identity, "pro", cost),
        core.for_limit("hit", "login", None, "pro", cost, ip="2001:db8::1"),
        core.for_request(
            "hit",
            "POST",
            "/api/login",
            identity,
            tier="pro",
            cost=cost,
            ip="10.0.0.1",
            host="example.com",
            keys={"org": identity + "-org"},
        ),
        # Without app keys: planned, then remembered with its call's parts encoded once
        # (Core.for_request's memo); a path of four checks and one of three.
        *(
            core.for_request(
                "hit", "POST", path, identity, tier="pro", cost=cost, ip="10.0.0.1", host=None
            )
            for path in ("/api/login", "/api/x", "/api/login", "/api/x")
        ),
    ]


@settings(max_examples=60, deadline=None)
@given(
    identity=st.text(min_size=1, max_size=80),
    cost=st.sampled_from([1, 2, 1_000_000_000]),
    cluster=st.booleans(),
    clock=st.booleans(),
)
def test_encoded_calls_are_the_commands_hiredis_packs(
    identity: str, cost: int, cluster: bool, clock: bool
) -> None:
    """Every call of every plan (one check, several rates, several limits, per IP and per
    org, peek, cost above 1, a test clock, split by slot on a cluster) packs to the bytes
    hiredis makes of its keys and arguments, whichever command carries it."""
    core = Core(
        compile_policy(POLICY),
        cluster=cluster,
        test_clock=(lambda: 1234.5678) if clock else None,
    )
    for prepared in _plans(core, identity, cost):
        assert prepared.calls
        for call in prepared.calls:
            assert call.packed, "the core encodes every call it makes"
            for how in COMMANDS:
                assert pack(call, how) == _reference(call, how)
        for how in COMMANDS:
            packed, count = pack_calls(prepared.calls, how)
            assert count == len(prepared.calls)
            assert packed == b"".join(_reference(call, how) for call in prepared.calls)


def test_refund_calls_are_encoded_too() -> None:
    """A denied multi-slot decision's refunds (cluster only) pack as hiredis packs them."""
    core = Core(compile_policy(POLICY), cluster=True)
    prepared = core.for_request(
        "hit", "POST", "/api/login", "alice", tier="free", cost=1, ip="10.0.0.1", host=None
    )
    assert len(prepared.calls) > 1, "per-user and per-IP keys live in different slots"
    # Every call admits and consumes, except the per-IP limit's, which denies: the request
    # is denied, and the calls that consumed are given back.
    replies: list[object] = []
    for group in prepared.groups:
        reply = [1_000_000, len(group)]
        for index in group:
            denied = prepared.checks[index].rule.name == "login"
            reply += [0, 0, 0, 1_000_000, 500_000] if denied else [1, 1, 9, 1_000_000, -1]
        replies.append(reply)
    decision, refunds = prepared.decide(replies)
    assert not decision.allowed
    assert refunds
    for call in refunds:
        assert call.args[0] == "refund"
        for how in COMMANDS:
            assert pack(call, how) == _reference(call, how)


@pytest.mark.parametrize("how", COMMANDS)
def test_a_call_without_encoding_is_packed_by_hiredis(how: bytes) -> None:
    """A ScriptCall built without ``packed`` (as other code may build one) still packs."""
    call = ScriptCall(("k1", "k2"), ("hit", "", "n", "0", "2"))
    assert pack(call, how) == _reference(call, how)
