"""The binding result of a decision is the one the definition names, however it is found.

``Decision.binding`` (and the decision's scalar fields) come from the enforced result with
the fewest remaining, then the longest reset, the first in policy order among equals; when
denied, from the denying result with the longest wait. The admitted case is found in one
loop (``_decision._scan``); this holds it to the definition written with min() and max().
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from applimit import LimitResult
from applimit._decision import combine


def _wait(result: LimitResult) -> float:
    return math.inf if result.retry_after is None else result.retry_after


def _reference(results: list[LimitResult]) -> LimitResult:
    """The binding result by its definition."""
    enforced = [r for r in results if not r.shadow]
    allowed = all(r.allowed for r in enforced)
    if not allowed:
        return max([r for r in enforced if not r.allowed], key=_wait)
    return min(enforced or results, key=lambda r: (r.remaining, -r.reset_after))


resets = st.one_of(st.sampled_from([0.0, 1.0, 1.0, 60.0, math.inf]), st.floats(0.0, 100.0))
result = st.builds(
    LimitResult,
    name=st.sampled_from(["a", "b", "c"]),
    tier=st.just("free"),
    algorithm=st.just("gcra"),
    quota=st.integers(1, 10),
    window=st.just(60.0),
    allowed=st.booleans(),
    consumed=st.booleans(),
    remaining=st.integers(0, 3),
    reset_after=resets,
    retry_after=st.one_of(st.none(), resets),
    shadow=st.booleans(),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(result, min_size=2, max_size=5))
def test_the_binding_result_is_the_one_the_definition_names(results: list[LimitResult]) -> None:
    """Same object as the definition picks (ties to the first in order), and the decision's
    scalar fields are its."""
    decision = combine(results)
    expected = _reference(results)
    assert decision.binding is expected
    assert decision.limit == expected.quota
    assert decision.remaining == expected.remaining
    assert decision.policy == expected.name
