"""The policy model: vocabulary, environment expansion, lint codes, matching and the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import edgegen_policy as policy
import pytest
from edgegen_policy import Duration, Matcher, Rate, Severity
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "policy.yaml"


@pytest.mark.parametrize(
    ("text", "limit", "ms"),
    [
        ("100/1m", 100, 60_000),
        ("5/10s", 5, 10_000),
        ("20000/1h", 20_000, 3_600_000),
        ("1/d", 1, 86_400_000),
        ("7/250ms", 7, 250),
        (" 3 / 2m ", 3, 120_000),
    ],
)
def test_rate_parsing(text: str, limit: int, ms: int) -> None:
    """Rates parse into a limit and a period in milliseconds."""
    rate = Rate.parse(text)
    assert (rate.limit, rate.period.ms) == (limit, ms)


@given(st.integers(1, 10**9), st.integers(1, 366 * 86_400_000))
def test_rate_text_round_trips(limit: int, ms: int) -> None:
    """A rate's canonical text parses back to the same rate."""
    rate = Rate(limit, Duration(ms))
    assert Rate.parse(str(rate)) == rate


@pytest.mark.parametrize(
    ("text", "hint"),
    [("10/1min", "10/1m"), ("10/5 seconds", "10/5s"), ("10/hour", "10/1h"), ("abc", "100/1m")],
)
def test_rate_errors_suggest_a_spelling(text: str, hint: str) -> None:
    """A misspelt unit gets a suggestion in the unit we use."""
    with pytest.raises(ValueError, match=f"write it like {hint}"):
        Rate.parse(text)


@pytest.mark.parametrize("text", ["\u0661\u0660s", "\uff11\uff10s", "\u0661\u0660/1m", "5/\u0661m"])
def test_only_ascii_digits_count(text: str) -> None:
    """Digits of other scripts (Arabic-Indic, fullwidth) are no number to the loader, as
    they are none to the JSON Schema's patterns an editor checks."""
    with pytest.raises(ValueError):
        (Rate if "/" in text else Duration).parse(text)


def test_duration_canonical_text() -> None:
    """Durations print in the largest unit that divides them."""
    assert [str(Duration.parse(t)) for t in ("60s", "1500ms", "120m", "24h", 5)] == [
        "1m",
        "1500ms",
        "2h",
        "1d",
        "5s",
    ]


def _load(body: str, env: dict[str, str] | None = None) -> policy.Policy:
    return policy.loads(textwrap.dedent(body), "p.yaml", env=env or {})


def test_environment_expansion() -> None:
    """${VAR} and ${VAR:-default} read the environment; $$ is a literal dollar."""
    loaded = _load(
        """
        version: 1
        cloudflare: { plan: pro, zone_id: "${ZONE}" }
        app:
          redis_url: ${REDIS_URL:-redis://cache:6379/1}
          key_prefix: ${PREFIX:-rl}
        limits:
          - name: "cost$$"
            app: { tiers: { default: "${RATE:-9/1s}" } }
        """,
        env={"ZONE": "0" * 32, "PREFIX": "svc"},
    )
    assert loaded.cloudflare is not None
    assert loaded.cloudflare.zone_id == "0" * 32
    assert loaded.app.redis_url == "redis://cache:6379/1"
    assert loaded.app.key_prefix == "svc"
    assert loaded.limits[0].name == "cost$"
    assert loaded.limits[0].app is not None
    assert str(loaded.limits[0].app.tiers["default"][0]) == "9/1s"


def test_unset_variable_is_a_located_warning() -> None:
    """An unset ${VAR} without default leaves the field unset and lint says where."""
    loaded = _load(
        """
        version: 1
        cloudflare:
          plan: pro
          zone_id: ${CLOUDFLARE_ZONE_ID}
        """
    )
    assert loaded.cloudflare is not None and loaded.cloudflare.zone_id is None
    [finding] = [d for d in policy.lint(loaded) if d.code == "L003"]
    assert finding.severity is Severity.WARNING
    assert (finding.line, finding.path) == (5, "cloudflare.zone_id")
    assert "CLOUDFLARE_ZONE_ID is not set" in finding.message


def _codes(body: str) -> dict[str, list[policy.Diagnostic]]:
    found: dict[str, list[policy.Diagnostic]] = {}
    for d in policy.lint(_load(body)):
        found.setdefault(d.code, []).append(d)
    return found


BASE = """
version: 1
cloudflare: { plan: enterprise }
authenticated_when: { headers: [authorization] }
tiers: [free, pro, enterprise]
limits:
"""


def test_lint_duplicate_names_and_unknown_tiers() -> None:
    """Duplicate names (L001) and unknown tiers (L002) are errors with locations."""
    found = _codes(
        BASE
        + """
  - name: api
    app: { tiers: { free: 1/1s, pro: 2/1s, enterprise: 3/1s } }
  - name: api
    match: { paths: [/other] }
    app: { tiers: { free: 1/1s, gold: 2/1s, pro: 2/1s, enterprise: 3/1s } }
"""
    )
    assert found["L001"][0].severity is Severity.ERROR
    assert found["L001"][0].path == "limits[1].name"
    assert found["L002"][0].path == "limits[1].app.tiers.gold"
    assert found["L002"][0].line == 12


def test_lint_tiers_getting_less_generous() -> None:
    """A higher tier with a smaller allowance at any window is L101."""
    found = _codes(
        BASE
        + """
  - name: api
    app: { tiers: { free: 100/1m, pro: [1000/1m, 50/1h], enterprise: 10000/1m } }
"""
    )
    [warning] = found["L101"]
    assert warning.path == "limits[0].app.tiers.pro"
    assert "'pro' admits fewer requests than the lower tier 'free'" in warning.message


def test_lint_edge_stricter_than_app() -> None:
    """An edge limit covering an app limit's route and stricter than its lowest tier: L102."""
    found = _codes(
        BASE
        + """
  - name: edge
    match: { path_prefix: /api/ }
    edge: { rate: 10/1m, unauthenticated_only: false }
  - name: app
    match: { paths: [/api/x] }
    app: { tiers: { free: 100/1m, pro: 200/1m, enterprise: 300/1m } }
"""
    )
    assert [d.limit for d in found["L102"]] == ["edge"]
    assert "loosen the edge limit" in found["L102"][0].message


def test_lint_edge_for_anonymous_does_not_conflict_with_users() -> None:
    """Edge counting anonymous IPs and app counting users do not trigger L102."""
    found = _codes(
        BASE
        + """
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: 10/1m }
    app: { tiers: { free: 100/1m, pro: 200/1m, enterprise: 300/1m } }
"""
    )
    assert "L102" not in found


def test_lint_sliding_log_memory() -> None:
    """A large sliding log is L103 with an estimate and the suggested algorithms."""
    found = _codes(
        BASE
        + """
  - name: api
    app:
      algorithm: sliding_log
      tiers: { free: 100/1m, pro: 20000/1h, enterprise: 30000/1h }
"""
    )
    assert {d.path for d in found["L103"]} == {
        "limits[0].app.tiers.pro",
        "limits[0].app.tiers.enterprise",
    }
    assert "gcra or sliding_window" in found["L103"][0].message


def test_lint_matchers_identical_and_overlapping() -> None:
    """Identical matchers warn (L104); overlapping ones are info (L105)."""
    found = _codes(
        BASE
        + """
  - name: a
    match: { path_prefix: /api/ }
    app: { tiers: { free: 1/1s, pro: 2/1s, enterprise: 3/1s } }
  - name: b
    match: { path_prefix: /api/ }
    app: { tiers: { free: 1/1s, pro: 2/1s, enterprise: 3/1s } }
  - name: c
    match: { paths: [/api/search] }
    app: { tiers: { free: 1/1s, pro: 2/1s, enterprise: 3/1s } }
  - name: d
    match: { paths: [/static/x] }
    app: { tiers: { free: 1/1s, pro: 2/1s, enterprise: 3/1s } }
"""
    )
    assert [(d.limit, d.severity) for d in found["L104"]] == [("b", Severity.WARNING)]
    assert sorted(d.limit or "" for d in found["L105"]) == ["c", "c"]


def test_a_limit_applied_only_by_name_overlaps_nothing() -> None:
    """A limit with ``middleware: false`` and no edge part (docs/web.md's "limits for
    explicit use only") selects no request by its match, so no L104/L105 names it; with an
    edge part its match counts at the edge, so it still does."""
    found = _codes(
        BASE
        + """
  - name: api
    match: { path_prefix: /api/ }
    app: { tiers: { free: 1/1s, pro: 2/1s, enterprise: 3/1s } }
  - name: exports
    app: { middleware: false, tiers: { free: 1/1s, pro: 2/1s, enterprise: 3/1s } }
  - name: reports
    app: { middleware: false, tiers: { free: 1/1s, pro: 2/1s, enterprise: 3/1s } }
"""
    )
    assert "L104" not in found and "L105" not in found


def test_lint_missing_tier_shadow_and_no_credentials() -> None:
    """L106 (tier without rate), L107 (shadow mode) and L108 (no credentials) fire."""
    found = _codes(
        """
version: 1
cloudflare: { plan: enterprise }
tiers: [free, pro]
limits:
  - name: a
    edge: { rate: 10/1m }
    app: { enforce: false, tiers: { free: 1/1s } }
"""
    )
    assert found["L106"][0].severity is Severity.WARNING
    assert "pro" in found["L106"][0].message
    assert found["L107"][0].severity is Severity.INFO
    assert found["L108"][0].severity is Severity.WARNING


def test_lint_edge_without_cloudflare_section() -> None:
    """Edge limits need a cloudflare section (L004, error)."""
    found = _codes(
        """
version: 1
limits:
  - name: a
    edge: { rate: 10/1m, unauthenticated_only: false }
"""
    )
    assert found["L004"][0].severity is Severity.ERROR


def test_example_policy_is_clean() -> None:
    """The example policy loads and lints without errors or warnings (edgegen's placement
    checks included, as edgegen validate runs them)."""
    from edgegen._placement import EDGE_CHECKS

    loaded = policy.load(EXAMPLE, env={})
    found = policy.lint(loaded, EDGE_CHECKS)
    assert [d for d in found if d.severity is not Severity.INFO] == []
    features = {
        "algorithms": {lim.app.algorithm for lim in loaded.limits if lim.app},
        "shadow": any(lim.app and not lim.app.enforce for lim in loaded.limits),
        "approximate": any(
            lim.app and lim.app.mode.value == "approximate" for lim in loaded.limits
        ),
        "hosts": any(lim.match.hosts for lim in loaded.limits),
        "multi-rate tier": any(
            lim.app and any(len(r) > 1 for r in lim.app.tiers.values()) for lim in loaded.limits
        ),
        "fail closed": any(
            lim.app and lim.app.on_redis_error and lim.app.on_redis_error.value == "deny"
            for lim in loaded.limits
        ),
    }
    assert features == {
        "algorithms": set(policy.Algorithm),
        "shadow": True,
        "approximate": True,
        "hosts": True,
        "multi-rate tier": True,
        "fail closed": True,
    }


MATCH_CASES = [
    # (matcher kwargs, method, path, host, expected)
    ({"paths": ["/login"]}, "POST", "/login", None, True),
    # One trailing slash more or less is the same exact path (slash-redirecting routers).
    ({"paths": ["/login"]}, "POST", "/login/", None, True),
    ({"paths": ["/login/"]}, "POST", "/login", None, True),
    ({"paths": ["/login"]}, "POST", "/login//", None, False),
    ({"paths": ["/login"]}, "POST", "/Login", None, False),
    # HEAD runs the GET handler, so a limit on GET counts it.
    ({"paths": ["/a"], "methods": ["GET"]}, "HEAD", "/a", None, True),
    ({"paths": ["/a"], "methods": ["POST"]}, "HEAD", "/a", None, False),
    ({"paths": ["/login"], "methods": ["POST"]}, "GET", "/login", None, False),
    ({"paths": ["/login"], "methods": ["POST"]}, "post", "/login", None, True),
    ({"path_prefixes": ["/api/"]}, "GET", "/api/x", None, True),
    ({"path_prefixes": ["/api/"]}, "GET", "/api", None, False),
    ({"path_prefixes": ["/api/"], "paths": ["/health"]}, "GET", "/health", None, True),
    ({"hosts": ["api.example.com"]}, "GET", "/", "API.example.com:443", True),
    ({"hosts": ["api.example.com"]}, "GET", "/", "example.com", False),
    ({"hosts": ["*.example.com"]}, "GET", "/", "a.b.example.com", True),
    ({"hosts": ["*.example.com"]}, "GET", "/", "example.com", False),
    ({"hosts": ["*.example.com"]}, "GET", "/", "badexample.com", False),
    ({}, "DELETE", "/anything", "any.host", True),
]


@pytest.mark.parametrize(("kwargs", "method", "path", "host", "expected"), MATCH_CASES)
def test_matcher_semantics(
    kwargs: dict[str, list[str]], method: str, path: str, host: str | None, expected: bool
) -> None:
    """Paths OR prefixes, AND methods, AND hosts (case-insensitive, port ignored)."""
    assert Matcher.create(**kwargs).matches(method, path, host) is expected


@pytest.mark.parametrize(
    ("target", "forms"),
    [
        ("/login", ("/login",)),
        ("/l%6Fgin", ("/l%6Fgin", "/login")),
        ("/%6cogin", ("/%6cogin", "/login")),
        ("/%61pi/items", ("/%61pi/items", "/api/items")),
        ("/api%2Fitems", ("/api%2Fitems", "/api/items")),
        ("/api%2fitems", ("/api%2fitems", "/api/items")),
        ("/api/%73earch", ("/api/%73earch", "/api/search")),
        ("//api/items", ("//api/items", "/api/items")),
        ("/api/../login", ("/api/../login", "/login")),
        ("/api/%2e%2e/login", ("/api/%2e%2e/login", "/api/../login", "/login")),
        ("/api/./items?x=1", ("/api/./items?x=1", "/api/./items", "/api/items")),
        ("/a\\b", ("/a\\b", "/a/b")),
        ("/caf%C3%A9", ("/caf%C3%A9", "/caf\u00e9")),
        ("/%FF", ("/%FF", "/\ufffd")),
        ("/login\n", ("/login\n", "/login")),
        ("/login%0A", ("/login%0A", "/login\n", "/login")),
        ("/login%0D%0A", ("/login%0D%0A", "/login\r\n", "/login\r")),
        ("/lo%09gin", ("/lo%09gin", "/lo\tgin")),
        ("/a/..//b%0a", ("/a/..//b%0a", "/a/..//b\n", "/b\n", "/a/..//b", "/b")),
    ],
)
def test_request_paths(target: str, forms: tuple[str, ...]) -> None:
    """The router's path, its decoded form and its canonical form, in that order, deduped;
    ending in a newline, both again without it (a route's ``$`` matches before it)."""
    assert policy.request_paths(target) == forms


@pytest.mark.parametrize(
    ("path", "mount", "forms"),
    [
        ("/x/login", "/x", ("/x/login", "/login")),
        ("/x/l%6Fgin", "/x", ("/x/l%6Fgin", "/x/login", "/l%6Fgin", "/login")),
        ("/x", "/x", ("/x", "/")),
        ("/x/", "/x/", ("/x/", "/")),
        ("/y/login", "/x", ("/y/login",)),
        ("/x/login", "", ("/x/login",)),
    ],
)
def test_request_paths_with_a_mount(path: str, mount: str, forms: tuple[str, ...]) -> None:
    """A mount (SCRIPT_NAME, root_path) the path starts with adds the forms of the path
    without it: what the router matches. One it does not start with adds nothing."""
    assert policy.request_paths(path, mount) == forms


def test_control_characters_are_exactly_c0_and_del() -> None:
    """has_control_character is true for U+0000-U+001F and U+007F anywhere in a path, and
    for nothing else (space, C1 controls, line separators, non-ASCII are not refused)."""
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        expected = code < 0x20 or code == 0x7F
        for path in (f"/login{char}", f"/{char}x", f"/a{char}/b"):
            assert policy.has_control_character(path) is expected, (hex(code), path)


@pytest.mark.parametrize(
    ("target", "limit"),
    [
        ("/l%6Fgin", "login"),
        ("/%6cogin", "login"),
        ("/%61pi/items", "api"),
        ("/api%2Fitems", "api"),
        ("/api/%73earch", "search"),
        ("//api/items", "api"),
        ("/api/search/", "search"),
        ("/./login", "login"),
    ],
)
def test_encoded_spellings_match(target: str, limit: str) -> None:
    """Every spelling that a router serves as a limited route is matched by that limit."""
    loaded = policy.load(EXAMPLE)
    method = "POST" if limit == "login" else "GET"
    assert loaded.limit(limit).match.matcher().matches_raw(method, target)


@given(st.text(max_size=80))
def test_canonical_path_is_idempotent(text: str) -> None:
    """The canonical form of a canonical path is itself, and it always starts with '/'."""
    once = policy.canonical_path(text)
    assert once.startswith("/") and policy.canonical_path(once) == once
    assert "//" not in once and "\\" not in once


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("/api/x?q=1", "/api/x"),
        ("/api/./x", "/api/x"),
        ("/api/../login", "/login"),
        ("/a/%2e%2e/login", "/login"),
        ("", "/"),
        ("/caf\u00e9", "/caf%C3%A9"),
        (b"/\xff", "/%FF"),
        ("/a b", "/a%20b"),
        ("/a\\b", "/a/b"),
        ("/x#frag", "/x"),
    ],
)
def test_normalize_path(raw: str | bytes, normalized: str) -> None:
    """Paths are normalised the way the edge sees them, and never raise."""
    assert policy.normalize_path(raw) == normalized


@given(st.binary(max_size=300))
def test_normalize_path_never_raises(raw: bytes) -> None:
    """Any bytes normalise to an absolute, ASCII path."""
    out = policy.normalize_path(raw)
    assert out.startswith("/") and out.isascii()


def test_matcher_overlap_and_cover() -> None:
    """Overlap and coverage used by lint are consistent with matching."""
    api = Matcher.create(path_prefixes=["/api/"])
    search = Matcher.create(paths=["/api/search"], methods=["GET"])
    login = Matcher.create(paths=["/login"], methods=["POST"])
    assert api.overlaps(search) and api.covers(search) and not search.covers(api)
    assert not api.overlaps(login)
    assert not search.overlaps(Matcher.create(paths=["/api/search"], methods=["POST"]))


def test_json_schema_describes_every_section() -> None:
    """The schema lists every top-level key, forbids unknown keys, and is valid JSON."""
    schema = policy.json_schema()
    assert set(schema["properties"]) == {
        "version",
        "cloudflare",
        "authenticated_when",
        "tiers",
        "clients",
        "app",
        "limits",
        "overrides",
    }
    assert schema["additionalProperties"] is False
    json.dumps(schema)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgegen.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def test_cli_validate_example_strict() -> None:
    """The example passes ``validate --strict`` and says what it found."""
    result = _cli("validate", "--strict", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert "valid: 6 limits" in result.stdout


def test_cli_validate_strict_turns_warnings_into_errors(tmp_path: Path) -> None:
    """A warning passes by default and fails with --strict."""
    file = tmp_path / "p.yaml"
    file.write_text("version: 1\ncloudflare: { plan: pro, zone_id: '${UNSET_ZONE_VAR}' }\n")
    assert _cli("validate", str(file)).returncode == 0
    strict = _cli("validate", "--strict", str(file))
    assert strict.returncode == 1
    assert "environment variable UNSET_ZONE_VAR is not set" in strict.stderr
    assert "[warning L003]" in strict.stderr


def test_cli_validate_json(tmp_path: Path) -> None:
    """--format json gives machine-readable diagnostics for load errors too."""
    file = tmp_path / "p.yaml"
    file.write_text("version: 1\ntiers: [free]\nlimits:\n  - name: a\n    app: { tiers: 3 }\n")
    result = _cli("validate", "--format", "json", str(file))
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    assert report["diagnostics"][0]["line"] == 5
    assert report["diagnostics"][0]["path"] == "limits[0].app.tiers"


def test_cli_schema_and_show() -> None:
    """``schema`` prints JSON Schema; ``show`` lists every limit."""
    schema = _cli("schema")
    assert schema.returncode == 0
    assert json.loads(schema.stdout)["title"] == "Rate-limit policy"
    show = _cli("show", str(EXAMPLE))
    assert show.returncode == 0
    for name in ("login", "api", "search", "exports", "webhooks", "events"):
        assert f"  {name}: " in show.stdout


def test_cli_usage_errors_exit_2() -> None:
    """A bad command line exits 2 with a usage message, not a traceback."""
    result = _cli("validate")
    assert result.returncode == 2
    assert "usage:" in result.stderr and "Traceback" not in result.stderr


def test_policy_locates_its_fields() -> None:
    """``Policy.locate`` gives file, line and column of a field, for tools that report."""
    loaded = policy.load(EXAMPLE, env={})
    index = loaded.limit_index("api")
    where = loaded.locate("limits", index, "edge", "rate")
    assert where is not None
    file, line, column = where
    assert file == str(EXAMPLE)
    assert EXAMPLE.read_text().splitlines()[line - 1][column - 1 :].startswith("600/1m")
    assert policy.loads("version: 1\n").locate("limits") == ("<policy>", 1, 1)


@given(
    st.text(alphabet=st.sampled_from("/.%2eE\\?#ab-_~:@!$&'()*+,;=[]| \t\x00é")),
    st.booleans(),
)
def test_the_plain_path_shortcut_normalises_like_the_full_algorithm(
    text: str, absolute: bool
) -> None:
    """normalize_path returns plain paths (most request paths) unchanged without running
    the algorithm; for every input it must agree with the full algorithm."""
    from edgegen_policy._match import _normalize

    raw = "/" + text if absolute else text
    assert policy.normalize_path(raw) == _normalize(raw)


@pytest.mark.parametrize(
    ("ip", "prefix", "bucket"),
    [
        ("203.0.113.9", 64, "203.0.113.9"),
        ("::ffff:203.0.113.9", 64, "203.0.113.9"),
        ("2001:DB8:0:1::5", 64, "2001:db8:0:1::/64"),
        ("2001:db8:0:1:ffff:ffff:ffff:ffff", 64, "2001:db8:0:1::/64"),
        ("2001:db8:0:2::5", 64, "2001:db8:0:2::/64"),
        ("2001:db8:0:1::5", 128, "2001:db8:0:1::5"),
        ("2001:db8:0:1::5", 48, "2001:db8::/48"),
        ("[2001:db8::1]", 64, "2001:db8::/64"),
        ("fe80::1%eth0", 128, "fe80::1"),
        ("testclient", 64, "testclient"),
    ],
)
def test_ip_bucket(ip: str, prefix: int, bucket: str) -> None:
    """IPv4 per address, IPv6 per network of the policy's prefix, one spelling each."""
    assert policy.ip_bucket(ip, prefix) == bucket


def test_ipv6_prefix_setting() -> None:
    """clients.ipv6_prefix defaults to 64 and refuses prefixes wider than /32."""
    base = "version: 1\nlimits: []\n"
    assert policy.loads(base).clients.ipv6_prefix == 64
    assert policy.loads(base + "clients: {ipv6_prefix: 56}\n").clients.ipv6_prefix == 56
    with pytest.raises(policy.PolicyLoadError, match=r"clients\.ipv6_prefix"):
        policy.loads(base + "clients: {ipv6_prefix: 16}\n")


@pytest.mark.parametrize(
    ("path", "hint"),
    [
        ("/caf%C3%A9", "'/café'"),
        ("/api//x", "'/api/x'"),
        ("/api/./x", "'/api/x'"),
        ("/a\\\\b", "'/a/b'"),
    ],
)
def test_policy_paths_are_written_canonical(path: str, hint: str) -> None:
    """A policy path no request could have once normalised is an error naming the fix."""
    text = f"version: 1\nlimits:\n  - name: x\n    match: {{paths: ['{path}']}}\n"
    with pytest.raises(policy.PolicyLoadError, match=re.escape(hint)):
        policy.loads(text)


@pytest.mark.parametrize(
    ("ip", "client"),
    [
        ("::ffff:0:192.0.2.9", "192.0.2.9"),  # IPv4-translated (RFC 2765)
        ("64:ff9b::192.0.2.9", "192.0.2.9"),  # NAT64 well-known prefix (RFC 6052)
        ("::192.0.2.9", "192.0.2.9"),  # IPv4-compatible (RFC 4291, deprecated)
        ("2002:c000:209::1", "192.0.2.9"),  # 6to4: one IPv4 host, 65,536 /64s
        ("2002:c000:209:ffff::1", "192.0.2.9"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdf6", "192.0.2.9"),  # Teredo, client inverted
        ("::1", "::/64"),
    ],
)
def test_ipv6_forms_that_carry_an_ipv4_client_count_as_it(ip: str, client: str) -> None:
    """Translators and tunnels write an IPv4 client into an IPv6 address: it is counted as
    that IPv4 client, so 6to4 cannot multiply a quota and NAT64 cannot merge clients."""
    assert policy.ip_bucket(ip, 64) == client


# --- the validity gate and the one diagnostic formatter ----------------------------------

GATE = """
version: 1
tiers: [free, pro]
limits:
  - name: a
    edge: { rate: 10/1m, unauthenticated_only: false }
    app: { tiers: { free: 1/1s, pro: 2/1s } }
  - name: a
    app: { tiers: { free: 1/1s, gold: 2/1s } }
  - name: b
    edge: { rate: 10/1m, unauthenticated_only: false }
"""


def test_check_says_which_layers_each_error_stops() -> None:
    """L001 stops the app (and the edge only for two edge limits), L002 the app, L004 the
    edge; every error makes the policy invalid."""
    checked = policy.check(_load(GATE))
    assert not checked.ok
    assert [d.code for d in checked.errors] == ["L004", "L001", "L002", "L004"]
    assert [d.code for d in checked.stopping(policy.Layer.APP)] == ["L001", "L002"]
    assert [d.code for d in checked.stopping(policy.Layer.EDGE)] == ["L004", "L004"]
    assert checked.failing() == 4 and checked.count(Severity.ERROR) == 4
    edge_twice = _load(
        GATE.replace("app: { tiers: { free: 1/1s, gold: 2/1s } }", "edge: { rate: 5/1m }")
    )
    assert "L001" in [d.code for d in policy.check(edge_twice).stopping(policy.Layer.EDGE)]


def test_check_takes_contributed_checks() -> None:
    """A check a consumer contributes reports through diagnostic_at, located in the file, and
    its errors stop what it says; lint and check run the same checks."""
    loaded = _load(
        "version: 1\ntiers: [free]\nlimits:\n  - name: a\n    app: { tiers: { free: 1/1s } }\n"
    )

    def contributed(p: policy.Policy) -> list[policy.Diagnostic]:
        return [
            policy.diagnostic_at(
                p,
                ("limits", 0, "app"),
                "X900",
                Severity.ERROR,
                "no",
                fix="yes",
                stops={policy.Layer.EDGE},
            )
        ]

    assert policy.check(loaded).ok
    checked = policy.check(loaded, [contributed])
    [found] = checked.errors
    assert (found.code, found.path, found.line, found.fix) == ("X900", "limits[0].app", 5, "yes")
    assert checked.stopping(policy.Layer.EDGE) == (found,)
    assert not checked.stopping(policy.Layer.APP)
    assert policy.lint(loaded, [contributed]) == list(checked.diagnostics)


def test_the_formatter_prints_one_diagnostic_everywhere() -> None:
    """The terminal line, JSON and Markdown of a diagnostic; Diagnostic.format and to_json
    are the same formatter."""
    found = policy.Diagnostic(
        "tier 'gold' is not one of the policy's tiers <b>|x|</b>",
        "L002",
        Severity.ERROR,
        "p.yaml",
        9,
        20,
        "limits[1].app.tiers.gold",
        limit="a",
        fix="add it to tiers",
    )
    line = "p.yaml:9:20: limits[1].app.tiers.gold: tier 'gold' is not one of the policy's tiers"
    assert policy.diagnostic_line(found) == found.format() == line + " <b>|x|</b>"
    assert policy.diagnostic_terminal(found).endswith("</b> [error L002]")
    assert list(policy.diagnostic_json(found)) == [
        "code",
        "severity",
        "file",
        "line",
        "column",
        "path",
        "limit",
        "message",
    ]
    assert found.to_json() == policy.diagnostic_json(found)
    markdown = policy.diagnostics_markdown([found])
    assert markdown.startswith("- **error** L002 at p\\.yaml\\:9\\:20, limits\\[1\\]")
    assert (
        "<b>" not in markdown
        and "\\|x\\|" in markdown
        and markdown.endswith("Fix: add it to tiers\n")
    )
    assert policy.diagnostics_markdown([]) == ""
    bare = policy.Diagnostic("no file", "P001")
    assert bare.format() == "no file" and policy.diagnostic_terminal(bare) == "no file [error P001]"


def test_write_diagnostics_sends_each_severity_to_its_stream() -> None:
    """Errors and warnings to the first stream, info to the second (or nowhere), and only
    errors with errors_only."""
    import io

    found = [
        policy.Diagnostic("e", "L001"),
        policy.Diagnostic("w", "L101", Severity.WARNING),
        policy.Diagnostic("i", "L105", Severity.INFO),
    ]
    err, out = io.StringIO(), io.StringIO()
    policy.write_diagnostics(found, err, info=out)
    assert err.getvalue() == "e [error L001]\nw [warning L101]\n"
    assert out.getvalue() == "i [info L105]\n"
    err = io.StringIO()
    policy.write_diagnostics(found, err)
    assert err.getvalue() == "e [error L001]\nw [warning L101]\n"
    err, out = io.StringIO(), io.StringIO()
    policy.write_diagnostics(found, err, info=out, errors_only=True)
    assert (err.getvalue(), out.getvalue()) == ("e [error L001]\n", "")


def test_policy_imports_nothing_of_edgegen() -> None:
    """The policy package loads without edgegen or applimit."""
    code = (
        "import sys, policy; "
        "assert not [m for m in sys.modules if m.startswith(('edgegen', 'applimit'))]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_checked_rates_keep_the_smaller_limit_of_each_period() -> None:
    """Of two rates with one period only the smaller limit is checked, whichever comes
    first; periods keep the order they first appear in (the app, its memory store and the
    replay all read a tier's rates through this one rule)."""
    rates = [policy.Rate.parse(r) for r in ("100/1m", "20000/1h", "60/1m", "200/60s", "5/1s")]
    assert [str(r) for r in policy.checked_rates(rates)] == ["60/1m", "20000/1h", "5/1s"]
    assert policy.checked_rates([]) == ()
