"""Per-identity overrides (applimit/_overrides.py, _override_store.py): set at run time on
one instance, they change the decisions of the others within ``app.override_refresh``;
removing one restores the tier; the audit stream lists both. On a real redis-server (two
processes), a real Redis Cluster, and ``memory://``; sync and async; the CLI.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import edgegen_policy
import pytest
import redis
from harness import RedisCluster, RedisServer
from limiter_support import Driver, MakeLimiter

from applimit import AsyncLimiter, InvalidArgumentError, Limiter, UnknownLimitError
from applimit._cli import main
from applimit._errors import ConfigurationError
from applimit._override_store import MemorySource
from applimit._override_store import keys as override_keys

ROOT = Path(__file__).resolve().parents[2]

POLICY = """
version: 1
tiers: [free, pro]
app: {{redis_url: "{url}", key_prefix: ov, timeout: 2s, override_refresh: {refresh}}}
limits:
  - name: api
    app:
      tiers: {{free: [3/1m], pro: [10/1m]}}
  - name: search
    app:
      per: org
      algorithm: gcra
      tiers: {{free: [2/1m], pro: [5/1m]}}
  - name: login
    app:
      per: ip
      tiers: {{free: [5/1m], pro: [5/1m]}}
  - name: edge_only
    edge: {{rate: 100/1m}}
cloudflare: {{plan: enterprise}}
"""


def write(tmp_path: Path, url: str, refresh: str = "200ms", extra: str = "") -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(url=url, refresh=refresh) + extra)
    return path


def allowed(limiter: Limiter, user: str, count: int, **options: Any) -> int:
    """How many of ``count`` hits of ``api`` are admitted."""
    return sum(limiter.hit("api", user, **options).allowed for _ in range(count))


def until(check: Any, seconds: float = 10.0) -> float:
    """Poll ``check`` until true, against a deadline; the seconds it took."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < seconds, "not seen before the deadline"
        time.sleep(0.01)
    return time.monotonic() - start


# --- memory:// -----------------------------------------------------------------------------


def test_memory_instances_see_a_change_at_once(tmp_path: Path) -> None:
    """On memory:// a change made through one limiter reaches the others on the store at
    once: the override's rates decide (tier shown as 'override'), the removal restores
    the tier, and the audit trail lists both, newest first."""
    path = write(tmp_path, "memory://overrides-a")
    one, two = Limiter.from_policy(path), Limiter.from_policy(path)
    one.overrides.set("api", "alice", rates=["5/1m"], reason="contract 17", by="ops", ttl=3600)
    decision = two.hit("api", "alice")
    assert decision.results[0].tier == "override" and decision.results[0].quota == 5
    assert allowed(two, "alice", 10) == 4
    assert allowed(two, "bob", 10) == 3  # others keep their tier
    assert two.overrides.remove("api", "alice", by="ops", reason="contract ended")
    assert two.hit("api", "alice").results[0].tier == "free"
    log = one.overrides.log()
    assert [(c.op, c.by, c.reason) for c in log] == [
        ("remove", "ops", "contract ended"),
        ("set", "ops", "contract 17"),
    ]
    assert log[1].override is not None and log[1].override.rates == ("5/1m",)
    assert not one.overrides.remove("api", "alice", by="ops", reason="again")
    assert len(one.overrides.log()) == 2


def test_override_is_per_limit_and_identity_kind(tmp_path: Path) -> None:
    """A per-org limit's override names the org; a user of the same name is not touched,
    and an identity spelt to look like another's key (braces, colons) gets nothing."""
    limiter = Limiter.from_policy(write(tmp_path, "memory://overrides-b"))
    limiter.overrides.set("search", "acme", rates=["4/1m"], reason="r", by="ops", ttl=60)
    org = {"org": "acme"}
    assert sum(limiter.hit("search", "u", keys=org).allowed for _ in range(6)) == 4
    assert sum(limiter.hit("search", "u", keys={"org": "acme}"}).allowed for _ in range(6)) == 2
    limiter.overrides.set("api", "a}:{u=b", rates=["1/1m"], reason="r", by="ops", ttl=60)
    assert allowed(limiter, "b", 5) == 3
    assert allowed(limiter, "a}:{u=b", 5) == 1


def test_checks_of_a_runtime_override(tmp_path: Path) -> None:
    """Every argument is checked, with the package's errors: nothing is stored."""
    limiter = Limiter.from_policy(write(tmp_path, "memory://overrides-c"))
    sets = limiter.overrides.set
    with pytest.raises(UnknownLimitError):
        sets("nope", "a", rates=["1/1m"], reason="r", by="o", ttl=60)
    with pytest.raises(UnknownLimitError, match="no app part"):
        sets("edge_only", "a", rates=["1/1m"], reason="r", by="o", ttl=60)
    with pytest.raises(InvalidArgumentError, match="client IP"):
        sets("login", "a", rates=["1/1m"], reason="r", by="o", ttl=60)
    with pytest.raises(InvalidArgumentError, match="rates"):
        sets("api", "a", rates=["lots"], reason="r", by="o", ttl=60)
    with pytest.raises(InvalidArgumentError, match="rates"):
        sets("api", "a", rates="1/1m", reason="r", by="o", ttl=60)
    with pytest.raises(InvalidArgumentError, match="expires"):
        sets("api", "a", rates=["1/1m"], reason="r", by="o", ttl=-1)
    with pytest.raises(InvalidArgumentError, match="expires"):
        sets("api", "a", rates=["1/1m"], reason="r", by="o", ttl=500 * 86400)
    with pytest.raises(InvalidArgumentError, match="reason"):
        sets("api", "a", rates=["1/1m"], reason="a\nb", by="o", ttl=60)
    with pytest.raises(InvalidArgumentError, match="by"):
        sets("api", "a", rates=["1/1m"], reason="r", by="\x9b31m", ttl=60)
    with pytest.raises(InvalidArgumentError, match="reason"):
        limiter.overrides.remove("api", "a", by="o", reason="\x1b[2J")
    with pytest.raises(InvalidArgumentError, match="value"):
        sets("api", "", rates=["1/1m"], reason="r", by="o", ttl=60)
    assert limiter.overrides.stored() == [] and limiter.overrides.log() == []


def test_a_policy_without_override_refresh_refuses_runtime_overrides(tmp_path: Path) -> None:
    """Without app.override_refresh the app would never read an override: setting one says
    so instead of storing something that changes nothing."""
    path = tmp_path / "p.yaml"
    path.write_text(
        POLICY.format(url="memory://overrides-d", refresh="1s").replace(
            ", override_refresh: 1s", ""
        )
    )
    limiter = Limiter.from_policy(path)
    assert limiter.override_feed is None
    with pytest.raises(ConfigurationError, match="override_refresh"):
        limiter.overrides.set("api", "a", rates=["1/1m"], reason="r", by="o", ttl=60)


def test_an_override_ends_when_it_expires(tmp_path: Path) -> None:
    """An expired override stops applying without any change being made or asked for: the
    feed applies the overrides again at its first read after the expiry."""
    limiter = Limiter.from_policy(write(tmp_path, "memory://overrides-e"))
    limiter.overrides.set("api", "alice", rates=["9/1m"], reason="r", by="o", ttl=0.3)
    assert limiter.peek("api", "alice").results[0].tier == "override"

    until(lambda: limiter.peek("api", "alice").results[0].tier == "free")
    assert limiter.overrides.in_force() == []


def test_denial_cache_does_not_outlive_a_change(tmp_path: Path) -> None:
    """A denial cached under the tier is not answered once an override gives room."""
    limiter = Limiter.from_policy(write(tmp_path, "memory://overrides-f"))
    assert allowed(limiter, "carol", 5) == 3
    limiter.overrides.set("api", "carol", rates=["6/1m"], reason="r", by="o", ttl=60)
    assert allowed(limiter, "carol", 5) == 3


# --- the policy file's overrides -------------------------------------------------------------


FILE_OVERRIDES = """
overrides:
  - limit: api
    user: dave
    rates: [7/1m]
    expires: "2999-01-01"
    reason: contract 9
  - limit: search
    key: {org: initech}
    rates: [3/1m]
    expires: "2999-01-01T00:00:00Z"
    reason: contract 10
"""


def test_file_overrides_apply_and_runtime_wins(tmp_path: Path) -> None:
    """The policy's overrides decide for the identities they name; a run-time override
    of the same identity wins while it lasts."""
    path = write(tmp_path, "memory://overrides-g", extra=FILE_OVERRIDES)
    limiter = Limiter.from_policy(path)
    assert allowed(limiter, "dave", 10) == 7
    org = {"org": "initech"}
    assert sum(limiter.hit("search", None, keys=org, ip="192.0.2.1").allowed for _ in range(5)) == 3
    limiter.overrides.set("api", "dave", rates=["9/1m"], reason="r", by="o", ttl=60)
    assert limiter.peek("api", "dave").results[0].quota == 9
    assert {o.source for o in limiter.overrides.in_force()} == {"file", "runtime"}


# --- a real redis-server: two processes ------------------------------------------------------

WATCHER = """
import json, sys, time
from applimit import Limiter
limiter = Limiter.from_policy(sys.argv[1])
seen = None
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    result = limiter.peek("api", "alice").results[0]
    now = (result.tier, result.quota)
    if now != seen:
        seen = now
        print(json.dumps(now), flush=True)
"""


def test_another_process_sees_set_and_remove_within_the_bound(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """A second process (its own limiter, override_refresh 200ms) decides with an override
    set here within the bound, and with its tier again once it is removed; both changes
    are in the audit stream."""
    path = write(tmp_path, redis_server.url)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert watcher.stdout is not None
        assert json.loads(watcher.stdout.readline()) == ["free", 3]
        limiter = Limiter.from_policy(path)
        started = time.monotonic()
        limiter.overrides.set("api", "alice", rates=["8/1m"], reason="deal", by="ops", ttl=600)
        assert json.loads(watcher.stdout.readline()) == ["override", 8]
        # The bound is the refresh interval; the rest is a loaded machine's scheduling.
        assert time.monotonic() - started < 0.2 + 2.0
        limiter.overrides.remove("api", "alice", by="ops", reason="deal over")
        assert json.loads(watcher.stdout.readline()) == ["free", 3]
        limiter.close()
    finally:
        watcher.kill()
        watcher.wait()
        if watcher.stdout is not None:
            watcher.stdout.close()
    log = redis_client.xrevrange(override_keys("ov")[2])
    assert [fields[b"op"] for _, fields in log] == [b"remove", b"set"]
    assert log[0][1][b"reason"] == b"deal over" and log[1][1][b"by"] == b"ops"
    # The hash expires with its last override; the version never does.
    assert redis_client.pttl(override_keys("ov")[1]) == -1


def test_redis_hash_expires_with_its_last_override(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """The hash of overrides carries the expiry of its last override, in Redis itself."""
    limiter = Limiter.from_policy(write(tmp_path, redis_server.url))
    limiter.overrides.set("api", "a", rates=["8/1m"], reason="r", by="o", ttl=100)
    limiter.overrides.set("api", "b", rates=["8/1m"], reason="r", by="o", ttl=1000)
    assert 999_000 < redis_client.pttl(override_keys("ov")[0]) <= 1_002_000
    assert [o.value for o in limiter.overrides.stored()] == ["a", "b"]
    limiter.close()


async def test_async_limiter_sets_and_reads(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """The async limiter sets, decides with, and removes an override, as the sync one."""
    path = write(tmp_path, redis_server.url)
    limiter = AsyncLimiter.from_policy(path)
    other = Limiter.from_policy(path)
    await limiter.overrides.set("api", "erin", rates=["2/1m"], reason="r", by="o", ttl=60)
    assert sum([(await limiter.hit("api", "erin")).allowed for _ in range(4)]) == 2
    until(lambda: other.peek("api", "erin").results[0].tier == "override")
    assert await limiter.overrides.remove("api", "erin", by="o", reason="done")
    assert (await limiter.peek("api", "erin")).results[0].tier == "free"
    assert [c.op for c in await limiter.overrides.log()] == ["remove", "set"]
    await limiter.aclose()
    other.close()


def test_cluster(tmp_path: Path, redis_cluster: RedisCluster, cluster_client: Any) -> None:
    """On Redis Cluster the three keys share a slot; one instance's change reaches another."""
    path = write(tmp_path, redis_cluster.url)
    one = Limiter.from_policy(path, cluster=True)
    two = Limiter.from_policy(path, cluster=True)
    one.overrides.set("search", "acme", rates=["4/1m"], reason="r", by="o", ttl=60)
    org = {"org": "acme"}
    until(lambda: two.peek("search", "x", keys=org).results[0].tier == "override")
    assert sum(two.hit("search", "x", keys=org).allowed for _ in range(6)) == 4
    one.overrides.remove("search", "acme", by="o", reason="done")
    until(lambda: two.peek("search", "x", keys=org).results[0].tier == "free")
    assert [c.op for c in two.overrides.log()] == ["remove", "set"]
    one.close()
    two.close()


# --- the command line ------------------------------------------------------------------------


def run(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    """``applimit`` in-process: exit code, stdout, stderr (argparse's own errors too)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(list(argv), stdin=io.StringIO(stdin), stdout=out, stderr=err)
        except SystemExit as stop:
            code = int(stop.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_cli_set_list_remove_log(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """`applimit override` sets, lists (JSON), removes (only with --yes from a script)
    and shows the log; a running limiter decides with what it set."""
    path = str(write(tmp_path, redis_server.url))
    limiter = Limiter.from_policy(path)
    code, out, err = run(
        "override", "set", path, "--limit", "search", "--keys", "org=acme",
        "--rate", "6/1m", "--ttl", "30d", "--reason", "contract 4", "--by", "ann",
    )  # fmt: skip
    assert code == 0, err
    assert "search" in out and "6/1m" in out
    code, out, _ = run("override", "list", path, "--format", "json")
    listed = json.loads(out)["overrides"]
    assert [(o["limit"], o["kind"], o["value"], o["rates"]) for o in listed] == [
        ("search", "org", "acme", ["6/1m"])
    ]
    until(lambda: limiter.peek("search", None, keys={"org": "acme"}).results[0].quota == 6)
    remove = ("override", "remove", path, "--limit", "search", "--keys", "org=acme")
    code, _, err = run(*remove, "--reason", "ended")
    assert code == 1 and "--yes" in err
    code, out, err = run(*remove, "--reason", "ended", "--yes", "--by", "bo")
    assert code == 0, err
    assert out.endswith(": its tier's limits apply\n")
    code, out, _ = run("override", "log", path, "--format", "json")
    changes = json.loads(out)["changes"]
    assert [(c["op"], c["by"], c["reason"]) for c in changes] == [
        ("remove", "bo", "ended"),
        ("set", "ann", "contract 4"),
    ]
    code, out, _ = run("override", "log", path)
    assert "remove limit 'search' for org 'acme' by bo: ended" in out
    limiter.close()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--limit", "api", "--rate", "1/1m", "--ttl", "1d"), "--reason"),
        (("--limit", "api", "--user", "a", "--rate", "1/1m", "--reason", "r"), "--ttl"),
        (("--limit", "api", "--keys", "org=x", "--rate", "1/1m", "--ttl", "1d", "--reason", "r"),
         "--user"),
        (("--limit", "login", "--user", "a", "--rate", "1/1m", "--ttl", "1d", "--reason", "r"),
         "client IP"),
        (("--limit", "nope", "--user", "a", "--rate", "1/1m", "--ttl", "1d", "--reason", "r"),
         "nope"),
        (("--limit", "api", "--user", "a", "--rate", "x", "--ttl", "1d", "--reason", "r"), "rate"),
        (("--limit", "api", "--user", "a", "--rate", "1/1m", "--ttl", "9", "--reason", "r"), "ttl"),
        (("--limit", "api", "--user", "a", "--rate", "1/1m", "--ttl", "1d", "--expires",
          "2027-06-30", "--reason", "r"), "not both"),
    ],
)  # fmt: skip
def test_cli_refuses_bad_input(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis, argv: Any, message: str
) -> None:
    """A wrong command line exits 2 with one line naming the fix, and stores nothing."""
    path = str(write(tmp_path, redis_server.url))
    code, _, err = run("override", "set", path, *argv)
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert redis_client.exists(override_keys("ov")[0]) == 0


# --- approximate mode, observers, headers ----------------------------------------------------

APPROXIMATE = """
version: 1
tiers: [free, pro]
app: {redis_url: "memory://overrides-h", override_refresh: 1s}
limits:
  - name: api
    match: {path_prefix: /api/}
    app:
      mode: approximate
      sync_every: 1
      tiers: {free: [3/1m], pro: [5/1m]}
"""


class Events:
    """An observer keeping (limit, tier, outcome) of every decision."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def on_decision(self, event: Any) -> None:
        self.seen.append((event.limit, event.tier, str(event.outcome)))


def test_approximate_mode_and_observers_see_the_override(tmp_path: Path) -> None:
    """An approximate limit counts the override's rates locally and in its syncs; the
    observers hear of decisions under the tier name 'override'."""
    path = tmp_path / "p.yaml"
    path.write_text(APPROXIMATE)
    events = Events()
    limiter = Limiter.from_policy(path, observers=[events])
    assert allowed(limiter, "alice", 6) == 3
    limiter.overrides.set("api", "alice", rates=["8/1m"], reason="r", by="o", ttl=60)
    # The minute's three count against the override too: its key is the tier's (1m).
    assert allowed(limiter, "alice", 10) == 5
    assert {tier for _, tier, _ in events.seen} == {"free", "override"}


def test_headers_show_the_override_rates(tmp_path: Path) -> None:
    """The middleware's RateLimit-Policy names the rate that applied: the override's."""
    from applimit import Caller
    from applimit.wsgi import RateLimitMiddleware

    path = tmp_path / "p.yaml"
    path.write_text(APPROXIMATE.replace("overrides-h", "overrides-i"))
    limiter = Limiter.from_policy(path)
    limiter.overrides.set("api", "zed", rates=["40/1h"], reason="r", by="o", ttl=60)

    def app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    def identify(request: Any) -> Caller:
        return Caller(request.header("x-user") or "")

    wrapped = RateLimitMiddleware(app, limiter=limiter, identify=identify)
    headers: dict[str, str] = {}

    def start(status: str, got: list[tuple[str, str]], exc_info: Any = None) -> None:
        headers.update(got)

    for user in ("zed", "amy"):
        environ = {
            "REQUEST_METHOD": "GET", "PATH_INFO": "/api/x", "SERVER_NAME": "h",
            "SERVER_PORT": "80", "REMOTE_ADDR": "192.0.2.9", "HTTP_X_USER": user,
            "wsgi.url_scheme": "http",
        }  # fmt: skip
        headers.clear()
        b"".join(wrapped(environ, start))
        quota = "40" if user == "zed" else "3"
        window = "3600" if user == "zed" else "60"
        assert f'"api";q={quota};w={window}' in headers["RateLimit-Policy"], headers


def test_usage_and_reset_of_an_overridden_identity(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """`applimit usage` shows an overridden identity's own rates (however many), and
    `reset` clears the keys of the override's periods too."""
    path = str(write(tmp_path, redis_server.url))
    limiter = Limiter.from_policy(path)
    limiter.overrides.set("api", "olga", rates=["8/1m", "20/1h"], reason="r", by="o", ttl=60)
    assert allowed(limiter, "olga", 2) == 2
    code, out, err = run("usage", path, "--user", "olga", "--tier", "free", "--format", "json")
    assert code == 0, err
    [api] = [limit for limit in json.loads(out)["limits"] if limit["name"] == "api"]
    rates = api["tiers"][0]["rates"]
    assert [(r["rate"], r["used"], r["tier"]) for r in rates] == [
        ("8/1m", 2, "override"),
        ("20/1h", 2, "override"),
    ]
    code, out, _ = run("usage", path, "--user", "olga", "--tier", "free")
    assert "(override)" in out
    assert limiter.reset("api", "olga")
    assert redis_client.keys("ov:api:*") == []
    limiter.close()


def _forked_child(limiter: Limiter, conn: Any) -> None:
    """In the forked child: wait for the override the parent sets, report how long."""
    import threading

    conn.send(any(t.name == "applimit-overrides" for t in threading.enumerate()))
    conn.recv()
    started = time.monotonic()
    deadline = started + 20
    while limiter.peek("api", "fay").results[0].tier != "override":
        if time.monotonic() > deadline:
            conn.send(None)
            return
        time.sleep(0.01)
    conn.send(time.monotonic() - started)


def test_a_forked_worker_keeps_reading(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """A limiter built before a pre-forking server forks its workers: each worker reads the
    overrides in a thread of its own (threads do not survive fork)."""
    import multiprocessing

    path = write(tmp_path, redis_server.url)
    limiter = Limiter.from_policy(path)
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    child = context.Process(target=_forked_child, args=(limiter, theirs))
    child.start()
    try:
        assert ours.poll(20) and ours.recv() is True
        other = Limiter.from_policy(path)
        other.overrides.set("api", "fay", rates=["7/1m"], reason="r", by="o", ttl=60)
        ours.send("set")
        assert ours.poll(30)
        took = ours.recv()
        assert took is not None and took < 0.2 + 5.0
        other.close()
    finally:
        child.join(30)
        ours.close()
        theirs.close()
    limiter.close()


COUNT_WHEN = """
version: 1
tiers: [free]
app: {redis_url: "memory://overrides-j", override_refresh: 1s}
limits:
  - name: logins
    count_when: {status: [401]}
    app:
      tiers: {free: [2/1m]}
"""


def test_count_when_counts_responses_against_the_override(tmp_path: Path) -> None:
    """A count_when limit checks and records against the identity's own rates."""
    path = tmp_path / "p.yaml"
    path.write_text(COUNT_WHEN)
    limiter = Limiter.from_policy(path)
    limiter.overrides.set("logins", "gus", rates=["4/1m"], reason="r", by="o", ttl=60)
    for _ in range(4):
        assert limiter.hit("logins", "gus").allowed
        recorded = limiter.record("logins", "gus", 401)
        assert recorded.results[0].tier == "override"
    assert not limiter.hit("logins", "gus").allowed
    assert limiter.hit("logins", "hal").results[0].quota == 2


def test_a_plan_made_while_the_overrides_change_is_not_remembered(tmp_path: Path) -> None:
    """A change that lands while a caller's plan is being made (the feed runs in its own
    thread) leaves no plan of the old overrides behind: the next decision has the new."""
    from applimit import _overrides

    limiter = Limiter.from_policy(write(tmp_path, "memory://overrides-k"))
    core = limiter.core
    now = time.time()
    changed = _overrides.table(
        limiter.compiled,
        [_overrides.Override("api", "user", "ivy", ("6/1m",), now + 60, "r", "o", now)],
        now,
    )
    planning = core._plan_user

    def change_midway(*args: Any) -> Any:
        plan = planning(*args)
        core.use_overrides(changed)
        return plan

    core._plan_user = change_midway  # type: ignore[method-assign]
    try:
        assert limiter.peek("api", "ivy").results[0].tier == "free"
    finally:
        del core._plan_user
    assert limiter.peek("api", "ivy").results[0].tier == "override"


@pytest.mark.parametrize("kind", ["server", "cluster"])
async def test_async_limiter_given_a_client(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """An AsyncLimiter given an asyncio client reads and writes the overrides with a
    blocking client of the same address (one server, or a cluster)."""
    import redis.asyncio
    import redis.asyncio.cluster

    client: Any
    if kind == "server":
        server: RedisServer = request.getfixturevalue("redis_server")
        request.getfixturevalue("redis_client")
        client = redis.asyncio.Redis.from_url(server.url)
    else:
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        request.getfixturevalue("cluster_client")
        client = redis.asyncio.cluster.RedisCluster.from_url(cluster.url)
    path = write(tmp_path, "redis://unused:6379/0")
    limiter = AsyncLimiter.from_policy(path, redis=client)
    await limiter.overrides.set("api", "jan", rates=["4/1m"], reason="r", by="o", ttl=60)
    assert (await limiter.peek("api", "jan")).results[0].quota == 4
    assert [o.value for o in await limiter.overrides.stored()] == ["jan"]
    await limiter.aclose()
    await client.aclose()


MIDDLEWARE = """
version: 1
tiers: [free, pro]
app: {redis_url: "memory://overrides-l", override_refresh: 1s}
limits:
  - name: api
    match: {path_prefix: /api/}
    app:
      tiers: {free: [3/1m], pro: [10/1m]}
  - name: org
    match: {path_prefix: /api/}
    app:
      per: org
      tiers: {free: [30/1m], pro: [100/1m]}
"""


def test_every_way_of_planning_sees_an_override_set_after_use(tmp_path: Path) -> None:
    """A limit used before its first override (its shape and plans remembered): hit(),
    check_request() with and without keys, and record paths all decide with the override
    once it is set, for its identity only, and with the tier again once it is removed."""
    path = tmp_path / "p.yaml"
    path.write_text(MIDDLEWARE)
    limiter = Limiter.from_policy(path)
    keys = {"org": "acme"}
    for who in ("kim", "lee"):
        limiter.peek("api", who)
        limiter.check_request("GET", "/api/x", who, ip="192.0.2.1")
        limiter.check_request("GET", "/api/x", who, ip="192.0.2.1", keys=keys)
    limiter.overrides.set("api", "kim", rates=["9/1m"], reason="r", by="o", ttl=60)
    limiter.overrides.set("org", "acme", rates=["90/1m"], reason="r", by="o", ttl=60)

    def tiers(who: str, **options: Any) -> list[str]:
        plain = limiter.check_request("GET", "/api/x", who, ip="192.0.2.1", **options)
        return [limiter.peek("api", who).results[0].tier, *(r.tier for r in plain.results)]

    # Without keys the org limit counts the caller by address: the tier applies.
    assert tiers("kim") == ["override", "override", "free"]
    assert tiers("kim", keys=keys) == ["override", "override", "override"]
    assert tiers("lee") == ["free", "free", "free"]
    assert tiers("lee", keys=keys) == ["free", "free", "override"]
    assert tiers("lee", keys={"org": "other"}) == ["free", "free", "free"]
    limiter.overrides.remove("api", "kim", by="o", reason="r")
    assert tiers("kim", keys=keys) == ["free", "free", "override"]


def test_cli_set_refuses_when_the_app_reads_no_overrides(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """Without app.override_refresh the command says the app would never read it (exit 1),
    and stores nothing; listing still works."""
    path = tmp_path / "p.yaml"
    path.write_text(
        POLICY.format(url=redis_server.url, refresh="1s").replace(", override_refresh: 1s", "")
    )
    code, _, err = run(
        "override", "set", str(path), "--limit", "api", "--user", "a", "--rate", "1/1m",
        "--ttl", "1d", "--reason", "r",
    )  # fmt: skip
    assert code == 1 and "override_refresh" in err
    assert redis_client.exists(override_keys("ov")[0]) == 0
    code, out, _ = run("override", "list", str(path))
    assert code == 0 and "no overrides" in out


# --- an override's own quotas and concurrency ------------------------------------------------

OWN_LIMITS = """
version: 1
tiers: [free, pro]
app: { timeout: 2s, key_prefix: own, override_refresh: 1s }
limits:
  - name: api
    app:
      algorithm: sliding_log
      tiers: { free: 100/1m, pro: 200/1m }
      quotas: { free: { day: 3 }, pro: { day: 10, month: 100 } }
      concurrency: { free: 1, pro: 4 }
"""


def own_policy(tmp_path: Path, url: str, refresh: str = "1s") -> Path:
    """OWN_LIMITS on the server at ``url``, read every ``refresh``, as a file."""
    path = tmp_path / "p.yaml"
    path.write_text(
        OWN_LIMITS.replace(
            "override_refresh: 1s", f'override_refresh: {refresh}, redis_url: "{url}"'
        )
    )
    return path


async def changed(limiter: Driver, setting: Any) -> Any:
    """What ``limiter.overrides.set``/``remove`` returned, awaited on an AsyncLimiter."""
    return await setting if limiter.is_async else setting


async def one_at_a_time(limiter: Driver, who: str, count: int) -> None:
    """``count`` hits of ``api`` for ``who``, each admitted and its slot given back."""
    for _ in range(count):
        decision = await limiter.hit("api", who)
        assert decision.allowed
        await limiter.release(decision)


def shown(decision: Any) -> list[tuple[str, str, int]]:
    return sorted((r.tier, r.algorithm, r.quota) for r in decision.results)


async def test_an_override_gives_its_own_quota_and_concurrency(make_limiter: MakeLimiter) -> None:
    """An override's quota and concurrency replace the tier's, counted on the same keys (a
    raised daily quota starts from what the caller used today); the tier's rate stays;
    removing the override restores the tier's, with what was used meanwhile counted.
    Observers hear of the override's quota and slots under the tier 'override'."""
    heard: list[tuple[str, str, str]] = []

    class Heard:
        def on_decision(self, event: Any) -> None:
            heard.append((event.tier, event.algorithm, str(event.outcome)))

    limiter = make_limiter(OWN_LIMITS, observers=[Heard()])
    await one_at_a_time(limiter, "acme", 3)
    refused = await limiter.hit("api", "acme")
    assert [r.algorithm for r in refused.denied_by] == ["quota:day"]
    overrides = limiter.limiter.overrides
    done = await changed(
        limiter,
        overrides.set("api", "acme", quotas={"day": 6}, concurrency=2, reason="c", by="o", ttl=60),
    )
    assert (done.rates, done.quotas, done.concurrency) == ((), (("day", 6),), 2)
    first = await limiter.hit("api", "acme")
    assert shown(first) == [
        ("free", "sliding_log", 100),
        ("override", "lease", 2),
        ("override", "quota:day", 6),
    ]
    second = await limiter.hit("api", "acme")
    assert second.allowed
    third = await limiter.hit("api", "acme")
    assert [r.algorithm for r in third.denied_by] == ["lease"]
    await limiter.release(first)
    fourth = await limiter.hit("api", "acme")
    assert fourth.allowed
    await limiter.release(second)
    await limiter.release(fourth)
    refused = await limiter.hit("api", "acme")
    assert [(r.tier, r.algorithm) for r in refused.denied_by] == [("override", "quota:day")]
    assert {e for e in heard if e[0] == "override"} >= {
        ("override", "quota:day", "allowed"),
        ("override", "quota:day", "denied"),
        ("override", "lease", "allowed"),
        ("override", "lease", "denied"),
    }
    # Others keep their tier; the tier's own concurrency of one still holds them.
    other = await limiter.hit("api", "initech")
    assert other.allowed and not (await limiter.hit("api", "initech")).allowed
    assert await changed(limiter, overrides.remove("api", "acme", by="o", reason="ended"))
    after = await limiter.hit("api", "acme")
    assert [(r.tier, r.algorithm) for r in after.denied_by] == [("free", "quota:day")]


async def test_an_override_replaces_rates_and_keeps_quotas_and_concurrency(
    make_limiter: MakeLimiter,
) -> None:
    """A customer's override of rates gives it its own rates; its tier's calendar quota
    and concurrency limit still apply (an override replaces only what it gives)."""
    limiter = make_limiter(
        """
version: 1
tiers: [free]
app: { timeout: 2s, override_refresh: 1s }
limits:
  - name: api
    app:
      algorithm: sliding_log
      tiers: { free: 2/1m }
      quotas: { free: { day: 5 } }
      concurrency: 1
"""
    )
    setting = limiter.limiter.overrides.set(
        "api", "acme", rates=["100/1m"], reason="contract", by="ops", ttl=60
    )
    if limiter.is_async:
        await setting
    first = await limiter.hit("api", "acme")
    assert sorted((r.tier, r.algorithm, r.quota) for r in first.results) == [
        ("free", "lease", 1),
        ("free", "quota:day", 5),
        ("override", "sliding_log", 100),
    ]
    # The tier's concurrency still holds the override's customer to one at once.
    assert not (await limiter.hit("api", "acme")).allowed
    await limiter.release(first)
    await one_at_a_time(limiter, "acme", 4)
    # Five in the day: the tier's quota refuses, though the override's rate has room.
    refused = await limiter.hit("api", "acme")
    assert [r.algorithm for r in refused.denied_by] == ["quota:day"]


async def test_an_override_of_one_kind_keeps_the_tiers_others(make_limiter: MakeLimiter) -> None:
    """Rates alone keep the tier's quotas and concurrency (and the other way round), for
    the tier the caller is on. Quotas replace the tier's as a whole, as rates do: a pro
    caller given a day of its own has no monthly quota left from pro."""
    limiter = make_limiter(OWN_LIMITS)
    overrides = limiter.limiter.overrides
    await changed(limiter, overrides.set("api", "acme", rates=["7/1m"], reason="c", by="o", ttl=60))
    first = await limiter.hit("api", "acme")
    assert shown(first) == [
        ("free", "lease", 1),
        ("free", "quota:day", 3),
        ("override", "sliding_log", 7),
    ]
    await limiter.release(first)
    await changed(
        limiter, overrides.set("api", "bolt", quotas={"day": 50}, reason="c", by="o", ttl=60)
    )
    pro = await limiter.hit("api", "bolt", tier="pro")
    assert shown(pro) == [
        ("override", "quota:day", 50),
        ("pro", "lease", 4),
        ("pro", "sliding_log", 200),
    ]
    await limiter.release(pro)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "rates, quotas or concurrency"),
        ({"quotas": {"year": 5}}, "not a period"),
        ({"quotas": {"day": 0}}, "from 1"),
        ({"quotas": {"day": True}}, "from 1"),
        ({"quotas": []}, "dict"),
        ({"quotas": {"billing": 5}}, "billing_day_from"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 2.5}, "concurrency"),
    ],
)
def test_checks_of_an_overrides_quotas_and_concurrency(
    options: dict[str, Any], message: str
) -> None:
    """What an override gives is checked against its limit: nothing is stored otherwise."""
    limiter = Limiter(edgegen_policy.loads(OWN_LIMITS), redis_url="memory://overrides-own")
    with pytest.raises(InvalidArgumentError, match=message):
        limiter.overrides.set("api", "a", reason="r", by="o", ttl=60, **options)
    assert limiter.overrides.stored() == []


def test_an_override_cannot_start_a_quota_or_lease_where_the_limit_cannot(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """A quota on a limit without quotas, concurrency on a limit without any, rates on a
    limit of concurrency alone, and concurrency on an approximate limit, say what to
    change in the policy."""
    limiter = Limiter.from_policy(write(tmp_path, "memory://overrides-own-b"))
    with pytest.raises(InvalidArgumentError, match="has no calendar quotas"):
        limiter.overrides.set("api", "a", quotas={"day": 5}, reason="r", by="o", ttl=60)
    with pytest.raises(InvalidArgumentError, match="has no concurrency limit"):
        limiter.overrides.set("api", "a", concurrency=3, reason="r", by="o", ttl=60)
    code, _, err = run(
        "override", "set", str(tmp_path / "policy.yaml"), "--limit", "api", "--user", "a",
        "--concurrency", "3", "--ttl", "1d", "--reason", "r", "--redis-url", redis_server.url,
    )  # fmt: skip
    assert code == 2 and "has no concurrency limit" in err
    slots = tmp_path / "slots.yaml"
    slots.write_text(
        OWN_LIMITS.replace("app: {", 'app: { redis_url: "memory://overrides-own-e",')
        + """  - name: exports
    app: { concurrency: 2 }
"""
    )
    alone = Limiter.from_policy(slots)
    with pytest.raises(InvalidArgumentError, match="concurrency alone"):
        alone.overrides.set("exports", "a", rates=["5/1m"], reason="r", by="o", ttl=60)
    assert alone.overrides.set("exports", "a", concurrency=3, reason="r", by="o", ttl=60)
    path = tmp_path / "approx.yaml"
    path.write_text(APPROXIMATE.replace("overrides-h", "overrides-own-c"))
    approximate = Limiter.from_policy(path)
    with pytest.raises(InvalidArgumentError, match="approximate"):
        approximate.overrides.set("api", "a", concurrency=3, reason="r", by="o", ttl=60)


def test_another_instance_sees_an_overrides_quota(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """A quota set on one instance reaches the others' decisions within the refresh; the
    document in Redis and the audit trail carry it; the CLI sets and lists it."""
    path = own_policy(tmp_path, redis_server.url, refresh="200ms")
    one, two = Limiter.from_policy(path), Limiter.from_policy(path)
    for _ in range(3):
        two.release(two.hit("api", "kim"))
    assert not two.hit("api", "kim").allowed
    code, out, err = run(
        "override", "set", str(path), "--limit", "api", "--user", "kim",
        "--quota", "day=5", "--concurrency", "3", "--ttl", "1d", "--reason", "trial", "--by", "ann",
    )  # fmt: skip
    assert code == 0, err
    assert "quotas 5/day; concurrency 3" in out
    until(lambda: two.peek("api", "kim").results[1].tier == "override")
    assert sum(two.hit("api", "kim").allowed for _ in range(4)) == 2
    code, out, _ = run("override", "list", str(path), "--format", "json")
    [listed] = json.loads(out)["overrides"]
    assert (listed["rates"], listed["quotas"], listed["concurrency"]) == ([], {"day": 5}, 3)
    code, out, _ = run("override", "log", str(path))
    assert "set limit 'api' for user 'kim': quotas 5/day; concurrency 3 by ann: trial" in out
    one.close()
    two.close()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--limit", "api", "--user", "a", "--ttl", "1d", "--reason", "r"), "--quota"),
        (("--limit", "api", "--user", "a", "--quota", "day", "--ttl", "1d", "--reason", "r"),
         "PERIOD=UNITS"),
        (("--limit", "api", "--user", "a", "--quota", "day=1", "--quota", "day=2", "--ttl", "1d",
          "--reason", "r"), "once per period"),
        (("--limit", "api", "--user", "a", "--quota", "year=1", "--ttl", "1d", "--reason", "r"),
         "not a period"),
        (("--limit", "api", "--user", "a", "--quota", "month=\u00b2", "--ttl", "1d", "--reason",
          "r"), "PERIOD=UNITS"),
        (("--limit", "api", "--user", "a", "--concurrency", "0", "--ttl", "1d", "--reason", "r"),
         "concurrency"),
    ],
)  # fmt: skip
def test_cli_refuses_bad_quotas_and_concurrency(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis, argv: Any, message: str
) -> None:
    """A wrong --quota or --concurrency exits 2 with one line naming the fix."""
    path = own_policy(tmp_path, redis_server.url)
    code, _, err = run("override", "set", str(path), *argv)
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert redis_client.exists(override_keys("own")[0]) == 0


FILE_OWN = """
overrides:
  - limit: api
    user: lou
    quotas: {day: 4}
    concurrency: 2
    expires: "2999-01-01"
    reason: contract 11
"""


def test_file_override_with_a_quota_and_concurrency(tmp_path: Path) -> None:
    """The policy file's override gives its quota and concurrency (the tier's rate stays)."""
    path = tmp_path / "p.yaml"
    path.write_text(
        OWN_LIMITS.replace("app: {", 'app: { redis_url: "memory://overrides-own-d",') + FILE_OWN
    )
    limiter = Limiter.from_policy(path)
    held = [limiter.hit("api", "lou") for _ in range(3)]
    assert [d.allowed for d in held] == [True, True, False]
    assert [(r.tier, r.algorithm) for r in held[2].denied_by] == [("override", "lease")]
    for decision in held:
        limiter.release(decision)
    # Two of the day's four are spent: two more, one at a time, then the quota refuses.
    for expected in (True, True, False):
        decision = limiter.hit("api", "lou")
        assert decision.allowed is expected
        limiter.release(decision)
    assert [r.algorithm for r in decision.denied_by] == ["quota:day"]


def test_usage_shows_an_overrides_quota_and_concurrency(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """`applimit usage` shows the identity's own quota and slots, marked as the override's,
    with what it used before the override counted; the period's end reads in days."""
    path = own_policy(tmp_path, redis_server.url)
    with Limiter.from_policy(path) as limiter:
        limiter.release(limiter.hit("api", "uma", tier="pro"))
        limiter.overrides.set(
            "api", "uma", quotas={"month": 500}, concurrency=3, reason="r", by="o", ttl=60
        )
        held = limiter.hit("api", "uma", tier="pro")
        argv = ("usage", str(path), "--user", "uma", "--tier", "pro")
        code, out, err = run(*argv, "--format", "json")
        assert code == 0, err
        [pro] = json.loads(out)["limits"][0]["tiers"]
        assert [(q["period"], q["tier"], q["quota"], q["used"]) for q in pro["quotas"]] == [
            ("month", "override", 500, 2)
        ]
        assert pro["concurrency"] == {"limit": 3, "running": 1, "free": 2, "tier": "override"}
        assert [(r["rate"], r["tier"], r["used"]) for r in pro["rates"]] == [("200/1m", "pro", 2)]
        code, text, _ = run(*argv)
        assert "running   1 of 3      free 2  (override)" in text
        assert re.search(
            r"500/month  used      2 of 500 .* period ends in \d+d \d+h  \(override\)", text
        )
        limiter.release(held)


async def test_a_cached_quota_denial_ends_with_the_override_that_made_it(
    make_limiter: MakeLimiter,
) -> None:
    """A quota's denial is cached until the period's end under the key of the period; an
    override changed meanwhile is decided at once, not answered from that cache. (Without
    a concurrency limit: a decision that takes a lease is never answered locally.)"""
    limiter = make_limiter(OWN_LIMITS.replace("      concurrency: { free: 1, pro: 4 }\n", ""))
    overrides = limiter.limiter.overrides
    await changed(
        limiter, overrides.set("api", "ned", quotas={"day": 1}, reason="r", by="o", ttl=60)
    )
    await limiter.release(await limiter.hit("api", "ned"))
    assert not (await limiter.hit("api", "ned")).allowed
    assert (await limiter.hit("api", "ned")).retry_after > 60  # cached until midnight
    await changed(
        limiter, overrides.set("api", "ned", quotas={"day": 2}, reason="r", by="o", ttl=60)
    )
    assert (await limiter.hit("api", "ned")).allowed


@pytest.mark.parametrize(
    "given",
    [
        {"rates": [], "quotas": {"year": 5}},
        {"rates": [], "quotas": {"day": -1}},
        {"rates": [], "quotas": {"day": 10**20}},
        {"rates": [], "concurrency": 0},
        {"rates": ["1/1m"] * 50},
        {"rates": [], "quotas": {"month": 2.7}},
        {"rates": [], "concurrency": 3.0},
        {"rates": ["1/1m"], "quotas": {"billing": 5}},
    ],
)
def test_an_override_written_into_redis_by_hand_is_checked_again(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis, given: dict[str, Any]
) -> None:
    """What Redis holds is read back with the checks of a set: a document no set would
    have written (an unknown period, units out of range, no slot at all, too many rates,
    a billing quota without a billing day) is ignored, and the tier decides."""
    path = own_policy(tmp_path, redis_server.url)
    with Limiter.from_policy(path) as limiter:
        good = limiter.overrides.set("api", "amy", rates=["9/1m"], reason="r", by="o", ttl=60)
        document = {**good.document(), "value": "bea", **given}
        field = json.dumps(["api", "user", "bea"])
        redis_client.hset(override_keys("own")[0], field, json.dumps(document))
        redis_client.incr(override_keys("own")[1])
        limiter.overrides.refresh()
        assert limiter.hit("api", "amy").results[0].tier == "override"
        decision = limiter.hit("api", "bea")
        assert decision.allowed and {r.tier for r in decision.results} == {"free"}


@pytest.mark.parametrize(
    "document",
    [
        '{"quotas": {"month": 1e400}}',
        '{"concurrency": Infinity}',
        '{"expires": NaN}',
        '{"at": ' + "9" * 400 + "}",
    ],
)
def test_a_document_no_number_can_hold_is_skipped_alone(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis, document: str
) -> None:
    """Numbers JSON allows and no override has (1e400, Infinity, NaN, a 400-digit time)
    make that one document unreadable: the others still apply, and every command still
    runs, `override remove` of the bad one included."""
    path = own_policy(tmp_path, redis_server.url)
    with Limiter.from_policy(path) as limiter:
        good = limiter.overrides.set("api", "amy", rates=["9/1m"], reason="r", by="o", ttl=60)
        text = json.dumps({**good.document(), "value": "bea"})
        bad = text[:-1] + ", " + document[1:]
        redis_client.hset(override_keys("own")[0], json.dumps(["api", "user", "bea"]), bad)
        redis_client.incr(override_keys("own")[1])
    with Limiter.from_policy(path) as other:
        until(lambda: other.peek("api", "amy").results[0].tier == "override")
        assert [o.value for o in other.overrides.stored()] == ["amy"]
    code, out, err = run("override", "list", str(path))
    assert code == 0 and "amy" in out and "Traceback" not in err
    code, _, err = run(
        "override", "remove", str(path), "--limit", "api", "--user", "bea",
        "--reason", "unreadable", "--yes",
    )  # fmt: skip
    assert code == 0, err


COUNTED_SLOTS = """
version: 1
tiers: [free, pro]
app: { timeout: 2s, key_prefix: own, override_refresh: 1s, redis_url: "memory://ov-slots" }
limits:
  - name: api
    count_when: { status: [500] }
    app:
      tiers: { free: [100/1m] }
      quotas: { free: { month: 100 } }
      concurrency: { pro: 5 }
"""


def test_a_count_when_limit_records_against_an_override_on_a_tier_of_slots_alone(
    tmp_path: Path,
) -> None:
    """A tier with only a concurrency limit has nothing to record against, but a caller's
    override gives it a quota: the failures count against that quota, as the hit checks."""
    path = tmp_path / "p.yaml"
    path.write_text(COUNTED_SLOTS)
    limiter = Limiter.from_policy(path)
    limiter.overrides.set("api", "alice", quotas={"month": 2}, reason="r", by="o", ttl=60)
    admitted = 0
    for _ in range(5):
        decision = limiter.hit("api", "alice", tier="pro")
        limiter.release(decision)
        if decision.allowed:
            admitted += 1
            recorded = limiter.record("api", "alice", 500, tier="pro")
            assert recorded is not None
            assert [(r.tier, r.algorithm) for r in recorded.results] == [
                ("override", "quota:month")
            ]
    assert admitted == 2


def test_reset_clears_what_an_override_replaces(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """`reset` of an overridden identity clears its tier's counters too (those its override
    replaces), so that the tier starts afresh when the override ends; and `reset --tier`
    takes a tier that has only a concurrency limit."""
    path = own_policy(tmp_path, redis_server.url)
    with Limiter.from_policy(path) as limiter:
        for _ in range(3):
            limiter.release(limiter.hit("api", "ada"))
        limiter.overrides.set("api", "ada", quotas={"month": 1000}, reason="r", by="o", ttl=60)
        assert limiter.reset("api", "ada")
        limiter.overrides.remove("api", "ada", by="o", reason="ended")
        decision = limiter.hit("api", "ada")
        assert decision.allowed, decision.denied_by
        limiter.release(decision)
    slots = tmp_path / "slots.yaml"
    slots.write_text(path.read_text() + "  - name: exports\n    app: { concurrency: { pro: 2 } }\n")
    code, _, err = run(
        "reset", str(slots), "--user", "ada", "--limit", "exports", "--tier", "pro", "--yes"
    )
    assert code == 0, err


def test_a_runtime_override_keeps_the_contracts_other_terms(tmp_path: Path) -> None:
    """A run-time override of one term (concurrency) over the file's contract (rates and a
    quota) keeps the contract's rates and quota while it lasts."""
    path = tmp_path / "p.yaml"
    path.write_text(
        OWN_LIMITS.replace("app: {", 'app: { redis_url: "memory://overrides-own-f",')
        + """overrides:
  - {limit: api, user: cy, rates: [50/1m], quotas: {day: 20}, expires: "2999-01-01", reason: c}
"""
    )
    limiter = Limiter.from_policy(path)
    limiter.overrides.set("api", "cy", concurrency=3, reason="bump", by="o", ttl=60)
    decision = limiter.hit("api", "cy")
    assert shown(decision) == [
        ("override", "lease", 3),
        ("override", "quota:day", 20),
        ("override", "sliding_log", 50),
    ]
    [held] = limiter.overrides.in_force()
    assert held.gives() == "rates 50/1m; quotas 20/day; concurrency 3"


@pytest.mark.parametrize(
    ("url", "connection"),
    [
        ("rediss://ann:secret@127.0.0.1:6380/2?ssl_cert_reqs=none", "SSLConnection"),
        ("redis://ann:secret@127.0.0.1:6380/2", "Connection"),
        ("unix:///tmp/redis.sock?db=3&password=secret", "UnixDomainSocketConnection"),
    ],
)
def test_the_feeds_blocking_client_keeps_the_async_clients_tls_and_credentials(
    url: str, connection: str
) -> None:
    """The overrides of an AsyncLimiter given an asyncio client are read in a thread with
    a blocking twin of that client: the same address, credentials and TLS (a TLS client's
    password never goes out in plain text to its TLS port)."""
    import redis.asyncio

    from applimit._clients import sync_from_async_client

    given = redis.asyncio.Redis.from_url(url)
    twin = sync_from_async_client(given, timeout=1.0, max_connections=4)()
    pool = twin.connection_pool
    assert pool.connection_class.__name__ == connection
    for setting in ("password", "db", "host", "port", "path", "username", "ssl_cert_reqs"):
        assert pool.connection_kwargs.get(setting) == given.connection_pool.connection_kwargs.get(
            setting
        ), setting
    twin.close()


@pytest.mark.parametrize("far", [1e15, float("inf"), float("nan")])
@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_an_expiry_no_set_could_write_is_dropped_not_kept_forever(
    tmp_path: Path,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    backend: str,
    far: float,
) -> None:
    """A document written by hand to expire centuries ahead (beyond the 400 days a set
    allows, and the day of clock skew between instances it is given) is not applied, and
    the next change drops it and still works (before, the hash's expiry overflowed and
    every set failed; Infinity and NaN, which Redis' JSON reads, stayed for ever); one set
    on a clock a few hours ahead is kept."""
    url = redis_server.url if backend == "redis" else f"memory://far-{tmp_path.name}"
    path = own_policy(tmp_path, url)
    with Limiter.from_policy(path) as limiter:
        good = limiter.overrides.set("api", "amy", rates=["9/1m"], reason="r", by="o", ttl=60)
        far_away = {**good.document(), "value": "bea", "expires": far}
        ahead = {**good.document(), "value": "cy", "expires": time.time() + 400 * 86_400 + 3600}
        written = {
            json.dumps(["api", "user", "bea"]): json.dumps(far_away),
            json.dumps(["api", "user", "cy"]): json.dumps(ahead),
        }
        if backend == "redis":
            redis_client.hset(override_keys("own")[0], mapping=written)
            redis_client.incr(override_keys("own")[1])
        else:
            source = limiter.override_source
            assert isinstance(source, MemorySource)
            with source.store.override_lock:
                source.store.overrides.update(written)
                source.store.override_version += 1
        limiter.overrides.refresh()
        assert limiter.hit("api", "bea").results[0].tier == "free"
        assert limiter.hit("api", "cy").results[0].tier == "override"
        limiter.overrides.set("api", "dan", rates=["7/1m"], reason="r", by="o", ttl=60)
        assert sorted(o.value for o in limiter.overrides.stored()) == ["amy", "cy", "dan"]
        if backend == "redis":
            ttl = redis_client.pttl(override_keys("own")[0])
            assert 400 * 86_400_000 < ttl <= 400 * 86_400_000 + 3_602_000
        # Listed before a change drops it: shown as ignored, never a traceback.
        if backend == "redis":
            redis_client.hset(override_keys("own")[0], json.dumps(["api", "user", "bea"]),
                              json.dumps(far_away))  # fmt: skip
            code, out, err = run("override", "list", str(path))
            assert code == 0 and "Traceback" not in err
            if far == 1e15:
                assert "'bea': rates 9/1m ignored: expires 1e+15 (no date)" in out
            code, out, _ = run("override", "list", str(path), "--format", "json")
            listed = {o["value"]: o["status"] for o in json.loads(out)["overrides"]}
            assert listed["amy"] == "in force" and listed["cy"] == "in force"
            assert listed.get("bea") in ({"ignored"} if far == 1e15 else {None})


def test_a_change_drops_the_same_documents_in_redis_and_in_memory(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """Documents of every shape written by hand, then one change: Redis' script and
    memory:// keep the same ones (a JSON object with a numeric expiry within bounds, even
    one readers skip) and drop the same ones."""
    now = time.time()
    shapes: dict[str, str] = {
        "good": json.dumps({"expires": now + 60}),
        "version-2": json.dumps({"version": 2, "expires": now + 60}),
        "whole-seconds": json.dumps({"expires": int(now) + 60}),
        "string-expiry": json.dumps({"expires": str(now + 60)}),
        "bool-expiry": json.dumps({"expires": True}),
        "no-expiry": json.dumps({"rates": []}),
        "expired": json.dumps({"expires": now - 1}),
        "far": json.dumps({"expires": now + 402 * 86_400}),
        "infinite": json.dumps({"expires": float("inf")}),
        "nan": json.dumps({"expires": float("nan")}),
        "huge-int": '{"expires": 1' + "0" * 400 + "}",
        "list": json.dumps([now + 60]),
        "not-json": "{",
        # Numbers Redis' JSON reads unless told to be strict, and Python's never does.
        "hex": '{"expires": 0x7FFFFFFF}',
        "plus": f'{{"expires": +{int(now) + 60}}}',
        "leading-zero": f'{{"expires": 0{int(now) + 60}}}',
        "infinity-beside": f'{{"expires": {int(now) + 60}, "at": Infinity}}',
    }
    kept: dict[str, set[str]] = {}
    for backend in ("redis", "memory"):
        url = redis_server.url if backend == "redis" else f"memory://shapes-{tmp_path.name}"
        with Limiter.from_policy(own_policy(tmp_path, url)) as limiter:
            if backend == "redis":
                redis_client.hset(override_keys("own")[0], mapping=shapes)
            else:
                source = limiter.override_source
                assert isinstance(source, MemorySource)
                with source.store.override_lock:
                    source.store.overrides.update(shapes)
            limiter.overrides.set("api", "amy", rates=["9/1m"], reason="r", by="o", ttl=60)
            if backend == "redis":
                held = redis_client.hkeys(override_keys("own")[0])
                kept[backend] = {k.decode() for k in held}
            else:
                kept[backend] = set(source.store.overrides)
    amy = json.dumps(["api", "user", "amy"])
    assert kept["redis"] == kept["memory"] == {"good", "version-2", "whole-seconds", amy}


class _ClosedPipe(io.StringIO):
    """Standard output whose reader went away (``applimit override log | head -1``)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("action", [("list",), ("list", "--format", "json"), ("log",)])
def test_a_closed_pipe_is_not_a_redis_outage(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis, action: tuple[str, ...]
) -> None:
    """Piped into ``head``: the reader goes away; the command ends quietly with 0, never
    "Redis did not answer" (a BrokenPipeError is an OSError, as Redis' failures are)."""
    path = str(write(tmp_path, redis_server.url))
    with Limiter.from_policy(path) as limiter:
        limiter.overrides.set("api", "amy", rates=["9/1m"], reason="r", by="o", ttl=60)
    err = io.StringIO()
    code = main(
        ["override", action[0], path, *action[1:]],
        stdin=io.StringIO(),
        stdout=_ClosedPipe(),
        stderr=err,
    )
    assert (code, err.getvalue()) == (0, "")


def test_removing_a_runtime_override_says_the_files_applies(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """Where the policy file gives the identity an override too, removing the run-time one
    restores the file's, and the command says so (not "its tier's limits apply")."""
    contract = (
        "overrides:\n  - { limit: api, user: amy, rates: [5/1m], expires: '2999-01-01', "
        "reason: contract }\n"
    )
    path = str(write(tmp_path, redis_server.url, extra=contract))
    code, _, err = run(
        "override", "set", path, "--limit", "api", "--user", "amy", "--rate", "7/1m",
        "--ttl", "1d", "--reason", "bump",
    )  # fmt: skip
    assert code == 0, err
    code, out, err = run(
        "override", "remove", path, "--limit", "api", "--user", "amy", "--reason", "done", "--yes"
    )
    assert code == 0, err
    assert out.endswith(
        ": the policy file's override applies (rates 5/1m until 2999-01-02T00:00:00Z)\n"
    )
    with Limiter.from_policy(path) as limiter:
        assert limiter.peek("api", "amy").results[0].quota == 5


def test_the_log_says_when_empty_and_by_defaults_to_the_account(
    tmp_path: Path,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty audit trail says so; without --by, a change is recorded under the
    account running the command, found without $USER (a container's root has none)."""
    import pwd

    path = str(write(tmp_path, redis_server.url))
    code, out, _ = run("override", "log", path)
    assert code == 0 and out.startswith("no override changes in redis://")
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    code, _, err = run(
        "override", "set", path, "--limit", "api", "--user", "amy", "--rate", "7/1m",
        "--ttl", "1d", "--reason", "r",
    )  # fmt: skip
    assert code == 0, err
    code, out, _ = run("override", "log", path, "--format", "json")
    [change] = json.loads(out)["changes"]
    try:
        account = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid with no entry, as in some containers
        account = "unknown"
    assert change["by"] == account


def test_list_says_which_stored_overrides_the_policy_cannot_apply(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """An override set before the policy changed (here: concurrency on a limit that has
    none) is not applied, and `override list` says so and why, not "until ..."."""
    path = str(write(tmp_path, redis_server.url))
    with Limiter.from_policy(path) as limiter:
        good = limiter.overrides.set("api", "amy", rates=["9/1m"], reason="r", by="o", ttl=60)
        stale = {**good.document(), "value": "zed", "concurrency": 8}
        redis_client.hset(
            override_keys("ov")[0], json.dumps(["api", "user", "zed"]), json.dumps(stale)
        )
        redis_client.incr(override_keys("ov")[1])
        limiter.overrides.refresh()
        assert limiter.peek("api", "zed").results[0].tier == "free"
    code, out, err = run("override", "list", path)
    assert code == 0, err
    [zed] = [line for line in out.splitlines() if "'zed'" in line]
    assert "not applied: limit 'api' has no concurrency limit" in zed
    [amy] = [line for line in out.splitlines() if "'amy'" in line]
    assert " until " in amy
    code, out, _ = run("override", "list", path, "--format", "json")
    found = {o["value"]: o["status"] for o in json.loads(out)["overrides"]}
    assert found == {"amy": "in force", "zed": "not applied"}
