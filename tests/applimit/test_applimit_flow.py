"""The decision machine (applimit/_flow.py) and the wire protocol (applimit/_protocol.py),
driven by hand: both do no I/O, so whoever runs their calls can drive them.

Here the calls a decision asks for are run with a plain redis-py client of the harness's
real server (or cluster), never the limiter's own wire, through ``drive``: the loop the
blocking limiter runs, so the decisions come out exactly as the limiters'. The protocol's
recovery is fed the error replies redis-py's parser makes of what servers say.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import edgegen_policy as policy
import pytest
import redis
from harness import RedisCluster
from limiter_support import TestClock
from redis._parsers.base import BaseParser

from applimit import ApplimitError, AsyncLimiter, BreakerState, Decision, Limiter, _script
from applimit._breaker import CircuitBreaker
from applimit._calls import EVAL, EVALSHA, FCALL, LOAD, ScriptCall
from applimit._errors import DeadlinePassed
from applimit._flow import Send, Wait, drive
from applimit._protocol import ScriptProtocol, Step, redirection

POLICY = """
version: 1
app: {key_prefix: fl, timeout: 2s, on_redis_error: deny}
limits:
  - name: log
    match: {path_prefix: /log/}
    app: {algorithm: sliding_log, tiers: {default: 2/1m}}
  - name: events
    match: {path_prefix: /events/}
    app: {algorithm: gcra, mode: approximate, sync_every: 5, sync_interval: 1m,
          tiers: {default: 100/1m}}
  - name: per-ip
    match: {path_prefix: /both/}
    app: {per: ip, algorithm: gcra, tiers: {default: 100/1m}}
  - name: per-user
    match: {path_prefix: /both/}
    app: {algorithm: gcra, tiers: {default: 1/1m}}
"""
# Nothing listens here: a limiter pointed at it shows that driving its flows by hand
# never uses its own wire.
NOWHERE = "redis://127.0.0.1:1/0"


def _run(client: Any, calls: Sequence[ScriptCall]) -> list[object]:
    """The outcomes of ``calls``, run with EVAL on a plain redis-py client."""
    outcomes: list[object] = []
    for call in calls:
        try:
            outcomes.append(client.eval(_script.SOURCE, len(call.keys), *call.keys, *call.args))
        except redis.exceptions.RedisError as error:
            outcomes.append(error)
    return outcomes


def _drive(
    limiter: Limiter, prepared: Any, answer: Any
) -> tuple[Decision, list[tuple[ScriptCall, ...]]]:
    """Run the decision for ``prepared`` through ``drive``, answering each Send's calls with
    ``answer(calls)``: the decision, and the calls of each Send in order."""
    sends: list[tuple[ScriptCall, ...]] = []

    def run(calls: tuple[ScriptCall, ...]) -> list[object]:
        sends.append(calls)
        outcomes: list[object] = answer(calls)
        return outcomes

    def wait(step: Wait) -> list[object]:
        raise AssertionError(f"no decision here waits: {step!r}")

    return drive(limiter.decider, prepared, run, wait), sends


def _limiter(**options: Any) -> Limiter:
    return Limiter(policy.loads(POLICY), redis_url=NOWHERE, **options)


def test_a_decision_is_one_send_answered_by_anyone(redis_client: redis.Redis) -> None:
    """A hit's flow asks for the plan's one call; answered by another client, it gives
    the decision the limiter would (the quota counts down), and nothing else happens."""
    limiter = _limiter(test_clock=TestClock())
    admin = redis_client
    try:
        for remaining in (1, 0):
            prepared = limiter.core.for_limit("hit", "log", "alice", None, 1)
            decision, sends = _drive(limiter, prepared, lambda calls: _run(admin, calls))
            assert sends == [prepared.calls]
            assert decision.allowed and not decision.degraded
            assert decision.remaining == remaining
    finally:
        limiter.close()


def test_a_repeated_denial_needs_no_send(redis_client: redis.Redis) -> None:
    """Once a cost-1 request is denied, the next flow for that identity ends without
    asking for a call: the denial cache answers."""
    limiter = _limiter(test_clock=TestClock())
    admin = redis_client

    def hit() -> tuple[Decision, list[tuple[ScriptCall, ...]]]:
        prepared = limiter.core.for_limit("hit", "log", "bob", None, 1)
        return _drive(limiter, prepared, lambda calls: _run(admin, calls))

    try:
        assert [len(hit()[1]) for _ in range(2)] == [1, 1]
        denied, sends = hit()
        assert not denied.allowed and len(sends) == 1
        again, sends = hit()
        assert not again.allowed and not again.degraded and sends == []
    finally:
        limiter.close()


def test_failed_calls_follow_the_failure_policy_and_open_the_breaker() -> None:
    """A call that failed gives the limit's failure policy (here: deny), degraded; after
    three, the breaker is open and the flow ends at once, without a Send."""
    limiter = _limiter()

    def down(calls: Any) -> list[object]:
        # Each failed call its own error, as a wire makes them.
        return [redis.exceptions.ConnectionError("Connection refused")]

    for _ in range(3):
        prepared = limiter.core.for_limit("hit", "log", "carol", None, 1)
        decision, sends = _drive(limiter, prepared, down)
        assert decision.degraded and not decision.allowed and len(sends) == 1
    assert limiter.breaker_state is BreakerState.OPEN
    prepared = limiter.core.for_limit("hit", "log", "carol", None, 1)
    decision, sends = _drive(limiter, prepared, down)
    assert decision.degraded and sends == []
    limiter.close()


def test_approximate_mode_syncs_then_answers_locally(redis_client: redis.Redis) -> None:
    """An approximate limit's first request syncs (one Send); the next ones, within
    sync_every and sync_interval, are answered by the flow alone."""
    limiter = _limiter(test_clock=TestClock())
    admin = redis_client
    try:
        counts = []
        for _ in range(4):
            prepared = limiter.core.for_limit("hit", "events", "dave", None, 1)
            decision, sends = _drive(limiter, prepared, lambda calls: _run(admin, calls))
            assert decision.allowed
            counts.append(len(sends))
        assert counts == [1, 0, 0, 0]
    finally:
        limiter.close()


@pytest.mark.cluster
def test_a_denied_multi_slot_request_asks_for_its_refund(
    redis_cluster: RedisCluster, cluster_client: Any
) -> None:
    """On Redis Cluster a request counted by address and by user is one call per slot;
    when the user's limit denies it, the flow asks for a second Send, the refund of what
    the address's limit consumed, and reports that limit as not consumed."""
    limiter = Limiter(policy.loads(POLICY), redis_url=redis_cluster.url, cluster=True)
    try:

        def request() -> tuple[Decision, list[tuple[ScriptCall, ...]]]:
            prepared = limiter.core.for_request(
                "hit", "GET", "/both/x", "erin", tier=None, cost=1, ip="192.0.2.7", host=None
            )
            assert len(prepared.calls) == 2
            return _drive(limiter, prepared, lambda calls: _run(cluster_client, calls))

        first, sends = request()
        assert first.allowed and len(sends) == 1
        second, sends = request()
        assert not second.allowed
        assert len(sends) == 2
        (refund,) = sends[1]
        assert refund.args[0] == "refund"
        by_name = {r.name: r for r in second.results}
        assert not by_name["per-ip"].consumed and by_name["per-ip"].remaining == 99
    finally:
        limiter.close()


def test_close_puts_a_fresh_wire_in_place_of_the_closed_one() -> None:
    """close() closes the wire the limiter had (a flow on it raises at its first step,
    whatever the caches hold) and puts an unopened one in its place: the limiter's next
    flow asks for its call as before, to be sent on new connections."""
    limiter = _limiter()
    old = limiter.decider.wire
    limiter.close()
    fresh = limiter.decider.wire
    assert old.closed and fresh is not old and not fresh.closed
    step = limiter.decider.begin(limiter.core.for_limit("hit", "log", "x", None, 1))
    assert isinstance(step, Send) and len(step.calls) == 1
    limiter.decider.wire = old
    with pytest.raises(ApplimitError, match="closed"):
        limiter.decider.begin(limiter.core.for_limit("hit", "log", "x", None, 1))


# --- the wire protocol -------------------------------------------------------------------


def _error(text: str) -> BaseException:
    """The exception redis-py's parser makes of an error reply ``text``."""
    error: BaseException = BaseParser.parse_error(text)
    return error


CALLS = [ScriptCall(("k1",), ("hit",)), ScriptCall(("k2",), ("hit",))]


def _recover(
    protocol: ScriptProtocol, how: bytes, replies: list[object], answers: list[list[object]]
) -> list[Step]:
    """Run the protocol's recovery, answering its steps with ``answers`` in turn."""
    steps: list[Step] = []
    recovery = protocol.recover(how, replies)
    try:
        step = next(recovery)
        while True:
            steps.append(step)
            step = recovery.send(answers[len(steps) - 1])
    except StopIteration:
        return steps


def test_a_missing_library_is_loaded_with_the_calls_again() -> None:
    """FCALL answered "Function not found": one step sends FUNCTION LOAD and those calls
    (only those) again in one write; their new replies take the old ones' places."""
    protocol = ScriptProtocol()
    replies: list[object] = [_error("ERR Function not found"), [1]]
    assert not protocol.settled(replies)
    steps = _recover(protocol, FCALL, replies, [[b"applimit_x", [7]]])
    assert [(s.how, s.indices, s.load) for s in steps] == [(FCALL, [0], True)]
    packed, count = steps[0].write(CALLS)
    assert packed.startswith(LOAD) and count == 2
    assert replies == [[7], [1]] and protocol.how is FCALL


@pytest.mark.parametrize(
    "refusal",
    [
        "NOPERM User scripts has no permissions to run the 'fcall' command",
        "ERR unknown command 'FCALL', with args beginning with: ",
    ],
)
def test_a_refusal_of_functions_is_evalsha_for_good(
    refusal: str, caplog: pytest.LogCaptureFixture
) -> None:
    """FCALL refused (an ACL, a Redis before 7): the calls go again as EVAL, and the
    protocol uses EVALSHA from then on; it says so once."""
    caplog.set_level(logging.INFO, logger="applimit")
    protocol = ScriptProtocol()
    replies: list[object] = [_error(refusal), _error(refusal)]
    steps = _recover(protocol, FCALL, replies, [[[1], [2]]])
    assert [(s.how, s.indices, s.load) for s in steps] == [(EVAL, [0, 1], False)]
    assert replies == [[1], [2]] and protocol.how is EVALSHA
    protocol.refuse(_error(refusal))
    assert sum("refused Redis Functions" in r.getMessage() for r in caplog.records) == 1


def test_a_refused_load_is_evalsha_and_a_failed_load_fails_the_calls() -> None:
    """FUNCTION LOAD refused: EVAL for the calls, EVALSHA from then on. FUNCTION LOAD
    failing for another reason (out of memory): the calls fail with that error, and the
    protocol keeps FCALL (an OOM is no refusal of Functions)."""
    protocol = ScriptProtocol()
    missing = _error("ERR Function not found")
    refused = _error("NOPERM User scripts has no permissions to run the 'function|load' command")
    replies: list[object] = [missing]
    steps = _recover(protocol, FCALL, replies, [[refused, missing], [[3]]])
    assert [(s.how, s.load) for s in steps] == [(FCALL, True), (EVAL, False)]
    assert replies == [[3]] and protocol.how is EVALSHA

    protocol = ScriptProtocol()
    oom = _error("OOM command not allowed when used memory > 'maxmemory'.")
    replies = [missing]
    _recover(protocol, FCALL, replies, [[oom, missing]])
    assert replies == [oom] and protocol.how is FCALL


def test_noscript_is_eval_and_state_errors_are_final() -> None:
    """EVALSHA answered NOSCRIPT (a restarted server): EVAL for that call. Errors about
    the server's state or a key (OOM, READONLY, WRONGTYPE) call for nothing more: they
    are the decision's, and never a refusal of Functions."""
    protocol = ScriptProtocol(functions=False)
    replies: list[object] = [[1], _error("NOSCRIPT No matching script. Please use EVAL.")]
    steps = _recover(protocol, EVALSHA, replies, [[[2]]])
    assert [(s.how, s.indices) for s in steps] == [(EVAL, [1])]
    assert replies == [[1], [2]]
    for text in (
        "OOM command not allowed when used memory > 'maxmemory'.",
        "READONLY You can't write against a read only replica.",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "ERR user_function:12: Script attempted to access a non local key, script: x",
    ):
        assert ScriptProtocol().settled([_error(text)]), text


def test_asking_replies_are_paired_off() -> None:
    """A call sent after ASKING has two replies; the call's own is kept, or ASKING's
    error when that was refused."""
    step = Step(EVAL, [0, 1])
    packed, count = step.write(CALLS, asking=True)
    assert count == 4 and packed.count(b"ASKING") == 2
    refused = _error("ERR ASKING is not allowed")
    assert step.replies([b"OK", [1], refused, [2]], asking=True) == [[1], refused]


def test_redirections_say_what_a_cluster_error_means() -> None:
    """MOVED, ASK and TRYAGAIN are followed; a CLUSTERDOWN or a dead connection means
    the slot map may be out of date; anything else is the call's own failure."""
    assert redirection(_error("MOVED 3999 127.0.0.1:6381")).value == "moved"
    assert redirection(_error("ASK 3999 127.0.0.1:6381")).value == "ask"
    assert redirection(_error("TRYAGAIN Multiple keys request during rehashing")).value == (
        "tryagain"
    )
    assert redirection(_error("CLUSTERDOWN The cluster is down")).value == "refresh"
    assert redirection(redis.exceptions.ConnectionError("refused")).value == "refresh"
    assert redirection(_error("WRONGTYPE Operation against a key")).value == "fail"


# --- the breakers' ledger ----------------------------------------------------------------


def test_a_round_trip_that_failed_as_a_whole_counts_once() -> None:
    """The calls of one failed round trip share its error: the breaker counts it once,
    however many decisions it carried; distinct failures count one each."""
    breaker = CircuitBreaker(threshold=3)
    batch = redis.exceptions.ConnectionError("Connection reset by peer")
    for _ in range(10):
        breaker.failure(batch)
    assert breaker.state is BreakerState.CLOSED and breaker.in_outage
    for _ in range(2):
        breaker.failure(redis.exceptions.ConnectionError("Connection refused"))
    assert breaker.state is BreakerState.OPEN


async def test_the_async_limiter_counts_a_failed_batch_once_as_threads_count_theirs() -> None:
    """Decisions of one event-loop turn go to Redis as one batch: when it fails as a
    whole, the decider (not the wire) tells the breaker, once for the batch. Three
    batches open it, as three failed calls of the blocking limiter do."""
    limiter = AsyncLimiter(policy.loads(POLICY), redis_url=NOWHERE, failure_threshold=3)
    try:
        for batch in range(3):
            assert limiter.breaker_state is BreakerState.CLOSED, batch
            decisions = await asyncio.gather(*(limiter.hit("log", f"user-{i}") for i in range(10)))
            assert all(d.degraded and not d.allowed for d in decisions)
        assert limiter.breaker_state is BreakerState.OPEN
    finally:
        await limiter.aclose()
    sync = _limiter(failure_threshold=3)
    for _ in range(3):
        assert sync.breaker_state is BreakerState.CLOSED
        assert sync.hit("log", "alice").degraded
    assert sync.breaker_state is BreakerState.OPEN
    sync.close()


async def test_a_deadline_is_no_outage_but_a_late_failure_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An async decision whose deadline passed follows the failure policy without telling
    the breaker (the event loop may have been busy); the batch's own failure, landing
    after its callers stopped waiting, still reaches the breaker through Decider.late."""
    limiter = AsyncLimiter(policy.loads(POLICY), redis_url=NOWHERE, failure_threshold=1)
    try:
        call = limiter.core.for_limit("hit", "log", "x", None, 1).calls[0]
        limiter.decider.late([call], [DeadlinePassed("the decision's deadline")])
        assert limiter.breaker_state is BreakerState.CLOSED
        limiter.decider.late([call], [redis.exceptions.TimeoutError("Timeout reading")])
        assert limiter.breaker_state is BreakerState.OPEN
    finally:
        await limiter.aclose()


def test_a_failed_call_is_found_whatever_the_plans_shape() -> None:
    """A failed call's outcome (its exception, where the reply would be) gives the
    failure policy's decision and tells the breaker, for a plan of one check and for one
    of several checks in one call; a breaker in an outage is not told of a success."""
    limiter = _limiter(failure_threshold=10)
    plans = [
        limiter.core.for_limit("hit", "log", "gus", None, 1),
        limiter.core.for_request(
            "hit", "GET", "/both/x", "gus", tier=None, cost=1, ip="192.0.2.8", host=None
        ),
    ]
    try:
        for prepared in plans:
            assert len(prepared.calls) == 1
            failure = redis.exceptions.ConnectionError(f"refused, {len(prepared.checks)}")
            decision, _ = _drive(limiter, prepared, lambda calls, failure=failure: [failure])
            assert decision.degraded and not decision.allowed
            assert limiter.decider.breakers.main.in_outage
        assert limiter.decider.breakers.main.outages == 1
    finally:
        limiter.close()


def test_a_reply_of_the_wrong_shape_is_no_outage_but_an_answer(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis answering with what the script never replies gives the failure policy's
    decision, logged as a refusal, and is no failure for the breaker; an outage under
    way ends with it (Redis answered), as with the next decision's proper reply."""
    caplog.set_level(logging.WARNING, logger="applimit")
    limiter = _limiter(failure_threshold=10, test_clock=TestClock())
    breaker = limiter.decider.breakers.main
    try:
        down, _ = _drive(
            limiter,
            limiter.core.for_limit("hit", "log", "hal", None, 1),
            lambda calls: [redis.exceptions.ConnectionError("Connection refused")],
        )
        assert down.degraded and breaker.in_outage
        odd, _ = _drive(
            limiter,
            limiter.core.for_limit("hit", "log", "hal", None, 1),
            lambda calls: [[b"not", b"the", b"script's"]],
        )
        assert odd.degraded and not odd.allowed
        assert not breaker.in_outage and breaker.outages == 1
        events = sorted(getattr(r, "applimit_event", "") for r in caplog.records)
        assert events == ["redis_outage", "redis_recovered", "redis_refused"]
        admitted, _ = _drive(
            limiter,
            limiter.core.for_limit("hit", "log", "hal", None, 1),
            lambda calls: _run(redis_client, calls),
        )
        assert admitted.allowed and not admitted.degraded
    finally:
        limiter.close()


@pytest.mark.cluster
@pytest.mark.parametrize("shape", ["the reply, then the failure", "the failure alone"])
def test_a_failed_call_of_several_is_the_decision(
    shape: str, redis_cluster: RedisCluster, cluster_client: Any
) -> None:
    """On Redis Cluster, a request counted by address and by user is one call per slot:
    when one of them failed (its exception beside the other's reply, or the outcomes
    stopping at it), the failure policy decides and the failed call's breaker hears it."""
    limiter = Limiter(
        policy.loads(POLICY), redis_url=redis_cluster.url, cluster=True, failure_threshold=10
    )
    try:
        prepared = limiter.core.for_request(
            "hit", "GET", "/both/x", "ida", tier=None, cost=1, ip="192.0.2.9", host=None
        )
        assert len(prepared.calls) == 2
        failure = redis.exceptions.ConnectionError("Connection reset by peer")
        step = limiter.decider.begin(prepared)
        assert isinstance(step, Send)
        if shape == "the failure alone":
            outcomes: list[object] = [failure]
            failed = step.breakers[0]
        else:
            outcomes = [*_run(cluster_client, step.calls[:1]), failure]
            failed = step.breakers[1]
        decision = limiter.decider.advance(step, outcomes)
        assert isinstance(decision, Decision)
        assert decision.degraded and not decision.allowed
        assert failed.in_outage
    finally:
        limiter.close()
