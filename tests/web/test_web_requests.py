"""Request facts and client IPs: the pure part of the middleware, without a server."""

from __future__ import annotations

import pytest

from applimit._web import UNKNOWN_IP, Gate, RequestInfo, TrustedProxies, parse_ip
from applimit.asgi import Caller


def asgi_scope(
    path: bytes = b"/api/items",
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    client: tuple[str, int] | None = ("203.0.113.9", 5555),
    method: str = "GET",
) -> dict[str, object]:
    """A minimal ASGI http scope, as uvicorn builds it."""
    return {
        "type": "http",
        "method": method,
        "path": path.decode("latin-1"),
        "raw_path": path,
        "query_string": b"q=1",
        "headers": headers if headers is not None else [(b"host", b"API.Example.com:8443")],
        "client": client,
        "server": ("127.0.0.1", 8000),
    }


def request(peer: str | None, *headers: tuple[str, str]) -> RequestInfo:
    """A RequestInfo with a peer and headers (names lower-cased like the builders do)."""
    return RequestInfo(
        method="GET",
        path="/",
        raw_path="/",
        host="",
        headers=tuple((k.lower(), v) for k, v in headers),
        peer=peer,
    )


# --- RequestInfo -------------------------------------------------------------------------


def test_asgi_request_is_normalised_like_the_edge() -> None:
    """The raw path is normalised (dot segments, percent-encoding) and the host loses its
    port and case, so a policy matcher sees what Cloudflare sees."""
    info = RequestInfo.from_asgi(asgi_scope(b"/api/../api/./caf\xc3\xa9"))
    assert info.path == "/api/caf%C3%A9"
    assert info.host == "api.example.com"
    assert info.peer == "203.0.113.9"
    assert info.query_string == "q=1"
    assert info.kind == "asgi"


def test_asgi_request_prefers_raw_path_over_the_decoded_path() -> None:
    """An encoded dot segment in raw_path is resolved the way the edge resolves it."""
    scope = asgi_scope(b"/api/%2e%2e/login")
    scope["path"] = "/api/../login"
    assert RequestInfo.from_asgi(scope).path == "/login"


def test_asgi_request_without_raw_path_or_host_header() -> None:
    """Servers may omit raw_path and a client may omit Host: the decoded path and the
    server address stand in."""
    scope = asgi_scope(b"/api/x", headers=[])
    del scope["raw_path"]
    info = RequestInfo.from_asgi(scope)
    assert info.path == "/api/x"
    assert info.host == "127.0.0.1"


def test_wsgi_request_reads_headers_and_the_raw_uri() -> None:
    """HTTP_* keys become lower-case header names; REQUEST_URI (the undecoded target) wins
    over PATH_INFO."""
    environ = {
        "REQUEST_METHOD": "post",
        "PATH_INFO": "/api/a b",
        "REQUEST_URI": "/api/a%20b?x=1",
        "QUERY_STRING": "x=1",
        "HTTP_HOST": "Hooks.Example.com",
        "HTTP_X_API_KEY": "k",
        "CONTENT_TYPE": "application/json",
        "REMOTE_ADDR": "198.51.100.4",
    }
    info = RequestInfo.from_wsgi(environ)
    assert info.method == "POST"
    assert info.path == "/api/a%20b"
    assert info.host == "hooks.example.com"
    assert info.header("X-Api-Key") == "k"
    assert info.header("content-type") == "application/json"
    assert info.peer == "198.51.100.4"
    assert info.kind == "wsgi"


def test_wsgi_request_without_a_raw_uri_re_encodes_path_info() -> None:
    """PATH_INFO is WSGI's latin-1 view of the bytes; it is percent-encoded again."""
    environ = {"SCRIPT_NAME": "/app", "PATH_INFO": "/caf\xc3\xa9", "REMOTE_ADDR": "::1"}
    assert RequestInfo.from_wsgi(environ).path == "/app/caf%C3%A9"


def test_absolute_form_targets_are_matched_by_their_path() -> None:
    """``GET http://host/api/x`` is the path /api/x, whichever server passed it on."""
    environ = {"REQUEST_URI": "HTTP://api.example.com/api/x?y=1", "REMOTE_ADDR": "::1"}
    assert RequestInfo.from_wsgi(environ).path == "/api/x"
    assert RequestInfo.from_wsgi({"REQUEST_URI": "https://api.example.com"}).path == "/"
    assert RequestInfo.from_asgi(asgi_scope(b"http://h/api/../login")).path == "/login"


def test_bearer_tokens_cookies_and_repeated_headers() -> None:
    """The helpers identify() functions use read what clients send, and ignore junk."""
    info = request(
        "10.0.0.1",
        ("authorization", "Bearer  abc "),
        ("cookie", "a=1; session=s3"),
        ("x-tag", "one"),
        ("x-tag", "two"),
    )
    assert info.bearer_token() == "abc"
    assert info.cookie("session") == "s3"
    assert info.cookie("missing") is None
    assert info.header_values("X-Tag") == ["one", "two"]
    assert request(None, ("authorization", "Basic eA==")).bearer_token() is None
    assert request(None, ("cookie", 'bad"cookie')).cookie("bad") is None


# --- client IPs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.2.3.4", "1.2.3.4"),
        (" 1.2.3.4:5678 ", "1.2.3.4"),
        ("::1", "::1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ('"[2001:DB8::1]"', "2001:db8::1"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
        ("unknown", None),
        ("[::1", None),
        ("", None),
    ],
)
def test_parse_ip(text: str, expected: str | None) -> None:
    """Addresses are read with or without ports and brackets and put in canonical form."""
    parsed = parse_ip(text)
    assert (str(parsed) if parsed is not None else None) == expected


def test_untrusted_peer_is_the_client_whatever_the_headers_say() -> None:
    """Without trust, X-Forwarded-For and CF-Connecting-IP are a client's claims: ignored."""
    proxies = TrustedProxies(["10.0.0.0/8"], behind_cloudflare=True)
    info = request("203.0.113.9", ("x-forwarded-for", "1.1.1.1"), ("cf-connecting-ip", "2.2.2.2"))
    assert proxies.client_ip(info) == "203.0.113.9"
    assert TrustedProxies().client_ip(request("203.0.113.9", ("x-forwarded-for", "1.1.1.1"))) == (
        "203.0.113.9"
    )


def test_forwarded_for_is_walked_right_to_left_past_trusted_hops() -> None:
    """The first untrusted address from the right is the client; a spoofed entry to its
    left (the client's own header) is never reached."""
    proxies = TrustedProxies(["10.0.0.0/8", "192.0.2.7"])
    info = request(
        "10.1.2.3",
        ("x-forwarded-for", "6.6.6.6, 198.51.100.20"),
        ("x-forwarded-for", "192.0.2.7"),
    )
    assert proxies.client_ip(info) == "198.51.100.20"


def test_all_hops_trusted_gives_the_leftmost() -> None:
    """Traffic from inside the trusted network: the farthest hop is the client."""
    proxies = TrustedProxies(["10.0.0.0/8"])
    info = request("10.0.0.1", ("x-forwarded-for", "10.9.9.9, 10.0.0.2"))
    assert proxies.client_ip(info) == "10.9.9.9"
    assert proxies.client_ip(request("10.0.0.1")) == "10.0.0.1"


def test_garbage_in_forwarded_for_stops_at_the_nearest_trusted_hop() -> None:
    """An unparsable hop cannot become a per-request key: the nearest hop we trust is used."""
    proxies = TrustedProxies(["10.0.0.0/8"])
    info = request("10.0.0.1", ("x-forwarded-for", "1.1.1.1, not-an-ip, 10.0.0.5"))
    assert proxies.client_ip(info) == "10.0.0.5"


def test_cloudflare_header_is_used_only_when_told_and_from_a_trusted_peer() -> None:
    """CF-Connecting-IP wins over X-Forwarded-For behind Cloudflare; otherwise it is ignored."""
    headers = (("cf-connecting-ip", "2001:db8::7"), ("x-forwarded-for", "198.51.100.1"))
    cloudflare = TrustedProxies(["173.245.48.0/20"], behind_cloudflare=True)
    assert cloudflare.client_ip(request("173.245.48.1", *headers)) == "2001:db8::7"
    plain = TrustedProxies(["173.245.48.0/20"])
    assert plain.client_ip(request("173.245.48.1", *headers)) == "198.51.100.1"
    # A bad CF-Connecting-IP falls back to the forwarding chain.
    bad = request("173.245.48.1", ("cf-connecting-ip", "nope"), ("x-forwarded-for", "192.0.2.1"))
    assert cloudflare.client_ip(bad) == "192.0.2.1"


def test_unix_socket_peers_and_unknown_peers() -> None:
    """A peer without an address is trusted only when "unix" is listed; with nothing to go
    on, all such callers share one bucket."""
    assert TrustedProxies().client_ip(request(None, ("x-forwarded-for", "1.2.3.4"))) == (UNKNOWN_IP)
    unix = TrustedProxies(["unix"])
    assert unix.client_ip(request(None, ("x-forwarded-for", "1.2.3.4"))) == "1.2.3.4"
    assert TrustedProxies().client_ip(request("testclient")) == "testclient"


def test_ipv4_mapped_peers_are_matched_against_ipv4_networks() -> None:
    """A dual-stack socket reports ::ffff:10.0.0.1; it is still the trusted 10.0.0.1."""
    proxies = TrustedProxies(["10.0.0.0/8"])
    info = request("::ffff:10.0.0.1", ("x-forwarded-for", "198.51.100.3"))
    assert proxies.client_ip(info) == "198.51.100.3"


def test_a_bad_trusted_proxy_entry_is_refused_with_the_fix() -> None:
    """A typo in the trusted list must fail at start-up, not trust nothing silently."""
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33' is not an IP address or CIDR"):
        TrustedProxies(["10.0.0.0/33"])


# --- subjects ----------------------------------------------------------------------------


def test_subjects_anonymous_known_and_unknown_tiers(caplog: pytest.LogCaptureFixture) -> None:
    """Anonymous callers are counted by IP in the lowest tier; a caller without a tier or
    with a tier the policy does not list is counted in the lowest tier (logged once)."""
    gate = Gate(tiers=("free", "pro"))
    info = request("198.51.100.1")
    anon = gate.subject(info, None)
    assert (anon.identity, anon.tier, anon.ip) == (None, "free", "198.51.100.1")
    assert gate.subject(info, Caller("u1", "pro")).tier == "pro"
    assert gate.subject(info, Caller("u1")).tier == "free"
    with caplog.at_level("WARNING", logger="applimit"):
        assert gate.subject(info, Caller("u1", "platinum")).tier == "free"
        assert gate.subject(info, Caller("u2", "platinum")).tier == "free"
    assert sum("platinum" in r.getMessage() for r in caplog.records) == 1
