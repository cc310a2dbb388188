"""``count_when`` through plan and apply against the fake zone: the counting expression is
written, read back as written (a second plan shows no change), and a change of the
statuses is a planned field change of the rule."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cloudflare_fake import ACCOUNT_ID, TOKEN, ZONE_ID, FakeCloudflare
from zone_support import Sleeps

from edgegen import cli
from edgegen.cloudflare import _client
from edgegen.compiler import _ids

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "policy.yaml"
LOGIN_EDGE = "    edge: { rate: 20/1m, action: managed_challenge, unauthenticated_only: false }\n"


@pytest.fixture
def zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCloudflare]:
    """An empty fake zone on the business plan; the client's waits are recorded, not slept."""
    monkeypatch.setattr(_client, "_sleep", Sleeps())
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", TOKEN)
    monkeypatch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
    monkeypatch.delenv("CLOUDFLARE_API_BASE_URL", raising=False)
    fake = FakeCloudflare()
    with fake.mock():
        yield fake


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def policy_with(tmp_path: Path, statuses: str) -> Path:
    """The example policy, its login limit counting only answers of ``statuses``."""
    text = EXAMPLE.read_text()
    assert LOGIN_EDGE in text
    text = text.replace(LOGIN_EDGE, f"    count_when: {{ status: {statuses} }}\n" + LOGIN_EDGE)
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_count_when_is_applied_and_read_back_unchanged(
    zone: FakeCloudflare, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """apply writes the counting expression; the next plan finds nothing to change; a new
    list of statuses is one planned change of the rule, which apply makes in place."""
    path = policy_with(tmp_path, "[401, 403]")
    code, _, err = run(capsys, "apply", path, "--auto-approve")
    assert code == 0, err
    [rule] = [r for r in zone.rules if r["ref"] == _ids.rule_ref("login")]
    counting = rule["ratelimit"]["counting_expression"]
    assert counting.endswith("and http.response.code in {401 403}")
    code, out, _ = run(capsys, "plan", path, "--detailed-exitcode")
    assert code == 0, out
    assert "No changes" in out
    path.write_text(path.read_text().replace("[401, 403]", "[401]"))
    code, out, _ = run(capsys, "plan", path, "--detailed-exitcode")
    assert code == 2
    assert "counting_expression" in out
    assert run(capsys, "apply", path, "--auto-approve")[0] == 0
    [after] = [r for r in zone.rules if r["ref"] == _ids.rule_ref("login")]
    assert after["id"] == rule["id"]
    assert after["ratelimit"]["counting_expression"].endswith("and http.response.code eq 401")


def test_a_plan_without_counting_expressions_refuses_a_hand_made_one(
    zone: FakeCloudflare,
) -> None:
    """The fake behaves like Cloudflare on a Pro zone: a rule with a counting expression
    is refused with a pointer at the field (which is why edgegen sends such limits to the
    Worker there)."""
    zone.plan = "pro"
    rule: dict[str, Any] = {
        "ref": "hand",
        "expression": 'http.request.uri.path eq "/login"',
        "action": "block",
        "ratelimit": {
            "characteristics": ["cf.colo.id", "ip.src"],
            "period": 60,
            "requests_per_period": 5,
            "mitigation_timeout": 60,
            "counting_expression": "http.response.code eq 401",
        },
    }
    errors = zone.validate_rules([rule])
    assert [e["source"]["pointer"] for e in errors] == ["/rules/0/ratelimit/counting_expression"]


def test_a_rejected_counting_expression_points_at_count_when(tmp_path: Path) -> None:
    """Should Cloudflare refuse the counting expression, the rejection is located at the
    limit's count_when, where the statuses it was compiled from are written."""
    import edgegen_policy as policy

    from edgegen.zone._rejections import Rejection, locate_rejections

    path = policy_with(tmp_path, "[401, 403]")
    loaded = policy.load(path)
    text = path.read_text().splitlines()
    [line] = [i + 1 for i, row in enumerate(text) if "count_when:" in row]
    rejection = Rejection(
        index=0, ref=None, limit="login", field="ratelimit.counting_expression", code=1,
        message="no",
    )  # fmt: skip
    [found] = locate_rejections([rejection], loaded)
    assert found.where is not None and found.where.startswith(f"{path}:{line}:")
