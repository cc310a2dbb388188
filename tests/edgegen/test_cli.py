"""The CLI's rough edges: --version, diff as data and its exit code, show as data, plan
without a cloudflare section, and exit codes under --detailed-exitcode."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest

from edgegen import cli
from edgegen.cloudflare._state import RemoteState, Scope
from edgegen.zone import _file_formats

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "policy.yaml"
GOLDEN = ROOT / "tests" / "golden" / "diff"
ZONE_ID = "0" * 32
ACCOUNT_ID = "f" * 32

Run = tuple[int, str, str]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Any:
    """Run the CLI in this process; returns (exit code, stdout, stderr)."""

    def invoke(*argv: str | Path) -> Run:
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def _policy(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- --version -------------------------------------------------------------------------


def test_version_comes_from_the_installed_metadata(run: Any) -> None:
    """``edgegen --version`` prints the version pyproject.toml gave the installed package."""
    code, out, _ = run("--version")
    assert code == 0
    assert out == f"edgegen {metadata.version('edgegen')}\n"


def test_the_installed_command_prints_its_version() -> None:
    """The console script the package installs answers --version too (a new process)."""
    script = Path(sys.executable).parent / "edgegen"
    done = subprocess.run([script, "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"edgegen {metadata.version('edgegen')}"


# --- diff --format json and --detailed-exitcode ----------------------------------------


def _diff(run: Any, case: str, *extra: str) -> Run:
    folder = GOLDEN / case
    result: Run = run("diff", folder / "old.yaml", folder / "new.yaml", *extra)
    return result


def test_diff_as_json_holds_the_changes_as_data(run: Any) -> None:
    """Each change has its kind, limit, message (as the text output words it) and the
    values it quotes; files have their status, line counts and diff lines."""
    code, out, _ = _diff(run, "app_rate_changed", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["format"] == 1
    assert data["changed"] is True
    assert data["old"] == {
        "label": str(GOLDEN / "app_rate_changed" / "old.yaml"),
        "builds": True,
        "build_error": None,
    }
    free = next(c for c in data["changes"] if "free" in c["values"])
    assert free == {
        "kind": "app_rate",
        "limit": "api",
        "message": "limit 'api': app rate for tier 'free' tightened from '100/1m' to '80/1m' "
        "(-20%)",
        "values": ["api", "free", "100/1m", "80/1m"],
    }
    _, text, _ = _diff(run, "app_rate_changed")
    for change in data["changes"]:
        assert f"  - {change['message']}\n" in text
    assert data["artifacts"]["compared"] is True
    for item in data["artifacts"]["files"]:
        assert set(item) == {"path", "status", "added", "removed", "diff"}


def test_diff_as_json_lists_changed_files(run: Any) -> None:
    """A change that moves a limit between a rule and the Worker changes files; their
    unified diff lines are in the JSON, and their counts match them."""
    _, out, _ = _diff(run, "plan_changed", "--format", "json")
    files = {item["path"]: item for item in json.loads(out)["artifacts"]["files"]}
    rules = files["cloudflare/http_ratelimit.json"]
    assert rules["status"] == "changed"
    assert rules["diff"][0] == "--- a/cloudflare/http_ratelimit.json"
    assert rules["added"] == sum(
        1 for ln in rules["diff"] if ln.startswith("+") and not ln.startswith("+++")
    )


def test_diff_as_json_without_changes(run: Any) -> None:
    """Identical policies: no changes, and every file unchanged."""
    code, out, _ = _diff(run, "no_changes", "--format", "json")
    data = json.loads(out)
    assert code == 0
    assert data["changed"] is False
    assert data["changes"] == []
    assert {item["status"] for item in data["artifacts"]["files"]} == {"unchanged"}


@pytest.mark.parametrize(("case", "code"), [("no_changes", 0), ("edge_loosened", 2)])
@pytest.mark.parametrize("output", ["text", "markdown", "json"])
def test_diff_detailed_exitcode(run: Any, case: str, code: int, output: str) -> None:
    """--detailed-exitcode: 0 without changes, 2 with changes, whatever the format."""
    assert _diff(run, case, "--format", output, "--detailed-exitcode")[0] == code
    assert _diff(run, case, "--format", output)[0] == 0


def test_diff_stops_at_a_version_the_gate_refuses(run: Any, tmp_path: Path) -> None:
    """A new version the zone's plan cannot carry (a 2h timeout on the free plan) has errors
    that ``edgegen validate`` reports: the diff fails with them (1, also under
    --detailed-exitcode, where 2 means "changes"), printing no diff."""
    old = (GOLDEN / "no_changes" / "old.yaml").read_text()
    broken = old.replace("plan: business", "plan: free").replace("10m", "2h")
    assert broken != old
    old_path = _policy(tmp_path, old, "old.yaml")
    new_path = _policy(tmp_path, broken, "new.yaml")
    code, out, err = run("diff", old_path, new_path, "--format", "json", "--detailed-exitcode")
    assert code == 1 and out == ""
    assert "[error L2" in err and "new.yaml has" in err


@pytest.mark.parametrize(
    "argv",
    [
        ("diff", "missing.yaml", str(EXAMPLE), "--detailed-exitcode"),
        ("diff", "git:", str(EXAMPLE), "--detailed-exitcode"),
        ("diff", str(EXAMPLE), str(EXAMPLE), "--format", "yaml", "--detailed-exitcode"),
        ("plan", str(EXAMPLE), "--state", "missing.json", "--detailed-exitcode"),
    ],
    ids=["missing-file", "bad-git-spec", "usage", "plan-missing-state"],
)
def test_errors_exit_1_under_detailed_exitcode(run: Any, argv: tuple[str, ...]) -> None:
    """With --detailed-exitcode, 2 means "changes" only: every error exits 1 (usage errors
    too, which otherwise exit 2), so CI never reads an error as a plan with changes."""
    code, _, err = run(*argv)
    assert code == 1
    assert err


def test_usage_errors_still_exit_2_without_detailed_exitcode(run: Any) -> None:
    """Without the flag, nothing changes: a usage error exits 2."""
    assert run("diff", str(EXAMPLE), str(EXAMPLE), "--format", "yaml")[0] == 2
    assert run("diff", "git:", str(EXAMPLE))[0] == 2


# --- show --format json ----------------------------------------------------------------


def test_show_says_how_long_a_sliding_window_refusal_may_wait(run: Any) -> None:
    """The example's sliding_window limit ('api') carries the note that a refused client may
    wait up to two periods; the other algorithms' limits do not."""
    code, out, _ = run("show", str(EXAMPLE))
    assert code == 0
    blocks = re.split(r"\n  (?=\S)", out)
    [api] = [b for b in blocks if b.startswith("api:")]
    assert "may wait up to two periods" in api
    assert sum("may wait up to two periods" in b for b in blocks) == 1


def test_show_as_json_is_the_policy_as_data(run: Any) -> None:
    """Every section of the policy, in the file's spelling, and each limit's effective
    values: data a program reads, not the sentences of the text output."""
    code, out, _ = run("show", EXAMPLE, "--format", "json")
    assert code == 0
    data = json.loads(out)
    loaded = policy.load(EXAMPLE)
    assert set(data) == {"format", "file", *policy.Policy.model_fields}
    assert data["format"] == 1
    assert data["file"] == str(EXAMPLE)
    assert data["tiers"] == list(loaded.tiers)
    assert data["cloudflare"]["plan"] == "business"
    assert [limit["name"] for limit in data["limits"]] == [lim.name for lim in loaded.limits]
    api = next(limit for limit in data["limits"] if limit["name"] == "api")
    assert api["match"]["path_prefix"] == ["/api/"]
    assert api["edge"]["rate"] == "600/1m"
    assert api["edge"]["timeout"] == "10m"
    assert api["app"]["tiers"]["pro"] == ["1000/1m", "20000/1h"]
    assert api["effective"] == {
        "edge_credentialed_rate": "6000/1m",
        "on_redis_error": loaded.app.on_redis_error.value,
    }
    login = next(limit for limit in data["limits"] if limit["name"] == "login")
    assert login["effective"]["edge_credentialed_rate"] is None  # not unauthenticated_only


def test_show_as_json_masks_the_redis_password(run: Any, tmp_path: Path) -> None:
    """``app.redis_url`` keeps its host and port, never its user and password."""
    path = _policy(
        tmp_path,
        "version: 1\napp: { redis_url: 'redis://app:s3cret-pass@cache.internal:6380/2' }\n"
        "limits:\n  - name: api\n    app: { tiers: { default: 10/1m } }\n",
    )
    code, out, _ = run("show", path, "--format", "json")
    assert code == 0
    assert "s3cret" not in out
    assert json.loads(out)["app"]["redis_url"] == "redis://***@cache.internal:6380/2"
    assert json.loads(out)["cloudflare"] is None


# --- plan without cloudflare: --------------------------------------------------------


NO_CLOUDFLARE = "version: 1\nlimits:\n  - name: api\n    app: { tiers: { default: 10/1m } }\n"


@pytest.mark.parametrize("with_state", [False, True])
def test_plan_without_a_cloudflare_section_says_what_is_missing(
    run: Any, tmp_path: Path, with_state: bool
) -> None:
    """Live or against a state file, plan names the missing section and what to add
    (against a state file it used to say the policy "names None")."""
    path = _policy(tmp_path, NO_CLOUDFLARE)
    state = tmp_path / "state.json"
    _file_formats.save_state(
        RemoteState(Scope(ZONE_ID, ACCOUNT_ID, "api-edge-limits"), None, None, ()), state
    )
    extra = ("--state", state) if with_state else ()
    code, out, err = run("plan", path, *extra)
    assert code == 2
    assert out == ""
    assert "has no cloudflare section" in err
    assert "cloudflare: { plan: ..., zone_id: ... }" in err
    assert "None" not in err


def test_plan_against_a_state_of_another_worker_names_both(run: Any, tmp_path: Path) -> None:
    """A policy without a Worker against a state pulled for one: the message says "no
    Worker", not None."""
    path = _policy(
        tmp_path,
        f"version: 1\ncloudflare: {{ plan: enterprise, zone_id: '{ZONE_ID}' }}\n"
        "limits:\n  - name: api\n    edge: { rate: 100/1m, unauthenticated_only: false }\n",
    )
    state = tmp_path / "state.json"
    _file_formats.save_state(RemoteState(Scope(ZONE_ID, ACCOUNT_ID, "edge"), None, None, ()), state)
    code, _, err = run("plan", path, "--state", state)
    assert code == 1
    assert "pulled for the Worker 'edge'" in err
    assert "names no Worker (cloudflare.worker)" in err
    assert "None" not in err


def test_build_and_show_without_a_cloudflare_section(run: Any, tmp_path: Path) -> None:
    """An app-only policy builds nothing for the edge and says why, rather than "the none
    plan"; show says the same."""
    path = _policy(tmp_path, NO_CLOUDFLARE)
    code, out, _ = run("build", path, "--out", tmp_path / "out")
    assert code == 0
    assert "built 0 rules for no zone (the policy has no cloudflare section), no Worker" in out
    code, out, _ = run("show", path)
    assert code == 0
    assert "plan none (no cloudflare section)" in out
