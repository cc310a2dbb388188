"""The edge compiler: golden files per plan, determinism, escaping, errors, and the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from urllib.parse import unquote

import edgegen_policy as policy
import pytest
import rules_eval
from edge_support import GOLDEN, GOLDEN_POLICY, PLANS, compare_with_golden, golden_files
from edge_support import golden_policy as load_golden

import edgegen
from edgegen import Artifacts, CompileError, Target, _placement
from edgegen._capabilities import PLANS as CAPABILITIES
from edgegen.compiler import _compile, _ids, _worker

HOSTILE = 'evil "quote" \\back ${x} %{y} `tick` </script> ünï\u2028end'
HEADER = """\
version: 1
cloudflare:
  plan: {plan}
  worker: {{ name: test-worker, routes: ["example.com/*"] }}
authenticated_when: {{ headers: [authorization], cookies: [session] }}
limits:
"""


def build_text(plan: str, limits: str) -> Artifacts:
    """Build a policy made of the standard header and these limits (YAML, indented)."""
    text = HEADER.format(plan=plan) + textwrap.indent(textwrap.dedent(limits), "  ")
    return edgegen.build(policy.loads(text))


def compile_error(plan: str, limits: str) -> CompileError:
    """The CompileError a policy raises."""
    with pytest.raises(CompileError) as info:
        build_text(plan, limits)
    return info.value


@pytest.mark.parametrize("plan", PLANS)
def test_golden_files(plan: str) -> None:
    """Every plan's build of the golden policy matches tests/golden/edge/<plan>/ exactly."""
    artifacts = edgegen.build(load_golden(plan))
    compare_with_golden(GOLDEN / plan, golden_files(artifacts))


@pytest.mark.parametrize("plan", PLANS)
def test_build_is_deterministic(plan: str, tmp_path: Path) -> None:
    """Two builds of the same policy give equal artifacts and byte-identical files."""
    first = edgegen.build(load_golden(plan))
    second = edgegen.build(load_golden(plan))
    assert first == second
    edgegen.write(first, tmp_path / "a")
    edgegen.write(second, tmp_path / "b")
    for relative in first.files():
        assert (tmp_path / "a" / relative).read_bytes() == (tmp_path / "b" / relative).read_bytes()


def test_placements_follow_the_plan() -> None:
    """The same limits land on different targets as the plan grows."""
    expected = {
        "free": {"search": "rule", "login": "worker", "api": "worker", "hooks": "worker"},
        "pro": {"search": "rule", "login": "worker", "api": "worker", "hooks": "rule"},
        "business": {"search": "rule", "login": "rule", "api": "worker", "hooks": "rule"},
        "enterprise": {"search": "rule", "login": "rule", "api": "rule", "hooks": "rule"},
    }
    for plan, targets in expected.items():
        loaded = load_golden(plan)
        artifacts = edgegen.build(loaded)
        got = {p.limit: p.target.value for p in artifacts.placements if p.limit in targets}
        assert got == targets, plan
        rules = len(artifacts.ruleset["rules"])
        # An unauthenticated-only limit is two rules on Enterprise: api here.
        assert rules == sum(
            _placement.rule_count(loaded, loaded.limit(p.limit))
            for p in artifacts.placements
            if p.target is Target.RULE
        )
        assert rules <= CAPABILITIES[policy.CloudflarePlan(plan)].max_rules.value


@pytest.mark.parametrize("plan", PLANS)
def test_ruleset_is_the_put_body(plan: str) -> None:
    """The JSON file is {"description", "rules"} and every rule has the required shape."""
    artifacts = edgegen.build(load_golden(plan))
    body = json.loads(artifacts.files()["cloudflare/http_ratelimit.json"])
    assert set(body) == {"description", "rules"}
    caps = CAPABILITIES[policy.CloudflarePlan(plan)]
    refs = [rule["ref"] for rule in body["rules"]]
    assert len(set(refs)) == len(refs)
    for rule in body["rules"]:
        assert rule["ref"].startswith("edgegen:")
        assert re.fullmatch(r"edgegen:[a-z0-9-]+-[0-9a-f]{8}(-credentialed)?", rule["ref"])
        assert rule["description"]
        assert len(rule["expression"]) <= 4096
        assert "cf.colo.id" in rule["ratelimit"]["characteristics"]
        assert rule["ratelimit"]["period"] in caps.periods.value
        timeout = rule["ratelimit"]["mitigation_timeout"]
        assert timeout == 0 or timeout in caps.mitigation_timeouts.value
        if rule["action"] != "block" and not caps.challenge_timeout.value:
            assert timeout == 0
        has_response = "action_parameters" in rule
        assert has_response == (rule["action"] == "block" and caps.custom_response.value)
        if has_response:
            response = rule["action_parameters"]["response"]
            assert response["status_code"] == 429
            assert response["content_type"] == "application/json"
            problem = json.loads(response["content"])
            assert problem["status"] == 429 and problem["title"] == "Too Many Requests"


def test_refs_are_stable_and_safe() -> None:
    """Refs come from the name alone; hostile names give safe refs; near names differ."""
    assert _ids.rule_ref("login") == _ids.rule_ref("login")
    ref = _ids.rule_ref(HOSTILE)
    assert re.fullmatch(r"edgegen:[a-z0-9-]+-[0-9a-f]{8}", ref)
    assert _ids.rule_ref("a b") != _ids.rule_ref("a-b")
    assert _ids.rule_ref("Login") != _ids.rule_ref("login")
    assert _ids.rule_ref("日本").startswith("edgegen:limit-")
    assert re.fullmatch(r"RL_[A-Z0-9_]+_[0-9A-F]{8}", _ids.binding_name(HOSTILE))
    first = _ids.namespace_id("worker", "login")
    assert first == _ids.namespace_id("worker", "login")
    assert first.isdigit() and 0 < int(first) < 2**31
    assert _ids.namespace_id("other-worker", "login") != first


@pytest.mark.parametrize("plan", ["free", "business", "enterprise"])
def test_hostile_strings_stay_escaped(plan: str) -> None:
    """Quotes, backslashes, ${}, backticks, </script> and unicode survive every file intact."""
    loaded = load_golden(plan)
    artifacts = edgegen.build(loaded)
    files = artifacts.files()
    body = json.loads(files["cloudflare/http_ratelimit.json"])
    hostile_rules = [r for r in body["rules"] if r["ref"] == _ids.rule_ref(HOSTILE)]
    matcher = loaded.limit(HOSTILE).match.matcher()
    if hostile_rules:
        rule = hostile_rules[0]
        assert rule["description"].startswith(HOSTILE + ":")
        _tree, strings = rules_eval.parse(rule["expression"])
        # Every literal is a spelling of one of the policy's paths (with %2F for a slash,
        # an exact path with one trailing slash, either with a final %0A), and every path is
        # there as itself.
        exact = {p + n for path in matcher.paths for p in (path, path + "/") for n in ("", "\n")}
        assert {unquote(s) for s in strings} == exact | set(matcher.path_prefixes)
        assert {rules_eval.cloudflare_normalize(p) for p in matcher.paths} <= set(strings)
        assert json.loads(rule["action_parameters"]["response"]["content"])["limit"] == HOSTILE
    if artifacts.worker is not None:
        source = artifacts.worker.module_source
        blob = source.split("const CONFIG = ", 1)[1].split(";\n\n", 1)[0]
        for char in "<>&\u2028\u2029":
            assert char not in blob
        assert not any(ord(c) > 0x7E for c in blob)
        data = json.loads(blob)
        names = [limit["name"] for limit in data["limits"]]
        assert (HOSTILE in names) == (not hostile_rules)
        # The policy's strings appear nowhere but in the blob.
        rest = source.replace(blob, "")
        assert "evil" not in rest and "</script>" not in rest and "/login" not in rest
        toml = tomllib.loads(artifacts.worker.wrangler_toml)
        assert [b["name"] for b in toml["ratelimits"]] == [
            b["name"] for b in artifacts.worker.bindings
        ]


def test_expressions_mean_what_the_matcher_means() -> None:
    """On Enterprise (every field), each rule's expression, on the path as Cloudflare's URL
    normalisation leaves it, agrees with the Python matcher on the raw request; requests
    with a credential go to the unauthenticated-only limit's second rule."""
    loaded = load_golden("enterprise")
    artifacts = edgegen.build(loaded)
    rules = {rule["ref"]: rule for rule in artifacts.ruleset["rules"]}
    hostile_path = sorted(loaded.limit(HOSTILE).match.matcher().paths)[0]
    requests = [
        ("POST", "/login", "example.com", {}),
        ("POST", "/login/", "example.com", {}),
        ("POST", "/l%6Fgin%2f", "example.com", {}),
        ("GET", "/login", "example.com", {}),
        ("POST", "/api/v1/sessions", "example.com", {}),
        ("POST", "//api%2Fv1/sessions", "example.com", {}),
        ("GET", "/api/x", "example.com", {}),
        ("GET", "/%61pi/x", "example.com", {}),
        ("GET", "/api%2Fx", "example.com", {}),
        ("GET", "/api/x", "example.com", {"authorization": ["Bearer t"]}),
        ("GET", "/api/x", "example.com", {"authorization": [""]}),
        ("GET", "/v2/x", "example.com", {"x-api-key": ["k"]}),
        ("GET", "/in/x", "a.hooks.example.com", {}),
        ("GET", "/in/x", "hooks.example.com", {}),
        ("GET", "/in/x", "badhooks.example.com", {}),
        ("GET", "/search", "example.com", {}),
        ("GET", "/feed/latest", "example.com", {}),
        ("HEAD", "/feed/latest/", "example.com", {}),
        ("POST", "/feed/latest", "example.com", {}),
        ("GET", hostile_path, "example.com", {}),
        # %2F for the policy's first three slashes after the leading one (the rule lists
        # those spellings; the later slashes are left to the Worker and the app).
        ("GET", "/" + "%2F".join(hostile_path[1:].split("/", 3)), "example.com", {}),
        ("GET", "/p'q%22/%25%7By%7D/z", "example.com", {}),
        ("GET", "/p'q%22%2f%25%7by%7d%2Fz", "example.com", {}),
    ]
    when = loaded.authenticated_when
    for limit in loaded.limits:
        assert limit.edge is not None
        matcher = limit.match.matcher()
        own = rules_eval.parse(rules[_ids.rule_ref(limit.name)]["expression"])[0]
        second = rules.get(_compile.credentialed_rule_ref(limit.name))
        for method, target, host, headers in requests:
            authenticated = any(any(v for v in headers.get(h, [])) for h in when.headers)
            matches = matcher.matches_raw(method, target, host)
            apart = limit.edge.unauthenticated_only and authenticated
            request = rules_eval.Request(
                rules_eval.cloudflare_normalize(target), method, host, headers
            )
            assert rules_eval.evaluate(own, request) is (matches and not apart), (
                limit.name,
                target,
                headers,
            )
            if second is not None:
                tree = rules_eval.parse(second["expression"])[0]
                assert rules_eval.evaluate(tree, request) is (matches and apart)
    assert _compile.credentialed_rule_ref("api") in rules


def test_write_replaces_and_removes_only_its_files(tmp_path: Path) -> None:
    """write() leaves other files alone and removes the Worker once no limit needs it."""
    (tmp_path / "worker").mkdir()
    (tmp_path / "keep.txt").write_text("mine")
    with_worker = edgegen.build(load_golden("business"))
    written = edgegen.write(with_worker, tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in written) == sorted(with_worker.files())
    assert (tmp_path / "worker" / "worker.js").is_file()
    without = edgegen.build(load_golden("enterprise"))
    edgegen.write(without, tmp_path)
    assert not (tmp_path / "worker" / "worker.js").exists()
    assert not (tmp_path / "worker" / "wrangler.toml").exists()
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert not list(tmp_path.rglob("*.tmp"))


def test_period_not_offered_anywhere_names_the_fix() -> None:
    """A 2m period on Pro (it offers up to 1m): the message names the limit, what is lacking
    and what works."""
    error = compile_error(
        "pro",
        """\
        - name: x
          match: { paths: [/x] }
          edge: { rate: 120/2m, unauthenticated_only: false }
        """,
    )
    message = str(error)
    assert message.startswith("limit 'x': period 2m is not available on the pro plan")
    assert "the Worker binding only offers periods of 10s or 1m" in message
    assert "use 60/1m" in message
    assert error.limit == "x"
    assert error.problems[0].code == "L201"


@pytest.mark.parametrize(
    ("plan", "limits", "fragments"),
    [
        (
            "business",
            """\
            - name: slow
              edge: { rate: 100/1h, unauthenticated_only: false }
            """,
            ["period 1h is not available on the business plan", "use 2/1m", "rule, use 17/10m"],
        ),
        (
            "pro",
            """\
            - name: human
              match: { paths: [/x], methods: [POST] }
              edge: { rate: 5/1m, action: managed_challenge, unauthenticated_only: false }
            """,
            ["the request method", "can only answer 429", "use action: block", "Business"],
        ),
        (
            "business",
            """\
            - name: forced
              match: { path_prefix: /api/ }
              edge: { rate: 5/1m, target: rule }
            """,
            ['"unauthenticated only" needs', "Enterprise", "unauthenticated_only: false"],
        ),
        (
            "pro",
            """\
            - name: pinned
              edge: { rate: 5/1m, action: js_challenge, target: worker,
                      unauthenticated_only: false }
            """,
            ["can only answer 429 (block), not js_challenge", "remove target: worker"],
        ),
        (
            "free",
            """\
            - name: wait
              match: { paths: [/x] }
              edge: { rate: 5/10s, action: managed_challenge, timeout: 1m,
                      unauthenticated_only: false }
            """,
            ["cannot have a timeout on the free plan", "remove timeout"],
        ),
        (
            "business",
            """\
            - name: audit
              edge: { rate: 5/2m, action: log, unauthenticated_only: false }
            """,
            ["log action is not available", "Enterprise"],
        ),
    ],
)
def test_impossible_limits_fail_with_the_nearest_fix(
    plan: str, limits: str, fragments: list[str]
) -> None:
    """Each impossible limit fails with a sentence naming the limit, the lack and a fix."""
    error = compile_error(plan, limits)
    message = str(error)
    assert message.startswith("limit '")
    for fragment in fragments:
        assert fragment in message, message


def test_forced_targets_are_honoured() -> None:
    """target: worker keeps a rule-able limit in the Worker; target: rule takes a slot first."""
    artifacts = build_text(
        "pro",
        """\
        - name: a
          match: { paths: [/a] }
          edge: { rate: 5/10s, unauthenticated_only: false }
        - name: b
          match: { paths: [/b] }
          edge: { rate: 5/10s, unauthenticated_only: false, target: worker }
        - name: c
          match: { paths: [/c] }
          edge: { rate: 5/10s, unauthenticated_only: false }
        - name: d
          match: { paths: [/d] }
          edge: { rate: 5/10s, unauthenticated_only: false, target: rule }
        """,
    )
    targets = {p.limit: p.target.value for p in artifacts.placements}
    assert targets == {"a": "rule", "b": "worker", "c": "worker", "d": "rule"}
    assert [r["ref"] for r in artifacts.ruleset["rules"]] == [
        _ids.rule_ref("a"),
        _ids.rule_ref("d"),
    ]
    c = next(p for p in artifacts.placements if p.limit == "c")
    assert any("other limits already use them" in reason for reason in c.reasons)


def test_rule_quota_prefers_limits_only_a_rule_can_carry() -> None:
    """On Free (one rule), a challenge gets the slot even when listed after a block."""
    artifacts = build_text(
        "free",
        """\
        - name: first
          match: { paths: [/a] }
          edge: { rate: 5/10s, unauthenticated_only: false }
        - name: challenge
          match: { paths: [/b] }
          edge: { rate: 5/10s, action: managed_challenge, unauthenticated_only: false }
        """,
    )
    targets = {p.limit: p.target.value for p in artifacts.placements}
    assert targets == {"first": "worker", "challenge": "rule"}


def test_mitigation_timeouts() -> None:
    """block: timeout or the period; challenges below Enterprise: 0; Enterprise: as given."""
    limits = """\
    - name: blocked
      match: { paths: [/a] }
      edge: { rate: 5/1m, timeout: 1h, unauthenticated_only: false }
    - name: plain
      match: { paths: [/b] }
      edge: { rate: 5/1m, unauthenticated_only: false }
    - name: human
      match: { paths: [/c] }
      edge: { rate: 5/1m, action: managed_challenge, unauthenticated_only: false }
    """
    for plan in ("business", "enterprise"):
        rules = build_text(plan, limits).ruleset["rules"]
        got = {r["ref"]: r["ratelimit"]["mitigation_timeout"] for r in rules}
        assert got == {
            _ids.rule_ref("blocked"): 3600,
            _ids.rule_ref("plain"): 60,
            _ids.rule_ref("human"): 0,
        }
    timed = limits.replace("action: managed_challenge,", "action: managed_challenge, timeout: 1h,")
    rules = build_text("enterprise", timed).ruleset["rules"]
    assert rules[2]["ratelimit"]["mitigation_timeout"] == 3600


def test_free_plan_has_no_custom_response() -> None:
    """Free cannot send a custom body: block rules there have no action_parameters."""
    rules = build_text(
        "free",
        """\
        - name: a
          match: { paths: [/a] }
          edge: { rate: 5/10s, unauthenticated_only: false }
        """,
    ).ruleset["rules"]
    assert "action_parameters" not in rules[0]
    assert rules[0]["ratelimit"]["mitigation_timeout"] == 10


def test_overlong_expression_is_refused() -> None:
    """An expression over 4,096 characters fails the build and names the limit."""
    paths = ", ".join(f"/{'p' * 200}/{i}" for i in range(25))
    error = compile_error(
        "enterprise",
        f"""\
        - name: many
          match: {{ paths: [{paths}] }}
          edge: {{ rate: 5/10s, unauthenticated_only: false }}
        """,
    )
    assert "limit 'many'" in str(error) and "4,096" in str(error)
    assert error.problems[0].code == "E301"


def test_spellings_left_out_to_fit_are_explained() -> None:
    """Deep paths whose %2F spellings would pass 4,096 characters: the build keeps the plain
    spellings, and --explain says what the rule no longer matches."""
    paths = ", ".join(f"/{'s' * 12}/{i}/x/y" for i in range(7))
    artifacts = build_text(
        "enterprise",
        f"""\
        - name: deep
          match: {{ paths: [{paths}] }}
          edge: {{ rate: 5/10s, unauthenticated_only: false }}
        """,
    )
    [rule] = artifacts.ruleset["rules"]
    assert len(rule["expression"]) <= 4096 and f'"/{"s" * 12}/6/x/y"' in rule["expression"]
    [placement] = artifacts.placements
    [note] = [r for r in placement.reasons if "leaves out" in r]
    assert "%2F in place of the third and later slashes of a path" in note
    assert "4,096" in note


def test_worker_needed_without_worker_section() -> None:
    """Limits that need the Worker fail when the policy names no Worker."""
    text = """\
version: 1
cloudflare: { plan: free }
limits:
  - name: a
    match: { methods: [POST] }
    edge: { rate: 5/10s, unauthenticated_only: false }
"""
    with pytest.raises(CompileError, match=r"no cloudflare.worker; add cloudflare.worker"):
        edgegen.build(policy.loads(text))
    codes = [d.code for d in _placement.check(policy.loads(text)).errors]
    assert "L204" in codes


def test_no_edge_limits_builds_an_empty_ruleset() -> None:
    """A policy with only app limits gives an empty ruleset and no Worker."""
    text = "version: 1\nlimits:\n  - name: a\n    app: { tiers: { default: 5/1m } }\n"
    artifacts = edgegen.build(policy.loads(text))
    assert artifacts.ruleset["rules"] == [] and artifacts.worker is None
    assert artifacts.placements == ()


def test_problem_and_policy_header() -> None:
    """The 429 body is RFC 9457; RateLimit-Policy keys a name as policy.header_key does."""
    loaded = load_golden("free")
    login = loaded.limit("login")
    assert _worker.problem(login, 10)["limit"] == "login"
    assert _worker.policy_header(login, 10) == '"login";q=5;w=10'
    hostile = _worker.policy_header(loaded.limit(HOSTILE), 10)
    assert hostile.isascii() and hostile.startswith('"evil \\"quote\\" \\\\back ${x} %25{y}')


def test_script_json_is_inert_in_javascript() -> None:
    """The blob escapes <, >, &, U+2028/9 and non-ASCII, and still parses as the same JSON."""
    value = {"s": "</script><!-- & \u2028\u2029 é \ud800 `${x}`"}
    text = _worker.script_json(value)
    assert not set("<>&\u2028\u2029é") & set(text)
    assert json.loads(text) == value


def test_cli_build_explain(tmp_path: Path) -> None:
    """edgegen build --explain writes the files and prints each limit's target and reasons."""
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgegen.cli",
            "build",
            str(GOLDEN_POLICY),
            "--out",
            str(out),
            "--explain",
        ],
        capture_output=True,
        text=True,
        env={"PLAN": "pro", "PATH": ""},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "built 2 rules for the pro plan, 4 limits in the Worker golden-edge-limits" in result.stdout
    )
    assert "  login -> worker" in result.stdout
    assert "the request method" in result.stdout
    assert (out / "cloudflare" / "http_ratelimit.json").is_file()
    assert (out / "worker" / "worker.js").is_file()


def test_cli_build_json_and_errors(tmp_path: Path) -> None:
    """--format json reports placements; an impossible limit exits 1 with the lint error."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgegen.cli",
            "build",
            str(GOLDEN_POLICY),
            "--out",
            str(tmp_path),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        env={"PLAN": "business", "PATH": ""},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["built"] is True
    assert {p["limit"]: p["target"] for p in report["placements"]}["api"] == "worker"
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\ncloudflare: { plan: pro }\nlimits:\n  - name: x\n"
        "    edge: { rate: 120/2m, unauthenticated_only: false }\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "edgegen.cli", "build", str(bad), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "limit 'x': period 2m is not available on the pro plan" in result.stderr
    assert "[error L201]" in result.stderr
    assert not (tmp_path / "o").exists()


def test_public_surface() -> None:
    """build, write, the artifact types and the errors are exported from edgegen."""
    expected = {
        "Artifacts",
        "BuildProblem",
        "CompileError",
        "EdgegenError",
        "Placement",
        "Target",
        "UsageError",
        "WorkerArtifact",
        "build",
        "write",
    }
    assert expected <= set(edgegen.__all__)
    for name in expected:
        assert getattr(edgegen, name) is not None


def test_cli_build_unwritable_out(tmp_path: Path) -> None:
    """--out naming a file is a usage error with one clear line, not a traceback."""
    target = tmp_path / "a-file"
    target.write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "edgegen.cli", "build", str(GOLDEN_POLICY), "--out", str(target)],
        capture_output=True,
        text=True,
        env={"PLAN": "pro", "PATH": ""},
        check=False,
    )
    assert result.returncode == 2
    assert "cannot write the artifacts under" in result.stderr
    assert "Traceback" not in result.stderr


# --- the validity gate -------------------------------------------------------------------

GATED = """\
version: 1
cloudflare: { plan: enterprise, worker: { name: w, routes: ["example.com/*"] } }
authenticated_when: { headers: [authorization] }
clients: { ipv6_prefix: 128 }
tiers: [free]
limits:
  - name: a
    match: { paths: [/a] }
    edge: { rate: 6/10s, credentialed_rate: 5/1m }
  - name: a
    match: { paths: [/b] }
    app: { tiers: { free: 1/1s, gold: 2/1s } }
"""


def test_build_refuses_what_stops_the_edge_and_only_that() -> None:
    """edgegen.build raises for the errors the gate says stop the edge; an invalid policy
    whose errors only stop the app (L001 between an edge and an app limit, L002) or stop
    nothing (L109) still builds, while the CLI refuses every error."""
    loaded = policy.loads(GATED)
    checked = _placement.check(loaded)
    assert [d.code for d in checked.errors] == ["L109", "L001", "L002"]
    assert checked.stopping(policy.Layer.EDGE) == ()
    rules = edgegen.build(loaded).ruleset["rules"]
    assert [r["ref"].split("-")[0] for r in rules] == ["edgegen:a", "edgegen:a"]
    both_edge = policy.loads(
        GATED.replace("app: { tiers: { free: 1/1s, gold: 2/1s } }", "edge: { rate: 5/1m }")
    )
    with pytest.raises(CompileError) as info:
        edgegen.build(both_edge)
    [problem] = info.value.problems
    assert (problem.code, problem.limit, problem.lacks) == ("L001", "a", "a unique name")
    assert problem.fix == "rename one of the limits"
    assert str(info.value) == _placement.check(both_edge).stopping(policy.Layer.EDGE)[0].message


def test_placement_errors_keep_what_the_plan_lacks() -> None:
    """A limit nothing can carry: the BuildProblem has the placement's lacks and fix."""
    error = compile_error(
        "pro",
        """\
        - name: x
          match: { paths: [/x] }
          edge: { rate: 120/2m, unauthenticated_only: false }
        """,
    )
    [problem] = error.problems
    assert problem.lacks.startswith("period 2m is not available on the pro plan")
    assert problem.fix == "use 60/1m"


def test_prepare_and_load_and_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's one load -> check -> print -> build sequence: outcomes as values, or
    printed and raised for plan and apply."""
    from edgegen import _pipeline
    from edgegen.errors import EdgegenError

    bad = tmp_path / "bad.yaml"
    bad.write_text(GATED)
    prepared = _pipeline.prepare(str(bad))
    assert not prepared.checked.ok and prepared.artifacts is None and prepared.error is None
    assert capsys.readouterr().err == ""
    with pytest.raises(EdgegenError, match="has 3 error"):
        _pipeline.load_and_build(str(bad))
    assert "[error L109]" in capsys.readouterr().err
    good = tmp_path / "good.yaml"
    edge_only = GATED.split("  - name: a\n    match: { paths: [/b] }", 1)[0]
    good.write_text(edge_only.replace("credentialed_rate: 5/1m", "credentialed_rate: 60/10s"))
    loaded, artifacts = _pipeline.load_and_build(str(good))
    assert loaded.limits[0].name == "a" and len(artifacts.ruleset["rules"]) == 2
    assert _pipeline.prepare(str(good)).artifacts == artifacts
