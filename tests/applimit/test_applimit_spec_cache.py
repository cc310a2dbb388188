"""A check's spec: one script argument, parsed once per library load (common.lua's
``spec_of``), strict on both backends, and a cache that stays bounded.

Each check of a call is one string, "<algorithm> <limit> <period µs> <cost> <burst>
<shadow>". The Functions library keeps what it parsed until it is reloaded, so a spec that
does not match exactly must be refused rather than read loosely, the same way by EVAL, by
FCALL and by the memory backend; and a caller that sends many costs must not grow the
server's Lua memory without end.
"""

from __future__ import annotations

import pytest
import redis

from applimit import _script
from applimit._calls import ScriptCall
from applimit._memory import MemoryStore

US = 1_000_000
KEY = "spec:{u}:k"


def _server_reply(
    client: redis.Redis, how: str, keys: tuple[str, ...], args: tuple[str, ...]
) -> object:
    try:
        if how == "eval":
            return client.eval(_script.SOURCE, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
        return client.fcall(_script.FUNCTION, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
    except redis.ResponseError as error:
        return error


@pytest.fixture
def loaded(redis_client: redis.Redis) -> redis.Redis:
    redis_client.function_load(_script.LIBRARY, replace=True)
    return redis_client


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "malformed check "),
        ("gcra 10 1000000 1 10", "malformed check gcra 10 1000000 1 10"),
        ("gcra 10 1000000 1 10 4", "malformed check gcra 10 1000000 1 10 4"),
        ("gcra 10 1000000 1 10 0 ", "malformed check gcra 10 1000000 1 10 0"),
        ("gcra  10 1000000 1 10 0", "malformed check gcra  10 1000000 1 10 0"),
        ("gcra -1 1000000 1 10 0", "malformed check gcra -1 1000000 1 10 0"),
        ("gcra 1e3 1000000 1 10 0", "malformed check gcra 1e3 1000000 1 10 0"),
        ("gcra 0x10 1000000 1 10 0", "malformed check gcra 0x10 1000000 1 10 0"),
        ("GCRA 10 1000000 1 10 0", "malformed check GCRA 10 1000000 1 10 0"),
        # Non-ASCII digits: Python's \d would take them, Lua's %d does not.
        ("gcra \u0661\u0660 1000000 1 10 0", "malformed check gcra \u0661\u0660 1000000 1 10 0"),
        # A line break: Lua's $ is the end of the string, not of a line.
        ("gcra 10 1000000 1 10 0\n", "malformed check gcra 10 1000000 1 10 0"),
        ("token_bucket 10 1000000 1 10 0", "unknown algorithm token_bucket"),
    ],
)
@pytest.mark.parametrize("how", ["eval", "fcall"])
def test_a_spec_that_does_not_match_exactly_is_refused_alike_and_writes_nothing(
    loaded: redis.Redis, how: str, spec: str, message: str
) -> None:
    """The malformed spec comes second, after a valid one: the call is refused as a whole
    (no key written) with the same message from Redis and from the memory backend, up to
    trailing white space (Redis drops a line break at the end of an error reply)."""
    keys = (KEY + "1", KEY + "2")
    args = ("hit", "", "abcdef012345", "0", "2", f"gcra 10 {60 * US} 1 10 0", spec)
    server = _server_reply(loaded, how, keys, args)
    memory = MemoryStore().execute(ScriptCall(keys, args))
    assert isinstance(server, redis.ResponseError), server
    assert isinstance(memory, redis.ResponseError), memory
    assert str(server).rstrip() == f"applimit: {message}".rstrip()
    assert str(memory).rstrip() == str(server).rstrip()
    assert loaded.exists(*keys) == 0


def test_a_refused_spec_is_not_remembered(loaded: redis.Redis) -> None:
    """The library keeps only specs it parsed: the same bad spec is refused every time,
    and a good one after it is read as itself."""
    bad = ("peek", "", "", "0", "1", "sliding_log 10 nope 1 0 0")
    for _ in range(3):
        assert isinstance(_server_reply(loaded, "fcall", (KEY,), bad), redis.ResponseError)
    good = ("peek", "", "", "0", "1", f"sliding_log 10 {60 * US} 1 0 0")
    reply = _server_reply(loaded, "fcall", (KEY,), good)
    assert isinstance(reply, list)
    assert reply[1:] == [1, 1, 0, 10, 0, -1]


def test_the_spec_cache_stays_bounded_and_still_answers_right(loaded: redis.Redis) -> None:
    """20,000 distinct specs (one cost each, as a caller with many costs sends them) grow
    the library's Lua memory by well under what keeping every one would (about 12 MB on
    Redis 7.0: some 600 bytes a spec); the first spec, parsed again after the cache was
    emptied, gives the reply it gave before, and the replies agree with the memory
    backend's."""

    def vm_bytes() -> int:
        return int(loaded.info("memory")["used_memory_vm_functions"])

    def peek(cost: int) -> tuple[str, ...]:
        # A fixed time, so that every reply can be compared whole.
        return (
            "peek",
            str(1_000 * 60 * US),
            "",
            "0",
            "1",
            f"gcra 1000000 {60 * US} {cost} 1000000 0",
        )

    first = _server_reply(loaded, "fcall", (KEY,), peek(1))
    before = vm_bytes()
    pipe = loaded.pipeline(transaction=False)
    for cost in range(2, 20_002):
        pipe.fcall(_script.FUNCTION, 1, KEY, *peek(cost))  # type: ignore[no-untyped-call]
    replies = pipe.execute()
    grown = vm_bytes() - before
    assert grown < 2_000_000, f"the spec cache grew Lua memory by {grown} bytes"
    assert _server_reply(loaded, "fcall", (KEY,), peek(1)) == first
    store = MemoryStore()
    for cost in (2, 1_025, 1_026, 20_001):
        assert replies[cost - 2] == store.execute(ScriptCall((KEY,), peek(cost)))
