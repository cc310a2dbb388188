"""Real HTTP servers for the web and differential tests: uvicorn for ASGI apps, waitress
for WSGI apps.

Each runs in a thread of the test process on a socket bound to a free loopback port before
the server starts, so the port is known up front; readiness is polled against a deadline.
Both servers are stopped (and their threads joined) when the context manager exits.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import uvicorn
from waitress.server import create_server

HOST = "127.0.0.1"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STARTUP_TIMEOUT = 10.0


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (examples/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _wait(what: str, ready: Callable[[], bool], thread: threading.Thread) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not ready():
        if not thread.is_alive():
            raise RuntimeError(f"{what} stopped before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready within {STARTUP_TIMEOUT}s")
        # Polling interval: readiness is re-checked every round.
        time.sleep(0.01)


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    return sock


@contextlib.contextmanager
def serve_asgi(app: Any, **options: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn; yield its base URL. ``options`` are further
    ``uvicorn.Config`` settings.

    Proxy headers are off: the middleware reads X-Forwarded-For itself, and uvicorn's own
    handling (on by default, trusting 127.0.0.1) would rewrite the peer under it. The loop
    and the parser are asyncio's and h11 unless ``options`` say otherwise: uvicorn's
    default takes uvloop and httptools whenever they are installed (the dev extra has them).
    """
    sock = _bound_socket()
    settings: dict[str, Any] = {
        "loop": "asyncio",
        "http": "h11",
        "lifespan": "on",
        "proxy_headers": False,
        "access_log": False,
        "log_level": "warning",
        "ws": "none",
    }
    config = uvicorn.Config(app, **(settings | options))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _wait("uvicorn", lambda: server.started, thread)
        yield f"http://{HOST}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(STARTUP_TIMEOUT)
        sock.close()


@contextlib.contextmanager
def serve_wsgi(app: Any, **options: Any) -> Iterator[str]:
    """Serve a WSGI app with waitress; yield its base URL. ``options`` are further
    ``create_server`` settings.

    Waitress drops X-Forwarded-For and friends unless told not to; the middleware decides
    which proxies to believe, so the headers must reach it.
    """
    sockets: dict[int, Any] = {}
    settings: dict[str, Any] = {
        "threads": 4,
        "ident": "test",
        "clear_untrusted_proxy_headers": False,
    }
    server = create_server(app, map=sockets, host=HOST, port=0, **(settings | options))
    port = server.effective_port
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def close_all() -> None:
        # Runs on the server's own loop thread (through its trigger): closing sockets from
        # another thread while the loop selects on them is a race. An empty map ends the loop.
        for channel in list(sockets.values()):
            channel.close()

    try:
        yield f"http://{HOST}:{port}"
    finally:
        try:
            server.trigger.pull_trigger(close_all)
        except OSError:
            # The loop has already stopped and closed its trigger (waitress does when its
            # select fails on a socket a handler closed): nothing races any more, so the
            # sockets left are closed here.
            close_all()
        thread.join(STARTUP_TIMEOUT)
        server.task_dispatcher.shutdown()
