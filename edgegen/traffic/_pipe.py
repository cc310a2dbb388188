"""Reading recorded traffic in a second process, so that parsing and replaying overlap.

A replay spends about as long parsing a line as deciding it, and both are pure Python: in
one process they add up; with the reader in a child process (``fork``) they run on two
cores, and a day of logs replays in about half the time. The child runs
:func:`~edgegen.traffic._read.read_traffic` as it is and sends the records in batches of plain
tuples through a pipe (a pipe's buffer is the only queue, so a slow consumer stops the
reader: memory stays bounded); the parent rebuilds them as :class:`Record` values. What
the parent sees is the same as reading in process: the same records in the same order, the
same stats (sent when the child is done) and the same :class:`TrafficError`, raised in the
parent where the child met it. Each batch carries how far the child has read the files,
which is what the parent's :meth:`~edgegen.traffic._read.Traffic.position` answers (a progress
report's estimate: the child reads at most a pipe's buffer ahead).

Only the child opens the files, and each once: it opens them and tells their formats first
and answers "ready" (or the error), which the parent waits for, so a missing file or an
unknown format still fails when the traffic is opened. A named pipe, a process
substitution (``<(zcat day.gz)``, a ``/dev/fd/N``) or any other input that cannot be read
twice is read once, by the child, and its format is told from the lines it buffered.

The child never outlives the parent: it closes its inherited copy of the pipe's read end
(so a write after the parent is gone fails with a broken pipe instead of filling a pipe
nobody reads), and on Linux asks the kernel to kill it when the parent dies
(``PR_SET_PDEATHSIG``), which also ends a child blocked reading a named pipe.

:func:`open_traffic` decides: in process for standard input, for small files, on a machine
with one core, or where ``fork`` is not available.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

from ..replay._types import Record
from ._options import TrafficError, TrafficOptions
from ._read import Position, Traffic, TrafficStats, read_traffic

# Records per message: large enough that a message's overhead is small, small enough that
# the parent starts at once.
_BATCH = 4096
# Below this many bytes of files (some 50,000 records) a second process saves little.
_MIN_BYTES = 1024 * 1024
# prctl(2): deliver a signal to this process when the thread that forked it ends.
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int, *, by_signal: bool) -> None:
    """Have the kernel kill this process when its parent dies (Linux), and end now if the
    parent is already gone (it may have died before the request was made).

    ``by_signal`` is False when the parent forked from a thread other than its main one:
    the kernel sends the signal when that thread ends, not the process, so the child then
    relies on the broken pipe alone.
    """
    if by_signal and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _send(conn: Connection, message: tuple[Any, ...]) -> None:
    conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))


def _child(
    conn: Connection,
    inherited: Connection,
    paths: list[str],
    options: TrafficOptions,
    *,
    parent: int,
    by_signal: bool,
) -> None:
    """Open the files and say "ready" with their stats and position (or the error); then
    send every record in batches, each with the position reached, then ("end", stats,
    position) or ("error", ...)."""
    # The fork copied the parent's read end: holding it, this process would never see the
    # pipe break, and would block for ever on a full pipe once the parent is gone.
    inherited.close()
    _die_with_parent(parent, by_signal=by_signal)
    try:
        with read_traffic(paths, options) as traffic:
            _send(conn, ("ready", traffic.stats, traffic.position()))
            batch: list[tuple[Any, ...]] = []
            for record in traffic:
                batch.append(tuple(record))
                if len(batch) >= _BATCH:
                    _send(conn, ("records", batch, traffic.position()))
                    batch = []
            if batch:
                _send(conn, ("records", batch, traffic.position()))
        _send(conn, ("end", traffic.stats, traffic.position()))
    except TrafficError as exc:
        _send(conn, ("error", str(exc), exc.file, exc.line))
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        conn.close()


class BackgroundTraffic(Traffic):
    """The records of a child process's read, as :class:`Traffic` gives them."""

    def __init__(self, paths: Sequence[str | Path], options: TrafficOptions) -> None:
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        by_signal = threading.current_thread() is threading.main_thread()
        self._process = context.Process(
            target=_child,
            args=(send, receive, [str(p) for p in paths], options),
            kwargs={"parent": os.getpid(), "by_signal": by_signal},
            daemon=True,
        )
        self._process.start()
        send.close()
        self._conn = receive
        try:
            # The child opens the files and tells their formats before anything is read,
            # so its errors come now, as reading in process gives them.
            message = self._message()
            if message[0] != "ready":
                self._raise(message)
        except BaseException:
            self._stop()
            raise
        # Where the child's reading has got, as of the last batch received.
        self._reached: Position = message[2]
        super().__init__(self._received(), message[1], [self._stop], self._where)

    def _where(self) -> Position:
        return self._reached

    def _message(self) -> tuple[Any, ...]:
        try:
            message: tuple[Any, ...] = pickle.loads(self._conn.recv_bytes())  # noqa: S301 (our own child's data)
        except (EOFError, OSError):
            raise TrafficError(
                "the process reading the traffic files ended without finishing; "
                "read them in process with --no-background-read to see why"
            ) from None
        return message

    @staticmethod
    def _raise(message: tuple[Any, ...]) -> NoReturn:
        _, text, file, line = message
        raise TrafficError(text, file=file, line=line)

    def _received(self) -> Iterator[Record]:
        make = Record._make
        while True:
            message = self._message()
            kind = message[0]
            if kind == "records":
                self._reached = message[2]
                for fields in message[1]:
                    yield make(fields)
            elif kind == "end":
                self._reached = message[2]
                stats: TrafficStats = message[1]
                self.stats.files[:] = stats.files
                return
            else:
                self._raise(message)

    def _stop(self) -> None:
        self._conn.close()
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def open_traffic(
    paths: Sequence[str | Path], options: TrafficOptions, *, background: bool = True
) -> Traffic:
    """The records of ``paths``: read in a child process when that is worth it (several
    cores, ``fork``, no standard input, at least a few MiB of regular files), else in this
    process. Either way every input is opened and read once."""
    if (
        not background
        or _cores() < 2
        or "fork" not in multiprocessing.get_all_start_methods()
        or any(str(path) == "-" for path in paths)
    ):
        return read_traffic(paths, options)
    try:
        size = sum(Path(path).stat().st_size for path in paths)
    except OSError:
        return read_traffic(paths, options)  # it says which file is missing
    if size < _MIN_BYTES:
        return read_traffic(paths, options)
    return BackgroundTraffic(paths, options)
