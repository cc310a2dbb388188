"""``count_when`` as rate limiting rules: a counting expression where the plan has one.

A rule decides on its matching expression and counts on its counting expression, which
replaces the match rather than extending it; so the counting expression carries the match
and adds ``http.response.code``. Below Business there is no counting expression: the limit
goes to the Worker with L215 at ``count_when``'s line.
"""

from __future__ import annotations

import textwrap
from typing import Any

import edgegen_policy as policy
import hcl_subset
import pytest
import rules_eval
from cloudflare_fake import FakeCloudflare
from edgegen_policy import Severity

import edgegen
from edgegen._placement import EDGE_CHECKS
from edgegen.compiler import _expr

HEADER = """\
version: 1
cloudflare:
  plan: {plan}
  worker: {{ name: w, routes: ["*/*"] }}
authenticated_when: {{ headers: [authorization] }}
limits:
"""

LOGIN = """\
- name: login
  match: { paths: [/login], methods: [POST] }
  count_when: { status: [401, 403, 5xx] }
  edge: { rate: 20/1m, unauthenticated_only: false }
"""


def _policy(plan: str, limits: str) -> policy.Policy:
    return policy.loads(HEADER.format(plan=plan) + textwrap.indent(limits, "  "), "policy.yaml")


def _rules(artifacts: edgegen.Artifacts) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = artifacts.ruleset["rules"]
    return rules


def _counts(rule: dict[str, Any], path: str, method: str, status: int, **headers: str) -> bool:
    tree, _ = rules_eval.parse(rule["ratelimit"]["counting_expression"])
    request = rules_eval.Request(
        path, method, "example.com", headers={k: [v] for k, v in headers.items()}, status=status
    )
    return rules_eval.evaluate(tree, request)


def _matches(rule: dict[str, Any], path: str, method: str, **headers: str) -> bool:
    tree, _ = rules_eval.parse(rule["expression"])
    request = rules_eval.Request(
        path, method, "example.com", headers={k: [v] for k, v in headers.items()}
    )
    return rules_eval.evaluate(tree, request)


@pytest.mark.parametrize("plan", ["business", "enterprise", "enterprise-arl"])
def test_a_rule_counts_only_the_listed_statuses_of_its_own_requests(plan: str) -> None:
    """The counting expression holds for the matched requests whose answer is listed, and
    for nothing else: not another status, not the same status on another path or method."""
    artifacts = edgegen.build(_policy(plan, LOGIN))
    [rule] = _rules(artifacts)
    assert [p.target.value for p in artifacts.placements] == ["rule"]
    listed = {401, 403, *range(500, 600)}
    for status in (200, 201, 302, 400, 401, 402, 403, 404, 429, 499, 500, 503, 599):
        assert _counts(rule, "/login", "POST", status) is (status in listed), status
        assert _counts(rule, "/other", "POST", status) is False
        assert _counts(rule, "/login", "GET", status) is False
    # The matching expression decides before there is an answer: it reads no response field.
    assert "http.response" not in rule["expression"]
    assert _matches(rule, "/login", "POST") and not _matches(rule, "/other", "POST")
    assert FakeCloudflare(plan=plan).validate_rules(_rules(artifacts)) == []


def test_the_counting_expression_is_in_the_terraform_too() -> None:
    """Terraform carries the same counting expression as the JSON ruleset."""
    artifacts = edgegen.build(_policy("business", LOGIN))
    [rule] = _rules(artifacts)
    assert artifacts.terraform is not None
    [(_, local)] = hcl_subset.parse(artifacts.terraform)["locals"]
    terraform = local["edgegen_rules"][0]["ratelimit"]["counting_expression"]
    assert terraform == rule["ratelimit"]["counting_expression"]


def test_a_limit_without_count_when_has_no_counting_expression() -> None:
    """Cloudflare's default (count what matches) is left to Cloudflare: no field sent."""
    artifacts = edgegen.build(_policy("business", LOGIN.replace(LOGIN.splitlines()[2] + "\n", "")))
    [rule] = _rules(artifacts)
    assert "counting_expression" not in rule["ratelimit"]


def test_one_status_is_an_eq_and_a_match_everything_limit_counts_by_status_alone() -> None:
    """A limit on every request needs no match in its counting expression."""
    text = """\
- name: errors
  count_when: { status: 401 }
  edge: { rate: 20/1m, unauthenticated_only: false }
"""
    [rule] = _rules(edgegen.build(_policy("business", text)))
    assert rule["ratelimit"]["counting_expression"] == "http.response.code eq 401"


def test_the_status_condition_writes_ranges_and_numbers() -> None:
    """Ranges are wirefilter's ``lo..hi`` inside an integer set."""
    condition = _expr.status_condition(((401, 401), (403, 403), (500, 599)))
    assert condition.text == "http.response.code in {401 403 500..599}"
    assert _expr.status_condition(((404, 404),)).text == "http.response.code eq 404"
    assert _expr.status_condition(((400, 499),)).text == "http.response.code in {400..499}"


def test_a_counting_expression_over_the_length_limit_stops_the_build() -> None:
    """The counting expression repeats the match: when the two no longer fit in 4,096
    characters the build says so (E301) rather than sending what Cloudflare refuses."""
    with pytest.raises(_expr.ExpressionError, match="counting expression"):
        _expr.counting_expression("x" * 4090, ((401, 401),))


@pytest.mark.parametrize("plan", ["free", "pro"])
def test_a_plan_without_counting_expressions_sends_the_limit_to_the_worker(plan: str) -> None:
    """Below Business: L215 (info) at count_when's line, naming the plan that has it; the
    Worker carries the limit; the rule the fake Cloudflare refuses is why."""
    text = LOGIN.replace("20/1m", "20/10s").replace(", methods: [POST]", "")
    loaded = _policy(plan, text)
    [finding] = [d for d in policy.lint(loaded, EDGE_CHECKS) if d.code == "L215"]
    assert finding.severity is Severity.INFO
    assert finding.path == "limits[0].count_when"
    assert finding.file == "policy.yaml" and finding.line == 9
    assert "cannot count only some answers" in finding.message
    assert "401, 403, 5xx" in finding.message
    assert finding.fix == "use the Business plan or above"
    assert not [d for d in policy.lint(loaded, EDGE_CHECKS) if d.code == "L206"]
    artifacts = edgegen.build(loaded)
    assert _rules(artifacts) == []
    assert [p.target.value for p in artifacts.placements] == ["worker"]
    [business] = _rules(edgegen.build(_policy("business", text)))
    errors = FakeCloudflare(plan=plan).validate_rules([business])
    assert "/rules/0/ratelimit/counting_expression" in [e["source"]["pointer"] for e in errors]


def test_target_rule_on_a_plan_without_counting_expressions_is_an_error() -> None:
    """target: rule cannot be honoured: L202, saying why."""
    loaded = _policy("pro", LOGIN.replace("unauthenticated_only: false", "target: rule"))
    [error] = [d for d in policy.lint(loaded, EDGE_CHECKS) if d.code == "L202"]
    assert "cannot count only some answers" in error.message
    with pytest.raises(edgegen.CompileError):
        edgegen.build(loaded)


def test_the_fake_refuses_a_response_field_in_the_matching_expression() -> None:
    """Cloudflare decides the match before the answer: response fields belong in the
    counting expression only."""
    [rule] = _rules(edgegen.build(_policy("business", LOGIN)))
    bad = {**rule, "expression": rule["ratelimit"]["counting_expression"]}
    errors = FakeCloudflare(plan="business").validate_rules([bad])
    assert [e["source"]["pointer"] for e in errors] == ["/rules/0/expression"]


CREDENTIALED = """\
- name: api
  match: { path_prefix: /api/ }
  count_when: { status: [401] }
  edge: { rate: 10/1m, unauthenticated_only: true, credentialed_rate: 50/1m }
"""


def test_both_counters_of_an_unauthenticated_only_limit_count_only_the_statuses() -> None:
    """With unauthenticated_only (header fields: Enterprise), each rule counts the listed
    answers of its own requests: without a credential at the rate, with one at the
    credentialed rate. A 401 to a request with a (made-up) token counts against the
    credentialed rule, never the other."""
    artifacts = edgegen.build(_policy("enterprise", CREDENTIALED))
    own, credentialed = _rules(artifacts)
    assert own["ratelimit"]["requests_per_period"] == 10
    assert credentialed["ratelimit"]["requests_per_period"] == 50
    assert _counts(own, "/api/x", "GET", 401)
    assert not _counts(own, "/api/x", "GET", 401, authorization="Bearer x")
    assert not _counts(own, "/api/x", "GET", 200)
    assert _counts(credentialed, "/api/x", "GET", 401, authorization="Bearer x")
    assert not _counts(credentialed, "/api/x", "GET", 401)
    assert not _counts(credentialed, "/api/x", "GET", 200, authorization="Bearer x")
    assert FakeCloudflare(plan="enterprise").validate_rules(_rules(artifacts)) == []


def test_count_when_with_requests_to_origin_sends_both() -> None:
    """Both narrow what counts: answers from the origin (not the cache) with a listed status."""
    text = LOGIN.replace(
        "unauthenticated_only: false", "unauthenticated_only: false, requests_to_origin: true"
    )
    [rule] = _rules(edgegen.build(_policy("business", text)))
    assert rule["ratelimit"]["requests_to_origin"] is True
    assert "http.response.code" in rule["ratelimit"]["counting_expression"]
    assert FakeCloudflare(plan="business").validate_rules([rule]) == []


def test_count_when_limits_take_a_rule_slot_before_flexible_ones() -> None:
    """A rule decides on its own counter; the Worker's spent mark reaches other isolates
    with a lag (docs/edge.md), so with the slots full a count_when limit keeps its rule."""
    flexible = "".join(
        f"- name: l{i}\n  match: {{ paths: [/l{i}] }}\n"
        "  edge: { rate: 5/1m, unauthenticated_only: false }\n"
        for i in range(5)
    )
    artifacts = edgegen.build(_policy("business", flexible + LOGIN))
    placed = {p.limit: p.target.value for p in artifacts.placements}
    assert placed["login"] == "rule"
    assert placed["l4"] == "worker"


def _changes(old_text: str, new_text: str, plan: str = "business") -> list[str]:
    from edgegen import _diff

    old, new = _policy(plan, old_text), _policy(plan, new_text)
    changes = _diff.semantic_changes(
        _diff.Version("old", old, edgegen.build(old)), _diff.Version("new", new, edgegen.build(new))
    )
    return [c.render(markdown=False) for c in changes if c.kind == "count_when"]


def test_a_change_of_count_when_shows_in_the_diff() -> None:
    """Adding, changing and removing count_when are each a change in what is counted."""
    plain = LOGIN.replace("  count_when: { status: [401, 403, 5xx] }\n", "")
    assert _changes(plain, LOGIN) == [
        "limit 'login': now counts only answers with status '401, 403, 5xx' (checked before "
        "a request runs, counted after its answer); other answers no longer count"
    ]
    assert _changes(LOGIN, plain) == [
        "limit 'login': now counts every request (it counted only answers with status "
        "'401, 403, 5xx')"
    ]
    narrower = LOGIN.replace("[401, 403, 5xx]", "401")
    assert _changes(LOGIN, narrower) == [
        "limit 'login': now counts answers with status '401' (was '401, 403, 5xx')"
    ]
    # The same statuses spelled otherwise are no change.
    assert _changes(LOGIN, LOGIN.replace("[401, 403, 5xx]", "[500-599, 403, 401]")) == []


def test_the_failed_logins_recipe_builds_as_it_says() -> None:
    """docs/recipes.md's policy: valid (the one warning the recipe names: L210, a rule
    counts each IPv6 address), a rule counting 401s on Business, the Worker with L215 on
    Free."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "recipes.md").read_text("utf-8")
    [snippet] = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    loaded = policy.loads(snippet, "recipes.md")
    warnings = [d for d in policy.lint(loaded, EDGE_CHECKS) if d.severity is not Severity.INFO]
    assert [d.code for d in warnings] == ["L210"]
    [rule] = _rules(edgegen.build(loaded))
    assert _counts(rule, "/login", "POST", 401) and not _counts(rule, "/login", "POST", 200)
    assert rule["ratelimit"]["requests_per_period"] == 20
    free = policy.loads(snippet.replace("plan: business", "plan: free"), "recipes.md")
    # L205 (the free plan's 10 s period), L206 (the method), L211 (info: the route's host)
    # and L215 (no counting expression) all send it to the Worker.
    assert "L215" in [d.code for d in policy.lint(free, EDGE_CHECKS)]
    assert [p.target.value for p in edgegen.build(free).placements] == ["worker"]


@pytest.mark.parametrize("plan", ["business", "enterprise", "enterprise-arl"])
@pytest.mark.parametrize("limits", [LOGIN, CREDENTIALED], ids=["login", "credentialed"])
def test_the_rules_pass_the_cloudflare_sdks_request_types(plan: str, limits: str) -> None:
    """The ruleset's rules validate against the official SDK's types for the phase
    entrypoint's PUT (``cloudflare.types.rulesets.phase_update_params.Rule``), the
    counting expression included; a counting expression of the wrong type does not."""
    from cloudflare.types.rulesets import phase_update_params
    from pydantic import TypeAdapter, ValidationError

    if limits is CREDENTIALED and plan == "business":
        limits = CREDENTIALED.replace("true", "false")  # header fields: Enterprise
    rules = _rules(edgegen.build(_policy(plan, limits)))
    assert rules and all("counting_expression" in r["ratelimit"] for r in rules)
    adapter = TypeAdapter(list[phase_update_params.Rule])
    validated = adapter.validate_python(rules)
    assert [r["ratelimit"]["counting_expression"] for r in validated] == [
        r["ratelimit"]["counting_expression"] for r in rules
    ]
    broken = [{**rules[0], "ratelimit": {**rules[0]["ratelimit"], "counting_expression": 401}}]
    with pytest.raises(ValidationError):
        adapter.validate_python(broken)
