"""Combining: the script calls of several threads sent in one write on one connection.

In a threaded app (gunicorn's threads, waitress) each decision is one script call, and
each call costs a write, a read and a wake-up on both sides of the socket. With
``Limiter(..., batch=True)`` the calls of threads deciding at the same moment share
them: while one thread's write is in flight, the others queue; when it is answered, the
first of them sends every queued call in one pipelined write and hands each thread its
reply. Redis runs the calls in the order written, one at a time, so each call decides
exactly as it would alone.

No thread of its own: the thread that finds nobody sending leads (it sends its own call
and whatever queued meanwhile); the others follow (each waits on a lock of its own).
When a leader's write is answered it hands the lead to the first thread still queued,
so a leader never sends on behalf of others after its own answer came back.

Deadlines, as without batching (where a call waits up to the timeout for a connection,
then the socket timeout bounds its round trip):

- a call still queued when its timeout has passed is dropped from the queue and fails
  with the builtin :class:`TimeoutError` (the calls ahead of it took the whole timeout:
  the decision follows the failure policy, and the flow logs it as slow unless Redis
  turns out to be down);
- a call in flight is answered by its leader's read, which the socket timeout bounds;
  as a safety net it stops waiting after twice the timeout from its send and fails with
  redis' ``TimeoutError``, an outage, like a socket timeout.

Everything here is about threads; what is written and read is the wire's
(``send`` is :meth:`applimit._wire.SyncWire.batch`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import redis.exceptions

from ._core import ScriptCall
from ._protocol import Replies

# The most calls sent in one write: bounds how long one read of replies may take and
# the buffer it needs; the calls beyond it go in the next write.
MAX_BATCH = 128
# How many writes may be in flight at once, each on a connection of its own. More than
# one lets Redis work on the next write while this one's replies are handed out, but
# splits the queue into smaller writes; with 8 and 32 threads two or three writers
# measured no better than one, within the noise of a shared machine.
WRITERS = 1

_QUEUED = 0  # waiting in the queue
_LEAD = 1  # handed the lead: sends the queue
_SENT = 2  # in a write in flight
_DONE = 3  # its outcome is set


class _Slot:
    """One thread's call: its state, its outcome, and the lock it waits on."""

    __slots__ = ("call", "outcome", "ready", "sent_at", "state")

    def __init__(self, call: ScriptCall) -> None:
        self.call = call
        self.outcome: object = None
        self.state = _QUEUED
        self.sent_at = 0.0
        self.ready: threading.Lock | None = None

    def queue(self) -> threading.Lock:
        """The lock to wait on (only a queued call needs one): held from the start,
        released once the outcome is set or the lead handed over."""
        ready = self.ready = threading.Lock()
        ready.acquire()
        return ready


def _wake(slot: _Slot) -> None:
    """Let a queued thread go: its outcome is set, or it was handed the lead."""
    ready = slot.ready
    if ready is not None:
        ready.release()


class Combiner:
    """Runs one call per thread, the calls of concurrent threads sent together.

    ``send`` writes calls in one write and returns one outcome per call (a reply or the
    failure, as a value); it is only ever called by one thread at a time.
    """

    def __init__(
        self,
        send: Callable[[Sequence[ScriptCall]], Replies],
        *,
        timeout: float,
        writers: int = WRITERS,
    ) -> None:
        """``writers``: how many writes may be in flight at once (each on a connection)."""
        self._send = send
        self._timeout = timeout
        self._writers = writers
        self._lock = threading.Lock()
        # The calls waiting for a leader, oldest first (leaders' own calls are not here).
        self._queue: list[_Slot] = []
        # Threads leading now: sending, or handed the lead and about to.
        self._leading = 0
        self.closed = False

    def run(self, call: ScriptCall) -> object:
        """The call's outcome: its reply, or its failure (as a value, never raised)."""
        slot = _Slot(call)
        with self._lock:
            if self.closed:
                return redis.exceptions.ConnectionError("the limiter was closed")
            lead = self._leading < self._writers
            if lead:
                self._leading += 1
            else:
                slot.queue()
                self._queue.append(slot)
        if not lead and not self._follow(slot):
            return slot.outcome
        self._lead(slot)
        return slot.outcome

    def _follow(self, slot: _Slot) -> bool:
        """Wait for the slot's outcome (False) or for the lead (True)."""
        deadline = time.monotonic() + self._timeout
        ready = slot.ready
        assert ready is not None
        while True:
            left = deadline - time.monotonic()
            if left > 0 and ready.acquire(timeout=left):
                return slot.state == _LEAD
            with self._lock:
                state = slot.state
                if state == _DONE:
                    return False
                if state == _LEAD:
                    # Handed the lead just as the wait ran out: the queue depends on it.
                    return True
                if state == _QUEUED:
                    self._queue.remove(slot)
                    slot.state = _DONE
                    slot.outcome = TimeoutError(
                        f"the calls ahead of this one took the whole timeout "
                        f"({self._timeout} s) on the limiter's batched connection"
                    )
                    return False
                # In flight: the leader's read is bounded by the socket timeout; this is
                # only a safety net against a leader that never comes back.
                net = slot.sent_at + 2 * self._timeout
                if time.monotonic() >= net:
                    slot.state = _DONE
                    slot.outcome = redis.exceptions.TimeoutError(
                        f"Redis did not answer a batched call within {self._timeout} s"
                    )
                    return False
                deadline = net

    def _lead(self, slot: _Slot) -> None:
        """Send the queue (``slot`` first) in one write and hand out the outcomes."""
        with self._lock:
            if self.closed:
                # Handed the lead as the limiter closed: the queue was failed already.
                slot.state = _DONE
                slot.outcome = redis.exceptions.ConnectionError("the limiter was closed")
                self._leading -= 1
                return
            slot.state = _SENT
            if self._queue:
                batch = [slot, *self._queue[: MAX_BATCH - 1]]
                del self._queue[: MAX_BATCH - 1]
                now = time.monotonic()
                for queued in batch:
                    queued.state = _SENT
                    queued.sent_at = now
            else:
                # Alone: the common case when threads seldom decide at the same moment.
                batch = [slot]
        outcomes: Sequence[object] = ()
        try:
            outcomes = self._send([queued.call for queued in batch])
        except BaseException as error:
            # Not a Redis failure (those are values): a bug or an interrupt. The leader
            # raises it; every follower is given it, so that none waits in vain.
            outcomes = [error] * len(batch)
            raise
        finally:
            self._hand_out(slot, batch, outcomes)

    def _hand_out(self, slot: _Slot, batch: list[_Slot], outcomes: Sequence[object]) -> None:
        """Give each thread of ``batch`` its outcome, and the lead to the first queued."""
        if len(outcomes) < len(batch):
            # The wire stopped short (it should not): no call goes unanswered.
            missing = redis.exceptions.ConnectionError("the batched write was not answered")
            outcomes = [*outcomes, *[missing] * (len(batch) - len(outcomes))]
        with self._lock:
            for queued, outcome in zip(batch, outcomes, strict=False):
                # Not one that gave up waiting (its outcome is its timeout).
                if queued.state == _SENT:
                    queued.state = _DONE
                    queued.outcome = outcome
                    if queued is not slot:
                        _wake(queued)
            if self._queue:
                # The lead passes on: the number of leaders stays the same.
                following = self._queue.pop(0)
                following.state = _LEAD
                _wake(following)
            else:
                self._leading -= 1

    def close(self) -> None:
        """Fail every queued call (the limiter was closed); a write in flight is answered
        or fails as the wire's connections close."""
        with self._lock:
            self.closed = True
            # Those handed the lead are not queued: they wake, find the limiter closed,
            # and fail.
            queued, self._queue = self._queue, []
            for waiting in queued:
                waiting.state = _DONE
                waiting.outcome = redis.exceptions.ConnectionError("the limiter was closed")
                _wake(waiting)
