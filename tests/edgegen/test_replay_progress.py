"""Progress while traffic is read: on standard error when it is a terminal (records read,
their rate, the share of the input read and the time left), redrawn at most a few times a
second and cleared at the end; nothing when standard error is a pipe or with --quiet."""

from __future__ import annotations

import fcntl
import io
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from bench.traffic import generate, write
from edgegen._cli_replay import PROGRESS_INTERVAL_S, Progress, progress_line

ROOT = Path(__file__).resolve().parents[2]
POLICY = str(ROOT / "examples" / "policy.yaml")
PREVIOUS = str(ROOT / "examples" / "policy-previous.yaml")
MAIN = "import sys; from edgegen.cli import main; sys.exit(main(sys.argv[1:]))"
CLEAR = "\r\x1b[K"
# A progress line: "\r" then the line, then the rest of the terminal line erased.
DRAWN = re.compile(r"\r(edgegen: [^\r\x1b]*)\x1b\[K")


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Some 36,000 records (1.6 MB of gzip: large enough to be read in a second process)."""
    path = tmp_path_factory.mktemp("progress") / "traffic.ndjson.gz"
    write(generate(seed=9, seconds=1800, rate_per_s=20), str(path), "ndjson")
    return path


def run_on_terminal(argv: list[str], tmp_path: Path) -> tuple[int, str, str, float]:
    """Run edgegen with standard error on a pseudo-terminal (120 columns) and standard
    output to a file: (exit code, what the terminal got, standard output, seconds)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    out_path = tmp_path / "stdout.txt"
    started = time.monotonic()
    with out_path.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", MAIN, *argv], cwd=ROOT, stdout=out, stderr=slave
        )
    os.close(slave)
    received = bytearray()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end closed it
                break
            if not chunk:
                break
            received += chunk
        code = process.wait(timeout=60)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    elapsed = time.monotonic() - started
    return code, received.decode(), out_path.read_text(encoding="utf-8"), elapsed


@pytest.mark.parametrize("background", [True, False], ids=["second process", "one process"])
def test_replay_shows_progress_on_a_terminal_and_clears_it(
    traffic: Path, tmp_path: Path, background: bool
) -> None:
    """On a terminal: lines with the records read, their rate, the share of the file read
    and the time left, at most a few a second, and the last thing written clears the line;
    the report on standard output is the same as without a terminal."""
    argv = ["replay", POLICY, "--traffic", str(traffic)]
    if not background:
        argv.append("--no-background-read")
    code, terminal, out, elapsed = run_on_terminal(argv, tmp_path)
    assert code == 0, terminal
    lines = DRAWN.findall(terminal)
    assert lines, repr(terminal)
    first = lines[0]
    assert re.fullmatch(
        r"edgegen: [\d,]+ records read, [\d,]+ records/s, \d+% of [\d.]+ (KiB|MiB)"
        r"(, about (\d+ s|\d+ min \d\d s|\d+ h \d\d min) left)?",
        first,
    ), first
    counts = [int(line.split()[1].replace(",", "")) for line in lines]
    assert counts == sorted(counts)
    # At most one redraw per interval, and one at the start.
    assert len(lines) <= elapsed / PROGRESS_INTERVAL_S + 1
    assert terminal.endswith(CLEAR)
    assert "\x1b" not in out and "\r" not in out
    assert "Refused by Cloudflare's rules" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["suggest", POLICY],
        ["diff", PREVIOUS, POLICY],
    ],
    ids=["suggest", "diff"],
)
def test_suggest_and_diff_show_progress_too(argv: list[str], traffic: Path, tmp_path: Path) -> None:
    code, terminal, out, _ = run_on_terminal([*argv, "--traffic", str(traffic)], tmp_path)
    assert code == 0, terminal
    assert DRAWN.search(terminal), repr(terminal)
    assert terminal.endswith(CLEAR)
    assert "\x1b" not in out


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", POLICY],
        ["suggest", POLICY],
        ["diff", PREVIOUS, POLICY],
    ],
    ids=["replay", "suggest", "diff"],
)
def test_quiet_shows_no_progress_on_a_terminal(
    argv: list[str], traffic: Path, tmp_path: Path
) -> None:
    code, terminal, _, _ = run_on_terminal([*argv, "--traffic", str(traffic), "--quiet"], tmp_path)
    assert code == 0, terminal
    assert "records read" not in terminal
    assert "\x1b" not in terminal


def test_no_progress_through_a_pipe(traffic: Path) -> None:
    """Standard error to a pipe (a CI log, a redirect): no progress, no control codes."""
    process = subprocess.run(
        [sys.executable, "-c", MAIN, "replay", POLICY, "--traffic", str(traffic)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    assert "records read" not in process.stderr
    assert "\r" not in process.stderr and "\x1b" not in process.stderr
    assert "Refused by Cloudflare's rules" in process.stdout


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_is_redrawn_at_most_every_interval() -> None:
    """Updates every 10 ms for 10 s draw the first one and then one per 0.25 s: 41 lines,
    not 1,000; finish clears the line once, and only when something was drawn."""
    stream = io.StringIO()
    clock = Clock()
    progress = Progress(stream, lambda: (500, 1000), clock=clock, interval=0.25)
    for step in range(1, 1001):
        clock.now += 0.01
        progress.update(step * 1024)
    drawn = DRAWN.findall(stream.getvalue())
    assert 40 <= len(drawn) <= 41
    progress.finish()
    assert stream.getvalue().endswith(CLEAR)
    progress.finish()
    assert stream.getvalue().count(CLEAR) == 1
    quiet = io.StringIO()
    Progress(quiet, lambda: (0, None), clock=clock).finish()
    assert quiet.getvalue() == ""


def test_the_progress_line_estimates_the_time_left_from_bytes_read() -> None:
    """A quarter of 4 MiB read in 30 s: 90 s left at that pace; without a size (a pipe),
    no share and no estimate."""
    line = progress_line(250_000, 30.0, 1024 * 1024, 4 * 1024 * 1024)
    assert line == (
        "edgegen: 250,000 records read, 8,333 records/s, 25% of 4.0 MiB, about 1 min 30 s left"
    )
    assert progress_line(1000, 2.0, 0, None) == "edgegen: 1,000 records read, 500 records/s"
    piped = progress_line(1000, 2.0, 3 * 1024, None)
    assert piped.endswith("3.0 KiB read") and "left" not in piped
