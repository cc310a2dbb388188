"""rate_limited: a policy limit on plain functions, sync and async, on a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness import RedisServer

from applimit import AsyncLimiter, Limiter, RateLimited, rate_limited

POLICY = """
version: 1
tiers: [free, pro]
app: { timeout: 2s }  # generous: these tests are about semantics, not latency
limits:
  - name: export
    app: { algorithm: sliding_log, tiers: { free: 2/1h, pro: 4/1h } }
  - name: webhook
    app: { per: ip, algorithm: sliding_log, tiers: { free: 1/1h, pro: 1/1h } }
"""


@dataclass(frozen=True)
class User:
    """A caller as an app would model it."""

    id: str
    plan: str


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    """Two limits without matchers: they apply wherever they are named."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


@pytest.fixture
def limiter(policy_path: Path, redis_server: RedisServer, redis_client: Any) -> Iterator[Limiter]:
    """A Limiter on the shared (flushed) Redis."""
    with Limiter.from_policy(policy_path, redis_url=redis_server.url) as limiter:
        yield limiter


@pytest.fixture
async def async_limiter(
    policy_path: Path, redis_server: RedisServer, redis_client: Any
) -> AsyncIterator[AsyncLimiter]:
    """An AsyncLimiter on the shared (flushed) Redis."""
    async with AsyncLimiter.from_policy(policy_path, redis_url=redis_server.url) as limiter:
        yield limiter


def test_sync_function_is_refused_over_the_limit_without_running(limiter: Limiter) -> None:
    """Identity and tier come from the call's arguments; the third free call raises
    RateLimited and the body does not run; another user has their own quota."""
    ran: list[str] = []

    @rate_limited(
        limiter,
        "export",
        identity=lambda user, name: user.id,
        tier=lambda user, name: user.plan,
    )
    def export(user: User, name: str) -> str:
        """Export something."""
        ran.append(name)
        return f"{user.id}:{name}"

    alice = User("alice", "free")
    assert export(alice, "a") == "alice:a"
    assert export(alice, name="b") == "alice:b"
    with pytest.raises(RateLimited) as refused:
        export(alice, "c")
    assert ran == ["a", "b"]
    assert refused.value.name == "export"
    assert refused.value.retry_after >= 3599
    assert not refused.value.decision.allowed
    assert "retry in" in str(refused.value)
    assert export(User("bob", "pro"), "d") == "bob:d"
    assert export.__name__ == "export" and export.__doc__ == "Export something."


def test_fixed_tier_and_callable_cost(limiter: Limiter) -> None:
    """A fixed tier string and a cost computed from the arguments."""

    @rate_limited(limiter, "export", identity=lambda n: "carol", tier="pro", cost=lambda n: n)
    def batch(n: int) -> int:
        return n

    assert batch(3) == 3
    with pytest.raises(RateLimited):
        batch(2)
    assert batch(1) == 1


def test_per_ip_limits_count_the_address_ip_returns(limiter: Limiter) -> None:
    """A per: ip limit counts what ip= returns, whatever the identity says; without ip=
    it is refused at decoration time, so a user-chosen name is never counted as an address."""

    @rate_limited(limiter, "webhook", identity=lambda ip, user: user, ip=lambda ip, user: ip)
    def receive(ip: str, user: str) -> None:
        return None

    receive("192.0.2.1", "alice")
    receive("192.0.2.2", "alice")
    with pytest.raises(RateLimited):
        receive("192.0.2.1", "bob")
    # A user who names themself after an address spends no quota of that address.
    receive("192.0.2.3", "192.0.2.4")
    receive("192.0.2.4", "carol")
    with pytest.raises(ValueError, match="counts per client IP; give ip="):
        rate_limited(limiter, "webhook", identity=lambda ip: ip)


async def test_async_function_with_an_async_limiter(async_limiter: AsyncLimiter) -> None:
    """The async form awaits the limiter and then the function."""

    @rate_limited(async_limiter, "export", identity=lambda user: user.id, tier="free")
    async def export(user: User) -> str:
        return user.id

    alice = User("alice", "free")
    assert await export(alice) == "alice"
    assert await export(alice) == "alice"
    with pytest.raises(RateLimited):
        await export(alice)


async def test_mismatched_limiter_and_function_and_unknown_names(
    limiter: Limiter, async_limiter: AsyncLimiter
) -> None:
    """A blocking limiter on a coroutine, an async limiter on a plain function and a limit
    the policy does not define fail at decoration time, with the fix in the message."""

    async def coroutine() -> None:
        return None

    def plain() -> None:
        return None

    with pytest.raises(TypeError, match="use an AsyncLimiter"):
        rate_limited(limiter, "export", identity=lambda: "x")(coroutine)
    with pytest.raises(TypeError, match="use a Limiter"):
        rate_limited(async_limiter, "export", identity=lambda: "x")(plain)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no app limit named 'exports'"):
        rate_limited(limiter, "exports", identity=lambda: "x")


def test_redis_down_follows_the_failure_policy(policy_path: Path) -> None:
    """With nothing listening, the default policy fails open: the function runs."""
    with Limiter.from_policy(policy_path, redis_url="redis://127.0.0.1:1/0") as limiter:

        @rate_limited(limiter, "export", identity=lambda: "alice")
        def export() -> str:
            return "done"

        assert export() == "done"
