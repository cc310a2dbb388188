"""``bench.flame``: stacks kept from the counted loop down, shares that add up, a flame graph
that draws every frame; and one real recording with py-spy, so the tool does not rot.

The shares' sizes are not asserted on the recording (they are the machine's): only that
the limiter's own frames are in it, under the loop, and that the files are well formed.
"""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench.flame import LOOP_FRAME, RecordingError, folded, py_spy, run_bounded, shares, svg

ROOT = Path(__file__).resolve().parent.parent
SETUP = "_run_module_as_main (<frozen runpy>);<module> (bench/callgrind.py)"
RAW = "\n".join(
    [
        # Setup, outside the loop: dropped.
        f"{SETUP};_find_and_load (<frozen importlib._bootstrap>) 50",
        f"{SETUP};_counted (bench/callgrind.py);{LOOP_FRAME};step (x.py);hit (a.py) 6",
        f"{SETUP};_counted (bench/callgrind.py);{LOOP_FRAME};step (x.py);hit (a.py);send (w.py) 3",
        f"{SETUP};_counted (bench/callgrind.py);{LOOP_FRAME};step (x.py) 1",
        # A recursive function, twice on one stack.
        f"{SETUP};_counted (bench/callgrind.py);{LOOP_FRAME};walk (r.py);walk (r.py) 2",
        "not a line of stacks",
    ]
)


def test_only_the_loop_s_stacks_are_kept_from_the_loop_down() -> None:
    stacks = folded(RAW)
    assert dict(stacks) == {
        ("step (x.py)", "hit (a.py)"): 6,
        ("step (x.py)", "hit (a.py)", "send (w.py)"): 3,
        ("step (x.py)",): 1,
        ("walk (r.py)", "walk (r.py)"): 2,
    }


def test_shares_are_inclusive_and_exclusive_and_recursion_counts_once() -> None:
    rows = {function: (inc, exc) for function, inc, exc in shares(folded(RAW))}
    assert rows["step (x.py)"] == (10 / 12, 1 / 12)
    assert rows["hit (a.py)"] == (9 / 12, 6 / 12)
    assert rows["send (w.py)"] == (3 / 12, 3 / 12)
    assert rows["walk (r.py)"] == (2 / 12, 2 / 12)
    assert sum(exc for _, exc in rows.values()) == pytest.approx(1.0)


def test_the_flame_graph_draws_each_frame_at_its_width_and_escapes_names() -> None:
    stacks = folded(RAW.replace("hit (a.py)", "hit<&> (a.py)"))
    root = ET.fromstring(svg("a <title>", stacks))
    titles = [el.text for el in root.iter("{http://www.w3.org/2000/svg}title")]
    assert "hit<&> (a.py) (75.0%)" in titles
    assert "walk (r.py) (16.7%)" in titles and titles.count("walk (r.py) (16.7%)") == 2
    widths = {
        g.find("{http://www.w3.org/2000/svg}title").text: float(  # type: ignore[union-attr]
            g.find("{http://www.w3.org/2000/svg}rect").get("width", "0")  # type: ignore[union-attr]
        )
        for g in root.iter("{http://www.w3.org/2000/svg}g")
    }
    assert widths["step (x.py) (83.3%)"] == pytest.approx(1000.0, abs=0.1)


@pytest.mark.skipif(py_spy() is None, reason="py-spy is in the dev extra: pip install -e '.[dev]'")
def test_a_recording_of_sync_hit_has_the_limiter_under_the_loop(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.flame",
            "--only",
            "sync_hit",
            "--decisions",
            "3000",
            "--out",
            str(tmp_path),
            # py-spy pausing the workload to sample has been seen to stall it (a CI run
            # waited out its three minutes): here it samples without pausing, and a
            # recording still past 60 s is made once more.
            "--nonblocking",
            "--timeout",
            "60",
            "--attempts",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    text = (tmp_path / "sync_hit.txt").read_text(encoding="utf-8")
    assert "Limiter.hit (applimit/_sync.py)" in text
    assert "_find_and_load" not in text
    ET.parse(tmp_path / "sync_hit.svg")


def _running_sleep(pid: int) -> bool:
    """Whether ``pid`` is still the ``sleep 60`` it was, and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and command.startswith(b"sleep\x0060")


def test_a_recording_past_its_time_is_stopped_with_everything_it_started() -> None:
    """A command that does not finish (as a stalled py-spy would not) is killed at the
    timeout together with the process it started (the workload), and the error says so;
    a failing one is an error too, with what it printed."""
    stuck = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(RecordingError, match="not finished within 1 s") as caught:
        run_bounded([sys.executable, "-c", stuck], timeout=1)
    pid = int(caught.value.output.split()[0])
    # The grandchild got the group's SIGKILL: it is gone, or a zombie until reaped. A
    # SIGKILL is delivered when the process next runs, so on a loaded machine it may
    # still be running for a moment: wait for it, against a deadline.
    deadline = time.monotonic() + 10
    while _running_sleep(pid):
        assert time.monotonic() < deadline, f"process {pid} (sleep 60) survived the group's kill"
        time.sleep(0.01)
    with pytest.raises(RecordingError, match="status 3") as failed:
        run_bounded([sys.executable, "-c", "print('no luck'); raise SystemExit(3)"], timeout=30)
    assert "no luck" in failed.value.output
    assert run_bounded([sys.executable, "-c", "print('fine')"], timeout=30).strip() == "fine"


def test_a_recording_past_its_time_is_made_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """record() makes a recording that ran past its time again, up to its attempts; a
    failure of another kind, or the last attempt's, is raised."""
    from bench import flame

    calls: list[list[str]] = []

    def stalls_once(command: list[str], timeout: float) -> str:
        calls.append(command)
        if len(calls) == 1:
            raise RecordingError("not finished within 1 s, stopped")
        raw = Path(command[command.index("--output") + 1])
        raw.write_text(RAW, encoding="utf-8")
        return ""

    monkeypatch.setattr(flame, "py_spy", lambda: "py-spy")
    monkeypatch.setattr(flame, "run_bounded", stalls_once)
    stacks = flame.record("sync_hit", "redis://x", 10, tmp_path, timeout=1, nonblocking=True)
    assert len(calls) == 2 and "--nonblocking" in calls[0]
    assert stacks == folded(RAW)

    def always_stalls(command: list[str], timeout: float) -> str:
        calls.append(command)
        raise RecordingError("not finished within 1 s, stopped")

    calls.clear()
    monkeypatch.setattr(flame, "run_bounded", always_stalls)
    with pytest.raises(RecordingError, match="not finished"):
        flame.record("sync_hit", "redis://x", 10, tmp_path, timeout=1, attempts=3)
    assert len(calls) == 3 and "--nonblocking" not in calls[0]

    def fails(command: list[str], timeout: float) -> str:
        calls.append(command)
        raise RecordingError("exited with status 1")

    calls.clear()
    monkeypatch.setattr(flame, "run_bounded", fails)
    with pytest.raises(RecordingError, match="status 1"):
        flame.record("sync_hit", "redis://x", 10, tmp_path, timeout=1)
    assert len(calls) == 1
