"""An app's own tests without Redis: the example apps on ``memory://``, under real servers.

What an app's test suite would do with the pytest plugin: build the app with its limiter
on ``memory://`` (here through ``create_app(redis_url=...)``; an app may read it from its
settings), serve it, and move ``applimit_clock`` instead of sleeping. The servers run in
threads of the test process, so the app's limiter and the test share the store and its
clock. Both stacks: FastAPI under uvicorn and Flask under waitress.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from servers import load_example, serve_asgi, serve_wsgi

from applimit.pytest_plugin import Clock

STACKS = {"fastapi": ("fastapi_app", serve_asgi), "flask": ("flask_app", serve_wsgi)}


@pytest.fixture(params=sorted(STACKS))
def client(request: pytest.FixtureRequest, applimit_clock: Clock) -> Iterator[httpx.Client]:
    """An HTTP client of the example app of the stack, its limits on memory://."""
    module, serve = STACKS[request.param]
    app: Any = load_example(module).create_app(redis_url="memory://", legacy_headers=False)
    with serve(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        yield http


def test_the_login_limit_answers_429_and_lets_through_a_minute_later(
    client: httpx.Client, applimit_clock: Clock
) -> None:
    """login: 5/1m per IP. The sixth attempt gets the 429 with Retry-After and the problem
    body; once the clock has moved a minute on (no sleep), attempts get through again."""
    for _ in range(5):
        assert client.post("/login").status_code == 200
    refused = client.post("/login")
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "60"
    assert refused.headers["Content-Type"].startswith("application/problem+json")
    assert json.loads(refused.text)["status"] == 429
    applimit_clock.advance(59)
    assert client.post("/login").status_code == 429
    applimit_clock.advance(1)
    assert client.post("/login").status_code == 200


def test_each_test_starts_with_full_quotas(client: httpx.Client) -> None:
    """The plugin clears the stores between tests: the previous test's attempts (the same
    address, the same store) are forgotten."""
    response = client.post("/login")
    assert response.status_code == 200
    assert response.headers["RateLimit"] == '"login";r=4;t=60'
