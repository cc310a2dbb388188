"""Request facts and client IPs: the pure part of the middleware, without a server."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

import edgegen_policy as policy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applimit.asgi import Caller
from applimit.web import _request
from applimit.web._client_ip import UNKNOWN_IP, TrustedProxies, parse_ip
from applimit.web._gate import Gate
from applimit.web._request import RequestInfo


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
        # What uvicorn puts in "path": the target's path, percent-decoded, read as UTF-8.
        "path": unquote_to_bytes(path.split(b"?")[0]).decode("utf-8", "replace"),
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


def test_asgi_request_path_is_the_routers_path() -> None:
    """``path`` is the decoded path the router matches; the host loses its port and case."""
    info = RequestInfo.from_asgi(asgi_scope(b"/api/../api/./caf%C3%A9"))
    assert info.path == "/api/../api/./caf\u00e9"
    assert info.raw_path == "/api/../api/./caf%C3%A9"
    assert info.host == "api.example.com"
    assert info.peer == "203.0.113.9"
    assert info.query_string == "q=1"
    assert info.kind == "asgi"


@pytest.mark.parametrize(
    ("raw", "limit"),
    [
        (b"/l%6Fgin", "/login"),
        (b"/%6cogin", "/login"),
        (b"/%61pi/items", "/api/"),
        (b"/api%2Fitems", "/api/"),
        (b"/api/%73earch", "/api/search"),
        (b"//api/items", "/api/"),
        (b"/api/%2e%2e/login", "/login"),
    ],
)
def test_asgi_encoded_spellings_reach_the_limit(raw: bytes, limit: str) -> None:
    """Spellings a router serves as a limited route are matched by that route's limit."""
    info = RequestInfo.from_asgi(asgi_scope(raw))
    forms = policy.request_paths(info.path)
    if limit.endswith("/"):
        assert any(form.startswith(limit) for form in forms), forms
    else:
        assert limit in forms, forms


def test_asgi_request_without_a_decoded_path_decodes_raw_path() -> None:
    """A server that leaves out ``path`` gets the raw target decoded as a router would."""
    scope = asgi_scope(b"/api/%2e%2e/l%6Fgin")
    del scope["path"]
    assert RequestInfo.from_asgi(scope).path == "/api/../login"


def test_asgi_request_without_raw_path_or_host_header() -> None:
    """Servers may omit raw_path and a client may omit Host: the decoded path and the
    server address stand in."""
    scope = asgi_scope(b"/api/x", headers=[])
    del scope["raw_path"]
    info = RequestInfo.from_asgi(scope)
    assert info.path == "/api/x"
    assert info.host == "127.0.0.1"


def test_wsgi_request_reads_headers_and_path_info() -> None:
    """HTTP_* keys become lower-case header names; PATH_INFO (what the router matches) is
    the path, REQUEST_URI the raw target."""
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
    assert info.path == "/api/a b"
    assert info.raw_path == "/api/a%20b"
    assert info.host == "hooks.example.com"
    assert info.header("X-Api-Key") == "k"
    assert info.header("content-type") == "application/json"
    assert info.peer == "198.51.100.4"
    assert info.kind == "wsgi"


def _headers_as_cgi_says(environ: dict[str, object]) -> tuple[tuple[str, str], ...]:
    """The headers of a WSGI environ, worked out afresh for every key (CGI's rules)."""
    found: list[tuple[str, str]] = []
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            found.append((key[5:].replace("_", "-").lower(), str(value)))
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            found.append((key.replace("_", "-").lower(), str(value)))
    return tuple(found)


_ENVIRON_KEYS = st.one_of(
    st.sampled_from(
        [
            "HTTP_HOST",
            "HTTP_X_USER",
            "HTTP_CONTENT_TYPE",
            "CONTENT_TYPE",
            "CONTENT_LENGTH",
            "SERVER_NAME",
            "wsgi.input",
            "HTTP_",
            "HTTP",
            "CONTENT_MD5",
        ]
    ),
    st.from_regex(r"HTTP_[A-Za-z0-9_]{1,12}", fullmatch=True),
    st.text(max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_ENVIRON_KEYS, st.one_of(st.just(""), st.text(max_size=8), st.integers())))
def test_wsgi_headers_are_cgis_whatever_the_keys(extra: dict[str, object]) -> None:
    """from_wsgi remembers what each environ key is (a header and its name, or not one):
    the headers it reads are those CGI's rules give, key by key, for any keys and values
    (empty CONTENT_* left out, an empty HTTP_* kept, a value that is not a str as text)."""
    environ: dict[str, object] = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", **extra}
    for _ in range(2):  # the first read remembers the keys, the second reads them back
        assert RequestInfo.from_wsgi(environ).headers == _headers_as_cgi_says(environ)


def test_wsgi_header_names_remembered_up_to_a_bound() -> None:
    """Header names are the client's: past the bound, new names are worked out on every
    request and not kept, and every request still reads its own headers."""
    limit = _request._HEADER_OF_LIMIT
    for n in range(limit + 500):
        environ = {"PATH_INFO": "/", f"HTTP_X_BOUND_{n}": str(n), "HTTP_HOST": "example.com"}
        info = RequestInfo.from_wsgi(environ)
        assert info.header(f"x-bound-{n}") == str(n)
        assert info.header("host") == "example.com"
    assert len(_request._HEADER_OF) <= limit


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from([b"host", b"Host", b"X-User", b"x-user", b"HOST"]),
                st.binary(max_size=10),
            ),
            st.binary(max_size=10),
            st.booleans(),
        ),
        max_size=8,
    )
)
def test_asgi_headers_are_read_whatever_the_names(
    pairs: list[tuple[bytes, bytes, bool]],
) -> None:
    """from_asgi remembers each header name it has lower-cased: for any names (upper
    case, latin-1 bytes, bytearray as well as bytes), the headers are the scope's, each
    name decoded as latin-1 and lower-cased, each value decoded, in order."""
    raw = [(bytearray(n) if as_array else n, v) for n, v, as_array in pairs]
    scope = {"type": "http", "method": "GET", "path": "/", "headers": raw}
    expected = tuple((bytes(n).decode("latin-1").lower(), v.decode("latin-1")) for n, v in raw)
    for _ in range(2):  # the first read remembers the names, the second reads them back
        assert RequestInfo.from_asgi(scope).headers == expected


def test_asgi_header_names_remembered_up_to_a_bound() -> None:
    """Header names are the client's: past the bound, new names are decoded on every
    request and not kept, and every request still reads its own headers."""
    limit = _request._NAME_OF_LIMIT
    for n in range(limit + 500):
        headers = [(f"X-Bound-{n}".encode(), str(n).encode()), (b"host", b"example.com")]
        info = RequestInfo.from_asgi({"type": "http", "path": "/", "headers": headers})
        assert info.header(f"x-bound-{n}") == str(n)
        assert info.host == "example.com"
    assert len(_request._NAME_OF) <= limit


def test_wsgi_path_info_is_read_as_utf8() -> None:
    """PATH_INFO is WSGI's latin-1 view of the bytes; the router reads them as UTF-8."""
    environ = {"SCRIPT_NAME": "/app", "PATH_INFO": "/caf\xc3\xa9", "REMOTE_ADDR": "::1"}
    assert RequestInfo.from_wsgi(environ).path == "/app/caf\u00e9"


def test_wsgi_decoded_slash_in_path_info_is_the_routers_path() -> None:
    """waitress decodes ``/api%2Fitems`` to ``/api/items`` in PATH_INFO: that is the path."""
    environ = {"PATH_INFO": "/api/items", "REQUEST_URI": "/api%2Fitems", "REMOTE_ADDR": "::1"}
    assert RequestInfo.from_wsgi(environ).path == "/api/items"


def test_absolute_form_targets_keep_their_raw_path() -> None:
    """``GET http://host/api/x``: the router's path is PATH_INFO; raw_path drops the origin."""
    environ = {
        "REQUEST_URI": "HTTP://api.example.com/api/x?y=1",
        "PATH_INFO": "/api/x",
        "REMOTE_ADDR": "::1",
    }
    assert RequestInfo.from_wsgi(environ).raw_path == "/api/x"
    scope = asgi_scope(b"http://h/api/../login")
    del scope["path"]
    assert RequestInfo.from_asgi(scope).path == "/api/../login"


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


def test_unknown_tiers_are_remembered_up_to_a_bound(caplog: pytest.LogCaptureFixture) -> None:
    """Tiers invented by a client through identify() are logged once each, but the gate
    remembers at most MAX_WARNED_TIERS of them: memory stays bounded."""
    from applimit.web._gate import MAX_WARNED_TIERS

    gate = Gate(tiers=["free", "pro"])
    info = request("203.0.113.9")
    with caplog.at_level("WARNING", logger="applimit"):
        for n in range(MAX_WARNED_TIERS * 4):
            assert gate.subject(info, Caller("u", tier=f"t{n}")).tier == "free"
        gate.subject(info, Caller("u", tier="t0"))
    assert len(gate._warned_tiers) == MAX_WARNED_TIERS
    assert len(caplog.records) == MAX_WARNED_TIERS


@pytest.mark.parametrize("tier", [5, ["pro"], {"t": 1}, b"pro"])
def test_a_tier_that_is_not_a_str_counts_as_the_lowest(tier: object) -> None:
    """A tier shaped by a client (a JSON claim: a number, a list) never raises out of the
    gate: the caller is counted in the lowest tier."""
    gate = Gate(tiers=["free", "pro"])
    caller = Caller("u", tier=tier)  # type: ignore[arg-type]
    assert gate.subject(request("203.0.113.9"), caller).tier == "free"
