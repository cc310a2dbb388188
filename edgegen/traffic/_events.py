"""The ``events`` format: applimit's decision-event log (one JSON object per decision
result); only ``hit`` operations are records, each bound to its app limit."""

from __future__ import annotations

from typing import Final

from ..replay._types import Record
from ._fields import Malformed, Parser, load_object, shown, text_field, time_us
from ._options import TrafficOptions

# The cost of a decision event is at most applimit's MAX_COST.
MAX_COST: Final = 1_000_000_000


def events_parser(_: tuple[str, str] | None, options: TrafficOptions) -> Parser:
    """Decision events name their identity: ``user_from`` does not apply to them."""
    default_tier = options.default_tier

    def parse(line: str) -> Record | None:
        obj = load_object(line)
        if obj.get("v") != 1:
            raise Malformed("event version", f"version {shown(obj.get('v'))} is not 1")
        if obj.get("operation", "hit") != "hit":
            return None
        cost = obj.get("cost", 1)
        if not isinstance(cost, int) or isinstance(cost, bool) or not 1 <= cost <= MAX_COST:
            raise Malformed("cost", f"{shown(cost)} is not a whole number from 1 to {MAX_COST:,}")
        tier = obj.get("tier")
        return Record(
            time_us(obj.get("ts")),
            "",
            "",
            "",
            "",
            user=text_field(obj, "identity"),
            tier=tier if isinstance(tier, str) and tier else default_tier,
            limit=text_field(obj, "limit"),
            cost=cost,
        )

    return parse
