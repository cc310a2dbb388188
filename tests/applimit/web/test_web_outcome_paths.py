"""The gate's two ways to a response's headers agree, and so do the client IP's.

``Gate.answer`` formats one admitting, enforced result (most responses) on a path of its
own, with each limit's RateLimit-Policy member made once; ``TrustedProxies.client_ip``
remembers the answer for a peer that alone decides it. Each shortcut must give what the
general code gives, header for header and address for address.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from applimit import Decision, LimitResult
from applimit._decision import combine
from applimit.web._client_ip import TrustedProxies
from applimit.web._gate import Answer, Gate, Subject
from applimit.web._request import Caller, RequestInfo

names = st.one_of(
    st.sampled_from(["api", "login", 'we"ird\\name', "café", "a/b", "100%"]),
    st.text(min_size=1, max_size=12),
)


@st.composite
def admitting(draw: st.DrawFn) -> LimitResult:
    """One enforced result that admits, with the edge cases of its numbers."""
    quota = draw(st.integers(min_value=1, max_value=10**9))
    return LimitResult(
        name=draw(names),
        tier="free",
        algorithm=draw(st.sampled_from(["sliding_log", "sliding_window", "gcra"])),
        quota=quota,
        window=draw(st.sampled_from([0.5, 1.0, 1.5, 60.0, 3600.0, 86400.0])),
        allowed=True,
        consumed=draw(st.booleans()),
        # Below 0 and above the quota (a GCRA burst) are clamped in the headers.
        remaining=draw(st.integers(min_value=-5, max_value=quota + 5)),
        reset_after=draw(
            st.one_of(
                st.sampled_from([0.0, 1.0, 2.0000000001, math.inf, math.nan]),
                st.floats(min_value=-1.0, max_value=1e6),
            )
        ),
        retry_after=None,
        shadow=False,
    )


@settings(max_examples=300, deadline=None)
@given(result=admitting(), legacy=st.booleans())
def test_one_admitting_result_gets_the_general_paths_headers(
    result: LimitResult, legacy: bool
) -> None:
    """The outcome of a decision with one admitting result is the one the general path
    makes when a shadow result (never advertised) rides along: same headers, same order."""
    gate = Gate(tiers=["free"], legacy_headers=legacy)
    shadow = LimitResult(
        name=result.name + "-shadow",
        tier="free",
        algorithm="gcra",
        quota=1,
        window=1.0,
        allowed=False,
        consumed=False,
        remaining=0,
        reset_after=1.0,
        retry_after=1.0,
        shadow=True,
    )
    alone = combine([result])
    with_shadow = combine([result, shadow])
    assert alone.allowed and with_shadow.allowed
    # Twice: the first call formats the member, the second reuses it.
    for _ in range(2):
        fast = gate.answer(alone, "free")
        general = gate.answer(with_shadow, "free")
        assert fast == general
        assert fast.headers[0][0] == "RateLimit-Policy"
        assert fast.raw_headers == general.raw_headers
        assert type(fast) is Answer
        assert fast == Answer(headers=fast.headers, refusal=None)


@given(
    user=st.one_of(st.none(), st.text(min_size=1, max_size=8)),
    tier=st.sampled_from([None, "free", "pro", "gold", 3]),
    keys=st.sampled_from([{}, {"org": "acme"}]),
)
def test_the_gates_subject_is_the_constructors(user: str | None, tier: Any, keys: Any) -> None:
    """Gate.subject gives the object Subject's own constructor gives for the same
    fields, of the class itself."""
    gate = Gate(tiers=["free", "pro"])
    caller = None if user is None else Caller(user, tier, keys=keys)
    subject = gate.subject(_request("203.0.113.7"), caller)
    assert type(subject) is Subject
    fields = {f.name: getattr(subject, f.name) for f in dataclasses.fields(Subject)}
    assert Subject(**fields) == subject
    assert subject.identity == user and subject.ip == "203.0.113.7"
    # An anonymous caller, and a tier the policy does not list, count in the lowest tier.
    assert subject.tier == (tier if user is not None and tier in ("free", "pro") else "free")
    assert dict(subject.keys) == (keys if user is not None else {})


def test_a_degraded_or_refusing_decision_takes_the_general_path() -> None:
    """Only an admitting, enforced, Redis-answered result is formatted on the short path:
    a degraded one has no RateLimit header, a refusal is a 429."""
    gate = Gate(tiers=["free"])
    admitted = LimitResult("api", "free", "gcra", 10, 60.0, True, True, 9, 6.0, None)
    degraded = Decision(True, 10, 0, 0.0, None, "api", (admitted,), degraded=True)
    assert [name for name, _ in gate.answer(degraded, "free").headers] == ["RateLimit-Policy"]
    denied = LimitResult("api", "free", "gcra", 10, 60.0, False, False, 0, 6.0, 6.0)
    refusal = gate.answer(combine([denied]), "free").refusal
    assert refusal is not None and refusal.status == 429


def _request(peer: str | None, forwarded: str | None = None) -> RequestInfo:
    headers = (("x-forwarded-for", forwarded),) if forwarded else ()
    return RequestInfo("GET", "/", "/", "example.com", headers, peer)


@given(
    peer=st.one_of(
        st.ip_addresses().map(str),
        st.sampled_from(["testclient", "[::1]:443", "1.2.3.4:5678", "::ffff:10.0.0.7", ""]),
    ),
    forwarded=st.sampled_from([None, "203.0.113.9", "garbage, 198.51.100.2"]),
)
def test_remembered_peers_give_the_same_client_ip(peer: str, forwarded: str | None) -> None:
    """A peer asked about again gets the answer a fresh TrustedProxies gives, trusted or
    not, whatever the forwarding header says this time."""
    for trusted in ((), ("10.0.0.0/8", "::1"), ("0.0.0.0/0", "::/0")):
        remembering = TrustedProxies(trusted)
        first = remembering.client_ip(_request(peer))
        again = remembering.client_ip(_request(peer, forwarded))
        assert first == TrustedProxies(trusted).client_ip(_request(peer))
        assert again == TrustedProxies(trusted).client_ip(_request(peer, forwarded))


def test_remembered_peers_are_bounded() -> None:
    """A flood of addresses does not grow what is remembered past its bound."""
    from applimit.web._client_ip import MAX_KNOWN_PEERS

    proxies = TrustedProxies()
    for index in range(MAX_KNOWN_PEERS * 2 + 3):
        peer = f"10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}"
        assert proxies.client_ip(_request(peer)) == peer
    assert len(proxies._direct) <= MAX_KNOWN_PEERS


@given(
    headers=st.lists(
        st.tuples(st.binary(min_size=1, max_size=12), st.binary(max_size=20)),
        max_size=6,
    ),
    path=st.sampled_from(["/api/items", "/l%6Fgin", "", "/caf\u00e9"]),
    client=st.sampled_from([None, ("203.0.113.5", 4000), ["::1", 1]]),
)
def test_requests_built_from_a_scope_equal_the_constructors(
    headers: list[tuple[bytes, bytes]], path: str, client: object
) -> None:
    """RequestInfo.from_asgi (built through the slots' setters) gives the object the
    dataclass' own constructor gives for the same fields, and it stays frozen."""
    import dataclasses

    scope = {
        "type": "http",
        "method": "get",
        "path": path,
        "raw_path": path.encode("utf-8"),
        "query_string": b"a=1",
        "headers": headers,
        "client": client,
        "server": ("127.0.0.1", 8000),
    }
    built = RequestInfo.from_asgi(scope)
    fields = {f.name: getattr(built, f.name) for f in dataclasses.fields(RequestInfo)}
    assert RequestInfo(**fields) == built
    assert built.native is scope
    assert built.kind == "asgi" and built.method == "GET"
    try:
        built.path = "/elsewhere"  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a RequestInfo must stay frozen")


@given(
    extra=st.dictionaries(
        st.from_regex(r"HTTP_[A-Z_]{1,10}", fullmatch=True), st.text(max_size=10), max_size=4
    ),
    addr=st.sampled_from([None, "", "203.0.113.5", "::1"]),
)
def test_requests_built_from_an_environ_equal_the_constructors(
    extra: dict[str, str], addr: str | None
) -> None:
    """RequestInfo.from_wsgi gives the object the dataclass' own constructor gives."""
    import dataclasses

    environ: dict[str, object] = {
        "REQUEST_METHOD": "post",
        "SCRIPT_NAME": "",
        "PATH_INFO": "/api/items",
        "QUERY_STRING": "q=1",
        "SERVER_NAME": "example.com",
        "CONTENT_TYPE": "text/plain",
        **extra,
    }
    if addr is not None:
        environ["REMOTE_ADDR"] = addr
    built = RequestInfo.from_wsgi(environ)
    fields = {f.name: getattr(built, f.name) for f in dataclasses.fields(RequestInfo)}
    assert RequestInfo(**fields) == built
    assert built.native is environ
    assert built.kind == "wsgi" and built.method == "POST"
