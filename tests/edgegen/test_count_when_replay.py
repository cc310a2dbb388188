"""``count_when`` in the replay: each layer checks a request before it runs and counts it
after, when the logged status is listed.

The expected answers are worked out by hand in each test from the layer's documented
behaviour (the rule's counting expression, the Worker's spent mark, the app's two phases),
not by asking the engine.
"""

from __future__ import annotations

import edgegen_policy as policy
import pytest

from edgegen.replay._engine import COUNT_WHEN_NOTE, ReplayLayer, ReplayOptions, replay
from edgegen.replay._types import Record

T0 = 1_764_748_800_000_000  # 2025-12-03T08:00:00Z in µs: a whole minute
S = 1_000_000
IP = "203.0.113.7"
OTHER = "198.51.100.9"

POLICY = """
version: 1
cloudflare:
  plan: {plan}
  worker: {{ name: edge, routes: ["*/*"] }}
limits:
  - name: login
    match: {{ paths: [/login] }}
    count_when: {{ status: [401] }}
{part}
"""
EDGE = "    edge: { rate: 3/1m, unauthenticated_only: false }"
APP = "    app: { per: ip, algorithm: sliding_log, tiers: { default: 3/1m } }"

# One caller's logins within one minute: successes and failures mixed.
STATUSES = [200, 401, 200, 401, 401, 200, 401, 401, 200]


def records(statuses: list[int | None], ip: str = IP, start_s: int = 1) -> list[Record]:
    """One login a second, answered with the logged statuses."""
    return [
        Record(T0 + (start_s + i) * S, "POST", "example.com", "/login", ip, status=status)
        for i, status in enumerate(statuses)
    ]


def load(plan: str, part: str) -> policy.Policy:
    return policy.loads(POLICY.format(plan=plan, part=part))


def decisions(plan: str, part: str, logged: list[Record]) -> list[str | None]:
    """What each record met, in order: the layer that refused it, or None."""
    from edgegen.replay._engine import Replay

    engine = Replay(load(plan, part))
    return [None if (layer := engine.feed(r)) is None else layer.value for r in logged]


@pytest.mark.parametrize(("plan", "layer"), [("free", "worker"), ("business", "rules")])
def test_the_edge_counts_failures_only_and_refuses_once_over(plan: str, layer: str) -> None:
    """3 failures a minute at the edge. The 200s count nothing. The failures at seconds 2,
    4 and 5 bring the count to the limit; the one at 7 still reaches the origin (neither
    the rule nor the Worker knows before its answer that the count is spent: the rule acts
    when the count is above the limit, the binding answers over the limit only to the call
    that finds it full) and is counted; from then on the caller is refused, a login that
    would succeed included. The Worker (free plan) and the rule (business) agree."""
    got = decisions(plan, EDGE, records(STATUSES))
    assert got == [None] * 7 + [layer, layer]


def test_a_replay_of_mixed_statuses_gives_the_known_totals() -> None:
    """Totals of the Worker's row: 4 failures counted, 2 requests refused, the second
    caller untouched by the first's failures."""
    logged = records(STATUSES) + records([401, 401, 200], OTHER, start_s=20)
    logged.sort(key=lambda r: r.at_us)
    result = replay(load("free", EDGE), logged)
    [row] = [r for r in result.rows if r.layer is ReplayLayer.WORKER]
    assert row.counted == 4 + 2
    assert row.refused == 2
    assert result.refused[ReplayLayer.WORKER] == 2
    assert result.admitted == len(logged) - 2
    assert COUNT_WHEN_NOTE in result.notes


def test_the_app_refuses_as_soon_as_the_count_is_spent() -> None:
    """The app checks before the handler: after the third failure (second 5) the next
    request finds 3 of 3 and is refused, whatever it would have answered; refused
    requests are not counted, so the caller stays refused only until the log lets the
    first failure go (sliding log: 60 s after second 2). The failure at second 62 fills
    the log again, and the request at 63 is refused."""
    logged = records(STATUSES) + records([401, 200], start_s=62)
    got = decisions("free", APP, logged)
    assert got == [None] * 5 + ["app"] * 4 + [None, "app"]


def test_a_later_refusal_is_the_answer_an_earlier_layer_counts() -> None:
    """With 429 listed, a request the app refuses answers 429 to the edge, which counts it;
    with 401 alone the edge does not count it."""
    part = (
        "    edge: { rate: 2/1m, unauthenticated_only: false }\n"
        "    app: { per: ip, algorithm: sliding_log, tiers: { default: 1/1m } }"
    )
    text = POLICY.format(plan="free", part=part)
    with_429 = policy.loads(text.replace("status: [401]", "status: [401, 429]"))
    logged = records([401, 200, 200, 200, 200])
    result = replay(with_429, logged)
    # 1: the app counts the 401 (1/1); 2, 3: refused by the app, 429s the Worker counts
    # (the Worker counts 1, 2, 3: the third is over the limit: spent); 4, 5: the Worker.
    assert result.refused[ReplayLayer.APP] == 2
    assert result.refused[ReplayLayer.WORKER] == 2
    result = replay(policy.loads(text), logged)
    assert result.refused[ReplayLayer.APP] == 4
    assert result.refused[ReplayLayer.WORKER] == 0


def test_records_without_a_status_are_not_counted_and_the_report_says_so() -> None:
    """A log without statuses cannot say which requests failed: none is counted, and the
    warnings say how many requests that concerned."""
    logged = records([None] * 8)
    result = replay(load("free", EDGE), logged)
    assert result.refused[ReplayLayer.WORKER] == 0
    assert result.statusless == 8
    [warning] = result.warnings
    assert "8 of 8 requests reached a limit with count_when but have no status" in warning


def test_a_limit_without_count_when_counts_every_status() -> None:
    """Unchanged behaviour: the fourth request is refused, whatever its status."""
    text = POLICY.format(plan="free", part=EDGE).replace("    count_when: { status: [401] }\n", "")
    result = replay(policy.loads(text), records(STATUSES))
    assert result.refused[ReplayLayer.WORKER] == len(STATUSES) - 3
    assert COUNT_WHEN_NOTE not in result.notes


def test_only_the_replayed_layers_count() -> None:
    """Replaying the edge alone, the edge sees the logged statuses."""
    options = ReplayOptions(layers=frozenset({ReplayLayer.WORKER}))
    result = replay(load("free", EDGE + "\n" + APP), records(STATUSES), options)
    assert result.refused[ReplayLayer.WORKER] == 2


def test_suggestions_count_only_the_listed_answers() -> None:
    """A caller who fails 4 times a minute among 20 successes has a peak of 4 for a limit
    that counts 401s, not 24; the floor that refuses no one is the busiest caller's 4."""
    from edgegen.replay._suggest import suggest

    logged = []
    for caller in range(3):
        ip = f"192.0.2.{caller + 1}"
        statuses = [401] * (caller + 2) + [200] * 20 + [None]
        logged += records(statuses, ip)
    logged.sort(key=lambda r: r.at_us)
    [item], _ = suggest(load("free", APP), logged, target=0.0)
    assert item.floor == 4
    assert item.identities == 3


def test_decision_events_of_a_count_when_limit_are_checks_that_count_nothing() -> None:
    """applimit logs a count_when limit's check as its hit; the count, after the answer,
    is not in the log. So events are checked, never counted (a spent caller cannot be told
    from the log), and the report says how many had no status."""
    events = [
        Record(T0 + i * S, "", "", "", "", user="u1", tier="default", limit="login")
        for i in range(10)
    ]
    result = replay(load("free", APP), events)
    assert result.refused[ReplayLayer.APP] == 0
    assert result.admitted == 10
    assert result.statusless == 10
    text = POLICY.format(plan="free", part=APP).replace("    count_when: { status: [401] }\n", "")
    assert replay(policy.loads(text), events).refused[ReplayLayer.APP] == 7


def test_both_counters_of_an_unauthenticated_only_limit_count_only_listed_answers() -> None:
    """Without a credential: 2 failures allowed, the third still answered, then refused.
    With one: 4 allowed at the credentialed rate, counted apart; 200s count in neither."""
    text = """
version: 1
cloudflare:
  plan: free
  worker: { name: edge, routes: ["*/*"] }
authenticated_when: { headers: [authorization] }
limits:
  - name: api
    match: { path_prefix: /api/ }
    count_when: { status: 401 }
    edge: { rate: 2/1m, unauthenticated_only: true, credentialed_rate: 4/1m }
"""

    def api(i: int, status: int, authenticated: bool) -> Record:
        return Record(
            T0 + (1 + i) * S, "GET", "example.com", "/api/x", IP, status=status,
            authenticated=authenticated,
        )  # fmt: skip

    logged = [api(i, 200, False) for i in range(5)]
    logged += [api(5 + i, 401, False) for i in range(4)]
    logged += [api(9 + i, 401, True) for i in range(6)]
    from edgegen.replay._engine import Replay

    engine = Replay(policy.loads(text))
    got = [engine.feed(r) for r in logged]
    worker = ReplayLayer.WORKER
    assert got == [None] * 5 + [None, None, None, worker] + [None] * 5 + [worker]


def test_a_limit_beside_a_count_when_one_counts_as_without_it() -> None:
    """A request refused by one limit still counts at every other limit it reached, the
    same whether or not a third limit on the path has count_when: 'counted' means one
    thing in every row (before, a count_when limit on the path made the others skip the
    requests another limit refused)."""
    base = """
version: 1
tiers: [default]
limits:
  - name: tight
    match: { paths: [/login] }
    app: { per: ip, algorithm: sliding_log, tiers: { default: 2/1m } }
  - name: wide
    match: { paths: [/login] }
    app: { per: ip, algorithm: sliding_log, tiers: { default: 100/1m } }
"""
    with_count_when = base + (
        "  - name: failures\n    match: { paths: [/login] }\n    count_when: { status: [401] }\n"
        "    app: { per: ip, algorithm: sliding_log, tiers: { default: 100/1m } }\n"
    )
    logged = records([200] * 6)

    def rows(text: str) -> dict[str, tuple[int, int]]:
        result = replay(policy.loads(text), logged)
        return {r.name: (r.counted, r.refused) for r in result.rows}

    plain, beside = rows(base), rows(with_count_when)
    # tight refuses 4 of 6; wide reached all 6 either way.
    assert plain == {"tight": (6, 4), "wide": (6, 0)}
    assert {k: v for k, v in beside.items() if k != "failures"} == plain
