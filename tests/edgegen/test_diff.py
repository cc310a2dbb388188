"""edgegen diff: golden outputs for each kind of change, git:REF:PATH, and PR-sized output.

Regenerate the golden files after an intended change with ``UPDATE_GOLDEN=1 pytest
tests/test_diff.py``, and review the diff of tests/golden/diff/ like any other change.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from edgegen import _diff, cli
from edgegen._diff import load_version, to_markdown, to_text
from edgegen.errors import UsageError

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "diff"
CASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

# The kinds of semantic change each case must report, and nothing else.
EXPECTED = {
    "action_and_timeout_changed": {"edge_action", "edge_timeout"},
    "algorithm_changed": {"algorithm"},
    "quotas_changed": {"quotas", "quota_timezone", "billing_day_from"},
    "app_rate_changed": {"app_rate"},
    "credentialed_rate_changed": {"edge_credentialed_rate"},
    "edge_loosened": {"edge_rate"},
    "edge_tightened": {"edge_rate"},
    "failure_policy_changed": {"failure_policy"},
    "ipv6_prefix_changed": {"ipv6_prefix"},
    "limit_added": {"limit_added"},
    "limit_removed": {"limit_removed"},
    "limit_renamed": {"limit_renamed"},
    "match_changed": {"match"},
    "middleware_toggled": {"middleware"},
    "no_changes": set(),
    "overrides_changed": {
        "override_added",
        "override_changed",
        "override_removed",
        "override_refresh",
    },
    "plan_changed": {"plan", "target_moved"},
    "shadow_toggled": {"shadow"},
    "target_moved": {"edge_target_setting", "target_moved"},
    "tier_added": {"tiers", "tier_added"},
    "tier_removed_from_limit": {"tier_removed"},
    "worker_route_added": {"worker_route"},
}


def outputs(case: str) -> tuple[_diff.PolicyDiff, dict[str, str]]:
    """The diff of a case, and its text and Markdown renderings."""
    cwd = Path.cwd()
    os.chdir(GOLDEN / case)
    try:
        result = _diff.diff(load_version("old.yaml"), load_version("new.yaml"))
    finally:
        os.chdir(cwd)
    return result, {"diff.txt": to_text(result), "diff.md": to_markdown(result)}


def test_every_case_is_listed() -> None:
    """At least ten kinds of change have a golden case, and each is checked below."""
    assert sorted(EXPECTED) == CASES
    assert len(CASES) >= 10


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    """The text and Markdown output of each case match tests/golden/diff/<case>/."""
    result, rendered = outputs(case)
    for name, text in rendered.items():
        path = GOLDEN / case / name
        if UPDATE:
            path.write_text(text)
        assert path.read_text() == text, f"{path} differs; UPDATE_GOLDEN=1 regenerates it"
    assert {c.kind for c in result.changes} == EXPECTED[case]


def test_percentages() -> None:
    """Rates are compared per second: 20/1m to 10/1m is -50%, 600/1m to 900/1m +50%."""
    assert "tightened from '20/1m' to '10/1m' (-50%)" in outputs("edge_tightened")[1]["diff.txt"]
    assert "loosened from '600/1m' to '900/1m' (+50%)" in outputs("edge_loosened")[1]["diff.txt"]
    app = outputs("app_rate_changed")[1]["diff.txt"]
    assert "app rate for tier 'free' tightened from '100/1m' to '80/1m' (-20%)" in app
    assert "app rate for tier 'pro' loosened from '1000/1m' to '1200/1m' (+20%)" in app


def test_credentialed_rates_and_ipv6_networks() -> None:
    """A limit's credentialed_rate is compared like its rate (a default one, ten times the
    rate, is "default"); clients.ipv6_prefix is named with both prefixes."""
    text = outputs("credentialed_rate_changed")[1]["diff.txt"]
    assert (
        "limit 'api': edge credentialed rate tightened from '6000/1m' to '3000/1m' (-50%)" in text
    )
    text = outputs("ipv6_prefix_changed")[1]["diff.txt"]
    assert "IPv6 clients are now counted per '/56' network (was '/64')" in text
    old = load_version(str(GOLDEN / "credentialed_rate_changed" / "old.yaml"))
    new = load_version(str(GOLDEN / "no_changes" / "old.yaml"))
    (change,) = _diff.diff(old, new).changes
    assert change.kind == "edge_credentialed_rate"
    assert change.render(markdown=False) == (
        "limit 'api': edge credentialed rate changed from '6000/1m' to 'default'"
    )


def test_moves_between_rule_and_worker() -> None:
    """A new plan that can express a limit as a rule moves it out of the Worker."""
    text = outputs("plan_changed")[1]["diff.txt"]
    assert "the zone's plan changed from 'business' to 'enterprise'" in text
    assert "limit 'api' moves from the Worker to a Cloudflare rule" in text
    assert "cloudflare/http_ratelimit.json: changed" in text


def test_no_changes() -> None:
    """Identical policies: no change in meaning, no changed file."""
    markdown = outputs("no_changes")[1]["diff.md"]
    assert "No change in meaning." in markdown
    assert "#### Generated artifacts\n\nNo changes." in markdown


def test_the_cli_prints_the_golden_output(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``edgegen diff OLD NEW --format markdown`` is the same text."""
    monkeypatch.chdir(GOLDEN / "target_moved")
    assert cli.main(["diff", "old.yaml", "new.yaml", "--format", "markdown"]) == 0
    assert capsys.readouterr().out == (GOLDEN / "target_moved" / "diff.md").read_text()


def test_a_version_that_does_not_build(tmp_path: Path) -> None:
    """The semantic diff is still shown; the artifacts are not compared."""
    old = (GOLDEN / "no_changes" / "old.yaml").read_text()
    (tmp_path / "old.yaml").write_text(old)
    (tmp_path / "new.yaml").write_text(old.replace("plan: business", "plan: free"))
    result = _diff.diff(
        load_version(str(tmp_path / "old.yaml")), load_version(str(tmp_path / "new.yaml"))
    )
    text = to_text(result)
    assert "does not build:" in text
    assert "Generated artifacts: not compared, since one version does not build" in text
    assert result.files == ()


def test_a_version_with_errors_is_not_diffed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The validity gate runs on both sides: a new version naming a tier the policy does
    not list (L002) fails the diff (exit 1, the finding located on stderr, nothing on
    stdout), in every format; so does an old one."""
    old = (GOLDEN / "no_changes" / "old.yaml").read_text()
    (tmp_path / "old.yaml").write_text(old)
    broken = old.replace("free:", "fre:", 1)
    assert broken != old
    (tmp_path / "new.yaml").write_text(broken)
    for pair in (("old.yaml", "new.yaml"), ("new.yaml", "old.yaml")):
        for fmt in ("text", "markdown", "json"):
            code = cli.main(["diff", *(str(tmp_path / p) for p in pair), "--format", fmt])
            out, err = capsys.readouterr()
            assert code == 1, (pair, fmt, err)
            assert out == ""
            assert "[error L002]" in err and "new.yaml has 1 error" in err
            assert "Traceback" not in err
    code = cli.main(
        ["diff", str(tmp_path / "old.yaml"), str(tmp_path / "new.yaml"), "--detailed-exitcode"]
    )
    assert code == 1


def test_markdown_fits_a_comment(tmp_path: Path) -> None:
    """A huge change is cut to fit a GitHub comment, saying so."""
    old = (GOLDEN / "no_changes" / "old.yaml").read_text()
    limit = "\n  - name: n{i}\n    match: {{ paths: [/p{i}/{x}] }}\n    edge: {{ rate: 5/10s }}\n"
    paths = "".join(limit.format(i=i, x="x" * 900) for i in range(150))
    (tmp_path / "old.yaml").write_text(old)
    (tmp_path / "new.yaml").write_text(old.rstrip("\n") + paths)
    result = _diff.diff(
        load_version(str(tmp_path / "old.yaml")), load_version(str(tmp_path / "new.yaml"))
    )
    markdown = to_markdown(result)
    assert len(markdown) < 65_536
    assert "more line(s) not shown, to fit a comment" in markdown


def git(repo: Path, *args: str) -> None:
    """Run git in a test repository."""
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository with two commits of policy.yaml (edge rate 20/1m, then 10/1m)."""
    case = GOLDEN / "edge_tightened"
    git(tmp_path, "init", "-q")
    (tmp_path / "policy.yaml").write_text((case / "old.yaml").read_text())
    git(tmp_path, "add", "policy.yaml")
    git(tmp_path, "commit", "-q", "-m", "one")
    (tmp_path / "policy.yaml").write_text((case / "new.yaml").read_text())
    git(tmp_path, "commit", "-q", "-am", "two")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_old_from_git(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``git:REF:PATH`` reads the policy as it was at REF."""
    assert cli.main(["diff", "git:HEAD~1:policy.yaml", "policy.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("edgegen diff git:HEAD~1:policy.yaml -> policy.yaml\n")
    assert "edge rate tightened from '20/1m' to '10/1m' (-50%)" in out


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("git:nope:policy.yaml", "check that the ref 'nope' exists"),
        ("git:HEAD:missing.yaml", "that 'missing.yaml' is in it"),
        ("git:HEAD", "is not git:REF:PATH"),
    ],
)
def test_git_errors(
    repo: Path, spec: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing ref or path is one clear line (exit 2), never a traceback."""
    with pytest.raises(UsageError, match="git"):
        load_version(spec)
    assert cli.main(["diff", spec, "policy.yaml"]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_redis_url_is_never_printed(tmp_path: Path) -> None:
    """A Redis URL may hold a password: the diff says it changed, not what it is."""
    old = (GOLDEN / "no_changes" / "old.yaml").read_text()
    (tmp_path / "old.yaml").write_text(old)
    (tmp_path / "new.yaml").write_text(
        old.replace(
            "  on_redis_error: allow\n",
            "  on_redis_error: allow\n  redis_url: redis://:hunter2@db:6379/0\n",
        )
    )
    result = _diff.diff(
        load_version(str(tmp_path / "old.yaml")), load_version(str(tmp_path / "new.yaml"))
    )
    for text in (to_text(result), to_markdown(result)):
        assert "hunter2" not in text
        assert "app.redis_url changed" in text


@pytest.mark.parametrize(
    "spec",
    [
        "git:--output=pwned.txt:y",
        "git:--output=pwned.txt:policy.yaml",
        "git:-opwned.txt:policy.yaml",
        "git:--textconv:policy.yaml",
    ],
)
def test_a_ref_is_never_read_as_an_option(
    repo: Path, spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A REF that starts with '-' is data, not a git option: it is refused with one clear
    line (exit 2), and git writes no file."""
    before = sorted(p.name for p in repo.iterdir())
    assert cli.main(["diff", spec, "policy.yaml"]) == 2
    err = capsys.readouterr().err
    assert "is not a git revision" in err
    assert "must not start with '-'" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in repo.iterdir()) == before
    assert not (repo / "pwned.txt").exists()


def test_refs_are_resolved_to_a_commit_first(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ref that names no commit (a tree, a ref with a control character) is refused
    before any file is read; ../PATH and ./PATH are read from the current directory."""
    assert cli.main(["diff", "git:HEAD^{tree}:policy.yaml", "policy.yaml"]) == 2
    assert "check that the ref 'HEAD^{tree}' exists" in capsys.readouterr().err
    assert cli.main(["diff", "git:HE\nAD:policy.yaml", "policy.yaml"]) == 2
    assert "is not a git revision" in capsys.readouterr().err
    sub = repo / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    for spec in ("git:HEAD~1:../policy.yaml", "git:HEAD~1:policy.yaml"):
        assert cli.main(["diff", spec, "../policy.yaml"]) == 0
        out = capsys.readouterr().out
        assert "edge rate tightened from '20/1m' to '10/1m' (-50%)" in out
