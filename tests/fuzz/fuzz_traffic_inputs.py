"""A coverage-guided fuzz target (atheris) for the traffic readers of ``edgegen replay``.

Each input is split into a selector byte and data; the data is written to a file and read
by one reader: each format named (combined, logpush, events, ndjson, csv), the format told
from the file's first lines, or that gzip-compressed. Every record read then goes through a
replay of the example policy and its report, as ``edgegen replay`` would take it.

A reader may return records or raise the error it documents (TrafficError); anything else
is a crash that atheris reports with the input. So is a reader over its budget: CPU time
and traced memory each have a fixed part and a part per byte of input (the constants below,
stated in docs/replay.md under "Hostile input"), whatever the bytes are.

The hypothesis tests in tests/edgegen/test_fuzz_traffic.py run in the suite; this target is
for longer runs, with atheris installed (``pip install atheris``)::

    .venv/bin/python tests/fuzz/fuzz_traffic_inputs.py -runs=200000 -max_len=8192
"""

from __future__ import annotations

import contextlib
import gzip
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import atheris

with atheris.instrument_imports():
    import edgegen_policy as policy

    from edgegen.replay._engine import Replay
    from edgegen.replay._report import to_json, to_text
    from edgegen.traffic._fields import MAX_TIME_US
    from edgegen.traffic._options import FORMATS, TrafficError, TrafficOptions
    from edgegen.traffic._read import read_traffic

# The budget of one read, whatever the input (docs/replay.md, "Hostile input"): CPU seconds,
# a fixed part and parts per line and per byte; traced bytes, a fixed part and per byte.
# The read is traced while timed, which slows it: the time is compared against twice the
# budget.
TIME_BASE_S = 0.25
TIME_PER_LINE_S = 50e-6
TIME_PER_BYTE_S = 1e-6
MEMORY_BASE = 4 << 20
MEMORY_PER_BYTE = 64

_ROOT = Path(__file__).resolve().parents[2]
_POLICY = policy.load(_ROOT / "examples" / "policy.yaml")
_DIRECTORY = Path(tempfile.mkdtemp(prefix="fuzz-traffic-"))


def _read(data: bytes, fmt: str | None, *, packed: bool = False) -> None:
    """Read ``data`` as ``fmt`` (None: told from the file), within the budget, and replay
    what it gives."""
    path = _DIRECTORY / "input"
    path.write_bytes(gzip.compress(data, mtime=0) if packed else data)
    options = TrafficOptions(
        format=fmt,
        user_from={"logpush": "header:x-user", "combined": "user", "ndjson": "user"}.get(fmt or ""),
        authenticated_headers=("authorization",),
    )
    tracemalloc.start()
    started = time.process_time()
    try:
        _read_and_replay(path, options)
    finally:
        elapsed = time.process_time() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    lines = data.count(b"\n") + 1
    budget = TIME_BASE_S + TIME_PER_LINE_S * lines + TIME_PER_BYTE_S * len(data)
    assert elapsed <= 2 * budget, (elapsed, len(data))
    assert peak <= MEMORY_BASE + MEMORY_PER_BYTE * len(data), (peak, len(data))


def _read_and_replay(path: Path, options: TrafficOptions) -> None:
    engine = Replay(_POLICY)
    with contextlib.suppress(TrafficError), read_traffic([path], options) as traffic:
        for record in traffic:
            assert 0 <= record.at_us <= MAX_TIME_US
            engine.feed(record)
        # What a report prints must be printable: UTF-8 without lone surrogates.
        lines = traffic.stats.describe()
        "\n".join(lines).encode("utf-8")
        result = engine.result()
        json.dumps(to_json(result), ensure_ascii=False).encode("utf-8")
        to_text(result, lines).encode("utf-8")


def _combined(data: bytes) -> None:
    _read(data, "combined")


def _logpush(data: bytes) -> None:
    _read(data, "logpush")


def _events(data: bytes) -> None:
    _read(data, "events")


def _ndjson(data: bytes) -> None:
    _read(data, "ndjson")


def _csv(data: bytes) -> None:
    _read(data, "csv")


def _detected(data: bytes) -> None:
    _read(data, None)


def _gzipped(data: bytes) -> None:
    _read(data, None, packed=True)


_READERS = (_combined, _logpush, _events, _ndjson, _csv, _detected, _gzipped)
assert len(FORMATS) == 5  # one reader per format above, and two that detect it


def test_one_input(data: bytes) -> None:
    """Feed one input to the reader its first byte selects."""
    if not data:
        return
    _READERS[data[0] % len(_READERS)](data[1:])


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
