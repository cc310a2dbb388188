"""Keys beyond the address in the Worker, in workerd: headers, cookies and verified JWT claims.

Two kinds of test. The generated Worker with its real (Miniflare-emulated) bindings shows the
behaviour end to end: two users behind one address counted apart, a forged or expired token
counted by address. A recording module (the Worker's own limiter.js and keys.js, verbatim,
with an entry point whose bindings record the key they are given) shows exactly which key
each request is counted under: a keyed hash, never the value, or the client's address.

Tokens are signed here: HS256 with Python's hmac, RS256 and ES256 with node:crypto
(jwt_sign.mjs), whose public keys the harness serves to the Worker as a JWKS.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest
from edge_support import HARNESS, WORKERS, require_node_modules, run_node

import edgegen
from edgegen.compiler import _worker

pytestmark = pytest.mark.workerd

HERE = Path(__file__).resolve().parent
IP_A = "203.0.113.7"
IP_B = "198.51.100.20"
KEY_SECRET = "k" * 32
JWT_SECRET = "the-hs256-signing-key-of-the-app"
ALL_SECRETS = {"EDGEGEN_KEY_SECRET": KEY_SECRET, "JWT_SECRET": JWT_SECRET}
JWKS_URL = "https://auth.example.com/.well-known/jwks.json"

HEADER_POLICY = """\
version: 1
cloudflare:
  plan: free
  worker: { name: keys-test, routes: ["api.example.com/*"] }
limits:
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: 2/1m, per: { header: X-Api-Key } }
  - name: pages
    match: { path_prefix: /pages/ }
    edge: { rate: 2/1m, per: { cookie: session } }
"""
HS256_POLICY = """\
version: 1
cloudflare:
  plan: free
  worker: { name: keys-test, routes: ["api.example.com/*"] }
limits:
  - name: api
    match: { path_prefix: /api/ }
    edge:
      rate: 2/1m
      per: { jwt: { claim: sub, secret: JWT_SECRET, issuer: https://auth.example.com } }
"""
JWKS_POLICY = f"""\
version: 1
cloudflare:
  plan: free
  worker: {{ name: keys-test, routes: ["api.example.com/*"] }}
limits:
  - name: api
    match: {{ path_prefix: /api/ }}
    edge:
      rate: 2/1m
      per: {{ jwt: {{ claim: sub, jwks: "{JWKS_URL}", audience: api }} }}
"""

RECORDING_ENTRY = """
export default {
  async fetch(request, env, ctx) {
    const seen = [];
    const recording = new Proxy(env, {
      get(target, name) {
        if (typeof name === "string" && name.startsWith("RL_")) {
          return { limit: async ({ key }) => { seen.push(key); return { success: true }; } };
        }
        return target[name];
      },
    });
    await decide(request, recording, CONFIG);
    return new Response(null, { headers: { "x-keys": JSON.stringify(seen) } });
  },
};
"""


def b64(data: bytes) -> str:
    """Unpadded base64url, as JWS writes it."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def part(value: object) -> str:
    """A JWT header or payload part."""
    return b64(json.dumps(value).encode("utf-8"))


def hs256(payload: dict[str, Any], secret: str = JWT_SECRET, **header: Any) -> str:
    """An HS256 token (the header may be overridden, e.g. alg)."""
    head = {"alg": "HS256", "typ": "JWT", **header}
    signing_input = f"{part(head)}.{part(payload)}"
    mac = hmac.new(secret.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(mac)}"


def claims(sub: object = "alice", **more: Any) -> dict[str, Any]:
    """A payload that verifies under HS256_POLICY: issuer right, valid for ten minutes."""
    now = int(time.time())
    return {"sub": sub, "iss": "https://auth.example.com", "exp": now + 600, **more}


def sign_with_node(keys: list[dict[str, Any]], tokens: list[dict[str, Any]]) -> Any:
    """RS256/ES256 keys and tokens from jwt_sign.mjs: {"jwks": [...], "tokens": [...]}."""
    return run_node(HERE / "jwt_sign.mjs", {"keys": keys, "tokens": tokens})


def build(tmp_path: Path, text: str) -> edgegen.WorkerArtifact:
    """Build a policy and write its Worker under tmp_path."""
    artifacts = edgegen.build(policy.loads(text))
    assert artifacts.worker is not None
    edgegen.write(artifacts, tmp_path)
    return artifacts.worker


def recording_module(tmp_path: Path, text: str) -> Path:
    """The Worker's logic for a policy with an entry point that reports the keys counted."""
    loaded = policy.loads(text)
    limits = [_worker.WorkerLimit(limit, 60) for limit in loaded.limits]
    blob = _worker.script_json(_worker.config(loaded, limits))
    module = tmp_path / "recording.js"
    module.write_text(
        f"const CONFIG = {blob};\n\n"
        + _worker.template_text(_worker.LOGIC_FILE)
        + _worker.template_text(_worker.KEYS_FILE)
        + textwrap.dedent(RECORDING_ENTRY),
        encoding="utf-8",
    )
    return module


def req(path: str, ip: str = IP_A, **headers: str | list[str]) -> dict[str, Any]:
    """A request to api.example.com from an address."""
    sent: dict[str, str | list[str]] = {k.replace("_", "-"): v for k, v in headers.items()}
    sent["cf-connecting-ip"] = ip
    return {"url": f"https://api.example.com{path}", "method": "GET", "headers": sent}


def bearer(token: str) -> str:
    """An Authorization value."""
    return f"Bearer {token}"


def recorded(
    tmp_path: Path,
    text: str,
    requests: list[dict[str, Any]],
    secrets: dict[str, str] | None = None,
    outbound: dict[str, Any] | None = None,
) -> tuple[list[list[str]], dict[str, int]]:
    """The keys each request was counted under, and the fetches of canned URLs."""
    job = {
        "script": str(recording_module(tmp_path, text)),
        "ratelimits": {},
        "vars": ALL_SECRETS if secrets is None else secrets,
        "outbound": outbound or {},
        "requests": requests,
    }
    result = run_node(HARNESS / "run.mjs", job)
    keys = []
    for response in result["responses"]:
        assert "exception" not in response, response["exception"]
        keys.append(json.loads(response["headers"]["x-keys"]))
    return keys, result["fetched"]


def hashed(key: str) -> bool:
    """A keyed hash: "k:" and 43 base64url characters (HMAC-SHA-256)."""
    return key.startswith("k:") and len(key) == 45


def run_generated(tmp_path: Path, text: str, requests: list[Any], **job: Any) -> list[int]:
    """Statuses of requests through the generated Worker with its rate limit bindings."""
    worker = build(tmp_path, text)
    full = {
        "script": str(tmp_path / "worker" / worker.main_module),
        "compatibilityDate": worker.compatibility_date,
        "ratelimits": {
            b["name"]: {"namespace_id": b["namespace_id"], "simple": b["simple"]}
            for b in worker.bindings
        },
        "vars": {"EDGEGEN_KEY_SECRET": KEY_SECRET, "JWT_SECRET": JWT_SECRET},
        "requests": requests,
        **job,
    }
    for _attempt in range(2):
        result = run_node(HARNESS / "run.mjs", full)
        if not result["windowCrossed"]:
            break
    assert not result["windowCrossed"]
    return [r["status"] for r in result["responses"]]


# --- end to end, with the bindings --------------------------------------------------------


def test_a_jwt_sub_counts_two_users_behind_one_address_apart(tmp_path: Path) -> None:
    """Two users on one address each get the whole limit; a third request of one is refused,
    and the other user is still let through."""
    alice, bob = bearer(hs256(claims("alice"))), bearer(hs256(claims("bob")))
    sent = [
        req("/api/a", authorization=alice),
        req("/api/a", authorization=alice),
        req("/api/a", authorization=bob),
        req("/api/a", authorization=bob),
        req("/api/a", authorization=alice),
        req("/api/a", IP_B, authorization=bob),
    ]
    assert run_generated(tmp_path, HS256_POLICY, sent) == [200, 200, 200, 200, 429, 429]


def test_forged_and_expired_tokens_are_counted_by_address(tmp_path: Path) -> None:
    """A token with a wrong signature, an expired one and alg none do not get a counter of
    their claim: all three, from one address, share the address's counter."""
    forged = hs256(claims("alice"), secret="not-the-key")
    expired = hs256(claims("bob", exp=int(time.time()) - 3600))
    unsigned = f"{part({'alg': 'none'})}.{part(claims('carol'))}."
    sent = [
        req("/api/a", authorization=bearer(forged)),
        req("/api/a", authorization=bearer(expired)),
        req("/api/a", authorization=bearer(unsigned)),
        req("/api/a", IP_B, authorization=bearer(forged)),
    ]
    assert run_generated(tmp_path, HS256_POLICY, sent) == [200, 200, 429, 200]


def test_header_key_counts_per_value_and_by_address_without_it(tmp_path: Path) -> None:
    """Two API keys on one address are counted apart; one key over two addresses together;
    requests without the header count per address."""
    sent = [
        req("/api/a", x_api_key="alpha"),
        req("/api/a", IP_B, x_api_key="alpha"),
        req("/api/a", x_api_key="beta"),
        req("/api/a", x_api_key="alpha"),
        req("/api/a"),
        req("/api/a"),
        req("/api/a"),
    ]
    assert run_generated(tmp_path, HEADER_POLICY, sent) == [200, 200, 200, 429, 200, 200, 429]


# --- which key each request is counted under ----------------------------------------------


def test_header_and_cookie_values_are_counted_as_a_keyed_hash(tmp_path: Path) -> None:
    """The binding sees "k:" and an HMAC of the value, never the value; equal values from
    two addresses give one key, other values other keys; no header, an empty one or an
    over-long one count by address."""
    sent = [
        req("/api/a", x_api_key="alpha-secret-value"),
        req("/api/a", IP_B, x_api_key="alpha-secret-value"),
        req("/api/a", x_api_key="beta"),
        req("/api/a"),
        req("/api/a", x_api_key=""),
        req("/api/a", x_api_key="x" * 9000),
        req("/pages/1", Cookie="theme=dark; session=s1; other=2"),
        req("/pages/1", IP_B, Cookie="session=s1"),
        req("/pages/1", Cookie="sessionid=s1"),
    ]
    keys, _ = recorded(tmp_path, HEADER_POLICY, sent)
    flat = [k for (k,) in keys]
    assert hashed(flat[0]) and flat[0] == flat[1]
    assert hashed(flat[2]) and flat[2] != flat[0]
    assert flat[3:6] == [IP_A, IP_A, IP_A]
    assert hashed(flat[6]) and flat[6] == flat[7] and flat[6] not in (flat[0], flat[2])
    assert flat[8] == IP_A
    assert not any("alpha" in k or "s1" in k for k in flat)


def test_without_the_hash_secret_keyed_limits_count_by_address(tmp_path: Path) -> None:
    """No EDGEGEN_KEY_SECRET (or one too short to be a key): the value is never used as a
    key; the request counts by address."""
    sent = [req("/api/a", x_api_key="alpha"), req("/api/a", IP_B, x_api_key="alpha")]
    for secrets in ({}, {"EDGEGEN_KEY_SECRET": "short"}):
        keys, _ = recorded(tmp_path, HEADER_POLICY, sent, secrets=secrets)
        assert keys == [[IP_A], [IP_B]]


def test_the_hash_depends_on_the_secret(tmp_path: Path) -> None:
    """Another secret gives another key for the same value (a keyed hash, not a digest)."""
    sent = [req("/api/a", x_api_key="alpha")]
    first, _ = recorded(tmp_path, HEADER_POLICY, sent)
    second, _ = recorded(tmp_path, HEADER_POLICY, sent, secrets={"EDGEGEN_KEY_SECRET": "z" * 32})
    assert hashed(first[0][0]) and hashed(second[0][0]) and first != second


def test_hs256_tokens_that_do_not_verify_count_by_address(tmp_path: Path) -> None:
    """Only a token signed with the secret, unexpired, already valid, from the issuer, with
    a string or number claim gets its claim counted; everything else counts by address."""
    now = int(time.time())
    good = hs256(claims("alice"))
    tokens = {
        "good": bearer(good),
        "lower-case scheme": f"bearer {good}",
        "same sub": bearer(hs256(claims("alice", jti="2"))),
        "other sub": bearer(hs256(claims("bob"))),
        "numeric sub": bearer(hs256(claims(42))),
        "exp within leeway": bearer(hs256(claims("alice", exp=now - 20))),
        "nbf within leeway": bearer(hs256(claims("alice", nbf=now + 20))),
        "wrong key": bearer(hs256(claims("alice"), secret="guess")),
        "expired": bearer(hs256(claims("alice", exp=now - 120))),
        "no exp": bearer(hs256({"sub": "alice", "iss": "https://auth.example.com"})),
        "not yet valid": bearer(hs256(claims("alice", nbf=now + 600))),
        "other issuer": bearer(hs256(claims("alice", iss="https://evil.example"))),
        "alg none": f"Bearer {part({'alg': 'none'})}.{part(claims('alice'))}.",
        "alg HS512": bearer(hs256(claims("alice"), alg="HS512")),
        "crit": bearer(hs256(claims("alice"), crit=["exp"])),
        "object sub": bearer(hs256(claims({"id": 1}))),
        "not a jwt": "Bearer abc.def",
        "padded": bearer(good + "=="),
        "sent twice": [bearer(good), bearer(good)],
    }
    sent = [req("/api/a", authorization=value) for value in tokens.values()]
    keys, _ = recorded(tmp_path, HS256_POLICY, sent)
    got = dict(zip(tokens, (k for (k,) in keys), strict=True))
    alice = got["good"]
    assert hashed(alice)
    for name in ("lower-case scheme", "same sub", "exp within leeway", "nbf within leeway"):
        assert got[name] == alice, name
    assert hashed(got["other sub"]) and got["other sub"] != alice
    assert hashed(got["numeric sub"]) and got["numeric sub"] not in (alice, got["other sub"])
    accepted = {"good", "lower-case scheme", "same sub", "other sub", "numeric sub"}
    accepted |= {"exp within leeway", "nbf within leeway"}
    for name in set(tokens) - accepted:
        assert got[name] == IP_A, name


def test_hs256_without_its_secret_counts_by_address(tmp_path: Path) -> None:
    """A Worker without the JWT secret trusts no token (it cannot check one)."""
    sent = [req("/api/a", authorization=bearer(hs256(claims("alice"))))]
    keys, _ = recorded(tmp_path, HS256_POLICY, sent, secrets={"EDGEGEN_KEY_SECRET": KEY_SECRET})
    assert keys == [[IP_A]]
    keys, _ = recorded(
        tmp_path,
        HS256_POLICY,
        sent,
        secrets={"EDGEGEN_KEY_SECRET": KEY_SECRET, "JWT_SECRET": JWT_SECRET},
    )
    assert hashed(keys[0][0])


def _jwks_tokens() -> tuple[dict[str, Any], dict[str, str]]:
    """A JWKS of an RSA key (kid r1) and a P-256 key (kid e1), and tokens to try on it."""
    now = int(time.time())
    payload = {"sub": "alice", "aud": ["api", "other"], "exp": now + 600}
    rs, es = {"alg": "RS256", "kid": "r1"}, {"alg": "ES256", "kid": "e1"}

    def spec(key: int, header: dict[str, str], **changed: Any) -> dict[str, Any]:
        return {"key": key, "header": header, "payload": {**payload, **changed}}

    specs = {
        "rs256": spec(0, rs),
        "es256": spec(1, es),
        "no kid": spec(1, {"alg": "ES256"}),
        "bob": spec(0, rs, sub="bob"),
        "unknown kid": spec(0, {**rs, "kid": "r9"}),
        "kid of the other key": spec(0, {**rs, "kid": "e1"}),
        "other signer": spec(2, es),
        "wrong audience": spec(0, rs, aud="web"),
        "expired": spec(1, es, exp=now - 600),
    }
    signed = sign_with_node(
        [{"alg": "RS256"}, {"alg": "ES256"}, {"alg": "ES256"}], list(specs.values())
    )
    rsa, ec, _stranger = signed["jwks"]
    jwks = {"keys": [{**rsa, "kid": "r1", "use": "sig"}, {**ec, "kid": "e1", "alg": "ES256"}]}
    tokens = dict(zip(specs, signed["tokens"], strict=True))
    # Alg confusion: HS256 signed with the public key's bytes, as a confused verifier would
    # check it; and alg none.
    tokens["hs256 with the public key"] = hs256(payload, secret=rsa["n"], kid="r1")
    tokens["alg none"] = f"{part({'alg': 'none', 'kid': 'r1'})}.{part(payload)}."
    return jwks, tokens


def test_rs256_and_es256_tokens_verify_against_the_jwks(tmp_path: Path) -> None:
    """Tokens signed by a key of the JWKS get their claim counted; a token naming an unknown
    kid, signed by another key, for another audience, expired, HS256 against the public key
    or unsigned counts by address. The JWKS is fetched once for all of them."""
    jwks, tokens = _jwks_tokens()
    sent = [req("/api/a", authorization=bearer(token)) for token in tokens.values()]
    outbound = {JWKS_URL: {"status": 200, "body": json.dumps(jwks)}}
    keys, fetched = recorded(tmp_path, JWKS_POLICY, sent, outbound=outbound)
    got = dict(zip(tokens, (k for (k,) in keys), strict=True))
    alice = got["rs256"]
    assert hashed(alice) and got["es256"] == alice and got["no kid"] == alice
    assert hashed(got["bob"]) and got["bob"] != alice
    for name in (
        "unknown kid",
        "kid of the other key",
        "other signer",
        "wrong audience",
        "expired",
        "hs256 with the public key",
        "alg none",
    ):
        assert got[name] == IP_A, name
    # Cached: one fetch, although a token named an unknown kid (a refresh waits 30 s).
    assert fetched == {JWKS_URL: 1}


@pytest.mark.parametrize(
    "answer",
    [
        {"status": 500, "body": "down"},
        {"status": 200, "body": "not json"},
        {"status": 200, "body": json.dumps({"keys": "none"})},
        {"status": 200, "body": json.dumps({"keys": []}) + " " * 70_000},
        {"status": 200, "body": "{}", "delayMs": 2500},
    ],
    ids=["error", "not json", "no key list", "too large", "slow"],
)
def test_a_jwks_that_fails_leaves_tokens_unverified(tmp_path: Path, answer: dict[str, Any]) -> None:
    """A failing, malformed, oversized or slow JWKS verifies nothing: the requests count by
    address, and the Worker does not fetch it again for every token."""
    _jwks, tokens = _jwks_tokens()
    sent = [req("/api/a", authorization=bearer(tokens["rs256"])) for _ in range(3)]
    keys, fetched = recorded(tmp_path, JWKS_POLICY, sent, outbound={JWKS_URL: answer})
    assert keys == [[IP_A]] * 3
    assert fetched == {JWKS_URL: 1}


def test_generated_files_never_hold_a_secret(tmp_path: Path) -> None:
    """The Worker, wrangler.toml and Terraform name the secrets and never hold a value; the
    Terraform takes them as sensitive inputs."""
    artifacts = edgegen.build(policy.loads(HS256_POLICY))
    assert artifacts.worker is not None
    assert artifacts.worker.secrets == ("EDGEGEN_KEY_SECRET", "JWT_SECRET")
    files = artifacts.files()
    assert all(JWT_SECRET not in text and KEY_SECRET not in text for text in files.values())
    toml = artifacts.worker.wrangler_toml
    assert "wrangler secret put EDGEGEN_KEY_SECRET" in toml
    assert "wrangler secret put JWT_SECRET" in toml
    assert artifacts.terraform is not None
    assert 'variable "secret_jwt_secret"' in artifacts.terraform
    assert "sensitive   = true" in artifacts.terraform


def test_a_jwks_answered_within_the_time_limit_verifies(tmp_path: Path) -> None:
    """The counter-case of the slow JWKS: an answer after 300 ms is waited for and used."""
    jwks, tokens = _jwks_tokens()
    sent = [req("/api/a", authorization=bearer(tokens["es256"]))]
    answer = {"status": 200, "body": json.dumps(jwks), "delayMs": 300}
    keys, fetched = recorded(tmp_path, JWKS_POLICY, sent, outbound={JWKS_URL: answer})
    assert hashed(keys[0][0])
    assert fetched == {JWKS_URL: 1}


# --- edge.tiers: the app's per-tier rates at the edge ------------------------------------

TIERS_POLICY = """\
version: 1
cloudflare:
  plan: free
  worker: { name: keys-test, routes: ["api.example.com/*"] }
tiers: [free, pro]
limits:
  - name: api
    match: { path_prefix: /api/ }
    edge:
      rate: 2/1m
      per: { jwt: { claim: sub, tier: tier, secret: JWT_SECRET } }
      tiers: true
    app: { tiers: { free: 3/1m, pro: [5/1m, 1000/1h] } }
"""


def test_a_verified_tier_is_held_to_its_app_rate_at_the_edge(tmp_path: Path) -> None:
    """A free caller stops after 3, a pro caller after 5 (the app's per-minute rates); a
    caller in a tier the policy does not list gets rate (2), per its claim; a forged token
    claiming pro gets rate per address."""

    def token(sub: str, tier: str, secret: str = JWT_SECRET) -> str:
        return bearer(hs256(claims(sub, tier=tier), secret=secret))

    sent = [
        *(req("/api/a", authorization=token("alice", "free")) for _ in range(4)),
        *(req("/api/a", authorization=token("bob", "pro")) for _ in range(6)),
        *(req("/api/a", authorization=token("carol", "platinum")) for _ in range(3)),
        *(req("/api/a", IP_B, authorization=token("mallory", "pro", "guess")) for _ in range(3)),
    ]
    statuses = run_generated(tmp_path, TIERS_POLICY, sent)
    assert statuses == [
        *([200] * 3 + [429]),
        *([200] * 5 + [429]),
        *([200] * 2 + [429]),
        *([200] * 2 + [429]),
    ]


COOKIE_TOKEN_POLICY = """\
version: 1
cloudflare:
  plan: free
  worker: { name: keys-test, routes: ["api.example.com/*"] }
limits:
  - name: api
    match: { path_prefix: /api/ }
    edge: { rate: 2/1m, per: { jwt: { claim: uid, cookie: token, secret: JWT_SECRET } } }
  - name: web
    match: { path_prefix: /web/ }
    edge: { rate: 2/1m, per: { jwt: { header: X-Token, secret: JWT_SECRET, leeway: 1s } } }
"""


def test_tokens_in_a_cookie_or_another_header(tmp_path: Path) -> None:
    """The token is read where the policy says: a cookie (its first copy), or a header of
    its own (a Bearer scheme is stripped there too); leeway 1s refuses a token expired a
    moment ago. The authorization header is not looked at for them."""
    now = int(time.time())
    good = hs256({"uid": 7, "sub": "s", "exp": now + 600})
    old = hs256({"sub": "s", "exp": now - 5})
    sent = [
        req("/api/a", Cookie=f"token={good}; theme=dark"),
        req("/api/a", Cookie=f"token={good}; token=junk"),
        req("/api/a", Cookie=f"token=junk; token={good}"),
        req("/api/a", authorization=bearer(good)),
        req("/web/a", x_token=good),
        req("/web/a", x_token=bearer(good)),
        req("/web/a", x_token=old),
    ]
    keys, _ = recorded(tmp_path, COOKIE_TOKEN_POLICY, sent)
    flat = [k for (k,) in keys]
    assert hashed(flat[0]) and flat[1] == flat[0]
    assert flat[2:4] == [IP_A, IP_A]
    assert hashed(flat[4]) and flat[5] == flat[4] and flat[4] != flat[0]
    assert flat[6] == IP_A


def test_wrangler_dry_run_accepts_keyed_and_tiered_workers(tmp_path: Path) -> None:
    """`wrangler deploy --dry-run` accepts the Worker (module and wrangler.toml) of a policy
    with JWT keys and edge tiers, and lists every binding, tier bindings included."""
    worker = build(tmp_path, TIERS_POLICY)
    require_node_modules()
    result = subprocess.run(
        ["node", str(HARNESS / "dryrun.mjs"), str(tmp_path / "worker")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=WORKERS,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert len(worker.bindings) == 3
    for binding in worker.bindings:
        assert f"env.{binding['name']}" in output, output
