"""edgegen replay, suggest and diff --traffic from the command line: real files in every
format the readers take, the three output formats, the chart, and mistakes answered with
one clear line and a non-zero exit (never a traceback)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.traffic import generate, write
from edgegen import cli

ROOT = Path(__file__).resolve().parents[2]
POLICY = str(ROOT / "examples" / "policy.yaml")
PREVIOUS = str(ROOT / "examples" / "policy-previous.yaml")


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twenty minutes of the generated traffic, as gzip-compressed named-column NDJSON."""
    path = tmp_path_factory.mktemp("traffic") / "sample.ndjson.gz"
    write(generate(seed=3, seconds=1200, rate_per_s=40), str(path), "ndjson")
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_replay_text_names_every_layer_and_the_assumptions(
    day: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["replay", POLICY, "--traffic", str(day)], capsys)
    assert code == 0, err
    assert "(ndjson, gzip)" in out
    for heading in ("Cloudflare rules:", "Worker:", "App:", "Assumptions (docs/replay.md):"):
        assert heading in out
    # The generated abusers are refused: credential stuffing at the edge, a scraper.
    assert "Refused by Cloudflare's rules: 0 " not in out
    assert "Traceback" not in err


def test_replay_json_is_consistent(day: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["replay", POLICY, "--traffic", str(day), "--format", "json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["version"] == 1
    assert data["traffic"]["records"] == data["requests"] > 0
    assert data["admitted"] + sum(data["refused"].values()) == data["requests"]
    points = data["timeline"]["points"]
    assert sum(sum(point[1:]) for point in points) == data["requests"]
    app_rows = [row for row in data["rows"] if row["layer"] == "app"]
    assert {row["limit"] for row in app_rows} >= {"api", "login", "search"}
    # Every refusal the app layer reports is a refusal of some app row.
    assert data["refused"]["app"] <= sum(row["refused"] for row in app_rows)


def test_replay_markdown_and_chart(
    day: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "timeline.svg"
    argv = ["replay", POLICY, "--traffic", str(day), "--format", "markdown", "--chart", str(chart)]
    code, out, _ = run(argv, capsys)
    assert code == 0
    assert out.startswith("### Replay of recorded traffic")
    assert "| limit | tier | rate |" in out
    assert chart.read_text(encoding="utf-8").lstrip().startswith("<?xml")


def test_replay_of_one_layer(day: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["replay", POLICY, "--traffic", str(day), "--layers", "app", "--format", "json"], capsys
    )
    assert code == 0
    data = json.loads(out)
    assert data["layers"] == ["app"]
    assert {row["layer"] for row in data["rows"]} == {"app"}


def test_malformed_lines_are_counted_not_fatal_unless_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "access.log"
    good = '203.0.113.9 - - [01/Dec/2026:10:00:00 +0000] "POST /login HTTP/1.1" 401 12 "-" "curl"\n'
    path.write_text(good + "this is not a log line\n" + good, encoding="utf-8")
    code, out, _ = run(["replay", POLICY, "--traffic", str(path)], capsys)
    assert code == 0
    assert "1 malformed" in out
    assert "2 requests" in out
    code, _, err = run(["replay", POLICY, "--traffic", str(path), "--strict"], capsys)
    assert code == 1
    assert "access.log:2" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layers", "edge"], "--layers"),
        (["--chart", "out.jpg"], ".svg or .png"),
        (["--default-tier", "platinum"], "not a tier of the policy"),
    ],
)
def test_mistakes_get_one_line(
    day: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["replay", POLICY, "--traffic", str(day), *extra], capsys)
    assert code != 0
    assert message in err
    assert "Traceback" not in err


def test_missing_traffic_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["replay", POLICY, "--traffic", str(tmp_path / "nope.log")], capsys)
    assert code == 1
    assert "nope.log" in err


def test_suggest_json_and_text(day: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["suggest", POLICY, "--traffic", str(day), "--target", "2%", "--format", "json"], capsys
    )
    assert code == 0
    data = json.loads(out)
    assert data["target"] == pytest.approx(0.02)
    busy = [s for s in data["suggestions"] if s["identities"]]
    assert busy
    for item in busy:
        assert item["refused_floor"] <= int(0.02 * item["identities"])
        if not item["kept_at_current"]:
            assert item["refused_suggested"] <= item["refused_floor"]
    code, out, _ = run(["suggest", POLICY, "--traffic", str(day)], capsys)
    assert code == 0
    assert "Suggested app rates" in out
    code, _, err = run(["suggest", POLICY, "--traffic", str(day), "--target", "150%"], capsys)
    assert code == 2
    assert "below 100%" in err


def test_diff_with_traffic_adds_the_impact_section(
    day: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        ["diff", PREVIOUS, POLICY, "--traffic", str(day), "--format", "markdown"], capsys
    )
    assert code == 0
    assert "### Impact on recorded traffic" in out
    assert "tier of app limit `api` 60/1m -> 100/1m" in out
    code, out, _ = run(
        ["diff", PREVIOUS, POLICY, "--traffic", str(day), "--format", "json"], capsys
    )
    data = json.loads(out)
    changed = {(item["limit"], item["tier"]) for item in data["impact"]["limits"]}
    assert ("api", "free") in changed


def test_stdin_and_gzip_are_read(
    day: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--traffic -` reads standard input, compressed or not."""
    import io
    import sys

    raw = gzip.decompress(day.read_bytes())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    code, out, _ = run(["replay", POLICY, "--traffic", "-", "--format", "json"], capsys)
    assert code == 0
    assert json.loads(out)["requests"] > 0


def test_authenticated_option_moves_requests_to_the_credentialed_counter(
    day: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--authenticated yes: the Worker's api limit (unauthenticated only) counts nothing
    at its own rate; every request meets its credentialed counter."""
    code, out, _ = run(
        ["replay", POLICY, "--traffic", str(day), "--authenticated", "yes", "--format", "json"],
        capsys,
    )
    assert code == 0
    rows = {(r["layer"], r["limit"]): r for r in json.loads(out)["rows"]}
    assert rows[("worker", "api")]["counted"] == 0
    assert rows[("worker", "api (credentialed)")]["counted"] > 0


NO_HOST = '203.0.113.9 - - [03/Dec/2026:08:00:0{} +0000] "GET /api/v1/items HTTP/1.1" 200 1\n'


@pytest.mark.parametrize(
    ("content", "extra", "said"),
    [
        (NO_HOST.replace("Dec", "Xyz").format(0) * 2, [], "2 timestamp"),
        (NO_HOST.format(0), ["--traffic-format", "ndjson"], "1 not JSON"),
        (
            '{"v": 1, "ts": 1796284800, "limit": "api", "identity": "u", "operation": "peek"}\n',
            [],
            "not hits",
        ),
        ("", [], "holds no lines"),
        ("\n  \n", [], "holds no lines"),
    ],
    ids=["malformed", "wrong-format", "no-hits", "empty", "blank"],
)
@pytest.mark.parametrize("command", ["replay", "suggest", "diff"])
def test_no_usable_record_is_an_error(
    command: str,
    content: str,
    extra: list[str],
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Traffic that gives no record (every line malformed, the wrong --traffic-format, no
    requests, nothing) fails with one line saying what the lines were, instead of an empty
    report and exit 0."""
    path = tmp_path / "traffic.log"
    path.write_text(content)
    argv = [command, POLICY, "--traffic", str(path), *extra]
    if command == "diff":
        argv = ["diff", PREVIOUS, POLICY, "--traffic", str(path), *extra]
    code, _, err = run(argv, capsys)
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("edgegen: error: no ")
    assert said in err
    assert str(path) in err
    assert "Traceback" not in err


def test_requests_without_a_host_are_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A combined log without host= matches no Worker route and no limit that names a
    host: the replay says how many requests that was, on stderr and in the report."""
    path = tmp_path / "access.log"
    path.write_text("".join(NO_HOST.format(i) for i in range(3)))
    code, out, err = run(["replay", POLICY, "--traffic", str(path)], capsys)
    assert code == 0
    assert "edgegen: warning: 3 of 3 requests have no host" in err
    assert "Warning: 3 of 3 requests have no host" in out
    code, out, _ = run(["replay", POLICY, "--traffic", str(path), "--format", "json"], capsys)
    (warning,) = json.loads(out)["warnings"]
    assert warning.startswith("3 of 3 requests have no host")
    code, _, err = run(["suggest", POLICY, "--traffic", str(path)], capsys)
    assert "warning: 3 of 3 requests have no host" in err
    code, out, _ = run(["diff", PREVIOUS, POLICY, "--traffic", str(path)], capsys)
    assert "Warning: 3 of 3 requests have no host" in out
    with_host = (NO_HOST.format(i).replace("\n", " host=api.example.com\n") for i in range(3))
    path.write_text("".join(with_host))
    code, out, err = run(["replay", POLICY, "--traffic", str(path), "--format", "json"], capsys)
    assert code == 0
    assert "warning" not in err
    assert json.loads(out)["warnings"] == []
