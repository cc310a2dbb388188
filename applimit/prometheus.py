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
``applimit_redis_duration_seconds``
    A histogram of the time of each decision that Redis answered (the round trip, the
    script and reading its reply): how slow Redis is, as the app sees it.
``applimit_breaker_state{node, state}``
    1 for the state each circuit breaker is in (``closed``, ``open``, ``half_open``),
    0 for the others; ``node`` is ``main`` or a cluster master's ``host:port``. Read at
    scrape time.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ._breaker import BreakerState
from ._observe import Attached, DecisionEvent, Outcome

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

_REDIS_OUTCOMES = frozenset({Outcome.ALLOWED, Outcome.DENIED, Outcome.SHADOW_DENIED})


class PrometheusObserver:
    """Counts every decision of the limiters it is given to, in a Prometheus registry.

    One observer may serve several limiters (pass it to each); build one per registry,
    since the metric names can be registered only once in each.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = REGISTRY,
        *,
        buckets: Sequence[float] = DURATION_BUCKETS,
    ) -> None:
        """Register the metrics in ``registry`` (prometheus_client's default one)."""
        self.decisions = Counter(
            "applimit_decisions",
            "Limit results of the rate limiter's decisions, by limit, tier and outcome.",
            ("limit", "tier", "outcome"),
            registry=registry,
        )
        self.local_answers = Counter(
            "applimit_local_answers",
            "Limit results answered without Redis (denial cache, approximate mode).",
            ("limit", "tier"),
            registry=registry,
        )
        self.redis_duration = Histogram(
            "applimit_redis_duration_seconds",
            "Time of the rate limiter's decisions that Redis answered.",
            buckets=buckets,
            registry=registry,
        )
        self._attached = Attached()
        # The labelled children, looked up once: .labels() takes a lock and builds a key
        # on every call, which a decision's path should not pay.
        self._children: dict[tuple[str, str, str], Any] = {}
        self._local: dict[tuple[str, str], Any] = {}
        if registry is not None:
            registry.register(_BreakerCollector(self))

    def attach(self, limiter: LimiterBase[Any]) -> None:
        """Called by the limiter it is given to: its breakers are reported on scrape."""
        self._attached.add(limiter)

    def on_decision(self, event: DecisionEvent) -> None:
        """Count one limit result."""
        if event.operation == "peek":
            return
        key = (event.limit, event.tier, event.outcome.value)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, self.decisions.labels(*key))
        child.inc()
        if event.answered_locally:
            pair = (event.limit, event.tier)
            local = self._local.get(pair)
            if local is None:
                local = self._local.setdefault(pair, self.local_answers.labels(*pair))
            local.inc()
        elif event.first and event.outcome in _REDIS_OUTCOMES:
            self.redis_duration.observe(event.latency)

    def breaker_states(self) -> dict[str, BreakerState]:
        """The worst state of each node's breaker over the attached limiters."""
        return self._attached.breaker_states()


class _BreakerCollector(Collector):
    """``applimit_breaker_state``, read from the attached limiters at each scrape."""

    def __init__(self, observer: PrometheusObserver) -> None:
        self._observer = weakref.ref(observer)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One series per node and state: 1 for the state the breaker is in."""
        family = GaugeMetricFamily(
            "applimit_breaker_state",
            "The rate limiter's circuit breaker per Redis node: 1 for its current state.",
            labels=("node", "state"),
        )
        observer = self._observer()
        states = {} if observer is None else observer.breaker_states()
        for node, current in sorted(states.items()):
            for state in BreakerState:
                family.add_metric((node, state.value), 1.0 if state is current else 0.0)
        yield family
