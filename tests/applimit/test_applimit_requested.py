"""Core.for_request's planned checks: a request's checks (what check_request and the
middleware send) are planned once per set of matching limits, caller, tier and cost, and
remembered. The memo plans what planning afresh plans, for any request and caller,
never keeps a refused call, and keys a plan by the client address only where the plan
can depend on it."""

from __future__ import annotations

from types import MappingProxyType
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
  - name: login
    match: { paths: [/login], methods: [POST] }
    app: { per: ip, tiers: { free: 5/1m, pro: 5/1m } }
  - name: api
    match: { path_prefix: /api/ }
    app: { tiers: { free: [100/1m, 1000/1h], pro: 1000/1m } }
  - name: api-log
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 10/1s } }
  - name: orgs
    match: { path_prefix: /orgs/ }
    app: { per: org, tiers: { free: 50/1m, pro: 500/1m } }
  - name: pro-only
    match: { path_prefix: /reports/ }
    app: { tiers: { pro: 10/1m } }
"""
)

PATHS = st.one_of(
    st.sampled_from(
        ["/login", "/l%6Fgin", "//login/", "/api/x", "/%61pi/items/7", "/orgs/1", "/reports/q", "/"]
    ),
    st.text(alphabet="/%aAlpi2F.orgs", max_size=16).map(lambda s: "/" + s),
)
IPS = st.sampled_from(
    [None, "203.0.113.9", "203.0.113.10", "2001:db8::1", "2001:db8::2", "", "nope", 7, "9" * 80]
)
IDENTITIES = st.one_of(
    st.sampled_from([None, "alice", "bob", "", "a b", "ü", "x" * 300, 42]),
    st.text(max_size=8),
)
KEYS = st.sampled_from([None, {}, MappingProxyType({}), {"org": "acme"}, {"org": ""}, [], 0])


def _plan(prepared: Prepared) -> tuple[Any, ...]:
    """What a plan sends, but for its nonce (new with every call): the keys, arguments and
    slot of each call, and its encoded bytes with the nonce blanked."""
    nonce = prepared.nonce.encode()
    calls = tuple(
        (
            call.keys,
            call.args[0],
            call.args[3:],
            call.slot,
            call.packed.replace(b"$12\r\n" + nonce, b"<nonce>") if nonce else call.packed,
        )
        for call in prepared.calls
    )
    checks = tuple((c.rule.name, c.tier, c.key, c.cost) for c in prepared.checks)
    return calls, checks, prepared.groups


def _outcome(core: Core, method: str, path: str, identity: Any, **kwargs: Any) -> object:
    try:
        return _plan(core.for_request("hit", method, path, identity, host=None, **kwargs))
    except ApplimitError as error:
        return (type(error), str(error))


def _unremembered(core: Core, method: str, path: str, identity: Any, **kwargs: Any) -> object:
    """What planning without the memo gives: the checks of the request, as given."""
    try:
        group = core._match(method, path, None)
        return _plan(core.prepare("hit", core._request_checks(group.rules, identity, **kwargs)))
    except ApplimitError as error:
        return (type(error), str(error))


REQUESTS = st.fixed_dictionaries(
    {
        "method": st.one_of(st.just("POST"), st.just("GET")),
        # Mostly a few callers and paths, so that a series repeats them: a plan kept for
        # one request must not answer another.
        "path": st.one_of(st.sampled_from(["/login", "/api/x", "/orgs/1", "/%61pi/y"]), PATHS),
        "identity": st.one_of(st.sampled_from([None, "alice"]), IDENTITIES),
        "ip": st.one_of(st.sampled_from(["203.0.113.9", "203.0.113.10"]), IPS),
        "tier": st.one_of(st.none(), st.sampled_from(["free", "pro", "gold", 3])),
        "cost": st.one_of(st.just(1), st.sampled_from([3, 0, True, 10**12])),
        "keys": KEYS,
    }
)


@settings(max_examples=300, deadline=None)
@given(requests=st.lists(REQUESTS, min_size=1, max_size=8), cluster=st.booleans())
def test_requested_checks_are_what_planning_afresh_gives(
    requests: list[dict[str, Any]], cluster: bool
) -> None:
    """A series of requests, twice through one core's memo (planned, then remembered),
    each gives what planning it without the memo gives: the same calls and checks, or
    the same refusal; and a refused request is never kept."""
    core = Core(compile_policy(POLICY), cluster=cluster)
    reference = Core(compile_policy(POLICY), cluster=cluster)
    for _ in range(2):
        for request in requests:
            arguments = dict(request)
            method, path, identity = (arguments.pop(k) for k in ("method", "path", "identity"))
            kept = len(core._requested.entries)
            outcome = _outcome(core, method, path, identity, **arguments)
            assert outcome == _unremembered(reference, method, path, identity, **arguments)
            if isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[0], type):
                assert len(core._requested.entries) == kept


def test_paths_that_match_the_same_limits_share_a_plan() -> None:
    """Ids in paths do not multiply the plans: /api/items/1 and /api/items/2 match the
    same limits, so a user's plan for one is the plan for the other."""
    core = Core(compile_policy(POLICY), cluster=False)
    plans = {
        id(
            core.for_request(
                "hit", "GET", f"/api/items/{n}", "alice", tier=None, cost=1, ip=None, host=None
            ).checks
        )
        for n in range(50)
    }
    assert len(plans) == 1
    assert len(core._requested.entries) == 1
    assert len(core._matching.entries) == 50


def test_the_address_keys_a_plan_only_where_the_plan_depends_on_it() -> None:
    """A user's plan for per-user limits is one whatever address the request came from;
    an anonymous caller's, and one of a set with a per-IP limit, is one per address (two
    addresses of one IPv6 /64 are two entries with the same keys)."""
    core = Core(compile_policy(POLICY), cluster=False)

    def plan(path: str, identity: str | None, ip: str) -> tuple[str, ...]:
        prepared = core.for_request(
            "hit", "POST", path, identity, tier=None, cost=1, ip=ip, host=None
        )
        return tuple(check.key for check in prepared.checks)

    assert plan("/api/x", "alice", "203.0.113.9") == plan("/api/x", "alice", "203.0.113.10")
    assert len(core._requested.entries) == 1
    core._requested.entries.clear()
    assert plan("/api/x", None, "203.0.113.9") != plan("/api/x", None, "203.0.113.10")
    assert len(core._requested.entries) == 2
    core._requested.entries.clear()
    assert plan("/login", "alice", "203.0.113.9") != plan("/login", "alice", "203.0.113.10")
    assert plan("/login", "alice", "2001:db8::1") == plan("/login", "alice", "2001:db8::2")
    assert len(core._requested.entries) == 4
    # A per-org limit counts a user without the key by address.
    assert plan("/orgs/1", "alice", "203.0.113.9") != plan("/orgs/1", "alice", "203.0.113.10")


def test_the_request_memo_is_bounded_and_takes_only_plain_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At most _PLANNED_CACHE requests are kept (see Memo); a request with app keys, a
    long identity or address, or more distinct sets of limits than _GROUPS is planned
    afresh every time and never kept."""
    monkeypatch.setattr(planning, "_PLANNED_CACHE", 8)
    core = Core(compile_policy(POLICY), cluster=False)
    for index in range(100):
        core.for_request(
            "hit", "GET", "/api/x", f"user-{index}", tier=None, cost=1, ip=None, host=None
        )
        assert 1 <= len(core._requested.entries) <= 8
    core._requested.entries.clear()
    core.for_request(
        "hit", "GET", "/orgs/1", "alice", tier=None, cost=1, ip=None, host=None, keys={"org": "a"}
    )
    core.for_request(
        "hit",
        "GET",
        "/api/x",
        "y" * (planning._PLANNED_IDENTITY + 1),
        tier=None,
        cost=1,
        ip=None,
        host=None,
    )
    core.for_request(
        "hit",
        "GET",
        "/api/x",
        None,
        tier=None,
        cost=1,
        ip="1" * (planning._PLANNED_IP + 1),
        host=None,
    )
    assert core._requested.entries == {}
    monkeypatch.setattr(planning, "_GROUPS", 1)
    bounded = Core(compile_policy(POLICY), cluster=False)
    bounded.for_request("hit", "GET", "/reports/q", "alice", tier=None, cost=1, ip=None, host=None)
    # The memo of sets, full for the first time, starts over (see Memo) with the next set;
    # the one after it finds it full and keeps no more.
    kept = bounded.for_request(
        "hit", "GET", "/api/x", "alice", tier=None, cost=1, ip=None, host=None
    )
    bounded._requested.entries.clear()
    unkept = bounded.for_request(
        "hit", "GET", "/orgs/1", "alice", tier=None, cost=1, ip="203.0.113.9", host=None
    )
    assert len(bounded._groups.entries) == 1
    assert len(bounded._requested.entries) == 0
    assert _plan(unkept) == _plan(
        Core(compile_policy(POLICY), cluster=False).for_request(
            "hit", "GET", "/orgs/1", "alice", tier=None, cost=1, ip="203.0.113.9", host=None
        )
    )
    assert kept.checks


def test_a_remembered_request_plan_is_a_new_call_every_time() -> None:
    """The checks are remembered, the call is not: every hit has a nonce of its own."""
    core = Core(compile_policy(POLICY), cluster=False)

    def hit() -> Prepared:
        return core.for_request(
            "hit", "GET", "/api/x", "alice", tier=None, cost=1, ip=None, host=None
        )

    first, second = hit(), hit()
    assert first.checks is second.checks
    assert first.nonce != second.nonce
    assert first.calls[0].packed != second.calls[0].packed
