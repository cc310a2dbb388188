"""A decision-event log: one NDJSON line per ``hit`` result, for replaying traffic.

Each line is exactly::

    {"v": 1, "ts": 1764748800.123, "limit": "api", "tier": "free", "identity": "9f2c...",
     "cost": 1, "outcome": "denied", "operation": "hit"}

``ts`` is ``time.time()`` when the observer heard of the result; ``identity`` the event's
``identity_hash`` (a keyed hash per process, or the raw counter key with
``log_identities=True``). Peeks are left out: they consume nothing, so a replay has
nothing to count for them.

An observer runs inline on the decision's path, so lines are only appended to a list
under a lock; they are written out (one ``write`` of them all) every ``flush_every``
lines, when ``flush_interval`` seconds have passed since the last write, on
:meth:`EventLogObserver.flush` and on :meth:`EventLogObserver.close` (also run at exit).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from pathlib import Path
from typing import IO, Self

from ._observe import DecisionEvent

__all__ = ["EventLogObserver"]

# The format's version: a reader refuses a line of a version it does not know.
VERSION = 1


class EventLogObserver:
    """Writes one NDJSON object per ``hit`` result to a file or a text stream.

    ``target`` is a path (opened for appending, created if missing; closed by
    :meth:`close`) or an open text stream (written to and flushed, never closed here).
    Thread-safe: one observer may serve several limiters and threads; lines are whole
    and in the order their decisions were told.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[str],
        *,
        flush_every: int = 1000,
        flush_interval: float = 1.0,
    ) -> None:
        """Log to ``target``; write out every ``flush_every`` lines or ``flush_interval``
        seconds, whichever comes first (checked when a result arrives)."""
        if flush_every < 1 or flush_interval < 0:
            raise ValueError(
                f"flush_every is {flush_every} and flush_interval {flush_interval}; use "
                "flush_every >= 1 and flush_interval >= 0 (seconds between writes)."
            )
        self.flush_every = flush_every
        self.flush_interval = flush_interval
        self._stream: IO[str]
        if isinstance(target, str | os.PathLike):
            self._stream = Path(target).open("a", encoding="utf-8")  # noqa: SIM115 (closed by close())
            self._owned = True
        else:
            self._stream = target
            self._owned = False
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._written = time.time()
        self._closed = False
        # The head of each line per (limit, tier, outcome), encoded once.
        self._heads: dict[tuple[str, str, str], tuple[str, str]] = {}
        atexit.register(self.close)

    def on_decision(self, event: DecisionEvent) -> None:
        """Append the line of one ``hit`` result; write out when due."""
        if event.operation != "hit":
            return
        limit, tier, outcome, cost = event.limit, event.tier, event.outcome, event.cost
        ts = time.time()
        key = (limit, tier, outcome)
        parts = self._heads.get(key)
        if parts is None:
            parts = self._heads.setdefault(
                key,
                (
                    f', "limit": {json.dumps(limit)}, "tier": {json.dumps(tier)}, "identity": ',
                    f', "outcome": {json.dumps(str(outcome))}, "operation": "hit"}}\n',
                ),
            )
        head, tail = parts
        # json.dumps: with log_identities=True the identity is the raw counter key.
        identity = json.dumps(event.identity_hash)
        line = f'{{"v": 1, "ts": {ts!r}{head}{identity}, "cost": {cost}{tail}'
        with self._lock:
            if self._closed:
                return
            lines = self._lines
            lines.append(line)
            # The wall clock serves for the interval too: a clock step only moves one write.
            if len(lines) >= self.flush_every or ts - self._written >= self.flush_interval:
                self._write()

    def flush(self) -> None:
        """Write out every line held, and flush the stream."""
        with self._lock:
            if not self._closed:
                self._write()

    def close(self) -> None:
        """Write out every line held; close the file if this observer opened it. Later
        results are dropped. Safe to call more than once."""
        with self._lock:
            if self._closed:
                return
            self._write()
            self._closed = True
            if self._owned:
                self._stream.close()
        atexit.unregister(self.close)

    def __enter__(self) -> Self:
        """Use as ``with EventLogObserver(path) as log:``; closes on exit."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close (see :meth:`close`)."""
        self.close()

    def _write(self) -> None:
        """Write the held lines (the lock is held)."""
        self._written = time.time()
        if not self._lines:
            return
        text = "".join(self._lines)
        self._lines = []
        self._stream.write(text)
        self._stream.flush()
