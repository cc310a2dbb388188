"""``Memo``: the one bounded memo of the decision path and the web layer.

Everything the limiter remembers to spare work on later calls (a request's plan, the limits
that match a path, a header name decoded, a peer's client address) is kept in a
:class:`Memo`, each with a bound of its own, so that no input a client chooses can grow
memory. Compiled by mypyc (setup.py), with the planning modules that read it.
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

# How often a full memo may start over, in seconds.
RESET = 60.0

_K = TypeVar("_K")
_V = TypeVar("_V")


class Memo(Generic[_K, _V]):
    """A bounded memo: read with ``entries.get``, filled with :meth:`keep`.

    When full it keeps nothing more, and starts over at most once every :data:`RESET`
    seconds. Emptying it whenever it filled would churn when more keys are in use than it
    holds (more active users than entries, ids in paths): every call would plan afresh and
    keep its plan, and the plans, living past a few collections of the young generation,
    would keep the cyclic garbage collector running full collections.

    ``entries`` is one dict for the memo's life, emptied in place and never replaced: a
    hot path may hold it and read it directly (a miss then goes through :meth:`keep`).
    """

    __slots__ = ("entries", "size", "until")

    def __init__(self, size: int) -> None:
        """An empty memo of at most ``size`` entries."""
        self.entries: dict[_K, _V] = {}
        self.size = size
        self.until = 0.0

    def keep(self, key: _K, value: _V) -> bool:
        """Remember ``value`` for ``key``; False when the memo is full and keeps it not."""
        entries = self.entries
        if len(entries) >= self.size:
            now = time.monotonic()
            if now < self.until:
                return False
            entries.clear()
            self.until = now + RESET
        entries[key] = value
        return True
