"""``per:`` naming a key of the app's own (``per: org``): the model takes it, lint says at
the field's line when a name cannot be used (L005) and what the edge counts instead
(L111), the app refuses a policy lint stops, and ``edgegen diff`` reports a change of
``per``."""

from __future__ import annotations

from pathlib import Path

import edgegen_policy as policy
import pytest
from edgegen_policy import AppKey, Layer, Severity

from applimit import ConfigurationError, Limiter
from edgegen import _diff

BASE = """\
version: 1
cloudflare: { plan: enterprise }
authenticated_when: { headers: [authorization] }
limits:
  - name: api
    match: { path_prefix: /api/ }
"""


def _lint(body: str) -> dict[str, list[policy.Diagnostic]]:
    found: dict[str, list[policy.Diagnostic]] = {}
    for d in policy.lint(policy.loads(BASE + body, "policy.yaml")):
        found.setdefault(d.code, []).append(d)
    return found


def test_per_takes_the_built_in_keys_and_any_app_key() -> None:
    """user and ip stay the built-in keys; another name is an app key, kept as written,
    and written back as plain text."""
    for per, expected in (("user", AppKey.USER), ("ip", AppKey.IP)):
        loaded = policy.loads(BASE + f"    app: {{ per: {per}, tiers: {{ default: 1/1s }} }}\n")
        assert loaded.limits[0].app is not None
        assert loaded.limits[0].app.per is expected
    loaded = policy.loads(BASE + "    app: { per: org, tiers: { default: 1/1s } }\n")
    app = loaded.limits[0].app
    assert app is not None
    assert not isinstance(app.per, AppKey)
    assert (app.per, app.per.value) == ("org", "org")
    assert loaded.model_dump(mode="json")["limits"][0]["app"]["per"] == "org"


@pytest.mark.parametrize(
    ("per", "message", "fix"),
    [
        ("Org", "'Org' is not a key name: use a lower-case letter", "per: org or per: api_key"),
        ("api-key", "'api-key' is not a key name", "per: org or per: api_key"),
        ('"1st"', "'1st' is not a key name", "per: org or per: api_key"),
        ('""', "'' is not a key name", "per: org or per: api_key"),
        ("IP", "'IP' is the built-in key 'ip' in another case", "write per: ip"),
        ("User", "'User' is the built-in key 'user' in another case", "write per: user"),
    ],
)
def test_unusable_key_names_are_located_errors(per: str, message: str, fix: str) -> None:
    """L005: an error at the per: field's line and column that stops the app (not the edge),
    saying what a key name is, or which built-in key was meant."""
    found = _lint(f"    app:\n      per: {per}\n      tiers: {{ default: 1/1s }}\n")
    [error] = found["L005"]
    assert error.severity is Severity.ERROR
    assert (error.file, error.line, error.column, error.path) == (
        "policy.yaml",
        8,
        12,
        "limits[0].app.per",
    )
    assert message in error.message
    assert fix in error.fix
    assert error.stops == frozenset({Layer.APP})


def test_the_app_refuses_a_policy_with_an_unusable_key_name() -> None:
    """The limiter goes through the same gate: an unusable per: stops it, naming L005."""
    loaded = policy.loads(BASE + "    app: { per: Org, tiers: { default: 1/1s } }\n")
    with pytest.raises(ConfigurationError, match="'Org' is not a key name"):
        Limiter(loaded, redis_url="redis://127.0.0.1:1/0")


def test_the_edge_part_of_a_per_key_limit_counts_per_ip() -> None:
    """L111 (info) says what the edge counts for a limit the app counts per organisation;
    like per: user, an edge limit on anonymous traffic does not hide it (no L102)."""
    found = _lint("    edge: { rate: 10/1m }\n    app: { per: org, tiers: { default: 100/1m } }\n")
    [info] = found["L111"]
    assert info.severity is Severity.INFO
    assert info.path == "limits[0].edge"
    assert "counts per org in the app" in info.message
    assert "counts per client IP (10/1m per IP)" in info.message
    assert "L102" not in found
    assert "L111" not in _lint("    edge: { rate: 10/1m }\n    app: { tiers: { default: 1/1s } }\n")


def test_edgegen_diff_reports_a_change_of_per(tmp_path: Path) -> None:
    """Moving a limit from per user to per org is a semantic change in the diff."""
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(BASE + "    app: { tiers: { default: 100/1m } }\n")
    new.write_text(BASE + "    app: { per: org, tiers: { default: 100/1m } }\n")
    result = _diff.diff(_diff.load_version(str(old)), _diff.load_version(str(new)))
    [change] = result.changes
    assert change.kind == "app_key"
    assert (
        change.render(markdown=False) == "limit 'api': app counts per changed from 'user' to 'org'"
    )


@pytest.mark.parametrize("per", ["5", "[org]", "{org: acme}"])
def test_a_per_that_is_not_a_name_is_one_load_error(per: str) -> None:
    """A number, list or mapping for per: is one located error saying what to write, not
    one error per kind of key the field takes."""
    with pytest.raises(policy.PolicyLoadError) as error:
        policy.loads(BASE + f"    app: {{ per: {per}, tiers: {{ default: 1/1s }} }}\n")
    [found] = error.value.diagnostics
    assert found.path == "limits[0].app.per"
    assert "is not a key name; write user, ip, or a key of the app's own" in found.message
