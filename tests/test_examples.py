"""The examples that `make demo` runs keep working: offline plan and policy diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgegen import cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_offline_plan_against_the_example_zone_state(capsys: pytest.CaptureFixture[str]) -> None:
    """The pulled example state plans with no token: changes, and the dashboard rule kept."""
    code = cli.main(
        [
            "plan",
            str(EXAMPLES / "policy.yaml"),
            "--state",
            str(EXAMPLES / "zone-state.json"),
            "--detailed-exitcode",
        ]
    )
    out = capsys.readouterr().out
    assert code == 2
    assert "ratelimit.requests_per_period: 10 -> 20" in out
    assert "1 rule not managed by edgegen kept in place" in out
    assert "Block WordPress probes" in out


def test_diff_of_the_example_versions(capsys: pytest.CaptureFixture[str]) -> None:
    """The previous and current example policies differ in the ways the demo describes."""
    code = cli.main(["diff", str(EXAMPLES / "policy-previous.yaml"), str(EXAMPLES / "policy.yaml")])
    out = capsys.readouterr().out
    assert code == 0
    assert "limit 'api': app rate for tier 'free' loosened from '60/1m' to '100/1m' (+67%)" in out
    assert "limit 'webhooks' is added" in out


def test_previous_example_policy_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    """The previous version is itself a clean policy (--strict)."""
    assert cli.main(["validate", "--strict", str(EXAMPLES / "policy-previous.yaml")]) == 0
