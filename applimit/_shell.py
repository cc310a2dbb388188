"""What ``Limiter`` and ``AsyncLimiter`` share besides the core: options, breaker, outcomes.

The shells differ only in how they run a script call (blocking, or awaited under a
deadline). Everything else is here: resolving the policy and the Redis options, the
circuit breaker, and turning a call's outcome (replies or an error) into a decision.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from redis.exceptions import ResponseError

from policy import Policy, load

from ._approx import ApproxCache, Flush, Sync
from ._breaker import BreakerState, CircuitBreaker
from ._core import CompiledPolicy, Core, Prepared, ScriptCall, compile_policy, wrote
from ._decision import Decision
from ._denials import DenialCache
from ._errors import ConfigurationError, PoolExhausted, is_outage

logger = logging.getLogger("applimit")

# What a client told to wait during an outage is told: the breaker probes Redis again
# well within this, so a retry after it may already be served normally.
DEGRADED_RETRY_AFTER = 1.0
# Errors specific to one key are logged at most this often (seconds), not per request.
_KEY_ERROR_LOG_INTERVAL = 60.0


def load_policy(source: str | os.PathLike[str] | Policy) -> Policy:
    """A policy object from a path, or the object itself."""
    if isinstance(source, Policy):
        return source
    return load(source)


class LimiterBase:
    """Construction and the I/O-free steps around each call, for both shells."""

    def __init__(
        self,
        policy: Policy,
        *,
        has_client: bool,
        redis_url: str | None,
        cluster: bool,
        max_connections: int,
        failure_threshold: int,
        recovery_time: float,
        test_clock: Callable[[], float] | None,
    ) -> None:
        if has_client and redis_url is not None:
            raise ConfigurationError(
                "pass either redis= (a client) or redis_url=, not both; the limiter builds "
                "its connections from one of them."
            )
        if max_connections < 1:
            raise ConfigurationError(f"max_connections is {max_connections}; use at least 1.")
        if recovery_time <= 0 or failure_threshold < 1:
            raise ConfigurationError(
                "failure_threshold must be at least 1 and recovery_time positive; they "
                "decide when the circuit breaker opens and when it probes Redis again."
            )
        self.compiled: CompiledPolicy = compile_policy(policy)
        self.url = redis_url if redis_url is not None else self.compiled.redis_url
        self.timeout = self.compiled.timeout
        self.max_connections = max_connections
        self.cluster = cluster
        self.test_clock = test_clock
        self._failure_threshold = failure_threshold
        self._recovery_time = recovery_time
        self.breaker = self._new_breaker("Redis (applimit)")
        # On Redis Cluster each master has a breaker of its own: one dead node must not
        # take down decisions whose keys live on the others.
        self._node_breakers: dict[str, CircuitBreaker] = {}
        self._breakers_lock = threading.Lock()
        self.core = Core(self.compiled, cluster=cluster, test_clock=test_clock)
        self.denials = self._denial_cache()
        self.approx = self._approx_cache()
        self._key_error_logged = float("-inf")
        self._slow_logged = float("-inf")
        self._pool_logged = float("-inf")

    def _new_breaker(self, describe: str) -> CircuitBreaker:
        return CircuitBreaker(
            threshold=self._failure_threshold,
            cooldown=self._recovery_time,
            # A probe that has not reported after a few timeouts was lost (cancelled).
            probe_timeout=max(4 * self.timeout, self._recovery_time),
            describe=describe,
        )

    def _breaker_for(self, node: str | None) -> CircuitBreaker:
        """The breaker of a cluster node (by name), or the one breaker without a cluster."""
        if node is None:
            return self.breaker
        breaker = self._node_breakers.get(node)
        if breaker is None:
            with self._breakers_lock:
                breaker = self._node_breakers.get(node)
                if breaker is None:
                    breaker = self._new_breaker(f"Redis node {node} (applimit)")
                    self._node_breakers[node] = breaker
        return breaker

    @staticmethod
    def _admit(breakers: Sequence[CircuitBreaker]) -> CircuitBreaker | None:
        """None when every breaker lets the call through; else the first that does not."""
        seen: set[int] = set()
        for breaker in breakers:
            if id(breaker) in seen:
                continue
            seen.add(id(breaker))
            if not breaker.allow():
                return breaker
        return None

    def _set_cluster(self, cluster: bool) -> None:
        self.cluster = cluster
        self.core = Core(self.compiled, cluster=cluster, test_clock=self.test_clock)
        self.denials = self._denial_cache()
        self.approx = self._approx_cache()

    def _approx_cache(self) -> ApproxCache | None:
        """The local counts of approximate limits, or None when the policy has none."""
        if not any(rule.approximate for rule in self.compiled.rules):
            return None
        return ApproxCache(self.core, self._clock)

    def _approx_begin(self, prepared: Prepared) -> Decision | Sync | None:
        """Approximate mode's first step: a local decision, a sync to run, or None (exact)."""
        if self.approx is None or not self.approx.applies(prepared):
            return None
        return self.approx.begin(prepared)

    def _approx_settle(self, sync: Sync, decision: Decision) -> Flush | None:
        assert self.approx is not None
        return self.approx.settle(sync, decision)

    def _denial_cache(self) -> DenialCache | None:
        """The "denied until" cache, or None where it could not be exact.

        On Redis Cluster a policy with both per-IP and per-user limits has requests whose
        checks span hash slots; their refunds give capacity back, which a cached denial
        would not see.
        """
        kinds = {rule.per_ip for rule in self.compiled.rules}
        if self.cluster and len(kinds) > 1:
            return None
        if self.test_clock is not None:
            return DenialCache(self.test_clock, exact_clock=True)
        return DenialCache(time.monotonic, exact_clock=False)

    def _clock(self) -> float:
        """The time a request is sent, by the denial cache's clock."""
        return self.test_clock() if self.test_clock is not None else time.monotonic()

    def _forget(self, keys: list[str]) -> None:
        """Drop what this instance holds of ``keys`` (a local reset): cached denials and
        approximate counts."""
        if self.denials is not None:
            self.denials.forget(keys, self.compiled.tiers)
        if self.approx is not None:
            self.approx.forget(keys, self.compiled.tiers)

    # -- the public read-only surface -----------------------------------------------------

    @property
    def tiers(self) -> tuple[str, ...]:
        """The policy's tiers, least generous first."""
        return self.compiled.tiers

    @property
    def limits(self) -> tuple[str, ...]:
        """The names of the policy's app limits, in policy order."""
        return tuple(r.name for r in self.compiled.rules)

    @property
    def breaker_state(self) -> BreakerState:
        """The circuit breaker's state, for health checks: ``closed`` when Redis answers.

        On Redis Cluster, the worst over the masters that serve slots now (``open`` if any
        of theirs is open): after a failover the dead master's breaker stays open, but no
        call goes to it any more, so it must not fail health checks forever.
        """
        serving = self._serving_nodes()
        # No slot map yet (never connected, or every node unknown): only the limiter's own
        # breaker knows whether Redis answers.
        states = [self.breaker.state] if not serving else []
        states += [
            breaker.state
            for node, breaker in list(self._node_breakers.items())
            if not serving or node in serving
        ]
        for state in (BreakerState.OPEN, BreakerState.HALF_OPEN):
            if state in states:
                return state
        return BreakerState.CLOSED

    def _serving_nodes(self) -> set[str] | None:
        """The masters in the cluster client's slot map (None: no cluster client yet).

        Once the client exists every call is routed to one of these, so the limiter's own
        breaker (used only while the slot map cannot name a node) no longer says anything
        about health on its own.
        """
        manager = getattr(getattr(self, "_client", None), "nodes_manager", None)
        if manager is None:
            return None
        return {str(node.name) for node in manager.get_nodes_by_server_type("primary")}

    # -- outcomes -------------------------------------------------------------------------

    def _skipped(self, prepared: Prepared, breaker: CircuitBreaker) -> Decision:
        """The decision while a breaker is open: the failure policy, at once."""
        breaker.degraded()
        return prepared.degraded(DEGRADED_RETRY_AFTER)

    def _failed(
        self,
        prepared: Prepared,
        error: BaseException,
        breaker: CircuitBreaker,
        *,
        report: bool = True,
    ) -> Decision:
        """The decision when a call failed: the failure policy, marked degraded.

        ``report`` is False when the round trip's own outcome reaches the breaker by
        another way (the async limiter's batches report once for all their calls).
        """
        if not report:
            breaker.degraded()
            self._log_other(error, breaker)
        elif self._note_failure(error, breaker):
            breaker.degraded()
        return prepared.degraded(DEGRADED_RETRY_AFTER)

    def _log_other(self, error: BaseException, breaker: CircuitBreaker) -> None:
        """Log a failure that is no outage (the breaker logs those), at most once a
        minute for each kind: the process too busy to keep to the timeout, its own pool
        too small, or an answer from Redis the limiter cannot use."""
        if isinstance(error, PoolExhausted):
            self._log_pool(error)
        elif isinstance(error, TimeoutError):
            self._log_slow(breaker)
        elif isinstance(error, ResponseError) and not is_outage(error):
            self._log_refusal(error)

    def _log_slow(self, breaker: CircuitBreaker) -> None:
        """Log, at most once a minute, decisions that ran out of time while Redis answered."""
        if breaker.in_outage:
            return
        now = time.monotonic()
        if now - self._slow_logged < _KEY_ERROR_LOG_INTERVAL:
            return
        self._slow_logged = now
        logger.warning(
            "decisions took longer than app.timeout (%.0f ms) while Redis was answering, so "
            "the failure policy decided them: the process is too busy to keep up.",
            self.timeout * 1000,
        )

    def _log_pool(self, error: BaseException) -> None:
        """Log, at most once a minute, decisions that found every connection busy."""
        now = time.monotonic()
        if now - self._pool_logged < _KEY_ERROR_LOG_INTERVAL:
            return
        self._pool_logged = now
        logger.warning(
            "%s; those decisions followed the failure policy. Redis is not at fault: raise "
            "max_connections (now %d) or make fewer decisions at once.",
            error,
            self.max_connections,
        )

    def _note_failure(self, error: BaseException, breaker: CircuitBreaker) -> bool:
        """Feed a failed call to the breaker (or the log); True when it was an outage."""
        if is_outage(error):
            breaker.failure(error)
            return True
        self._log_other(error, breaker)
        return False

    def _log_refusal(self, error: BaseException) -> None:
        """Log an answer from Redis that the limiter cannot use, at most once a minute."""
        now = time.monotonic()
        if now - self._key_error_logged < _KEY_ERROR_LOG_INTERVAL:
            return
        self._key_error_logged = now
        logger.error(
            "Redis answered the limiter with an error or an unexpected reply (%s: %s); the "
            "decision follows the failure policy. Is something other than applimit writing "
            "under key prefix %r, or another script loaded under the limiter's SHA?",
            type(error).__name__,
            error,
            self.compiled.key_prefix,
        )

    def _succeeded(
        self,
        prepared: Prepared,
        replies: Sequence[object],
        breakers: Sequence[CircuitBreaker],
        sent: float,
    ) -> tuple[Decision, tuple[ScriptCall, ...]]:
        """The decision from the replies (sent at ``sent``), and the refund calls to run.

        ``breakers`` are those of the calls, told of the success; none when the round
        trip reported its outcome itself (the async wire's batches).
        """
        for call, reply, breaker in zip(prepared.calls, replies, breakers, strict=bool(breakers)):
            if breaker.in_outage:
                # Rare: whether the call wrote decides if the outage is over.
                breaker.success(wrote=wrote(call, reply))
            else:
                breaker.success()
        try:
            decision, refunds = prepared.decide(replies)
        except ValueError as error:
            # A reply of the wrong shape: Redis answered, so this is not an outage, but
            # the decision can only follow the failure policy.
            self._log_refusal(error)
            return prepared.degraded(DEGRADED_RETRY_AFTER), ()
        if self.denials is not None and not decision.allowed:
            self.denials.record(prepared, decision, sent)
        return decision, refunds

    @staticmethod
    def _refund_failed(error: BaseException) -> None:
        logger.warning(
            "a refund after a denied multi-slot decision failed (%s: %s); the denied request "
            "stays counted against the limits that had admitted it.",
            type(error).__name__,
            error,
        )


UNLIMITED = Decision(
    allowed=True, limit=0, remaining=0, reset_after=0.0, retry_after=None, policy=None
)
