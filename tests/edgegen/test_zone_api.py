"""The public zone API: ``edgegen.pull``, ``plan`` and ``apply`` (with its ``confirm`` and
``output`` callbacks), saved plans and state files, against the stateful fake zone, and
the public surface itself, pinned."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import edgegen_policy as policy
import pytest
from cloudflare_fake import ACCOUNT_ID, TOKEN, ZONE_ID, FakeCloudflare
from zone_support import EXAMPLE, HAND_MADE, Sleeps

import edgegen

WORKER = "api-edge-limits"
SCOPE = edgegen.Scope(ZONE_ID, ACCOUNT_ID, WORKER)

# The public surface, pinned: a name is added or removed here on purpose, never by accident.
PUBLIC = [
    "ApplyError",
    "ApplyEvent",
    "ApplyResult",
    "Artifacts",
    "BuildProblem",
    "Client",
    "CloudflareAPIError",
    "CompileError",
    "EdgeReport",
    "EdgegenError",
    "Placement",
    "RemoteState",
    "SavedPlan",
    "Scope",
    "StalePlanError",
    "TamperedPlanError",
    "Target",
    "Token",
    "UsageError",
    "WorkerArtifact",
    "ZoneError",
    "ZonePlan",
    "apply",
    "build",
    "load_plan",
    "load_state",
    "plan",
    "pull",
    "report",
    "save_plan",
    "save_state",
    "write",
]


def test_the_public_surface_is_pinned() -> None:
    """``edgegen.__all__`` is exactly the public names, each one importable and documented;
    nothing the CLI needs for plan, pull and apply is reached through a private module."""
    assert edgegen.__all__ == PUBLIC
    for name in PUBLIC:
        value = getattr(edgegen, name)
        assert (value.__doc__ or "").strip(), name
    assert issubclass(edgegen.TamperedPlanError, edgegen.ZoneError)
    assert issubclass(edgegen.StalePlanError, edgegen.ZoneError)


@pytest.fixture
def zone() -> Iterator[FakeCloudflare]:
    """An empty fake zone on the business plan, installed for the test."""
    fake = FakeCloudflare()
    with fake.mock():
        yield fake


@pytest.fixture
def client() -> Iterator[edgegen.Client]:
    """A client of the fake that never really sleeps."""
    with edgegen.Client(edgegen.Token(TOKEN), sleep=Sleeps()) as made:
        yield made


def artifacts() -> edgegen.Artifacts:
    """What the example policy builds."""
    env = {"CLOUDFLARE_ZONE_ID": ZONE_ID, "CLOUDFLARE_ACCOUNT_ID": ACCOUNT_ID}
    return edgegen.build(policy.load(EXAMPLE, env=env))


def test_pull_plan_apply(zone: FakeCloudflare, client: edgegen.Client) -> None:
    """pull reads the zone with GETs only, plan is pure, apply writes in order and tells
    ``output`` each step: the plan first, then each write; then the zone matches."""
    zone.seed_rules(HAND_MADE)
    state = edgegen.pull(client, SCOPE)
    assert {r.method for r in zone.log} == {"GET"}
    assert state.ruleset is not None
    assert [r["ref"] for r in state.ruleset.rules] == ["scrapers", "search-bots"]
    made = edgegen.plan(artifacts(), state)
    assert made.has_changes
    assert isinstance(made, edgegen.ZonePlan)
    events: list[edgegen.ApplyEvent] = []
    result = edgegen.apply(client, made, output=events.append)
    assert result.outcome == "applied"
    assert [(e.kind, e.write.split(" ")[0]) for e in events] == [
        ("plan", ""),
        ("written", "update"),
        ("written", "upload"),
        ("written", "add"),
        ("written", "add"),
    ]
    assert events[0].plan is made
    assert result.written == tuple(e.write for e in events[1:])
    again = edgegen.plan(artifacts(), edgegen.pull(client, SCOPE))
    assert not again.has_changes
    assert edgegen.apply(client, again).outcome == "no_changes"


def test_confirm_sees_the_plan_and_a_no_writes_nothing(
    zone: FakeCloudflare, client: edgegen.Client
) -> None:
    """``confirm`` is asked with the plan after it was shown; False cancels with nothing
    written."""
    made = edgegen.plan(artifacts(), edgegen.pull(client, SCOPE))
    asked: list[edgegen.ZonePlan] = []
    shown: list[str] = []

    def confirm(plan: edgegen.ZonePlan) -> bool:
        asked.append(plan)
        assert shown == ["plan"]
        return False

    result = edgegen.apply(
        client, made, confirm=confirm, output=lambda event: shown.append(event.kind)
    )
    assert result.outcome == "cancelled"
    assert asked == [made]
    assert zone.writes == []


def test_a_yes_reads_the_zone_again_before_writing(
    zone: FakeCloudflare, client: edgegen.Client
) -> None:
    """After a yes, the zone is read again: if it changed while the question was open,
    StalePlanError and nothing written; if not, apply writes."""
    made = edgegen.plan(artifacts(), edgegen.pull(client, SCOPE))

    def changed_meanwhile(plan: edgegen.ZonePlan) -> bool:
        zone.seed_rules(HAND_MADE)
        return True

    with pytest.raises(edgegen.StalePlanError, match="nothing was written") as info:
        edgegen.apply(client, made, confirm=changed_meanwhile)
    assert info.value.changed
    assert zone.writes == []
    made = edgegen.plan(artifacts(), edgegen.pull(client, SCOPE))
    reads = len(zone.log)
    result = edgegen.apply(client, made, confirm=lambda plan: True)
    assert result.outcome == "applied"
    assert [r.method for r in zone.log[reads : reads + 3]] == ["GET", "GET", "GET"]


def test_a_dry_run_returns_the_requests_it_would_send(
    zone: FakeCloudflare, client: edgegen.Client
) -> None:
    """``dry_run``: everything up to the first write; the requests come back in order;
    ``validate_remote`` is the one request that is not a GET, and saves nothing."""
    made = edgegen.plan(artifacts(), edgegen.pull(client, SCOPE))
    kinds: list[str] = []
    result = edgegen.apply(
        client,
        made,
        dry_run=True,
        validate_remote=True,
        output=lambda event: kinds.append(event.kind),
    )
    assert result.outcome == "dry_run"
    assert [w.method for w in result.requests] == ["PUT", "PUT", "POST", "POST"]
    assert kinds == ["plan", "validated"]
    assert [(r.method, r.query) for r in zone.writes] == [("PUT", "dry_run=true")]
    assert zone.entrypoint is None


def test_saved_plans_and_state_files(
    zone: FakeCloudflare, client: edgegen.Client, tmp_path: Path
) -> None:
    """A state saved and loaded plans the same; a plan saved and loaded is checked against
    the zone before it is shown, applies without asking, and refuses once its writes are
    edited (TamperedPlanError) or the zone changed (StalePlanError)."""
    state_file = tmp_path / "state.json"
    edgegen.save_state(edgegen.pull(client, SCOPE), state_file)
    state = edgegen.load_state(state_file)
    made = edgegen.plan(artifacts(), state)
    plan_file = tmp_path / "plan.json"
    edgegen.save_plan(made, plan_file)
    saved = edgegen.load_plan(plan_file)
    assert isinstance(saved, edgegen.SavedPlan)
    assert saved.source == str(plan_file)

    data = json.loads(plan_file.read_text())
    data["writes"]["ruleset"]["rules"][0]["ratelimit"]["requests_per_period"] = 1_000_000
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data))
    with pytest.raises(edgegen.TamperedPlanError, match="does not write what it shows"):
        edgegen.load_plan(tampered)

    shown: list[edgegen.ZonePlan] = []
    result = edgegen.apply(client, saved, output=lambda event: shown.append(event.plan))
    assert result.outcome == "applied"
    assert shown[0].rule_changes == made.rule_changes
    with pytest.raises(edgegen.StalePlanError, match="nothing was written"):
        edgegen.apply(client, edgegen.load_plan(plan_file))


def test_a_rejected_rule_is_reported_at_the_policy_line(
    zone: FakeCloudflare, client: edgegen.Client, tmp_path: Path
) -> None:
    """``policy``: the policy the plan was made from; a rule Cloudflare rejects is traced
    to its limit's line there, and the error says nothing was written."""
    zone.plan = "free"
    loaded = policy.load(
        EXAMPLE, env={"CLOUDFLARE_ZONE_ID": ZONE_ID, "CLOUDFLARE_ACCOUNT_ID": ACCOUNT_ID}
    )
    made = edgegen.plan(edgegen.build(loaded), edgegen.pull(client, SCOPE))
    with pytest.raises(edgegen.ZoneError, match="nothing was written") as info:
        edgegen.apply(client, made, policy=loaded, validate_remote=True)
    (rejected,) = info.value.rejections
    assert rejected.limit == "login"
    assert rejected.where is not None and rejected.where.startswith(f"{EXAMPLE}:")
    assert zone.entrypoint is None
