"""edgegen replay and suggest with the policy's ``overrides:``: a user's own rates replace
its tier's while the override lasts (rows of tier ``override``), and suggestions for the
tiers leave the overridden users' traffic out."""

from __future__ import annotations

import edgegen_policy as policy

from edgegen.replay._engine import ReplayLayer, replay
from edgegen.replay._suggest import suggest
from edgegen.replay._types import Record

T0 = 1_796_083_200  # 2026-12-01T00:00:00Z
POLICY = """
version: 1
tiers: [free, pro]
limits:
  - name: api
    match: { path_prefix: /api/ }
    app:
      algorithm: sliding_log
      tiers: { free: 5/1m, pro: 50/1m }
  - name: search
    match: { path_prefix: /search/ }
    app:
      per: org
      tiers: { free: 5/1m, pro: 50/1m }
overrides:
  - limit: api
    user: big
    rates: [20/1m]
    expires: "2026-12-01T00:00:30Z"
    reason: contract 3
  - limit: search
    key: { org: acme }
    rates: [20/1m]
    expires: "2999-01-01"
    reason: contract 4
"""


def burst(user: str, count: int, start_s: int, path: str = "/api/x") -> list[Record]:
    """``count`` requests of ``user`` (free tier) one millisecond apart from ``start_s``."""
    return [
        Record((T0 + start_s) * 1_000_000 + i * 1000, "GET", "h", path, "192.0.2.1", user, "free")
        for i in range(count)
    ]


def rows(result: object) -> dict[tuple[str, str | None], tuple[int, int]]:
    return {
        (row.name, row.tier): (row.counted, row.refused)
        for row in result.rows  # type: ignore[attr-defined]
        if row.layer is ReplayLayer.APP
    }


def test_an_override_replaces_the_tier_until_it_expires() -> None:
    """Before the override's expiry the user gets its 20/1m; after it, the free tier's 5/1m
    (the replay counts an override's rates apart from the tier's: docs/replay.md)."""
    loaded = policy.loads(POLICY)
    records = burst("big", 30, 0) + burst("small", 10, 0) + burst("big", 10, 40)
    result = replay(loaded, sorted(records))
    found = rows(result)
    # 30 requests under the override: 20 admitted, 10 refused.
    assert found[("api", "override")] == (30, 10)
    # The free tier: small's 10 (5 refused) and big's 10 after expiry (5 refused).
    counted, refused = found[("api", "free")]
    assert counted == 20 and refused == 5 + 5
    assert any("org acme" in note for note in result.notes)


def test_suggest_leaves_overridden_users_out_of_the_tiers() -> None:
    """The tier's suggestion is made from the users the tier governs: a user with an
    override is counted in its own row, not in the tier's identities."""
    loaded = policy.loads(POLICY.replace("2026-12-01T00:00:30Z", "2999-01-01"))
    records = burst("big", 30, 0) + burst("small", 3, 0)
    items, _ = suggest(loaded, sorted(records), 0.01)
    [free] = [i for i in items if i.limit == "api" and i.tier == "free"]
    assert free.identities == 1 and free.requests == 3
    assert all(i.tier != "override" for i in items)


def test_decision_events_of_an_override_are_not_replayed_at_the_lowest_tier() -> None:
    """The app's decision-event log names an override's decisions with the tier
    'override', which no policy tier is: they are left out, with a note, rather than
    replayed against the lowest tier's 5/1m (which would refuse 25 of 30)."""
    from edgegen.replay._engine import OVERRIDE_EVENTS_NOTE

    events = [
        Record((T0 + 1) * 1_000_000 + i * 1000, "", "", "", "", "hashed", "override", limit="api")
        for i in range(30)
    ]
    result = replay(policy.loads(POLICY), events)
    assert result.refused[ReplayLayer.APP] == 0
    assert OVERRIDE_EVENTS_NOTE in result.notes


def test_a_policy_with_quotas_or_concurrency_says_they_are_not_replayed() -> None:
    """Calendar quotas and concurrency limits are not in the replay's models: a note says
    so, so that a replay of a policy whose real bound is a monthly quota is not read as
    the whole story."""
    from edgegen.replay._engine import CALENDAR_NOTE

    text = POLICY.replace(
        "      tiers: { free: 5/1m, pro: 50/1m }\n  - name: search",
        "      tiers: { free: 5/1m, pro: 50/1m }\n      quotas: { free: { day: 100 } }\n"
        "  - name: search",
    )
    assert CALENDAR_NOTE in replay(policy.loads(text), burst("small", 3, 0)).notes
    assert CALENDAR_NOTE not in replay(policy.loads(POLICY), burst("small", 3, 0)).notes


def test_the_diffs_impact_pairs_each_users_override_with_its_own() -> None:
    """Two users' overrides before, one after: the impact compares big's override with
    big's, never with another user's row that happens to sit at the same place, and says
    whose override it is."""
    from edgegen.replay._report import impact, impact_json, impact_lines

    two = POLICY.replace(
        "  - limit: search\n",
        "  - { limit: api, user: huge, rates: [30/1m], expires: '2999-01-01', reason: c5 }\n"
        "  - limit: search\n",
    ).replace("2026-12-01T00:00:30Z", "2999-01-01")
    only_huge = two.replace(
        '  - limit: api\n    user: big\n    rates: [20/1m]\n    expires: "2999-01-01"\n'
        "    reason: contract 3\n",
        "",
    )
    assert "user: big" not in only_huge and "huge" in only_huge
    records = sorted(burst("big", 25, 0) + burst("huge", 25, 0))
    before = replay(policy.loads(two), records)
    after = replay(policy.loads(only_huge), records)
    items = {(i.tier, i.who): i for i in impact(before, after) if i.limit == "api"}
    # huge's override is unchanged: 25 requests under its 30/1m, none refused either side.
    huge = items[("override", "huge")]
    assert (huge.counted_before, huge.counted_after) == (25, 25)
    assert not huge.changed
    # big's override is gone: its 25 requests fall to the free tier's 5/1m.
    big = items[("override", "big")]
    assert (big.rate_before, big.rate_after, big.refused_before) == ("20/1m", None, 5)
    free = items[("free", None)]
    assert (free.counted_before, free.counted_after, free.refused_after) == (0, 25, 20)
    lines = impact_lines(list(items.values()))
    assert any(line.startswith("the override for `big` of app limit `api`") for line in lines)
    assert not any("`huge`" in line for line in lines)
    found = impact_json(list(items.values()), before, after)["limits"]
    assert {(x["tier"], x["user"]) for x in found} == {("override", "big"), ("free", None)}


def test_an_overrides_user_is_never_read_as_markdown() -> None:
    """A user id is the policy's text, and the impact lands in a PR comment: every place
    the sentence names it is a code span, so no link or HTML in it is live."""
    import re

    from edgegen.replay._report import Impact, impact_lines

    who = "[pay here](https://evil.example) <b>x</b>"
    item = Impact(ReplayLayer.APP, "api", "override", who, "20/1m", None, 10, 0, 2, 0, 1, 0, 0, 1)
    [line] = impact_lines([item])
    outside = re.sub(r"`[^`]*`", "", line)
    assert who not in outside and "evil" not in outside and "<b>" not in outside
    assert line.count(f"`{who}`") == 2
