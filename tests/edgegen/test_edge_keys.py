"""Keys beyond the address: the policy's ``edge.per``, where each key runs, and the rules.

A key runs as a rule where the plan offers the characteristic (the fake Cloudflare accepts
the ruleset for that plan), else in the Worker with a located finding (L213, L214). The
Worker's behaviour in workerd is in test_edge_keys_worker.py.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import hcl_subset
import jsonschema
import pytest
import rules_eval
from cloudflare_fake import ACCOUNT_ID, TOKEN, ZONE_ID, FakeCloudflare
from edgegen_policy import CookieKey, EdgeKey, HeaderKey, JwtKey, PolicyLoadError, Severity
from zone_support import Sleeps

import edgegen
from edgegen import _diff, cli
from edgegen._capabilities import PLANS, key_table_markdown, rule_can_key
from edgegen._placement import EDGE_CHECKS, place
from edgegen.cloudflare import _client
from edgegen.compiler import _worker
from edgegen.replay._engine import replay
from edgegen.replay._types import Record

DOCS = Path(__file__).resolve().parents[2] / "docs" / "edge.md"
PLAN_NAMES = [plan.value for plan in PLANS]
KEYS = {
    "ip": "ip",
    "ip_nat": "ip_nat",
    "header": "{ header: X-Api-Key }",
    "cookie": "{ cookie: session }",
    "jwt": "{ jwt: { claim: sub, secret: JWT_SECRET } }",
}
# The lowest plan whose rules count by each key (None: no plan's rules).
RULE_FROM = {
    "ip": "free",
    "ip_nat": "business",
    "header": "enterprise-arl",
    "cookie": "enterprise-arl",
    "jwt": None,
}


def policy_text(plan: str, per: str, extra: str = "") -> str:
    """One edge limit on /api/, 100 per 10 s (a period every plan and the Worker offer)."""
    return textwrap.dedent(
        f"""\
        version: 1
        cloudflare:
          plan: {plan}
          worker: {{ name: keys-test, routes: ["api.example.com/*"] }}
        limits:
          - name: api
            match: {{ path_prefix: /api/ }}
            edge:
              rate: 100/10s
              per: {per}
        """
    ) + textwrap.indent(extra, "      ")


def load(text: str) -> policy.Policy:
    """A policy from text, as policy.yaml."""
    return policy.loads(text, "policy.yaml")


def load_error(text: str) -> str:
    """The one-line message of the load error a policy text raises."""
    with pytest.raises(PolicyLoadError) as caught:
        load(text)
    return str(caught.value)


def rules(artifacts: edgegen.Artifacts) -> list[dict[str, Any]]:
    """The generated rules."""
    found: list[dict[str, Any]] = artifacts.ruleset["rules"]
    return found


# --- the policy ---------------------------------------------------------------------------


def test_each_spelling_of_per_loads_as_its_key() -> None:
    """Names and one-key mappings; header names lower-cased; jwt defaults filled in."""
    loaded = {kind: load(policy_text("free", per)).limits[0].edge for kind, per in KEYS.items()}
    assert loaded["ip"] is not None and loaded["ip"].per is EdgeKey.IP
    assert loaded["ip_nat"] is not None and loaded["ip_nat"].per is EdgeKey.IP_NAT
    assert loaded["header"] is not None and loaded["header"].per == HeaderKey(header="x-api-key")
    assert loaded["cookie"] is not None and loaded["cookie"].per == CookieKey(cookie="session")
    jwt = loaded["jwt"]
    assert jwt is not None and isinstance(jwt.per, JwtKey)
    assert jwt.per.jwt.token_header == "authorization" and jwt.per.jwt.algorithms == ("HS256",)
    assert jwt.per.jwt.leeway.ms == 60_000


def test_keyed_limits_count_every_request() -> None:
    """unauthenticated_only defaults to false with a keyed per (true with an address), and
    true written out is an error at the edge's line, saying why and what to do."""
    for kind in ("header", "cookie", "jwt"):
        edge = load(policy_text("free", KEYS[kind])).limits[0].edge
        assert edge is not None and edge.unauthenticated_only is False, kind
    edge = load(policy_text("free", "ip_nat")).limits[0].edge
    assert edge is not None and edge.unauthenticated_only is True
    message = load_error(policy_text("free", KEYS["header"], "unauthenticated_only: true\n"))
    assert message.startswith("policy.yaml:9:")
    assert "limits[0].edge" in message and "remove unauthenticated_only" in message


@pytest.mark.parametrize(
    ("per", "line", "field", "says"),
    [
        ("{ header: 'x api key' }", 10, "per.header", "not an HTTP header name"),
        ('{ cookie: "a;b" }', 10, "per.cookie", "not a cookie name"),
        ("{ header: a, cookie: b }", 10, "per", "per is ip, ip_nat"),
        ("ipv6", 10, "per", "'ip' or 'ip_nat'"),
        ("{ jwt: { claim: sub } }", 10, "per.jwt", "exactly one way to verify"),
        (
            "{ jwt: { secret: S, jwks: 'https://a.example/k' } }",
            10,
            "per.jwt",
            "exactly one way to verify",
        ),
        ("{ jwt: { secret: 'hunter2-the-real-key' } }", 10, "per.jwt.secret", "never write"),
        ("{ jwt: { jwks: 'http://auth.example.com/k' } }", 10, "per.jwt.jwks", "https URL"),
        ("{ jwt: { secret: S, claim: 'a b' } }", 10, "per.jwt.claim", "not a claim name"),
        ("{ jwt: { secret: S, leeway: 10m } }", 10, "per.jwt", "longer than 5m"),
        ("{ jwt: { secret: S, header: a, cookie: b } }", 10, "per.jwt", "not both"),
        ("{ jwt: { secret: S, audience: '' } }", 10, "per.jwt.audience", "empty"),
    ],
)
def test_bad_keys_name_file_line_and_field(per: str, line: int, field: str, says: str) -> None:
    """Each mistake is one error at the per line with the field's path and the fix."""
    message = load_error(policy_text("free", per))
    assert re.match(rf"policy\.yaml:{line}:\d+: limits\[0\]\.edge\.{re.escape(field)}: ", message)
    assert says in message
    assert "Traceback" not in message


def test_the_json_schema_takes_every_spelling() -> None:
    """Editors validating against the published schema accept each key and refuse others."""
    schema = policy.json_schema()
    import yaml

    for per in KEYS.values():
        jsonschema.validate(yaml.safe_load(policy_text("free", per)), schema)
    bad = yaml.safe_load(policy_text("free", "{ header: a, cookie: b }"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


# --- placement and rules, per plan ---------------------------------------------------------


@pytest.mark.parametrize("plan", PLAN_NAMES)
@pytest.mark.parametrize("kind", list(KEYS))
def test_each_key_runs_where_the_plan_can_express_it(plan: str, kind: str) -> None:
    """A rule where the plan has the characteristic, the Worker otherwise; the ruleset is
    one the fake Cloudflare accepts for the plan, and every rule expression parses."""
    loaded = load(policy_text(plan, KEYS[kind]))
    artifacts = edgegen.build(loaded)
    [placed] = place(loaded)
    assert loaded.cloudflare is not None
    as_rule = rule_can_key(PLANS[loaded.cloudflare.plan], kind)
    assert (placed.target.value if placed.target else None) == ("rule" if as_rule else "worker")
    assert FakeCloudflare(plan=plan).validate_rules(rules(artifacts)) == []
    for rule in rules(artifacts):
        rules_eval.parse(rule["expression"])
    if as_rule:
        assert artifacts.worker is None
    else:
        assert rules(artifacts) == [] and artifacts.worker is not None


@pytest.mark.parametrize("plan", PLAN_NAMES)
@pytest.mark.parametrize("kind", ["ip_nat", "header", "cookie", "jwt"])
def test_a_key_the_plan_lacks_is_a_located_finding(plan: str, kind: str) -> None:
    """L213 (info) at the per line names the plan that would make it a rule; ip_nat in the
    Worker adds L214 (a warning): the Worker counts it per client IP."""
    loaded = load(policy_text(plan, KEYS[kind]))
    found = {d.code: d for d in policy.lint(loaded, EDGE_CHECKS)}
    if RULE_FROM[kind] is not None and PLAN_NAMES.index(plan) >= PLAN_NAMES.index(
        RULE_FROM[kind] or ""
    ):
        assert "L213" not in found and "L214" not in found
        return
    info = found["L213"]
    assert info.severity is Severity.INFO
    assert (info.file, info.line, info.path) == ("policy.yaml", 10, "limits[0].edge.per")
    if kind == "jwt":
        assert "API Shield" in info.message
    else:
        lowest = next(c for c in PLANS.values() if rule_can_key(c, kind))
        assert f"use the {lowest.label} plan or above" in info.message
    if kind == "ip_nat":
        warning = found["L214"]
        assert warning.severity is Severity.WARNING and warning.line == 10
        assert "counts per client IP" in warning.message
    else:
        assert "L214" not in found


def test_target_rule_with_a_jwt_key_is_an_error() -> None:
    """No plan's rules verify a token: target: rule cannot be honoured (L202)."""
    loaded = load(policy_text("enterprise-arl", KEYS["jwt"], "target: rule\n"))
    errors = [d for d in policy.lint(loaded, EDGE_CHECKS) if d.severity is Severity.ERROR]
    assert [d.code for d in errors] == ["L202"]
    assert "API Shield" in errors[0].message
    with pytest.raises(edgegen.CompileError):
        edgegen.build(loaded)


def test_ip_nat_rule_counts_by_the_visitor_id_alone() -> None:
    """cf.unique_visitor_id without ip.src (Cloudflare refuses the two together)."""
    [rule] = rules(edgegen.build(load(policy_text("business", "ip_nat"))))
    assert rule["ratelimit"]["characteristics"] == ["cf.colo.id", "cf.unique_visitor_id"]


@pytest.mark.parametrize(
    ("per", "characteristic", "present", "empty"),
    [
        (KEYS["header"], 'http.request.headers["x-api-key"]', {"headers": {"x-api-key": ["k"]}},
         {"headers": {"x-api-key": [""]}}),
        (KEYS["cookie"], 'http.request.cookies["session"]', {"cookies": {"session": ["s"]}},
         {"cookies": {"session": [""]}}),
    ],
)  # fmt: skip
def test_a_header_or_cookie_rule_counts_requests_without_the_key_by_address(
    per: str, characteristic: str, present: dict[str, Any], empty: dict[str, Any]
) -> None:
    """Two rules: the key's values (for requests that carry it) and the client IP (for the
    others); exactly one of them matches any request. A key sent empty (``session=``) is
    no key, as the Worker reads it: counted by address, never all under "" in one
    counter that an anonymous client could fill for everyone."""
    artifacts = edgegen.build(load(policy_text("enterprise-arl", per)))
    keyed, unkeyed = rules(artifacts)
    assert keyed["ratelimit"]["characteristics"] == ["cf.colo.id", characteristic]
    assert unkeyed["ratelimit"]["characteristics"] == ["cf.colo.id", "ip.src"]
    assert unkeyed["ref"] == keyed["ref"] + "-unkeyed"
    assert keyed["ratelimit"]["requests_per_period"] == 100
    assert unkeyed["ratelimit"]["requests_per_period"] == 100
    base = {"path": "/api/x", "host": "api.example.com", "method": "GET"}
    for fields, expected in ((present, (True, False)), ({}, (False, True)), (empty, (False, True))):
        request = rules_eval.Request(**base, **fields)
        got = tuple(
            rules_eval.evaluate(rules_eval.parse(r["expression"])[0], request)
            for r in (keyed, unkeyed)
        )
        assert got == expected, fields
    detail = json.loads(keyed["action_parameters"]["response"]["content"])["detail"]
    assert "one value of" in detail


def test_a_keyed_limit_takes_two_rule_slots() -> None:
    """Placement counts both rules against the plan's quota: the explanation names both."""
    artifacts = edgegen.build(load(policy_text("enterprise-arl", KEYS["header"])))
    [placement] = artifacts.placements
    assert any("a second rule" in reason for reason in placement.reasons)


def test_names_that_need_escaping_stay_inside_their_strings() -> None:
    """Cookie and claim names with quotes, backslashes, < and > are written as data: a
    valid rule expression and characteristic, and a Worker module whose only policy text is
    the escaped JSON."""
    cookie = "a'b|c~d"
    claim = 'https://example.com/"tier"\\</script>'
    text = policy_text("enterprise-arl", f'{{ cookie: "{cookie}" }}')
    [keyed, _] = rules(edgegen.build(load(text)))
    assert keyed["ratelimit"]["characteristics"][1] == f'http.request.cookies["{cookie}"]'
    rules_eval.parse(keyed["expression"])
    claim_yaml = json.dumps(claim)
    worker = edgegen.build(
        load(policy_text("free", f"{{ jwt: {{ claim: {claim_yaml}, secret: S }} }}"))
    ).worker
    assert worker is not None
    assert "</script>" not in worker.module_source and claim not in worker.module_source
    blob = worker.module_source.split("const CONFIG = ", 1)[1].split(";\n", 1)[0]
    assert json.loads(blob)["limits"][0]["key"]["claim"] == claim


# --- the Worker's files ---------------------------------------------------------------------


def test_only_a_worker_with_a_keyed_limit_carries_the_key_logic() -> None:
    """keys.js and CONFIG.keySecret are in the module only when a limit needs them."""
    plain = edgegen.build(load(policy_text("free", "ip", "target: worker\n"))).worker
    keyed = edgegen.build(load(policy_text("free", KEYS["header"]))).worker
    assert plain is not None and keyed is not None
    marker = "async function keyedCounters("
    assert marker not in plain.module_source and plain.secrets == ()
    assert marker in keyed.module_source and keyed.secrets == (_worker.KEY_SECRET,)
    assert '"keySecret": "EDGEGEN_KEY_SECRET"' in keyed.module_source


def test_terraform_takes_the_secrets_as_sensitive_inputs() -> None:
    """One sensitive variable per secret, bound as secret_text; no value anywhere."""
    artifacts = edgegen.build(load(policy_text("free", KEYS["jwt"])))
    assert artifacts.terraform is not None
    parsed = hcl_subset.parse(artifacts.terraform)
    variables = dict(parsed["variable"])
    for name in ("secret_edgegen_key_secret", "secret_jwt_secret"):
        assert variables[(name,)]["sensitive"] is True
        assert "default" not in variables[(name,)]
    [(_, script)] = [r for r in parsed["resource"] if r[0][0] == "cloudflare_workers_script"]
    bindings = script["bindings"]
    assert bindings.name == "concat"
    secret_bindings = bindings.args[1]
    assert [b["name"] for b in secret_bindings] == ["EDGEGEN_KEY_SECRET", "JWT_SECRET"]
    assert all(b["type"] == "secret_text" for b in secret_bindings)


def test_wrangler_toml_says_which_secrets_to_set() -> None:
    """The comment names each secret and what happens until it is set."""
    worker = edgegen.build(load(policy_text("free", KEYS["jwt"]))).worker
    assert worker is not None
    toml = worker.wrangler_toml
    assert "wrangler secret put EDGEGEN_KEY_SECRET" in toml
    assert "wrangler secret put JWT_SECRET" in toml
    assert "count by client IP" in toml
    assert "per the JWT claim sub value" in toml


def test_the_fake_refuses_characteristics_the_plan_lacks() -> None:
    """The fake's validation is what makes the per-plan tests meaningful: a header
    characteristic below Advanced Rate Limiting, and ip.src with the visitor id, fail."""
    rule = {
        "ref": "x",
        "expression": "true",
        "action": "block",
        "ratelimit": {
            "characteristics": ["cf.colo.id", 'http.request.headers["x"]'],
            "period": 10,
            "requests_per_period": 1,
            "mitigation_timeout": 10,
        },
    }
    for plan in ("free", "pro", "business", "enterprise"):
        [error] = FakeCloudflare(plan=plan).validate_rules([rule])
        assert error["source"]["pointer"] == "/rules/0/ratelimit/characteristics/1"
    assert FakeCloudflare(plan="enterprise-arl").validate_rules([rule]) == []
    both = {**rule, "ratelimit": {**rule["ratelimit"]}}
    both["ratelimit"]["characteristics"] = ["cf.colo.id", "ip.src", "cf.unique_visitor_id"]
    [error] = FakeCloudflare(plan="business").validate_rules([both])
    assert "cannot be used together" in error["message"]


def test_docs_show_the_current_key_table() -> None:
    """docs/edge.md holds the table key_table_markdown() renders, verbatim."""
    text = DOCS.read_text(encoding="utf-8")
    start = "<!-- key table: generated by edgegen._capabilities.key_table_markdown -->\n"
    shown = text.split(start, 1)[1].split("<!-- end of key table -->", 1)[0]
    assert shown == key_table_markdown()


# --- apply keeps the secrets the user set ---------------------------------------------------

ZONE_POLICY = """\
version: 1
cloudflare:
  plan: business
  zone_id: ${CLOUDFLARE_ZONE_ID}
  account_id: ${CLOUDFLARE_ACCOUNT_ID}
  worker: { name: keys-zone, routes: ["api.example.com/*"] }
limits:
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: RATE, per: { jwt: { secret: JWT_SECRET } } }
"""


@pytest.fixture
def zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCloudflare]:
    """An empty fake zone and the environment that points at it; the client never sleeps."""
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", TOKEN)
    monkeypatch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
    monkeypatch.delenv("CLOUDFLARE_API_BASE_URL", raising=False)
    monkeypatch.setattr(_client, "_sleep", Sleeps())
    fake = FakeCloudflare()
    with fake.mock():
        yield fake


def test_apply_keeps_secrets_set_with_wrangler(
    zone: FakeCloudflare, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Secrets set on the script survive a new upload (keep_bindings), are no change in the
    plan, and their names only (never a value) appear in its output."""
    path = tmp_path / "policy.yaml"
    path.write_text(ZONE_POLICY.replace("RATE", "100/1m"))
    assert cli.main(["apply", str(path), "--auto-approve"]) == 0
    zone.put_secret("keys-zone", "EDGEGEN_KEY_SECRET")
    zone.put_secret("keys-zone", "JWT_SECRET")
    capsys.readouterr()
    assert cli.main(["plan", str(path), "--detailed-exitcode"]) == 0
    path.write_text(ZONE_POLICY.replace("RATE", "50/1m"))
    assert cli.main(["apply", str(path), "--auto-approve"]) == 0
    names = {b["name"]: b["type"] for b in zone.scripts["keys-zone"].bindings}
    assert names["EDGEGEN_KEY_SECRET"] == names["JWT_SECRET"] == "secret_text"
    assert [b["simple"]["limit"] for b in zone.scripts["keys-zone"].bindings if "simple" in b] == [
        50
    ]


def test_lint_names_the_edge_key_not_the_address() -> None:
    """L111 (the edge counts per IP while the app counts an app key) is not said of a limit
    whose edge counts by a header; L110 says why credentialed_rate has no effect there."""
    text = textwrap.dedent(
        """\
        version: 1
        cloudflare: { plan: free, worker: { name: w, routes: ["api.example.com/*"] } }
        authenticated_when: { headers: [authorization] }
        tiers: [free]
        limits:
          - name: api
            match: { path_prefix: /api/ }
            edge: { rate: 100/1m, per: { header: x-api-key }, credentialed_rate: 1000/1m }
            app: { per: org, tiers: { free: 10/1m } }
          - name: web
            match: { path_prefix: /web/ }
            edge: { rate: 100/1m }
            app: { per: org, tiers: { free: 10/1m } }
        """
    )
    found = policy.lint(load(text), EDGE_CHECKS)
    assert [d.limit for d in found if d.code == "L111"] == ["web"]
    [unused] = [d for d in found if d.code == "L110"]
    assert "counts per header x-api-key, or per client IP without one" in unused.message


# --- edge.tiers -------------------------------------------------------------------------------

TIERS = """\
version: 1
cloudflare: { plan: free, worker: { name: w, routes: ["api.example.com/*"] } }
tiers: [free, pro, team]
limits:
  - name: api
    match: { path_prefix: /api/ }
    edge:
      rate: 2/1m
      per: { jwt: { claim: sub, tier: tier, jwks: "https://auth.example.com/jwks.json" } }
      tiers: true
    app: { tiers: { free: [3/10s, 100/1h], pro: 5/1m, team: 10000/1d } }
"""


def test_edge_tiers_bind_each_usable_app_rate() -> None:
    """One binding per app rate with a period of 10s or 1m; a tier with none is L216 at its
    line and is held to rate."""
    loaded = load(TIERS)
    artifacts = edgegen.build(loaded)
    assert artifacts.worker is not None
    simple = {b["name"]: b["simple"] for b in artifacts.worker.bindings}
    assert list(simple.values()) == [
        {"limit": 2, "period": 60},
        {"limit": 3, "period": 10},
        {"limit": 5, "period": 60},
    ]
    assert len({b["namespace_id"] for b in artifacts.worker.bindings}) == 3
    blob = artifacts.worker.module_source.split("const CONFIG = ", 1)[1].split(";\n", 1)[0]
    entry = json.loads(blob)["limits"][0]
    assert sorted(entry["tiers"]) == ["free", "pro"]
    assert entry["key"]["tierClaim"] == "tier"
    [finding] = [d for d in policy.lint(loaded, EDGE_CHECKS) if d.code == "L216"]
    assert finding.severity is Severity.WARNING and finding.line == 11
    assert finding.path == "limits[0].app.tiers.team"
    assert "'team'" in finding.message and "held to rate (2/1m)" in finding.message
    assert "in tier pro" in artifacts.worker.wrangler_toml


@pytest.mark.parametrize(
    ("edge", "app", "says"),
    [
        (
            "{ rate: 2/1m, per: { jwt: { secret: S } }, tiers: true }",
            "{ tiers: { f: 1/1m } }",
            "tier:",
        ),
        ("{ rate: 2/1m, per: ip, tiers: true }", "{ tiers: { f: 1/1m } }", "tier:"),
        ("{ rate: 2/1m, per: { jwt: { secret: S, tier: t } }, tiers: true }", None, "no app part"),
    ],
)
def test_edge_tiers_need_a_tier_claim_and_an_app_part(
    edge: str, app: str | None, says: str
) -> None:
    """Each is one located error that says what to add."""
    text = (
        'version: 1\ncloudflare: { plan: free, worker: { name: w, routes: ["a.b/*"] } }\n'
        f"tiers: [f]\nlimits:\n  - name: api\n    edge: {edge}\n"
        + (f"    app: {app}\n" if app else "")
    )
    message = load_error(text)
    assert message.startswith("policy.yaml:") and says in message


def test_ip_nat_with_credentials_counts_both_rules_by_the_visitor_id() -> None:
    """An unauthenticated-only ip_nat limit on Enterprise: both rules (without and with a
    credential) count per cf.unique_visitor_id, and say so; the fake accepts them."""
    text = policy_text("enterprise", "ip_nat").replace(
        "limits:", "authenticated_when: { headers: [authorization] }\nlimits:"
    )
    built = rules(edgegen.build(load(text)))
    assert [r["ratelimit"]["characteristics"] for r in built] == [
        ["cf.colo.id", "cf.unique_visitor_id"]
    ] * 2
    assert "unauthenticated visitor (IP with NAT support)" in built[0]["description"]
    assert "visitor (IP with NAT support) sending a credential" in built[1]["description"]
    assert FakeCloudflare(plan="enterprise").validate_rules(built) == []


def test_diff_names_a_change_of_key_and_of_edge_tiers(tmp_path: Path) -> None:
    """edgegen diff says what the edge counted by before and after, and edge.tiers on/off."""
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(policy_text("free", KEYS["header"]))
    new.write_text(
        TIERS.replace('jwks: "https://auth.example.com/jwks.json"', "secret: JWT_SECRET")
        .replace("[free, pro, team]", "[free, pro]")
        .replace(", team: 10000/1d", "")
        .replace("rate: 2/1m", "rate: 100/10s")
    )
    text = _diff.to_text(_diff.diff(_diff.load_version(str(old)), _diff.load_version(str(new))))
    assert (
        "edge counts per changed from 'header x-api-key' to "
        "'JWT claim sub (header authorization, secret JWT_SECRET)'" in text
    )
    assert "edge tiers changed from 'off' to 'on'" in text


def test_replay_says_it_counts_a_keyed_limit_per_address() -> None:
    """Traffic records carry no header or token values: the replay says so and counts the
    limit per client IP."""
    loaded = load(policy_text("free", KEYS["header"]))
    records = [
        Record(at_us=1_764_748_800_000_000 + i, method="GET", host="api.example.com",
               path="/api/x", ip="203.0.113.7")
        for i in range(3)
    ]  # fmt: skip
    result = replay(loaded, records)
    assert any("header x-api-key" in note and "per client IP" in note for note in result.notes)
    assert result.admitted == 3


@pytest.mark.parametrize("kind", ["ip_nat", "header", "cookie"])
def test_keyed_rules_pass_the_cloudflare_sdks_request_types(kind: str) -> None:
    """On the plan from which rules count by the key, the ruleset's rules (both of a header
    or cookie key's pair) validate against the official SDK's types for the phase
    entrypoint's PUT, with the characteristics as written; characteristics of the wrong
    type do not."""
    from cloudflare.types.rulesets import phase_update_params
    from pydantic import TypeAdapter, ValidationError

    plan = RULE_FROM[kind]
    assert plan is not None
    written = rules(edgegen.build(load(policy_text(plan, KEYS[kind]))))
    assert len(written) == (1 if kind == "ip_nat" else 2)
    adapter = TypeAdapter(list[phase_update_params.Rule])
    validated = adapter.validate_python(written)
    assert [r["ratelimit"]["characteristics"] for r in validated] == [
        r["ratelimit"]["characteristics"] for r in written
    ]
    broken = [{**written[0], "ratelimit": {**written[0]["ratelimit"], "characteristics": "ip"}}]
    with pytest.raises(ValidationError):
        adapter.validate_python(broken)
