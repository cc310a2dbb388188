"""Bad policy input: every kind gives a clear message with a line number and no traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import edgegen_policy as policy
import pytest

GOOD_HEADER = """\
version: 1
cloudflare: { plan: business }
tiers: [free, pro]
"""


@dataclass(frozen=True)
class Case:
    """One bad policy: its text, and what the first error must say and where."""

    id: str
    text: str
    line: int
    path: str
    fragment: str


def _limits(body: str) -> str:
    return GOOD_HEADER + "limits:\n" + textwrap.indent(textwrap.dedent(body).lstrip("\n"), "  ")


CASES = [
    Case(
        "rate-bad-unit",
        _limits("""
        - name: api
          app: { tiers: { free: 100/1m, pro: 1000/1min } }
        """),
        6,
        "limits[0].app.tiers.pro",
        "'1000/1min' is not a rate; write it like 1000/1m",
    ),
    Case(
        "rate-not-a-string",
        _limits("""
        - name: api
          app: { tiers: { free: 100 } }
        """),
        6,
        "limits[0].app.tiers.free",
        "100 is not a rate; write it like 100/1m",
    ),
    Case(
        "rate-zero",
        _limits("""
        - name: api
          app: { tiers: { free: 0/1m } }
        """),
        6,
        "limits[0].app.tiers.free",
        "allows nothing",
    ),
    Case(
        "rate-empty-list",
        _limits("""
        - name: api
          app: { tiers: { free: [] } }
        """),
        6,
        "limits[0].app.tiers.free",
        "empty list of rates",
    ),
    Case(
        "rate-list-bad-item",
        _limits("""
        - name: api
          app:
            tiers:
              pro: [1000/1m, 20000/hour]
        """),
        8,
        "limits[0].app.tiers.pro",
        "write it like 20000/1h",
    ),
    Case(
        "duration-bad",
        GOOD_HEADER + "app: { timeout: 50 msecs }\n",
        4,
        "app.timeout",
        "'50 msecs' is not a duration",
    ),
    Case(
        "duration-too-long",
        GOOD_HEADER + "app: { timeout: 1h }\n",
        4,
        "app.timeout",
        "too long to wait on every request",
    ),
    Case(
        "unknown-top-level-key",
        GOOD_HEADER + "limts: []\n",
        4,
        "limts",
        "unknown field 'limts'; did you mean 'limits'?",
    ),
    Case(
        "unknown-nested-key",
        _limits("""
        - name: api
          app: { algoritm: gcra, tiers: { free: 1/1s } }
        """),
        6,
        "limits[0].app.algoritm",
        "did you mean 'algorithm'?",
    ),
    Case(
        "missing-version",
        "tiers: [free]\n",
        1,
        "version",
        "required field 'version' is missing",
    ),
    Case(
        "wrong-version",
        "version: 2\n",
        1,
        "version",
        "2 is not allowed",
    ),
    Case(
        "missing-name",
        _limits("""
        - match: { paths: [/x] }
          app: { tiers: { free: 1/1s } }
        """),
        5,
        "limits[0].name",
        "required field 'name' is missing",
    ),
    Case(
        "unknown-algorithm",
        _limits("""
        - name: api
          app: { algorithm: leaky_bucket, tiers: { free: 1/1s } }
        """),
        6,
        "limits[0].app.algorithm",
        "'leaky_bucket' is not allowed",
    ),
    Case(
        "unknown-plan",
        "version: 1\ncloudflare: { plan: platinum }\n",
        2,
        "cloudflare.plan",
        "'platinum' is not allowed",
    ),
    Case(
        "unknown-action",
        _limits("""
        - name: api
          edge: { rate: 10/1m, action: ban }
        """),
        6,
        "limits[0].edge.action",
        "'ban' is not allowed",
    ),
    Case(
        "path-without-slash",
        _limits("""
        - name: api
          match: { paths: [login] }
          app: { tiers: { free: 1/1s } }
        """),
        6,
        "limits[0].match.paths",
        "must start with '/'",
    ),
    Case(
        "path-with-query",
        _limits("""
        - name: api
          match: { path_prefix: "/api?x=1" }
          app: { tiers: { free: 1/1s } }
        """),
        6,
        "limits[0].match.path_prefix",
        "match on the path only",
    ),
    Case(
        "bad-method",
        _limits("""
        - name: api
          match: { methods: [FETCH] }
          app: { tiers: { free: 1/1s } }
        """),
        6,
        "limits[0].match.methods",
        "'FETCH' is not an HTTP method",
    ),
    Case(
        "bad-host",
        _limits("""
        - name: api
          match: { hosts: ["https://api.example.com"] }
          app: { tiers: { free: 1/1s } }
        """),
        6,
        "limits[0].match.hosts",
        "is not a host name",
    ),
    Case(
        "limit-without-edge-or-app",
        _limits("""
        - name: api
          match: { paths: [/x] }
        """),
        5,
        "limits[0]",
        "has neither edge nor app",
    ),
    Case(
        "burst-without-gcra",
        _limits("""
        - name: api
          app: { algorithm: sliding_log, burst: 5, tiers: { free: 1/1s } }
        """),
        6,
        "limits[0].app",
        "burst applies to gcra only",
    ),
    Case(
        "bad-redis-url",
        GOOD_HEADER + "app: { redis_url: 'localhost:6379' }\n",
        4,
        "app.redis_url",
        "is not a Redis URL",
    ),
    Case(
        "bad-on-redis-error",
        GOOD_HEADER + "app: { on_redis_error: maybe }\n",
        4,
        "app.on_redis_error",
        "'maybe' is not allowed",
    ),
    Case(
        "bad-zone-id",
        "version: 1\ncloudflare: { plan: pro, zone_id: not-a-zone }\n",
        2,
        "cloudflare.zone_id",
        "is not a Cloudflare id",
    ),
    Case(
        "bad-worker-name",
        "version: 1\ncloudflare:\n  plan: pro\n  worker: { name: My_Worker }\n",
        4,
        "cloudflare.worker.name",
        "is not a Worker name",
    ),
    Case(
        "bad-route",
        "version: 1\ncloudflare:\n  plan: pro\n"
        "  worker: { name: w, routes: ['https://x.com/*'] }\n",
        4,
        "cloudflare.worker.routes",
        "is not a route pattern",
    ),
    Case(
        "duplicate-tier",
        "version: 1\ntiers: [free, pro, free]\n",
        2,
        "tiers",
        "tier 'free' is listed twice",
    ),
    Case(
        "bad-tier-name",
        "version: 1\ntiers: [free, 'gold plan']\n",
        2,
        "tiers",
        "is not a tier name",
    ),
    Case(
        "quota-period-misspelt",
        _limits("""
        - name: api
          app: { tiers: { free: 1/1s }, quotas: { free: { monthly: 10 } } }
        """),
        6,
        "limits[0].app.quotas.free.monthly",
        "unknown field 'monthly'; did you mean 'month'?",
    ),
    Case(
        "bad-header-name",
        "version: 1\nauthenticated_when: { headers: ['x auth'] }\n",
        2,
        "authenticated_when.headers",
        "is not an HTTP header name; use letters, digits and -",
    ),
    Case(
        "name-with-newline",
        _limits("""
        - name: "a\\nb"
          app: { tiers: { free: 1/1s } }
        """),
        5,
        "limits[0].name",
        "contains a control character",
    ),
    Case(
        "name-too-long",
        _limits(f"""
        - name: {"n" * 65}
          app: {{ tiers: {{ free: 1/1s }} }}
        """),
        5,
        "limits[0].name",
        "at most 64 characters",
    ),
    Case(
        "wrong-type-list",
        GOOD_HEADER + "limits: { name: api }\n",
        4,
        "limits",
        "valid tuple",
    ),
    Case(
        "wrong-type-bool",
        _limits("""
        - name: api
          app: { enforce: sometimes, tiers: { free: 1/1s } }
        """),
        6,
        "limits[0].app.enforce",
        "'sometimes'",
    ),
    Case(
        "sync-without-approximate",
        _limits("""
        - name: api
          app: { sync_every: 10, tiers: { free: 1/1s } }
        """),
        6,
        "limits[0].app",
        "need mode: approximate",
    ),
    Case(
        "bad-env-reference",
        GOOD_HEADER + "app: { redis_url: 'redis://${:6379' }\n",
        4,
        "app.redis_url",
        "is not a variable reference",
    ),
]

YAML_CASES = [
    # Syntax errors name the mistake and point at it (an unclosed bracket or quote: where
    # it opens), never in PyYAML's parser words ("expected <block end>, but found '?'").
    Case("yaml-syntax", "version: 1\nlimits: [\n", 3, "", "that is never closed"),
    Case("yaml-unclosed-list", "version: 1\ntiers: [a, b\n", 2, "", "[ ... ] list is not closed"),
    Case("yaml-tab-indent", "version: 1\ntiers:\n\t- free\n", 3, "", "a tab indents this line"),
    Case(
        "yaml-indent-sibling",
        "version: 1\nlimits:\n  - name: api\n   edge: { rate: 10/1m }\n",
        4,
        "",
        "not indented like the others of the block at line 3",
    ),
    Case(
        "yaml-indent-deeper",
        "version: 1\napp:\n  timeout: 10s\n    key_prefix: rl\n",
        4,
        "",
        "indented deeper than the key before it",
    ),
    Case(
        "yaml-list-among-keys",
        "version: 1\napp:\n  timeout: 10s\n  - rl\n",
        4,
        "",
        "a list item ('- ') where a key was expected",
    ),
    Case(
        "yaml-unclosed-quote",
        'version: 1\nlimits:\n  - name: "api\n    app: { tiers: { free: 1/1s } }\n',
        3,
        "",
        "quoted string is never closed",
    ),
    Case("yaml-no-colon", "version: 1\ntiers\n", 2, "", "add the ':' after the key"),
    Case("yaml-undefined-alias", "version: 1\ntiers: *free\n", 2, "", "'*free' refers to no"),
    Case("yaml-duplicate-key", "version: 1\ntiers: [a]\ntiers: [b]\n", 3, "tiers", "appears twice"),
    Case("yaml-empty", "", 1, "", "the file is empty"),
    Case("yaml-not-mapping", "- version: 1\n", 1, "", "top level must be a mapping"),
    Case("yaml-two-documents", "version: 1\n---\nversion: 1\n", 3, "", "several YAML documents"),
    Case(
        "yaml-merge-key",
        "version: 1\nx: &a { plan: pro }\ncloudflare: { <<: *a }\n",
        3,
        "cloudflare",
        "merge keys",
    ),
]


@pytest.mark.parametrize("case", CASES + YAML_CASES, ids=lambda c: c.id)
def test_bad_policy_gives_line_and_path(case: Case, tmp_path: Path) -> None:
    """Each kind of bad input fails to load with its line, field path and a helpful message."""
    file = tmp_path / "policy.yaml"
    file.write_text(case.text)
    with pytest.raises(policy.PolicyLoadError) as info:
        policy.load(file, env={})
    first = info.value.diagnostics[0]
    assert first.line == case.line, first.format()
    assert first.path == case.path, first.format()
    assert case.fragment in first.message, first.format()
    assert first.format().startswith(f"{file}:{case.line}")
    assert not any(word in first.message for word in ("<block", "<stream", "scalar")), first


def test_a_yaml_mistake_reads_as_a_diagnostic_line(tmp_path: Path) -> None:
    """An indentation mistake prints as ``file:line:col: message [error P002]``, like every
    other finding, with the column of the line at fault."""
    file = tmp_path / "policy.yaml"
    file.write_text("version: 1\nlimits:\n  - name: api\n   edge: { rate: 10/1m }\n")
    with pytest.raises(policy.PolicyLoadError) as info:
        policy.load(file, env={})
    (only,) = info.value.diagnostics
    assert policy.diagnostic_terminal(only) == (
        f"{file}:4:4: this line is not indented like the others of the block at line 3: keys "
        "of one mapping, and the items of one list, start in the same column [error P002]"
    )


def test_many_kinds_of_bad_input_are_covered() -> None:
    """The suite keeps at least 25 distinct kinds of bad input (an acceptance criterion)."""
    assert len({c.id for c in CASES + YAML_CASES}) >= 25


def test_every_error_is_reported_not_just_the_first(tmp_path: Path) -> None:
    """Three independent mistakes give three diagnostics, sorted by line."""
    file = tmp_path / "p.yaml"
    file.write_text(
        _limits("""
        - name: a
          app: { tiers: { free: 1/1x } }
        - name: b
          app: { algorithm: nope, tiers: { free: 1/1s } }
        - name: c
          edge: { rate: 10/1m, colour: red }
        """)
    )
    with pytest.raises(policy.PolicyLoadError) as info:
        policy.load(file, env={})
    lines = [d.line for d in info.value.diagnostics]
    assert lines == [6, 8, 10]


def test_exact_message_format(tmp_path: Path) -> None:
    """The message reads ``file:line:col: field.path: message`` as the docs promise."""
    file = tmp_path / "policy.yaml"
    file.write_text(
        _limits("""
        - name: api
          app:
            tiers:
              pro: 1000/1min
        """)
    )
    with pytest.raises(policy.PolicyLoadError) as info:
        policy.load(file, env={})
    assert info.value.diagnostics[0].format() == (
        f"{file}:8:14: limits[0].app.tiers.pro: '1000/1min' is not a rate; write it like 1000/1m"
    )


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("missing", None, "no such file"),
        ("binary.yaml", b"version: 1\n\xff\xfe\n", "not UTF-8"),
        ("nul.yaml", b"version: 1\n\x00\n", "NUL byte"),
        ("huge.yaml", b"#" * 1_000_001, "the most a policy may be"),
    ],
)
def test_unreadable_files(tmp_path: Path, name: str, content: bytes | None, fragment: str) -> None:
    """Missing, binary, NUL-containing and oversized files give a clear error."""
    file = tmp_path / name
    if content is not None:
        file.write_bytes(content)
    with pytest.raises(policy.PolicyLoadError) as info:
        policy.load(file)
    assert fragment in info.value.diagnostics[0].message


def test_deep_nesting_and_endless_files(tmp_path: Path) -> None:
    """Thousands of nested brackets, /dev/zero and a NUL in the path are clear errors."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("version: 1\nx: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(policy.PolicyLoadError) as info:
        policy.load(deep)
    assert "nested far deeper" in info.value.diagnostics[0].message
    with pytest.raises(policy.PolicyLoadError) as info:
        policy.load("/dev/zero")
    assert "the most a policy may be" in info.value.diagnostics[0].message
    with pytest.raises(policy.PolicyLoadError) as info:
        policy.load(str(tmp_path / "a\x00b.yaml"))
    assert "NUL byte" in info.value.diagnostics[0].message


def test_alias_bomb_is_refused(tmp_path: Path) -> None:
    """YAML alias expansion cannot blow up memory: the loader counts values and stops."""
    lines = ["version: 1", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 8):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    file = tmp_path / "bomb.yaml"
    file.write_text("\n".join(lines) + "\n")
    with pytest.raises(policy.PolicyLoadError) as info:
        policy.load(file)
    assert "more than" in info.value.diagnostics[0].message


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgegen.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("case", CASES[:8] + YAML_CASES[:3], ids=lambda c: c.id)
def test_cli_reports_without_traceback(case: Case, tmp_path: Path) -> None:
    """``edgegen validate`` exits 1 with the located message on stderr and no traceback."""
    file = tmp_path / "policy.yaml"
    file.write_text(case.text)
    result = _cli("validate", str(file))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert f"{file}:{case.line}" in result.stderr
    assert case.fragment in result.stderr
