"""The Cloudflare API client against the stateful fake: envelope, errors, retries, token."""

from __future__ import annotations

import ast
import gzip
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from cloudflare_fake import ACCOUNT_ID, BASE_URL, TOKEN, ZONE_ID, FakeCloudflare

from edgegen import (
    Client,
    CloudflareAPIError,
    Token,
    UsageError,
    cli,
)
from edgegen.cloudflare import _client, _retry, _transport
from edgegen.cloudflare._retry import RetryPolicy, parse_retry_after
from edgegen.cloudflare._state import UrlNormalization

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "policy.yaml"
RULE: dict[str, Any] = {
    "ref": "edgegen:login-1",
    "description": "login",
    "expression": 'http.request.uri.path eq "/login"',
    "action": "block",
    "ratelimit": {
        "characteristics": ["cf.colo.id", "ip.src"],
        "period": 60,
        "requests_per_period": 5,
        "mitigation_timeout": 60,
    },
}


class Sleeps(list[float]):
    """Records each wait instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture(autouse=True)
def no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every client here is given a sleep function; the real one must never run."""

    def refuse(seconds: float) -> None:
        raise AssertionError(f"a test tried to really sleep for {seconds} s")

    monkeypatch.setattr(_client, "_sleep", refuse)


@pytest.fixture
def fake() -> Iterator[FakeCloudflare]:
    """A fake zone, installed for the test."""
    zone = FakeCloudflare()
    with zone.mock():
        yield zone


@pytest.fixture
def sleeps() -> Sleeps:
    """The waits the client asked for."""
    return Sleeps()


@pytest.fixture
def client(sleeps: Sleeps) -> Iterator[Client]:
    """A client of the fake whose jitter is its upper bound (so waits are predictable)."""
    with Client(Token(TOKEN), sleep=sleeps, jitter=lambda low, high: high) as c:
        yield c


def put_rules(client: Client, rules: list[dict[str, Any]], **options: Any) -> Any:
    """PUT the entrypoint with these rules."""
    return client.send(
        client.put_entrypoint_write(ZONE_ID, {"description": "d", "rules": rules}, **options)
    )


def test_missing_entrypoint_reads_as_none(fake: FakeCloudflare, client: Client) -> None:
    """A zone without an entrypoint answers 404 with code 10003, which means "no rules"."""
    assert client.get_entrypoint(ZONE_ID) is None
    assert fake.log[-1].status == 404


def test_put_then_get_unwraps_the_envelope(fake: FakeCloudflare, client: Client) -> None:
    """A write returns the ruleset; each write makes a new version; ids are kept when sent."""
    first = put_rules(client, [RULE])
    assert first["version"] == "1"
    ruleset = client.get_entrypoint(ZONE_ID)
    assert ruleset is not None
    assert ruleset.version == "1"
    rule_id = ruleset.rules[0]["id"]
    changed = {**RULE, "id": rule_id, "ratelimit": {**RULE["ratelimit"], "requests_per_period": 6}}
    second = put_rules(client, [changed])
    assert second["version"] == "2"
    assert second["rules"][0]["id"] == rule_id
    assert second["rules"][0]["version"] == "2"


def test_dry_run_validates_without_saving(fake: FakeCloudflare, client: Client) -> None:
    """``?dry_run=true`` returns result null and leaves the zone as it was."""
    assert put_rules(client, [RULE], dry_run=True) is None
    assert fake.entrypoint is None
    assert fake.log[-1].query == "dry_run=true"


def test_invalid_rule_is_a_400_with_codes_and_pointers(
    fake: FakeCloudflare, client: Client
) -> None:
    """Every problem comes back, each with Cloudflare's code, message and JSON pointer."""
    # 50 s is no supported period on any plan (the fake's default plan is business).
    bad = {**RULE, "expression": "x" * 5000, "ratelimit": {**RULE["ratelimit"], "period": 50}}
    with pytest.raises(CloudflareAPIError) as info:
        put_rules(client, [bad])
    error = info.value
    assert error.status == 400
    assert error.pointers == ("/rules/0/expression", "/rules/0/ratelimit/period")
    assert len(error.codes) == 2
    assert "4096" in error.messages[0]
    assert "HTTP 400" in str(error)
    assert error.ambiguous is False


def test_plan_quota_is_enforced(fake: FakeCloudflare, client: Client) -> None:
    """More rules than the plan allows is rejected at /rules."""
    fake.plan = "pro"
    rules = [{**RULE, "ref": f"edgegen:r{i}"} for i in range(3)]
    with pytest.raises(CloudflareAPIError) as info:
        put_rules(client, rules)
    assert "/rules" in info.value.pointers


@pytest.mark.parametrize(
    ("tokens", "status", "fix"),
    [({}, 401, "valid, unexpired token"), ({TOKEN: frozenset({"routes"})}, 403, "Zone WAF")],
)
def test_bad_tokens(
    fake: FakeCloudflare, client: Client, tokens: dict[str, frozenset[str]], status: int, fix: str
) -> None:
    """An unknown token is 401, one without the permission 403; both say how to fix it."""
    fake.tokens = tokens
    with pytest.raises(CloudflareAPIError) as info:
        client.get_entrypoint(ZONE_ID)
    assert info.value.status == status
    assert info.value.codes == (10000,)
    assert fix in str(info.value)
    assert TOKEN not in str(info.value)


def test_a_wrong_zone_is_an_error_not_an_empty_zone(fake: FakeCloudflare, client: Client) -> None:
    """A 404 with another code (7003: no such zone) must not read as "no rules yet"."""
    with pytest.raises(CloudflareAPIError) as info:
        client.get_entrypoint("0" * 32)
    assert info.value.status == 404
    assert info.value.codes == (7003,)


def test_429_waits_for_retry_after(fake: FakeCloudflare, client: Client, sleeps: Sleeps) -> None:
    """Over the API limit, the client waits as long as Retry-After says, then succeeds."""
    fake.throttle(after=0, times=2, retry_after="3")
    assert client.list_routes(ZONE_ID) == ()
    assert sleeps == [3.0, 3.0]
    assert [r.status for r in fake.log] == [429, 429, 200]


def test_retry_after_beyond_the_cap_fails_at_once(
    fake: FakeCloudflare, client: Client, sleeps: Sleeps
) -> None:
    """A 5-minute block is not waited out: the error says how long Cloudflare asked."""
    fake.throttle(after=0, times=5, retry_after="300")
    with pytest.raises(CloudflareAPIError) as info:
        client.list_routes(ZONE_ID)
    assert info.value.status == 429
    assert info.value.retry_after == 300.0
    assert "wait 300 s" in str(info.value)
    assert sleeps == []


def test_5xx_is_retried_with_capped_exponential_backoff(
    fake: FakeCloudflare, sleeps: Sleeps
) -> None:
    """Idempotent requests are retried on 5xx; waits double from 0.5 s up to the cap."""
    fake.fail("GET", "/workers/routes", 502, times=4)
    retry = RetryPolicy(attempts=5, base_delay=0.5, max_delay=2.0)
    with Client(Token(TOKEN), sleep=sleeps, jitter=lambda lo, hi: hi, retry=retry) as c:
        assert c.list_routes(ZONE_ID) == ()
    assert sleeps == [0.5, 1.0, 2.0, 2.0]


def test_jitter_is_full_jitter(fake: FakeCloudflare, sleeps: Sleeps) -> None:
    """Each wait is drawn between 0 and the backoff delay."""
    fake.fail("GET", "/workers/routes", 503, times=2)
    seen: list[tuple[float, float]] = []

    def jitter(low: float, high: float) -> float:
        seen.append((low, high))
        return high / 4

    with Client(Token(TOKEN), sleep=sleeps, jitter=jitter) as c:
        c.list_routes(ZONE_ID)
    assert seen == [(0.0, 0.5), (0.0, 1.0)]
    assert sleeps == [0.125, 0.25]


def test_5xx_gives_up_after_the_attempts(fake: FakeCloudflare, client: Client) -> None:
    """After every attempt fails, the error says it is Cloudflare's side."""
    fake.fail("GET", "/entrypoint", 500, times=10)
    with pytest.raises(CloudflareAPIError) as info:
        client.get_entrypoint(ZONE_ID)
    assert info.value.status == 500
    assert "cloudflarestatus" in str(info.value)
    assert sum(1 for r in fake.log if r.status == 500) == 5


def test_post_is_not_retried_on_5xx(fake: FakeCloudflare, client: Client) -> None:
    """A POST that got a 5xx may have happened: not retried, marked ambiguous."""
    fake.set_script("w", "export default {}")
    fake.fail("POST", "/workers/routes", 500, after_write=True)
    with pytest.raises(CloudflareAPIError) as info:
        client.send(client.create_route_write(ZONE_ID, "a.example.com/*", "w"))
    assert info.value.ambiguous is True
    assert "may or may not" in str(info.value)
    assert len(fake.writes) == 1
    assert len(fake.routes) == 1


def test_post_is_retried_on_429(fake: FakeCloudflare, client: Client, sleeps: Sleeps) -> None:
    """A 429 means Cloudflare did nothing, so even a POST is retried."""
    fake.set_script("w", "export default {}")
    fake.throttle(after=0, times=1, retry_after="1")
    client.send(client.create_route_write(ZONE_ID, "a.example.com/*", "w"))
    assert sleeps == [1.0]
    assert len(fake.routes) == 1


def test_connection_errors_are_retried() -> None:
    """A connection that never opened is retried; the final error names the base URL."""
    sleeps = Sleeps()
    tries: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        tries.append(request)
        raise httpx.ConnectError("refused", request=request)

    with respx.mock(base_url=BASE_URL) as router:
        router.get(path__regex=r".*").mock(side_effect=refuse)
        with Client(Token(TOKEN), sleep=sleeps) as c, pytest.raises(CloudflareAPIError) as info:
            c.list_routes(ZONE_ID)
    assert info.value.status is None
    assert BASE_URL in str(info.value)
    assert len(sleeps) == 4
    assert len(tries) == 5


def test_timeout_on_a_write_is_ambiguous() -> None:
    """A PUT whose answer timed out is retried (PUT is idempotent), then reported ambiguous."""
    tries: list[httpx.Request] = []

    def slow(request: httpx.Request) -> httpx.Response:
        tries.append(request)
        raise httpx.ReadTimeout("slow", request=request)

    with respx.mock(base_url=BASE_URL) as router:
        router.put(path__regex=r".*").mock(side_effect=slow)
        with Client(Token(TOKEN), sleep=Sleeps()) as c, pytest.raises(CloudflareAPIError) as info:
            c.send(c.put_entrypoint_write(ZONE_ID, {"rules": []}))
    assert info.value.ambiguous is True
    assert len(tries) == 5


def test_timeout_on_a_post_is_not_retried() -> None:
    """A POST whose answer timed out may have happened: one try, reported ambiguous."""
    tries: list[httpx.Request] = []

    def slow(request: httpx.Request) -> httpx.Response:
        tries.append(request)
        raise httpx.ReadTimeout("slow", request=request)

    with respx.mock(base_url=BASE_URL) as router:
        router.post(path__regex=r".*").mock(side_effect=slow)
        with Client(Token(TOKEN), sleep=Sleeps()) as c, pytest.raises(CloudflareAPIError) as info:
            c.send(c.create_route_write(ZONE_ID, "a.example.com/*", "w"))
    assert info.value.ambiguous is True
    assert "after 1 attempt(s)" in str(info.value)
    assert len(tries) == 1


def test_an_answer_that_is_not_an_envelope() -> None:
    """A proxy's HTML page is not read as "missing": it is an error naming the proxy."""
    with respx.mock(base_url=BASE_URL) as router:
        router.get(path__regex=r".*").mock(return_value=httpx.Response(404, text="<html>no</html>"))
        with Client(Token(TOKEN), sleep=Sleeps()) as c, pytest.raises(CloudflareAPIError) as info:
            c.get_entrypoint(ZONE_ID)
    assert info.value.enveloped is False
    assert "CLOUDFLARE_API_BASE_URL" in str(info.value)


def test_success_false_on_200_is_an_error() -> None:
    """``success: false`` is an error even with HTTP 200."""
    body = {
        "success": False,
        "errors": [{"code": 1, "message": "no"}],
        "messages": [],
        "result": None,
    }
    with respx.mock(base_url=BASE_URL) as router:
        router.get(path__regex=r".*").mock(return_value=httpx.Response(200, json=body))
        with Client(Token(TOKEN), sleep=Sleeps()) as c, pytest.raises(CloudflareAPIError) as info:
            c.list_routes(ZONE_ID)
    assert info.value.codes == (1,)


def test_worker_upload_is_multipart_and_reads_back(fake: FakeCloudflare, client: Client) -> None:
    """The upload has a metadata part and a module part; settings and content read back."""
    binding = {
        "type": "ratelimit",
        "name": "RL_A",
        "namespace_id": "1001",
        "simple": {"limit": 5, "period": 60},
    }
    metadata = {
        "main_module": "worker.js",
        "compatibility_date": "2025-01-01",
        "bindings": [binding],
    }
    source = "// Generated by edgegen\nexport default { fetch() {} }\n"
    client.send(client.put_script_write(ACCOUNT_ID, "api", metadata, {"worker.js": source}))
    settings = client.get_script_settings(ACCOUNT_ID, "api")
    content = client.get_script_content(ACCOUNT_ID, "api")
    assert settings is not None and content is not None
    assert settings.bindings == (binding,)
    assert settings.compatibility_date == "2025-01-01"
    assert content.main_module == "worker.js"
    assert content.modules == {"worker.js": source.encode()}
    assert client.get_script_settings(ACCOUNT_ID, "other") is None
    assert client.get_script_content(ACCOUNT_ID, "other") is None


def test_a_bad_binding_is_rejected(fake: FakeCloudflare, client: Client) -> None:
    """The fake validates bindings like the API: a ratelimit period must be 10 or 60."""
    binding = {
        "type": "ratelimit",
        "name": "RL_A",
        "namespace_id": "1",
        "simple": {"limit": 5, "period": 30},
    }
    metadata = {
        "main_module": "worker.js",
        "compatibility_date": "2025-01-01",
        "bindings": [binding],
    }
    with pytest.raises(CloudflareAPIError) as info:
        client.send(
            client.put_script_write(ACCOUNT_ID, "api", metadata, {"worker.js": "export default {}"})
        )
    assert info.value.status == 400
    assert "10 or 60" in str(info.value)


def test_routes_create_conflict_and_delete(fake: FakeCloudflare, client: Client) -> None:
    """Routes: create, 409 for a taken pattern, delete (a gone route counts as deleted)."""
    fake.set_script("w", "export default {}")
    created = client.send(client.create_route_write(ZONE_ID, "a.example.com/*", "w"))
    with pytest.raises(CloudflareAPIError) as info:
        client.send(client.create_route_write(ZONE_ID, "a.example.com/*", "w"))
    assert info.value.status == 409
    (route,) = client.list_routes(ZONE_ID)
    assert (route.id, route.pattern, route.script) == (created["id"], "a.example.com/*", "w")
    client.send(client.delete_route_write(ZONE_ID, route.id, route.pattern))
    assert client.send(client.delete_route_write(ZONE_ID, route.id, route.pattern)) is None
    assert client.list_routes(ZONE_ID) == ()


def test_the_token_is_never_shown(fake: FakeCloudflare, client: Client) -> None:
    """Not in the Token's repr, the client's repr, a write's description or an error."""
    token = Token(TOKEN)
    assert TOKEN not in repr(token) + str(token) + f"{token}" + repr(client)
    write = client.put_entrypoint_write(ZONE_ID, {"rules": []})
    assert TOKEN not in write.describe(client.base_url)
    fake.tokens = {}
    with pytest.raises(CloudflareAPIError) as info:
        client.list_routes(ZONE_ID)
    assert TOKEN not in str(info.value) + repr(info.value.__dict__)
    with pytest.raises(TypeError):
        json.dumps(token)


@pytest.mark.parametrize("value", ["", "   ", "two words", "line\nbreak", "tökén"])
def test_bad_token_values_are_refused_without_echo(value: str) -> None:
    """An empty or malformed token is a UsageError that does not repeat the value."""
    with pytest.raises(UsageError) as info:
        Token(value)
    assert value.strip() == "" or value not in str(info.value)


def test_token_from_env_and_file(tmp_path: Any) -> None:
    """``--token-file`` wins over the variable; missing both names both."""
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    assert Token.from_env({}, str(path)).reveal() == TOKEN
    assert Token.from_env({"CLOUDFLARE_API_TOKEN": TOKEN}).reveal() == TOKEN
    with pytest.raises(UsageError, match="CLOUDFLARE_API_TOKEN or pass --token-file"):
        Token.from_env({})
    with pytest.raises(UsageError, match="does not exist"):
        Token.from_env({}, str(tmp_path / "nope"))


def test_base_url_from_env() -> None:
    """The base URL comes from CLOUDFLARE_API_BASE_URL and must be http(s)."""
    assert _transport.base_url_from_env({}) == "https://api.cloudflare.com/client/v4"
    proxy = {"CLOUDFLARE_API_BASE_URL": "https://proxy.local:8443/cf/"}
    assert _transport.base_url_from_env(proxy) == "https://proxy.local:8443/cf"
    with pytest.raises(UsageError, match="not an http"):
        _transport.base_url_from_env({"CLOUDFLARE_API_BASE_URL": "ftp://x"})


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/client/v4",
        "http://127.9.8.7/",
        "http://[::1]:8080/client/v4",
        "http://localhost:8080",
        "http://LOCALHOST./cf",
        "https://proxy.example/cf",
    ],
)
def test_plain_http_only_to_this_machine(url: str) -> None:
    """The token travels in clear text over http://, so only a loopback address may be
    reached that way (a local proxy or test server)."""
    assert _transport.base_url_from_env({"CLOUDFLARE_API_BASE_URL": url}) == url.rstrip("/")
    Client(Token(TOKEN), base_url=url).close()


@pytest.mark.parametrize(
    "url",
    [
        "http://proxy.example/cf",
        "http://api.cloudflare.com/client/v4",
        "http://localhost.evil.example/",
        "http://127.0.0.1.nip.io/",
        "http://10.0.0.1:8080/",
        "http://[::2]/",
    ],
)
def test_plain_http_elsewhere_is_refused(url: str) -> None:
    """http:// to any other host is refused before any request, saying to use https://."""
    with pytest.raises(UsageError, match="https://") as info:
        _transport.base_url_from_env({"CLOUDFLARE_API_BASE_URL": url})
    assert "the API token would travel in clear text" in str(info.value)
    with pytest.raises(UsageError, match="https://"):
        Client(Token(TOKEN), base_url=url)


def test_requests_go_through_the_configured_base_url(sleeps: Sleeps) -> None:
    """A proxy base URL with a path prefix is where every request goes."""
    proxy = FakeCloudflare(base_url="https://proxy.local:8443/cf/client/v4")
    with proxy.mock(), Client(Token(TOKEN), base_url=proxy.base_url, sleep=sleeps) as c:
        assert c.get_entrypoint(ZONE_ID) is None
    assert proxy.log[0].path.startswith("/cf/client/v4/zones/")


def test_timeouts_are_explicit() -> None:
    """Every request has connect and read timeouts."""
    timeout = _transport.DEFAULT_TIMEOUT
    assert timeout.connect == 10.0
    assert timeout.read == 30.0


def test_parse_retry_after() -> None:
    """Retry-After is seconds or an HTTP date; anything else is ignored."""
    from datetime import UTC, datetime

    now = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:30 GMT", now) == 30.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


# --- deadlines and answer sizes --------------------------------------------------------


class Trickle:
    """A real HTTP server on a loopback port that sends its answer one byte at a time,
    every ``pace`` seconds (``head`` first if given, so only the body trickles)."""

    def __init__(self, head: bytes = b"", pace: float = 0.2) -> None:
        self.head = head
        self.pace = pace
        self.stop = threading.Event()
        self.connections = 0
        self.sent = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.threads: list[threading.Thread] = []

    @property
    def base_url(self) -> str:
        """The client's base URL for this server."""
        return f"http://127.0.0.1:{self.port}/client/v4"

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self.server.close()
        for thread in self.threads:
            thread.join(5)

    def _serve(self) -> None:
        self.server.settimeout(0.05)
        while not self.stop.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connection.settimeout(5)
            self.connections += 1
            thread = threading.Thread(target=self._answer, args=(connection,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _answer(self, connection: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        body = json.dumps({"success": True, "errors": [], "messages": [], "result": []})
        answer += f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        with connection:
            received = b""
            while b"\r\n\r\n" not in received:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                received += chunk
            try:
                if self.head:
                    connection.sendall(self.head)
                    answer = b"x" * 10_000
                for byte in answer:
                    if self.stop.wait(self.pace):
                        return
                    connection.sendall(bytes([byte]))
                    self.sent += 1
            except OSError:
                return


BODY_TRICKLES = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n"
)


@pytest.mark.parametrize("head", [b"", BODY_TRICKLES], ids=["headers", "body"])
def test_a_trickling_answer_is_cut_off_at_the_request_deadline(head: bytes) -> None:
    """A server that sends a byte every 0.2 s never trips a read timeout; the request's
    wall-clock deadline stops it anyway, whether the headers or the body trickle."""
    with Trickle(head) as server:
        client = Client(
            Token(TOKEN),
            base_url=server.base_url,
            retry=RetryPolicy(attempts=1),
            timeout=httpx.Timeout(3.0),
            request_deadline=1.0,
            sleep=Sleeps(),
        )
        started = time.monotonic()
        with client, pytest.raises(CloudflareAPIError) as info:
            client.list_routes(ZONE_ID)
        elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 2.5
    assert info.value.status is None
    assert "within the request deadline of 1 s" in str(info.value)
    assert server.sent < 20


def test_the_command_deadline_bounds_every_retry(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """edgegen plan against a trickling server: each try stops at the request deadline,
    and the command gives up at its own deadline (2.5 s) rather than after five tries."""
    monkeypatch.setattr(_transport, "REQUEST_DEADLINE", 1.0)
    monkeypatch.setattr(_transport, "COMMAND_DEADLINE", 2.5)
    monkeypatch.setattr(_client, "_sleep", Sleeps())
    # No backoff between tries: the recorded waits take no time but count against the
    # command's deadline, so random ones would end the command early in real time (after
    # two tries, at about 2 s) as often as not.
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    with Trickle() as server:
        monkeypatch.setenv("CLOUDFLARE_API_BASE_URL", server.base_url)
        monkeypatch.setenv("CLOUDFLARE_API_TOKEN", TOKEN)
        monkeypatch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
        monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
            monkeypatch.delenv(name, raising=False)
        started = time.monotonic()
        code = cli.main(["plan", str(EXAMPLE)])
        elapsed = time.monotonic() - started
        connections = server.connections
    err = capsys.readouterr().err
    assert code == 1
    assert 2.4 <= elapsed < 4.5, err
    assert 2 <= connections < 5
    assert "the 2.5 s deadline of one command" in err
    assert "Traceback" not in err


def endless(chunk: bytes, taken: list[int]) -> Iterator[bytes]:
    """An answer body that never ends; ``taken`` counts the chunks read from it."""
    while True:
        taken.append(1)
        yield chunk


def test_an_endless_answer_stops_at_the_size_cap() -> None:
    """An answer over the cap (16 MiB by default) is refused once the cap is passed: the
    body is not read further and not kept."""
    taken: list[int] = []
    chunk = b"x" * 65536

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless(chunk, taken))

    with (
        Client(
            Token(TOKEN),
            transport=httpx.MockTransport(answer),
            max_response_bytes=2**20,
            sleep=Sleeps(),
        ) as client,
        pytest.raises(CloudflareAPIError) as info,
    ):
        client.list_routes(ZONE_ID)
    assert "larger than 1 MiB" in str(info.value)
    assert len(taken) <= 2**20 // len(chunk) + 2
    assert _transport.MAX_RESPONSE_BYTES == 16 * 2**20


def test_a_declared_length_over_the_cap_is_not_read() -> None:
    """A Content-Length over the cap is refused before the body is read."""
    taken: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"Content-Length": str(2**40)}, content=endless(b"x", taken)
        )

    with (
        Client(Token(TOKEN), transport=httpx.MockTransport(answer), sleep=Sleeps()) as client,
        pytest.raises(CloudflareAPIError) as info,
    ):
        client.send(client.put_entrypoint_write(ZONE_ID, {"rules": []}))
    assert "larger than 16 MiB" in str(info.value)
    assert info.value.ambiguous is True
    assert taken == []


def test_a_compressed_answer_is_refused() -> None:
    """edgegen asks for answers without Content-Encoding; a compressed one (a zip bomb
    would pass any size cap) is not decoded."""
    seen: list[str] = []
    bomb = gzip.compress(b"{" * 2**20)

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Accept-Encoding"])
        return httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=bomb)

    with (
        Client(Token(TOKEN), transport=httpx.MockTransport(answer), sleep=Sleeps()) as client,
        pytest.raises(CloudflareAPIError) as info,
    ):
        client.list_routes(ZONE_ID)
    assert seen[0] == "identity"
    assert "Content-Encoding" in str(info.value)


# --- the zone's URL normalisation setting ----------------------------------------------


def test_url_normalization_is_read(fake: FakeCloudflare, client: Client) -> None:
    """GET /zones/{zone}/url_normalization: scope and type, unwrapped from the envelope."""
    assert client.get_url_normalization(ZONE_ID) == UrlNormalization("incoming", "cloudflare")
    fake.url_normalization = {"scope": "none", "type": "rfc3986"}
    assert client.get_url_normalization(ZONE_ID) == UrlNormalization("none", "rfc3986")
    assert fake.log[-1].path.endswith(f"/zones/{ZONE_ID}/url_normalization")


def test_url_normalization_needs_zone_settings_read(fake: FakeCloudflare, client: Client) -> None:
    """A token without Zone Settings permission gets a 403 naming it."""
    fake.tokens = {TOKEN: frozenset({"waf", "scripts", "routes"})}
    with pytest.raises(CloudflareAPIError) as info:
        client.get_url_normalization(ZONE_ID)
    assert info.value.status == 403
    assert "Zone > Zone Settings > Read" in str(info.value)
    assert "URL normalisation setting of zone" in str(info.value)


@pytest.mark.parametrize("result", [None, [], {"scope": "none"}, {"scope": 1, "type": "x"}])
def test_a_setting_that_is_not_one_is_an_error(result: Any) -> None:
    """An answer without a scope and a type is an unclear read: an error, not a guess."""
    body = {"success": True, "errors": [], "messages": [], "result": result}
    with respx.mock(base_url=BASE_URL) as router:
        router.get(path__regex=r".*").mock(return_value=httpx.Response(200, json=body))
        with Client(Token(TOKEN), sleep=Sleeps()) as c, pytest.raises(CloudflareAPIError) as info:
            c.get_url_normalization(ZONE_ID)
    assert "answered, but not with a" in str(info.value)


# --- the retry decision, as a value ----------------------------------------------------


def decide(tried: _retry.Tried, *, method: str = "GET", retry: int = 0, done: bool = False) -> Any:
    """The decision for one try of ``method``; backoff waits are their upper bound."""
    return _retry.decide(
        RetryPolicy(),
        _retry.RetryRequest.of(method),
        retry,
        tried,
        maybe_done=done,
        jitter=lambda low, high: high,
    )


def test_the_retry_decision_is_a_pure_function() -> None:
    """What a try gave decides what comes next, with no network and no clock: 2xx is done,
    Retry-After is honoured up to the cap, 5xx backs off, a POST is retried only when
    Cloudflare certainly did not act, and a write whose answer was lost is ambiguous."""
    answer = _retry.Tried
    assert decide(answer("answer", 200)).action == "done"
    assert decide(answer("answer", 429, 3.0)) == _retry.Decision("retry", 3.0)
    assert decide(answer("answer", 429, 300.0)).action == "fail"
    assert decide(answer("answer", 503), retry=2) == _retry.Decision("retry", 2.0)
    assert decide(answer("answer", 503), retry=4).action == "fail"
    assert decide(answer("answer", 400)).action == "fail"
    put = decide(answer("answer", 502), method="PUT")
    assert put == _retry.Decision("retry", 0.5, maybe_done=True)
    assert decide(answer("answer", 502), method="POST").action == "fail"
    assert decide(answer("answer", 429, 1.0), method="POST").action == "retry"
    assert decide(answer("unsent"), method="POST").action == "retry"
    assert decide(answer("unsent"), retry=4, done=True) == _retry.Decision(
        "fail", ambiguous=False, maybe_done=True
    )
    lost = decide(answer("unanswered"), method="POST")
    assert (lost.action, lost.ambiguous) == ("fail", True)
    assert decide(answer("unanswered"), method="GET").ambiguous is False
    late = decide(answer("deadline", cut_short=True), method="PUT")
    assert (late.action, late.ambiguous) == ("give_up", True)
    assert decide(answer("unusable"), method="DELETE") == _retry.Decision("fail", ambiguous=True)


def test_only_the_transport_talks_http() -> None:
    """httpx is imported, outside type checking, by one module of edgegen only."""
    importing = []
    package = Path(__file__).resolve().parents[2] / "edgegen"
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        checked = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for node in ast.walk(block)
        }
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if id(node) not in checked and any(n.split(".")[0] == "httpx" for n in names):
                importing.append(path.relative_to(package).as_posix())
    assert importing == ["cloudflare/_transport.py"]
