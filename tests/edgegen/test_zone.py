"""plan, pull and apply end to end: the CLI, the real client and the stateful fake zone."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cloudflare_fake import ACCOUNT_ID, PERMISSIONS, TOKEN, ZONE_ID, FakeCloudflare
from zone_support import HAND_MADE, Sleeps

from edgegen import cli
from edgegen.cloudflare import _client
from edgegen.compiler import _ids
from edgegen.zone._file_formats import write_hashes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "policy.yaml"
LOGIN = _ids.rule_ref("login")
WORKER = "api-edge-limits"


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Sleeps:
    """No test sleeps: the client's waits are recorded here instead."""
    recorded = Sleeps()
    monkeypatch.setattr(_client, "_sleep", recorded)
    return recorded


@pytest.fixture
def zone(monkeypatch: pytest.MonkeyPatch, sleeps: Sleeps) -> Iterator[FakeCloudflare]:
    """An empty fake zone on the business plan, and the environment that points at it."""
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", TOKEN)
    monkeypatch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
    monkeypatch.delenv("CLOUDFLARE_API_BASE_URL", raising=False)
    fake = FakeCloudflare()
    with fake.mock():
        yield fake


Run = tuple[int, str, str]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Any:
    """Run the CLI; returns (exit code, stdout, stderr)."""

    def invoke(*argv: str | Path) -> Run:
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def variant(tmp_path: Path, name: str = "policy.yaml", **replace: str) -> Path:
    """The example policy with text replaced (``old=new`` pairs given as a dict)."""
    text = EXAMPLE.read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def edit(path: Path, old: str, new: str) -> None:
    """Change a policy file in place."""
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def by_ref(fake: FakeCloudflare) -> dict[str, dict[str, Any]]:
    """The zone's rules by ref."""
    return {r["ref"]: r for r in fake.rules}


def test_first_apply_on_an_empty_zone(zone: FakeCloudflare, run: Any) -> None:
    """Rules, Worker and route are created; apply reports each write."""
    code, out, err = run("apply", EXAMPLE, "--auto-approve")
    assert code == 0, err
    assert "+ create login (edgegen:login-" in out
    assert "done: update the http_ratelimit rules" in out
    assert "done: upload the Worker api-edge-limits" in out
    assert "done: add the route api.example.com/* -> api-edge-limits" in out
    assert "done: add the route hooks.example.com/webhooks/* -> api-edge-limits" in out
    assert "Apply complete: 4 write(s) made." in out
    assert list(by_ref(zone)) == [LOGIN]
    assert zone.version == "1"
    script = zone.scripts[WORKER]
    assert sorted(b["name"] for b in script.bindings) == [
        "RL_API_14C2529E",
        "RL_API_14C2529E_CREDENTIALED",
        "RL_WEBHOOKS_A58F0473",
    ]
    assert [(r["pattern"], r["script"]) for r in zone.routes.values()] == [
        ("api.example.com/*", WORKER),
        ("hooks.example.com/webhooks/*", WORKER),
    ]


def test_applying_twice_changes_nothing(zone: FakeCloudflare, run: Any) -> None:
    """The second plan shows no changes and the second apply writes nothing."""
    assert run("apply", EXAMPLE, "--auto-approve")[0] == 0
    writes = len(zone.writes)
    code, out, _ = run("plan", EXAMPLE, "--detailed-exitcode")
    assert code == 0
    assert "No changes: the zone matches the policy." in out
    assert run("apply", EXAMPLE, "--auto-approve")[0] == 0
    assert len(zone.writes) == writes
    assert zone.version == "1"


def test_update_is_planned_field_by_field(zone: FakeCloudflare, run: Any, tmp_path: Path) -> None:
    """A tighter login limit is one field change; apply keeps the rule's id."""
    path = variant(tmp_path)
    assert run("apply", path, "--auto-approve")[0] == 0
    rule_id = by_ref(zone)[LOGIN]["id"]
    edit(path, "rate: 20/1m, action: managed_challenge", "rate: 10/1m, action: managed_challenge")
    code, out, _ = run("plan", path, "--detailed-exitcode")
    assert code == 2
    assert "~ update login (edgegen:login-" in out
    assert "ratelimit.requests_per_period: 20 -> 10" in out
    assert "Worker api-edge-limits:\n  no changes" in out
    assert run("apply", path, "--auto-approve")[0] == 0
    rule = by_ref(zone)[LOGIN]
    assert rule["id"] == rule_id
    assert rule["ratelimit"]["requests_per_period"] == 10
    assert run("plan", path, "--detailed-exitcode")[0] == 0


def test_delete_removes_our_rule(zone: FakeCloudflare, run: Any, tmp_path: Path) -> None:
    """A limit that loses its edge part loses its rule."""
    path = variant(tmp_path)
    assert run("apply", path, "--auto-approve")[0] == 0
    edit(
        path,
        "    edge: { rate: 20/1m, action: managed_challenge, unauthenticated_only: false }\n",
        "",
    )
    code, out, _ = run("plan", path, "--detailed-exitcode")
    assert code == 2
    assert f"- delete login: 20/1m per client IP, managed_challenge ({LOGIN})" in out
    assert run("apply", path, "--auto-approve")[0] == 0
    assert zone.rules == []
    assert run("plan", path, "--detailed-exitcode")[0] == 0


def test_foreign_rules_are_preserved_in_place(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """Hand-made rules keep their id, every field and their order through apply."""
    zone.seed_rules(HAND_MADE, description="made in the dashboard")
    before = [dict(r) for r in zone.rules]
    path = variant(tmp_path)
    code, out, _ = run("apply", path, "--auto-approve")
    assert code == 0
    assert "2 rules not managed by edgegen kept in place:" in out
    assert [r["ref"] for r in zone.rules] == ["scrapers", "search-bots", LOGIN]
    for old, new in zip(before, zone.rules, strict=False):
        assert {k: v for k, v in old.items() if k != "last_updated"} == {
            k: v for k, v in new.items() if k != "last_updated"
        }
    assert zone.entrypoint is not None
    assert zone.entrypoint["description"] == "made in the dashboard"
    edit(path, "rate: 20/1m, action: managed_challenge", "rate: 30/1m, action: managed_challenge")
    assert run("apply", path, "--auto-approve")[0] == 0
    assert [r["ref"] for r in zone.rules] == ["scrapers", "search-bots", LOGIN]
    assert [r["version"] for r in zone.rules] == ["1", "1", "2"]


def test_worker_is_uploaded_only_when_it_changes(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """A rule-only change does not re-upload the Worker; a Worker limit's change does."""
    path = variant(tmp_path)
    assert run("apply", path, "--auto-approve")[0] == 0

    def uploads() -> int:
        return sum(1 for w in zone.writes if "/workers/scripts/" in w.path)

    assert uploads() == 1
    edit(path, "rate: 20/1m, action: managed_challenge", "rate: 10/1m, action: managed_challenge")
    assert run("apply", path, "--auto-approve")[0] == 0
    assert uploads() == 1
    edit(path, "rate: 100/10s", "rate: 50/10s")
    _code, out, _ = run("plan", path)
    assert "bindings.RL_WEBHOOKS_A58F0473.simple.limit: 100 -> 50" in out
    assert "content_sha256:" in out
    assert run("apply", path, "--auto-approve")[0] == 0
    assert uploads() == 2


def test_saved_plan_applies_without_asking(zone: FakeCloudflare, run: Any, tmp_path: Path) -> None:
    """plan --out then apply PLANFILE writes exactly that plan."""
    planfile = tmp_path / "plan.json"
    code, _, err = run("plan", EXAMPLE, "--out", planfile)
    assert code == 0
    assert f"Saved the plan to {planfile}" in err
    code, out, err = run("apply", planfile)
    assert code == 0, err
    assert "Apply complete: 4 write(s) made." in out
    assert run("plan", EXAMPLE, "--detailed-exitcode")[0] == 0


def test_stale_plan_is_refused(zone: FakeCloudflare, run: Any, tmp_path: Path) -> None:
    """A rule added in the dashboard after the plan: apply PLANFILE writes nothing."""
    planfile = tmp_path / "plan.json"
    assert run("plan", EXAMPLE, "--out", planfile)[0] == 0
    zone.seed_rules(HAND_MADE[:1])
    code, _, err = run("apply", planfile)
    assert code == 1
    assert "the zone changed since this plan was made" in err
    assert "version none when planned, 1 now" in err
    assert zone.writes == []


def test_stale_plan_after_the_worker_changed(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """A Worker deployed by someone else since the plan is a change too."""
    planfile = tmp_path / "plan.json"
    assert run("plan", EXAMPLE, "--out", planfile)[0] == 0
    zone.set_script(WORKER, "export default {}")
    code, _, err = run("apply", planfile)
    assert code == 1
    assert "the Worker script or its bindings" in err


def test_dry_run_sends_only_gets(zone: FakeCloudflare, run: Any) -> None:
    """Everything up to the first write, each request printed, nothing written."""
    code, out, _ = run("apply", EXAMPLE, "--dry-run")
    assert code == 0
    assert {r.method for r in zone.log} == {"GET"}
    assert zone.entrypoint is None and not zone.scripts and not zone.routes
    assert "Dry run: apply would send 4 request(s), in this order:" in out
    assert (
        f"PUT https://api.cloudflare.com/client/v4/zones/{ZONE_ID}/rulesets/phases/http_ratelimit/entrypoint"
        in out
    )
    assert f'"ref": "{LOGIN}"' in out
    assert 'part "worker.js" (application/javascript+module,' in out
    assert "POST https://api.cloudflare.com/client/v4/zones/" in out
    assert "Dry run: nothing was written." in out


def test_dry_run_of_a_saved_plan_sends_only_gets(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """apply PLANFILE --dry-run checks the fingerprints and prints; it writes nothing."""
    planfile = tmp_path / "plan.json"
    assert run("plan", EXAMPLE, "--out", planfile)[0] == 0
    code, out, _ = run("apply", planfile, "--dry-run")
    assert code == 0
    assert {r.method for r in zone.log} == {"GET"}
    assert "Dry run: nothing was written." in out


def test_dry_run_with_validate_remote(zone: FakeCloudflare, run: Any) -> None:
    """The only non-GET is Cloudflare's own ?dry_run=true, which saves nothing."""
    code, out, _ = run("apply", EXAMPLE, "--dry-run", "--validate-remote")
    assert code == 0
    assert [(r.method, r.query) for r in zone.writes] == [("PUT", "dry_run=true")]
    assert zone.entrypoint is None
    assert "Cloudflare's dry run accepted the rules." in out


def login_rate_position() -> str:
    """``file:line:column`` of the login limit's edge rate value in the example policy,
    found by reading the file as text (independently of the loader's positions)."""
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if "- name: login" in line)
    index = next(i for i in range(start, len(lines)) if "edge: { rate: " in lines[i])
    return f"{EXAMPLE}:{index + 1}:{lines[index].index('rate: ') + len('rate: ') + 1}"


def test_validate_remote_maps_a_rejection_to_the_limit(zone: FakeCloudflare, run: Any) -> None:
    """A zone really on Free rejects the 60 s period: the error names limit 'login' and
    the line of the policy its period comes from."""
    zone.plan = "free"
    code, _, err = run("apply", EXAMPLE, "--auto-approve", "--validate-remote")
    assert code == 1
    assert "Cloudflare's dry run rejected the rules; nothing was written" in err
    assert (
        f"{login_rate_position()}: limit 'login': Cloudflare rejected its rule "
        "(field ratelimit.period)"
    ) in err
    assert [(r.method, r.query) for r in zone.writes] == [("PUT", "dry_run=true")]


def test_a_400_on_apply_is_mapped_back_and_reported(zone: FakeCloudflare, run: Any) -> None:
    """The rules are written first here; the 400 stops apply with nothing written."""
    zone.plan = "free"
    code, _, err = run("apply", EXAMPLE, "--auto-approve")
    assert code == 1
    assert "apply stopped: update the http_ratelimit rules" in err
    assert (
        f"{login_rate_position()}: limit 'login': Cloudflare rejected its rule "
        "(field ratelimit.period)"
    ) in err
    assert "Written: nothing." in err
    assert "Not written: upload the Worker api-edge-limits; add the route" in err
    assert zone.entrypoint is None and not zone.scripts


def test_a_400_on_a_saved_plan_names_the_limit_without_a_line(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """A saved plan may outlive the file it was made from, so its rejections name the limit
    and the rule's field but point at no line."""
    planfile = tmp_path / "plan.json"
    assert run("plan", EXAMPLE, "--out", planfile)[0] == 0
    zone.plan = "free"
    code, _, err = run("apply", planfile)
    assert code == 1
    assert "\n  limit 'login': Cloudflare rejected its rule (field ratelimit.period)" in err
    assert str(EXAMPLE) not in err
    assert zone.entrypoint is None


def test_failure_mid_apply_says_what_was_written(zone: FakeCloudflare, run: Any) -> None:
    """A route that cannot be added: rules and Worker are written, and plan shows the rest."""
    zone.fail("POST", "/workers/routes", 500)
    code, _, err = run("apply", EXAMPLE, "--auto-approve")
    assert code == 1
    assert "apply stopped: add the route api.example.com/* -> api-edge-limits failed" in err
    assert "Written: update the http_ratelimit rules of zone" in err
    assert "upload the Worker api-edge-limits." in err
    assert "Not written: add the route hooks.example.com/webhooks/*" in err
    assert "may or may not have been made" in err
    assert "Run edgegen plan to see what the zone holds now" in err
    code, out, _ = run("plan", EXAMPLE, "--detailed-exitcode")
    assert code == 2
    assert "+ add api.example.com/* -> api-edge-limits" in out
    assert "Rate limiting rules (http_ratelimit entrypoint, version 1):\n  no changes" in out


def test_ambiguous_write_then_plan_shows_the_truth(zone: FakeCloudflare, run: Any) -> None:
    """The upload was made but every answer was a 500: reported ambiguous; plan sees it done."""
    zone.fail("PUT", "/workers/scripts/", 500, times=5, after_write=True)
    code, _, err = run("apply", EXAMPLE, "--auto-approve")
    assert code == 1
    assert (
        "The failed write (upload the Worker api-edge-limits) may or may not have been made." in err
    )
    code, out, _ = run("plan", EXAMPLE)
    assert "Worker api-edge-limits:\n  no changes" in out
    assert "+ add api.example.com/*" in out


def test_retries_are_invisible_when_they_succeed(
    zone: FakeCloudflare, run: Any, sleeps: Sleeps
) -> None:
    """429 with Retry-After and a 503 in between: apply still completes, waiting as told."""
    zone.throttle(after=1, times=1, retry_after="4")
    zone.fail("PUT", "/entrypoint", 503)
    code, out, err = run("apply", EXAMPLE, "--auto-approve")
    assert code == 0, err
    assert 4.0 in sleeps
    assert len(sleeps) == 2
    assert "Apply complete" in out


def test_no_read_failure_leads_to_a_write(zone: FakeCloudflare, run: Any) -> None:
    """A read that keeps failing stops apply before any write."""
    zone.fail("GET", "/workers/routes", 500, times=10)
    code, _, err = run("apply", EXAMPLE, "--auto-approve")
    assert code == 1
    assert "Cloudflare failed to answer GET the Worker routes" in err
    assert zone.writes == []


@pytest.mark.parametrize(
    ("setup", "code", "message"),
    [
        (lambda z, m: setattr(z, "tokens", {}), 1, "did not accept the API token"),
        (
            lambda z, m: setattr(z, "tokens", {TOKEN: frozenset({"routes", "scripts"})}),
            1,
            "Zone WAF",
        ),
        (lambda z, m: m.delenv("CLOUDFLARE_API_TOKEN"), 2, "set CLOUDFLARE_API_TOKEN"),
        (lambda z, m: m.setenv("CLOUDFLARE_ZONE_ID", ""), 2, "sets no cloudflare.zone_id"),
        (lambda z, m: m.setenv("CLOUDFLARE_ACCOUNT_ID", ""), 2, "needs the account"),
        (
            lambda z, m: z.add_route("api.example.com/*", "someone-else"),
            1,
            "runs the Worker 'someone-else'",
        ),
        (lambda z, m: z.throttle(after=0, times=9, retry_after="300"), 1, "wait 300 s"),
        (lambda z, m: m.setenv("CLOUDFLARE_API_BASE_URL", "ftp://proxy"), 2, "not an http(s) URL"),
    ],
)
def test_error_paths(
    zone: FakeCloudflare,
    run: Any,
    monkeypatch: pytest.MonkeyPatch,
    setup: Any,
    code: int,
    message: str,
) -> None:
    """Every way plan and apply can be stopped: a clear line, the right exit code, no writes."""
    setup(zone, monkeypatch)
    for command in (("plan", EXAMPLE), ("apply", EXAMPLE, "--auto-approve")):
        got, _out, err = run(*command)
        assert got == code, (command, err)
        assert message in err
        assert "Traceback" not in err
    assert zone.writes == []


def test_pull_then_plan_offline(
    zone: FakeCloudflare, run: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A pulled state plans exactly like the live zone, with no token and no request."""
    zone.seed_rules(HAND_MADE)
    state = tmp_path / "state.json"
    code, out, _ = run("pull", EXAMPLE, "--out", state)
    assert code == 0
    assert (
        "ruleset version 1 with 2 rule(s), Worker api-edge-limits not deployed, 0 route(s)" in out
    )
    live = run("plan", EXAMPLE)[1]
    monkeypatch.delenv("CLOUDFLARE_API_TOKEN")
    monkeypatch.setenv("CLOUDFLARE_ZONE_ID", "")
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", "")
    requests = len(zone.log)
    code, offline, err = run("plan", EXAMPLE, "--state", state, "--detailed-exitcode")
    assert code == 2, err
    assert offline == live
    assert len(zone.log) == requests


def test_offline_plan_file_applies_when_the_zone_is_unchanged(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """A plan made offline from a pulled state applies if the zone is still as pulled."""
    state = tmp_path / "state.json"
    planfile = tmp_path / "plan.json"
    assert run("pull", EXAMPLE, "--out", state)[0] == 0
    assert run("plan", EXAMPLE, "--state", state, "--out", planfile)[0] == 0
    code, _, err = run("apply", planfile)
    assert code == 0, err
    assert LOGIN in by_ref(zone)


def test_pull_without_a_policy(zone: FakeCloudflare, run: Any, tmp_path: Path) -> None:
    """pull takes the zone from --zone-id (or CLOUDFLARE_ZONE_ID) and the Worker from --worker."""
    state = tmp_path / "state.json"
    code, _out, _ = run("pull", "--out", state, "--worker", WORKER)
    assert code == 0
    data = json.loads(state.read_text())
    assert (data["zone_id"], data["account_id"], data["worker_name"]) == (
        ZONE_ID,
        ACCOUNT_ID,
        WORKER,
    )


def test_a_state_of_another_zone_is_refused(zone: FakeCloudflare, run: Any, tmp_path: Path) -> None:
    """plan --state checks the state is of the policy's zone and Worker."""
    state = tmp_path / "state.json"
    assert run("pull", "--out", state, "--zone-id", "a" * 32)[0] == 1
    assert run("pull", "--out", state)[0] == 0
    code, _, err = run("plan", EXAMPLE, "--state", state)
    assert code == 1
    assert "was pulled for no Worker, but" in err
    state.write_text("{not json")
    code, _, err = run("plan", EXAMPLE, "--state", state)
    assert code == 1
    assert "is not JSON" in err


def test_plan_formats(zone: FakeCloudflare, run: Any) -> None:
    """markdown for PR comments, json for programs."""
    code, out, _ = run("plan", EXAMPLE, "--format", "markdown")
    assert code == 0
    assert out.startswith("### edgegen plan\n")
    assert f"- **create** `login` (`{LOGIN}`)" in out
    _code, out, _ = run("plan", EXAMPLE, "--format", "json")
    data = json.loads(out)
    assert data["has_changes"] is True
    assert data["rules"][0]["action"] == "create"
    assert "writes" not in data


class Terminal(io.StringIO):
    """A stdin that claims to be a terminal; ``on_read`` runs when the answer is read."""

    def __init__(self, answer: str, on_read: Any = None) -> None:
        super().__init__(answer)
        self.on_read = on_read

    def isatty(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> str:
        if self.on_read is not None:
            self.on_read()
        return super().readline()


def test_apply_asks_and_only_yes_applies(
    zone: FakeCloudflare, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """'no' cancels with nothing written; 'yes' applies."""
    monkeypatch.setattr("sys.stdin", Terminal("no\n"))
    code, out, _ = run("apply", EXAMPLE)
    assert code == 1
    assert "Only 'yes' applies" in out
    assert "Apply cancelled; nothing was written." in out
    assert zone.writes == []
    monkeypatch.setattr("sys.stdin", Terminal("yes\n"))
    assert run("apply", EXAMPLE)[0] == 0
    assert LOGIN in by_ref(zone)


def test_apply_without_a_terminal_refuses(
    zone: FakeCloudflare, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In CI, with no terminal and no --auto-approve, apply says what to do instead."""
    monkeypatch.setattr("sys.stdin", io.StringIO("yes\n"))
    code, _, err = run("apply", EXAMPLE)
    assert code == 2
    assert "pass --auto-approve" in err
    assert zone.writes == []


def test_a_change_while_asking_is_caught(
    zone: FakeCloudflare, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone edits the rules while the plan is being read: apply re-reads and refuses."""
    monkeypatch.setattr("sys.stdin", Terminal("yes\n", on_read=lambda: zone.seed_rules(HAND_MADE)))
    code, _, err = run("apply", EXAMPLE)
    assert code == 1
    assert "the zone changed since this plan was made" in err
    assert zone.writes == []


def test_token_file(
    zone: FakeCloudflare, run: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--token-file replaces the variable."""
    monkeypatch.delenv("CLOUDFLARE_API_TOKEN")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    assert run("plan", EXAMPLE, "--token-file", token)[0] == 0


def test_the_token_never_appears(
    zone: FakeCloudflare, run: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Run every command path, failing ones too, and look for the token everywhere."""
    secret = "tok-SEKRIT-7f3a9c1e-do-not-print"
    zone.tokens = {secret: PERMISSIONS}
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", secret)
    state = tmp_path / "state.json"
    planfile = tmp_path / "plan.json"
    seen: list[str] = []

    def go(*argv: str | Path) -> None:
        _code, out, err = run(*argv)
        seen.extend([out, err])

    go("pull", EXAMPLE, "--out", state)
    go("plan", EXAMPLE, "--state", state)
    go("plan", EXAMPLE, "--out", planfile, "--format", "json")
    go("plan", EXAMPLE, "--format", "markdown")
    go("apply", EXAMPLE, "--dry-run", "--validate-remote")
    zone.fail("POST", "/workers/routes", 500)
    go("apply", EXAMPLE, "--auto-approve")
    go("apply", planfile)
    zone.throttle(after=0, times=9, retry_after="300")
    go("plan", EXAMPLE)
    zone.budget = None
    zone.plan = "free"
    go("apply", EXAMPLE, "--auto-approve", "--validate-remote")
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", secret + "x")
    go("plan", EXAMPLE)
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", secret + " x")
    go("plan", EXAMPLE)
    go("diff", EXAMPLE, EXAMPLE)
    files = [p.read_text() for p in tmp_path.rglob("*") if p.is_file()]
    assert all(secret not in text for text in seen + files)
    assert any("did not accept the API token" in text for text in seen)


# --- saved plans are bound to what they show ---------------------------------------------


def saved(run: Any, tmp_path: Path, policy: Path = EXAMPLE) -> tuple[Path, dict[str, Any]]:
    """``plan --out``: the plan file and its content."""
    planfile = tmp_path / "plan.json"
    code, _, err = run("plan", policy, "--out", planfile)
    assert code == 0, err
    return planfile, json.loads(planfile.read_text())


def refused(run: Any, zone: FakeCloudflare, planfile: Path, data: Any, says: str) -> str:
    """Save ``data`` as the plan; apply (and apply --dry-run) refuse it, naming ``says``,
    with nothing written. Returns what apply said."""
    planfile.write_text(json.dumps(data))
    before = len(zone.log)
    for options in ((), ("--dry-run",), ("--validate-remote",)):
        code, out, err = run("apply", planfile, *options)
        assert code == 1, (options, out, err)
        assert f"refusing to apply {planfile}" in err
        assert says in err, err
        assert "nothing was written" in err.lower()
        assert "Traceback" not in err
        assert "Apply complete" not in out
    assert [r for r in zone.log[before:] if r.is_write] == []
    return err


def rehash(data: dict[str, Any]) -> dict[str, Any]:
    """The plan with its recorded hashes made to match its writes again (what someone
    editing a plan with care would do)."""
    return {**data, "writes_sha256": write_hashes(data["writes"], data["routes"])}


def login_rule(data: dict[str, Any]) -> dict[str, Any]:
    """The login rule in a plan file's rules body."""
    return next(r for r in data["writes"]["ruleset"]["rules"] if r["ref"] == LOGIN)


def test_an_edited_rules_body_is_refused(zone: FakeCloudflare, run: Any, tmp_path: Path) -> None:
    """The rate of a rule set to a million in the body only: refused, nothing written."""
    planfile, data = saved(run, tmp_path)
    login_rule(data)["ratelimit"]["requests_per_period"] = 1_000_000
    refused(run, zone, planfile, data, "the rules it writes no longer match")


def test_a_body_and_change_list_edited_to_match_are_refused(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """The change list edited to show the edited body, the recorded hash left: refused.
    With the hash recomputed too, what apply shows is what it writes (the edited rate)."""
    planfile, data = saved(run, tmp_path)
    login_rule(data)["ratelimit"]["requests_per_period"] = 1_000_000
    change = next(c for c in data["rules"] if c["ref"] == LOGIN)
    field = next(f for f in change["fields"] if f["path"] == "ratelimit.requests_per_period")
    field["new"] = 1_000_000
    refused(run, zone, planfile, data, "the rules it writes no longer match")
    planfile.write_text(json.dumps(rehash(data)))
    code, out, err = run("apply", planfile)
    assert code == 0, err
    assert "ratelimit.requests_per_period: 1000000" in out
    assert by_ref(zone)[LOGIN]["ratelimit"]["requests_per_period"] == 1_000_000


def test_a_consistent_edit_is_refused_against_the_reviewed_policy(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """Hashes cannot tell a careful edit (body, change list and hashes changed together)
    from the plan as made; ``--policy`` can: the plan must write what the reviewed policy
    builds for the zone, or nothing is written."""
    planfile, data = saved(run, tmp_path)
    login_rule(data)["ratelimit"]["requests_per_period"] = 1_000_000
    change = next(c for c in data["rules"] if c["ref"] == LOGIN)
    field = next(f for f in change["fields"] if f["path"] == "ratelimit.requests_per_period")
    field["new"] = 1_000_000
    planfile.write_text(json.dumps(rehash(data)))
    before = len(zone.log)
    code, out, err = run("apply", planfile, "--policy", EXAMPLE)
    assert code == 1, out
    assert "does not write what the policy builds" in err
    assert "ruleset differ" in err and "Nothing was written" in err
    assert "Traceback" not in err
    assert all(r.method == "GET" for r in zone.log[before:])
    assert zone.entrypoint is None and not zone.scripts and not zone.routes


def test_a_plan_made_from_the_policy_applies_with_it(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """The unedited plan passes the check against its own policy and applies."""
    planfile, _ = saved(run, tmp_path)
    code, out, err = run("apply", planfile, "--policy", EXAMPLE)
    assert code == 0, err
    assert "Apply complete: 4 write(s) made." in out


def test_a_plan_for_another_zone_is_refused_against_the_policy(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """A plan whose zone or Worker is not the policy's is refused before any write."""
    planfile, _ = saved(run, tmp_path)
    other = variant(tmp_path, "other.yaml", **{"name: api-edge-limits": "name: other-limits"})
    code, _, err = run("apply", planfile, "--policy", other)
    assert code == 1
    assert "Worker api-edge-limits, the policy for zone" in err and "other-limits" in err
    assert not zone.scripts


def test_policy_option_goes_with_a_saved_plan(zone: FakeCloudflare, run: Any) -> None:
    """``apply POLICY --policy POLICY`` is a usage error that says what to run instead."""
    code, _, err = run("apply", EXAMPLE, "--policy", EXAMPLE)
    assert code == 2
    assert "--policy goes with a saved plan" in err


def test_a_body_edited_with_its_hash_but_not_its_change_list_is_refused(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """The body and its hash edited, the change list left: the body is re-derived from the
    zone and the changes listed, and does not match."""
    planfile, data = saved(run, tmp_path)
    login_rule(data)["ratelimit"]["requests_per_period"] = 1_000_000
    refused(run, zone, planfile, rehash(data), "the rules it writes are not the changes it lists")


@pytest.mark.parametrize(
    "edit_body",
    [
        lambda body: body["rules"].append(
            {**body["rules"][0], "ref": "not-ours", "description": "slipped in"}
        ),
        lambda body: body["rules"][0].update(id="ffffffffffffffffffffffffffffffff"),
        lambda body: body.update(description="changed"),
    ],
    ids=["a rule edgegen does not own", "an id", "the description"],
)
def test_any_edit_of_the_rules_written_is_refused(
    zone: FakeCloudflare, run: Any, tmp_path: Path, edit_body: Any
) -> None:
    """Whatever part of the body is edited (hash recomputed), it is not what the zone and
    the change list give."""
    zone.seed_rules(HAND_MADE)
    planfile, data = saved(run, tmp_path)
    edit_body(data["writes"]["ruleset"])
    refused(run, zone, planfile, rehash(data), "the rules it writes are not the changes it lists")


def test_an_edited_worker_module_is_refused(zone: FakeCloudflare, run: Any, tmp_path: Path) -> None:
    """The Worker's source replaced: refused by its hash, and (hash recomputed) because
    its content hash is not the one the change list shows."""
    planfile, data = saved(run, tmp_path)
    data["writes"]["worker"]["module_source"] = "export default { fetch() { return fetch(x) } }"
    refused(run, zone, planfile, data, "the Worker module worker.js no longer matches")
    refused(run, zone, planfile, rehash(data), "the Worker it uploads is not the change it lists")
    assert zone.scripts == {}


def test_an_edited_worker_binding_is_refused(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """A binding's limit raised in the upload: refused."""
    planfile, data = saved(run, tmp_path)
    data["writes"]["worker"]["bindings"][0]["simple"]["limit"] = 1_000_000
    refused(run, zone, planfile, data, "the Worker's bindings and compatibility date no longer")
    refused(run, zone, planfile, rehash(data), "the Worker it uploads is not the change it lists")


def test_an_edited_route_is_refused(zone: FakeCloudflare, run: Any, tmp_path: Path) -> None:
    """A route to add pointed at another pattern or Worker, or a route to remove pointed at
    a route edgegen does not own: refused, and no route is touched."""
    assert run("apply", EXAMPLE, "--auto-approve")[0] == 0
    old = zone.add_route("old.example.com/*", WORKER)
    shop = zone.add_route("shop.example.com/*", "shop")
    planfile, data = saved(run, tmp_path)
    (delete,) = [c for c in data["routes"] if c["action"] == "delete"]
    assert delete["route_id"] == old
    routes = dict(zone.routes)

    other = json.loads(json.dumps(data))
    next(c for c in other["routes"] if c["route_id"] == old)["route_id"] = shop
    refused(run, zone, planfile, other, "route change 1 (remove old.example.com/*) no longer")
    refused(run, zone, planfile, rehash(other), "the route changes are not those the zone gives")

    other = json.loads(json.dumps(data))
    next(c for c in other["routes"] if c["route_id"] == old)["pattern"] = "shop.example.com/*"
    refused(run, zone, planfile, rehash(other), "the route changes are not those the zone gives")
    assert zone.routes == routes


def test_routes_added_to_a_plan_are_refused(zone: FakeCloudflare, run: Any, tmp_path: Path) -> None:
    """A route to add that the plan's patterns do not name, or that runs another Worker:
    refused."""
    planfile, data = saved(run, tmp_path)
    for route in (
        {"action": "create", "pattern": "evil.example.com/*", "script": WORKER, "route_id": None},
        {"action": "create", "pattern": "api.example.com/*", "script": "evil", "route_id": None},
    ):
        other = json.loads(json.dumps(data))
        other["routes"] = [route]
        refused(
            run, zone, planfile, rehash(other), "the route changes are not those the zone gives"
        )
    other = json.loads(json.dumps(data))
    other["route_patterns"] = ["evil.example.com/*"]
    other["writes"]["worker"]["routes"] = ["evil.example.com/*"]
    refused(run, zone, planfile, rehash(other), "the route changes are not those the zone gives")
    assert zone.routes == {}


def test_an_unedited_plan_applies_what_it_shows(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """The check passes for plans as made: on a zone with hand-made rules, our routes and
    Worker, a change of rules, Worker and routes at once."""
    zone.seed_rules(HAND_MADE)
    assert run("apply", EXAMPLE, "--auto-approve")[0] == 0
    zone.add_route("old.example.com/*", WORKER)
    path = variant(
        tmp_path,
        **{
            "rate: 20/1m, action: managed_challenge": "rate: 10/1m, action: managed_challenge",
            'routes: ["api.example.com/*", "hooks.example.com/webhooks/*"]': (
                'routes: ["api.example.com/v2/*", "hooks.example.com/webhooks/*"]'
            ),
            "rate: 100/10s": "rate: 50/10s",
        },
    )
    planfile, _ = saved(run, tmp_path, path)
    shown = run("plan", path)[1]
    code, out, err = run("apply", planfile)
    assert code == 0, err
    assert out.startswith(shown)
    assert run("plan", path, "--detailed-exitcode")[0] == 0


# --- the zone's URL normalisation ----------------------------------------------------------

NORMALISE = 'turn on "Normalize incoming URLs" with type cloudflare'


def test_a_zone_that_does_not_normalise_urls_is_warned_about(
    zone: FakeCloudflare, run: Any
) -> None:
    """scope none: rules see URLs as sent, so /%61pi/items skips a limit on /api/. plan
    and apply warn on stderr, say what to change, and still plan and apply."""
    zone.url_normalization = {"scope": "none", "type": "cloudflare"}
    code, out, err = run("plan", EXAMPLE, "--detailed-exitcode")
    assert code == 2
    assert out.startswith(f"edgegen plan for zone {ZONE_ID}")
    assert "edgegen: warning: zone" in err
    assert "does not normalise URLs" in err
    assert "/%61pi/items" in err and "//api/items" in err
    assert NORMALISE in err
    assert "warning" not in out
    code, out, err = run("apply", EXAMPLE, "--auto-approve")
    assert code == 0, err
    assert NORMALISE in err
    assert "Apply complete" in out
    assert any(r.path.endswith("/url_normalization") for r in zone.log)


def test_rfc3986_normalisation_is_noted(zone: FakeCloudflare, run: Any) -> None:
    """type rfc3986 keeps // and encodes \\: //api/items skips rules; a note says so."""
    zone.url_normalization = {"scope": "incoming", "type": "rfc3986"}
    code, _, err = run("plan", EXAMPLE)
    assert code == 0
    assert "edgegen: note: zone" in err
    assert "rfc3986" in err and "//api/items" in err
    assert "type cloudflare" in err
    assert "does not normalise URLs" not in err


@pytest.mark.parametrize("scope", ["incoming", "both"])
def test_normalising_zones_get_no_warning(zone: FakeCloudflare, run: Any, scope: str) -> None:
    """The default (incoming + cloudflare) and both + cloudflare: nothing to say."""
    zone.url_normalization = {"scope": scope, "type": "cloudflare"}
    code, _, err = run("plan", EXAMPLE)
    assert code == 0
    assert "normalis" not in err


def test_without_limits_in_rules_the_setting_does_not_matter(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """The Worker and the app normalise paths themselves: a policy with no limit placed in a
    rule gets no warning, whatever the zone does."""
    zone.url_normalization = {"scope": "none", "type": "rfc3986"}
    path = variant(
        tmp_path,
        **{
            "    edge: { rate: 20/1m, action: managed_challenge, unauthenticated_only: false }\n": (
                ""
            )
        },
    )
    code, out, err = run("plan", path)
    assert code == 0, err
    assert "Worker api-edge-limits:" in out
    assert "normalis" not in err


def test_a_token_that_may_not_read_the_setting_gets_a_warning(
    zone: FakeCloudflare, run: Any
) -> None:
    """A 403 on the setting (no Zone Settings Read) is a warning, not a failure."""
    zone.tokens = {TOKEN: PERMISSIONS - {"zone_settings"}}
    code, out, err = run("plan", EXAMPLE, "--detailed-exitcode")
    assert code == 2
    assert "+ create login" in out
    assert "edgegen: warning: the API token may not read" in err
    assert "Zone > Zone Settings > Read" in err
    assert "Traceback" not in err
    assert run("apply", EXAMPLE, "--auto-approve")[0] == 0


def test_other_failures_to_read_the_setting_stop_plan(zone: FakeCloudflare, run: Any) -> None:
    """Like every read, a setting that cannot be read for another reason is an error."""
    zone.fail("GET", "/url_normalization", 500, times=9)
    code, _, err = run("apply", EXAMPLE, "--auto-approve")
    assert code == 1
    assert "HTTP 500" in err and "nothing was written" in err
    assert zone.writes == []


def test_a_saved_plan_warns_with_the_setting_at_apply_time(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """apply PLANFILE reads the setting again and shows the warning with the plan."""
    planfile, _ = saved(run, tmp_path)
    zone.url_normalization = {"scope": "none", "type": "rfc3986"}
    code, _, err = run("apply", planfile)
    assert code == 0, err
    assert NORMALISE in err


def test_pulled_state_carries_the_setting(
    zone: FakeCloudflare, run: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """pull saves the setting; plan --state warns from it with no request; a state file
    without it (an older edgegen) still loads, with a note."""
    zone.url_normalization = {"scope": "none", "type": "cloudflare"}
    state = tmp_path / "state.json"
    assert run("pull", EXAMPLE, "--out", state)[0] == 0
    data = json.loads(state.read_text())
    assert data["url_normalization"] == {"scope": "none", "type": "cloudflare"}
    monkeypatch.delenv("CLOUDFLARE_API_TOKEN")
    requests = len(zone.log)
    code, out, err = run("plan", EXAMPLE, "--state", state)
    assert code == 0
    assert NORMALISE in err
    assert len(zone.log) == requests
    del data["url_normalization"]
    state.write_text(json.dumps(data))
    code, offline, err = run("plan", EXAMPLE, "--state", state)
    assert code == 0
    assert offline == out
    assert f"edgegen: note: {state} holds no URL normalisation setting" in err
    # The example is a recent pull (make demo's plan ends without that note).
    example = ROOT / "examples" / "zone-state.json"
    assert "url_normalization" in json.loads(example.read_text())
    code, _, err = run("plan", EXAMPLE, "--state", example)
    assert code in (0, 1) and "holds no URL normalisation setting" not in err


def test_plan_prints_the_edges_lint_findings(
    zone: FakeCloudflare, run: Any, tmp_path: Path
) -> None:
    """plan runs the same validity gate as validate, edge checks included: a Worker limit
    whose host no route covers (L211) is a warning on stderr, and the plan still shows."""
    path = variant(
        tmp_path,
        **{
            'routes: ["api.example.com/*", "hooks.example.com/webhooks/*"]': (
                'routes: ["api.example.com/*"]'
            )
        },
    )
    code, out, err = run("plan", path)
    assert code == 0, err
    assert "[warning L211]" in err and "hooks.example.com" in err
    assert out.startswith(f"edgegen plan for zone {ZONE_ID}")
