"""A pytest plugin for apps that use applimit: limits in tests, without a Redis server.

Installed with applimit and loaded by pytest on its own (entry point ``pytest11``). It
gives:

- ``applimit_clock``: the clock of every ``memory://`` store while the test runs, at a
  fixed start; ``applimit_clock.advance(60)`` moves it a minute on, without sleeping;
- ``applimit_limiter`` / ``applimit_async_limiter``: a ``Limiter`` / ``AsyncLimiter`` for
  the policy of the ``applimit_policy`` ini option (or of your own ``applimit_policy``
  fixture), on ``memory://``, on that clock, closed after the test;
- a reset before every test: every ``memory://`` store is cleared, with what the
  limiters on it cache locally, so no count leaks from one test into the next. That
  includes a limiter your app builds itself on ``memory://`` (say from an environment
  variable that the test settings point at ``memory://``).

A test an app would write (``applimit_policy = policy.yaml`` in its pytest ini)::

    def test_login_is_limited(applimit_limiter, applimit_clock):
        for _ in range(5):
            assert applimit_limiter.hit("login", None, ip="192.0.2.1").allowed
        assert not applimit_limiter.hit("login", None, ip="192.0.2.1").allowed
        applimit_clock.advance(60)
        assert applimit_limiter.hit("login", None, ip="192.0.2.1").allowed

The memory backend runs the limiter's own algorithms in this process (docs/applimit.md,
"Testing"): the same decisions as Redis for the same clock, for one process only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from edgegen_policy import Policy

    from ._async import AsyncLimiter
    from ._sync import Limiter

# Where the plugin's clock starts: a fixed time, so tests that print times are stable.
CLOCK_START = 1_700_000_000.0
_INI = "applimit_policy"


class Clock:
    """A clock the test moves by hand: seconds, held as integer microseconds so that
    advancing by a window lands on it exactly."""

    def __init__(self, start: float = CLOCK_START) -> None:
        """Start at ``start`` seconds."""
        self.us = round(start * 1_000_000)

    def __call__(self) -> float:
        """The time in seconds (as ``time.time()`` gives it)."""
        return self.us / 1_000_000

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on (a negative value moves it back)."""
        self.us += round(seconds * 1_000_000)

    def set(self, seconds: float) -> None:
        """Put the clock at ``seconds``."""
        self.us = round(seconds * 1_000_000)


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ini option naming the policy of ``applimit_limiter``."""
    parser.addini(
        _INI,
        "the policy file of the applimit_limiter fixture (relative to the ini file)",
        default="",
    )


@pytest.fixture(autouse=True)
def _applimit_reset() -> Iterator[None]:
    """Clear every memory:// store before each test (only if applimit is in use)."""
    memory = sys.modules.get("applimit._memory")
    if memory is not None:
        memory.clear_all()
    yield


@pytest.fixture
def applimit_clock() -> Iterator[Clock]:
    """The clock of every memory:// store during the test; move it with ``advance()``."""
    from . import _memory

    clock = Clock()
    with _memory.use_clock(clock):
        yield clock


@pytest.fixture
def applimit_policy(pytestconfig: pytest.Config) -> str | os.PathLike[str] | Policy:
    """The policy of ``applimit_limiter``: the ``applimit_policy`` ini option. Override
    this fixture to return a path or a loaded ``policy.Policy`` instead."""
    value = str(pytestconfig.getini(_INI))
    if not value:
        raise pytest.UsageError(
            "the applimit_limiter fixture needs a policy: set `applimit_policy = "
            "path/to/policy.yaml` in the [pytest] section of your ini file (or "
            "[tool.pytest.ini_options] in pyproject.toml), or define a fixture "
            "`applimit_policy` that returns a path or a loaded policy."
        )
    base = pytestconfig.inipath.parent if pytestconfig.inipath else pytestconfig.rootpath
    return Path(base, value)


@pytest.fixture
def applimit_limiter(
    applimit_policy: str | os.PathLike[str] | Policy, applimit_clock: Clock
) -> Iterator[Limiter]:
    """A ``Limiter`` for the policy on ``memory://``, on ``applimit_clock``."""
    from ._sync import Limiter

    with Limiter.from_policy(applimit_policy, redis_url="memory://") as limiter:
        yield limiter


@pytest.fixture
async def applimit_async_limiter(
    applimit_policy: str | os.PathLike[str] | Policy, applimit_clock: Clock
) -> AsyncIterator[AsyncLimiter]:
    """An ``AsyncLimiter`` for the policy on ``memory://``, on ``applimit_clock``
    (needs an async test runner such as pytest-asyncio or anyio)."""
    from ._async import AsyncLimiter

    async with AsyncLimiter.from_policy(applimit_policy, redis_url="memory://") as limiter:
        yield limiter
