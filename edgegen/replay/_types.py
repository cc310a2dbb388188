"""The values a replay passes between its parts: a recorded request and the layer models.

A replay reads recorded requests (``edgegen.traffic``), runs them through the policy's layers in
the order traffic meets them (Cloudflare rules, the Worker, the app: ``_models``
holds each layer's counting model, ``_engine`` drives them) and reports what each layer
refused (``_report``). These types are the contract between those modules; they
hold no behaviour.

Time is integer microseconds since the Unix epoch everywhere in a replay, as it is in the
app's scripts (Redis TIME in µs), so the app models can be compared with the Lua exactly.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple, Protocol

from edgegen_policy import Verdict


class Record(NamedTuple):
    """One recorded request, as the reader could reconstruct it.

    ``path`` is the path as logged (it may carry percent-encoding; each layer normalises it
    the way that layer does). ``host`` is lower case without a port, "" when the log has
    none. ``user`` is the authenticated identity when the log or the options name one;
    ``tier`` its tier when known (the replay falls back to the default tier).
    ``authenticated`` says whether the request carried a credential as the policy's
    ``authenticated_when`` defines it; None when the log cannot tell (the replay then takes
    ``user is not None``). ``colo`` is Cloudflare's data centre code when logged. ``status``
    is the status the origin answered when logged (informational only).

    ``limit`` is set only for records read from the app's decision-event log: such a record
    is one hit of that app limit (by ``user``, already hashed, in ``tier``, of ``cost``)
    recorded behind the edge, so the replay gives it to that limit alone and to no edge
    layer.

    A named tuple rather than a frozen dataclass: a reader builds one per line, and a
    tuple is built several times faster (a frozen dataclass sets each field through
    ``object.__setattr__``); it is just as immutable, and ``_replace`` copies one.
    """

    at_us: int
    method: str
    host: str
    path: str
    ip: str
    user: str | None = None
    tier: str | None = None
    authenticated: bool | None = None
    colo: str | None = None
    status: int | None = None
    limit: str | None = None
    cost: int = 1


class AppModel(Protocol):
    """One app limit rate of one algorithm, for every identity (``key``) it counts.

    Its decisions equal ``applimit/lua``'s for the same calls at the same times: ``peek``
    is phase 1 of ``decide.lua`` (what this cost finds now; writes nothing) and ``record``
    phase 2 (count an admitted cost), an ``edgegen_policy.Counter`` for
    ``edgegen_policy.decide``, which applies a request checked against several limits to
    all of them only when every enforced check admits it, as the script does. ``check``
    and ``apply`` are the same two phases as plain answers.
    """

    def peek(self, key: Hashable, now: int, cost: int) -> Verdict: ...

    def record(self, key: Hashable, verdict: Verdict, now: int, cost: int) -> None: ...

    def check(self, key: Hashable, now_us: int, cost: int) -> bool: ...

    def apply(self, key: Hashable, now_us: int, cost: int) -> None: ...

    def sweep(self, now_us: int) -> None:
        """Forget every key whose state no longer changes any decision at ``now_us``, so
        memory is bounded by the identities active within a period, not by the log."""
        ...


class EdgeCounter(Protocol):
    """One Cloudflare rule's or one Worker binding's counters, for every counter ``key``
    (the value combination of its characteristics, data centre included).

    ``hit`` counts one request and answers True when the layer's action applies to it
    (the rule mitigates it, or the binding's ``limit()`` answers ``success: false``).
    """

    def hit(self, key: Hashable, now_us: int) -> bool: ...

    def sweep(self, now_us: int) -> None: ...
