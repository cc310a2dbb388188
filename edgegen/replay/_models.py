"""Each layer's counting model for ``edgegen replay``: the app's algorithms, a Cloudflare
rate limiting rule, and the Workers Rate Limiting binding.

Every model holds the state of one limit rate (app), one rule or one binding (edge) for
every key it counts, in plain dicts keyed by the identity (app) or by the counter key the
engine builds (edge: the characteristics' values with the data centre). Time is integer µs
(``_types``). The models import nothing of ``applimit``: edgegen depends on
``policy`` only, whose model of ``applimit/lua`` the app models decide with;
tests/edgegen/test_replay_models.py holds them to the Lua, decision for decision, on a
real Redis.

App models (:func:`app_model`, :func:`app_models`)
    One rate of an app limit for every identity it counts, deciding with
    ``edgegen_policy``'s model of ``applimit/lua`` (``ALGORITHMS``: the arithmetic the
    in-process ``memory://`` store runs too), so the replay decides exactly as the scripts
    do for the arguments ``applimit/_calls.py`` sends (``Quota.of``: the period in µs, gcra's
    burst defaulting to the quota). ``peek`` and ``record`` are decide.lua's two phases for
    ``edgegen_policy.decide``; ``check``, ``apply`` and ``hit`` the same as plain answers.
    What the scripts do when the clock goes back is kept too. Redis expiry is not
    modelled: a key expires only once its state no longer changes a decision, which
    ``sweep`` restates (``idle``).

Sweeps (every model)
    ``sweep(t)`` forgets what can no longer change a decision at ``t`` or later. A call at
    an earlier time than ``t`` may then decide otherwise than without the sweep, so an
    engine that reads records slightly out of order sweeps at the earliest time a record
    still to come may carry.

Rule model (:func:`rule_counter`)
    Cloudflare's request-rate calculation (developers.cloudflare.com/waf/rate-limiting-
    rules/request-rate/ and .../parameters/), counted with the sliding-window approximation
    Cloudflare published for its rate limiting (blog.cloudflare.com/counting-things-a-lot-
    of-different-things/). See :class:`RuleCounter` for the assumptions.

Worker model (:func:`worker_counter`)
    The Workers Rate Limiting binding as workerd's local emulation implements it
    (Miniflare's ratelimit.worker.ts): fixed windows of the period aligned to the Unix
    epoch, a refused call not counted. See :class:`WorkerCounter`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from edgegen_policy import (
    ALGORITHMS,
    Action,
    Algorithm,
    Quota,
    Rate,
    Verdict,
    checked_rates,
)

from ._types import AppModel, EdgeCounter

US_PER_S = 1_000_000
# The Workers binding accepts these periods only (wrangler and Miniflare refuse others).
WORKER_PERIODS_S = (10, 60)


def _positive(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a whole number of at least 1, not {value!r}.")
    return value


class AlgorithmCounter:
    """One app limit rate of one algorithm, for every identity (``key``) it counts: each
    key's value (``edgegen_policy``'s ``Tat``, ``Window`` or ``Log``) in a dict."""

    __slots__ = ("_model", "_quota", "_values")

    def __init__(self, algorithm: Algorithm, quota: Quota) -> None:
        """``quota.limit`` per ``quota.period`` µs with ``algorithm``."""
        _positive(quota.limit, "limit")
        _positive(quota.period, "period_us")
        if algorithm is Algorithm.GCRA:
            _positive(quota.burst, "burst")
        self._model = ALGORITHMS[algorithm]
        self._quota = quota
        self._values: dict[Hashable, Any] = {}

    def __len__(self) -> int:
        """The number of keys held."""
        return len(self._values)

    def peek(self, key: Hashable, now: int, cost: int) -> Verdict:
        """Phase 1: what ``cost`` finds now; nothing changes."""
        verdict: Verdict = self._model.check(self._values.get(key), now, self._quota, cost)
        return verdict

    def record(self, key: Hashable, verdict: Verdict, now: int, cost: int) -> None:
        """Phase 2: count the ``cost`` that ``verdict`` admitted."""
        values = self._values
        values[key] = self._model.apply(values.get(key), verdict, now, self._quota, cost)

    def check(self, key: Hashable, now_us: int, cost: int) -> bool:
        """Whether ``cost`` fits now (phase 1: nothing changes)."""
        return self.peek(key, now_us, cost).allowed

    def apply(self, key: Hashable, now_us: int, cost: int) -> None:
        """Record an admitted ``cost`` (phase 2)."""
        self.record(key, self.peek(key, now_us, cost), now_us, cost)

    def hit(self, key: Hashable, now_us: int, cost: int = 1) -> bool:
        """check, and apply when admitted: one request counted by this model alone."""
        verdict = self.peek(key, now_us, cost)
        if verdict.allowed:
            self.record(key, verdict, now_us, cost)
        return verdict.allowed

    def sweep(self, now_us: int) -> None:
        """Forget keys whose value can no longer change a decision (the model's ``idle``):
        they decide as a key never seen."""
        idle, quota, values = self._model.idle, self._quota, self._values
        for key in [k for k, value in values.items() if idle(value, now_us, quota)]:
            del values[key]


class GcraModel(AlgorithmCounter):
    """gcra: one theoretical arrival time per key."""

    __slots__ = ()

    def __init__(self, limit: int, period_us: int, burst: int) -> None:
        """``limit`` requests per ``period_us``, at most ``burst`` at once."""
        super().__init__(Algorithm.GCRA, Quota(limit, period_us, burst))


class SlidingWindowModel(AlgorithmCounter):
    """sliding_window: per key the current fixed window's index and count and the
    previous window's count."""

    __slots__ = ()

    def __init__(self, limit: int, period_us: int) -> None:
        """``limit`` requests per ``period_us``."""
        super().__init__(Algorithm.SLIDING_WINDOW, Quota(limit, period_us))


class SlidingLogModel(AlgorithmCounter):
    """sliding_log: every admitted request is an entry scored with its time and holding
    its cost; the window is (now - period, now]. Memory holds the entries within a period,
    plus those that left it since the last trim (at most ``TRIM_EVERY`` units' worth)."""

    __slots__ = ()

    def __init__(self, limit: int, period_us: int) -> None:
        """``limit`` units per ``period_us``."""
        super().__init__(Algorithm.SLIDING_LOG, Quota(limit, period_us))

    def entries(self, key: Hashable) -> int:
        """The number of entries held for ``key`` (those not yet trimmed included)."""
        log = self._values.get(key)
        return 0 if log is None else len(log.scores)


def app_model(algorithm: Algorithm, rate: Rate, burst: int | None) -> AppModel:
    """The model of one app limit rate: ``rate.limit`` per ``rate.period`` with
    ``algorithm``; ``burst`` for gcra (None: the rate's limit, as applimit sends it)."""
    if burst is not None and algorithm is not Algorithm.GCRA:
        raise ValueError(
            f"burst applies to gcra only, not {algorithm.value}; pass burst=None for "
            f"{algorithm.value}."
        )
    quota = Quota.of(algorithm, rate, burst)
    if algorithm is Algorithm.GCRA:
        return GcraModel(quota.limit, quota.period, quota.burst)
    if algorithm is Algorithm.SLIDING_WINDOW:
        return SlidingWindowModel(quota.limit, quota.period)
    if algorithm is Algorithm.SLIDING_LOG:
        return SlidingLogModel(quota.limit, quota.period)
    raise ValueError(f"no replay model for algorithm {algorithm!r}.")


def app_models(
    algorithm: Algorithm, rates: Iterable[Rate], burst: int | None
) -> tuple[AppModel, ...]:
    """The models of one tier's rates, one per period, as applimit checks them
    (``checked_rates``: of two rates with the same period only the smaller limit)."""
    return tuple(app_model(algorithm, rate, burst) for rate in checked_rates(rates))


class RuleCounter:
    """One Cloudflare rate limiting rule's counters, per counter key (the value combination
    of the rule's characteristics, data centre included: counters are per data centre).

    The model, and what it assumes where Cloudflare does not say:

    - **Counting window.** The rate is Cloudflare's published sliding-window estimate:
      fixed windows of the period, aligned to multiples of the period since the Unix epoch
      (an assumption: the windows' phase is not documented), and the rate at a time
      ``elapsed`` into the current window is
      ``previous x (period - elapsed) / period + current``, compared in integers (x period).
    - **When the action applies.** A request is counted first, then the rule acts on it
      when the estimate is above ``requests_per_period`` (request-rate page, example A:
      with 1 request per period, the request that sets the counter to 2 is blocked).
    - **Mitigation timeout.** Once the rate is exceeded the action applies to every
      request of that key for ``mitigation_timeout`` seconds, whatever the rate (parameters
      page, "For duration"). With a timeout of 0 (throttling: challenge actions below
      Enterprise, block on Enterprise) only the requests that find the rate exceeded get
      the action.
    - **Mitigated requests count.** Every matching request increments its counter, those
      that get the action included: example A counts request 3 (counter 2) and blocks it,
      and the rule's counting expression defaults to its matching expression. So a key
      that keeps sending above the rate through its mitigation is mitigated again as soon
      as the timeout ends, and under throttling a key whose whole rate is above the limit
      gets the action on all its requests until its rate falls.
    - **Challenges are not solved.** Passing a challenge resets the counter (parameters
      page); a log cannot say who would have solved one, so none is, and a challenged
      request counts like any other.
    - **Response-based counting** (a counting expression with response fields, example B,
      what a limit's ``count_when`` compiles to) is :meth:`check_before_answer` then
      :meth:`count_answer` (:meth:`hit_counted_on_response` in one call).
    """

    __slots__ = (
        "_limit_scaled",
        "_period",
        "_state",
        "action",
        "mitigation_timeout_us",
        "requests_per_period",
    )

    def __init__(
        self,
        period_s: int,
        requests_per_period: int,
        mitigation_timeout_s: int,
        action: Action | str,
    ) -> None:
        """A rule of ``requests_per_period`` per ``period_s`` seconds whose ``action``
        (block, a challenge, log) applies for ``mitigation_timeout_s`` (0: throttling)."""
        self._period = _positive(period_s, "period_s") * US_PER_S
        self.requests_per_period = _positive(requests_per_period, "requests_per_period")
        if isinstance(mitigation_timeout_s, bool) or mitigation_timeout_s < 0:
            raise ValueError(
                f"mitigation_timeout_s must be 0 (throttle) or a number of seconds, not "
                f"{mitigation_timeout_s!r}."
            )
        self.mitigation_timeout_us = mitigation_timeout_s * US_PER_S
        try:
            self.action = Action(action)
        except ValueError:
            names = ", ".join(a.value for a in Action)
            raise ValueError(f"unknown rule action {action!r}; use one of {names}.") from None
        self._limit_scaled = self.requests_per_period * self._period
        # key -> [window, current count, previous count, mitigated until (µs)]
        self._state: dict[Hashable, list[int]] = {}

    def __len__(self) -> int:
        """The number of counters held."""
        return len(self._state)

    def _counter(self, key: Hashable, now_us: int) -> tuple[list[int], int]:
        """The key's counter moved on to the window of ``now_us``, and the µs elapsed in it."""
        period = self._period
        window = now_us // period
        state = self._state.get(key)
        if state is None:
            state = self._state[key] = [window, 0, 0, 0]
        else:
            stored = state[0]
            if stored == window - 1:
                state[0], state[1], state[2] = window, 0, state[1]
            elif stored < window - 1:
                state[0], state[1], state[2] = window, 0, 0
            elif stored > window:
                # A request logged out of order: counted in the newer window.
                window = stored
        elapsed = now_us - window * period
        return state, elapsed if elapsed > 0 else 0

    def _exceeded(self, state: list[int], elapsed: int) -> bool:
        period = self._period
        return state[2] * (period - elapsed) + state[1] * period > self._limit_scaled

    def hit(self, key: Hashable, now_us: int) -> bool:
        """Count one matching request; True when the rule's action applies to it."""
        state, elapsed = self._counter(key, now_us)
        state[1] += 1
        if now_us < state[3]:
            return True
        if self._exceeded(state, elapsed):
            if self.mitigation_timeout_us:
                state[3] = now_us + self.mitigation_timeout_us
            return True
        return False

    def hit_counted_on_response(self, key: Hashable, now_us: int, counted: bool) -> bool:
        """One matching request of a rule whose counting expression reads the response:
        the rule decides on the counter as it stands, and only a request that reached the
        origin and whose response matched (``counted``) increments it afterwards (example
        B). True when the action applies; such a request never reaches the origin and is
        not counted."""
        if self.check_before_answer(key, now_us):
            return True
        if counted:
            self.count_answer(key, now_us)
        return False

    def check_before_answer(self, key: Hashable, now_us: int) -> bool:
        """The first half of :meth:`hit_counted_on_response`: whether the action applies
        to a request on the counter as it stands; nothing is counted."""
        state, elapsed = self._counter(key, now_us)
        if now_us < state[3]:
            return True
        if self._exceeded(state, elapsed):
            if self.mitigation_timeout_us:
                state[3] = now_us + self.mitigation_timeout_us
            return True
        return False

    def count_answer(self, key: Hashable, now_us: int) -> None:
        """The second half: an answer the counting expression matched increments the
        counter (the replay calls it once the request's answer is known)."""
        state, _ = self._counter(key, now_us)
        state[1] += 1

    def sweep(self, now_us: int) -> None:
        """Forget counters that weigh nothing now and whose mitigation has ended."""
        before = now_us // self._period - 1
        state = self._state
        for key in [k for k, s in state.items() if s[0] < before and s[3] <= now_us]:
            del state[key]


class WorkerCounter:
    """The Workers Rate Limiting binding (``limit({key})``), as workerd's local emulation
    implements it (Miniflare, src/workers/ratelimit/ratelimit.worker.ts):

    - one fixed window of the period, 10 or 60 s, numbered floor(ms since the epoch /
      period): windows are aligned to the Unix epoch, not to a key's first call;
    - when a call falls in another window than the last call's, every key's count is
      cleared (one window for the whole binding);
    - a call whose key has already counted ``limit`` answers ``success: false`` and is not
      counted; otherwise it is counted and answers ``success: true``.

    Cloudflare documents the binding's counters as per location (the engine puts the data
    centre in the key) and eventually consistent ("permissive"); this model counts exactly.

    For a limit with ``count_when`` the Worker checks :meth:`spent` before forwarding and
    calls :meth:`count_answer` for a listed answer; its marks are exact here too (in
    Cloudflare they reach another isolate of the location through the Cache API).
    """

    __slots__ = ("_counts", "_epoch", "_period", "_spent", "limit")

    def __init__(self, limit: int, period_s: int) -> None:
        """A binding of ``limit`` calls per key per ``period_s`` (10 or 60) seconds."""
        self.limit = _positive(limit, "limit")
        if period_s not in WORKER_PERIODS_S:
            raise ValueError(
                f"the Workers Rate Limiting binding's period is 10 or 60 seconds, not {period_s!r}."
            )
        self._period = period_s * US_PER_S
        self._epoch: int | None = None
        self._counts: dict[Hashable, int] = {}
        # count_when: key -> µs until which the Worker refuses it before forwarding.
        self._spent: dict[Hashable, int] = {}

    def __len__(self) -> int:
        """The number of counters held."""
        return len(self._counts)

    def hit(self, key: Hashable, now_us: int) -> bool:
        """One ``limit({key})`` call; True when it answers ``success: false``."""
        epoch = now_us // self._period
        if epoch != self._epoch:
            self._epoch = epoch
            self._counts.clear()
        count = self._counts.get(key, 0)
        if count >= self.limit:
            return True
        self._counts[key] = count + 1
        return False

    def spent(self, key: Hashable, now_us: int) -> bool:
        """For a limit with ``count_when``: whether the Worker refuses the key before
        forwarding (limiter.js ``isSpent``), marked by an answer :meth:`count_answer` found
        over the limit; nothing is counted."""
        until = self._spent.get(key)
        return until is not None and now_us < until

    def count_answer(self, key: Hashable, now_us: int) -> None:
        """A listed answer: one ``limit()`` call after the origin answered; over the limit,
        the key is marked spent for one period from now (limiter.js ``countAnswer``)."""
        if self.hit(key, now_us):
            self._spent[key] = now_us + self._period

    def sweep(self, now_us: int) -> None:
        """Clear the counts once their window has ended (the next call would), and the
        spent marks that have run out."""
        epoch = now_us // self._period
        if self._epoch is not None and epoch > self._epoch:
            self._epoch = epoch
            self._counts.clear()
        if self._spent:
            self._spent = {key: until for key, until in self._spent.items() if until > now_us}


def rule_counter(
    period_s: int, requests_per_period: int, mitigation_timeout_s: int, action: Action | str
) -> EdgeCounter:
    """The counters of one Cloudflare rate limiting rule (see :class:`RuleCounter`)."""
    return RuleCounter(period_s, requests_per_period, mitigation_timeout_s, action)


def worker_counter(limit: int, period_s: int) -> EdgeCounter:
    """The counters of one Workers Rate Limiting binding (see :class:`WorkerCounter`)."""
    return WorkerCounter(limit, period_s)
