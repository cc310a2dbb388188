"""Checks every rate-limit header of a response against the grammar and against each other.

``rate_limit_headers(response)`` parses RateLimit-Policy and RateLimit with the strict
structured-field parser, Retry-After as delay-seconds and the legacy X-RateLimit-* fields,
asserts that they agree (every RateLimit item names a policy, ``r <= q``, Retry-After is not
earlier than any ``t``, the legacy fields describe the most restrictive item), and returns
the parsed values for the test's own assertions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from servers import EXAMPLES
from sfparse import Token, parse_list

EXAMPLE_POLICY = EXAMPLES / "policy.yaml"
FASTAPI = "fastapi+uvicorn"
FLASK = "flask+waitress"
ALICE = {"Authorization": "Bearer key-alice"}  # free tier
BOB = {"X-API-Key": "key-bob"}  # pro tier
CAROL = {"Authorization": "Bearer key-carol"}  # enterprise tier

Serve = Callable[..., httpx.Client]
"""``serve(**create_app_options)``: start the example app of the current stack."""

_DELAY_SECONDS = re.compile(r"^[0-9]+$")


@dataclass
class Quota:
    """One RateLimit-Policy item."""

    q: int
    w: int | None


@dataclass
class Service:
    """One RateLimit item."""

    r: int
    t: int


@dataclass
class RateLimitHeaders:
    """The parsed rate-limit headers of one response."""

    policies: dict[str, Quota] = field(default_factory=dict)
    limits: dict[str, Service] = field(default_factory=dict)
    retry_after: int | None = None
    legacy: tuple[int, int, int] | None = None


def _integer(value: object, what: str) -> int:
    assert isinstance(value, int) and not isinstance(value, bool), f"{what} is {value!r}"
    assert value >= 0, f"{what} is negative: {value}"
    return value


def rate_limit_headers(response: httpx.Response) -> RateLimitHeaders:
    """Parse and cross-check the response's rate-limit headers (see the module docstring)."""
    parsed = RateLimitHeaders()
    policy_lines = response.headers.get_list("ratelimit-policy")
    limit_lines = response.headers.get_list("ratelimit")
    if policy_lines:
        for item in parse_list(*policy_lines):
            assert not isinstance(item.value, Token), "a policy name must be an sf-string"
            assert isinstance(item.value, str)
            assert item.value not in parsed.policies, f"policy {item.value!r} listed twice"
            assert "q" in item.params, f"policy {item.value!r} has no q"
            window = item.params.get("w")
            w = _integer(window, "w") if window is not None else None
            assert w is None or w > 0, "w must be positive"
            parsed.policies[item.value] = Quota(q=_integer(item.params["q"], "q"), w=w)
    if limit_lines:
        assert policy_lines, "RateLimit without RateLimit-Policy"
        for item in parse_list(*limit_lines):
            assert isinstance(item.value, str) and not isinstance(item.value, Token)
            assert item.value in parsed.policies, f"RateLimit names unknown {item.value!r}"
            service = Service(r=_integer(item.params["r"], "r"), t=_integer(item.params["t"], "t"))
            assert service.r <= parsed.policies[item.value].q, "more remaining than the quota"
            parsed.limits[item.value] = service
    retry = response.headers.get_list("retry-after")
    if retry:
        assert len(retry) == 1 and _DELAY_SECONDS.match(retry[0]), f"Retry-After {retry!r}"
        parsed.retry_after = int(retry[0])
        for name, service in parsed.limits.items():
            assert parsed.retry_after >= service.t, f"Retry-After is earlier than t of {name}"
    legacy = [response.headers.get(f"x-ratelimit-{n}") for n in ("limit", "remaining", "reset")]
    if any(v is not None for v in legacy):
        assert all(v is not None and _DELAY_SECONDS.match(v) for v in legacy), legacy
        limit, remaining, reset = (int(v) for v in legacy if v is not None)
        parsed.legacy = (limit, remaining, reset)
        # The legacy trio describes the most restrictive item, which is in RateLimit.
        assert any(
            parsed.policies[name].q == limit and s.r == remaining and s.t == reset
            for name, s in parsed.limits.items()
        ), "X-RateLimit-* match no RateLimit item"
        assert remaining == min(s.r for s in parsed.limits.values())
    return parsed


def problem(response: httpx.Response, status: int) -> dict[str, object]:
    """The RFC 9457 body of a refusal, after checking its media type and members."""
    assert response.status_code == status
    assert response.headers["content-type"].split(";")[0] == "application/problem+json"
    body = json.loads(response.content)
    assert isinstance(body, dict)
    assert body["status"] == status
    for member in ("type", "title", "detail"):
        assert isinstance(body[member], str) and body[member], member
    return body
