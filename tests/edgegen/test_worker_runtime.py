"""The generated Worker in the real workerd runtime (through Miniflare), and wrangler --dry-run.

Uses the pinned tooling in workers/ (workers/harness/run.mjs and dryrun.mjs, see
workers/README.md). Without workers/node_modules these tests fail with the install command;
they never skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest
import rules_eval
from edge_support import HARNESS, PLANS, WORKERS, golden_policy, require_node_modules, run_node
from edgegen_policy import (
    credentialed_rate,
    ip_bucket,
    normalize_host,
    normalize_path,
    request_paths,
)
from edgegen_policy._match import canonical_path, decode_path

import edgegen
from edgegen.compiler import _worker

pytestmark = pytest.mark.workerd

IP_A = "203.0.113.7"
IP_B = "2001:db8::1"
HOSTILE = 'evil "quote" \\back ${x} %{y} `tick` </script> ünï\u2028end'
RUNTIME_POLICY = """\
version: 1
cloudflare:
  plan: free
  worker: { name: runtime-test, routes: ["api.example.com/*"] }
authenticated_when: { headers: [authorization, x-api-key], cookies: [session] }
limits:
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: 3/1m }
  - name: login
    match: { paths: [/login], methods: [POST] }
    edge: { rate: 2/1m, unauthenticated_only: false }
"""


def build_worker(tmp_path: Path, text: str = RUNTIME_POLICY) -> edgegen.WorkerArtifact:
    """Build a policy and write its Worker files under tmp_path."""
    artifacts = edgegen.build(policy.loads(text))
    assert artifacts.worker is not None
    edgegen.write(artifacts, tmp_path)
    return artifacts.worker


def ratelimits(worker: edgegen.WorkerArtifact) -> dict[str, Any]:
    """The job's bindings, exactly as the Worker declares them."""
    return {
        b["name"]: {"namespace_id": b["namespace_id"], "simple": b["simple"]}
        for b in worker.bindings
    }


def run(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one job; once more if the rate-limit window turned over during it."""
    for _attempt in range(2):
        result = run_node(HARNESS / "run.mjs", job)
        if not result["windowCrossed"]:
            break
    assert not result["windowCrossed"], "the rate-limit window turned over twice"
    responses: list[dict[str, Any]] = result["responses"]
    for response in responses:
        assert "exception" not in response, response["exception"]
    return responses


def request(
    path: str, ip: str | None = IP_A, method: str = "GET", **headers: str
) -> dict[str, Any]:
    """A request to api.example.com, from an IP (None: no CF-Connecting-IP)."""
    sent = {k.replace("_", "-"): v for k, v in headers.items()}
    if ip is not None:
        sent["cf-connecting-ip"] = ip
    return {"url": f"https://api.example.com{path}", "method": method, "headers": sent}


def job_for(tmp_path: Path, worker: edgegen.WorkerArtifact, requests: list[Any]) -> dict[str, Any]:
    """A run.mjs job for the Worker written under tmp_path."""
    return {
        "script": str(tmp_path / "worker" / worker.main_module),
        "compatibilityDate": worker.compatibility_date,
        "ratelimits": ratelimits(worker),
        "requests": requests,
    }


def assert_reached_origin(response: dict[str, Any], sent: dict[str, Any]) -> None:
    """The origin got the request exactly as the client sent it."""
    assert response["status"] == 200
    assert response["headers"].get("x-origin") == "1"
    echo = json.loads(response["body"])
    assert echo["method"] == sent["method"]
    assert echo["url"] == sent["url"]
    expected = {k.lower(): v for k, v in sent["headers"].items()}
    expected.setdefault("host", "api.example.com")
    assert echo["headers"] == expected
    assert echo["body"] == sent.get("body")


def assert_too_many(response: dict[str, Any], name: str, limit: int, period: int) -> None:
    """A 429 with Retry-After, RateLimit-Policy and an RFC 9457 problem body."""
    assert response["status"] == 429
    headers = response["headers"]
    assert headers["content-type"] == "application/problem+json"
    assert headers["retry-after"] == str(period)
    assert headers["ratelimit-policy"].endswith(f";q={limit};w={period}")
    assert "x-origin" not in headers
    body = json.loads(response["body"])
    # The members and the problem type of the app's refusal (applimit's Gate).
    assert set(body) == {
        "type",
        "title",
        "status",
        "detail",
        "limit",
        "violated-policies",
        "retry-after",
    }
    assert body["type"] == policy.QUOTA_EXCEEDED
    assert body["status"] == 429 and body["title"] == "Too Many Requests"
    assert body["limit"] == name
    assert body["violated-policies"] == [name]
    assert body["retry-after"] == period


def test_over_limit_unauthenticated_requests_get_429(tmp_path: Path) -> None:
    """The fourth anonymous request in a minute is refused with the problem response."""
    worker = build_worker(tmp_path)
    sent = [request(f"/api/items/{i}") for i in range(5)]
    responses = run(job_for(tmp_path, worker, sent))
    for response, original in zip(responses[:3], sent[:3], strict=True):
        assert_reached_origin(response, original)
    for response in responses[3:]:
        assert_too_many(response, "api", 3, 60)
        assert response["headers"]["ratelimit-policy"] == '"api";q=3;w=60'


def test_authenticated_requests_reach_the_origin_unchanged(tmp_path: Path) -> None:
    """Requests with a credential skip unauthenticated-only limits and arrive untouched."""
    worker = build_worker(tmp_path)
    sent = [
        *(request("/api/x", Authorization=f"Bearer t{i}") for i in range(4)),
        *(request("/api/x", x_api_key="k") for _ in range(2)),
        *(request("/api/x", Cookie="theme=dark; session=abc") for _ in range(2)),
        {**request("/api/upload", method="POST", Authorization="t"), "body": "payload ünï"},
    ]
    responses = run(job_for(tmp_path, worker, sent))
    for response, original in zip(responses, sent, strict=True):
        assert_reached_origin(response, original)


def test_empty_credentials_do_not_authenticate(tmp_path: Path) -> None:
    """An empty Authorization header or a cookie named differently still counts."""
    worker = build_worker(tmp_path)
    sent = [
        request("/api/a", Authorization=""),
        request("/api/a", Cookie="sessionid=1"),
        request("/api/a", Cookie="session"),
        request("/api/a"),
    ]
    responses = run(job_for(tmp_path, worker, sent))
    assert [r["status"] for r in responses] == [200, 200, 200, 429]


def test_non_matching_requests_reach_the_origin_unchanged(tmp_path: Path) -> None:
    """Paths and methods no limit matches are never counted and never altered."""
    worker = build_worker(tmp_path)
    sent = [
        *(request("/other?q=1", Accept="text/html") for _ in range(5)),
        *(request("/login", method="GET") for _ in range(4)),
        *(request("/apix") for _ in range(4)),
        {**request("/upload", method="PUT", Content_Type="text/plain"), "body": "x" * 1000},
    ]
    responses = run(job_for(tmp_path, worker, sent))
    for response, original in zip(responses, sent, strict=True):
        assert_reached_origin(response, original)


def test_different_ips_are_counted_apart(tmp_path: Path) -> None:
    """Exhausting the limit from one IP leaves another IP's count untouched."""
    worker = build_worker(tmp_path)
    sent = [
        request("/login", ip=IP_A, method="POST"),
        request("/login", ip=IP_A, method="POST"),
        request("/login", ip=IP_A, method="POST"),
        request("/login", ip=IP_B, method="POST"),
        request("/login", ip=IP_B, method="POST"),
        request("/login", ip=IP_B, method="POST"),
    ]
    responses = run(job_for(tmp_path, worker, sent))
    statuses = [r["status"] for r in responses]
    assert statuses == [200, 200, 429, 200, 200, 429]
    assert_too_many(responses[2], "login", 2, 60)


def test_odd_input_never_throws(tmp_path: Path) -> None:
    """No IP header, huge paths, bad escapes, odd cookies and long IPs all get an answer."""
    worker = build_worker(tmp_path)
    sent = [
        *(request("/api/no-ip", ip=None) for _ in range(5)),
        # Long enough to be odd, short enough for the local HTTP server (it answers 431
        # above ~16 KB of request line and headers, and Miniflare sends the URL twice).
        request("/api/" + "a" * 7_000),
        request("/api/%FF%FE/%C3%28/%"),
        request("/api/x", Cookie=";;;=;==;session"),
        request("/api/x", ip="x" * 5_000),
        request("/api/x", ip="  "),
        request("/api/\u00ff/\u2028/\ud83d\ude00"),
        request("/api/x", Authorization="\u00ff\u00fe"),
    ]
    responses = run(job_for(tmp_path, worker, sent))
    # Without CF-Connecting-IP nothing is counted: all five pass.
    assert [r["status"] for r in responses[:5]] == [200] * 5
    assert all(r["status"] in (200, 429) for r in responses)


# Every C0 control character and DEL, escaped in either case of hex.
CONTROL_ESCAPES = tuple(
    text
    for code in (*range(0x20), 0x7F)
    for text in dict.fromkeys((f"%{code:02X}", f"%{code:02x}"))
)


def control_spellings(path: str, escape: str) -> list[str]:
    """``path`` with one escaped control character at every position a router could read
    specially: first, last, around each slash, inside a segment, after a trailing slash and
    before a query."""
    slashes = (i for i, c in enumerate(path) if c == "/" and i > 0)
    spots = sorted({1, len(path), len(path) // 2, *slashes})
    out = [path[:at] + escape + path[at:] for at in spots]
    out += [path + "/" + escape, path + escape + "?x=1", path + escape + "/"]
    return list(dict.fromkeys(out))


def test_control_characters_are_refused_before_anything(tmp_path: Path) -> None:
    """A path whose decoded form holds a control character (every C0 byte and DEL, escaped
    in upper and lower hex, at every position of a limited exact path and a prefix) gets a
    400 problem answer and never reaches the origin, as the app's middlewares answer; an
    unlimited path too. Neighbours of the class (space, NEL, LINE SEPARATOR, "%250A")
    still pass to the origin."""
    worker = build_worker(tmp_path)
    paths = ("/login", "/api/items", "/static/app.js")
    bad = [
        spelled
        for escape in CONTROL_ESCAPES
        for path in paths
        for spelled in control_spellings(path, escape)
    ]
    fine = ["/login%20", "/login%C2%85", "/login%E2%80%A8", "/login%250A", "/api/%25%30%41"]
    sent = [request(p, method="POST") for p in bad] + [request(p) for p in fine]
    responses = run(job_for(tmp_path, worker, sent))
    refused = responses[: len(bad)]
    wrong = [(p, r["status"]) for p, r in zip(bad, refused, strict=True) if r["status"] != 400]
    assert not wrong, wrong[:10]
    for response in refused:
        assert "x-origin" not in response["headers"]
        assert response["headers"]["content-type"] == "application/problem+json"
        body = json.loads(response["body"])
        assert body["status"] == 400 and "control character U+00" in body["detail"]
    for sent_request, response in zip(sent[len(bad) :], responses[len(bad) :], strict=True):
        assert_reached_origin(response, sent_request)


def test_a_missing_binding_fails_open(tmp_path: Path) -> None:
    """If the binding is not there the Worker lets requests through instead of failing."""
    worker = build_worker(tmp_path)
    job = job_for(tmp_path, worker, [request("/api/x") for _ in range(5)])
    job["ratelimits"] = {}
    responses = run(job)
    assert [r["status"] for r in responses] == [200] * 5


@pytest.mark.parametrize("plan", ["free", "pro"])
def test_golden_workers_run(plan: str, tmp_path: Path) -> None:
    """The golden policy's Worker (hostile names included) loads and limits in workerd."""
    artifacts = edgegen.build(golden_policy(plan))
    assert artifacts.worker is not None
    edgegen.write(artifacts, tmp_path)
    hostile = golden_policy(plan).limit(HOSTILE).match.matcher()
    path = sorted(hostile.paths)[0]
    sent = [request(path) for _ in range(11)]
    responses = run(job_for(tmp_path, artifacts.worker, sent))
    assert [r["status"] for r in responses] == [200] * 10 + [429]
    assert json.loads(responses[-1]["body"])["limit"] == HOSTILE
    key = responses[-1]["headers"]["ratelimit-policy"].rsplit(";q=", 1)[0]
    assert key == policy.header_key(HOSTILE)


def _dry_run(directory: Path) -> subprocess.CompletedProcess[str]:
    """`wrangler deploy --dry-run` in a directory, through workers/harness/dryrun.mjs."""
    require_node_modules()
    return subprocess.run(
        ["node", str(HARNESS / "dryrun.mjs"), str(directory)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=WORKERS,
        check=False,
    )


def test_wrangler_dry_run_accepts_every_generated_worker(tmp_path: Path) -> None:
    """`wrangler deploy --dry-run` accepts the Worker of every plan and of the example."""
    workers: list[tuple[str, edgegen.WorkerArtifact]] = []
    for plan in PLANS:
        artifacts = edgegen.build(golden_policy(plan))
        if artifacts.worker is not None:
            edgegen.write(artifacts, tmp_path / plan)
            workers.append((plan, artifacts.worker))
    example = edgegen.build(
        policy.load(Path(__file__).resolve().parents[2] / "examples" / "policy.yaml", env={})
    )
    assert example.worker is not None
    edgegen.write(example, tmp_path / "example")
    workers.append(("example", example.worker))
    assert len(workers) >= 3
    for name, worker in workers:
        result = _dry_run(tmp_path / name / "worker")
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{name}: wrangler refused the Worker:\n{output}"
        for binding in worker.bindings:
            assert f"env.{binding['name']}" in output, (name, output)
        assert not (tmp_path / name / "worker" / ".wrangler").exists()


def test_wrangler_dry_run_refuses_a_bad_period(tmp_path: Path) -> None:
    """The dry run really checks: the same Worker with a 30 s period is refused."""
    worker = build_worker(tmp_path)
    toml = (tmp_path / "worker" / "wrangler.toml").read_text()
    (tmp_path / "worker" / "wrangler.toml").write_text(toml.replace("period = 60", "period = 30"))
    result = _dry_run(tmp_path / "worker")
    assert result.returncode != 0
    assert "10 or 60" in result.stdout + result.stderr
    assert worker.bindings


# --- the JavaScript matcher against the Python one ---------------------------------------

CORPUS_POLICY = """\
version: 1
cloudflare: { plan: enterprise }
authenticated_when: { headers: [authorization, x-api-key], cookies: [session, sid] }
limits:
  - name: login
    match: { paths: [/login, /api/v1/sessions], methods: [POST] }
    edge: { rate: 5/1m, unauthenticated_only: false }
  - name: api
    match: { path_prefix: [/api/, /v2/] }
    edge: { rate: 5/1m }
  - name: hooks
    match: { hosts: ["*.hooks.example.com", hooks.example.com], path_prefix: /in/ }
    edge: { rate: 5/1m, unauthenticated_only: false }
  - name: exact-host
    match: { hosts: [api.example.com], methods: [GET, PATCH] }
    edge: { rate: 5/1m }
  - name: unicode
    match: { paths: ["/café", "/a b", "/x|y"], path_prefix: ["/ünï/"] }
    edge: { rate: 5/1m, unauthenticated_only: false }
  - name: everything
    edge: { rate: 5/1m }
"""

# (method, host, target, headers): the target is appended to https://host.
CORPUS: list[tuple[str, str, str, dict[str, str]]] = [
    ("POST", "example.com", "/login", {}),
    ("GET", "example.com", "/login", {}),
    ("post", "example.com", "/login", {}),
    ("POST", "example.com", "/login/", {}),
    ("POST", "example.com", "/Login", {}),
    ("POST", "example.com", "/login?next=/x", {}),
    ("POST", "example.com", "/login#frag", {}),
    ("POST", "example.com", "/api/v1/sessions", {}),
    ("POST", "example.com", "/a/../login", {}),
    ("POST", "example.com", "/a/%2e%2e/login", {}),
    ("POST", "example.com", "/./login", {}),
    ("POST", "example.com", "//login", {}),
    ("POST", "example.com", "/%6Cogin", {}),
    ("POST", "example.com", "/log\tin", {}),
    ("POST", "example.com", "/login\n", {}),
    ("GET", "example.com", "/api/x", {}),
    ("GET", "example.com", "/api", {}),
    ("GET", "example.com", "/api/", {}),
    ("GET", "example.com", "/apix", {}),
    ("GET", "example.com", "/v2/y", {}),
    ("GET", "example.com", "/api/x", {"authorization": "Bearer t"}),
    ("GET", "example.com", "/api/x", {"authorization": ""}),
    ("GET", "example.com", "/api/x", {"x-api-key": "k"}),
    ("GET", "example.com", "/api/x", {"cookie": "session=1"}),
    ("GET", "example.com", "/api/x", {"cookie": "session="}),
    ("GET", "example.com", "/api/x", {"cookie": "a=1; sid=2"}),
    ("GET", "example.com", "/api/x", {"cookie": "sessionid=1"}),
    ("GET", "example.com", "/api/x", {"cookie": "Session=1"}),
    ("GET", "example.com", "/api/x", {"cookie": "session"}),
    ("GET", "example.com", "/api/x", {"cookie": " session =1"}),
    ("GET", "example.com", "/api\\x", {}),
    ("GET", "example.com", "\\api\\x", {}),
    ("GET", "example.com", "/api/%2e%2e/x", {}),
    ("GET", "example.com", "/api/../api/x", {}),
    ("GET", "example.com", "/api/./x", {}),
    ("GET", "example.com", "/api/" + "a" * 5000, {}),
    ("GET", "a.hooks.example.com", "/in/1", {}),
    ("GET", "A.B.HOOKS.EXAMPLE.COM", "/in/1", {}),
    ("GET", "hooks.example.com", "/in/1", {}),
    ("GET", "hooks.example.com:8443", "/in/1", {}),
    ("GET", "hooks.example.com.", "/in/1", {}),
    ("GET", "badhooks.example.com", "/in/1", {}),
    ("GET", "hooks.example.com", "/out/1", {}),
    ("GET", "xn--bcher-kva.hooks.example.com", "/in/1", {}),
    ("GET", "api.example.com", "/anything", {}),
    ("HEAD", "api.example.com", "/anything", {}),
    ("PATCH", "api.example.com", "/anything", {}),
    ("PUT", "api.example.com", "/anything", {}),
    ("DELETE", "api.example.com", "/anything", {}),
    ("GET", "API.EXAMPLE.COM:443", "/anything", {}),
    ("GET", "api.example.com.", "/anything", {}),
    ("GET", "[::1]:8080", "/anything", {}),
    ("GET", "127.0.0.1", "/api/x", {}),
    ("GET", "example.com", "/café", {}),
    ("GET", "example.com", "/caf%C3%A9", {}),
    ("GET", "example.com", "/caf%c3%a9", {}),
    ("GET", "example.com", "/a b", {}),
    ("GET", "example.com", "/a%20b", {}),
    ("GET", "example.com", "/x|y", {}),
    ("GET", "example.com", "/x%7Cy", {}),
    ("GET", "example.com", "/x%7cy/", {}),
    ("GET", "example.com", "/x/y", {}),
    ("GET", "example.com", "/ünï/z", {}),
    ("GET", "example.com", "/%C3%BCn%C3%AF/z", {}),
    ("GET", "example.com", "/\ud800", {}),
    ("GET", "example.com", "/\u2028/\U0001f600", {}),
    ("GET", "example.com", "/`{}|^[]<>\"'", {}),
    ("GET", "example.com", "/%", {}),
    ("GET", "example.com", "/a%zz", {}),
    ("GET", "example.com", "/trailing ", {}),
    ("GET", "example.com", "", {}),
    ("GET", "example.com", "?only=query", {}),
    ("OPTIONS", "example.com", "/api/x", {}),
    # Spellings the app routes to a limited path: escapes, //, %2F, a trailing slash.
    ("GET", "example.com", "/%61pi/x", {}),
    ("GET", "example.com", "//api//x", {}),
    ("GET", "example.com", "/api%2Fx", {}),
    ("GET", "example.com", "/api%2fx", {}),
    ("GET", "example.com", "/v2%2F", {}),
    ("POST", "example.com", "/%6C%6Fgin", {}),
    ("POST", "example.com", "/login%2F", {}),
    ("POST", "example.com", "/api%2Fv1%2Fsessions/", {}),
    ("POST", "example.com", "/api/v1/sessions//", {}),
    ("POST", "example.com", "/LOGIN", {}),
    ("GET", "example.com", "/caf%C3%A9/", {}),
    ("GET", "example.com", "/%C3%BCn%C3%AF%2Fz", {}),
    ("HEAD", "api.example.com", "/%61nything", {}),
]


def python_applicable(
    loaded: policy.Policy, method: str, host: str, path: str, headers: dict[str, str]
) -> list[str]:
    """The counters the policy's Python matcher applies to a request path, in every form
    `request_paths` gives, with the documented credential rule: a request carrying a credential
    counts against an unauthenticated-only limit's second counter (``name+credential``)."""
    when = loaded.authenticated_when
    authenticated = any(headers.get(name) for name in when.headers)
    cookie = headers.get("cookie", "")
    sent = {pair.split("=", 1)[0].strip() for pair in cookie.split(";") if "=" in pair}
    authenticated = authenticated or any(name in sent for name in when.cookies)
    forms = request_paths(path)
    names = []
    for limit in loaded.limits:
        assert limit.edge is not None
        if not limit.match.matcher().matches_any(method, forms, host):
            continue
        if limit.edge.unauthenticated_only and authenticated:
            if credentialed_rate(loaded, limit) is not None:
                names.append(f"{limit.name}+credential")
            continue
        names.append(limit.name)
    return names


def rule_applicable(
    artifacts: edgegen.Artifacts, method: str, host: str, target: str, headers: dict[str, str]
) -> list[str]:
    """The counters whose generated rule expression matches, on the path as Cloudflare's
    default URL normalisation leaves it."""
    cookies: dict[str, list[str]] = {}
    for pair in headers.get("cookie", "").split(";"):
        if "=" in pair:
            name, value = pair.split("=", 1)
            if name.strip():
                cookies.setdefault(name.strip(), []).append(value)
    fields = rules_eval.Request(
        path=rules_eval.cloudflare_normalize(target),
        method=method.upper(),
        host=normalize_host(host),
        headers={k: [v] for k, v in headers.items() if k != "cookie"},
        cookies=cookies,
    )
    names = []
    for placement, rule in zip(rule_owners(artifacts), artifacts.ruleset["rules"], strict=True):
        tree, _ = rules_eval.parse(rule["expression"])
        if rules_eval.evaluate(tree, fields):
            names.append(placement)
    return names


def rule_owners(artifacts: edgegen.Artifacts) -> list[str]:
    """Each rule's counter, named like python_applicable names them."""
    return [
        rule["description"].split(":", 1)[0]
        + ("+credential" if rule["ref"].endswith("-credentialed") else "")
        for rule in artifacts.ruleset["rules"]
    ]


MATCHER_MODULE = """
export default {
  async fetch(request) {
    const url = new URL(request.url);
    const names = applicableLimits(request, url, CONFIG).map((counter) =>
      counter.binding.endsWith("_CREDENTIALED") ? `${counter.name}+credential` : counter.name,
    );
    // In a header, so that HEAD requests (no body) report too.
    const result = JSON.stringify({ path: url.pathname, limits: names });
    return new Response(null, { headers: { "x-matcher": result } });
  },
};
"""


def test_js_matcher_agrees_with_python(tmp_path: Path) -> None:
    """On a corpus of 80 requests, workerd and Python agree on path, matches and credentials.

    The Worker's own functions (limiter.js, verbatim) decide, on `new URL(request.url)` in
    workerd; Python decides with Matcher.matches_any on request_paths of the pathname
    (policy.normalize_path models WHATWG's parser). The Enterprise rule expressions,
    evaluated on the path Cloudflare's URL normalisation leaves, agree with Python on that
    path's forms.
    """
    assert len(CORPUS) >= 80
    loaded = policy.loads(CORPUS_POLICY)
    limits = [
        _worker.WorkerLimit(limit, 60, credentialed_rate(loaded, limit)) for limit in loaded.limits
    ]
    blob = _worker.script_json(_worker.config(loaded, limits))
    module = tmp_path / "matcher.js"
    module.write_text(
        f"const CONFIG = {blob};\n\n"
        + _worker.template_text(_worker.LOGIC_FILE)
        + textwrap.dedent(MATCHER_MODULE),
        encoding="utf-8",
    )
    requests = [
        {"url": f"https://{host}{target}", "method": method, "headers": headers}
        for method, host, target, headers in CORPUS
    ]
    responses = run({"script": str(module), "ratelimits": {}, "requests": requests})
    artifacts = edgegen.build(loaded)
    mismatches = []
    for (method, host, target, headers), response in zip(CORPUS, responses, strict=True):
        assert response["status"] == 200, (target, response)
        got = json.loads(response["headers"]["x-matcher"])
        expected_path = normalize_path(target)
        expected = python_applicable(loaded, method, host, expected_path, headers)
        normalized = rules_eval.cloudflare_normalize(target)
        by_python = python_applicable(loaded, method, host, normalized, headers)
        by_rule = rule_applicable(artifacts, method, host, target, headers)
        if got["path"] != expected_path or got["limits"] != expected or by_rule != by_python:
            mismatches.append(
                {
                    "request": (method, host, target[:80], headers),
                    "workerd": got | {"path": got["path"][:80]},
                    "python": {"path": expected_path[:80], "limits": expected},
                    "rules": {"path": normalized[:80], "limits": by_rule, "python": by_python},
                }
            )
    assert not mismatches, json.dumps(mismatches, indent=2, ensure_ascii=False)


def test_harness_files_are_where_the_tests_expect() -> None:
    """The runner and the dry-run script exist (they ship with workers/package.json)."""
    assert (HARNESS / "run.mjs").is_file() and (HARNESS / "dryrun.mjs").is_file()
    assert shutil.which("node") is not None


def test_missing_node_modules_fails_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without workers/node_modules the JS tests fail (never skip) and say how to install."""
    import edge_support

    monkeypatch.setattr(edge_support, "NODE_MODULES", tmp_path / "node_modules")
    with pytest.raises(pytest.fail.Exception, match=r"make test.*npm ci --prefix workers"):
        edge_support.require_node_modules()


# --- issue 12: spellings of a limited path, IPv6 networks, fake credentials ---------------

SPELLING_POLICY = """\
version: 1
cloudflare:
  plan: free
  worker: { name: spelling-test, routes: ["api.example.com/*"] }
limits:
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: 600/1m, unauthenticated_only: false }
"""


@pytest.mark.parametrize("spelling", ["/%61pi/items", "//api/items"])
def test_other_spellings_of_a_limited_path_are_counted(spelling: str, tmp_path: Path) -> None:
    """620 requests from one IP to a spelling the app routes to /api/items: 20 are refused.

    `/%61pi/items` decodes to /api/items and `//api/items` is /api/items once `//` is merged;
    the Worker counts every form of the path, whatever the zone's URL normalisation did.
    """
    worker = build_worker(tmp_path, SPELLING_POLICY)
    responses = run(job_for(tmp_path, worker, [request(spelling) for _ in range(620)]))
    statuses = [r["status"] for r in responses]
    assert statuses == [200] * 600 + [429] * 20
    assert_too_many(responses[-1], "api", 600, 60)


def test_fake_credentials_are_held_to_the_credentialed_rate(tmp_path: Path) -> None:
    """A made-up `Authorization: Bearer x` no longer buys unlimited passage: one IP sending
    it is stopped at the credentialed ceiling (default ten times the rate), counted apart
    from the same IP's anonymous requests."""
    worker = build_worker(tmp_path)
    names = [b["name"] for b in worker.bindings]
    assert len(names) == len(set(names)) == 3
    faked = [request("/api/x", Authorization="Bearer x") for _ in range(31)]
    anonymous = [request("/api/x") for _ in range(4)]
    responses = run(job_for(tmp_path, worker, faked + anonymous))
    statuses = [r["status"] for r in responses]
    assert statuses == [200] * 30 + [429] + [200] * 3 + [429]
    assert_too_many(responses[30], "api", 30, 60)
    assert responses[30]["headers"]["ratelimit-policy"] == '"api";q=30;w=60'
    assert "allows 30 requests per 1m" in json.loads(responses[30]["body"])["detail"]
    assert_too_many(responses[-1], "api", 3, 60)


CREDENTIALED_POLICY = """\
version: 1
cloudflare:
  plan: business
  worker: { name: credentialed-test, routes: ["api.example.com/*"] }
authenticated_when: { headers: [authorization], cookies: [session] }
limits:
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: 2/10s, credentialed_rate: 5/1m }
"""


def test_an_explicit_credentialed_rate_has_its_own_period(tmp_path: Path) -> None:
    """credentialed_rate 5/1m beside rate 2/10s: its own binding, limit and period."""
    worker = build_worker(tmp_path, CREDENTIALED_POLICY)
    assert sorted(b["simple"]["period"] for b in worker.bindings) == [10, 60]
    sent = [request("/api/x", Cookie=f"session={i}") for i in range(6)]
    sent += [request("/api/x") for _ in range(3)]
    responses = run(job_for(tmp_path, worker, sent))
    assert [r["status"] for r in responses] == [200] * 5 + [429] + [200] * 2 + [429]
    assert_too_many(responses[5], "api", 5, 60)
    assert_too_many(responses[-1], "api", 2, 10)


def test_ipv6_clients_are_counted_per_network(tmp_path: Path) -> None:
    """50 addresses of one /64, in several spellings, share one 5/1m budget: 5 pass.
    Another /64 and an IPv4-mapped address are other clients."""
    text = RUNTIME_POLICY.replace("rate: 3/1m", "rate: 5/1m")
    worker = build_worker(tmp_path, text)
    spellings = [
        "2001:db8:0:1::{:x}",
        "2001:DB8:0:1:0:0:0:{:X}",
        "2001:0db8:0000:0001:0000:0000:0000:{:04x}",
        "[2001:db8:0:1::{:x}]",
    ]
    addresses = [spellings[i % 4].format((0x1000 + i * 7919) % 0x10000) for i in range(50)]
    assert len(set(addresses)) == 50
    sent = [request("/api/x", ip=address) for address in addresses]
    sent += [request("/api/x", ip="2001:db8:0:2::1"), request("/api/x", ip="::ffff:192.0.2.1")]
    responses = run(job_for(tmp_path, worker, sent))
    assert [r["status"] for r in responses] == [200] * 5 + [429] * 45 + [200, 200]


# --- the ports of edgegen_policy/_match.py and _net.py, string for string ------------------

FUNCTIONS_MODULE = """
export default {
  async fetch(request) {
    const corpus = await request.json();
    const out = {
      decodePath: corpus.paths.map((p) => decodePath(p)),
      canonicalPath: corpus.paths.map((p) => canonicalPath(decodePath(p))),
      requestPaths: corpus.paths.map((p) => requestPaths(p)),
      ipBucket: corpus.ips.map(([ip, prefix]) => ipBucket(ip, prefix)),
    };
    return new Response(JSON.stringify(out), { headers: { "content-type": "application/json" } });
  },
};
"""

_PATH_PIECES = [
    "a",
    "api",
    "login",
    "x",
    ".",
    "..",
    "%2e",
    "%2E%2e",
    "/",
    "//",
    "\\",
    "%2F",
    "%2f",
    "%5C",
    "%61",
    "%7E",
    "%C3%A9",
    "%c3%a9",
    "%C3",
    "%A9",
    "%FF",
    "%C0%80",
    "%ED%A0%80",
    "%F0%9F%98",
    "%F0%9F%98%80",
    "%EF%BB%BF",
    "%E2%80%A8",
    "%00",
    "%0A",
    "%0d",
    "%7F",
    "%1f",
    "%20",
    "%",
    "%%",
    "%4",
    "%G1",
    "%25",
    "%2525",
    "?q=%41",
    "#f",
    ";p=1",
    "é",
    "\u2028",
    "\U0001f600",
    "~",
    "-",
]


def path_corpus() -> list[str]:
    """Request paths: fixed odd cases (control characters among them) and 400 random ones
    from pieces that decode oddly."""
    import random

    rng = random.Random(1212)
    fixed = ["/", "", "/api/items", "//api/items", "/%61pi/items", "/api%2Fitems", "/a/b/..",
             "/a/./b/", "/..", "/%2e%2e/x", "\\api\\x", "api/x", "/login/", "/%EF%BB%BFx",
             "%EF%BB%BF", "/caf%C3%A9", "/\u00e9%C3%A9\u00e9%A9", "/login%0A", "/login\n",
             "/lo%09gin/%0d%0a", "/a%7F/..//b", "/%00", "/x%1F%0B%0C", "/%0A/..",
             "/%C2%85"]  # fmt: skip
    randoms = [
        "/" + "".join(rng.choice(_PATH_PIECES) for _ in range(rng.randint(1, 8)))
        for _ in range(400)
    ]
    return fixed + randoms


def _spell_ipv6(rng: Any, hextets: list[int]) -> str:
    """One of the many ways to write an IPv6 address: case, leading zeros, where "::" goes."""
    words = [
        (f"{h:04x}" if rng.random() < 0.3 else f"{h:x}").upper()
        if rng.random() < 0.3
        else (f"{h:04x}" if rng.random() < 0.3 else f"{h:x}")
        for h in hextets
    ]
    runs = [
        (start, end)
        for start in range(8)
        for end in range(start + 1, 9)
        if all(h == 0 for h in hextets[start:end])
    ]
    if runs and rng.random() < 0.8:
        start, end = rng.choice(runs)
        return ":".join(words[:start]) + "::" + ":".join(words[end:])
    if hextets[:5] == [0] * 5 and hextets[5] == 0xFFFF and rng.random() < 0.5:
        low = (hextets[6] << 16) | hextets[7]
        return "::ffff:" + ".".join(str((low >> s) & 0xFF) for s in (24, 16, 8, 0))
    return ":".join(words)


def ip_corpus() -> list[tuple[str, int]]:
    """Client addresses with prefixes: IPv4, IPv6 in many spellings, IPv4-mapped, zone ids,
    brackets, whitespace and garbage."""
    import random

    rng = random.Random(6464)
    fixed = [
        "203.0.113.7", "0.0.0.0", "255.255.255.255", "01.2.3.4", "1.2.3.256", "1.2.3",
        "1.2.3.4.5", "1..2.3", " 1.2.3.4 ", "1.2.3.4/24", "\u0661.2.3.4", "::", "::1", "1::",
        "::ffff:1.2.3.4", "::FFFF:1.2.3.4", "::ffff:0102:0304", "::1.2.3.4", "64:ff9b::1.2.3.4",
        "fe80::1%eth0", "fe80::1%", "fe80::1%%x", "fe80::1%25en0", "[::1]", "[::1", "::1]",
        "[2001:DB8::1]", " 2001:db8::1\t", "\u30002001:db8::1\u3000", "\u00a0::1", "\ufeff::1",
        "\x1c::1\x1f", "\x85::1", ":::", "1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", "g::",
        "1:2:3:4:5:6:7::", "::1:2:3:4:5:6:7", "1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:7:1.2.3.4",
        "::1.2.3", "::01.2.3.4", "1:2:3:4:5:6:7:8", ":1:2:3:4:5:6:7", "1:2:3:4:5:6:7:",
        "::/0", "", " ", "[]", "testclient", "unknown", "2001:db8::", "2001:0:0:1::1",
        "2001:db8:0:0:1:0:0:1", "0:0:0:0:0:0:0:1", "1:0:0:2:0:0:0:3", "ABCD:EF01::",
        "2001:db8:85a3:8d3:1319:8a2e:370:7348", "2001:db8::ffff:1.2.3.4",
        # IPv6 forms that carry an IPv4 client: translated, NAT64, 6to4, Teredo, compatible.
        "::ffff:0:1.2.3.4", "::FFFF:0:0102:0304", "64:FF9B::102:304", "64:ff9b:1::1.2.3.4",
        "2002:102:304::1", "2002:c000:0204:5::9", "2001:0:4136:e378:8000:63bf:fefd:fcfb",
        "2001::ffff:ffff", "::0.1.0.0", "::0.0.255.255", "::ffff:1:1.2.3.4",
    ]  # fmt: skip
    prefixes = [32, 48, 56, 63, 64, 65, 96, 100, 127, 128]
    corpus = [(ip, rng.choice(prefixes)) for ip in fixed for _ in range(2)]
    for _ in range(600):
        hextets = [rng.choice([0, 0, 0, 1, 0xFFFF, rng.randrange(0x10000)]) for _ in range(8)]
        if rng.random() < 0.1:
            hextets[:6] = [0, 0, 0, 0, 0, 0xFFFF]
        corpus.append((_spell_ipv6(rng, hextets), rng.choice(prefixes)))
    return corpus


def test_path_and_ip_functions_agree_with_python(tmp_path: Path) -> None:
    """decodePath, canonicalPath, requestPaths and ipBucket, run in workerd, give exactly the
    strings of policy's decode_path, canonical_path, request_paths and ip_bucket on ~420 paths
    (invalid UTF-8, BOMs, odd escapes) and ~720 addresses (IPv6 in many spellings, IPv4-mapped,
    zone ids, brackets, Unicode whitespace, garbage)."""
    paths, ips = path_corpus(), ip_corpus()
    module = tmp_path / "functions.js"
    module.write_text(
        "const CONFIG = {};\n\n"
        + _worker.template_text(_worker.LOGIC_FILE)
        + textwrap.dedent(FUNCTIONS_MODULE),
        encoding="utf-8",
    )
    job = {
        "script": str(module),
        "ratelimits": {},
        "requests": [
            {
                "url": "https://example.com/",
                "method": "POST",
                "headers": {"content-type": "application/json"},
                "body": json.dumps({"paths": paths, "ips": ips}),
            }
        ],
    }
    [response] = run(job)
    got = json.loads(response["body"])
    expected = {
        "decodePath": [decode_path(p) for p in paths],
        "canonicalPath": [canonical_path(decode_path(p)) for p in paths],
        "requestPaths": [list(request_paths(p)) for p in paths],
        "ipBucket": [ip_bucket(ip, prefix) for ip, prefix in ips],
    }
    inputs = {"decodePath": paths, "canonicalPath": paths, "requestPaths": paths, "ipBucket": ips}
    mismatches = {
        name: [
            (given, mine, theirs)
            for given, mine, theirs in zip(inputs[name], expected[name], got[name], strict=True)
            if mine != theirs
        ][:10]
        for name in expected
    }
    assert not any(mismatches.values()), json.dumps(mismatches, indent=2, ensure_ascii=True)
    buckets = set(expected["ipBucket"])
    assert any("::/" in b for b in buckets) and any(b.count(".") == 3 for b in buckets)
    assert any("\ufffd" in d for d in expected["decodePath"])


def test_head_counts_against_a_get_limit(tmp_path: Path) -> None:
    """HEAD runs the GET handler, so a GET limit counts it: GET, HEAD, then a refused HEAD."""
    text = SPELLING_POLICY.replace(
        "match: { path_prefix: /api/ }", "match: { path_prefix: /api/, methods: [GET] }"
    ).replace("rate: 600/1m", "rate: 2/1m")
    worker = build_worker(tmp_path, text)
    sent = [request("/api/x"), request("/api/x", method="HEAD"), request("/api/x", method="HEAD")]
    sent.append(request("/api/x", method="POST"))
    responses = run(job_for(tmp_path, worker, sent))
    assert [r["status"] for r in responses] == [200, 200, 429, 200]


NAMED_POLICY = """\
version: 1
cloudflare:
  plan: free
  worker: { name: names-test, routes: ["api.example.com/*"] }
limits:
  - name: "café ☕ 100%"
    match: { path_prefix: /api/ }
    edge: { rate: 1/1m }
  - name: "caf%C3%A9 ☕ 100%25"
    match: { path_prefix: /other/ }
    edge: { rate: 1/1m }
"""


def test_a_non_ascii_name_is_keyed_as_the_app_keys_it(tmp_path: Path) -> None:
    """RateLimit-Policy names a limit by policy.header_key, the key the app sends: the
    name percent-encoded as UTF-8, '%' included, so a limit literally named like another's
    encoding still gets a key of its own; the problem body carries the name itself."""
    worker = build_worker(tmp_path, NAMED_POLICY)
    sent = [request("/api/x"), request("/api/x"), request("/other/x"), request("/other/x")]
    responses = run(job_for(tmp_path, worker, sent))
    assert [r["status"] for r in responses] == [200, 429, 200, 429]
    first, second = responses[1], responses[3]
    assert_too_many(first, "café ☕ 100%", 1, 60)
    assert_too_many(second, "caf%C3%A9 ☕ 100%25", 1, 60)
    assert first["headers"]["ratelimit-policy"] == '"caf%C3%A9 %E2%98%95 100%25";q=1;w=60'
    assert second["headers"]["ratelimit-policy"] == ('"caf%25C3%25A9 %E2%98%95 100%2525";q=1;w=60')
    assert first["headers"]["ratelimit-policy"] == f"{policy.header_key('café ☕ 100%')};q=1;w=60"
