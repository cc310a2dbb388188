"""Reading recorded traffic in a second process, so that parsing and replaying overlap.

A replay spends about as long parsing a line as deciding it, and both are pure Python: in
one process they add up; with the reader in a child process (``fork``) they run on two
cores, and a day of logs replays in about half the time. The child runs
:func:`~edgegen._traffic.read_traffic` as it is and sends the records in batches of plain
tuples through a pipe (a pipe's buffer is the only queue, so a slow consumer stops the
reader: memory stays bounded); the parent rebuilds them as :class:`Request` values. What
the parent sees is the same as reading in process: the same records in the same order, the
same stats (sent when the child is done) and the same :class:`TrafficError`, raised in the
parent where the child met it.

:func:`open_traffic` decides: in process for standard input, for small files, on a machine
with one core, or where ``fork`` is not available.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ._replay_types import Request
from ._traffic import Traffic, TrafficError, TrafficOptions, TrafficStats, read_traffic

# Records per message: large enough that a message's overhead is small, small enough that
# the parent starts at once.
_BATCH = 4096
# Below this many bytes of files (some 50,000 records) a second process saves little.
_MIN_BYTES = 1024 * 1024


def _child(conn: Connection, paths: list[str], options: TrafficOptions) -> None:
    """Read every record and send them in batches; then ("end", stats) or ("error", ...)."""
    try:
        with read_traffic(paths, options) as traffic:
            batch: list[tuple[Any, ...]] = []
            for record in traffic:
                batch.append(tuple(record))
                if len(batch) >= _BATCH:
                    conn.send_bytes(pickle.dumps(("records", batch), pickle.HIGHEST_PROTOCOL))
                    batch = []
            if batch:
                conn.send_bytes(pickle.dumps(("records", batch), pickle.HIGHEST_PROTOCOL))
        conn.send_bytes(pickle.dumps(("end", traffic.stats), pickle.HIGHEST_PROTOCOL))
    except TrafficError as exc:
        message = ("error", str(exc), exc.file, exc.line)
        conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        conn.close()


class BackgroundTraffic(Traffic):
    """The records of a child process's read, as :class:`Traffic` gives them."""

    def __init__(self, paths: Sequence[str | Path], options: TrafficOptions) -> None:
        # Open and detect in this process first, so a missing file or an unknown format is
        # the same error at the same moment as reading in process; then let the child read.
        with read_traffic(paths, options) as probe:
            stats = probe.stats
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_child, args=(send, [str(p) for p in paths], options), daemon=True
        )
        self._process.start()
        send.close()
        self._conn = receive
        super().__init__(self._received(), stats, [self._stop])

    def _received(self) -> Iterator[Request]:
        make = Request._make
        conn = self._conn
        while True:
            try:
                message = pickle.loads(conn.recv_bytes())  # noqa: S301 (our own child's data)
            except EOFError:
                raise TrafficError(
                    "the process reading the traffic files ended without finishing; "
                    "read them in process with --no-background-read to see why"
                ) from None
            kind = message[0]
            if kind == "records":
                for fields in message[1]:
                    yield make(fields)
            elif kind == "end":
                stats: TrafficStats = message[1]
                self.stats.files[:] = stats.files
                return
            else:
                _, text, file, line = message
                raise TrafficError(text, file=file, line=line)

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
    cores, ``fork``, files only, at least a few MiB), else in this process."""
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
