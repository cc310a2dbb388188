"""A ``redis_url=`` given to a limiter is checked like the policy's ``app.redis_url``, and
no message about a URL shows its password.

``Limiter.from_policy(path, redis_url=...)`` (and the constructors) used to take the URL
as given, so a URL the policy would refuse reached redis-py, and the limiter's own
messages (a Sentinel URL it cannot read, a database on Redis Cluster) quoted it whole.
"""

from __future__ import annotations

from typing import Any

import edgegen_policy as policy
import pytest
from harness import RedisServer

from applimit import AsyncLimiter, ConfigurationError, Limiter
from applimit._clients import shown_url

PASSWORD = "hunter2-Sekr1t"
POLICY = """
version: 1
app: {key_prefix: url, timeout: 2s}
limits:
  - name: api
    app: {algorithm: gcra, tiers: {default: 10/1m}}
"""

# (URL, what the message says): the policy's own checks, and the limiter's.
BAD = [
    (f"redis://:{PASSWORD}@host:notaport/0", "port 'notaport' is not a number"),
    (f"redis://user:{PASSWORD}@host:99999/0", "port 99999 is not between 1 and 65535"),
    (f"rediss://:{PASSWORD}@host:6379/abc", "database 'abc' is not a number"),
    (f"redis://:{PASSWORD}@host?db=x", "query argument db='x' is not a whole number"),
    (f"redis://host?password={PASSWORD}&db=x", "query argument db='x'"),
    (f"redis+sentinel://:{PASSWORD}@s1:26379", "names no service"),
    (f"redis+sentinel://:{PASSWORD}@s1:26379/m?db=1", "takes no query"),
    (f"ftp://:{PASSWORD}@host/0", "scheme 'ftp://', which the limiter does not support"),
    (f"redis://:{PASSWORD}/x@host:6379/0", "redis://:***@host:6379/0"),
]


def _chain(error: BaseException) -> str:
    """Everything an error carries that a log or a traceback could show."""
    seen = []
    current: BaseException | None = error
    while current is not None:
        seen.append(f"{current!s} {current!r} {current.args!r}")
        current = current.__cause__ or current.__context__
    return "\n".join(seen)


@pytest.mark.parametrize("flavour", [Limiter, AsyncLimiter])
@pytest.mark.parametrize(("url", "says"), BAD, ids=range(len(BAD)))
def test_a_bad_redis_url_option_is_refused_without_its_password(
    url: str, says: str, flavour: Any
) -> None:
    """from_policy and the constructor refuse the URL the policy would refuse, with the
    policy's reason and the password as ***, nowhere in the error or what it chains."""
    loaded = policy.loads(POLICY)
    for build in (flavour.from_policy, flavour):
        with pytest.raises(ConfigurationError) as info:
            build(loaded, redis_url=url)
        message = str(info.value)
        assert message.startswith("redis_url= ")
        assert says in message
        assert PASSWORD not in _chain(info.value)
        if "@" in url:
            assert "***" in message


@pytest.mark.parametrize("flavour", [Limiter, AsyncLimiter])
def test_the_limiters_own_url_messages_hide_the_password(flavour: Any) -> None:
    """A URL the policy accepts but the limiter cannot use (a database on Redis Cluster)
    is refused showing the password as ***."""
    url = f"redis://:{PASSWORD}@127.0.0.1:7000/3"
    with pytest.raises(ConfigurationError, match="only database 0") as info:
        flavour(policy.loads(POLICY), redis_url=url, cluster=True)
    assert "redis://:***@127.0.0.1:7000/3" in str(info.value)
    assert PASSWORD not in _chain(info.value)


def test_a_redis_url_that_is_not_text_is_refused() -> None:
    """redis_url must be a str."""
    with pytest.raises(ConfigurationError, match="must be a str"):
        Limiter.from_policy(policy.loads(POLICY), redis_url=6379)


async def test_a_good_redis_url_option_is_used(redis_server: RedisServer) -> None:
    """An override that passes the checks is the one the limiters connect to."""
    loaded = policy.loads(POLICY)
    with Limiter.from_policy(loaded, redis_url=redis_server.url) as limiter:
        assert not limiter.peek("api", "url-user").degraded
    async with AsyncLimiter.from_policy(loaded, redis_url=redis_server.url) as async_limiter:
        assert not (await async_limiter.peek("api", "url-user")).degraded


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{PASSWORD}@host:6379/0", "redis://:***@host:6379/0"),
        (f"rediss://user:{PASSWORD}@host", "rediss://user:***@host"),
        (f"redis://{PASSWORD}@host", "redis://***@host"),
        (f"redis://:{PASSWORD}/x@host:6379/0", "redis://:***@host:6379/0"),
        (f"redis://host?password={PASSWORD}&db=1", "redis://host?password=***&db=1"),
        (f"redis+sentinel://:{PASSWORD}@s1,s2/m", "redis+sentinel://:***@s1,s2/m"),
        ("redis://host:6379/0", "redis://host:6379/0"),
    ],
)
def test_urls_are_shown_with_the_password_hidden(url: str, shown: str) -> None:
    """shown_url hides what the policy's messages hide: the password, in the user
    information or a query argument."""
    assert shown_url(url) == shown
