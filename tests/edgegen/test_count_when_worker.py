"""``count_when`` in the Worker, run in workerd: checked before forwarding, counted after the
origin's answer.

The origin stub (workers/harness/run.mjs) answers the status a request asks for in
``x-origin-status`` (200 otherwise) and marks its answers with ``x-origin: 1``, so a test
sees which requests reached it. The binding counts a caller's listed answers; the answer
that finds the count over the limit marks the caller spent, and a spent caller is refused
without the request reaching the origin.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest
from test_worker_runtime import IP_A, IP_B, build_worker, job_for, request, run

import edgegen
from edgegen.compiler import _worker

pytestmark = pytest.mark.workerd

POLICY = """\
version: 1
cloudflare:
  plan: free
  worker: { name: count-when-test, routes: ["api.example.com/*"] }
authenticated_when: { headers: [authorization] }
limits:
  - name: login
    match: { paths: [/login], methods: [POST] }
    count_when: { status: [401, 5xx] }
    edge: { rate: 3/1m, unauthenticated_only: false }
"""
LIMIT = 3


def login(status: int, ip: str = IP_A, **headers: str) -> dict[str, Any]:
    """A POST /login that the origin stub answers with ``status``."""
    return request("/login", ip, "POST", x_origin_status=str(status), **headers)


def reached(response: dict[str, Any]) -> bool:
    """Whether the origin answered this response (the Worker's own 429s do not say so)."""
    return response["headers"].get("x-origin") == "1"


def forgetful_worker(tmp_path: Path) -> edgegen.WorkerArtifact:
    """The Worker of POLICY, whose isolate forgets its spent marks on a request carrying
    ``x-forget-isolate: 1``, as another isolate of the location would not have them."""
    worker = build_worker(tmp_path, POLICY)
    module = tmp_path / "worker" / worker.main_module
    source = module.read_text("utf-8")
    entry = "return handleRequest(request, env, ctx, CONFIG);"
    assert entry in source
    forget = 'if (request.headers.get("x-forget-isolate") === "1") SPENT_KEYS.clear();'
    module.write_text(source.replace(entry, f"{forget}\n    {entry}"), "utf-8")
    return worker


def test_only_listed_answers_count_and_a_spent_caller_never_reaches_the_origin(
    tmp_path: Path,
) -> None:
    """Successful logins do not count, however many; 401s do. The binding allows 3, so the
    fourth 401 is the answer that finds the count over the limit: it still reaches the
    client (the origin answered it), and from then on the caller is refused before its
    request is forwarded, a login that would succeed included. Another caller is not."""
    worker = build_worker(tmp_path, POLICY)
    sent = [login(200) for _ in range(6)]
    sent += [login(401) for _ in range(LIMIT + 1)]
    sent += [login(401), login(200), login(200, IP_B), login(401, IP_B)]
    responses = run(job_for(tmp_path, worker, sent))
    statuses = [r["status"] for r in responses]
    origin = [reached(r) for r in responses]
    assert statuses == [200] * 6 + [401] * (LIMIT + 1) + [429, 429, 200, 401]
    assert origin == [True] * 6 + [True] * (LIMIT + 1) + [False, False, True, True]
    refusal = responses[6 + LIMIT + 1]
    assert refusal["headers"]["content-type"] == "application/problem+json"
    assert refusal["headers"]["retry-after"] == "60"
    assert json.loads(refusal["body"])["limit"] == "login"


def test_a_status_class_counts_every_status_in_it(tmp_path: Path) -> None:
    """5xx: 500 and 503 count alike; 404 and 302-like answers do not."""
    worker = build_worker(tmp_path, POLICY)
    sent = [login(404), login(500), login(201), login(503), login(599), login(599), login(200)]
    responses = run(job_for(tmp_path, worker, sent))
    assert [r["status"] for r in responses] == [404, 500, 201, 503, 599, 599, 429]
    assert [reached(r) for r in responses] == [True] * 6 + [False]


def test_the_mark_is_shared_through_the_cache(tmp_path: Path) -> None:
    """Another isolate of the location has none of this isolate's marks: with them
    forgotten, the mark written to the Cache API still refuses the spent caller before
    the origin, and the caller's neighbour still passes."""
    worker = forgetful_worker(tmp_path)
    sent = [login(401) for _ in range(LIMIT + 1)]
    sent += [login(200, x_forget_isolate="1"), login(200, IP_B, x_forget_isolate="1")]
    responses = run(job_for(tmp_path, worker, sent))
    assert [r["status"] for r in responses] == [401] * (LIMIT + 1) + [429, 200]
    assert [reached(r) for r in responses] == [True] * (LIMIT + 1) + [False, True]


def test_the_cached_mark_holds_on_every_port(tmp_path: Path) -> None:
    """The port is the client's to pick among Cloudflare's: the mark another isolate
    reads from the cache is the same on :8443 as on :443."""
    worker = forgetful_worker(tmp_path)
    sent = [login(401) for _ in range(LIMIT + 1)]
    other_port = login(200, x_forget_isolate="1")
    other_port["url"] = other_port["url"].replace("api.example.com", "api.example.com:8443")
    responses = run(job_for(tmp_path, worker, [*sent, other_port]))
    assert [r["status"] for r in responses] == [401] * (LIMIT + 1) + [429]
    assert not reached(responses[-1])


def test_other_limits_still_count_before_forwarding(tmp_path: Path) -> None:
    """A limit without count_when on the same request counts every request before it is
    forwarded, as before; its refusal does not count toward the count_when limit."""
    text = POLICY + (
        "  - name: all\n    match: { path_prefix: / }\n"
        "    edge: { rate: 5/1m, unauthenticated_only: false }\n"
    )
    worker = build_worker(tmp_path, text)
    sent = [login(401), login(401), login(200), login(200), login(401), login(401)]
    sent += [login(401, IP_B)]
    responses = run(job_for(tmp_path, worker, sent))
    # "all" allows five requests; the sixth is refused by it before the origin, uncounted.
    assert [r["status"] for r in responses] == [401, 401, 200, 200, 401, 429, 401]
    assert json.loads(responses[5]["body"])["limit"] == "all"
    assert [reached(r) for r in responses] == [True] * 5 + [False, True]


CREDENTIALED = """\
version: 1
cloudflare:
  plan: free
  worker: { name: count-when-test, routes: ["api.example.com/*"] }
authenticated_when: { headers: [authorization] }
limits:
  - name: api
    match: { path_prefix: /api/ }
    count_when: { status: 401 }
    edge: { rate: 2/1m, unauthenticated_only: true, credentialed_rate: 4/1m }
"""


def test_an_unauthenticated_only_limit_counts_each_counters_listed_answers(
    tmp_path: Path,
) -> None:
    """Without a credential, two 401s are allowed and the third marks the caller spent for
    that counter; requests with a (made-up) token have their own counter, at four, also
    counting only 401s; a spent anonymous counter does not refuse the token's requests."""
    worker = build_worker(tmp_path, CREDENTIALED)
    anonymous = [request("/api/x", IP_A, x_origin_status="401") for _ in range(4)]
    token = {"authorization": "Bearer made-up", "x_origin_status": "401"}
    with_token = [request("/api/x", IP_A, **token) for _ in range(6)]
    ok = request("/api/x", IP_A, authorization="Bearer made-up")
    responses = run(job_for(tmp_path, worker, [*anonymous, ok, *with_token]))
    assert [r["status"] for r in responses] == [401, 401, 401, 429, 200] + [401] * 5 + [429]
    assert [reached(r) for r in responses] == [True] * 3 + [False] + [True] * 6 + [False]


def test_the_config_carries_the_statuses_only_for_count_when_limits() -> None:
    """countWhen is the merged ranges, on both counters; absent for other limits, so their
    entries are what they were."""
    loaded = policy.loads(CREDENTIALED)
    artifacts = edgegen.build(loaded)
    assert artifacts.worker is not None
    limit = loaded.limits[0]
    entry = _worker.config(loaded, [_worker.WorkerLimit(limit, 60, policy.Rate.parse("4/1m"))])
    [own] = entry["limits"]
    assert own["countWhen"] == [[401, 401]]
    assert own["withCredential"]["countWhen"] == [[401, 401]]
    plain = policy.loads(CREDENTIALED.replace("    count_when: { status: 401 }\n", ""))
    entry = _worker.config(plain, [_worker.WorkerLimit(plain.limits[0], 60)])
    assert "countWhen" not in entry["limits"][0]


def test_odd_callers_and_a_missing_binding_fail_open(tmp_path: Path) -> None:
    """Without CF-Connecting-IP a request is not counted (as for every limit); without the
    binding, counting fails and every answer still reaches the client."""
    worker = build_worker(tmp_path, POLICY)
    anonymous = [login(401, None) for _ in range(LIMIT + 3)]
    responses = run(job_for(tmp_path, worker, anonymous))
    assert [r["status"] for r in responses] == [401] * (LIMIT + 3)
    job = job_for(tmp_path, worker, [login(401) for _ in range(LIMIT + 3)])
    job["ratelimits"] = {}
    responses = run(job)
    assert [r["status"] for r in responses] == [401] * (LIMIT + 3)
    assert all(reached(r) for r in responses)


def test_an_ipv6_network_is_one_caller_and_its_mark_is_cached(tmp_path: Path) -> None:
    """Two addresses of one /64 fail in turn; the network is spent as a whole, and its mark
    (a key holding ':' and '/') is found in the cache once the isolate forgets it."""
    worker = forgetful_worker(tmp_path)
    first, second = "2001:db8:0:1::1", "2001:db8:0:1:ffff::2"
    sent = [login(401, first if i % 2 else second) for i in range(LIMIT + 1)]
    sent += [login(200, first, x_forget_isolate="1"), login(200, "2001:db8:0:2::1")]
    responses = run(job_for(tmp_path, worker, sent))
    assert [r["status"] for r in responses] == [401] * (LIMIT + 1) + [429, 200]


KEYED_POLICY = """\
version: 1
cloudflare:
  plan: free
  worker: { name: count-when-keyed, routes: ["api.example.com/*"] }
limits:
  - name: login
    match: { paths: [/login], methods: [POST] }
    count_when: { status: [401] }
    edge: { rate: 2/1m, per: { header: x-api-key } }
"""


def test_a_keyed_limit_counts_and_spends_per_key(tmp_path: Path) -> None:
    """count_when with a key beyond the address: two API keys behind one address fail
    apart; once one key's failures are spent, its next request is refused before the
    origin while the other key (same address) still gets through."""
    worker = build_worker(tmp_path, KEYED_POLICY)
    sent = [login(401, x_api_key="alpha") for _ in range(3)]
    sent += [login(200, x_api_key="alpha"), login(401, x_api_key="beta")]
    sent += [login(200, x_api_key="beta"), login(401, x_api_key="beta")]
    job = job_for(tmp_path, worker, sent)
    job["vars"] = {"EDGEGEN_KEY_SECRET": "k" * 32}
    responses = run(job)
    assert [r["status"] for r in responses] == [401, 401, 401, 429, 401, 200, 401]
    assert [reached(r) for r in responses] == [True, True, True, False, True, True, True]
