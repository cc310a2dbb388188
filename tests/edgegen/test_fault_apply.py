"""apply under faults: a failure injected at every request of a full apply.

For each scenario (a first apply on a zone with hand-made rules, an update, a delete, a limit
moving between a rule and the Worker in both directions, route changes) a clean apply is
run first: it gives the requests apply sends, in order, and the zone after each of its
writes (S0 the zone before, Sn the zone the policy asks for). Then, for every request index
i and every kind of fault (a refused connection, an answer that never comes, 500/502/503,
429, each once and then recovering or from then on, and answers lost after Cloudflare acted),
apply runs again from S0 with request i failing.

What apply guarantees, and what is checked after each run:

- apply sends its writes one by one (the rules PUT, the Worker upload, each route); each is
  atomic at Cloudflare, so the zone after a failure is always "the first k writes made":
  exactly S_k, where k is the number of writes the report lists as written, or S_(k+1)
  when the report says the failed write may or may not have been made. There is no other
  state: never half a ruleset, never a route to a Worker that was not uploaded;
- the report names the written writes, the failed one and the ones not written, and its
  "done:" lines agree; a failure before the first write says that nothing was written;
- a fault that recovers on a retry is invisible (exit 0, the zone is Sn), except for the
  one write that is not idempotent, adding a route (POST), which is never retried once it
  may have reached Cloudflare;
- hand-made rules are always exactly as they were (same id, every field, same order);
- with the network back, plan shows what is left to do (exit 2, or 0 when the zone is Sn),
  a saved plan is refused once anything was written, and apply then finishes the job with
  no changes left.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest
from cloudflare_fake import ACCOUNT_ID, TOKEN, ZONE_ID, FakeCloudflare
from zone_support import (
    EXAMPLE,
    HAND_MADE,
    Fault,
    Network,
    Sleeps,
    Terminal,
    clone,
    variant,
    zone_state,
)

from edgegen import cli
from edgegen.cloudflare import _client

BASE = EXAMPLE.read_text()
LOGIN_EDGE = "    edge: { rate: 20/1m, action: managed_challenge, unauthenticated_only: false }\n"
HOOKS_IN_WORKER = "edge: { rate: 100/10s, unauthenticated_only: false, target: worker }"
HOOKS_AS_RULE = "edge: { rate: 100/10s, unauthenticated_only: false, target: rule }"
ROUTES = 'routes: ["api.example.com/*", "hooks.example.com/webhooks/*"]'


@dataclass(frozen=True)
class Scenario:
    """A zone (hand-made rules, then ``before`` applied) and the policy ``after`` to apply.

    ``mode``: ``auto`` (apply POLICY --auto-approve), ``validate`` (the same with
    --validate-remote), ``confirm`` (answering yes on a terminal, so the zone is read twice)
    or ``planfile`` (plan --out first, then apply PLANFILE).
    """

    before: str | None
    after: str
    mode: str


SCENARIOS = {
    "first_apply": Scenario(None, BASE, "validate"),
    "update": Scenario(
        BASE,
        variant(BASE, **{"rate: 20/1m,": "rate: 10/1m,", "rate: 100/10s": "rate: 50/10s"}),
        "planfile",
    ),
    "delete": Scenario(
        BASE, variant(BASE, **{LOGIN_EDGE: "", "rate: 100/10s": "rate: 50/10s"}), "auto"
    ),
    "worker_to_rule": Scenario(BASE, variant(BASE, **{HOOKS_IN_WORKER: HOOKS_AS_RULE}), "confirm"),
    "rule_to_worker": Scenario(variant(BASE, **{HOOKS_IN_WORKER: HOOKS_AS_RULE}), BASE, "auto"),
    "routes": Scenario(
        BASE,
        variant(
            BASE,
            **{
                ROUTES: 'routes: ["api.example.com/v2/*", "www.example.com/api/*", '
                '"hooks.example.com/webhooks/*"]'
            },
        ),
        "auto",
    ),
}

FAULTS = {
    "connection refused once": Fault("connect"),
    "connections refused from then on": Fault("connect", persistent=True),
    "timeout once": Fault("timeout"),
    "timeouts from then on": Fault("timeout", persistent=True),
    "answer lost once": Fault("timeout", after_write=True),
    "answers lost from then on": Fault("timeout", after_write=True, persistent=True),
    "500 once": Fault("status", 500),
    "500 from then on": Fault("status", 500, persistent=True),
    "502 once": Fault("status", 502),
    "502 from then on": Fault("status", 502, persistent=True),
    "503 once, Retry-After 1": Fault("status", 503, retry_after="1"),
    "503 from then on": Fault("status", 503, persistent=True),
    "500 after the write once": Fault("status", 500, after_write=True),
    "502 after the write from then on": Fault("status", 502, after_write=True, persistent=True),
    "429 once, Retry-After 2": Fault("status", 429, retry_after="2"),
}

_POLICIES: dict[tuple[str, str], policy.Policy] = {}
_real_load = policy.load


def _cached_load(path: Any, *args: Any, **kwargs: Any) -> policy.Policy:
    """policy.load, once per file content (the loader has its own tests; here it is setup)."""
    key = (str(path), Path(path).read_text())
    if key not in _POLICIES or args or kwargs:
        _POLICIES[key] = _real_load(path, *args, **kwargs)
    return _POLICIES[key]


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """The environment pointing at the fake, no real sleeps, and the network to the fake."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CLOUDFLARE_API_TOKEN", TOKEN)
        patch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
        patch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
        patch.delenv("CLOUDFLARE_API_BASE_URL", raising=False)
        # No request leaves the process: an empty CA directory saves loading certificates
        # for each of the thousands of clients made here.
        patch.delenv("SSL_CERT_FILE", raising=False)
        patch.setenv("SSL_CERT_DIR", str(tmp_path_factory.mktemp("no-ca")))
        patch.setattr(_client, "_sleep", Sleeps())
        patch.setattr(policy, "load", _cached_load)
        net = Network()
        with net.installed():
            yield net


Run = tuple[int, str, str]


def run(*argv: str | Path, answer: str | None = None) -> Run:
    """Run the CLI; returns (exit code, stdout, stderr). ``answer``: typed on a terminal."""
    out, err = io.StringIO(), io.StringIO()
    stdin = sys.stdin
    sys.stdin = Terminal(answer) if answer is not None else io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main([str(a) for a in argv])
    finally:
        sys.stdin = stdin
    return code, out.getvalue(), err.getvalue()


@dataclass
class Reference:
    """A scenario's clean apply: the zone before, the command, its writes and requests."""

    prepared: FakeCloudflare
    after: Path
    command: tuple[str | Path, ...]
    answer: str | None
    whats: list[str]
    requests: list[tuple[str, str]]
    snapshots: list[dict[str, Any]]
    planfile: Path | None


_REFERENCES: dict[str, Reference] = {}


def reference(name: str, network: Network, directory: Path) -> Reference:
    """The clean run of a scenario (made once per module)."""
    if name in _REFERENCES:
        return _REFERENCES[name]
    scenario = SCENARIOS[name]
    fake = FakeCloudflare()
    fake.seed_rules(HAND_MADE, description="made in the dashboard")
    network.reset(fake)
    if scenario.before is not None:
        before = directory / "before.yaml"
        before.write_text(scenario.before)
        code, _, err = run("apply", before, "--auto-approve")
        assert code == 0, err
    after = directory / "after.yaml"
    after.write_text(scenario.after)
    prepared = clone(fake)
    planfile = None
    command: tuple[str | Path, ...] = ("apply", after, "--auto-approve")
    answer = None
    if scenario.mode == "validate":
        command = (*command, "--validate-remote")
    elif scenario.mode == "confirm":
        command, answer = ("apply", after), "yes\n"
    elif scenario.mode == "planfile":
        planfile = directory / "plan.json"
        network.reset(clone(prepared))
        code, _, err = run("plan", after, "--out", planfile)
        assert code == 0, err
        command = ("apply", planfile)
    network.reset(clone(prepared))
    network.snapshots = [zone_state(network.fake)]
    code, out, err = run(*command, answer=answer)
    assert code == 0, err
    whats = done_lines(out)
    snapshots = network.snapshots
    assert len(snapshots) == len(whats) + 1 >= 2
    assert f"Apply complete: {len(whats)} write(s) made." in out
    found = Reference(
        prepared, after, command, answer, whats, list(network.requests), snapshots, planfile
    )
    _REFERENCES[name] = found
    return found


def done_lines(out: str) -> list[str]:
    """The writes apply reported as made (the question on a terminal ends without a
    newline, so the first may follow it on its line)."""
    return re.findall(r"(?:^|: )done: (.*)$", out, re.M)


@dataclass(frozen=True)
class Report:
    """What a failed apply said: the writes made, the one that failed, the rest."""

    written: list[str]
    failed: str | None
    not_written: list[str]
    ambiguous: bool


def _items(text: str) -> list[str]:
    return [] if text == "nothing" else text.split("; ")


def report(err: str) -> Report:
    """Parse apply's report from stderr."""
    stopped = re.search(r"^edgegen: error: apply stopped: (.+?) failed: ", err, re.M)
    if stopped is None:
        return Report([], None, [], False)
    written = re.search(r"^Written: (.*)\.$", err, re.M)
    not_written = re.search(r"^Not written: (.*)\.$", err, re.M)
    assert written is not None and not_written is not None, err
    ambiguous = f"The failed write ({stopped.group(1)}) may or may not have been made." in err
    return Report(
        _items(written.group(1)), stopped.group(1), _items(not_written.group(1)), ambiguous
    )


def foreign(fake: FakeCloudflare) -> list[dict[str, Any]]:
    """The zone's rules not managed by edgegen, exactly as stored."""
    return [r for r in fake.rules if not str(r.get("ref", "")).startswith("edgegen:")]


def check_one(ref: Reference, network: Network, fault: Fault, at: int) -> None:
    """Apply with request ``at`` failing, then check the zone, the report and recovery."""
    fake = clone(ref.prepared)
    network.reset(fake, fault, at)
    code, out, err = run(*ref.command, answer=ref.answer)
    where = f"request {at} ({' '.join(ref.requests[at])}): exit {code}\n{err}"
    assert "Traceback" not in err, where
    method = ref.requests[at][0]
    recovers = not fault.persistent and (
        fault.kind == "connect" or fault.status == 429 or method != "POST"
    )
    assert code == (0 if recovers else 1), where
    state = zone_state(fake)
    snapshots = ref.snapshots
    done = done_lines(out)
    if code == 0:
        assert state == snapshots[-1], where
        assert done == ref.whats, where
        assert f"Apply complete: {len(ref.whats)} write(s) made." in out, where
    else:
        told = report(err)
        if told.failed is None:
            # Stopped before the first write: a read (or Cloudflare's dry run) failed.
            assert (
                method == "GET"
                or "dry_run" in str(ref.requests[at])
                or at < len(ref.requests) - len(ref.whats)
            ), where
            assert "nothing was written" in err.lower(), where
            assert done == [], where
            assert state == snapshots[0], where
        else:
            k = len(told.written)
            assert told.written == ref.whats[:k] == done, where
            assert told.failed == ref.whats[k], where
            assert told.not_written == ref.whats[k + 1 :], where
            assert "Run edgegen plan to see what the zone holds now" in err, where
            if fault.after_write:
                # Cloudflare made the write; the client could not know.
                assert told.ambiguous, where
                assert state == snapshots[k + 1], where
            elif fault.kind == "connect":
                assert not told.ambiguous, where
                assert state == snapshots[k], where
            else:
                assert told.ambiguous, where
                assert state == snapshots[k], where
    assert foreign(fake) == foreign(ref.prepared), where
    kept = {r["ref"]: r["id"] for r in ref.prepared.rules}
    assert all(kept.get(r["ref"], r["id"]) == r["id"] for r in fake.rules), where

    # The network is back: plan tells the truth and apply finishes the job.
    network.reset(fake)
    finished = state == snapshots[-1]
    code, _, err = run("plan", ref.after, "--detailed-exitcode")
    assert code == (0 if finished else 2), f"{where}\nplan: {err}"
    if finished:
        return
    if ref.planfile is not None:
        code, _, err = run("apply", ref.planfile)
        if state == snapshots[0]:
            assert code == 0, f"{where}\napply PLANFILE: {err}"
            assert zone_state(fake) == snapshots[-1], where
            return
        assert code == 1, where
        assert "the zone changed since this plan was made" in err, where
        assert all(method == "GET" for method, _ in network.requests), where
    code, _, err = run("apply", ref.after, "--auto-approve")
    assert code == 0, f"{where}\napply again: {err}"
    # The zone is now Sn, which plans as "no changes" (test_sync checks that for Sn).
    assert zone_state(fake) == snapshots[-1], where
    assert foreign(fake) == foreign(ref.prepared), where


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_fault_at_every_request(
    scenario: str, fault: str, network: Network, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Fail each request of the scenario's apply in turn: the zone is always S_k as reported,
    hand-made rules are kept, and plan and apply recover."""
    ref = reference(scenario, network, tmp_path_factory.mktemp(scenario))
    for at in range(len(ref.requests)):
        check_one(ref, network, FAULTS[fault], at)


def test_the_scenarios_cover_every_kind_of_write(
    network: Network, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Between them, the scenarios write rules and the Worker in both orders, add and remove
    routes, read the zone twice (confirm, saved plan) and validate remotely."""
    writes = {
        name: reference(name, network, tmp_path_factory.mktemp(name)).whats for name in SCENARIOS
    }
    assert [w.split(" ")[0] for w in writes["first_apply"]] == ["update", "upload", "add", "add"]
    assert [w.split(" ")[0] for w in writes["delete"]] == ["upload", "update"]
    assert [w.split(" ")[0] for w in writes["worker_to_rule"]] == ["update", "upload"]
    assert [w.split(" ")[0] for w in writes["rule_to_worker"]] == ["upload", "update"]
    assert [w.split(" ")[0] for w in writes["routes"]] == ["add", "add", "remove"]
    requests = reference("first_apply", network, tmp_path_factory.mktemp("x")).requests
    assert [m for m, _ in requests].count("PUT") == 3  # the dry run, the rules, the Worker
    confirm = reference("worker_to_rule", network, tmp_path_factory.mktemp("y")).requests
    # Read (the URL normalisation setting too), then read again after "yes" (without it).
    assert [m for m, _ in confirm].count("GET") == 9
    assert [p for _, p in confirm].count(f"/client/v4/zones/{ZONE_ID}/url_normalization") == 1


def test_a_lost_answer_to_the_rules_put_is_retried_safely(
    network: Network, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Cloudflare saved the rules but the answer timed out: PUT replaces the whole ruleset
    with the same body, so sending it again is safe; apply completes and the zone is Sn."""
    ref = reference("first_apply", network, tmp_path_factory.mktemp("first_apply"))
    # The second PUT of the rules: the first is Cloudflare's dry run (--validate-remote).
    put = [i for i, (m, p) in enumerate(ref.requests) if m == "PUT" and "entrypoint" in p][1]
    fake = clone(ref.prepared)
    network.reset(fake, Fault("timeout", after_write=True), put)
    code, out, err = run(*ref.command)
    assert code == 0, err
    puts = [r for r in network.requests if r[0] == "PUT" and "entrypoint" in r[1]]
    assert len(puts) == 3  # the dry run, the lost one, the retry
    assert zone_state(fake) == ref.snapshots[-1]
    assert "Apply complete" in out


def test_lost_answers_to_a_put_report_an_unknown_outcome(
    network: Network, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Every answer to the Worker upload is lost (it was made each time): apply stops after
    five tries and says the upload may or may not have been made, and to run plan."""
    ref = reference("first_apply", network, tmp_path_factory.mktemp("first_apply"))
    upload = next(i for i, (m, p) in enumerate(ref.requests) if m == "PUT" and "/scripts/" in p)
    fake = clone(ref.prepared)
    network.reset(fake, Fault("timeout", after_write=True, persistent=True), upload)
    code, _, err = run(*ref.command)
    assert code == 1
    assert "after 5 attempt(s) (ReadTimeout)" in err
    assert "Cloudflare may or may not have made this change: run edgegen plan to see" in err
    told = report(err)
    assert told.ambiguous
    assert told.failed == "upload the Worker api-edge-limits"
    assert zone_state(fake) == ref.snapshots[2]


def test_a_lost_answer_to_a_route_post_is_not_retried(
    network: Network, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Adding a route is not idempotent: after a lost answer it is not sent again (a second
    POST could fail or duplicate); apply says the outcome is unknown, plan then sees the
    route, and apply has nothing left to do."""
    ref = reference("first_apply", network, tmp_path_factory.mktemp("first_apply"))
    post = next(i for i, (m, _) in enumerate(ref.requests) if m == "POST")
    fake = clone(ref.prepared)
    network.reset(fake, Fault("timeout", after_write=True), post)
    code, _, err = run(*ref.command)
    assert code == 1
    assert [m for m, _ in network.requests].count("POST") == 1
    told = report(err)
    assert told.ambiguous and told.failed is not None and told.failed.startswith("add the route")
    assert "Run edgegen plan to see what the zone holds now, then apply again." in err
    # The route whose answer was lost is in the zone; the writes after it were never sent.
    first = next(i for i, what in enumerate(ref.whats) if what.startswith("add the route"))
    assert zone_state(fake) == ref.snapshots[first + 1]
    network.reset(fake)
    code, out, _ = run("apply", ref.after, "--auto-approve")
    assert code == 0
    assert out.count("done: ") == len(ref.whats) - first - 1
    assert told.failed not in out
    assert zone_state(fake) == ref.snapshots[-1]
    assert run("plan", ref.after, "--detailed-exitcode")[0] == 0
