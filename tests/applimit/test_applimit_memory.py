"""The memory:// backend, enabled=False, the URL schemes and the pytest plugin.

The memory backend's decisions are held to Redis' by the contract and property suites
(``backend`` and ``url`` fixtures); these tests cover what is its own: choosing it, its
stores and clock, a disabled limiter, and the plugin an app's tests use.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import tomllib
from pathlib import Path

import edgegen_policy as policy
import pytest

from applimit import AsyncLimiter, ConfigurationError, Limiter, UnknownLimitError, _memory

POLICY = """
version: 1
app: {key_prefix: m, timeout: 2s, redis_url: "redis://127.0.0.1:1/0"}
limits:
  - name: login
    match: {paths: [/login]}
    app: {per: ip, algorithm: sliding_log, tiers: {default: 2/1m}}
  - name: api
    app: {algorithm: gcra, tiers: {default: 3/1m}}
"""
IP = "192.0.2.7"
ROOT = Path(__file__).resolve().parents[2]


def test_memory_url_decides_in_the_process_without_redis() -> None:
    """redis_url="memory://" decides with the limiter's algorithms and no server (the
    policy's own URL points at a closed port): counts, denial, retry time."""
    with Limiter(policy.loads(POLICY), redis_url="memory://t1") as limiter:
        assert [limiter.hit("login", None, ip=IP).remaining for _ in range(2)] == [1, 0]
        denied = limiter.hit("login", None, ip=IP)
        assert not denied.allowed and not denied.degraded
        assert denied.retry_after is not None and 59 < denied.retry_after <= 60


async def test_limiters_on_one_memory_url_share_counts_and_other_names_do_not() -> None:
    """Like two limiters on one Redis: the same URL shares counts (sync and async alike);
    another name is another store."""
    loaded = policy.loads(POLICY)
    with Limiter(loaded, redis_url="memory://shared") as one:
        async with AsyncLimiter(loaded, redis_url="memory://shared") as two:
            assert one.hit("api", "ann").remaining == 2
            assert (await two.hit("api", "ann")).remaining == 1
            with Limiter(loaded, redis_url="memory://other") as three:
                assert three.hit("api", "ann").remaining == 2


def test_the_memory_clock_moves_decisions_and_the_denial_cache() -> None:
    """The stores' clock is what tests move: a denial (cached locally by the limiter)
    ends when the clock passes its retry time, without sleeping."""
    now = [1_000.0]
    with (
        _memory.use_clock(lambda: now[0]),
        Limiter(policy.loads(POLICY), redis_url="memory://clock") as limiter,
    ):
        for _ in range(2):
            assert limiter.hit("login", None, ip=IP).allowed
        assert not limiter.hit("login", None, ip=IP).allowed
        now[0] += 59.999
        assert not limiter.hit("login", None, ip=IP).allowed
        now[0] += 0.001
        assert limiter.hit("login", None, ip=IP).allowed


def test_clearing_the_stores_also_clears_local_denials() -> None:
    """clear_all() (the plugin's reset between tests) forgets the counts and the denials
    the limiters on the stores cached, so nothing leaks into the next test."""
    with Limiter(policy.loads(POLICY), redis_url="memory://reset") as limiter:
        for _ in range(3):
            limiter.hit("login", None, ip=IP)
        assert not limiter.hit("login", None, ip=IP).allowed
        _memory.clear_all()
        assert limiter.hit("login", None, ip=IP).remaining == 1


def test_threads_sharing_a_memory_limiter_admit_exactly_the_limit() -> None:
    """8 threads x 40 hits on one identity of 100/1m (a frozen clock, so GCRA does not
    refill): exactly 100 admitted, as on Redis: a call is atomic under the store's lock."""
    text = POLICY.replace("3/1m", "100/1m")
    admitted = [0] * 8
    with Limiter(
        policy.loads(text), redis_url="memory://threads", test_clock=lambda: 5_000.0
    ) as limiter:
        start = threading.Barrier(8)

        def run(index: int) -> None:
            start.wait()
            for _ in range(40):
                admitted[index] += limiter.hit("api", "same").allowed

        workers = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert sum(admitted) == 100


@pytest.mark.parametrize("flavour", [Limiter, AsyncLimiter])
def test_unknown_schemes_name_every_supported_one(flavour: type[Limiter]) -> None:
    """A URL of another scheme is refused with the list of those the limiter takes,
    redis+sentinel:// and memory:// included, never redis-py's own message."""
    for url in ("mem://", "localhost:6379", "http://host:6379/0"):
        with pytest.raises(ConfigurationError) as info:
            flavour.from_policy(policy.loads(POLICY), redis_url=url)
        message = str(info.value)
        for scheme in ("redis://", "rediss://", "unix://", "redis+sentinel://", "memory://"):
            assert scheme in message, (url, message)


def test_bad_memory_urls_are_refused() -> None:
    """memory:// takes a plain name, and is one store: cluster=True makes no sense."""
    with pytest.raises(ConfigurationError, match="memory:// or memory://name"):
        Limiter(policy.loads(POLICY), redis_url="memory://a/b")
    with pytest.raises(ConfigurationError, match="leave cluster out"):
        Limiter(policy.loads(POLICY), redis_url="memory://", cluster=True)


async def test_a_disabled_limiter_allows_everything_and_touches_no_redis() -> None:
    """enabled=False: every decision allowed with no results, never degraded (the
    policy's Redis is a closed port), no request matches, resets succeed, names are still
    checked."""
    loaded = policy.loads(POLICY)
    with Limiter(loaded, enabled=False) as limiter:
        for _ in range(5):
            decision = limiter.hit("login", None, ip=IP)
            assert decision.allowed and not decision.degraded and decision.results == ()
        assert limiter.check_request("GET", "/login", "u", ip=IP).allowed
        # Nothing matches, so the middleware never runs the app's identify.
        assert not limiter.matches("GET", "/login")
        assert limiter.reset("api", "u")
        with pytest.raises(UnknownLimitError):
            limiter.hit("nope", "u")
    async with AsyncLimiter(loaded, enabled=False) as alimiter:
        decision = await alimiter.hit("api", "u", cost=3)
        assert decision.allowed and decision.results == ()
        assert await alimiter.reset("api", "u")


def test_the_pytest_plugin_gives_a_limiter_a_clock_and_a_reset(tmp_path: Path) -> None:
    """An app's test suite: the policy named in its ini, the limiter fixtures (sync and
    async) on memory://, the clock moved by hand, and counts that do not leak from one
    test to the next (the third test starts from a full quota although the first two used
    it up)."""
    (tmp_path / "policy.yaml").write_text(POLICY, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\napplimit_policy = policy.yaml\nasyncio_mode = auto\n", encoding="utf-8"
    )
    (tmp_path / "test_app.py").write_text(
        textwrap.dedent(
            """
            from applimit import Limiter

            IP = "192.0.2.1"
            APP = Limiter.from_policy("policy.yaml", redis_url="memory://")

            def test_login_is_limited(applimit_limiter, applimit_clock):
                for _ in range(2):
                    assert applimit_limiter.hit("login", None, ip=IP).allowed
                denied = applimit_limiter.hit("login", None, ip=IP)
                assert not denied.allowed and denied.retry_after == 60.0
                applimit_clock.advance(60)
                assert applimit_limiter.hit("login", None, ip=IP).allowed

            def test_the_apps_own_limiter_uses_the_clock(applimit_clock):
                for _ in range(2):
                    assert APP.hit("login", None, ip=IP).allowed
                assert not APP.hit("login", None, ip=IP).allowed
                applimit_clock.advance(60)
                assert APP.hit("login", None, ip=IP).allowed

            def test_the_next_test_starts_afresh(applimit_limiter):
                # Both on memory://: one store, so one count.
                assert APP.hit("login", None, ip=IP).remaining == 1
                assert applimit_limiter.peek("login", None, ip=IP).remaining == 1

            async def test_the_async_limiter(applimit_async_limiter, applimit_clock):
                assert (await applimit_async_limiter.hit("api", "ann", cost=3)).allowed
                assert not (await applimit_async_limiter.hit("api", "ann")).allowed
                applimit_clock.advance(20)
                assert (await applimit_async_limiter.hit("api", "ann")).allowed
            """
        ),
        encoding="utf-8",
    )
    # The plugin named, and no other loaded: the same whether or not this checkout's
    # install (and its entry point) is current; the entry point is checked below.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "applimit.pytest_plugin",
            "-p",
            "pytest_asyncio.plugin",
        ],
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout


def test_pytest_finds_the_plugin_through_its_entry_point() -> None:
    """pyproject.toml registers the plugin with pytest (entry point group pytest11), so an
    app that installs applimit gets the fixtures without configuring anything."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        project = tomllib.load(file)["project"]
    assert project["entry-points"]["pytest11"] == {"applimit": "applimit.pytest_plugin"}
