"""``edgegen schema`` is the loader's truth: every document the loader accepts passes it.

The schema is generated from the model the loader validates with
(``policy/edgegen_policy/_schema.py``);
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

import edgegen_policy as policy
import pytest
import yaml
from edgegen_policy._loader import parse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

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


@pytest.mark.parametrize(
    "fragment",
    [
        "app: { algorithm: gcra, burst: yes, tiers: { default: 10/1m } }",
        "app: { mode: approximate, sync_every: true, tiers: { default: 10/1m } }",
    ],
)
def test_a_boolean_is_not_a_count(fragment: str) -> None:
    """``burst: yes`` is refused by both, where pydantic alone would read it as a burst of 1."""
    text = f"version: 1\nlimits:\n  - name: api\n    {fragment}\n"
    with pytest.raises(policy.PolicyLoadError, match="true is not a number"):
        policy.loads(text)
    assert _schema_errors(yaml.safe_load(text)) != []


def test_defaults_are_written_as_a_file_writes_them() -> None:
    """A duration's default reads ``50ms`` in the schema, not the object that holds it."""
    assert SCHEMA["$defs"]["App"]["properties"]["timeout"]["default"] == "50ms"


# --- a small grammar of the policy's fields, valid and invalid values mixed -----------


def _pick(valid: list[Any], invalid: list[Any]) -> st.SearchStrategy[Any]:
    """A value of a field: valid nine times in ten, so that most documents get far enough
    for the loader to accept them, and the rest find where the schema is too narrow."""
    good, bad = st.sampled_from(valid), st.sampled_from(invalid)
    return st.integers(0, 9).flatmap(lambda n: bad if n == 0 else good)


def _one_or_list(valid: list[Any], invalid: list[Any]) -> st.SearchStrategy[Any]:
    """A field that takes one value or a list: the scalar shortcut and the list form."""
    item = _pick(valid, invalid)
    return st.one_of(item, st.lists(item, max_size=3))


def _section(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A mapping with some of its fields; now and then with an unknown field, or not a
    mapping at all."""
    mapping = st.fixed_dictionaries(required, optional=optional)
    odd = st.one_of(
        mapping.map(lambda fields: {**fields, "unknown_field": 1}),
        st.sampled_from([None, "text", 3]),
    )
    return st.integers(0, 15).flatmap(lambda n: odd if n == 0 else mapping)


# Valid spellings include every shortcut the loader takes: text with spaces, numbers and
# booleans written as text, durations in seconds, ${VAR} references (see ENV).
RATES = ["100/1m", "5/10s", " 3 / 2m ", "1/d", "7/250ms", "${RATE}"]
BAD_RATES = ["10/1min", "0/1m", 100, "${UNSET}", ["10/1m"]]
DURATIONS = ["10s", "50ms", "1m", 1, 600, " 2 m ", "${WAIT}"]
BAD_DURATIONS = ["1min", 0, -1, 1.5, True, "10"]
BOOLS = [True, False, "yes", "off", "TRUE", "n", 1, 0, 1.0, "${FLAG}"]
BAD_BOOLS = [2, "maybe", None, " yes", "1.0"]
COUNTS = [1, 5, "5", " 7 ", "+3", "5.0", "1_0", 5.0, "${COUNT}"]
BAD_COUNTS = [0, 5.5, "x", "0x10", 20_000, True]
PREFIXES = [64, 48, 128, "64", " 56 ", "64.0", 64.0]
BAD_PREFIXES = [0, 129, "sixty", True, 64.5]
TIERS = ["free", "pro", "default"]

rates = st.one_of(_pick(RATES, BAD_RATES), st.lists(_pick(RATES, BAD_RATES), max_size=3))
match = _section(
    {},
    {
        "paths": _one_or_list(["/login", "/api/items"], ["login", "/a//b", "/%41", 3]),
        "path_prefix": _one_or_list(["/api/", "/"], ["api/", "/x?y"]),
        "methods": _one_or_list(["POST", "get", "HEAD"], ["FETCH", 1]),
        "hosts": _one_or_list(["api.example.com", "*.example.com"], ["http://x/", ""]),
    },
)
edge = _section(
    {"rate": _pick(RATES, BAD_RATES)},
    {
        "action": _pick(["block", "log", "managed_challenge"], ["ban", "BLOCK"]),
        "timeout": _pick(DURATIONS, BAD_DURATIONS),
        "unauthenticated_only": _pick(BOOLS, BAD_BOOLS),
        "credentialed_rate": _pick([*RATES, None], BAD_RATES),
        "target": _pick(["auto", "rule", "worker"], ["lambda"]),
        "per": _pick(["ip"], ["user"]),
    },
)
_app_common = {
    "per": _pick(["user", "ip", "org"], ["", 3]),
    "enforce": _pick(BOOLS, BAD_BOOLS),
    "on_redis_error": _pick(["allow", "deny", None], ["maybe"]),
}
app_limit = st.one_of(
    # Any combination (burst without gcra, sync_every without approximate mode, ...).
    _section(
        {"tiers": st.dictionaries(st.sampled_from(TIERS), rates, min_size=1, max_size=3)},
        {
            **_app_common,
            "algorithm": _pick(["sliding_log", "sliding_window", "gcra"], ["token_bucket"]),
            "burst": _pick([*COUNTS, None], BAD_COUNTS),
            "mode": _pick(["exact", "approximate"], ["fast"]),
            "sync_every": _pick([*COUNTS, None], BAD_COUNTS),
            "sync_interval": _pick([*DURATIONS, None], BAD_DURATIONS),
        },
    ),
    # The combinations the model allows, so that their numbers and flags get tried.
    _section(
        {
            "tiers": st.dictionaries(st.sampled_from(TIERS), rates, min_size=1, max_size=3),
            "algorithm": st.just("gcra"),
        },
        {**_app_common, "burst": _pick([*COUNTS, None], BAD_COUNTS)},
    ),
    _section(
        {
            "tiers": st.dictionaries(st.sampled_from(TIERS), rates, min_size=1, max_size=3),
            "mode": st.just("approximate"),
        },
        {
            **_app_common,
            "sync_every": _pick([*COUNTS, None], BAD_COUNTS),
            "sync_interval": _pick([*DURATIONS, None], BAD_DURATIONS),
        },
    ),
)
limit = _section(
    {"tiers": st.dictionaries(st.sampled_from(TIERS), rates, min_size=1, max_size=3)},
    {
        "per": _pick(["user", "ip", "org"], ["", 3]),
        "algorithm": _pick(["sliding_log", "sliding_window", "gcra"], ["token_bucket"]),
        "burst": _pick([*COUNTS, None], BAD_COUNTS),
        "enforce": _pick(BOOLS, BAD_BOOLS),
        "on_redis_error": _pick(["allow", "deny", None], ["maybe"]),
        "mode": _pick(["exact", "approximate"], ["fast"]),
        "sync_every": _pick([*COUNTS, None], BAD_COUNTS),
        "sync_interval": _pick([*DURATIONS, None], BAD_DURATIONS),
    },
)
limit = _section(
    {"name": _pick(["api", "login", "Pro", "checkout"], ["", " x", "a\tb", 7])},
    {
        "description": _pick(["why", None], ["", 5]),
        "match": match,
        "edge": edge,
        "app": app_limit,
    },
)
documents = _section(
    {"version": _pick([1, 1.0], [2, "1", True, "${UNSET}"])},
    {
        "cloudflare": _section(
            {"plan": _pick(["free", "pro", "business", "enterprise"], ["gold"])},
            {
                "zone_id": _pick(["", "0" * 32, None, "${ZONE:-}"], ["xyz"]),
                "account_id": _pick(["f" * 32, None], ["F" * 32]),
                "worker": _section(
                    {"name": _pick(["edge"], ["Edge", "-x"])},
                    {
                        "routes": _one_or_list(["api.example.com/*"], ["https://x/*", "x"]),
                        "compatibility_date": _pick(["2025-01-01"], ["soon"]),
                    },
                ),
            },
        ),
        "authenticated_when": _section(
            {},
            {
                "headers": _one_or_list(["authorization", "x-api-key"], ["bad header"]),
                "cookies": _one_or_list(["session"], ["a;b"]),
            },
        ),
        "tiers": _one_or_list(TIERS, ["9lives"]),
        "clients": _section({}, {"ipv6_prefix": _pick(PREFIXES, BAD_PREFIXES)}),
        "app": _section(
            {},
            {
                "redis_url": _pick(["redis://localhost:6379/0"], ["memcached://x", 5]),
                "key_prefix": _pick(["rl", "app.v2"], ["bad prefix", ""]),
                "on_redis_error": _pick(["allow", "deny"], ["maybe"]),
                "timeout": _pick(DURATIONS, BAD_DURATIONS),
            },
        ),
        "limits": st.one_of(st.lists(limit, max_size=3), st.sampled_from([None, "api"])),
    },
)


# Whole documents fail somewhere far more often than not; one limit under a plain header
# gets the limits' fields accepted (and checked against the schema) often enough too.
one_limit = limit.map(lambda generated: {"version": 1, "limits": [generated]})


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(documents, one_limit))
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
