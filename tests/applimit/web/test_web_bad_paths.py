"""Paths with control characters, answered by the helpers that the differential suite does not
serve: the Flask extension (under waitress) and FastAPI's ``RateLimit`` dependency (under
uvicorn), each on a real redis-server.

A route's ``$`` matches before a final newline in Starlette, so ``/login%0A`` reaches the
handler of ``/login``; every middleware and helper refuses a path whose decoded form holds a
C0 control character or DEL with 400 before anything else, so no spelling of that class runs
a handler uncounted.
"""

from __future__ import annotations

import json
from typing import Any

import edgegen_policy as policy
import httpx
import pytest
from fastapi import Depends, FastAPI
from flask import Flask
from harness import RedisServer
from servers import serve_asgi, serve_wsgi

from applimit import AsyncLimiter, Limiter
from applimit.fastapi import RateLimit, add_problem_handler
from applimit.flask import Limits

POLICY = """
version: 1
tiers: [free]
app: { timeout: 2s }
limits:
  - name: login
    match: { paths: [/login], methods: [POST] }
    app: { per: ip, algorithm: sliding_log, tiers: { free: 5/1h } }
"""
# Every C0 control character and DEL at the end of /login, and a few in other places.
BAD = [f"/login%{code:02X}" for code in (*range(0x20), 0x7F)] + [
    "/login%0a?x=1",
    "/%6c%6f%67%69%6e%0a",
    "/lo%09gin",
    "/%00login",
    "/login/%0A",
]


def _assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 400, (response.request.url, response.text)
    assert response.headers["content-type"] == "application/problem+json"
    body = json.loads(response.text)
    assert body["status"] == 400 and "control character U+00" in body["detail"]


def test_the_flask_extension_refuses_control_characters(redis_server: RedisServer) -> None:
    """Each bad spelling gets the 400 problem answer and the login view never runs; /login
    itself is still limited to five."""
    ran: list[str] = []
    app = Flask("bad-paths")
    limiter = Limiter.from_policy(policy.loads(POLICY), redis_url=redis_server.url)
    Limits(app, limiter=limiter)

    @app.post("/login")
    def login() -> str:
        ran.append("login")
        return "ok"

    try:
        with serve_wsgi(app) as url, httpx.Client(base_url=url) as client:
            for path in BAD:
                _assert_refused(client.post(path))
            assert ran == []
            statuses = [client.post("/login").status_code for _ in range(7)]
    finally:
        limiter.close()
    assert statuses == [200] * 5 + [429] * 2 and len(ran) == 5


@pytest.mark.parametrize("which", ["async", "sync"])
def test_the_fastapi_dependency_refuses_control_characters(
    redis_server: RedisServer, which: str
) -> None:
    """The ``RateLimit`` dependency (with either limiter) answers 400 before the route's
    handler runs for every bad spelling Starlette would route to /login."""
    ran: list[str] = []
    loaded = policy.loads(POLICY.replace("app: { timeout", f"app: {{ key_prefix: {which}, timeout"))
    limiter: Any = (
        AsyncLimiter.from_policy(loaded, redis_url=redis_server.url)
        if which == "async"
        else Limiter.from_policy(loaded, redis_url=redis_server.url)
    )
    app = FastAPI()
    add_problem_handler(app)

    @app.post("/login", dependencies=[Depends(RateLimit(limiter))])
    async def login() -> str:
        ran.append("login")
        return "ok"

    with serve_asgi(app) as url, httpx.Client(base_url=url) as client:
        for path in BAD:
            response = client.post(path)
            if response.status_code == 404:
                continue  # Starlette does not route it to /login: nothing ran.
            _assert_refused(response)
        assert ran == []
        statuses = [client.post("/login").status_code for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2 and len(ran) == 5
