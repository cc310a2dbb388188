"""The corpus through each layer, as records the invariants are checked on.

- :func:`run_app`: every spelling, byte for byte, to a stack's app with applimit's middleware
  over a real Redis (every other one under ``SCRIPT_NAME`` where the server honours it,
  :func:`mounted`): which handler served it, which limits counted it, and how many requests
  the ``clients`` limit has counted for the client so far;
- :func:`oracle`: requests to the bare app (no middleware): which handler an origin runs;
- :func:`run_worker`: every spelling to the generated Worker in workerd: the URL and method
  the origin received, which limit bindings the Worker consulted and with which key, and
  the Worker's ``ipBucket`` of every client IP.

The rule expressions need no runner: tests/test_differential.py evaluates them with
tests/rules_eval.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import redis

import edgegen
from edgegen.compiler import _ids

from . import apps, spec
from .corpus import Spelling
from .rawhttp import NoAnswer, RawClient, Response

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "workers"
RUNNER = Path(__file__).with_name("worker_runner.mjs")
DEFAULT_EXPORT = "export default {"
_ITEM = re.compile(r'"((?:[^"\\]|\\.)*)"((?:;[a-z]+=-?\d+)*)')

# --- the apps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppRecord:
    """What one spelling did in an app. ``status`` 0: the server closed without answering."""

    spelling: Spelling
    status: int
    handler: str | None
    route_path: str | None
    counted: frozenset[str]
    clients_remaining: int | None
    # The SCRIPT_NAME header it was sent with (its target prefixed with it), if any.
    mount: str | None = None


def _items(value: str | None) -> dict[str, dict[str, int]]:
    """A RateLimit or RateLimit-Policy field: item name -> its integer parameters."""
    items: dict[str, dict[str, int]] = {}
    for match in _ITEM.finditer(value or ""):
        params = {}
        for param in match.group(2).split(";")[1:]:
            key, _, number = param.partition("=")
            params[key] = int(number)
        items[match.group(1).replace('\\"', '"').replace("\\\\", "\\")] = params
    return items


def _headers(host: str, ip: str | None, mount: str | None = None) -> list[tuple[str, str]]:
    headers = [("Host", host)]
    if ip is not None:
        headers.append(("CF-Connecting-IP", ip))
    if mount is not None:
        headers.append(("SCRIPT_NAME", mount))
    return headers


def _send(
    client: RawClient,
    method: str,
    target: bytes,
    host: str,
    ip: str | None,
    mount: str | None = None,
) -> Response:
    try:
        return client.request(method, target, _headers(host, ip, mount))
    except NoAnswer:
        return Response(status=0)


def mounted(stack: str, index: int, spelling: Spelling) -> bool:
    """Whether the runner sends this spelling under ``apps.MOUNT`` with a ``SCRIPT_NAME``
    header: every other origin-form request of a stack whose server honours the header."""
    return stack in apps.MOUNTED and index % 2 == 1 and spelling.target.startswith("/")


def run_app(stack: str, corpus: Iterable[Spelling], *, redis_url: str) -> list[AppRecord]:
    """Send the corpus to the stack's app under the middleware; one record per spelling."""
    prefix = f"diff-{stack}"
    with redis.Redis.from_url(redis_url) as client:
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
    text = spec.policy_text(target="rule", key_prefix=prefix)
    records = []
    with (
        apps.serve(stack, policy_text=text, redis_url=redis_url) as port,
        RawClient(apps.HOST, port) as http,
    ):
        for index, spelling in enumerate(corpus):
            target, mount = spelling.target_bytes, None
            if mounted(stack, index, spelling):
                target, mount = apps.MOUNT.encode("ascii") + target, apps.MOUNT
            response = _send(http, spelling.method, target, spelling.host, spelling.ip, mount)
            policies = _items(response.header("ratelimit-policy"))
            remaining = _items(response.header("ratelimit")).get(spec.CLIENTS, {}).get("r")
            route_path = response.header("x-route-path")
            records.append(
                AppRecord(
                    spelling=spelling,
                    status=response.status,
                    handler=response.header("x-handler"),
                    route_path=unquote(route_path) if route_path is not None else None,
                    counted=frozenset(policies),
                    clients_remaining=remaining,
                    mount=mount,
                )
            )
    return records


@dataclass(frozen=True)
class Served:
    """What the bare app did with a request: its status and the handler that ran (if any)."""

    status: int
    handler: str | None


def oracle(
    stack: str, requests: Iterable[tuple[str, str, str]]
) -> dict[tuple[str, str, str], Served]:
    """Ask the stack's bare app which handler serves each (method, target, host)."""
    answers: dict[tuple[str, str, str], Served] = {}
    with (
        apps.serve(stack, policy_text=None, redis_url=None) as port,
        RawClient(apps.HOST, port) as http,
    ):
        for method, target, host in requests:
            if (method, target, host) in answers:
                continue
            response = _send(http, method, target.encode("utf-8"), host, None)
            answers[method, target, host] = Served(response.status, response.header("x-handler"))
    return answers


# --- the Worker ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRecord:
    """What the Worker did with one spelling (``status`` 0: the request could not be sent)."""

    spelling: Spelling
    status: int
    origin_url: str | None
    origin_method: str | None
    consulted: tuple[tuple[str, str | None], ...]
    error: str | None
    # The ``detail`` of a problem+json answer the Worker gave itself, if any.
    detail: str | None = None

    @property
    def counted(self) -> frozenset[str]:
        """The limits whose binding the Worker called."""
        return frozenset(name for name, _ in self.consulted)

    @property
    def origin_request(self) -> tuple[str, str, str] | None:
        """(method, target, host) of the request the origin received."""
        if self.origin_url is None or self.origin_method is None:
            return None
        parts = urlsplit(self.origin_url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        return self.origin_method, target or "/", parts.netloc


@dataclass(frozen=True)
class WorkerRun:
    """The Worker's records, and its ``ipBucket`` per probed IP (None: it has no ipBucket)."""

    records: list[WorkerRecord]
    buckets: dict[str, str | None] | None


def origin_form(spelling: Spelling) -> bool:
    """Whether the target is in origin form (starts with ``/``): the only form a client can
    send through Cloudflare to a Worker route; other request lines are refused there."""
    return spelling.target.startswith("/")


def _entry_module(worker_js: str, bindings: dict[str, str]) -> str:
    """The generated module with an entry point that records binding calls (see
    worker_runner.mjs)."""
    if worker_js.count(DEFAULT_EXPORT) != 1:
        raise AssertionError(f"the generated worker.js has no single {DEFAULT_EXPORT!r}")
    renamed = worker_js.replace(DEFAULT_EXPORT, "const GENERATED_WORKER = {")
    return (
        renamed
        + f"\nconst DIFFERENTIAL_BINDINGS = {json.dumps(bindings)};\n"
        + """
export default {
  async fetch(request, env, ctx) {
    if (request.headers.get("x-differential-probe") !== null) {
      const probes = await request.json();
      let buckets = null;
      if (typeof ipBucket === "function") {
        buckets = probes.map(([ip, prefix]) => {
          try {
            return String(ipBucket(ip, prefix));
          } catch (err) {
            return `threw ${err}`;
          }
        });
      }
      return Response.json({ buckets });
    }
    const consulted = [];
    const recording = Object.assign({}, env);
    for (const [binding, name] of Object.entries(DIFFERENTIAL_BINDINGS)) {
      const real = env[binding];
      recording[binding] = {
        limit(options) {
          const key = options && options.key !== undefined ? String(options.key) : null;
          consulted.push([name, key]);
          return real.limit(options);
        },
      };
    }
    let response;
    try {
      response = await GENERATED_WORKER.fetch(request, recording, ctx);
    } catch (err) {
      return new Response(null, { status: 599, headers: { "x-differential-error": String(err) } });
    }
    const out = new Response(response.body, response);
    out.headers.set("x-differential-consulted", JSON.stringify(consulted));
    return out;
  },
};
"""
    )


def run_worker(
    corpus: Iterable[Spelling], directory: Path, probes: Iterable[str], ipv6_prefix: int
) -> WorkerRun:
    """Build the Worker from the test policy and send it every origin-form spelling."""
    loaded = spec.load_policy(target="worker")
    artifacts = edgegen.build(loaded)
    worker = artifacts.worker
    assert worker is not None, "the test policy put no limit in the Worker"
    edgegen.write(artifacts, directory)
    module = (directory / "worker" / worker.main_module).read_text(encoding="utf-8")
    bindings: dict[str, str] = {}
    for limit in loaded.limits:
        bindings[_ids.binding_name(limit.name)] = limit.name
        bindings[_ids.binding_name(limit.name) + "_CREDENTIALED"] = limit.name
    declared = {b["name"] for b in worker.bindings}
    bindings = {b: n for b, n in bindings.items() if b in declared}
    assert set(bindings) == declared, (declared, bindings)
    entry = directory / "worker" / "differential-entry.js"
    entry.write_text(_entry_module(module, bindings), encoding="utf-8")
    sent = [s for s in corpus if origin_form(s)]
    probe_list = sorted(set(probes))
    job = {
        "workers": str(WORKERS),
        "script": str(entry),
        "compatibilityDate": worker.compatibility_date,
        "ratelimits": {b["name"]: {"simple": b["simple"]} for b in worker.bindings},
        "probes": [[ip, ipv6_prefix] for ip in probe_list],
        "requests": [
            {
                "url": f"https://{s.host}{s.target}",
                "method": s.method,
                "headers": {"cf-connecting-ip": s.ip},
            }
            for s in sent
        ],
        "concurrency": 8,
    }
    result = _node(job)
    records = []
    for spelling, answer in zip(sent, result["responses"], strict=True):
        records.append(
            WorkerRecord(
                spelling=spelling,
                status=int(answer["status"]),
                origin_url=answer["originUrl"],
                origin_method=answer["originMethod"],
                consulted=tuple((str(n), k) for n, k in answer["consulted"] or ()),
                error=answer["error"],
                detail=answer["detail"],
            )
        )
    buckets = result["buckets"]
    return WorkerRun(
        records=records,
        buckets=None if buckets is None else dict(zip(probe_list, buckets, strict=True)),
    )


def _node(job: dict[str, Any]) -> Any:
    if not (WORKERS / "node_modules" / "miniflare").is_dir():
        raise AssertionError(
            "workers/node_modules has no miniflare: run `make test` or `npm ci --prefix workers`"
        )
    result = subprocess.run(
        ["node", str(RUNNER)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=WORKERS,
        check=False,
    )
    assert result.returncode == 0, f"worker_runner.mjs failed:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout)
