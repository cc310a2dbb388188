"""The answer of the limiter: a Decision, and one LimitResult per rate that was checked."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ._frozen import fast_constructor


@dataclass(frozen=True, slots=True)
class LimitResult:
    """One rate of one limit, as checked for one request.

    ``name`` is the policy's limit name and ``tier`` the tier whose rate applied;
    ``quota`` requests per ``window`` seconds is that rate (a tier with several rates gives
    several results with the same name). ``allowed`` says whether this rate alone admits
    the request; for a ``shadow`` limit (``enforce: false``) that is what it *would* decide,
    and it never denies the request. ``consumed`` is true when the request was counted.

    ``remaining`` is how many more requests of cost 1 this rate admits right now (after
    this one, when it was consumed). ``reset_after`` is the number of seconds until the
    full quota is back if nothing else arrives. ``retry_after`` is None when allowed;
    otherwise the seconds until this request's cost fits, or ``math.inf`` when it never
    can (a cost above the quota, or above a GCRA burst).
    """

    name: str
    tier: str
    algorithm: str
    quota: int
    window: float
    allowed: bool
    consumed: bool
    remaining: int
    reset_after: float
    retry_after: float | None
    shadow: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a request may proceed, and the numbers for the response headers.

    ``allowed`` is false only when an enforced limit denies (shadow limits never deny),
    or when Redis could not answer and a limit involved fails closed.

    The scalar fields describe the most restrictive result, ``binding``: when denied, the
    denying rate whose wait is longest (the request fits only once every denial has
    cleared); when allowed, the rate with the fewest ``remaining`` (then the longest
    ``reset_after``). ``limit`` is its quota, ``policy`` its limit name. ``results`` keeps
    every rate checked, in policy order, for headers that list them all.

    ``reset_after`` and ``retry_after`` are seconds as floats; ``retry_after`` is None when
    allowed. When no limit applies (``check_request`` matched none, or the tier has no rate
    in the limit), ``results`` is empty, ``binding`` and ``policy`` are None, ``limit`` and
    ``remaining`` are 0 and the request is allowed.

    ``degraded`` marks a decision made without Redis (unreachable, too slow, or the circuit
    breaker open): each limit's ``on_redis_error`` decided it, and the counts are unknown
    (``remaining`` 0, ``reset_after`` 0).
    """

    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float | None
    policy: str | None
    results: tuple[LimitResult, ...] = ()
    degraded: bool = False

    @property
    def binding(self) -> LimitResult | None:
        """The result the scalar fields describe (None when no limit applied)."""
        return _binding(self.results, self.allowed)

    @property
    def denied_by(self) -> tuple[LimitResult, ...]:
        """The enforced results that denied the request (empty when allowed)."""
        if self.allowed:
            return ()
        return tuple(r for r in self.results if not r.allowed and not r.shadow)

    @property
    def shadow_denied_by(self) -> tuple[LimitResult, ...]:
        """The shadow results that would have denied the request, were they enforced."""
        return tuple(r for r in self.results if not r.allowed and r.shadow)


@dataclass(frozen=True, slots=True)
class Leased(Decision):
    """An allowed Decision that took concurrency leases (a limit with ``concurrency``):
    give them back with ``limiter.release(decision)`` when the request ends. ``releases``
    are the calls that do it, one per server."""

    releases: tuple[object, ...] = ()


def leased(decision: Decision, releases: tuple[object, ...]) -> Leased:
    """``decision`` holding the leases ``releases`` give back."""
    return Leased(
        decision.allowed,
        decision.limit,
        decision.remaining,
        decision.reset_after,
        decision.retry_after,
        decision.policy,
        decision.results,
        decision.degraded,
        releases,
    )


# ``LimitResult(...)`` and ``Decision(...)`` with every field given in order, built
# without a call per field (see _frozen): one of each per decision.
make_result = fast_constructor(LimitResult)
make_decision = fast_constructor(Decision)


def _wait(result: LimitResult) -> float:
    return math.inf if result.retry_after is None else result.retry_after


def _binding(results: Sequence[LimitResult], allowed: bool) -> LimitResult | None:
    if not results:
        return None
    if allowed:
        # Every enforced result admits: the tightest of them, or of all when every one is
        # shadow.
        best = _scan(results)[1]
        return best if best is not None else min(results, key=_tightness)
    enforced = [r for r in results if not r.shadow]
    denied = [r for r in enforced if not r.allowed]
    if denied:
        # max() keeps the first of equal waits: policy order breaks ties.
        return max(denied, key=_wait)
    pool = enforced or results
    return min(pool, key=_tightness)


def _scan(results: Sequence[LimitResult]) -> tuple[bool, LimitResult | None]:
    """Whether every enforced result admits, and then the tightest of them (``min(enforced,
    key=_tightness)``: the first with the fewest remaining, then the longest reset) in one
    loop, with no key tuples; (False, None) at the first denial, None when every one is
    shadow."""
    best: LimitResult | None = None
    for result in results:
        if result.shadow:
            continue
        if not result.allowed:
            return False, None
        if (
            best is None
            or result.remaining < best.remaining
            or (result.remaining == best.remaining and result.reset_after > best.reset_after)
        ):
            best = result
    return True, best


def _tightness(result: LimitResult) -> tuple[int, float]:
    """Fewest remaining first, then the longest reset."""
    return (result.remaining, -result.reset_after)


def single(only: LimitResult, degraded: bool = False) -> Decision:
    """The decision for one result (one rate: most decisions), which binds whatever it
    says: ``combine((only,))``."""
    allowed = only.allowed or only.shadow
    return make_decision(
        allowed,
        only.quota,
        only.remaining,
        only.reset_after,
        None if allowed else (only.retry_after if only.retry_after is not None else math.inf),
        only.name,
        (only,),
        degraded,
    )


def combine(results: Sequence[LimitResult], *, degraded: bool = False) -> Decision:
    """The decision for a set of results: denied when any enforced result denies."""
    if len(results) == 1:
        return single(results[0], degraded)
    # The commonest case, every enforced result admitting, in one pass: the binding one
    # is the tightest of them.
    allowed, best = _scan(results)
    if best is not None:
        return make_decision(
            True,
            best.quota,
            best.remaining,
            best.reset_after,
            None,
            best.name,
            tuple(results),
            degraded,
        )
    chosen = _binding(results, allowed)
    if chosen is None:
        return Decision(True, 0, 0, 0.0, None, None, (), degraded)
    return _described_by(chosen, allowed, tuple(results), degraded)


def _described_by(
    chosen: LimitResult, allowed: bool, results: tuple[LimitResult, ...], degraded: bool
) -> Decision:
    """The decision whose scalar fields are those of the binding result ``chosen``."""
    retry = None
    if not allowed:
        retry = chosen.retry_after if chosen.retry_after is not None else math.inf
    return make_decision(
        allowed,
        chosen.quota,
        chosen.remaining,
        chosen.reset_after,
        retry,
        chosen.name,
        results,
        degraded,
    )
