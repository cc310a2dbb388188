"""Reading traffic in a child process gives what reading in process gives: the same
records in the same order, the same stats, the same errors at the same moments."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from bench.traffic import generate, write
from edgegen.traffic._options import TrafficError, TrafficOptions
from edgegen.traffic._pipe import BackgroundTraffic, open_traffic
from edgegen.traffic._read import read_traffic

HERE = Path(__file__).resolve().parent / "traffic"


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pipe") / "sample.log.gz"
    write(generate(seed=5, seconds=900, rate_per_s=30), str(path), "combined")
    return path


def test_background_read_equals_reading_in_process(sample: Path) -> None:
    options = TrafficOptions(user_from="user")
    with read_traffic([sample], options) as direct:
        expected = list(direct)
    with BackgroundTraffic([sample], options) as background:
        got = list(background)
    assert got == expected
    assert len(got) > 10_000  # several batches
    assert background.stats.records == direct.stats.records == len(expected)
    assert background.stats.describe() == direct.stats.describe()


def test_an_error_in_the_child_is_raised_here_with_its_file_and_line() -> None:
    path = HERE / "combined_malformed.log"
    with (
        BackgroundTraffic([path], TrafficOptions(strict=True)) as traffic,
        pytest.raises(TrafficError) as caught,
    ):
        list(traffic)
    assert caught.value.file == str(path)
    assert caught.value.line == 2


def test_errors_before_reading_come_at_open_time(tmp_path: Path) -> None:
    with pytest.raises(TrafficError, match="nope"):
        BackgroundTraffic([tmp_path / "nope.log"], TrafficOptions())


def test_closing_early_stops_the_child(sample: Path) -> None:
    traffic = BackgroundTraffic([sample], TrafficOptions())
    records = iter(traffic)
    next(records)
    traffic.close()
    assert not traffic._process.is_alive()


def test_small_files_and_stdin_are_read_in_process(sample: Path) -> None:
    with open_traffic([HERE / "named.ndjson"], TrafficOptions()) as small:
        assert not isinstance(small, BackgroundTraffic)
    with open_traffic([sample], TrafficOptions(), background=False) as asked:
        assert not isinstance(asked, BackgroundTraffic)


# --- how far the reading has got (for the progress line) ----------------------------------


@pytest.mark.parametrize("background", [False, True], ids=["in process", "second process"])
def test_the_position_grows_to_the_files_size(sample: Path, background: bool) -> None:
    """The position counts the file's stored (gzip) bytes: it grows while records are read
    and ends at the file's size, read in process or in the second process."""
    size = sample.stat().st_size
    opened = BackgroundTraffic if background else read_traffic
    with opened([sample], TrafficOptions()) as traffic:
        seen = []
        for n, _ in enumerate(traffic, 1):
            if n % 4096 == 0:
                seen.append(traffic.position())
        end = traffic.position()
    assert end == (size, size)
    assert all(total == size for _, total in seen)
    done = [read for read, _ in seen]
    assert done == sorted(done)
    assert 0 < done[0] < size


def test_the_position_has_no_total_when_an_input_is_a_pipe(sample: Path, tmp_path: Path) -> None:
    """A named pipe has no size to compare with: the total is None, and the bytes counted
    are those of the regular files."""
    fifo = tmp_path / "fifo.ndjson"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", 'cat "$0" > "$1"', str(HERE / "named.ndjson"), fifo])
    try:
        with read_traffic([sample, fifo], TrafficOptions()) as traffic:
            count = sum(1 for _ in traffic)
            read, total = traffic.position()
    finally:
        writer.wait(timeout=30)
    assert count > 0
    assert total is None
    assert read == sample.stat().st_size


def test_observe_counts_records_and_runs_done_on_close(sample: Path) -> None:
    """observe calls back every N records with the count so far, and its done when the
    traffic is closed, also after a partial read."""
    calls: list[int] = []
    done: list[bool] = []
    with read_traffic([sample], TrafficOptions()) as traffic:
        traffic.observe(1000, calls.append, lambda: done.append(True))
        records = iter(traffic)
        for _ in range(2500):
            next(records)
        assert calls == [1000, 2000]
        assert not done
    assert done == [True]


# --- inputs that cannot be read twice, and a parent that dies ------------------------------

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "examples" / "policy.yaml"
# A parent that opens the background reader, says its child's process id and waits to be
# killed, reading nothing more: the child fills the pipe, or waits on a named pipe.
# The parent takes HUP's default action even when the test run inherited it ignored (a
# run under nohup): the test is about a parent that dies of the signal.
PARENT = """
import signal
import sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)
sys.path.insert(0, sys.argv[1])
from edgegen.traffic._options import TrafficOptions
from edgegen.traffic._pipe import BackgroundTraffic
traffic = BackgroundTraffic(sys.argv[2:], TrafficOptions())
print(traffic._process.pid, flush=True)
sys.stdin.read()
"""
CLI = "import sys; from edgegen.cli import main; sys.exit(main())"
LINUX = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG are Linux's"
)


def ndjson_lines(count: int, start: float = 1796284800.0) -> bytes:
    """``count`` named-column records, a millisecond apart."""
    return "".join(
        f'{{"timestamp": {start + i / 1000:.3f}, "method": "GET", "path": "/{i}", '
        f'"ip": "192.0.2.{i % 250}", "host": "api.example.com"}}\n'
        for i in range(count)
    ).encode()


def read_line(stream: IO[str], seconds: float) -> str:
    """The next line of a child's output, waiting at most ``seconds`` for it."""
    ready, _, _ = select.select([stream], [], [], seconds)
    assert ready, f"no line within {seconds} s"
    return stream.readline()


def ended(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` (not a child of ours) ends within ``seconds``: its pidfd
    becomes readable when it does (a zombie has ended)."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([handle], [], [], seconds)
        return bool(ready)
    finally:
        os.close(handle)


@pytest.fixture
def named_pipe(tmp_path: Path) -> Iterator[Path]:
    """A named pipe holding some records, its write end kept open (no end of file), so a
    reader waits on it for more."""
    path = tmp_path / "live.ndjson"
    os.mkfifo(path)
    # O_RDWR opens a FIFO without waiting for a reader, and keeps it writable.
    handle = os.open(path, os.O_RDWR)
    try:
        # More than the reader's first block, so the format is told without the end.
        os.write(handle, ndjson_lines(400))
        yield path
    finally:
        os.close(handle)


@LINUX
def test_the_reader_holds_no_read_end_of_its_pipe(sample: Path) -> None:
    """The child closes its inherited copy of the pipe's read end: holding it, it never saw
    the pipe break and blocked for ever on a full pipe once the parent was gone."""
    traffic = BackgroundTraffic([sample], TrafficOptions())
    with traffic:
        inode = os.fstat(traffic._conn.fileno()).st_ino
        pid = traffic._process.pid
        modes = []
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(FileNotFoundError):
                if str(fd.readlink()) == f"pipe:[{inode}]":
                    info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
                    flags = re.search(r"^flags:\s+([0-7]+)$", info, re.MULTILINE)
                    assert flags is not None
                    modes.append(int(flags.group(1), 8) & os.O_ACCMODE)
        assert modes == [os.O_WRONLY]


def test_a_reader_that_ends_early_is_an_error_not_fewer_records(sample: Path) -> None:
    """The child killed half way: the records stop with a TrafficError saying so, never a
    shorter stream that looks complete."""
    traffic = BackgroundTraffic([sample], TrafficOptions())
    with traffic:
        records = iter(traffic)
        next(records)
        os.kill(traffic._process.pid, signal.SIGKILL)
        traffic._process.join(timeout=30)
        assert traffic._process.exitcode == -signal.SIGKILL
        with pytest.raises(TrafficError, match="ended without finishing"):
            for _ in records:
                pass


@LINUX
@pytest.mark.parametrize("source", ["a file", "a named pipe"])
@pytest.mark.parametrize(
    "signum",
    [
        pytest.param(signal.SIGTERM, id="TERM"),
        pytest.param(signal.SIGKILL, id="KILL"),
        pytest.param(signal.SIGHUP, id="HUP"),
    ],
)
def test_the_reader_dies_with_its_parent(
    signum: signal.Signals, source: str, sample: Path, request: pytest.FixtureRequest
) -> None:
    """Kill the parent (TERM, KILL, HUP: none runs its exit handlers) while its reader is
    blocked writing to a full pipe, or reading a named pipe that has no end yet: the reader
    ends too, instead of living on under init."""
    path = sample if source == "a file" else request.getfixturevalue("named_pipe")
    child = None
    with subprocess.Popen(
        [sys.executable, "-c", PARENT, str(ROOT), str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as parent:
        try:
            assert parent.stdout is not None
            child = int(read_line(parent.stdout, 60))
            handle = os.pidfd_open(child)
            try:
                parent.send_signal(signum)
                assert parent.wait(timeout=60) == -signum
                ready, _, _ = select.select([handle], [], [], 30)
                assert ready, "the reader outlived its parent"
            finally:
                os.close(handle)
        finally:
            if parent.poll() is None:
                parent.kill()
            if child is not None and not ended(child, 0):
                os.kill(child, signal.SIGKILL)


def test_inputs_that_cannot_be_read_twice_are_read_once(tmp_path: Path) -> None:
    """A process substitution (plain or gzip) and a named pipe, each one of several files:
    every record is read, the format and compression told from what was read once (the
    substitution lost records, the gzip one was "unknown format", the named pipe hung), and
    the report equals the one read in process."""
    big = tmp_path / "big.ndjson"
    big.write_bytes(ndjson_lines(12_000))  # over a MiB: read in the background
    small = tmp_path / "small.ndjson"
    small.write_bytes(ndjson_lines(3_000, start=1796284801.0005))
    packed = tmp_path / "small.ndjson.gz"
    packed.write_bytes(gzip.compress(small.read_bytes()))
    fifo = tmp_path / "fifo.ndjson"
    os.mkfifo(fifo)
    script = (
        'cat "$SMALL" > "$FIFO" &\n'
        'exec "$PYTHON" -c "$CLI" replay "$POLICY" --traffic "$BIG" <(cat "$SMALL") '
        '<(cat "$PACKED") "$FIFO" --format json --show-identities $EXTRA\n'
    )
    reports = []
    for extra in ("", "--no-background-read"):
        env = {
            **os.environ,
            "SMALL": str(small),
            "PACKED": str(packed),
            "FIFO": str(fifo),
            "BIG": str(big),
            "PYTHON": sys.executable,
            "CLI": CLI,
            "POLICY": str(POLICY),
            "EXTRA": extra,
        }
        done = subprocess.run(
            ["bash", "-c", script],
            check=False,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        reports.append(json.loads(done.stdout))
    files = reports[0]["traffic"]["files"]
    assert [(f["records"], f["format"], f["gzip"]) for f in files] == [
        (12_000, "ndjson", False),
        (3_000, "ndjson", False),
        (3_000, "ndjson", True),
        (3_000, "ndjson", False),
    ]
    assert all(not f["malformed"] for f in files)
    for report in reports:
        for item in report["traffic"]["files"]:
            item["file"] = Path(item["file"]).suffix  # /dev/fd/N differs from run to run
    assert reports[0] == reports[1]
