"""app.redis_url is checked the way redis-py reads it, and its password is never shown.

A URL that validates must connect (``Limiter.from_policy`` must not fail later with
redis-py's own ``ValueError``), and every message about a bad URL (``edgegen validate`` in
text and JSON, the exception of ``policy.load`` and ``Limiter.from_policy``) shows ``***``
where the password was, with the file, line, column and field path of the value.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import edgegen_policy as policy
import pytest
import redis.connection

from applimit import Limiter
from edgegen import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "policy.yaml"
PASSWORD = "hunter2-Sekr1t"
URL_LINE = re.compile(r"^  redis_url: .*$", re.M)


def policy_with(tmp_path: Path, url: str) -> tuple[Path, int]:
    """The example policy with ``app.redis_url`` set to ``url``; and the line it is on."""
    text = EXAMPLE.read_text()
    assert URL_LINE.search(text)
    text = URL_LINE.sub(lambda _: "  redis_url: " + json.dumps(url), text, count=1)
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    line = text[: text.index("  redis_url: ")].count("\n") + 1
    return path, line


GOOD = [
    "redis://localhost:6379/0",
    "redis://localhost",
    "redis://localhost/",
    "redis://:pw@host:6380/1",
    "redis://user:pw@host",
    "rediss://:pw@host:6380/2",
    "redis://[::1]:6379/0",
    "redis://host?db=3&socket_timeout=0.5&protocol=3&retry_on_timeout=yes",
    "unix:///var/run/redis.sock",
    "unix:///var/run/redis.sock?db=2",
    "redis+sentinel://:pw@s1:26379,s2:26379/mymaster/0",
    "redis+sentinel://s1,[::1]:26380/mymaster",
]

# (URL, what the message says); every password below is PASSWORD.
BAD = [
    (f"redis://:{PASSWORD}@host:notaport/0", "port 'notaport' is not a number"),
    (f"redis://user:{PASSWORD}@host:99999/0", "port 99999 is not between 1 and 65535"),
    (f"rediss://:{PASSWORD}@host:6379/abc", "database 'abc' is not a number"),
    (f"redis://:{PASSWORD}@host:6379/0/1", "database '0/1' is not a number"),
    (f"redis://:{PASSWORD}@host?db=x", "query argument db='x' is not a whole number"),
    (f"redis://:{PASSWORD}@host?socket_timeout=soon", "socket_timeout='soon' is not a number"),
    (f"redis://host?password={PASSWORD}&db=x", "query argument db='x'"),
    (f"redis://:{PASSWORD}@[::1/0", "cannot be read as a URL"),
    (f"unix://:{PASSWORD}@", "names no socket path"),
    (f"redis+sentinel://:{PASSWORD}@s1:port/mymaster", "port 'port' is not a number"),
    (f"redis+sentinel://:{PASSWORD}@s1:26379", "names no service"),
    (f"redis+sentinel://:{PASSWORD}@s1:26379/mymaster/x", "database 'x' is not a number"),
    (f"redis+sentinel://:{PASSWORD}@s1:26379/m?db=1", "takes no query"),
    (f"redis+sentinel://:{PASSWORD}@:26379/m", "a sentinel address is empty"),
    (f"ftp://:{PASSWORD}@host/0", "is not a Redis URL"),
    (f"{PASSWORD}@host:6379", "is not a Redis URL"),
    (f"rediss+tls://:{PASSWORD}@host/0", "redis+sentinel://host:26379/mymaster for Sentinel"),
    (f"memory://:{PASSWORD}@x", "a memory URL is memory:// or memory://name"),
    (f"redis://:{PASSWORD}/x@host:6379/0", "redis://:***@host:6379/0"),
    (f"redis://:{PASSWORD}?x@host:6379/0", "percent-encode them (%2F, %3F, %23)"),
]


@pytest.mark.parametrize("url", GOOD)
def test_urls_redis_reads_are_accepted(tmp_path: Path, url: str) -> None:
    """Every form redis-py (or applimit's Sentinel parser) reads validates."""
    path, _ = policy_with(tmp_path, url)
    assert policy.load(path).app.redis_url == url
    if not url.startswith("redis+sentinel://"):
        redis.connection.parse_url(url)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(("url", "says"), BAD, ids=range(len(BAD)))
def test_a_bad_url_is_a_located_error_without_its_password(
    tmp_path: Path, url: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """edgegen validate: exit 1, file:line:column and field path, what is wrong, the
    password as ***; the JSON form and the exception say the same."""
    path, line = policy_with(tmp_path, url)
    assert cli.main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err
    assert f"{path}:{line}:14: app.redis_url: " in err
    assert says in err
    assert "***" in err
    assert "Traceback" not in err
    assert cli.main(["validate", str(path), "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err
    (diagnostic,) = json.loads(out)["diagnostics"]
    assert diagnostic["path"] == "app.redis_url"
    assert diagnostic["line"] == line
    with pytest.raises(policy.PolicyLoadError) as info:
        policy.load(path)
    assert PASSWORD not in str(info.value) + repr(info.value.diagnostics)


def test_from_policy_refuses_a_bad_url_before_redis_sees_it(tmp_path: Path) -> None:
    """Limiter.from_policy fails with the policy's located error, not redis-py's ValueError
    (which would come only at the first decision, or quote the URL)."""
    path, line = policy_with(tmp_path, f"redis://:{PASSWORD}@host:notaport/0")
    with pytest.raises(policy.PolicyLoadError) as info:
        Limiter.from_policy(path)
    message = str(info.value)
    assert f"{path}:{line}:14: app.redis_url: " in message
    assert "redis://:***@host:notaport/0" in message
    assert PASSWORD not in message


@pytest.mark.parametrize("index", [0, 1, 4, 5, 6, 7])
def test_what_is_refused_redis_would_refuse(index: int) -> None:
    """The checks are redis-py's: each of these URLs makes its parse_url raise."""
    with pytest.raises(ValueError):
        redis.connection.parse_url(BAD[index][0])  # type: ignore[no-untyped-call]


def test_a_database_path_redis_would_misread_is_refused() -> None:
    """redis-py ignores a database path that is not a number (connecting to database 0)
    and reads /0/1 as database 1: both are refused here rather than misread."""
    assert "db" not in redis.connection.parse_url(BAD[2][0])  # type: ignore[no-untyped-call]
    assert redis.connection.parse_url(BAD[3][0])["db"] == 1  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("url", ["memory://", "memory://tests", "memory://a-b_9"])
def test_memory_comes_from_the_environment(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``REDIS_URL=memory://`` behind ``${REDIS_URL:-redis://...}`` (the README's policy)
    loads, lint says what it means (info L112, so --strict still passes), and a limiter
    built from the file alone decides in this process."""
    from applimit import Limiter

    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\n"
        "app:\n"
        "  redis_url: ${REDIS_URL:-redis://localhost:6379/0}\n"
        "limits:\n"
        "  - name: api\n"
        "    match: { path_prefix: /api/ }\n"
        "    app: { tiers: { default: 2/1m } }\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("REDIS_URL", url)
    loaded = policy.load(path)
    assert loaded.app.redis_url == url
    [finding] = [d for d in policy.lint(loaded) if d.code == "L112"]
    assert finding.severity is policy.Severity.INFO and finding.line == 3
    assert cli.main(["validate", "--strict", str(path)]) == 0
    limiter = Limiter.from_policy(path)
    try:
        assert [limiter.hit("api", "u").allowed for _ in range(3)] == [True, True, False]
    finally:
        limiter.close()
