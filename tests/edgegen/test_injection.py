"""Policy strings built to inject, through every language edgegen writes.

A corpus of policies is made from fragments that break out of strings or markup in some
language (quotes, backslashes, ``${}``/``%{}``, ``</script>``, ``</details>``, ``|``,
backticks, TOML table headers, ``" or true or "``, bidirectional overrides, ...), put in
limit names, descriptions, paths and prefixes, header and cookie names, and route
patterns (hosts, tiers and the Worker name are checked by the policy against patterns that
leave no room for injection; valid odd ones are used). Each policy is built twice: on
Enterprise, where every limit is a rule, and on Business with every limit in the Worker.
Then each output is read back with a parser of its language and compared with the policy:

- rule expressions, by ``tests/rules_eval.py``: every string literal is one the policy
  gave, and the expression answers like the policy's matcher on requests built from it;
- the ruleset JSON and the Terraform HCL (``tests/hcl_subset.py``): the same rules;
- ``wrangler.toml``, by ``tomllib``: name, routes and bindings as built;
- the Worker module, by Node: it imports (so it parses), and the CONFIG object it holds,
  as JavaScript reads it, equals the data; its ``RateLimit-Policy`` values are RFC 8941
  strings naming the limit;
- the plan and the diff as Markdown: names only inside code spans or escaped, no HTML but
  edgegen's own ``<details>`` blocks (balanced), every fence closed, every table row of
  two cells; as text: no terminal control characters.

Redis keys are checked in ``tests/applimit/test_keys_fuzz.py`` (any bytes, any length).
"""

from __future__ import annotations

import functools
import json
import random
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import edgegen_policy as policy
import hcl_subset
import pytest
import rules_eval
import yaml

import edgegen
from edgegen import Artifacts, Target, _diff
from edgegen.cloudflare._state import RemoteState, Scope
from edgegen.compiler import _compile, _ids
from edgegen.errors import CompileError
from edgegen.zone._format import to_markdown, to_text
from edgegen.zone._merge import make_plan

ZONE = "0123456789abcdef0123456789abcdef"
ACCOUNT = "fedcba9876543210fedcba9876543210"
WORKER = "hostile-worker"
FRAGMENTS = [
    '"',
    "\\",
    '\\"',
    "'",
    "'''",
    '"""',
    "`",
    "```",
    "${x}",
    "%{y}",
    "$${",
    "#{z}",
    "{{ a }}",
    "{0}",
    "%s",
    "</script>",
    "<script>alert(1)</script>",
    "<!--",
    "-->",
    "</details>",
    "<details>",
    "<img src=x onerror=alert(1)>",
    "|",
    "||",
    "*bold*",
    "_em_",
    "[link](javascript:alert(1))",
    "~~",
    "&amp;",
    "&",
    '" or true or "',
    '") or (true',
    '"} or {"',
    "]]",
    "[[ratelimits]]",
    "= 1",
    "\u2028",
    "\u2029",
    "\u202e",
    "\ufeff",
    "ünï",
    "日本語",
    "\U0001f600",
    "%22",
    "%00",
    "..",
    ";",
    "x",
    "/",
]
# Header and cookie names: HTTP tokens, which allow these punctuation characters.
TOKEN_FRAGMENTS = ["x", "-", "!", "#", "$", "%", "&", "'", "*", "+", ".", "^", "_", "`", "|", "~"]
ROUTE_FRAGMENTS = ['"', "\\", "'", "${x}", "]", "[", "#", "=", "{", "}", "|", "`", "*", "\x1b[31m"]
HOSTS = ["api.example.com", "*.example.com", "a-b.c-d.example", "xn--nxasmq6b.example", "10.0.0.1"]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]
COUNT = 16


def _hostile(rng: random.Random, parts: list[str], limit: int) -> str:
    text = "".join(rng.choice(parts) for _ in range(rng.randint(1, 4))).strip()
    return text[:limit].strip() or "x"


def _yaml_text(value: str) -> str:
    # The loader reads ${VAR} as a variable; $$ is its escape for a literal $.
    return value.replace("$", "$$")


def _path_text(value: str) -> str:
    """A hostile path the policy accepts: written decoded (a "%XX" fragment loses its
    escape, "%!XX") and canonical (no "//", "\\" or dot segments)."""
    unescaped = re.sub(r"%(?=[0-9A-Fa-f]{2})", "%!", value.replace("?", "").replace("#", ""))
    return policy.canonical_path(unescaped)


def _policy_data(rng: random.Random, plan: str, target: str) -> dict[str, Any]:
    limits = []
    names: set[str] = set()
    for _ in range(3):
        name = _hostile(rng, FRAGMENTS, 64)
        while name in names:
            name = _hostile(rng, FRAGMENTS, 60) + "x"
        names.add(name)
        match: dict[str, Any] = {}
        if rng.random() < 0.7:
            match["paths"] = [
                _path_text("/" + _hostile(rng, FRAGMENTS, 80)) for _ in range(rng.randint(1, 3))
            ]
        if rng.random() < 0.5:
            match["path_prefix"] = [_path_text("/" + _hostile(rng, FRAGMENTS, 40))]
        if rng.random() < 0.5:
            match["methods"] = rng.sample(METHODS, rng.randint(1, 3))
        if rng.random() < 0.5:
            match["hosts"] = rng.sample(HOSTS, rng.randint(1, 2))
        period = "1m" if rng.random() < 0.5 else "10s"
        limits.append(
            {
                "name": _yaml_text(name),
                "description": _yaml_text(_hostile(rng, FRAGMENTS, 500)),
                "match": {k: [_yaml_text(v) for v in vs] for k, vs in match.items()},
                "edge": {
                    "rate": f"{rng.randint(1, 900)}/{period}",
                    "unauthenticated_only": rng.random() < 0.5,
                    "target": target,
                },
            }
        )
    route = "api.example.com/" + "".join(rng.choice(ROUTE_FRAGMENTS) for _ in range(3)) + "*"
    return {
        "version": 1,
        "cloudflare": {
            "plan": plan,
            "zone_id": ZONE,
            "account_id": ACCOUNT,
            "worker": {"name": WORKER, "routes": [_yaml_text(route), "b.example.com/*"]},
        },
        "authenticated_when": {
            "headers": ["authorization", _hostile(rng, TOKEN_FRAGMENTS, 20)],
            "cookies": [_hostile(rng, TOKEN_FRAGMENTS, 20)],
        },
        "limits": limits,
    }


@dataclass(frozen=True)
class Case:
    """One hostile policy, loaded, and what it builds."""

    number: int
    plan: str
    loaded: policy.Policy
    artifacts: Artifacts


@functools.cache
def corpus() -> tuple[Case, ...]:
    """COUNT hostile policies, each built for Enterprise (rules) and Business (Worker)."""
    rng = random.Random(20261202)
    cases = []
    number = 0
    while len(cases) < 2 * COUNT:
        state = rng.getstate()
        pair = []
        for plan, target in (("enterprise", "auto"), ("business", "worker")):
            rng.setstate(state)
            text = yaml.safe_dump(_policy_data(rng, plan, target), allow_unicode=True)
            try:
                loaded = policy.loads(text, f"hostile-{number}.yaml", env={})
                pair.append(Case(number, plan, loaded, edgegen.build(loaded)))
            except (policy.PolicyLoadError, CompileError):
                # A string the policy refuses (a path too long once encoded, ...): the
                # refusal is tested elsewhere; draw another policy.
                pass
        if len(pair) == 2:
            cases.extend(pair)
        number += 1
    return tuple(cases)


def rule_cases() -> list[Case]:
    """The Enterprise builds: every limit a rule."""
    return [c for c in corpus() if c.plan == "enterprise"]


def worker_cases() -> list[Case]:
    """The Business builds: every limit in the Worker."""
    return [c for c in corpus() if c.plan == "business"]


def test_the_corpus_is_hostile() -> None:
    """The policies really hold the fragments, and the builds put them where intended."""
    names = [limit.name for case in corpus() for limit in case.loaded.limits]
    joined = "".join(names)
    for fragment in ('"', "\\", "`", "</", "|", "${", "\u202e"):
        assert fragment in joined
    assert all(p.target is Target.RULE for case in rule_cases() for p in case.artifacts.placements)
    assert all(case.artifacts.worker is not None for case in worker_cases())
    routes = [r for case in corpus() for r in case.loaded.cloudflare.worker.routes]  # type: ignore[union-attr]
    assert any('"' in r for r in routes) and any("\x1b" in r for r in routes)


# --- rule expressions, JSON, HCL --------------------------------------------------------


def _probes(
    limit: policy.Limit, when: policy.AuthenticatedWhen
) -> list[tuple[str, rules_eval.Request]]:
    """Requests that hit and miss each criterion of the limit: the raw target a client
    sends (paths percent-encoded as browsers do, and with %2F for the first slash), and
    what the rule sees of it after Cloudflare's URL normalisation."""
    matcher = limit.match.matcher()
    paths = ["/", "/other"]
    for path in matcher.paths:
        paths += [path, path + "/", path + "/x", path[:-1] or "/"]
    for prefix in matcher.path_prefixes:
        paths += [prefix, prefix + "zz", prefix[:-1] or "/"]
    targets = [policy.encode_policy_path(p) for p in paths]
    targets += ["/" + t[1:].replace("/", "%2F", 1) for t in targets]
    hosts = ["example.org"]
    for host in matcher.hosts:
        hosts += [host.removeprefix("*."), "sub." + host.removeprefix("*.")]
    credentials: list[tuple[dict[str, list[str]], dict[str, list[str]]]] = [({}, {})]
    for header in when.headers:
        credentials += [({header: ["v"]}, {}), ({header: [""]}, {})]
    for cookie in when.cookies:
        credentials.append(({}, {cookie: ["v"]}))
    return [
        (
            target,
            rules_eval.Request(
                rules_eval.cloudflare_normalize(target), method, host, headers, cookies
            ),
        )
        for target in dict.fromkeys(targets)
        for method in ("GET", "POST", *sorted(matcher.methods))
        for host in hosts
        for headers, cookies in credentials
    ]


@pytest.mark.parametrize("case", rule_cases(), ids=lambda c: f"policy-{c.number}")
def test_rule_expressions_mean_the_matcher(case: Case) -> None:
    """Each expression parses, holds only spellings of the policy's strings, and answers
    like the matcher (and "unauthenticated only", whose credentialed requests go to the
    limit's second rule) on every probe."""
    rules = {rule["ref"]: rule for rule in case.artifacts.ruleset["rules"]}
    when = case.loaded.authenticated_when
    for limit in case.loaded.limits:
        assert limit.edge is not None
        own = rules[_ids.rule_ref(limit.name)]
        second = rules.get(_compile.credentialed_rule_ref(limit.name))
        matcher = limit.match.matcher()
        apart = limit.edge.unauthenticated_only and bool(when.headers or when.cookies)
        assert (second is not None) == apart
        allowed = {
            # Exact paths, with one trailing slash, either also with an encoded final newline.
            *(p + e + n for p in matcher.paths for e in ("", "/") for n in ("", "\n")),
            *matcher.path_prefixes,
            *matcher.methods,
            *(h.removeprefix("*") for h in matcher.hosts),
            *when.headers,
            *when.cookies,
        }
        trees = []
        for rule in (own, second):
            if rule is None:
                continue
            assert rule["description"].startswith(limit.name + ": ")
            tree, strings = rules_eval.parse(rule["expression"])
            # Paths are percent-encoded (with %2F spellings): decoded, they are the policy's.
            decoded = {unquote(s) if s.startswith("/") else s for s in strings}
            assert decoded <= allowed, decoded - allowed
            trees.append(tree)
        for target, request in _probes(limit, when):
            authenticated = any(any(request.headers.get(h, [])) for h in when.headers) or any(
                c in request.cookies for c in when.cookies
            )
            matches = matcher.matches_raw(request.method, target, request.host)
            expected = [matches and not (apart and authenticated)]
            if apart:
                expected.append(matches and authenticated)
            got = [rules_eval.evaluate(tree, request) for tree in trees]
            assert got == expected, (limit.name, target, request)


@pytest.mark.parametrize("case", rule_cases(), ids=lambda c: f"policy-{c.number}")
def test_json_and_terraform_hold_the_same_rules(case: Case) -> None:
    """The ruleset JSON parses to the PUT body; the HCL parses to the same rules."""
    files = case.artifacts.files()
    body = json.loads(files["cloudflare/http_ratelimit.json"])
    assert body == case.artifacts.ruleset
    parsed = hcl_subset.parse(files["terraform/ratelimit.tf"])
    [(_labels, local)] = parsed["locals"]
    assert local["edgegen_rules"] == body["rules"]
    resource = dict(parsed["resource"])[("cloudflare_ruleset", "edgegen_http_ratelimit")]
    assert resource["description"] == body["description"]


# --- the Worker: TOML and JavaScript -----------------------------------------------------


@pytest.mark.parametrize("case", worker_cases(), ids=lambda c: f"policy-{c.number}")
def test_wrangler_toml_reads_back(case: Case) -> None:
    """tomllib reads the name, the routes (hostile patterns intact) and the bindings."""
    worker = case.artifacts.worker
    assert worker is not None
    data = tomllib.loads(worker.wrangler_toml)
    assert data["name"] == WORKER
    assert data["main"] == "worker.js"
    assert data["account_id"] == ACCOUNT
    assert data["workers_dev"] is False
    assert [r["pattern"] for r in data["routes"]] == list(worker.routes)
    assert {r["zone_id"] for r in data["routes"]} == {ZONE}
    assert data["ratelimits"] == [
        {"name": b["name"], "namespace_id": b["namespace_id"], "simple": b["simple"]}
        for b in worker.bindings
    ]
    assert set(data) == {
        "name",
        "main",
        "compatibility_date",
        "account_id",
        "workers_dev",
        "routes",
        "ratelimits",
    }


def _sf_string(text: str) -> tuple[str, str]:
    """An RFC 8941 string at the start of ``text``: its value and what follows."""
    assert text.startswith('"')
    out, index = [], 1
    while text[index] != '"':
        char = text[index]
        assert 0x20 <= ord(char) <= 0x7E, text
        if char == "\\":
            index += 1
            assert text[index] in '"\\', text
            char = text[index]
        out.append(char)
        index += 1
    return "".join(out), text[index + 1 :]


def test_the_worker_modules_in_javascript(tmp_path: Path) -> None:
    """Node imports every module (so each parses) and reads CONFIG as the data edgegen
    meant: names, paths, hosts and credentials exactly as the policy has them."""
    paths = []
    for case in worker_cases():
        worker = case.artifacts.worker
        assert worker is not None
        path = tmp_path / f"worker-{case.number}.mjs"
        path.write_text(worker.module_source + "\nexport { CONFIG as __edgegen_config };\n")
        paths.append(str(path))
    runner = tmp_path / "read.mjs"
    runner.write_text(
        "import { pathToFileURL } from 'node:url';\n"
        "const out = [];\n"
        "for (const file of JSON.parse(process.argv[2])) {\n"
        "  out.push((await import(pathToFileURL(file))).__edgegen_config);\n"
        "}\n"
        "process.stdout.write(JSON.stringify(out));\n"
    )
    for path in (paths[0], paths[-1]):
        subprocess.run(["node", "--check", path], check=True, capture_output=True, timeout=60)
    result = subprocess.run(
        ["node", str(runner), json.dumps(paths)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    configs = json.loads(result.stdout)
    for case, config in zip(worker_cases(), configs, strict=True):
        when = case.loaded.authenticated_when
        assert config["authenticatedWhen"] == {
            "headers": list(when.headers),
            "cookies": list(when.cookies),
        }
        assert [c["name"] for c in config["limits"]] == [x.name for x in case.loaded.limits]
        for entry, limit in zip(config["limits"], case.loaded.limits, strict=True):
            matcher = limit.match.matcher()
            assert entry["paths"] == sorted(matcher.paths)
            assert entry["pathPrefixes"] == list(matcher.path_prefixes)
            assert entry["hosts"] == list(matcher.hosts)
            assert entry["problem"]["limit"] == limit.name
            shown, rest = _sf_string(entry["policy"])
            # policy.header_key: the app's key, whose percent-decoded content is the name.
            assert unquote(shown, errors="strict") == limit.name
            assert re.fullmatch(r";q=\d+;w=\d+", rest)


@pytest.mark.parametrize("case", worker_cases(), ids=lambda c: f"policy-{c.number}")
def test_no_policy_string_outside_the_blob(case: Case) -> None:
    """The module holds the policy's strings only in its JSON blob, which is ASCII with
    no <, > or & (so no </script> or <!-- in any form)."""
    worker = case.artifacts.worker
    assert worker is not None
    source = worker.module_source
    blob = source.split("const CONFIG = ", 1)[1].split(";\n\n", 1)[0]
    assert blob.isascii()
    assert not set("<>&\u2028\u2029") & set(blob)
    rest = source.replace(blob, "")
    for limit in case.loaded.limits:
        if len(limit.name) > 3:
            assert limit.name not in rest


# --- Markdown and the terminal -----------------------------------------------------------

_ALLOWED_TAG = re.compile(r"</?(?:details|summary|code)>")


def _outside_code(line: str) -> str:
    """The line without backslash escapes and code spans (CommonMark's rules: a run of n
    backticks opens a span that the next run of exactly n closes)."""
    out, index = [], 0
    while index < len(line):
        char = line[index]
        if char == "\\" and index + 1 < len(line) and not line[index + 1].isalnum():
            index += 2
            continue
        if char == "`":
            run = len(line[index:]) - len(line[index:].lstrip("`"))
            closer = re.compile(r"(?<!`)" + "`" * run + r"(?!`)")
            end = closer.search(line, index + run)
            if end is not None:
                index = end.end()
                continue
            out.append("`" * run)
            index += run
            continue
        out.append(char)
        index += 1
    return "".join(out)


def check_markdown(text: str) -> None:
    """Fences close; outside them, no HTML but edgegen's own balanced tags, no markup
    characters from names, and table rows of two cells."""
    fence: str | None = None
    opened = closed = 0
    for line in text.splitlines():
        if fence is not None:
            if line.strip() == fence:
                fence = None
            else:
                assert not (line.startswith(fence[0] * len(fence)) and set(line.strip()) == {"`"})
            continue
        match = re.match(r"(`{3,})\w*$", line)
        if match:
            fence = match.group(1)
            continue
        plain = _outside_code(line)
        for tag in re.findall(r"<[^>]*>?", plain):
            assert _ALLOWED_TAG.fullmatch(tag), (tag, line)
        opened += plain.count("<details>")
        closed += plain.count("</details>")
        if line.startswith("|"):
            assert len(re.findall(r"(?<!\\)\|", line)) == 3, line
        else:
            assert "|" not in plain, line
        if line.startswith("<"):
            continue  # an HTML block line (<details>): Markdown is not read in it
        for mark in ("*", "_", "["):
            # edgegen's own bold (**...**) is the only emphasis it writes.
            assert mark not in plain.replace("**", ""), (mark, line)
    assert fence is None
    assert opened == closed


def check_terminal(text: str) -> None:
    """No character a terminal would act on: ESC and other controls, bidi overrides."""
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text)


def _empty_zone() -> RemoteState:
    return RemoteState(Scope(ZONE, ACCOUNT, WORKER), None, None, ())


@pytest.mark.parametrize("case", corpus()[::3], ids=lambda c: f"policy-{c.number}-{c.plan}")
def test_plans_as_markdown_and_text(case: Case) -> None:
    """The plan of a hostile policy, as a pull request comment and on a terminal."""
    plan = make_plan(case.artifacts, _empty_zone())
    markdown = to_markdown(plan)
    check_markdown(markdown)
    for limit in case.loaded.limits:
        if limit.name in {c.limit for c in plan.rule_changes}:
            assert any(limit.name in line for line in markdown.splitlines())
    check_terminal(to_text(plan))


def _version(label: str, data: dict[str, Any]) -> _diff.Version:
    loaded = policy.loads(yaml.safe_dump(data, allow_unicode=True), label, env={})
    try:
        return _diff.Version(label, loaded, edgegen.build(loaded))
    except CompileError as exc:
        return _diff.Version(label, loaded, None, str(exc))


@pytest.mark.parametrize("number", range(0, COUNT, 2))
def test_diffs_as_markdown_and_text(number: int) -> None:
    """The diff from a plain policy to a hostile one, and to a hostile one that does not
    build (its error quotes the names): markup stays text, controls stay escaped."""
    rng = random.Random(number)
    hostile = _policy_data(rng, "enterprise", "auto")
    plain = json.loads(json.dumps(hostile))
    plain["limits"] = [{"name": "plain", "edge": {"rate": "5/1m", "unauthenticated_only": False}}]
    broken = json.loads(json.dumps(hostile))
    broken["cloudflare"]["plan"] = "pro"
    for limit in broken["limits"]:
        limit["edge"]["rate"] = "30/30s"
    for new in (hostile, broken):
        result = _diff.diff(_version("old/<b>|`x`.yaml", plain), _version("new.yaml", new))
        check_markdown(_diff.to_markdown(result))
        check_terminal(_diff.to_text(result))
    assert result.new.build_error is not None


def test_the_markdown_checker_catches_breakage() -> None:
    """The checks fail on the mistakes they look for."""
    for broken in (
        "- limit </details><script>x</script>",
        "- limit `a` | b",
        "| `a|b` | c |",
        "```diff\n+ x",
        "<details>\n",
        "- *bold* name",
    ):
        with pytest.raises(AssertionError):
            check_markdown(broken)
    check_markdown("- limit ``a`b`` \\<script\\> \\| \\*x\\*")
    with pytest.raises(AssertionError):
        check_terminal("a\x1b[2Jb")


def test_what_the_zone_says_reaches_the_terminal_escaped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rule made by hand whose description holds escape sequences, and an error message
    from Cloudflare (or a proxy) holding them: plan and the error show them escaped."""
    import respx
    from cloudflare_fake import TOKEN, FakeCloudflare, error, respond

    from edgegen import cli
    from edgegen.cloudflare import _client

    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", TOKEN)
    monkeypatch.setenv("CLOUDFLARE_ZONE_ID", ZONE)
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT)
    monkeypatch.setattr(_client, "_sleep", lambda seconds: None)
    example = Path(__file__).resolve().parents[2] / "examples" / "policy.yaml"
    fake = FakeCloudflare(zone_id=ZONE, account_id=ACCOUNT)
    fake.seed_rules(
        [
            {
                "ref": "hand\x1b[2J",
                "description": "\x1b]0;owned\x07 made by \u202ehand\r",
                "expression": "true",
                "action": "block",
                "ratelimit": {"characteristics": ["cf.colo.id"], "period": 10},
            }
        ]
    )
    with fake.mock():
        assert cli.main(["plan", str(example)]) == 0
    out = capsys.readouterr().out
    assert "\\x1b]0;owned\\x07 made by \\u202ehand\\x0d" in out
    check_terminal(out)
    with respx.mock(assert_all_called=False) as router:
        router.route().mock(
            return_value=respond(400, errors=[error(7, "bad \x1b[31mred\x1b[0m \u202etxt")])
        )
        assert cli.main(["plan", str(example)]) == 1
    err = capsys.readouterr().err
    assert "bad \\x1b[31mred\\x1b[0m \\u202etxt" in err
    check_terminal(err.replace("\n", ""))


def test_the_escaping_helpers() -> None:
    """markdown_text leaves no markup; code spans hold backticks and no line break;
    terminal_text shows controls and bidi overrides as escapes and keeps line breaks."""
    from edgegen._text import code, markdown_text, terminal_text

    escaped = markdown_text("</details> *a* [b](c) `d` | e\n\n# f")
    assert escaped == r"\<\/details\> \*a\* \[b\]\(c\) \`d\` \| e  \# f"
    check_markdown(f"- {escaped}")
    assert code("a``b") == "```a``b```"
    assert code("`x`") == "`` `x` ``"
    assert code("a\n\nb\r\nc") == "`a  b c`"
    assert terminal_text("a\x1b[2Jb\rc\u202ed\n\te") == "a\\x1b[2Jb\\x0dc\\u202ed\n\te"
