"""Reading traffic in a child process gives what reading in process gives: the same
records in the same order, the same stats, the same errors at the same moments."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.traffic import generate, write
from edgegen._traffic import TrafficError, TrafficOptions, read_traffic
from edgegen._traffic_pipe import BackgroundTraffic, open_traffic

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
