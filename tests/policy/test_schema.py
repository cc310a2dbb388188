"""``edgegen schema`` is the loader's truth: every document the loader accepts passes it.

The schema is generated from the model the loader validates with (``policy/_schema.py``);
these tests hold the two together on the project's own examples, on the shortcuts the
issue named, and on documents generated from a small grammar of the policy's fields.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

import policy
from policy._loader import parse

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# What ${VAR} references in generated documents expand to (some are left unset).
ENV = {"RATE": "100/1m", "FLAG": "true", "WAIT": "10s", "COUNT": "5"}

SCHEMA = policy.json_schema()
VALIDATOR = Draft202012Validator(SCHEMA)


def _schema_errors(document: object) -> list[str]:
    return [f"{error.json_path}: {error.message}" for error in VALIDATOR.iter_errors(document)]


def _loads(text: str) -> policy.Policy | None:
    """The policy, or None when the loader refuses the text."""
    try:
        return policy.loads(text, "policy.yaml", env=ENV)
    except policy.PolicyLoadError:
        return None


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    """Editors and CI validators can read it: it checks against the draft's metaschema."""
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_cli_prints_the_same_schema() -> None:
    """``edgegen schema`` prints exactly ``policy.json_schema()``."""
    done = subprocess.run(
        [sys.executable, "-m", "edgegen.cli", "schema"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert json.loads(done.stdout) == SCHEMA


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_policy_passes_the_schema(path: Path) -> None:
    """Each policy in examples/ passes as written (what an editor sees, ``${VAR}`` and
    all) and as the loader reads it once the environment is expanded."""
    text = path.read_text(encoding="utf-8")
    policy.loads(text, str(path), env={})
    assert _schema_errors(yaml.safe_load(text)) == []
    expanded, _ = parse(text, str(path), env={})
    assert _schema_errors(expanded) == []


@pytest.mark.parametrize(
    "fragment",
    [
        "match: { path_prefix: /api/ }\n    edge: { rate: 10/1m }",
        "match: { methods: POST, paths: /login, hosts: api.example.com }\n"
        "    edge: { rate: 10/1m }",
        "edge: { rate: 10/1m, timeout: 1 }",
        "edge: { rate: ' 10 / 1 m ', timeout: ' 10s ', unauthenticated_only: 'off' }",
        "edge: { rate: '${RATE}', timeout: '${WAIT}' }",
        "app: { algorithm: gcra, burst: '5', enforce: 'yes', tiers: { default: 10/1m } }",
        "app: { algorithm: gcra, burst: '${COUNT}', enforce: '${FLAG}', "
        "tiers: { default: [10/1m, 100/1h] } }",
    ],
)
def test_shortcuts_the_loader_takes_pass_the_schema(fragment: str) -> None:
    """The forms the issue found refused by the schema: a prefix as a string, a scalar
    method, a timeout in seconds, and text the loader coerces (or expands) into a value."""
    text = f"version: 1\nlimits:\n  - name: api\n    {fragment}\n"
    assert _loads(text) is not None, text
    assert _schema_errors(yaml.safe_load(text)) == []


def test_an_unquoted_date_is_read_as_text() -> None:
    """``compatibility_date: 2025-01-01`` (a date to YAML 1.1, text to editors) loads."""
    text = textwrap.dedent(
        """\
        version: 1
        cloudflare:
          plan: free
          worker: { name: edge, compatibility_date: 2025-01-01 }
        """
    )
    loaded = policy.loads(text)
    assert loaded.cloudflare is not None and loaded.cloudflare.worker is not None
    assert loaded.cloudflare.worker.compatibility_date == "2025-01-01"
    expanded, _ = parse(text, "policy.yaml", env={})
    assert _schema_errors(expanded) == []


def test_a_boolean_is_not_a_version() -> None:
    """``version: true`` is refused by both (pydantic alone would read it as 1)."""
    text = "version: true\n"
    with pytest.raises(policy.PolicyLoadError, match="not a version"):
        policy.loads(text)
    assert _schema_errors(yaml.safe_load(text)) != []


def test_defaults_are_written_as_a_file_writes_them() -> None:
    """A duration's default reads ``50ms`` in the schema, not the object that holds it."""
    assert SCHEMA["$defs"]["App"]["properties"]["timeout"]["default"] == "50ms"


# --- a small grammar of the policy's fields, valid and invalid values mixed -----------


def _one_or_list(values: list[Any]) -> st.SearchStrategy[Any]:
    """A field that takes one value or a list: the scalar shortcut and the list form."""
    item = st.sampled_from(values)
    return st.one_of(item, st.lists(item, max_size=3))


def _section(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A mapping with some of its fields; now and then with an unknown field, or not a
    mapping at all (rarely, so that most documents get far enough to be accepted)."""
    mapping = st.fixed_dictionaries(required, optional=optional)
    odd = st.one_of(
        mapping.map(lambda fields: {**fields, "unknown_field": 1}),
        st.sampled_from([None, "text", 3]),
    )
    return st.integers(0, 15).flatmap(lambda n: odd if n == 0 else mapping)


# Each pool holds valid forms (most of them: documents must get far enough to be accepted)
# and a few invalid ones.
RATES = ["100/1m", "5/10s", " 3 / 2m ", "1/d", "7/250ms", "${RATE}", "10/1min", "0/1m", 100]
DURATIONS = ["10s", "50ms", "1m", 1, 600, " 2 m ", "${WAIT}", "1min", 0, -1, 1.5, True]
BOOLS = [True, False, "yes", "off", "TRUE", 1, 0, "${FLAG}", 2, "maybe", None]
INTS = [1, 5, 64, 128, "5", " 7 ", "5.0", 5.0, True, "${COUNT}", 0, 200, 5.5, "x", 20_000]
NAMES = ["api", "login", "Pro", "checkout", "", " x", "a\tb", 7]
TIERS = ["free", "pro", "default", "9lives"]

rates = st.one_of(st.sampled_from(RATES), st.lists(st.sampled_from(RATES), max_size=3))
match = _section(
    {},
    {
        "paths": _one_or_list(["/login", "/api/items", "login", "/a//b", "/%41", 3]),
        "path_prefix": _one_or_list(["/api/", "/", "api/", "/x?y"]),
        "methods": _one_or_list(["POST", "get", "FETCH", 1]),
        "hosts": _one_or_list(["api.example.com", "*.example.com", "http://x/"]),
    },
)
edge = _section(
    {"rate": st.sampled_from(RATES)},
    {
        "action": st.sampled_from(["block", "log", "managed_challenge", "ban"]),
        "timeout": st.sampled_from(DURATIONS),
        "unauthenticated_only": st.sampled_from(BOOLS),
        "credentialed_rate": st.sampled_from([*RATES, None]),
        "target": st.sampled_from(["auto", "rule", "worker", "lambda"]),
        "per": st.sampled_from(["ip", "user"]),
    },
)
app_limit = _section(
    {"tiers": st.dictionaries(st.sampled_from(TIERS), rates, max_size=3)},
    {
        "per": st.sampled_from(["user", "ip", "org", "", 3]),
        "algorithm": st.sampled_from(["sliding_log", "sliding_window", "gcra", "token_bucket"]),
        "burst": st.sampled_from([*INTS, None]),
        "enforce": st.sampled_from(BOOLS),
        "on_redis_error": st.sampled_from(["allow", "deny", "maybe", None]),
        "mode": st.sampled_from(["exact", "approximate"]),
        "sync_every": st.sampled_from([*INTS, None]),
        "sync_interval": st.sampled_from([*DURATIONS, None]),
    },
)
limit = _section(
    {"name": st.sampled_from(NAMES)},
    {
        "description": st.sampled_from(["why", "", None, 5]),
        "match": match,
        "edge": edge,
        "app": app_limit,
    },
)
documents = _section(
    {"version": st.sampled_from([1, 1, 1, 2, "1", True, 1.0, "${UNSET}"])},
    {
        "cloudflare": _section(
            {"plan": st.sampled_from(["free", "pro", "business", "enterprise", "gold"])},
            {
                "zone_id": st.sampled_from(["", "0" * 32, "xyz", None, "${ZONE:-}"]),
                "account_id": st.sampled_from(["f" * 32, None]),
                "worker": _section(
                    {"name": st.sampled_from(["edge", "Edge", "-x"])},
                    {
                        "routes": _one_or_list(["api.example.com/*", "https://x/*", "x"]),
                        "compatibility_date": st.sampled_from(["2025-01-01", "soon"]),
                    },
                ),
            },
        ),
        "authenticated_when": _section(
            {},
            {
                "headers": _one_or_list(["authorization", "x-api-key", "bad header"]),
                "cookies": _one_or_list(["session", "a;b"]),
            },
        ),
        "tiers": _one_or_list(TIERS),
        "clients": _section({}, {"ipv6_prefix": st.sampled_from(INTS)}),
        "app": _section(
            {},
            {
                "redis_url": st.sampled_from(["redis://localhost:6379/0", "memcached://x", 5]),
                "key_prefix": st.sampled_from(["rl", "bad prefix", ""]),
                "on_redis_error": st.sampled_from(["allow", "deny", "maybe"]),
                "timeout": st.sampled_from(DURATIONS),
            },
        ),
        "limits": st.one_of(st.lists(limit, max_size=3), st.sampled_from([None, "api"])),
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_what_the_loader_accepts_the_schema_accepts(document: Any) -> None:
    """Loader-valid policies pass the schema; documents the schema rejects are rejected
    by the loader (the same law, read both ways: the schema may only be the wider)."""
    text = yaml.safe_dump(document, sort_keys=False)
    assert yaml.safe_load(text) == document
    loaded = _loads(text)
    errors = _schema_errors(document)
    if loaded is not None:
        assert errors == [], f"the loader accepts this, the schema does not:\n{text}"
    if errors:
        assert loaded is None, f"the schema rejects this, the loader accepts it:\n{text}"
