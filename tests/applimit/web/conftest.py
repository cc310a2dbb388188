"""Fixtures of the web tests: the example apps served over real HTTP, on real Redis.

``stack`` runs each test twice: the FastAPI example under uvicorn and the Flask example
under waitress. ``serve(**options)`` builds the example app of the current stack with
``create_app(**options)`` (Redis URL, policy file, trusted proxies...), serves it, and
returns an httpx client for it; everything is stopped and closed at teardown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from harness import RedisServer
from servers import EXAMPLES, load_example, serve_asgi, serve_wsgi
from webcheck import FASTAPI, FLASK, Serve


@pytest.fixture(params=[FASTAPI, FLASK])
def stack(request: pytest.FixtureRequest) -> str:
    """Which example app and server a test runs against."""
    return str(request.param)


@pytest.fixture
def example_policy(tmp_path: Path) -> Path:
    """The example policy with a generous app.timeout: these tests are about what the apps
    answer, and the example's 50 ms would let a pause of this process (a full garbage
    collection, a busy CI machine) turn an exact decision into a fail-open one."""
    text = (EXAMPLES / "policy.yaml").read_text(encoding="utf-8")
    assert "  timeout: 50ms" in text
    path = tmp_path / "example-policy.yaml"
    path.write_text(text.replace("  timeout: 50ms", "  timeout: 2s", 1), encoding="utf-8")
    return path


@pytest.fixture
def serve(
    stack: str, redis_server: RedisServer, redis_client: redis.Redis, example_policy: Path
) -> Iterator[Serve]:
    """Start the stack's example app; options go to its ``create_app``.

    Defaults: the shared (flushed) Redis server and the example policy (with a 2 s
    timeout). Returns a client whose base URL is the server.
    """
    with contextlib.ExitStack() as stack_of_things:

        def start(**options: Any) -> httpx.Client:
            options.setdefault("redis_url", redis_server.url)
            options.setdefault("policy", example_policy)
            options.setdefault("trusted_proxies", [])
            options.setdefault("behind_cloudflare", False)
            if stack == FASTAPI:
                app = load_example("fastapi_app").create_app(**options)
                url = stack_of_things.enter_context(serve_asgi(app))
            else:
                app = load_example("flask_app").create_app(**options)
                stack_of_things.callback(app.extensions["applimit"].close)
                url = stack_of_things.enter_context(serve_wsgi(app))
            return stack_of_things.enter_context(httpx.Client(base_url=url, timeout=10))

        yield start


@pytest.fixture
def write_policy(tmp_path: Path) -> Callable[[str], Path]:
    """Write a policy file for one test and return its path."""

    def write(text: str) -> Path:
        path = tmp_path / "policy.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    return write
