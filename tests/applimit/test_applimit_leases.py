"""Concurrency limits: at most N requests of one caller at once, each holding a lease.

A limit's ``concurrency`` adds a lease check to the same atomic call as its rates (all or
nothing); ``release`` gives the lease back; a lease whose process died runs out after the
limit's ``lease``. The limiter-level tests run on the standalone server, the cluster and
``memory://``, through Limiter and AsyncLimiter (conftest.make_limiter); the bound is then
checked across 4 processes x 8 threads on a real server, and a killed process's leases
are shown to free within the lease.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import edgegen_policy as policy
import pytest
import redis
from harness import RedisServer
from limiter_support import MakeLimiter, TestClock

from applimit import ConfigurationError, Limiter, rate_limited
from applimit._cli import main
from applimit._decision import Leased
from applimit.fastapi import RateLimit

POLICY = """
version: 1
tiers: [free, pro]
app: { timeout: 2s }
limits:
  - name: exports
    match: { path_prefix: /exports/ }
    app: { concurrency: { free: 1, pro: 2 }, lease: 30s }
  - name: api
    match: { path_prefix: / }
    app:
      per: ip
      algorithm: sliding_log
      tiers: { free: 3/1m, pro: 3/1m }
"""
IP = "192.0.2.10"


async def test_a_lease_is_held_until_released(make_limiter: MakeLimiter) -> None:
    """free may run one export at once: the second is refused (retry in a second, no
    rate consumed), the first's release lets the next in; peek takes no lease."""
    limiter = make_limiter(POLICY)
    first = await limiter.hit("exports", "ann")
    assert first.allowed and type(first) is Leased
    [result] = first.results
    assert (result.algorithm, result.quota, result.remaining) == ("lease", 1, 0)
    refused = await limiter.hit("exports", "ann")
    assert not refused.allowed and type(refused) is not Leased
    assert refused.retry_after == 1.0
    assert (await limiter.peek("exports", "ann")).remaining == 0
    # Another caller has leases of their own.
    other = await limiter.hit("exports", "bob")
    assert other.allowed
    await limiter.release(first)
    assert (await limiter.peek("exports", "ann")).remaining == 1
    again = await limiter.hit("exports", "ann")
    assert again.allowed
    # Releasing twice, or a decision without leases, changes nothing.
    await limiter.release(first)
    await limiter.release(refused)
    assert (await limiter.peek("exports", "ann")).remaining == 0
    await limiter.release(again)
    await limiter.release(other)


async def test_each_tier_has_its_own_number(make_limiter: MakeLimiter) -> None:
    """pro may run two at once; a third waits."""
    limiter = make_limiter(POLICY)
    held = [await limiter.hit("exports", "cy", tier="pro") for _ in range(2)]
    assert all(d.allowed for d in held)
    assert not (await limiter.hit("exports", "cy", tier="pro")).allowed
    for decision in held:
        await limiter.release(decision)
    assert (await limiter.hit("exports", "cy", tier="pro")).allowed


async def test_leases_and_rates_are_all_or_nothing(make_limiter: MakeLimiter) -> None:
    """A request refused by its rate takes no lease; one refused for want of a lease
    consumes no rate; check_request takes the leases of every limit that matches."""
    text = POLICY.replace(
        "tiers: { free: 3/1m, pro: 3/1m }", "tiers: { free: 3/1m, pro: 3/1m }\n      concurrency: 5"
    )
    limiter = make_limiter(text)
    first = await limiter.check_request("GET", "/exports/a", "dee", ip=IP)
    assert first.allowed
    assert sorted((r.name, r.algorithm) for r in first.results) == [
        ("api", "lease"),
        ("api", "sliding_log"),
        ("exports", "lease"),
    ]
    refused = await limiter.check_request("GET", "/exports/b", "dee", ip=IP)
    assert not refused.allowed
    assert [(r.name, r.algorithm) for r in refused.denied_by] == [("exports", "lease")]
    # The refusal consumed nothing of api's rate nor took its lease.
    api = {r.algorithm: r.remaining for r in (await limiter.peek("api", None, ip=IP)).results}
    assert api == {"sliding_log": 2, "lease": 4}
    await limiter.release(first)
    for _ in range(2):
        decision = await limiter.check_request("GET", "/other", None, ip=IP)
        assert decision.allowed
        await limiter.release(decision)
    # api's rate is spent: refused, and no lease of api or exports is taken.
    spent = await limiter.check_request("GET", "/exports/c", "dee", ip=IP)
    assert [(r.name, r.algorithm) for r in spent.denied_by] == [("api", "sliding_log")]
    assert (await limiter.peek("exports", "dee")).remaining == 1
    assert {r.algorithm: r.remaining for r in (await limiter.peek("api", None, ip=IP)).results}[
        "lease"
    ] == 5


async def test_reset_frees_every_lease(make_limiter: MakeLimiter) -> None:
    """reset() forgets a caller's leases too."""
    limiter = make_limiter(POLICY)
    assert (await limiter.hit("exports", "eve")).allowed
    assert not (await limiter.hit("exports", "eve")).allowed
    assert await limiter.reset("exports", "eve")
    assert (await limiter.hit("exports", "eve")).allowed


async def test_a_lease_runs_out_after_the_limits_lease(make_limiter: MakeLimiter) -> None:
    """Never released (its process died): the lease stops counting once the limit's
    lease has passed since it was taken, not before."""
    clock = TestClock()
    limiter = make_limiter(POLICY, test_clock=clock)
    assert (await limiter.hit("exports", "fay")).allowed
    clock.advance(30_000_000 - 1)
    assert not (await limiter.hit("exports", "fay")).allowed
    clock.advance(1)
    assert (await limiter.hit("exports", "fay")).allowed


def test_concurrency_needs_exact_mode_and_known_tiers() -> None:
    """Located errors for approximate mode and a tier the policy does not list."""
    approximate = POLICY.replace("lease: 30s }", "lease: 30s, mode: approximate }")
    with pytest.raises(policy.PolicyLoadError, match="concurrency needs mode: exact"):
        policy.loads(approximate, "p.yaml")
    unknown = POLICY.replace("{ free: 1, pro: 2 }", "{ free: 1, gold: 2 }")
    found = policy.lint(policy.loads(unknown, "p.yaml"))
    [unknown_tier] = [d for d in found if d.code == "L002"]
    assert unknown_tier.path == "limits[0].app.concurrency.gold"
    assert unknown_tier.file == "p.yaml" and unknown_tier.line == 8


def test_rate_limited_holds_the_lease_while_the_call_runs(redis_server: RedisServer) -> None:
    """A decorated function holds its caller's slot while it runs, and gives it back when
    it returns or raises."""
    with Limiter(policy.loads(POLICY), redis_url=redis_server.url) as limiter:
        inside: list[bool] = []

        @rate_limited(limiter, "exports", identity=lambda user: user)
        def export(user: str) -> None:
            inside.append(limiter.peek("exports", user).remaining == 0)
            if user == "gil":
                raise ValueError("the export failed")

        export("hal")
        with pytest.raises(ValueError, match="export failed"):
            export("gil")
        assert inside == [True, True]
        assert limiter.peek("exports", "hal").remaining == 1
        assert limiter.peek("exports", "gil").remaining == 1


# --- across processes ------------------------------------------------------------------

PROCESSES, THREADS, LIMIT = 4, 8, 3
WORKER_POLICY = f"""
version: 1
tiers: [free]
app: {{ timeout: 5s }}
limits:
  - name: jobs
    app: {{ concurrency: {LIMIT}, lease: 1m }}
"""
# The shared caller's contract: its own number at once, in place of the tier's.
OWN = 5
WITH_OVERRIDE = f"""{WORKER_POLICY}overrides:
  - {{ limit: jobs, user: shared, concurrency: {OWN}, expires: "2999-01-01", reason: contract }}
"""


def _worker(url: str, rounds: int, out: Any, text: str, limit: int) -> None:
    """One process of 8 threads: take a lease, say so in Redis (INCR), do a round trip
    of work, leave (DECR), give the lease back; report the most seen at once.

    Until ``limit`` handlers have been seen running together, an admitted handler holds
    its lease and watches the count: the limit being reached is then certain, not left
    to how the threads happen to interleave (a limiter that admits fewer than ``limit``
    at once never opens the gate, and the test fails at its deadline)."""
    client = redis.Redis.from_url(url)
    most = 0
    admitted = 0
    lock = threading.Lock()
    deadline = time.monotonic() + 60

    def gate(running: int) -> None:
        while not client.exists("jobs:reached") and time.monotonic() < deadline:
            if running >= limit:
                client.set("jobs:reached", 1)
            # Polling interval: the count is read again each round.
            time.sleep(0.001)
            running = int(client.get("jobs:running") or 0)

    with Limiter(policy.loads(text), redis_url=url) as limiter:

        def thread() -> None:
            nonlocal most, admitted
            done = 0
            while done < rounds and time.monotonic() < deadline:
                decision = limiter.hit("jobs", "shared")
                if not decision.allowed:
                    # Polling interval: a refused thread tries again (the bound is checked
                    # by what the admitted ones see, not by how often others try).
                    time.sleep(0.001)
                    continue
                try:
                    running = int(client.incr("jobs:running"))
                    gate(running)
                    client.ping()
                    with lock:
                        most = max(most, running, int(client.get("jobs:running") or 0))
                        admitted += 1
                    client.decr("jobs:running")
                    done += 1
                finally:
                    limiter.release(decision)

        with ThreadPoolExecutor(THREADS) as pool:
            for future in [pool.submit(thread) for _ in range(THREADS)]:
                future.result()
    out.put((most, admitted))


@pytest.mark.parametrize(
    ("text", "limit"), [(WORKER_POLICY, LIMIT), (WITH_OVERRIDE, OWN)], ids=["tier", "override"]
)
def test_no_more_than_the_limit_run_at_once_across_processes(
    redis_server: RedisServer, redis_client: redis.Redis, text: str, limit: int
) -> None:
    """4 processes x 8 threads share a limit of 3 at once (or the caller's override of
    5): the handlers, counting themselves in Redis, never see more than that running;
    the limit is reached, and every thread's rounds are admitted in the end."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    rounds = 20
    processes = [
        context.Process(target=_worker, args=(redis_server.url, rounds, out, text, limit))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        results = [out.get(timeout=120) for _ in processes]
        for process in processes:
            process.join(30)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
    assert redis_client.exists("jobs:reached"), "the limit was never reached"
    assert max(most for most, _ in results) == limit
    assert sum(admitted for _, admitted in results) == PROCESSES * THREADS * rounds
    assert int(redis_client.get("jobs:running") or 0) == 0


def _holder(url: str, ready: Any) -> None:
    """Take every lease, say so, then wait to be killed."""
    with Limiter(policy.loads(WORKER_POLICY.replace("1m", "2s")), redis_url=url) as limiter:
        held = [limiter.hit("jobs", "shared") for _ in range(LIMIT)]
        assert all(d.allowed for d in held)
        ready.set()
        threading.Event().wait()


def test_the_leases_of_a_killed_process_free_within_the_lease(redis_server: RedisServer) -> None:
    """A process that holds every lease is killed (SIGKILL: nothing is released); others
    are refused until the 2 s lease has run out, and admitted within it plus a margin."""
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    holder = context.Process(target=_holder, args=(redis_server.url, ready))
    holder.start()
    assert ready.wait(60)
    taken = time.monotonic()
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(30)
    with Limiter(
        policy.loads(WORKER_POLICY.replace("1m", "2s")), redis_url=redis_server.url
    ) as limiter:
        assert not limiter.hit("jobs", "shared").allowed
        deadline = taken + 2.0 + 3.0
        while True:
            decision = limiter.hit("jobs", "shared")
            if decision.allowed:
                break
            assert time.monotonic() < deadline, "the dead process's leases never ran out"
            # Polling interval: the lease's end is re-checked every round.
            time.sleep(0.05)
        assert time.monotonic() - taken >= 1.9


def test_the_fastapi_dependency_refuses_a_concurrency_limit() -> None:
    """A dependency never sees the response end, so it could not give the slot back:
    refused when built, with what to use instead."""
    with Limiter(policy.loads(POLICY), redis_url="memory://leases-dependency") as limiter:
        with pytest.raises(ConfigurationError, match=r"'exports'.*concurrency"):
            RateLimit(limiter, "exports")
        with pytest.raises(ConfigurationError, match="RateLimitMiddleware"):
            RateLimit(limiter)
        assert RateLimit(limiter, "api").name == "api"


def test_usage_shows_the_slots_in_use(redis_server: RedisServer, tmp_path: Any) -> None:
    """applimit usage: running and free slots per tier, beside the rates."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.replace("timeout: 2s", f'timeout: 2s, redis_url: "{redis_server.url}"'))
    with Limiter.from_policy(path) as limiter:
        held = limiter.hit("exports", "ivy", tier="pro")
        out = io.StringIO()
        code = main(
            ["usage", str(path), "--user", "ivy", "--format", "json"],
            stdin=io.StringIO(),
            stdout=out,
            stderr=io.StringIO(),
        )
        assert code == 0
        [exports] = [x for x in json.loads(out.getvalue())["limits"] if x["name"] == "exports"]
        assert [(t["tier"], t["concurrency"], t["rates"]) for t in exports["tiers"]] == [
            ("free", {"limit": 1, "running": 1, "free": 0, "tier": "free"}, []),
            ("pro", {"limit": 2, "running": 1, "free": 1, "tier": "pro"}, []),
        ]
        limiter.release(held)


def test_usage_names_no_algorithm_for_a_concurrency_limit_alone(
    redis_server: RedisServer, tmp_path: Any
) -> None:
    """A limit with no rate, only concurrency: no algorithm counts for it, so usage names
    none (null in JSON, left out of the text), while a limit with rates names its own."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.replace("timeout: 2s", f'timeout: 2s, redis_url: "{redis_server.url}"'))

    def usage(user: str, *argv: str) -> str:
        out = io.StringIO()
        code = main(
            ["usage", str(path), "--user", user, "--ip", IP, *argv],
            stdin=io.StringIO(),
            stdout=out,
            stderr=io.StringIO(),
        )
        assert code == 0
        return out.getvalue()

    def heads(user: str) -> list[str]:
        return [line for line in usage(user).splitlines() if not line.startswith(" ")]

    limits = {x["name"]: x for x in json.loads(usage("ivy", "--format", "json"))["limits"]}
    assert limits["exports"]["algorithm"] is None
    assert limits["api"]["algorithm"] == "sliding_log"
    assert "exports (per user): counted by user 'ivy'" in heads("ivy")
    assert f"api (sliding_log, per ip): counted by ip '{IP}'" in heads("ivy")
