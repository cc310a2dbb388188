"""Prometheus metrics of a limiter's decisions (``pip install 'edgegen[prometheus]'``).

::

    from applimit.prometheus import PrometheusObserver

    limiter = Limiter.from_policy("policy.yaml", observers=[PrometheusObserver()])
    # expose prometheus_client's registry, e.g. prometheus_client.make_asgi_app()

The metrics (labels are the policy's limit and tier names and fixed words: never an
identity, so the number of series is bounded by the policy):

``applimit_decisions_total{limit, tier, outcome}``
    One per limit result of each ``hit``/``check_request`` (peeks consume nothing and are
    not counted). ``outcome`` is ``allowed``, ``denied``, ``shadow_denied``,
    ``degraded_allowed`` or ``degraded_denied``.
``applimit_local_answers_total{limit, tier}``
    Results answered without Redis by the denial cache or approximate mode.
``applimit_approx_syncs_total{limit, tier}``
    Results of approximate-mode limits that Redis answered (a sync of the local counts);
    with ``applimit_local_answers_total``, how much of such a limit Redis still sees.
``applimit_approx_overshoot_total{limit, tier}``
    Requests (cost units) of approximate-mode limits that this instance admitted locally
    and a later sync found were over the limit: what approximate mode admitted beyond an
    exact limiter, each counted once (documented bound: instances x (sync_every - 1) per
    window).
``applimit_redis_duration_seconds``
    A histogram of the time of each decision that Redis answered (the round trip, the
    script and reading its reply): how slow Redis is, as the app sees it.
``applimit_breaker_state{node, state}``
    1 for the state each circuit breaker is in (``closed``, ``open``, ``half_open``),
    0 for the others; ``node`` is ``main`` or a cluster master's ``host:port``. Read at
    scrape time.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ._breaker import BreakerState
from ._observe import Attached, CountingObserver, Outcome

if TYPE_CHECKING:
    from ._shell import LimiterBase

__all__ = ["DURATION_BUCKETS", "PrometheusObserver"]

# Seconds: a decision on a healthy local Redis takes well under a millisecond; the top
# buckets catch the ones that ran into the policy's timeout.
DURATION_BUCKETS: Sequence[float] = (
    0.0002,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)

_ALLOWED = Outcome.ALLOWED
_REDIS_OUTCOMES = frozenset({Outcome.ALLOWED, Outcome.DENIED, Outcome.SHADOW_DENIED})


# Bound once: read on every decision.
_bisect_left = bisect.bisect_left


class PrometheusObserver(Collector, CountingObserver):
    """Counts every decision of the limiters it is given to, in a Prometheus registry.

    One observer may serve several limiters (pass it to each); build one per registry,
    since the metric names can be registered only once in each.

    It is its own collector: a decision only adds to plain counts under one lock (a
    prometheus_client Counter child and Histogram would take a lock each, and cost more
    than the rest of an async decision's bookkeeping); the metric families are built
    from the counts at scrape time.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = REGISTRY,
        *,
        buckets: Sequence[float] = DURATION_BUCKETS,
    ) -> None:
        """Register the metrics in ``registry`` (prometheus_client's default one; None
        registers nothing, for a registry of your own: ``registry.register(observer)``)."""
        self._bounds = sorted(float(b) for b in buckets if not math.isinf(b))
        self._lock = threading.Lock()
        self._decisions: dict[tuple[str, str, str], int] = {}
        self._local: dict[tuple[str, str], int] = {}
        self._syncs: dict[tuple[str, str], int] = {}
        self._overshoot: dict[tuple[str, str], int] = {}
        # One count per bucket (not cumulative; +Inf last), the sum of the observations.
        self._buckets = [0] * (len(self._bounds) + 1)
        self._sum = 0.0
        self._attached = Attached()
        if registry is not None:
            registry.register(self)

    def attach(self, limiter: LimiterBase[Any]) -> None:
        """Called by the limiter it is given to: its breakers are reported on scrape."""
        self._attached.add(limiter)

    def _count_result(  # noqa: PLR0917 (the fields, in order; see applimit._observe.CountingObserver)
        self,
        limit: str,
        tier: str,
        outcome: Outcome,
        latency: float,
        local: bool,
        first: bool,
        approximate: bool,
    ) -> None:
        """Count one result of a hit: what runs on every decision, so as little as can be
        under the lock (the bucket is found before taking it)."""
        # An Outcome is a str: the key holds it as is, and the label is written from it.
        key = (limit, tier, outcome)
        decisions = self._decisions
        if local:
            pair = (limit, tier)
            with self._lock:
                decisions[key] = decisions.get(key, 0) + 1
                self._local[pair] = self._local.get(pair, 0) + 1
            return
        redis = outcome in _REDIS_OUTCOMES
        if redis and first:
            self._count_timed(limit, tier, latency, approximate, outcome)
            return
        with self._lock:
            decisions[key] = decisions.get(key, 0) + 1
            if redis and approximate:
                pair = (limit, tier)
                self._syncs[pair] = self._syncs.get(pair, 0) + 1

    def _count_timed(
        self,
        limit: str,
        tier: str,
        latency: float,
        approximate: bool,
        outcome: Outcome = _ALLOWED,
    ) -> None:
        """Count the first result of a decision Redis answered, with its latency: for the
        commonest case (one result, admitted) the notifier calls it directly, with nothing
        left to decide."""
        key = (limit, tier, outcome)
        bucket = _bisect_left(self._bounds, latency)
        lock = self._lock
        # acquire/release rather than `with`: the same guarantee (release in finally),
        # without the context manager's two method calls, on every decision.
        lock.acquire()
        try:
            decisions = self._decisions
            decisions[key] = decisions.get(key, 0) + 1
            self._buckets[bucket] += 1
            self._sum += latency
            if approximate:
                pair = (limit, tier)
                self._syncs[pair] = self._syncs.get(pair, 0) + 1
        finally:
            lock.release()

    def on_overshoot(self, limit: str, tier: str, count: int) -> None:
        """Count requests an approximate-mode sync found admitted over the limit."""
        pair = (limit, tier)
        with self._lock:
            self._overshoot[pair] = self._overshoot.get(pair, 0) + count

    def breaker_states(self) -> dict[str, BreakerState]:
        """The worst state of each node's breaker over the attached limiters."""
        return self._attached.breaker_states()

    def describe(self) -> Iterator[Metric]:
        """The metric names, for the registry's duplicate check (no counts read)."""
        return self._families(empty=True)

    def collect(self) -> Iterator[Metric]:
        """The metrics as they are now."""
        return self._families(empty=False)

    def _families(self, *, empty: bool) -> Iterator[Metric]:
        with self._lock:
            decisions = {} if empty else dict(self._decisions)
            local = {} if empty else dict(self._local)
            syncs = {} if empty else dict(self._syncs)
            overshoot = {} if empty else dict(self._overshoot)
            buckets = list(self._buckets)
            total = self._sum
        family = CounterMetricFamily(
            "applimit_decisions",
            "Limit results of the rate limiter's decisions, by limit, tier and outcome.",
            labels=("limit", "tier", "outcome"),
        )
        for (limit, tier, outcome), value in sorted(decisions.items()):
            family.add_metric((limit, tier, str(outcome)), value)
        yield family
        family = CounterMetricFamily(
            "applimit_local_answers",
            "Limit results answered without Redis (denial cache, approximate mode).",
            labels=("limit", "tier"),
        )
        for pair, value in sorted(local.items()):
            family.add_metric(pair, value)
        yield family
        family = CounterMetricFamily(
            "applimit_approx_syncs",
            "Results of approximate-mode limits that Redis answered: the syncs of the "
            "counts kept locally.",
            labels=("limit", "tier"),
        )
        for pair, value in sorted(syncs.items()):
            family.add_metric(pair, value)
        yield family
        family = CounterMetricFamily(
            "applimit_approx_overshoot",
            "Requests of approximate-mode limits admitted locally that a sync found were "
            "over the limit.",
            labels=("limit", "tier"),
        )
        for pair, value in sorted(overshoot.items()):
            family.add_metric(pair, value)
        yield family
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip([*self._bounds, math.inf], buckets, strict=True):
            running += count
            cumulative.append(("+Inf" if math.isinf(bound) else repr(bound), running))
        histogram = HistogramMetricFamily(
            "applimit_redis_duration_seconds",
            "Time of the rate limiter's decisions that Redis answered.",
        )
        histogram.add_metric([], cumulative, total)
        yield histogram
        gauge = GaugeMetricFamily(
            "applimit_breaker_state",
            "The rate limiter's circuit breaker per Redis node: 1 for its current state.",
            labels=("node", "state"),
        )
        states = {} if empty else self.breaker_states()
        for node, current in sorted(states.items()):
            for state in BreakerState:
                gauge.add_metric((node, state.value), 1.0 if state is current else 0.0)
        yield gauge
