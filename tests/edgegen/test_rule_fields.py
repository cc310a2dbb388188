"""Rule fields per plan: ``requests_to_origin`` and the full set of periods.

A limit may count only requests that reach the origin; a rule carries that on Business and
up, the Worker cannot (L212). Every period and timeout the availability table offers a plan
compiles to a rule the fake Cloudflare accepts for that plan.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import edgegen_policy as policy
import hcl_subset
import pytest
from cloudflare_fake import FakeCloudflare
from edgegen_policy import Severity

import edgegen
from edgegen._capabilities import PLANS, capability_table_markdown, period_sources
from edgegen._placement import EDGE_CHECKS


def _policy(plan: str, limits: str, path: str = "policy.yaml") -> policy.Policy:
    text = (
        f"version: 1\ncloudflare:\n  plan: {plan}\n"
        '  worker: { name: w, routes: ["*/*"] }\nlimits:\n'
        + textwrap.indent(textwrap.dedent(limits), "  ")
    )
    return policy.loads(text, path)


def _rules(artifacts: edgegen.Artifacts) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = artifacts.ruleset["rules"]
    return rules


ORIGIN = """\
- name: pages
  match: { path_prefix: /pages/ }
  edge: { rate: 100/1m, unauthenticated_only: false, requests_to_origin: true }
"""


@pytest.mark.parametrize("plan", ["business", "enterprise", "enterprise-arl"])
def test_requests_to_origin_is_a_rule_field_where_the_plan_has_it(plan: str) -> None:
    """The rule sends requests_to_origin: true, in the JSON and the Terraform alike, and the
    fake Cloudflare accepts it on the plan."""
    artifacts = edgegen.build(_policy(plan, ORIGIN))
    [rule] = _rules(artifacts)
    assert rule["ratelimit"]["requests_to_origin"] is True
    assert artifacts.terraform is not None
    [(_, local)] = hcl_subset.parse(artifacts.terraform)["locals"]
    assert local["edgegen_rules"][0]["ratelimit"]["requests_to_origin"] is True
    assert FakeCloudflare(plan=plan).validate_rules(_rules(artifacts)) == []


def test_requests_to_origin_is_left_out_by_default() -> None:
    """A limit that does not ask for it sends no requests_to_origin (Cloudflare's default)."""
    artifacts = edgegen.build(_policy("business", ORIGIN.replace(", requests_to_origin: true", "")))
    [rule] = _rules(artifacts)
    assert "requests_to_origin" not in rule["ratelimit"]


@pytest.mark.parametrize("plan", ["free", "pro"])
def test_a_plan_without_requests_to_origin_gets_a_located_finding(plan: str) -> None:
    """Below Business the limit runs in the Worker, which counts every request: L212, a
    warning at the field's line, naming the plan that would honour it."""
    loaded = _policy(plan, ORIGIN)
    found = [d for d in policy.lint(loaded, EDGE_CHECKS) if d.code == "L212"]
    [warning] = found
    assert warning.severity is Severity.WARNING
    assert warning.path == "limits[0].edge.requests_to_origin"
    assert warning.file == "policy.yaml" and warning.line == 8
    assert "counts every request, cached responses included" in warning.message
    assert warning.fix == "use the Business plan or above, or remove requests_to_origin"
    # No second finding for the same cause (L206 says a field sent it to the Worker).
    assert not [d for d in policy.lint(loaded, EDGE_CHECKS) if d.code == "L206"]
    artifacts = edgegen.build(loaded)
    assert _rules(artifacts) == []
    assert artifacts.worker is not None
    # The Worker cannot honour it, and that the fake would refuse the rule is why.
    rule = {
        "ref": "edgegen:x",
        "expression": "true",
        "action": "block",
        "ratelimit": {
            "characteristics": ["cf.colo.id", "ip.src"],
            "period": 10,
            "requests_per_period": 5,
            "mitigation_timeout": 10,
            "requests_to_origin": True,
        },
    }
    [error] = FakeCloudflare(plan=plan).validate_rules([rule])
    assert error["source"]["pointer"] == "/rules/0/ratelimit/requests_to_origin"


def test_a_forced_worker_target_says_a_rule_would_honour_it() -> None:
    """target: worker on Business: L212 suggests removing the target."""
    loaded = _policy(
        "business",
        ORIGIN.replace("requests_to_origin: true", "requests_to_origin: true, target: worker"),
    )
    [warning] = [d for d in policy.lint(loaded, EDGE_CHECKS) if d.code == "L212"]
    assert warning.fix == "remove target: worker so a rule carries it, or remove requests_to_origin"


def test_requests_to_origin_takes_a_rule_slot_first() -> None:
    """With the Business plan's five slots taken by limits the Worker carries as well, the
    limit that counts only origin requests still gets a rule, and the last flexible limit
    moves to the Worker."""
    flexible = "".join(
        f"- name: l{i}\n  match: {{ paths: [/l{i}] }}\n"
        "  edge: { rate: 5/1m, unauthenticated_only: false }\n"
        for i in range(5)
    )
    artifacts = edgegen.build(_policy("business", flexible + ORIGIN))
    placed = {p.limit: p.target.value for p in artifacts.placements}
    assert placed["pages"] == "rule"
    assert placed["l4"] == "worker"
    assert [p for p, t in placed.items() if t == "rule"] == ["l0", "l1", "l2", "l3", "pages"]


def test_requests_to_origin_changes_show_in_the_diff() -> None:
    """edgegen diff names the change of what the edge counts."""
    from edgegen import _diff

    old = _policy("business", ORIGIN.replace(", requests_to_origin: true", ""))
    new = _policy("business", ORIGIN)
    changes = _diff.semantic_changes(
        _diff.Version("old", old, edgegen.build(old)), _diff.Version("new", new, edgegen.build(new))
    )
    [change] = [c for c in changes if c.kind == "edge_counting"]
    assert "counts only requests that reach the origin" in change.render(markdown=False)


@pytest.mark.parametrize("plan", list(PLANS))
def test_every_period_of_a_plan_builds_a_rule_the_plan_accepts(plan: str) -> None:
    """Each period the table offers the plan compiles to a rule (not the Worker) that the
    fake Cloudflare, which reads the availability table itself, accepts."""
    caps = PLANS[policy.CloudflarePlan(plan)]
    for period in caps.periods.value:
        loaded = _policy(
            plan,
            f"- name: x\n  edge: {{ rate: 5/{period}s, unauthenticated_only: false, "
            f"timeout: {caps.mitigation_timeouts.value[0]}s }}\n",
        )
        artifacts = edgegen.build(loaded)
        [rule] = _rules(artifacts)
        assert rule["ratelimit"]["period"] == period
        assert FakeCloudflare(plan=plan).validate_rules([rule]) == [], period


@pytest.mark.parametrize(
    ("plan", "rate", "placed"),
    [
        ("pro", "5/30s", "rule"),
        ("pro", "5/2m", None),
        ("business", "5/8m", "rule"),
        ("business", "5/1h", None),
        ("enterprise", "5/30m", "rule"),
        ("enterprise", "5/65535s", "rule"),
        ("enterprise", "5/1d", None),
    ],
)
def test_periods_up_to_the_plans_maximum(plan: str, rate: str, placed: str | None) -> None:
    """Values of the footnote up to the plan's maximum are rules; beyond it, L201 (the
    Worker offers 10 s and 1 min only) at the rate's line."""
    loaded = _policy(plan, f"- name: x\n  edge: {{ rate: {rate}, unauthenticated_only: false }}\n")
    errors = [d for d in policy.lint(loaded, EDGE_CHECKS) if d.severity is Severity.ERROR]
    if placed is None:
        [error] = errors
        assert (error.code, error.path, error.line) == ("L201", "limits[0].edge.rate", 7)
        assert f"is not available on the {plan} plan" in error.message
    else:
        assert errors == []
        [placement] = edgegen.build(loaded).placements
        assert placement.target.value == placed


def test_each_period_names_its_sources() -> None:
    """A value both pages list cites both; one only the availability footnote lists cites
    that alone, and the table marks it."""
    assert [s.url.rsplit("/", 2)[-2] for s in period_sources(60)] == [
        "rate-limiting-rules",
        "parameters",
    ]
    [only] = period_sources(30)
    assert only.url.endswith("#availability")
    assert period_sources(86400) == period_sources(86400, timeout=False)[:1]
    assert len(period_sources(86400, timeout=True)) == 2
    table = json.dumps(capability_table_markdown())
    assert "30*" in table and " 60," in table
