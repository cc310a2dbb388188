"""Every code snippet of README.md and docs/web.md that builds an app, run exactly as written.

A snippet builds an app when it makes one (``FastAPI(``, ``Starlette(`` or ``Flask(``). Each is
written to ``app.py`` in a directory of its own beside a ``policy.yaml`` whose
``app.redis_url`` is ``${REDIS_URL:-redis://localhost:6379/0}`` (as the README's), imported,
and its app driven twice in one process (two ``TestClient`` sessions, so the lifespan runs
twice, each in an event loop of its own; two Flask test clients): once with ``REDIS_URL`` set
to a real Redis, once to ``memory://``. Nothing but the environment variable chooses the
store. The first session is refused at the policy's count; the second, after the first one's
shutdown closed the limiter, is still refused: a closed limiter lets nothing through.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import RedisServer

# Starlette 1.x warns that its TestClient will move to another HTTP client; the TestClient
# is what an app's own tests use, which is what these tests do.
pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "web.md")
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_BUILDS_AN_APP = re.compile(r"\b(?:FastAPI|Starlette|Flask)\(")
QUOTA = 3
POLICY = """\
version: 1
tiers: [free, pro]
app:
  redis_url: ${REDIS_URL:-redis://localhost:6379/0}
  key_prefix: PREFIX
limits:
  - name: api
    match: { path_prefix: /api/ }
    app: { per: user, tiers: { free: QUOTA/1m, pro: 10/1m } }
"""


def snippets() -> Iterator[Any]:
    """Each app-building snippet, with an id naming its file and line."""
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            code = match.group(1)
            if _BUILDS_AN_APP.search(code):
                line = text.count("\n", 0, match.start()) + 1
                yield pytest.param(code, id=f"{doc.name}:{line}")


SNIPPETS = list(snippets())


def test_the_docs_have_app_snippets() -> None:
    """README.md builds a FastAPI app; docs/web.md a FastAPI and a Flask app."""
    ids = [p.id for p in SNIPPETS]
    assert any(i.startswith("README.md:") for i in ids), ids
    assert sum(i.startswith("web.md:") for i in ids) >= 2, ids


def _load(code: str, directory: Path) -> Any:
    """Import the snippet as module ``app`` from ``directory`` (its policy.yaml is read from
    the working directory, as the snippet says)."""
    (directory / "app.py").write_text(code, encoding="utf-8")
    name = f"doc_snippet_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, directory / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _session(app: Any) -> list[int]:
    """One client session (a lifespan for ASGI apps): five anonymous requests, then five
    of alice (free), each to /api/items; the statuses."""
    headers = {"Authorization": "Bearer key-alice"}
    if hasattr(app, "test_client"):
        client = app.test_client()
        anonymous = [client.get("/api/items").status_code for _ in range(5)]
        alice = [client.get("/api/items", headers=headers).status_code for _ in range(5)]
        return anonymous + alice
    from starlette.testclient import TestClient

    with TestClient(app) as client:
        anonymous = [client.get("/api/items").status_code for _ in range(5)]
        alice = [client.get("/api/items", headers=headers).status_code for _ in range(5)]
    return anonymous + alice


@pytest.mark.parametrize("store", ["redis", "memory"])
@pytest.mark.parametrize("code", SNIPPETS)
def test_a_snippet_runs_as_written_twice(
    code: str,
    store: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    redis_server: RedisServer,
) -> None:
    """The app the snippet builds refuses at the policy's count in a first session, and in a
    second session of the same process still refuses (nothing let through after the first
    session's shutdown closed the limiter), against Redis and against memory:// alike."""
    prefix = f"doc-{uuid.uuid4().hex[:12]}"
    (tmp_path / "policy.yaml").write_text(
        POLICY.replace("PREFIX", prefix).replace("QUOTA", str(QUOTA)), encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REDIS_URL", redis_server.url if store == "redis" else "memory://")
    module = _load(code, tmp_path)
    try:
        first = _session(module.app)
        second = _session(module.app)
    finally:
        limiter = module.limiter
        close = getattr(limiter, "close", None)
        if close is not None:
            close()
    refused = [429] * (5 - QUOTA)
    assert first == [200] * QUOTA + refused + [200] * QUOTA + refused, first
    assert second == [429] * 10, second
    if store == "memory":
        assert module.limiter.memory_store is not None
    else:
        assert module.limiter.memory_store is None
