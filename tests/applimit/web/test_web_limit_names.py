"""The app's refusal against the Worker's: one problem type, one body shape, one header key.

A client cannot tell whether the Worker or the app behind it answered, so both name a limit
in ``RateLimit-Policy`` as ``policy.header_key`` does and refuse with ``policy.QUOTA_EXCEEDED``
(tests/edgegen/test_worker_runtime.py holds the Worker to the same in workerd). Decisions are
built with the core's own ``combine``, and headers are parsed by the strict checker.
"""

from __future__ import annotations

import json

import edgegen_policy as policy
import httpx
import pytest
from webcheck import rate_limit_headers

from applimit import LimitResult
from applimit._decision import combine
from applimit.web._gate import Answer, Gate
from edgegen.compiler import _worker

GATE = Gate(tiers=("free",))
EDGE_POLICY = """\
version: 1
limits:
  - name: {name}
    edge: {{ rate: 5/1m }}
"""


def refused(name: str) -> Answer:
    """The app's outcome when a 5/1m limit of this name refuses a request."""
    result = LimitResult(
        name=name,
        tier="free",
        algorithm="sliding_window",
        quota=5,
        window=60.0,
        allowed=False,
        consumed=False,
        remaining=0,
        reset_after=60.0,
        retry_after=60.0,
        shadow=False,
    )
    return GATE.answer(combine([result]), "free")


def as_response(outcome: Answer) -> httpx.Response:
    """The refusal as an HTTP response, for the header checker."""
    assert outcome.refusal is not None
    refusal = outcome.refusal
    return httpx.Response(refusal.status, headers=list(refusal.headers), content=refusal.body)


def edge_limit(name: str) -> policy.Limit:
    """An edge limit of this name, 5/1m, as the Worker is built from it."""
    return policy.loads(EDGE_POLICY.format(name=json.dumps(name))).limit(name)


@pytest.mark.parametrize("name", ["api", "café", "日本語 ☕", 'say "hi" \\ now'])
def test_the_app_keys_a_limit_as_the_worker_does(name: str) -> None:
    """RateLimit-Policy carries policy.header_key(name), which the Worker sends too, and a
    strict structured-field parser reads it back as one sf-string."""
    response = as_response(refused(name))
    assert response.headers["ratelimit-policy"] == f"{policy.header_key(name)};q=5;w=60"
    assert response.headers["ratelimit-policy"] == _worker.policy_header(edge_limit(name), 60)
    assert len(rate_limit_headers(response).policies) == 1


def test_a_name_with_a_percent_sign_keeps_a_key_of_its_own() -> None:
    """A limit literally named like another's encoding is not given that other's key."""
    response = as_response(refused("caf%C3%A9"))
    assert response.headers["ratelimit-policy"] == '"caf%25C3%25A9";q=5;w=60'


def test_the_refusal_has_the_workers_problem_type_and_members() -> None:
    """The app's 429 body and the Worker's have the same type and the same members, and
    agree on the limit, the violated policies and the wait."""
    body = json.loads(as_response(refused("café")).content)
    edge = _worker.problem(edge_limit("café"), 60)
    assert body["type"] == edge["type"] == policy.QUOTA_EXCEEDED
    assert set(body) == set(edge)
    for member in ("title", "status", "limit", "violated-policies", "retry-after"):
        assert body[member] == edge[member], member
