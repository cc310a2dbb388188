"""CORS in a real browser: a page on one origin reads a 429 from the API on another.

Headless Chromium (Debian's ``chromium``) loads a page served by one real server; the
page's script ``fetch``es the rate-limited API, served by uvicorn on another port (another
origin), until it is refused, and writes what it could read (status, ``Retry-After``, the
problem type) into the DOM, which ``--dump-dom`` prints. The browser enforces CORS itself:
a response without the right headers is a network error to the script, never a status.

Skipped, with the reason, only when no Chromium binary can be found.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from harness import RedisServer
from servers import serve_asgi, serve_wsgi
from starlette.middleware.cors import CORSMiddleware

from applimit import AsyncLimiter
from applimit.asgi import RateLimitMiddleware
from applimit.web._headers import QUOTA_EXCEEDED

POLICY = """
version: 1
tiers: [free]
app: { timeout: 2s }  # generous: these tests are about semantics, not latency
limits:
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 2/1m } }
"""

# What the page's script may read of a cross-origin response: Retry-After and the
# RateLimit fields are not CORS-safelisted, so the API's CORS setup must expose them.
EXPOSED = ["Retry-After", "RateLimit", "RateLimit-Policy"]

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>cors</title></head>
<body><pre id="result">pending</pre>
<script>
(async () => {
  const seen = [];
  let last = null;
  for (let i = 0; i < 5; i++) {
    try {
      const response = await fetch(API + "/api/thing");
      const type = response.headers.get("content-type") || "";
      last = {
        status: response.status,
        retryAfter: response.headers.get("Retry-After"),
        rateLimit: response.headers.get("RateLimit"),
        problem: type.includes("problem+json") ? (await response.json()).type : null,
      };
    } catch (error) {
      last = {error: String(error)};
    }
    seen.push(last);
    if (last.error || last.status === 429) break;
  }
  document.getElementById("result").textContent = "RESULT" + JSON.stringify(seen) + "END";
})();
</script></body></html>
"""


def find_chromium() -> str | None:
    """The Chromium binary: $CHROMIUM, or chromium / chromium-browser on the PATH."""
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not found (install Debian's chromium package, or set "
    "$CHROMIUM); the CORS browser test needs a real browser",
)


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    """2 requests a minute under /api/ for everyone (anonymous callers, by IP)."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


@pytest.fixture
def limiter(policy_path: Path, redis_server: RedisServer, redis_client: Any) -> AsyncLimiter:
    """An AsyncLimiter on the shared (flushed) Redis. It connects on first use, in the
    server's event loop, and the app's lifespan closes it there (see ``limited_app``)."""
    return AsyncLimiter.from_policy(policy_path, redis_url=redis_server.url)


def limited_app(limiter: AsyncLimiter) -> FastAPI:
    """A FastAPI app with /api/thing whose lifespan closes ``limiter``."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await limiter.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.get("/api/thing")
    async def thing() -> dict[str, str]:
        return {"ok": "yes"}

    return app


@pytest.fixture
def page_server() -> Iterator[Callable[[str], str]]:
    """``serve(api_url)``: the page, on a server (origin) of its own; returns its URL."""
    pages: dict[str, bytes] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        body = pages.get(environ.get("PATH_INFO", ""), b"not found")
        status = "200 OK" if environ.get("PATH_INFO") in pages else "404 Not Found"
        start_response(status, [("Content-Type", "text/html; charset=utf-8")])
        return [body]

    with serve_wsgi(app) as url:

        def serve(api: str) -> str:
            script = f"<script>const API = {json.dumps(api)};</script>"
            pages["/page.html"] = (script + PAGE).encode("utf-8")
            return f"{url}/page.html"

        yield serve


def browse(url: str) -> list[dict[str, Any]]:
    """Load ``url`` in headless Chromium; the page's results, as it wrote them."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        command = [
            CHROMIUM,
            "--headless",
            # Root in a container has no user namespace for the sandbox.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            f"--user-data-dir={profile}",
            # Virtual time runs the page's script (and waits for its fetches) before the
            # DOM is dumped.
            "--virtual-time-budget=20000",
            "--dump-dom",
            url,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r"RESULT(.*)END", done.stdout)
    assert found is not None, f"no result in the page:\n{done.stdout}\n{done.stderr[-3000:]}"
    results: list[dict[str, Any]] = json.loads(found.group(1))
    return results


def api_app(limiter: AsyncLimiter, page_origin: str, order: str) -> FastAPI:
    """The API: CORSMiddleware for the page's origin and RateLimitMiddleware, added in
    ``order`` ("cors-first": the rate limit is the outer one, as the README once had it)."""
    app = limited_app(limiter)

    def cors() -> None:
        app.add_middleware(
            CORSMiddleware, allow_origins=[page_origin], allow_methods=["*"], expose_headers=EXPOSED
        )

    def rate_limit() -> None:
        app.add_middleware(RateLimitMiddleware, limiter=limiter)

    for add in (cors, rate_limit) if order == "cors-first" else (rate_limit, cors):
        add()
    return app


@pytest.mark.parametrize("order", ["cors-first", "rate-limit-first"])
def test_the_browser_reads_a_429_and_retry_after_cross_origin(
    limiter: AsyncLimiter, page_server: Callable[[str], str], order: str
) -> None:
    """Whichever order the two middleware are added in, the page's script reads the two
    allowed answers and then the 429 with its Retry-After and problem type."""
    page = page_server("")
    page_origin = page.rsplit("/", 1)[0]
    with serve_asgi(api_app(limiter, page_origin, order)) as api:
        results = browse(page_server(api))
    assert [r.get("status") for r in results] == [200, 200, 429], results
    refused = results[-1]
    assert refused["retryAfter"] is not None
    assert 1 <= int(refused["retryAfter"]) <= 60
    assert refused["rateLimit"].startswith('"api";r=0;t=')
    assert refused["problem"] == QUOTA_EXCEEDED


def test_without_cors_the_browser_reads_nothing(
    limiter: AsyncLimiter, page_server: Callable[[str], str]
) -> None:
    """The control: with no CORS middleware the browser hides even the first answer from
    the script (a TypeError), so the test above shows what CORS lets through."""
    app = limited_app(limiter)
    app.add_middleware(RateLimitMiddleware, limiter=limiter)
    with serve_asgi(app) as api:
        results = browse(page_server(api))
    assert len(results) == 1
    assert "TypeError" in results[0]["error"]


@pytest.mark.parametrize("order", ["cors-first", "limits-first"])
def test_the_browser_reads_a_429_from_flask_with_flask_cors(
    policy_path: Path,
    redis_server: RedisServer,
    redis_client: Any,
    page_server: Callable[[str], str],
    order: str,
) -> None:
    """Flask with Flask-CORS and the applimit.flask extension (its refusals pass through
    Flask's after_request functions), in either order, under waitress: the page reads the
    429 and its Retry-After as well."""
    from flask import Flask, Response, jsonify
    from flask_cors import CORS

    from applimit import Limiter
    from applimit.flask import Limits

    page = page_server("")
    page_origin = page.rsplit("/", 1)[0]
    app = Flask(__name__)

    @app.get("/api/thing")
    def thing() -> Response:
        return jsonify(ok="yes")

    with Limiter.from_policy(policy_path, redis_url=redis_server.url) as limiter:
        limits = Limits(limiter=limiter)
        steps = [
            lambda: CORS(app, origins=[page_origin], expose_headers=EXPOSED),
            lambda: limits.init_app(app),
        ]
        for step in steps if order == "cors-first" else steps[::-1]:
            step()
        with serve_wsgi(app) as api:
            results = browse(page_server(api))
    assert [r.get("status") for r in results] == [200, 200, 429], results
    refused = results[-1]
    assert 1 <= int(refused["retryAfter"]) <= 60
    assert refused["rateLimit"].startswith('"api";r=0;t=')
    assert refused["problem"] == QUOTA_EXCEEDED
