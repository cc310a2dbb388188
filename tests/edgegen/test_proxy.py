"""The API token and proxies: no proxy ever sees it.

Everything here runs over real sockets on this machine. ``Listener`` is a TCP server on a
free loopback port that records every byte it receives: as the proxy of the environment
(``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, in both cases), as the proxy given in
``EDGEGEN_PROXY``, or as an https:// API that is not loopback. ``Api`` is a real HTTP server
in front of ``FakeCloudflare`` and ``FakeGraphQL``, for an http:// base on loopback.

An https:// base that is not loopback, without leaving the machine: ``0.0.0.0`` is not a
loopback address to edgegen (so its proxy rules apply), and on Linux a connection to it
reaches a server listening on 127.0.0.1.
"""

from __future__ import annotations

import base64
import http.server
import io
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from cloudflare_fake import (
    ACCOUNT_ID,
    PERMISSIONS,
    ZONE_ID,
    FakeCloudflare,
    FakeGraphQL,
)
from zone_support import EXAMPLE, HAND_MADE, Sleeps

import edgegen
from edgegen import cli
from edgegen.cloudflare import _client

SECRET = "proxy-test-token-7f3e9a1c5b2d8e4f6a0c"
ENV_PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
NO_PROXY = ("NO_PROXY", "no_proxy")
# The first bytes of a TLS record that opens a handshake (a ClientHello).
TLS_HANDSHAKE = b"\x16\x03"


def forms(token: str) -> dict[str, bytes]:
    """The token as a leak could carry it."""
    raw = token.encode()
    return {
        "the token": raw,
        "its base64": base64.b64encode(raw).rstrip(b"="),
        "the base64 of its header": base64.b64encode(b"Bearer " + raw).rstrip(b"="),
        "its percent-encoding": quote(token, safe="").encode(),
        "its hex": raw.hex().encode(),
        "its first half": raw[: len(raw) // 2],
        "its second half": raw[len(raw) // 2 :],
    }


def leaks(data: bytes | str, token: str = SECRET) -> list[str]:
    """The forms of ``token`` in ``data`` (compared without case)."""
    blob = (data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data).lower()
    return [name for name, form in forms(token).items() if form.lower() in blob]


class Listener:
    """A TCP server on a free loopback port that records what each connection sends.

    It reads a request head (up to the blank line) or a TLS record, whichever comes. A
    ``CONNECT`` is answered 200 when ``tunnel`` is set, and then the first bytes sent
    through the tunnel are recorded too; anything else gets a 502. Then the connection is
    closed: nothing is ever forwarded. Leaving the ``with`` block waits for every
    connection's thread, so what was received is complete.
    """

    def __init__(self, *, tunnel: bool = False) -> None:
        self.tunnel = tunnel
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        # What each connection sent first, and what came through each tunnel opened.
        self.received: list[bytes] = []
        self.tunnelled: list[bytes] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        """The listener as a proxy URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def everything(self) -> bytes:
        """All bytes received, on every connection."""
        return b"".join(self.received + self.tunnelled)

    def __enter__(self) -> Listener:
        self._accepting.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._accepting.join(5)
        self.server.close()
        for thread in self._threads:
            thread.join(5)

    def _serve(self) -> None:
        self.server.settimeout(0.05)
        while not self._stop.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._answer, args=(connection,), daemon=True)
            self._threads.append(thread)
            thread.start()

    @staticmethod
    def _read(connection: socket.socket) -> bytes:
        """A request head, or the first TLS record (or whatever came before EOF)."""
        data = b""
        while b"\r\n\r\n" not in data:
            try:
                chunk = connection.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
            if data.startswith(TLS_HANDSHAKE):
                break
        return data

    def _answer(self, connection: socket.socket) -> None:
        connection.settimeout(5)
        with connection:
            head = self._read(connection)
            self.received.append(head)
            try:
                if head.startswith(b"CONNECT ") and self.tunnel:
                    connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    self.tunnelled.append(self._read(connection))
                elif head and not head.startswith(TLS_HANDSHAKE):
                    connection.sendall(
                        b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n"
                        b"Connection: close\r\n\r\n"
                    )
            except OSError:
                pass


class _ApiHandler(http.server.BaseHTTPRequestHandler):
    """Hands each request to the fake zone (REST) or the fake analytics (``/graphql``)."""

    zone: FakeCloudflare
    analytics: FakeGraphQL
    authorizations: list[str]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.authorizations.append(self.headers.get("Authorization", ""))
        request = httpx.Request(
            self.command,
            f"http://{self.headers['Host']}{self.path}",
            headers=list(self.headers.items()),
            content=body,
        )
        if self.path.endswith("/graphql"):
            response = self.analytics.handle(request)
        else:
            response = self.zone.handle(request)
        response.read()
        self.send_response(response.status_code)
        for name, value in response.headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.content)))
        self.end_headers()
        self.wfile.write(response.content)

    do_GET = do_PUT = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@contextmanager
def api_server() -> Iterator[tuple[str, type[_ApiHandler]]]:
    """A real HTTP server for the fakes on a free loopback port; its base URL and handler
    class (``authorizations`` lists the Authorization header of each request)."""
    handler = type("Handler", (_ApiHandler,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    base = f"http://127.0.0.1:{server.server_address[1]}/client/v4"
    handler.zone = FakeCloudflare(base_url=base, tokens={SECRET: PERMISSIONS})
    handler.zone.seed_rules(HAND_MADE[:1])
    handler.analytics = FakeGraphQL(grants={SECRET: {"zone", "account"}})
    handler.authorizations = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield base, handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """The token, zone and account; no proxy settings yet; retries never really wait."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", SECRET)
    monkeypatch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
    for name in (*ENV_PROXIES, *NO_PROXY, "EDGEGEN_PROXY", "CLOUDFLARE_API_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_client, "_sleep", Sleeps())
    return monkeypatch


def run(*argv: str | Path) -> tuple[int, str, str]:
    """Run the CLI; exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    stdin, sys.stdin = sys.stdin, io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = cli.main([str(a) for a in argv])
    finally:
        sys.stdin = stdin
    return code, out.getvalue(), err.getvalue()


COMMANDS = {
    "report": ("report", EXAMPLE, "--since", "2h"),
    "pull": ("pull", EXAMPLE, "--out", "state.json"),
    "plan": ("plan", EXAMPLE),
}


@pytest.mark.parametrize("explicit", [False, True], ids=["environment", "and EDGEGEN_PROXY"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_loopback_http_base_never_goes_through_a_proxy(
    env: pytest.MonkeyPatch, command: str, explicit: bool
) -> None:
    """With every proxy variable of the environment pointing at a listener (and
    ``EDGEGEN_PROXY`` too), report, pull and plan against an http:// API on loopback talk to
    it directly: the proxy gets no connection and no byte, so the Authorization header never
    travels to it in clear text; the token went to the API only, and is in no output or
    file."""
    with Listener() as proxy, api_server() as (base, handler):
        for name in ENV_PROXIES:
            env.setenv(name, proxy.url)
        if explicit:
            env.setenv("EDGEGEN_PROXY", proxy.url)
        env.setenv("CLOUDFLARE_API_BASE_URL", base)
        code, out, err = run(*COMMANDS[command])
    assert code == 0, err
    assert proxy.received == []
    assert handler.authorizations
    assert set(handler.authorizations) == {f"Bearer {SECRET}"}
    assert leaks(out + err) == []
    for path in Path.cwd().iterdir():
        assert leaks(path.read_bytes()) == [], path


@pytest.fixture
def off_loopback() -> None:
    """The tests that reach this machine as 0.0.0.0 need Linux."""
    if not sys.platform.startswith("linux"):
        pytest.skip("a connection to 0.0.0.0 reaches 127.0.0.1 on Linux only")


@pytest.mark.usefixtures("off_loopback")
@pytest.mark.parametrize("command", ["report", "pull"])
def test_an_https_base_ignores_the_proxies_of_the_environment(
    env: pytest.MonkeyPatch, command: str
) -> None:
    """HTTPS_PROXY and the others are not an opt-in: against an https:// base that is not
    loopback, edgegen connects directly (its TLS handshake reaches the API's address) and
    the proxy of the environment gets nothing. The handshake fails (the listener speaks no
    TLS), so the command ends with one error that shows no token."""
    with Listener() as proxy, Listener() as api:
        for name in ENV_PROXIES:
            env.setenv(name, proxy.url)
        env.setenv("CLOUDFLARE_API_BASE_URL", f"https://0.0.0.0:{api.port}/client/v4")
        code, out, err = run(*COMMANDS[command])
    assert code == 1
    assert proxy.received == []
    assert api.received
    assert all(data.startswith(TLS_HANDSHAKE) for data in api.received)
    assert "edgegen never uses HTTP_PROXY, HTTPS_PROXY or ALL_PROXY" in err
    assert leaks(out + err) == []
    assert leaks(api.everything) == []


@pytest.mark.usefixtures("off_loopback")
@pytest.mark.parametrize("command", ["report", "pull"])
def test_edgegen_proxy_tunnels_an_https_base_with_connect(
    env: pytest.MonkeyPatch, command: str
) -> None:
    """``EDGEGEN_PROXY`` (a plain http:// proxy, with a user and password) carries requests
    to an https:// base as a CONNECT tunnel: the proxy sees ``CONNECT host:port``, its own
    credentials, then a TLS handshake, and never the token in any form; nothing connects
    to the API directly. Errors show the proxy without its password."""
    with Listener(tunnel=True) as proxy, Listener() as api:
        env.setenv("EDGEGEN_PROXY", f"http://ops:hunter2-secret@127.0.0.1:{proxy.port}")
        env.setenv("CLOUDFLARE_API_BASE_URL", f"https://0.0.0.0:{api.port}/client/v4")
        code, out, err = run(*COMMANDS[command])
    assert code == 1
    assert api.received == []
    credentials = b"Proxy-Authorization: Basic " + base64.b64encode(b"ops:hunter2-secret")
    assert proxy.received
    for head in proxy.received:
        assert head.startswith(f"CONNECT 0.0.0.0:{api.port} HTTP/1.1\r\n".encode())
        assert credentials in head
    assert proxy.tunnelled
    assert all(data.startswith(TLS_HANDSHAKE) for data in proxy.tunnelled)
    assert b"authorization: bearer" not in proxy.everything.lower()
    assert leaks(proxy.everything) == []
    assert f"through the proxy http://***@127.0.0.1:{proxy.port}" in err
    assert "hunter2" not in out + err
    assert leaks(out + err) == []


def test_a_proxy_that_refuses_the_tunnel_means_nothing_was_sent() -> None:
    """A proxy that answers CONNECT with 502 never passed the request on: even a write (a
    POST, which is otherwise not repeated once it may have arrived) is tried again, as a
    connection that never opened is, and its error never says the change may have been
    made; it names the proxy, and the proxy saw no token."""
    with Listener() as proxy:
        settings = {
            "CLOUDFLARE_API_TOKEN": SECRET,
            # Nothing listens on port 9 (discard): were the proxy bypassed, the connection
            # would be refused on this machine.
            "CLOUDFLARE_API_BASE_URL": "https://0.0.0.0:9/client/v4",
            "EDGEGEN_PROXY": proxy.url,
        }
        with (
            edgegen.Client.from_env(settings, sleep=Sleeps()) as client,
            pytest.raises(edgegen.CloudflareAPIError) as caught,
        ):
            client.send(client.create_route_write(ZONE_ID, "example.com/api/*", "edge"))
    assert len(proxy.received) == 5
    assert all(head.startswith(b"CONNECT 0.0.0.0:9 HTTP/1.1\r\n") for head in proxy.received)
    assert not caught.value.ambiguous
    assert "may or may not" not in str(caught.value)
    assert "(ProxyError)" in str(caught.value)
    assert f"through the proxy {proxy.url}" in str(caught.value)
    assert leaks(proxy.everything) == []


BAD_PROXIES = {
    "a SOCKS proxy": "socks5://ops:hunter2-secret@127.0.0.1:1080",
    "no scheme": "ops:hunter2-secret@proxy.example:3128",
    "no host": "http://",
    "a path": "http://ops:hunter2-secret@proxy.example:3128/edge",
    "a query": "http://proxy.example:3128?key=hunter2-secret",
    "a port that is no number": "http://proxy.example:port",
    "port 0": "http://proxy.example:0",
}


@pytest.mark.parametrize("value", list(BAD_PROXIES.values()), ids=list(BAD_PROXIES))
def test_a_malformed_edgegen_proxy_is_a_usage_error(env: pytest.MonkeyPatch, value: str) -> None:
    """An EDGEGEN_PROXY that is not an http(s) proxy URL stops the command before any
    request (exit 2), with a message that names the variable and never shows a password."""
    env.setenv("EDGEGEN_PROXY", value)
    with Listener() as api:
        env.setenv("CLOUDFLARE_API_BASE_URL", f"http://127.0.0.1:{api.port}/client/v4")
        code, out, err = run("pull", EXAMPLE, "--out", "state.json")
    assert code == 2, err
    assert api.received == []
    assert err.startswith("edgegen: error: EDGEGEN_PROXY is ")
    assert "hunter2" not in out + err
    with pytest.raises(edgegen.UsageError, match="EDGEGEN_PROXY"):
        edgegen.Client(edgegen.Token(SECRET), proxy=value)
