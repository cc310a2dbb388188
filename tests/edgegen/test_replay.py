"""The replay engine: layers in the order traffic meets them, each with its own semantics,
and the report and impact built from it.

The layer models themselves are proven against their references in test_replay_models.py
(the Lua for the app, Cloudflare's documented examples for rules, workerd for the Worker);
these tests are about how the engine wires them: which requests reach which layer, what
each counts them by, and what the report says.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import edgegen_policy as policy
import pytest

from edgegen.replay._engine import Replay, ReplayLayer, ReplayOptions, replay, replay_pair
from edgegen.replay._report import impact, impact_lines, impact_markdown, to_json, to_markdown
from edgegen.replay._suggest import suggest
from edgegen.replay._types import Record

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "replay"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
T0 = 1_764_748_800_000_000  # 2025-12-03T08:00:00Z in µs
S = 1_000_000

BASE = """
version: 1
cloudflare:
  plan: {plan}
  worker: {{ name: edge-limits, routes: ["hooks.example.com/*"] }}
authenticated_when: {{ headers: [authorization] }}
tiers: [free, pro]
limits:
{limits}
"""


def load(limits: str, plan: str = "business") -> policy.Policy:
    return policy.loads(BASE.format(limits=limits, plan=plan))


def req(at_s: float, path: str = "/api/x", **fields: object) -> Record:
    values: dict[str, object] = {
        "at_us": T0 + round(at_s * S),
        "method": "GET",
        "host": "api.example.com",
        "path": path,
        "ip": "203.0.113.7",
    }
    values.update(fields)
    return Record(**values)  # type: ignore[arg-type]


def row(result: object, layer: ReplayLayer, name: str, tier: str | None = None) -> object:
    rows = [r for r in result.rows if r.layer is layer and r.name == name and r.tier == tier]  # type: ignore[attr-defined]
    assert len(rows) == 1, rows
    return rows[0]


def test_a_request_refused_at_the_edge_never_reaches_the_app() -> None:
    """A rule that blocks the fourth request per minute: the app counts three of five."""
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: 3/1m, action: block, timeout: 1m, unauthenticated_only: false }
    app: { per: user, algorithm: sliding_log, tiers: { free: 100/1m, pro: 100/1m } }
"""
    )
    result = replay(loaded, [req(i, user="u1", tier="free") for i in range(5)])
    rules = row(result, ReplayLayer.RULES, "api")
    app = row(result, ReplayLayer.APP, "api", "free")
    assert rules.counted == 5  # type: ignore[attr-defined]
    assert rules.refused == 2  # type: ignore[attr-defined]
    assert app.counted == 3  # type: ignore[attr-defined]
    assert result.refused[ReplayLayer.RULES] == 2
    assert result.admitted == 3


def test_app_limits_are_all_or_nothing_and_shadow_limits_only_count() -> None:
    """Two enforced limits on one path: a request the tighter refuses is not recorded by
    the looser (decide.lua's phase 2); a shadow limit's refusals are counted apart."""
    loaded = load(
        """
  - name: tight
    match: { path_prefix: /api/ }
    app: { per: user, algorithm: sliding_log, tiers: { free: 2/1m } }
  - name: loose
    match: { path_prefix: /api/ }
    app: { per: user, algorithm: sliding_log, tiers: { free: 3/1m } }
  - name: watch
    match: { path_prefix: /api/ }
    app: { per: user, algorithm: sliding_log, enforce: false, tiers: { free: 1/1m } }
"""
    )
    records = [req(i, user="u1", tier="free") for i in range(6)]
    result = replay(loaded, records)
    tight = row(result, ReplayLayer.APP, "tight", "free")
    loose = row(result, ReplayLayer.APP, "loose", "free")
    watch = row(result, ReplayLayer.APP, "watch", "free")
    assert tight.refused == 4  # type: ignore[attr-defined]
    # The looser limit admitted every request it saw, but recorded only two: had it
    # recorded the refused ones, it would refuse from the fourth on.
    assert loose.refused == 0  # type: ignore[attr-defined]
    assert watch.refused == 0  # type: ignore[attr-defined]
    # The shadow limit would refuse from the second request on (it recorded only the
    # first), whether or not another limit refused the request: five would-be refusals.
    assert watch.shadow == 5  # type: ignore[attr-defined]
    assert result.admitted == 2


def test_anonymous_callers_count_by_network_and_users_by_identity() -> None:
    """IPv6 addresses of one /64 share an anonymous quota; a user keeps theirs."""
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    app: { per: user, algorithm: gcra, tiers: { free: 2/1m, pro: 10/1m } }
"""
    )
    anonymous = [req(i, ip=f"2001:db8:0:1::{i + 1:x}") for i in range(4)]
    users = [req(10 + i, ip="2001:db8:0:1::99", user="u1", tier="pro") for i in range(4)]
    result = replay(loaded, anonymous + users)
    free = row(result, ReplayLayer.APP, "api", "free")
    pro = row(result, ReplayLayer.APP, "api", "pro")
    assert free.refused == 2  # type: ignore[attr-defined]
    assert free.identities == 1  # type: ignore[attr-defined]
    assert pro.refused == 0  # type: ignore[attr-defined]


def test_unknown_tiers_count_in_the_lowest_tier() -> None:
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_window, tiers: { free: 1/1m, pro: 10/1m } }
"""
    )
    result = replay(loaded, [req(i, user="u1", tier="platinum") for i in range(3)])
    assert row(result, ReplayLayer.APP, "api", "free").refused == 2  # type: ignore[attr-defined]


def test_credentialed_requests_meet_the_credentialed_rule_only() -> None:
    """An unauthenticated-only edge limit: requests with a credential are held to the
    credentialed rate by its second rule, the others to the rate."""
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: 2/1m, credentialed_rate: 4/1m, action: block, timeout: 1m }
""",
        plan="enterprise",  # header fields in rule expressions need Enterprise
    )
    anonymous = [req(i) for i in range(5)]
    credentialed = [req(i, ip="198.51.100.1", authenticated=True) for i in range(5)]
    result = replay(loaded, anonymous + credentialed)
    main = row(result, ReplayLayer.RULES, "api")
    second = row(result, ReplayLayer.RULES, "api (credentialed)")
    assert main.counted == 5 and main.refused == 3  # type: ignore[attr-defined]
    assert second.counted == 5 and second.refused == 1  # type: ignore[attr-defined]


def test_the_worker_sees_only_its_routes_and_counts_per_colo() -> None:
    loaded = load(
        """
  - name: hooks
    match: { path_prefix: /webhooks/ }
    edge: { rate: 2/10s, unauthenticated_only: false, target: worker }
"""
    )
    on_route = [req(0.1 * i, "/webhooks/a", host="hooks.example.com", colo="FRA") for i in range(3)]
    other_colo = [req(0.5, "/webhooks/a", host="hooks.example.com", colo="LHR")]
    off_route = [req(0.1 * i, "/webhooks/a", host="api.example.com") for i in range(5)]
    result = replay(loaded, on_route + other_colo + off_route)
    worker = row(result, ReplayLayer.WORKER, "hooks")
    assert worker.counted == 4  # type: ignore[attr-defined]
    assert worker.refused == 1  # type: ignore[attr-defined]


def test_decision_event_records_reach_their_app_limit_only() -> None:
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: 1/1m, action: block, timeout: 1m, unauthenticated_only: false }
    app: { algorithm: sliding_log, tiers: { free: 2/1m } }
"""
    )
    events = [
        Record(T0 + i * S, "", "", "", "", user="h1", tier="free", limit="api") for i in range(3)
    ]
    result = replay(loaded, events)
    assert row(result, ReplayLayer.RULES, "api").counted == 0  # type: ignore[attr-defined]
    assert row(result, ReplayLayer.APP, "api", "free").refused == 1  # type: ignore[attr-defined]


def test_head_counts_as_get_and_spellings_count_alike() -> None:
    loaded = load(
        """
  - name: login
    match: { paths: [/login], methods: [GET] }
    app: { per: ip, algorithm: sliding_log, tiers: { free: 2/1m } }
"""
    )
    records = [req(0, "/login"), req(1, "/l%6Fgin", method="HEAD"), req(2, "//login/")]
    result = replay(loaded, records)
    assert row(result, ReplayLayer.APP, "login", "free").counted == 3  # type: ignore[attr-defined]
    assert result.refused[ReplayLayer.APP] == 1


def test_layers_option_skips_layers() -> None:
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: 1/1m, action: block, timeout: 1m, unauthenticated_only: false }
    app: { algorithm: sliding_log, tiers: { free: 1/1m } }
"""
    )
    result = replay(
        loaded, [req(i) for i in range(3)], ReplayOptions(layers=frozenset({ReplayLayer.APP}))
    )
    assert [r.layer for r in result.rows] == [ReplayLayer.APP]
    assert result.refused[ReplayLayer.APP] == 2


def test_identities_are_hashed_unless_asked() -> None:
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 1/1m } }
"""
    )
    records = [req(i, user="alice@example.com") for i in range(3)]
    hidden = json.dumps(to_json(replay(loaded, records)))
    shown = json.dumps(to_json(replay(loaded, records, ReplayOptions(show_identities=True))))
    assert "alice" not in hidden
    assert "alice@example.com" in shown


def test_impact_names_newly_refused_and_freed_identities() -> None:
    old = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 3/1m, pro: 10/1m } }
"""
    )
    new = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 2/1m, pro: 10/1m } }
"""
    )
    # u1 sends 4 a minute (refused before and after), u2 sends 3 (refused only after).
    records = sorted(
        [req(i, user="u1") for i in range(4)] + [req(i + 0.5, user="u2") for i in range(3)],
        key=lambda r: r.at_us,
    )
    before, after = replay_pair(old, new, records)
    items = [item for item in impact(before, after) if item.changed]
    assert len(items) == 1
    item = items[0]
    assert (item.limit, item.tier) == ("api", "free")
    assert (item.refused_before, item.refused_after) == (1, 3)
    assert (item.identities_before, item.identities_after) == (1, 2)
    assert (item.newly_refused, item.freed) == (1, 0)
    line = impact_lines(items)[0]
    assert "3/1m -> 2/1m" in line and "1 newly refused" in line


def test_suggest_finds_the_rate_for_a_known_trace() -> None:
    """Ten users whose peaks per minute are 1..10: at a 10 % target one may be refused, so
    the floor is 9/1m; at 0 %, 10/1m; the current 5/1m refuses five. Ten identities are a
    small sample, so the floor, looser than today, is not suggested: 5/1m is kept."""
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 5/1m } }
"""
    )
    records = sorted(
        (req(n + k / 100, user=f"u{n}") for n in range(1, 11) for k in range(n)),
        key=lambda r: r.at_us,
    )
    items, _ = suggest(loaded, records, 0.10)
    (item,) = items
    assert item.identities == 10
    assert item.refused_now == 5
    assert item.floor_rate == "9/1m"
    assert item.refused_floor == 1
    assert item.small_sample and item.kept
    assert item.suggested_rate == "5/1m" and item.refused_suggested == 5
    items, _ = suggest(loaded, records, 0.0)
    assert items[0].floor_rate == "10/1m" and items[0].refused_floor == 0


def test_suggestion_checked_by_a_replay_of_the_suggested_rate() -> None:
    """For sliding_log the floor is exact: replaying it refuses no more identities than the
    target allows, and one less would refuse more."""
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 5/1m } }
"""
    )
    import random

    rng = random.Random(7)
    records = sorted(
        (
            req(rng.uniform(0, 600), user=f"u{n}")
            for n in range(40)
            for _ in range(rng.randint(1, 60))
        ),
        key=lambda r: r.at_us,
    )
    (item,), _ = suggest(loaded, records, 0.05)
    assert item.floor is not None

    def refused_identities(count: int) -> int:
        variant = load(
            f"""
  - name: api
    match: {{ path_prefix: /api/ }}
    app: {{ algorithm: sliding_log, tiers: {{ free: {count}/1m }} }}
"""
        )
        return len(row(replay(variant, records), ReplayLayer.APP, "api", "free").refused_by)  # type: ignore[attr-defined]

    assert refused_identities(item.floor) == item.refused_floor <= int(0.05 * 40)
    if item.floor > 1:
        assert refused_identities(item.floor - 1) > int(0.05 * 40)


def test_markdown_report_and_impact_match_golden() -> None:
    """The PR comment's replay report and impact section, for the example policies and a
    small deterministic trace (review tests/golden/replay/ after an intended change)."""
    root = Path(__file__).resolve().parents[2]
    old = policy.load(root / "examples" / "policy-previous.yaml")
    new = policy.load(root / "examples" / "policy.yaml")
    records = []
    for minute in range(3):
        for i in range(150):
            records.append(
                req(minute * 60 + i * 0.3, "/api/v1/items", user=f"u{i % 3}", tier="free")
            )
        for i in range(30):
            records.append(req(minute * 60 + i, "/login", method="POST", ip=f"198.51.100.{i % 2}"))
    records.sort(key=lambda r: r.at_us)
    options = ReplayOptions(show_identities=True)
    before, after = replay_pair(old, new, records, options)
    files = {
        "report.md": to_markdown(after),
        "impact.md": impact_markdown(impact(before, after), before, after, "golden trace"),
    }
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = GOLDEN / name
        if UPDATE or not path.exists():
            path.write_text(text, encoding="utf-8")
        assert text == path.read_text(encoding="utf-8"), f"{name} differs from {path}"


def test_replay_engine_feeds_one_request_at_a_time() -> None:
    """Replay.feed answers which layer refused each request, as it goes."""
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 1/1m } }
"""
    )
    engine = Replay(loaded)
    assert engine.feed(req(0)) is None
    assert engine.feed(req(1)) is ReplayLayer.APP
    assert engine.feed(req(61)) is None


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_suggest_ignores_identities_without_requests(share: float) -> None:
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 5/1m, pro: 5/1m } }
"""
    )
    items, _ = suggest(loaded, [], share)
    assert all(item.identities == 0 and item.suggested is None for item in items)


def test_of_two_rates_with_one_period_only_the_smaller_is_checked() -> None:
    """As applimit checks a tier's rates: 10/1m beside 5/1m adds nothing."""
    loaded = load(
        """
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_window, tiers: { free: [10/1m, 5/1m, 100/1h] } }
"""
    )
    result = replay(loaded, [req(i, user="u1") for i in range(7)])
    rates = [str(r.rate) for r in result.rows_of(ReplayLayer.APP)]
    assert rates == ["5/1m", "100/1h"]
    assert result.refused[ReplayLayer.APP] == 2


def test_a_worker_route_covers_every_spelling_of_its_paths() -> None:
    """An encoded or doubled slash spelling of /webhooks/ is on the hooks route, as the
    zone's normalised URL is, and counts at the Worker like the plain one."""
    loaded = load(
        """
  - name: hooks
    match: { path_prefix: /webhooks/ }
    edge: { rate: 2/10s, unauthenticated_only: false, target: worker }
"""
    )
    # The route names the path, not only the host.
    loaded = loaded.model_copy(
        update={
            "cloudflare": loaded.cloudflare.model_copy(  # type: ignore[union-attr]
                update={
                    "worker": loaded.cloudflare.worker.model_copy(  # type: ignore[union-attr]
                        update={"routes": ("hooks.example.com/webhooks/*",)}
                    )
                }
            )
        }
    )
    spellings = ["/webhooks/a", "/%77ebhooks/a", "//webhooks/a"]
    records = [req(0.1 * i, path, host="hooks.example.com") for i, path in enumerate(spellings)]
    result = replay(loaded, records)
    worker = row(result, ReplayLayer.WORKER, "hooks")
    assert worker.counted == 3  # type: ignore[attr-defined]
    assert worker.refused == 1  # type: ignore[attr-defined]
