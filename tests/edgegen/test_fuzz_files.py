"""Fuzzing what edgegen reads besides the policy: state files, plan files, Cloudflare's answers.

Every input gives a result or a clear error: ``edgegen plan POLICY --state FILE`` and
``edgegen apply PLANFILE`` exit 0, 1 or 2 with one line on stderr, never an exception that
escapes the CLI (which would be a traceback); the API client returns a value or raises
``CloudflareAPIError``, never anything else; planning against whatever a zone holds works.
Each test has a time limit, so a hang fails it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import httpx
import pytest
from cloudflare_fake import ACCOUNT_ID, TOKEN, ZONE_ID, FakeCloudflare, envelope
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from zone_support import EXAMPLE, HAND_MADE, Network, Sleeps, clone, variant

import edgegen
from edgegen import (
    Artifacts,
    Client,
    CloudflareAPIError,
    RemoteState,
    Scope,
    Token,
    build,
    cli,
)
from edgegen.cloudflare import _client
from edgegen.cloudflare._retry import MAX_RETRY_AFTER, parse_retry_after
from edgegen.cloudflare._state import RemoteRuleset
from edgegen.zone import _format
from edgegen.zone._file_formats import plan_to_json

BASE = EXAMPLE.read_text()
CHANGED = variant(
    BASE,
    **{
        "rate: 20/1m,": "rate: 10/1m,",
        "rate: 100/10s": "rate: 50/10s",
        'routes: ["api.example.com/*", "hooks.example.com/webhooks/*"]': (
            'routes: ["api.example.com/v2/*", "hooks.example.com/webhooks/*"]'
        ),
    },
)
FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(["edgegen:x", "create", "delete", "update", "move", "GET", "", "0" * 32]),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)
# JSON texts that parse but hold what edgegen must refuse, and texts that do not parse.
HOSTILE_TEXTS = [
    "[" * 50_000 + "]" * 50_000,
    '{"a":' * 5_000 + "1" + "}" * 5_000,
    '{"format": "edgegen-plan", "x": ' + "[" * 5_000 + "]" * 5_000 + "}",
    '{"format": "edgegen-state", "format_version": 1, "zone_id": "\\ud800"}',
    '{"format": "edgegen-plan", "format_version": 1, "notes": ["\\udfff"]}',
    '{"format": "edgegen-state", "format_version": NaN}',
    '{"format": "edgegen-plan", "format_version": Infinity}',
    "1" * 10_000,
    '{"format": "edgegen-plan"',
    "\ufeff{}",
    "",
]


def mutate(data: Any, path: list[int], value: object) -> Any:
    """``data`` with the value at ``path`` (indices modulo each level's size) replaced."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        key = list(data)[head % len(data)] if data else "x"
        return {**data, key: mutate(data.get(key), rest, value)}
    if isinstance(data, list) and data:
        index = head % len(data)
        return [*data[:index], mutate(data[index], rest, value), *data[index + 1 :]]
    return value


def drop(data: Any, path: list[int]) -> Any:
    """``data`` with the key or item at ``path`` removed."""
    if isinstance(data, dict) and data:
        key = list(data)[path[0] % len(data)]
        if len(path) == 1:
            return {k: v for k, v in data.items() if k != key}
        return {**data, key: drop(data[key], path[1:])}
    if isinstance(data, list) and data:
        index = path[0] % len(data)
        if len(path) == 1:
            return data[:index] + data[index + 1 :]
        return [*data[:index], drop(data[index], path[1:]), *data[index + 1 :]]
    return data


def run(*argv: str | Path) -> tuple[int, str, str]:
    """Run the CLI; an exception other than the CLI's own exit escapes and fails the test.

    stdout is strict UTF-8, as on many terminals, so text that cannot be printed fails.
    """
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", write_through=True)
    err = io.StringIO()
    stdin = sys.stdin
    sys.stdin = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main([os.fspath(a) for a in argv])
            except SystemExit as exit_:
                # argparse's usage errors and --help.
                code = exit_.code if isinstance(exit_.code, int) else 2
    finally:
        sys.stdin = stdin
    return code, raw.getvalue().decode("utf-8", "replace"), err.getvalue()


def assert_clean_exit(code: int, err: str, allowed: tuple[int, ...] = (0, 1, 2)) -> None:
    """Exit 0, 1 or 2; an error is one 'edgegen: error:' sentence, never a traceback."""
    assert code in allowed, err
    assert "Traceback" not in err
    if code == 1:
        assert "edgegen: error: " in err or "[error P" in err, err


class Lab:
    """A fake zone (hand-made rules, the example applied), its state and a plan file."""

    def __init__(self, network: Network, directory: Path) -> None:
        self.network = network
        self.directory = directory
        fake = FakeCloudflare()
        fake.seed_rules(HAND_MADE, description="made in the dashboard")
        network.reset(fake)
        self.base = directory / "base.yaml"
        self.base.write_text(BASE)
        self.changed = directory / "changed.yaml"
        self.changed.write_text(CHANGED)
        assert run("apply", self.base, "--auto-approve")[0] == 0
        state = directory / "state.json"
        assert run("pull", self.base, "--out", state)[0] == 0
        self.state: dict[str, Any] = json.loads(state.read_text())
        plan = directory / "plan.json"
        assert run("plan", self.changed, "--out", plan)[0] == 0
        self.plan: dict[str, Any] = json.loads(plan.read_text())
        self.prepared = clone(fake)

    def fresh_zone(self) -> FakeCloudflare:
        """The zone as the plan was made against, for one example."""
        fake = clone(self.prepared)
        self.network.reset(fake)
        return fake

    def write(self, name: str, content: str | bytes) -> Path:
        """A file in the lab's directory."""
        path = self.directory / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, "utf-8", errors="surrogatepass")
        return path

    def plan_with_state(self, content: str | bytes) -> tuple[int, str, str]:
        """``edgegen plan CHANGED --state FILE`` with this file."""
        return run("plan", self.changed, "--state", self.write("fuzz-state.json", content))

    def apply_plan(self, content: str | bytes, *options: str) -> tuple[int, str, str]:
        """``edgegen apply FILE`` (a fresh zone each time) with this file."""
        self.fresh_zone()
        return run("apply", self.write("fuzz-plan.json", content), *options)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The environment pointing at the fake, no real sleeps, and the lab."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CLOUDFLARE_API_TOKEN", TOKEN)
        patch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
        patch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
        patch.delenv("CLOUDFLARE_API_BASE_URL", raising=False)
        # No request leaves the process: skip loading CA certificates for every client.
        patch.delenv("SSL_CERT_FILE", raising=False)
        patch.setenv("SSL_CERT_DIR", str(tmp_path_factory.mktemp("no-ca")))
        patch.setattr(_client, "_sleep", Sleeps())
        network = Network()
        with network.installed():
            yield Lab(network, tmp_path_factory.mktemp("lab"))


# --- state files ---------------------------------------------------------------------


def test_the_unchanged_files_work(lab: Lab) -> None:
    """The pulled state plans and the saved plan applies: the fuzzing starts from working
    files."""
    code, out, err = lab.plan_with_state(json.dumps(lab.state))
    assert code == 0, err
    assert "~ update login" in out
    code, out, err = lab.apply_plan(json.dumps(lab.plan))
    assert code == 0, err
    assert "Apply complete: 4 write(s) made." in out


@pytest.mark.timeout(120)
@FUZZ
@given(json_values)
def test_state_file_any_json(lab: Lab, data: object) -> None:
    """Any JSON as a state file: a plan or one clear error."""
    code, _, err = lab.plan_with_state(json.dumps(data))
    assert_clean_exit(code, err, (1,))


@pytest.mark.timeout(120)
@FUZZ
@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), json_values)
@example([6, 4], [7])
@example([6, 4, 0], 7)
@example([3], 5)
@example([7], [{"id": "1", "pattern": "api.example.com/*", "script": ["x"]}])
def test_state_file_one_value_changed(lab: Lab, path: list[int], value: object) -> None:
    """The pulled state with any one value replaced: a plan or one clear error."""
    code, _, err = lab.plan_with_state(json.dumps(mutate(lab.state, path, value)))
    assert_clean_exit(code, err)


@pytest.mark.timeout(120)
@FUZZ
@given(st.lists(st.integers(0, 40), min_size=1, max_size=5))
def test_state_file_one_field_missing(lab: Lab, path: list[int]) -> None:
    """The pulled state without any one field: a plan or one clear error."""
    code, _, err = lab.plan_with_state(json.dumps(drop(lab.state, path)))
    assert_clean_exit(code, err)


@pytest.mark.timeout(120)
@settings(FUZZ, max_examples=50)
@given(st.binary(max_size=300))
def test_state_file_random_bytes(lab: Lab, data: bytes) -> None:
    """Random bytes as a state file: one clear error."""
    code, _, err = lab.plan_with_state(data)
    assert_clean_exit(code, err, (1,))


@pytest.mark.parametrize("text", HOSTILE_TEXTS, ids=range(len(HOSTILE_TEXTS)))
def test_state_file_hostile_json(lab: Lab, text: str) -> None:
    """Deep nesting, lone surrogates, NaN, huge numbers, cut-short JSON: one clear error."""
    code, _, err = lab.plan_with_state(text)
    assert_clean_exit(code, err, (1,))


@pytest.mark.timeout(30)
def test_state_file_without_end(lab: Lab) -> None:
    """A path that never ends (/dev/zero) is read only as far as a state file could be."""
    code, _, err = run("plan", lab.changed, "--state", "/dev/zero")
    assert code == 1
    assert "is larger than 16 MiB, so it is not a state file edgegen wrote" in err


# --- plan files ----------------------------------------------------------------------


@pytest.mark.timeout(120)
@FUZZ
@given(json_values)
def test_plan_file_any_json(lab: Lab, data: object) -> None:
    """Any JSON (naming the plan format, so it is read as a plan) as a saved plan: refused
    with one clear error, and nothing written."""
    if isinstance(data, dict):
        data = {**data, "format": "edgegen-plan"}
    fake = lab.fresh_zone()
    code, _, err = run("apply", lab.write("fuzz-plan.json", json.dumps(data)))
    assert_clean_exit(code, err, (1,))
    assert fake.writes == []


@pytest.mark.timeout(120)
@FUZZ
@given(st.lists(st.integers(0, 60), min_size=1, max_size=7), json_values, st.booleans())
@example([6, 0, 0], "explode", False)
@example([9, 0, 0], "explode", False)
@example([8], {"action": "explode", "name": "w", "fields": []}, True)
@example([9, 0, 3], 5, False)
@example([3, 1], 5, False)
@example([13, 1, 4], [7], True)
@example([13, 1, 0], "another-worker", False)
def test_plan_file_one_value_changed(
    lab: Lab, path: list[int], value: object, dry_run: bool
) -> None:
    """The saved plan with any one value replaced: applied, refused, or one clear error."""
    options = ("--dry-run",) if dry_run else ()
    code, _, err = lab.apply_plan(json.dumps(mutate(lab.plan, path, value)), *options)
    assert_clean_exit(code, err)


@pytest.mark.timeout(120)
@FUZZ
@given(st.lists(st.integers(0, 60), min_size=1, max_size=6))
def test_plan_file_one_field_missing(lab: Lab, path: list[int]) -> None:
    """The saved plan without any one field: applied, refused, or one clear error."""
    code, _, err = lab.apply_plan(json.dumps(drop(lab.plan, path)))
    assert_clean_exit(code, err)


@pytest.mark.timeout(120)
@settings(FUZZ, max_examples=50)
@given(st.binary(max_size=300))
def test_plan_file_random_bytes(lab: Lab, data: bytes) -> None:
    """Random bytes given to apply: read as a policy (which they are not) or refused."""
    fake = lab.fresh_zone()
    code, _, err = run("apply", lab.write("fuzz-plan.json", data), "--auto-approve")
    assert_clean_exit(code, err, (1,))
    assert fake.writes == []


# Text that is not a plan is read as a policy; deep nesting there is a located error too.
PLAN_TEXTS = HOSTILE_TEXTS


@pytest.mark.parametrize("text", PLAN_TEXTS, ids=range(len(HOSTILE_TEXTS)))
def test_plan_file_hostile_json(lab: Lab, text: str) -> None:
    """Deep nesting, lone surrogates, NaN, cut-short JSON given to apply: one clear error."""
    fake = lab.fresh_zone()
    code, _, err = run("apply", lab.write("fuzz-plan.json", text), "--auto-approve")
    assert_clean_exit(code, err, (1,))
    assert fake.writes == []


@pytest.mark.timeout(30)
def test_apply_of_a_file_without_end(lab: Lab) -> None:
    """apply /dev/zero stops reading at the size a plan could have."""
    code, _, err = run("apply", "/dev/zero")
    assert code == 1
    assert "is larger than 16 MiB" in err


# --- Cloudflare's answers ------------------------------------------------------------

RETRY_AFTER = st.one_of(
    st.sampled_from(
        [
            "-1",
            "1e309",
            "1.5",
            "9" * 400,
            "0" * 30 + "5",
            "NaN",
            "inf",
            "²",
            "٣",
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Fri, 31 Dec 9999 23:59:59 GMT",
            "Mon, 01 Jan 99999 00:00:00 GMT",
            "Wed, 32 Foo 2026 25:61:61 XYZ",
            "",
        ]
    ),
    st.text(max_size=40),
)


@settings(max_examples=500, deadline=None)
@given(RETRY_AFTER)
def test_retry_after_is_a_bounded_number_or_none(value: str) -> None:
    """Whatever the header says: None, or seconds between 0 and a day."""
    seconds = parse_retry_after(value)
    assert seconds is None or 0.0 <= seconds <= MAX_RETRY_AFTER


def test_retry_after_values() -> None:
    """Digits are seconds (leading zeros too); a far-off date or a huge number is a day,
    which is more than any retry waits; signs, fractions and other digits mean nothing."""
    assert parse_retry_after("0" * 30 + "5") == 5.0
    assert parse_retry_after("9" * 400) == MAX_RETRY_AFTER
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT") == MAX_RETRY_AFTER
    for value in ("-1", "1e309", "1.5", "²", "٣", "inf"):
        assert parse_retry_after(value) is None


header_values = st.one_of(RETRY_AFTER, st.text(st.characters(max_codepoint=255), max_size=30))
BODIES = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    json_values.map(lambda v: json.dumps(envelope(v)).encode()),
    st.builds(
        lambda ok, result, errors: json.dumps(
            {"success": ok, "errors": errors, "messages": [], "result": result}
        ).encode(),
        st.booleans(),
        json_values,
        json_values,
    ),
    st.binary(max_size=200),
    st.sampled_from([t.encode() for t in HOSTILE_TEXTS]),
)


Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    """A response (status, headers, body) of any status, with odd headers and any body."""
    status = draw(st.sampled_from([200, 201, 204, 299, 304, 400, 401, 403, 404, 409, 429, 500]))
    status = draw(st.one_of(st.just(status), st.integers(100, 999)))
    headers: list[tuple[bytes, bytes]] = []
    for name in draw(
        st.lists(
            st.sampled_from(
                ["Retry-After", "Content-Type", "CF-Entrypoint", "Content-Encoding", "X-Odd"]
            ),
            max_size=4,
        )
    ):
        value = draw(
            st.one_of(
                header_values,
                st.sampled_from(
                    [
                        "multipart/form-data; boundary=b",
                        "multipart/form-data",
                        "multipart/mixed; boundary=\xff",
                        "gzip",
                        "br",
                        "deflate",
                        "application/json; charset=utf-32",
                    ]
                ),
            )
        )
        headers.append((name.encode(), value.encode("latin-1", "replace")))
    body = draw(BODIES)
    if draw(st.booleans()) and any(n == b"Content-Type" for n, _ in headers):
        body = b'--b\r\nContent-Disposition: form-data; name="worker.js"\r\n\r\n' + body
    return status, headers, body


CALLS = {
    "get_entrypoint": lambda c: c.get_entrypoint(ZONE_ID),
    "get_script_settings": lambda c: c.get_script_settings(ACCOUNT_ID, "w"),
    "get_script_content": lambda c: c.get_script_content(ACCOUNT_ID, "w"),
    "list_routes": lambda c: c.list_routes(ZONE_ID),
    "put_entrypoint": lambda c: c.send(c.put_entrypoint_write(ZONE_ID, {"rules": []})),
    "dry_run": lambda c: c.send(c.put_entrypoint_write(ZONE_ID, {"rules": []}, dry_run=True)),
    "create_route": lambda c: c.send(c.create_route_write(ZONE_ID, "a.example.com/*", "w")),
    "delete_route": lambda c: c.send(c.delete_route_write(ZONE_ID, "r1", "a.example.com/*")),
}


@pytest.mark.timeout(120)
@settings(max_examples=250, deadline=None)
@given(st.sampled_from(sorted(CALLS)), st.lists(answers(), min_size=1, max_size=5))
def test_any_answer_is_a_result_or_an_api_error(name: str, replies: list[Answer]) -> None:
    """Whatever Cloudflare (or a proxy) answers, each call returns or raises
    CloudflareAPIError; a write is retried at most five times and never waits long."""
    queue = list(replies)
    sleeps = Sleeps()

    def answer(request: httpx.Request) -> httpx.Response:
        status, headers, body = queue.pop(0) if len(queue) > 1 else queue[0]
        return httpx.Response(status, headers=headers, content=body, request=request)

    with Client(Token(TOKEN), transport=httpx.MockTransport(answer), sleep=sleeps) as client:
        try:
            CALLS[name](client)
        except CloudflareAPIError as exc:
            assert str(exc)
            assert exc.method in {"GET", "PUT", "POST", "DELETE"}
            if name in ("dry_run",) or exc.method == "GET":
                assert not exc.ambiguous
    assert len(sleeps) <= 4
    assert all(0 <= s <= 60 for s in sleeps)


@functools.cache
def example_artifacts() -> Artifacts:
    """What the example policy builds."""
    return build(policy.load(EXAMPLE, env={"CLOUDFLARE_ZONE_ID": ZONE_ID}))


rule_fields = st.dictionaries(
    st.sampled_from(
        [
            *("id", "ref", "description", "expression", "action", "ratelimit", "enabled"),
            *("version", "categories", "last_updated", "x"),
        ]
    ),
    json_values,
    max_size=8,
)


@pytest.mark.timeout(120)
@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.one_of(
            rule_fields,
            rule_fields.map(lambda r: {**r, "ref": "edgegen:" + str(r.get("ref", ""))}),
            st.just({"id": "x", "ref": "edgegen:login-42882135"}),
        ),
        max_size=6,
    ),
    st.text(max_size=20),
)
def test_planning_against_any_rules_in_the_zone(rules: list[dict[str, Any]], version: str) -> None:
    """Whatever rules the zone holds (made by hand, damaged, ours with odd fields), planning,
    every output format and the plan file work."""
    artifacts = example_artifacts()
    state = RemoteState(
        Scope(ZONE_ID, ACCOUNT_ID, "api-edge-limits"),
        RemoteRuleset("rs", version, "d", tuple(rules)),
        None,
        (),
    )
    plan = edgegen.plan(artifacts, state)
    _format.to_text(plan)
    _format.to_markdown(plan)
    json.dumps(plan_to_json(plan))
    assert plan.ruleset_body is not None or not plan.rule_changes


# --- command lines and paths -----------------------------------------------------------

WORDS = [
    "plan",
    "pull",
    "apply",
    "diff",
    "--state",
    "--out",
    "--format",
    "json",
    "markdown",
    "text",
    "--detailed-exitcode",
    "--token-file",
    "--zone-id",
    "--account-id",
    "--worker",
    "--auto-approve",
    "--dry-run",
    "--validate-remote",
    "@BASE",
    "@CHANGED",
    "@STATE",
    "@PLAN",
    "@TOKEN",
    "/dev/null",
    "/",
    "/nonexistent",
    ZONE_ID,
    "api-edge-limits",
    "-",
    "",
]


@pytest.mark.timeout(120)
@settings(FUZZ, max_examples=120)
@given(st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=12)), max_size=7))
def test_sync_command_lines(lab: Lab, argv: list[str]) -> None:
    """Any command line of plan, pull, apply and diff: exit 0, 1 or 2, never a traceback."""
    places = {
        "@BASE": lab.base,
        "@CHANGED": lab.changed,
        "@STATE": lab.write("cli-state.json", json.dumps(lab.state)),
        "@PLAN": lab.write("cli-plan.json", json.dumps(lab.plan)),
        "@TOKEN": lab.write("cli-token", TOKEN),
    }
    words: list[str | Path] = [places.get(a, a) for a in argv if not a.startswith("git:")]
    # --out always writes into a scratch directory, never over the inputs.
    words = [
        lab.directory / "scratch" / f"out-{i}" if i and words[i - 1] == "--out" else w
        for i, w in enumerate(words)
    ]
    lab.fresh_zone()
    code, _, err = run(*words)
    assert_clean_exit(code, err)


ODD_NAMES = [
    b"p\xff\xfe",
    b"\xed\xa0\x80surrogate",
    "ünïcødé 名前".encode(),
    b" spaces and 'quotes\" ",
    b"-dash",
    b"new\nline\ttab",
    b"x" * 200,
]


@pytest.mark.parametrize("name", ODD_NAMES, ids=range(len(ODD_NAMES)))
def test_paths_of_any_bytes(lab: Lab, name: bytes) -> None:
    """Files whose names are any bytes (as the shell passes them) work for every option that
    takes a path, and messages naming them print on a strict terminal."""
    folder = os.fsencode(lab.directory) + b"/" + name
    Path(os.fsdecode(folder)).mkdir(parents=True, exist_ok=True)

    def path(suffix: bytes) -> str:
        return os.fsdecode(folder + b"/" + name[:40] + suffix)

    policy_path = path(b".yaml")
    Path(policy_path).write_text(CHANGED)
    token = path(b".token")
    Path(token).write_text(TOKEN)
    state, plan = path(b".state"), path(b".plan")
    lab.fresh_zone()
    assert run("pull", policy_path, "--out", state, "--token-file", token)[0] == 0
    code, _, err = run("plan", policy_path, "--state", state, "--out", plan)
    assert code == 0, err
    assert run("apply", plan, "--dry-run", "--token-file", token)[0] == 0
    for argv in (
        ("plan", policy_path, "--state", path(b".missing")),
        ("apply", path(b".missing")),
        ("plan", policy_path, "--token-file", path(b".missing")),
        ("plan", policy_path, "--out", policy_path + "/under-a-file"),
        ("pull", policy_path, "--out", os.fsdecode(folder + b"/" + b"y" * 300)),
    ):
        code, _, err = run(*argv)
        assert code in (1, 2), (argv, err)
        assert "Traceback" not in err
        assert err.startswith("edgegen: error: ") or "[error P" in err, err
