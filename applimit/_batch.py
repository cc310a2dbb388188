"""Combining: the script calls of several threads sent in one write on one connection.

In a threaded app (gunicorn's threads, waitress) each decision is one script call, and
each call costs a write, a read and a wake-up on both sides of the socket. With
``Limiter(..., batch=True)`` the calls of threads deciding at the same moment share
them: while one thread's write is in flight, the others queue; when it is answered, the
first of them sends every queued call in one pipelined write and hands each thread its
reply. Redis runs the calls in the order written, one at a time, so each call decides
exactly as it would alone.

No thread of its own: the thread that finds nobody sending sends its call at once; the
others queue (each waits on a lock of its own). When a write is answered, its sender
hands the lead to the first thread still queued, which sends every queued call, its own
first; so a thread never sends on behalf of others after its own answer came back.

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

from ._calls import ScriptCall
from ._protocol import Replies

# The most calls sent in one write: bounds how long one read of replies may take and
# the buffer it needs; the calls beyond it go in the next write.
MAX_BATCH = 128
# How many writes may be in flight at once, each on a connection of its own: more would let
# Redis work on the next write meanwhile, but split the queue into smaller writes, and
# measured no better (docs/benchmarks-compare.md, "Why each speed trick stays").
WRITERS = 1

_QUEUED = 0  # waiting in the queue
_LEAD = 1  # handed the lead: sends the queue
_SENT = 2  # in a write in flight
_DONE = 3  # its outcome is set


class _Slot:
    """A queued thread's call: its state, its outcome, and the lock it waits on."""

    __slots__ = ("call", "outcome", "ready", "sent_at", "state")

    def __init__(self, call: ScriptCall) -> None:
        self.call = call
        self.outcome: object = None
        self.state = _QUEUED
        self.sent_at = 0.0
        # Held from the start: released once the outcome is set or the lead handed over.
        self.ready = threading.Lock()
        self.ready.acquire()


class Combiner:
    """Runs one call per thread, the calls of concurrent threads sent together.

    ``send`` writes calls in one write and returns one outcome per call (a reply or the
    failure, as a value); at most ``writers`` threads call it at once.

    The queue only fills while every writer is busy: a writer that finishes hands the
    lead to the first queued thread, and a thread that finds a writer free leads at once.
    So a thread that finds a writer free also finds the queue empty, and sends its call
    alone, with no bookkeeping beyond a count (most decisions, when threads seldom decide
    at the same moment).
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
        with self._lock:
            if self.closed:
                return redis.exceptions.ConnectionError("the limiter was closed")
            if self._leading < self._writers:
                self._leading += 1
                slot = None
            else:
                slot = _Slot(call)
                self._queue.append(slot)
        if slot is None:
            # A writer was free, so the queue is empty: this call goes alone.
            outcomes: Sequence[object] = ()
            try:
                outcomes = self._send((call,))
            finally:
                with self._lock:
                    self._pass_on()
            return outcomes[0] if outcomes else _unanswered()
        try:
            lead = self._follow(slot)
        except BaseException:
            # Interrupted while waiting (KeyboardInterrupt in the main thread): leave the
            # queue as if never in it, and pass on a lead handed over meanwhile, or
            # every later call would queue behind a leader that never comes.
            self._abandon(slot)
            raise
        if lead:
            self._lead(slot)
        return slot.outcome

    def _abandon(self, slot: _Slot) -> None:
        """Take a thread that stopped waiting out of the queue and the lead."""
        with self._lock:
            if slot.state == _QUEUED:
                self._queue.remove(slot)
            elif slot.state == _LEAD:
                self._pass_on()
            slot.state = _DONE

    def _follow(self, slot: _Slot) -> bool:
        """Wait for the slot's outcome (False) or for the lead (True)."""
        deadline = time.monotonic() + self._timeout
        ready = slot.ready
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
            batch = [slot, *self._queue[: MAX_BATCH - 1]]
            del self._queue[: MAX_BATCH - 1]
            now = time.monotonic()
            for queued in batch:
                queued.state = _SENT
                queued.sent_at = now
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
            outcomes = [*outcomes, *[_unanswered()] * (len(batch) - len(outcomes))]
        with self._lock:
            for queued, outcome in zip(batch, outcomes, strict=False):
                # Not one that gave up waiting (its outcome is its timeout).
                if queued.state == _SENT:
                    queued.state = _DONE
                    queued.outcome = outcome
                    if queued is not slot:
                        queued.ready.release()
            self._pass_on()

    def _pass_on(self) -> None:
        """A write was answered: hand the lead to the first queued thread, or free the
        writer (under the lock)."""
        if self._queue:
            # The lead passes on: the number of leaders stays the same.
            following = self._queue.pop(0)
            following.state = _LEAD
            following.ready.release()
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
                waiting.ready.release()


def _unanswered() -> redis.exceptions.ConnectionError:
    """The outcome of a call the wire gave no outcome for (it should not happen): no call
    goes unanswered."""
    return redis.exceptions.ConnectionError("the batched write was not answered")
