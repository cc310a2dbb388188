"""The API token never leaves the Authorization header.

One distinctive token runs through every command (pull, plan in each format and offline,
apply of a policy and of a saved plan, dry runs, --token-file) and every way they fail
(401, 403, 429, 5xx, refused connections, timeouts, a bad or stale plan file, a token with
a typo or a space, token files that cannot be used). Then the token is searched for, as
itself and in the forms a leak would take (base64, base64 of the whole header,
percent-encoded, hex, cut in half), in: stdout and stderr, every file under the working
directory, every log record of every logger at DEBUG (httpx and httpcore included), every
exception a command raised with its ``__cause__``/``__context__`` chain, attributes and
formatted traceback, and the repr, URL and body of every request the client built.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import io
import json
import logging
import secrets
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import httpx
import pytest
from cloudflare_fake import ACCOUNT_ID, PERMISSIONS, ZONE_ID, FakeCloudflare, error, respond
from zone_support import EXAMPLE, HAND_MADE, Fault, Network, Sleeps, Terminal, variant

from edgegen import (
    Client,
    CloudflareAPIError,
    Token,
    UsageError,
    _cli_build,
    _cli_zone,
    cli,
)
from edgegen.cloudflare import _client

# Characters that change under base64, percent- and form-encoding, so every form differs.
SECRET = secrets.token_urlsafe(30) + "~+/=%"
LOGGERS = ("", "httpx", "httpcore", "httpcore.http11", "httpcore.connection", "edgegen")


def forms(token: str) -> dict[str, str]:
    """The token as a leak could show it."""
    raw = token.encode()
    return {
        "the token": token,
        "its base64": base64.b64encode(raw).decode().rstrip("="),
        "its URL-safe base64": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "the base64 of its header": base64.b64encode(b"Bearer " + raw).decode().rstrip("="),
        "its percent-encoding": quote(token, safe=""),
        "its form encoding": quote_plus(token),
        "its hex": raw.hex(),
        "its first half": token[: len(token) // 2],
        "its second half": token[len(token) // 2 :],
    }


@dataclass
class Seen:
    """Everything the commands produced, each text with where it came from."""

    caplog: pytest.LogCaptureFixture | None = None
    texts: list[tuple[str, str]] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)

    def add(self, where: str, text: str | bytes) -> None:
        """Keep one text (bytes are read as Latin-1, so every byte is a character)."""
        self.texts.append((where, text.decode("latin-1") if isinstance(text, bytes) else text))

    def exception(self, where: str, exc: BaseException) -> None:
        """An exception, its message, repr, attributes, traceback and everything it chains."""
        stack: list[BaseException] = [exc]
        visited: set[int] = set()
        while stack:
            item = stack.pop()
            if id(item) in visited:
                continue
            visited.add(id(item))
            self.add(f"{where}: str of {type(item).__name__}", str(item))
            self.add(f"{where}: repr of {type(item).__name__}", repr(item))
            self.add(f"{where}: args", repr(item.args))
            self.add(f"{where}: attributes", repr(getattr(item, "__dict__", {})))
            self.add(f"{where}: traceback", "".join(traceback.format_exception(item)))
            request = getattr(item, "_request", None)
            if isinstance(request, httpx.Request):
                self.add(f"{where}: its request", f"{request!r} {request.headers!r}")
            for link in (item.__cause__, item.__context__, getattr(item, "cause", None)):
                if isinstance(link, BaseException):
                    stack.append(link)

    def logged(self) -> list[logging.LogRecord]:
        """The log records so far (each is searched by ``check``)."""
        return self.caplog.records if self.caplog is not None else []

    def check(self, token: str = SECRET) -> None:
        """No form of the token anywhere, log records included."""
        for record in self.logged():
            self.add(f"log record of {record.name}", logging.Formatter().format(record))
            self.add(f"log record of {record.name}: args", repr(record.args))
        assert self.texts
        for name, form in forms(token).items():
            for where, text in self.texts:
                assert form not in text, f"{name} appears in {where}: {text[:300]!r}"


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Seen:
    """Collects outputs, log records (DEBUG, every logger) and the commands' exceptions."""
    found = Seen(caplog)
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name or None)
    for module, handler in (
        (_cli_zone, "run_plan"),
        (_cli_zone, "run_pull"),
        (_cli_zone, "run_apply"),
        (_cli_zone, "run_diff"),
        (_cli_build, "run_build"),
    ):
        monkeypatch.setattr(module, handler, recording(getattr(module, handler), found))
    return found


def recording(func: Callable[[Any], int], found: Seen) -> Callable[[Any], int]:
    """A command handler that keeps the exception it raises, if any."""

    def wrapper(args: Any) -> int:
        try:
            return func(args)
        except BaseException as exc:
            found.exception(f"{func.__name__} raised", exc)
            raise

    return wrapper


@pytest.fixture
def zone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seen: Seen
) -> Iterator[tuple[Network, FakeCloudflare]]:
    """A fake zone that knows only SECRET, and the environment holding it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", SECRET)
    monkeypatch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
    monkeypatch.delenv("CLOUDFLARE_API_BASE_URL", raising=False)
    monkeypatch.setattr(_client, "_sleep", Sleeps())
    fake = FakeCloudflare(tokens={SECRET: PERMISSIONS})
    fake.seed_rules(HAND_MADE)
    network = Network(fake, on_request=seen.requests.append)
    with network.installed():
        yield network, fake


def runner(seen: Seen) -> Callable[..., int]:
    """Run the CLI, keeping stdout and stderr; ``answer`` is typed on a terminal."""

    def invoke(*argv: str | Path, answer: str | None = None) -> int:
        out, err = io.StringIO(), io.StringIO()
        stdin = sys.stdin
        sys.stdin = Terminal(answer) if answer is not None else io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cli.main([str(a) for a in argv])
        finally:
            sys.stdin = stdin
        label = " ".join(str(a) for a in argv)
        seen.add(f"stdout of {label}", out.getvalue())
        seen.add(f"stderr of {label}", err.getvalue())
        return code

    return invoke


def test_the_token_appears_nowhere(
    zone: tuple[Network, FakeCloudflare],
    seen: Seen,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every command, succeeding and failing: no form of the token in any output, file,
    log record, exception or request other than its Authorization header."""
    network, fake = zone
    run = runner(seen)
    policy = tmp_path / "policy.yaml"
    policy.write_text(EXAMPLE.read_text())
    tighter = tmp_path / "tighter.yaml"
    tighter.write_text(variant(EXAMPLE.read_text(), **{"rate: 20/1m,": "rate: 10/1m,"}))
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "\n")

    # Everything that works.
    assert run("pull", policy, "--out", "state.json") == 0
    assert run("plan", policy) == 0
    assert run("plan", policy, "--format", "markdown") == 0
    assert run("plan", policy, "--format", "json", "--detailed-exitcode") == 2
    assert run("plan", policy, "--out", "plan.json") == 0
    assert run("plan", policy, "--state", "state.json", "--out", "offline-plan.json") == 0
    assert run("apply", policy, "--dry-run", "--validate-remote") == 0
    assert run("apply", "plan.json", "--dry-run") == 0
    assert run("apply", "plan.json", "--validate-remote") == 0
    assert run("apply", policy, "--auto-approve") == 0
    assert run("build", policy, "--out", "out") == 0
    assert run("diff", policy, tighter, "--format", "markdown") == 0
    assert run("plan", tighter, "--out", "tighter-plan.json") == 0
    assert run("apply", tighter, answer="no\n") == 1
    with monkeypatch.context() as env:
        env.delenv("CLOUDFLARE_API_TOKEN")
        assert run("plan", policy, "--token-file", token_file) == 0
        assert run("pull", policy, "--out", "state2.json", "--token-file", token_file) == 0
        assert run("apply", tighter, "--auto-approve", "--token-file", token_file) == 0

    # Cloudflare refuses or fails.
    assert run("apply", "plan.json") == 1  # stale: the zone changed since
    fake.tokens = {}
    assert run("plan", policy) == 1  # 401
    assert run("apply", policy, "--auto-approve") == 1
    fake.tokens = {SECRET: frozenset({"routes", "scripts"})}
    assert run("apply", policy, "--auto-approve") == 1  # 403
    fake.tokens = {SECRET: PERMISSIONS}
    fake.throttle(after=0, times=9, retry_after="300")
    assert run("plan", policy) == 1  # 429, too long to wait
    fake.budget = None
    fake.throttle(after=1, times=1, retry_after="1")
    assert run("plan", policy) == 0  # 429, then fine
    fake.budget = None
    for kind in (
        Fault("status", 500, persistent=True),
        Fault("status", 502, after_write=True, persistent=True),
        Fault("connect", persistent=True),
        Fault("timeout", persistent=True),
        Fault("timeout", after_write=True),
    ):
        for at in (0, 4):
            network.fault, network.at, network.requests = kind, at, []
            run("apply", policy, "--auto-approve")
            network.fault, network.at, network.requests = kind, at, []
            run("apply", "tighter-plan.json")
    network.fault = None
    fake.fail("PUT", "/workers/scripts/", 500, times=9)
    assert (
        run("apply", variant_path(tmp_path, "rate: 100/10s", "rate: 90/10s"), "--auto-approve") == 1
    )

    # Plan files that are not plans, and tokens that are not the token.
    Path("bad-plan.json").write_text('{"format": "edgegen-plan", "format_version": 1}')
    assert run("apply", "bad-plan.json") == 1
    Path("cut-plan.json").write_text(Path("plan.json").read_text()[:200])
    assert run("apply", "cut-plan.json") == 1
    with monkeypatch.context() as env:
        env.setenv("CLOUDFLARE_API_TOKEN", SECRET + "x")
        assert run("plan", policy) == 1  # Cloudflare does not know it
        env.setenv("CLOUDFLARE_API_TOKEN", SECRET + " x")
        assert run("plan", policy) == 2  # refused before any request
        env.setenv("CLOUDFLARE_API_TOKEN", f"Bearer {SECRET}")
        assert run("plan", policy) == 2
        env.delenv("CLOUDFLARE_API_TOKEN")
        for content in (
            f"{SECRET}\n{SECRET}\n",
            f"CLOUDFLARE_API_TOKEN={SECRET} # the token",
            SECRET.encode() + b"\xff\xfe",
            SECRET * 200,
        ):
            bad = tmp_path / "bad-token"
            if isinstance(content, bytes):
                bad.write_bytes(content)
            else:
                bad.write_text(content)
            assert run("plan", policy, "--token-file", bad) == 2
        assert run("plan", policy, "--token-file", tmp_path) == 2  # a directory

    inputs = {token_file, tmp_path / "bad-token"}
    for path in tmp_path.rglob("*"):
        if path.is_file() and path not in inputs:
            seen.add(f"the file {path.relative_to(tmp_path)}", path.read_bytes())
    for request in seen.requests:
        assert request.headers["Authorization"] in (f"Bearer {SECRET}", f"Bearer {SECRET}x")
        seen.add(f"a request to {request.url.path}", f"{request!r} {request.headers!r}")
        seen.add(f"the URL of a request to {request.url.path}", str(request.url))
        seen.add(f"the body of a request to {request.url.path}", request.content)
    # The checks can see: the requests carry the token, so a leak would be found.
    assert len(seen.requests) > 100
    seen.check()


def variant_path(directory: Path, old: str, new: str) -> Path:
    """The example policy with one change, as a file."""
    path = directory / "variant.yaml"
    path.write_text(variant(EXAMPLE.read_text(), **{old: new}))
    return path


def test_a_token_echoed_by_a_proxy_is_removed(seen: Seen) -> None:
    """A proxy (or Cloudflare) that quotes the Authorization header in its error message:
    the message edgegen shows has *** in its place."""

    def echo(request: httpx.Request) -> httpx.Response:
        said = f"invalid header Authorization: {request.headers['Authorization']}"
        return respond(400, errors=[error(6003, said, f"/x/{SECRET}")])

    client = Client(Token(SECRET), transport=httpx.MockTransport(echo), sleep=Sleeps())
    with client, pytest.raises(CloudflareAPIError) as info:
        client.list_routes(ZONE_ID)
    assert "invalid header Authorization: Bearer ***" in str(info.value)
    seen.exception("list_routes", info.value)
    seen.check()


def json_escaped(text: str) -> str:
    """Every character as a JSON \\u escape (what a proxy quoting JSON in JSON sends)."""
    return "".join(f"\\u{ord(c):04x}" for c in text)


ECHOES = {
    "as sent": lambda t: f"Bearer {t}",
    "upper case": lambda t: f"BEARER {t.upper()}",
    "lower case": lambda t: f"bearer {t.lower()}",
    "percent-encoded": lambda t: quote(f"Bearer {t}", safe=""),
    "percent-encoded, lower-case hex": lambda t: quote(t, safe="").lower(),
    "every byte percent-encoded": lambda t: "".join(f"%{b:02X}" for b in t.encode()),
    "form-encoded": quote_plus,
    "base64": lambda t: base64.b64encode(t.encode()).decode(),
    "URL-safe base64": lambda t: base64.urlsafe_b64encode(t.encode()).decode(),
    "base64 of the header": lambda t: base64.b64encode(f"Bearer {t}".encode()).decode(),
    "base64 of the whole header line": lambda t: base64.b64encode(
        f"Authorization: Bearer {t}".encode()
    ).decode(),
    "JSON-escaped": json_escaped,
    "JSON-escaped slashes": lambda t: json.dumps({"h": t}).replace("/", "\\/"),
    "hex": lambda t: t.encode().hex(),
    "upper-case hex": lambda t: t.encode().hex().upper(),
    "HTML entities": lambda t: "".join(f"&#{ord(c)};" for c in t),
    "base64 of its percent-encoding": lambda t: base64.b64encode(
        quote(t, safe="").encode()
    ).decode(),
    "its first 20 characters": lambda t: t[:20],
}


@pytest.mark.parametrize("echo", ECHOES)
def test_a_token_quoted_in_any_form_is_not_shown(echo: str, seen: Seen) -> None:
    """A proxy or server that quotes the token in its error message, pointer or
    CF-Entrypoint header, in any case or encoding: the message edgegen shows holds no form
    of it (the form is replaced by *** or the message withheld)."""
    quoted = ECHOES[echo](SECRET)

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/content/v2"):
            return httpx.Response(
                200,
                content=b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\nx\r\n--b--\r\n',
                headers={
                    "Content-Type": "multipart/form-data; boundary=b",
                    "CF-Entrypoint": quoted,
                },
            )
        return respond(400, errors=[error(6003, f"bad header: {quoted}", f"/x/{quoted}")])

    client = Client(Token(SECRET), transport=httpx.MockTransport(answer), sleep=Sleeps())
    with client:
        with pytest.raises(CloudflareAPIError) as info:
            client.list_routes(ZONE_ID)
        seen.exception("list_routes", info.value)
        with pytest.raises(CloudflareAPIError) as content:
            client.get_script_content(ACCOUNT_ID, "w")
        seen.exception("get_script_content", content.value)
    assert "HTTP 400" in str(info.value)
    assert "***" in str(info.value) or "withheld" in str(info.value)
    seen.check()
    for where, text in seen.texts:
        for piece in (SECRET[:12].lower(), SECRET[-12:].lower(), quoted.lower()):
            assert piece not in text.lower(), f"{echo} appears in {where}: {text[:300]!r}"


def test_a_long_message_is_cut_short(seen: Seen) -> None:
    """A message of a megabyte is quoted in its first few hundred characters, and of a
    hundred thousand errors the first hundred are quoted."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            return respond(400, errors=[error(6003, f"e{i}") for i in range(100_000)])
        return respond(400, errors=[error(6003, "x" * 2**20)])

    client = Client(Token(SECRET), transport=httpx.MockTransport(answer), sleep=Sleeps())
    with client:
        with pytest.raises(CloudflareAPIError) as info:
            client.list_routes(ZONE_ID)
        assert len(str(info.value)) < 1000
        assert "xxx..." in str(info.value)
        with pytest.raises(CloudflareAPIError) as many:
            client.send(client.put_entrypoint_write(ZONE_ID, {"rules": []}))
    assert len(many.value.errors) == 101
    assert str(many.value).endswith("e99; and 99,900 more errors); fix what it names and run again")


def test_a_proxy_password_is_never_shown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seen: Seen
) -> None:
    """A CLOUDFLARE_API_BASE_URL with a user and password (or a query) is refused (they
    would never be sent, only logged), and the refusal shows *** in their place, wherever
    the password ends (a '/' or '?' in it, no scheme)."""
    password = secrets.token_urlsafe(16)
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", SECRET)
    monkeypatch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
    run = runner(seen)
    for base in (
        f"https://user:{password}@proxy.example/client/v4",
        f"https://{password}@proxy.example/client/v4",
        f"ftp://user:{password}@proxy.example/",
        f"https://user:{password}/x@proxy.example/client/v4",
        f"https://user:{password}?x@proxy.example/client/v4",
        f"user:{password}@proxy.example/client/v4",
        f"http://user:{password}@proxy.example/client/v4",
        f"https://proxy.example/client/v4?key={password}",
        f"https://proxy.example/client/v4#{password}",
    ):
        monkeypatch.setenv("CLOUDFLARE_API_BASE_URL", base)
        assert run("plan", EXAMPLE) == 2
        assert run("apply", EXAMPLE, "--dry-run") == 2
    assert any("'https://***@proxy.example/client/v4'" in text for _, text in seen.texts)
    assert any("'https://proxy.example/client/v4?***'" in text for _, text in seen.texts)
    seen.check(password)
    seen.check()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_text(""), "is empty"),
        (lambda p: p.write_text("  \n\t\n"), "is empty"),
        (lambda p: p.write_text(f"{SECRET}\nsecond line"), "spaces, line breaks"),
        (lambda p: p.write_text(f"token = {SECRET}"), "spaces, line breaks"),
        (lambda p: p.write_bytes(SECRET.encode() + b"\xff"), "not UTF-8 text"),
        (lambda p: p.write_text(SECRET * 300), "longer than 4,096 bytes"),
        (lambda p: p.mkdir(), "Is a directory"),
    ],
    ids=["missing", "empty", "blank", "two lines", "assignment", "binary", "huge", "directory"],
)
def test_token_file_problems(
    make: Callable[[Path], object], says: str, tmp_path: Path, seen: Seen
) -> None:
    """A token file that cannot be used: exit 2, naming the file and what is wrong, never
    its content."""
    path = tmp_path / "token"
    make(path)
    with pytest.raises(UsageError) as info:
        Token.from_env({}, str(path))
    message = str(info.value)
    assert str(path) in message
    assert says in message
    seen.exception("Token.from_env", info.value)
    seen.check()


def test_an_unreadable_token_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: Seen
) -> None:
    """A token file without read permission (simulated: tests may run as root, who reads
    anything) names the reason and the file."""
    path = tmp_path / "token"
    path.write_text(SECRET)
    real_open = Path.open

    def refuse(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(UsageError, match="Permission denied") as info:
        Token.from_env({}, str(path))
    seen.exception("Token.from_env", info.value)
    seen.check()


def test_the_token_cannot_be_copied_out() -> None:
    """A Token shows *** in every form and refuses to be pickled, copied or serialised."""
    import copy
    import pickle

    token = Token(SECRET)
    for text in (repr(token), str(token), f"{token}", f"{token!r:>20}", "{}".format(token)):  # noqa: UP032 (format is a way tested)
        assert SECRET not in text
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy, json.dumps):
        with pytest.raises(TypeError):
            attempt(token)


class _Server(http.server.BaseHTTPRequestHandler):
    """A real HTTP server in front of the fake, so that httpcore's own code (and its DEBUG
    logging) runs."""

    fake: FakeCloudflare

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        request = httpx.Request(
            self.command,
            f"http://{self.headers['Host']}{self.path}",
            headers=list(self.headers.items()),
            content=body,
        )
        response = self.fake.handle(request)
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


def test_real_connections_log_no_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seen: Seen
) -> None:
    """Over a real socket (httpcore sends the request and logs each step at DEBUG), plan
    and apply leave no form of the token in any log record."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    port = server.server_address[1]
    base = f"http://127.0.0.1:{port}/client/v4"
    _Server.fake = FakeCloudflare(base_url=base, tokens={SECRET: PERMISSIONS})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        monkeypatch.setenv("CLOUDFLARE_API_TOKEN", SECRET)
        monkeypatch.setenv("CLOUDFLARE_API_BASE_URL", base)
        monkeypatch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
        monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
        monkeypatch.chdir(tmp_path)
        run = runner(seen)
        assert run("plan", EXAMPLE, "--out", "plan.json") == 0
        assert run("apply", "plan.json") == 0
        monkeypatch.setenv("CLOUDFLARE_API_TOKEN", SECRET + "x")
        assert run("plan", EXAMPLE) == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert _Server.fake.scripts  # the apply really went over the socket
    assert any(r.name.startswith("httpcore") for r in seen.logged())
    assert any(r.name == "httpx" for r in seen.logged())
    seen.check()
