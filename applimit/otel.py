"""OpenTelemetry metrics of a limiter's decisions (``pip install 'edgegen[otel]'``).

::

    from applimit.otel import OpenTelemetryObserver

    limiter = Limiter.from_policy("policy.yaml", observers=[OpenTelemetryObserver()])

Only ``opentelemetry-api`` is needed here: the app configures the SDK and its exporter
(OTLP, Prometheus...) as it does for its other metrics; without one, the API's no-op
meter makes this observer cost next to nothing.

The instruments (attributes as in ``applimit.prometheus``: limit and tier names and fixed
words, never an identity):

``applimit.decisions`` (counter; ``limit``, ``tier``, ``outcome``)
    One per limit result of each ``hit``/``check_request``; peeks are not counted.
``applimit.local_answers`` (counter; ``limit``, ``tier``)
    Results answered without Redis by the denial cache or approximate mode.
``applimit.approx.syncs`` (counter; ``limit``, ``tier``)
    Results of approximate-mode limits that Redis answered (syncs of the local counts).
``applimit.approx.overshoot`` (counter; ``limit``, ``tier``)
    Requests of approximate-mode limits admitted locally that a sync found were over the
    limit, each counted once.
``applimit.redis.duration`` (histogram, seconds)
    The time of each decision that Redis answered.
``applimit.breaker.state`` (observable gauge; ``node``, ``state``)
    1 for the state each circuit breaker is in, 0 for the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics

from ._breaker import BreakerState
from ._observe import Attached, CountingObserver, Outcome

if TYPE_CHECKING:
    from ._shell import LimiterBase

__all__ = ["OpenTelemetryObserver"]

_REDIS_OUTCOMES = frozenset({Outcome.ALLOWED, Outcome.DENIED, Outcome.SHADOW_DENIED})


class OpenTelemetryObserver(CountingObserver):
    """Records every decision of the limiters it is given to as OpenTelemetry metrics."""

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        """Instruments of the meter ``applimit`` of ``meter_provider`` (the global one
        by default)."""
        meter = metrics.get_meter("applimit", meter_provider=meter_provider)
        self.decisions = meter.create_counter(
            "applimit.decisions",
            unit="{result}",
            description="Limit results of the rate limiter's decisions, by limit, tier and "
            "outcome.",
        )
        self.local_answers = meter.create_counter(
            "applimit.local_answers",
            unit="{result}",
            description="Limit results answered without Redis (denial cache, approximate mode).",
        )
        self.approx_syncs = meter.create_counter(
            "applimit.approx.syncs",
            unit="{result}",
            description="Results of approximate-mode limits that Redis answered (syncs).",
        )
        self.approx_overshoot = meter.create_counter(
            "applimit.approx.overshoot",
            unit="{request}",
            description="Requests of approximate-mode limits admitted locally that a sync "
            "found were over the limit.",
        )
        self.redis_duration = meter.create_histogram(
            "applimit.redis.duration",
            unit="s",
            description="Time of the rate limiter's decisions that Redis answered.",
        )
        self._attached = Attached()
        meter.create_observable_gauge(
            "applimit.breaker.state",
            callbacks=[self._breaker_states],
            description="The rate limiter's circuit breaker per Redis node: 1 for its "
            "current state.",
        )
        # Attribute mappings built once per label set: a decision's path only looks up.
        self._attributes: dict[tuple[str, str, str], dict[str, str]] = {}
        self._local: dict[tuple[str, str], dict[str, str]] = {}

    def attach(self, limiter: LimiterBase[Any]) -> None:
        """Called by the limiter it is given to: its breakers are reported."""
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
        """Record one result of a hit, with no event built for it."""
        key = (limit, tier, outcome)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = self._attributes.setdefault(
                key, {"limit": limit, "tier": tier, "outcome": str(outcome)}
            )
        self.decisions.add(1, attributes)
        if local:
            pair = (limit, tier)
            counted = self._local.get(pair)
            if counted is None:
                counted = self._local.setdefault(pair, {"limit": limit, "tier": tier})
            self.local_answers.add(1, counted)
        elif outcome in _REDIS_OUTCOMES:
            if first:
                self.redis_duration.record(latency)
            if approximate:
                pair = (limit, tier)
                synced = self._local.get(pair)
                if synced is None:
                    synced = self._local.setdefault(pair, {"limit": limit, "tier": tier})
                self.approx_syncs.add(1, synced)

    def on_overshoot(self, limit: str, tier: str, count: int) -> None:
        """Record requests an approximate-mode sync found admitted over the limit."""
        pair = (limit, tier)
        attributes = self._local.get(pair)
        if attributes is None:
            attributes = self._local.setdefault(pair, {"limit": limit, "tier": tier})
        self.approx_overshoot.add(count, attributes)

    def _breaker_states(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        for node, current in sorted(self._attached.breaker_states().items()):
            for state in BreakerState:
                yield metrics.Observation(
                    1 if state is current else 0, {"node": node, "state": state.value}
                )
