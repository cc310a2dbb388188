"""Core.matching: the memo the middleware's matches() and check_request() share gives
what matching afresh gives, for any path, and stays bounded however many paths it sees."""

from __future__ import annotations

import edgegen_policy as policy
from edgegen_policy import request_paths
from hypothesis import given, settings
from hypothesis import strategies as st

from applimit import _memo, _plan
from applimit._memo import Memo
from applimit._plan import Core
from applimit._rules import compile_policy

POLICY = policy.loads(
    """
version: 1
tiers: [free, pro]
limits:
  - name: login
    match: { paths: [/login], methods: [POST] }
    app: { per: ip, tiers: { free: 5/1m } }
  - name: api
    match: { path_prefix: /api/ }
    app: { tiers: { free: 100/1m, pro: 1000/1m } }
  - name: hooks
    match: { hosts: [hooks.example.com], path_prefix: /hooks/ }
    app: { tiers: { pro: 10/1s } }
  - name: explicit
    match: { path_prefix: /api/ }
    app: { middleware: false, tiers: { free: 1/1m } }
"""
)

PATHS = st.one_of(
    st.sampled_from(["/login", "/l%6Fgin", "//login/", "/api/x", "/%61pi/x", "/hooks/a", "/"]),
    st.text(alphabet="/%aAlpi2F.\\og", max_size=20).map(lambda s: "/" + s),
)


def fresh(core: Core, method: str, path: str, host: str | None) -> tuple[str, ...]:
    forms = request_paths(path)
    return tuple(
        rule.name
        for rule in core.policy.rules
        if rule.middleware and rule.matcher.matches_any(method, forms, host)
    )


@settings(max_examples=300, deadline=None)
@given(
    method=st.sampled_from(["GET", "HEAD", "POST"]),
    path=PATHS,
    host=st.sampled_from([None, "api.example.com", "HOOKS.example.com:443"]),
)
def test_memo_answers_as_matching_afresh(method: str, path: str, host: str | None) -> None:
    core = Core(compile_policy(POLICY), cluster=False)
    first = tuple(rule.name for rule in core.matching(method, path, host))
    again = tuple(rule.name for rule in core.matching(method, path, host))
    assert first == again == fresh(core, method, path, host)
    assert "explicit" not in first  # middleware: false is never the middleware's


def test_memo_is_bounded_and_skips_long_paths() -> None:
    core = Core(compile_policy(POLICY), cluster=False)
    for n in range(_plan._MATCHING_CACHE + 500):
        core.matching("GET", f"/api/items/{n}", None)
    assert 0 < len(core._matching.entries) <= _plan._MATCHING_CACHE
    core._matching.entries.clear()
    long_path = "/api/" + "a" * (_plan._MATCHING_PATH + 1)
    assert [rule.name for rule in core.matching("GET", long_path, None)] == ["api"]
    assert not core._matching.entries
    long_host = "a" * (_plan._MATCHING_HOST + 1) + ".example.com"
    assert [rule.name for rule in core.matching("GET", "/api/x", long_host)] == ["api"]
    assert not core._matching.entries


def test_a_full_memo_keeps_nothing_more_and_starts_over_at_most_once_a_reset() -> None:
    """A full memo does not empty itself for every new key (which would churn when more
    keys are in use than it holds): it starts over when it fills for the first time, and
    after that once RESET seconds have passed since, not sooner."""
    memo: Memo[int, str] = Memo(3)
    for key in range(3):
        memo.keep(key, str(key))
    # Full for the first time: it starts over with the new key.
    memo.keep(3, "3")
    assert memo.entries == {3: "3"}
    for key in range(4, 10):
        memo.keep(key, str(key))
    assert memo.entries == {3: "3", 4: "4", 5: "5"}
    assert memo.until > 0
    # As if the reset time had passed.
    memo.until -= _memo.RESET
    memo.keep(10, "10")
    assert memo.entries == {10: "10"}
