"""The Worker: its module (template + plain JavaScript), bindings and wrangler.toml.

The JavaScript is ``workers/templates/limiter.js`` (shipped as ``edgegen._worker_templates``),
included verbatim; ``worker.js.j2`` adds one JSON blob of policy data and the module's
``export default { fetch }``. No policy string is written anywhere else in the module.

Ids: each limit in the Worker gets a binding ``RL_<SLUG>_<HASH>`` and a ``namespace_id``
derived from the Worker's name and the limit's name (see ``_ids``), so redeploying the
same policy keeps its counters.
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass
from typing import Any

import jinja2

from policy import Limit, Policy, Worker

from . import _ids
from ._artifacts import WorkerArtifact

TEMPLATE_PACKAGE = "edgegen._worker_templates"
MODULE_TEMPLATE = "worker.js.j2"
LOGIC_FILE = "limiter.js"
MAIN_MODULE = "worker.js"

# Characters that must not appear literally in the JSON blob: <, > and & so that no policy
# string can look like markup (</script>, <!--) to any tool that scans the file, and
# U+2028/U+2029 (already escaped by ensure_ascii) which older JavaScript treats as newlines.
_JS_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}


def template_text(name: str) -> str:
    """The text of a file shipped in the Worker template package."""
    return importlib.resources.files(TEMPLATE_PACKAGE).joinpath(name).read_text("utf-8")


def script_json(value: object) -> str:
    """JSON that is safe to paste into JavaScript source as an expression.

    ASCII only (every non-ASCII character, U+2028/9 and lone surrogates become ``\\u``
    escapes), with ``<``, ``>`` and ``&`` escaped too; sorted nowhere, so the order is the
    order the compiler built, which is the policy's.
    """
    text = json.dumps(value, ensure_ascii=True, indent=2)
    for char, escape in _JS_UNSAFE.items():
        text = text.replace(char, escape)
    return text


def problem(limit: Limit, retry_after: int) -> dict[str, Any]:
    """The RFC 9457 body of a 429 for a limit (the rules' custom response uses it too)."""
    assert limit.edge is not None
    rate = limit.edge.rate
    return {
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": f"Rate limit exceeded: at most {rate.limit} requests in "
        f"{rate.period.seconds:g} seconds from one client. Retry after {retry_after} seconds.",
        "limit": limit.name,
    }


def policy_header(limit: Limit, period: int) -> str:
    """The ``RateLimit-Policy`` value: ``"name";q=100;w=60`` (an RFC 8941 string item).

    A structured-field string holds printable ASCII only; a name with anything else is
    written as its stable slug-and-hash id instead.
    """
    assert limit.edge is not None
    name = limit.name
    if not all(0x20 <= ord(c) <= 0x7E for c in name):
        name = f"{_ids.slug(name)}-{_ids.short_hash(name)}"
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{quoted}";q={limit.edge.rate.limit};w={period}'


@dataclass(frozen=True, slots=True)
class WorkerLimit:
    """One limit as the Worker carries it."""

    limit: Limit
    period: int

    @property
    def binding(self) -> str:
        """The binding's name in ``env``."""
        return _ids.binding_name(self.limit.name)

    @property
    def requests(self) -> int:
        """Requests allowed per period."""
        assert self.limit.edge is not None
        return self.limit.edge.rate.limit


def config(policy: Policy, limits: list[WorkerLimit]) -> dict[str, Any]:
    """The data the Worker's logic reads: credentials and, per limit, matcher and binding."""
    when = policy.authenticated_when
    entries: list[dict[str, Any]] = []
    for item in limits:
        limit = item.limit
        assert limit.edge is not None
        matcher = limit.match.matcher()
        entries.append(
            {
                "name": limit.name,
                "binding": item.binding,
                "paths": sorted(matcher.paths),
                "pathPrefixes": list(matcher.path_prefixes),
                "methods": sorted(matcher.methods),
                "hosts": list(matcher.hosts),
                "unauthenticatedOnly": limit.edge.unauthenticated_only,
                "limit": limit.edge.rate.limit,
                "period": item.period,
                "policy": policy_header(limit, item.period),
                "problem": problem(limit, item.period),
            }
        )
    return {
        "authenticatedWhen": {"headers": list(when.headers), "cookies": list(when.cookies)},
        "limits": entries,
    }


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(template_text),
        # JavaScript, not HTML: escaping is done by script_json, never by Jinja.
        autoescape=False,  # noqa: S701
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


def render_module(data: dict[str, Any]) -> str:
    """The Worker module's source for a config blob."""
    template = _environment().get_template(MODULE_TEMPLATE)
    count = len(data["limits"])
    return template.render(
        banner=f"{count} limit{'s' if count != 1 else ''} in this Worker; see docs/edge.md.",
        config_json=script_json(data),
        limiter_js=template_text(LOGIC_FILE),
    )


def toml_string(value: str) -> str:
    """A TOML basic string, ASCII only: quotes, backslashes and controls escaped."""
    out: list[str] = []
    for char in value:
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif 0x20 <= code <= 0x7E:
            out.append(char)
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"{value!r} contains a lone surrogate, which TOML cannot hold")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04X}")
        else:
            out.append(f"\\U{code:08X}")
    return '"' + "".join(out) + '"'


def bindings(worker: Worker, limits: list[WorkerLimit]) -> tuple[dict[str, Any], ...]:
    """The ratelimit bindings in the upload-metadata form of the Cloudflare API."""
    return tuple(
        {
            "type": "ratelimit",
            "name": item.binding,
            "namespace_id": _ids.namespace_id(worker.name, item.limit.name),
            "simple": {"limit": item.requests, "period": item.period},
        }
        for item in limits
    )


def wrangler_toml(policy: Policy, worker: Worker, binding_list: tuple[dict[str, Any], ...]) -> str:
    """wrangler.toml for the Worker: name, module, date, routes and one [[ratelimits]] each."""
    cloudflare = policy.cloudflare
    assert cloudflare is not None
    lines = [
        "# Generated by edgegen build from the rate-limit policy; do not edit.",
        "# Deploy from this directory with `wrangler deploy`.",
        f"name = {toml_string(worker.name)}",
        f"main = {toml_string(MAIN_MODULE)}",
        f"compatibility_date = {toml_string(worker.compatibility_date)}",
    ]
    if cloudflare.account_id:
        lines.append(f"account_id = {toml_string(cloudflare.account_id)}")
    # The Worker proxies to the origin with fetch(request); on workers.dev that origin would
    # be the Worker itself, so only the zone's routes may reach it.
    lines.append("workers_dev = false")
    if worker.routes:
        lines.append("routes = [")
        for route in worker.routes:
            if cloudflare.zone_id:
                lines.append(
                    f"  {{ pattern = {toml_string(route)}, zone_id = "
                    f"{toml_string(cloudflare.zone_id)} }},"
                )
            else:
                lines.append(f"  {toml_string(route)},")
        lines.append("]")
    for binding in binding_list:
        simple = binding["simple"]
        lines.extend(
            [
                "",
                f"# {simple['limit']} requests per {simple['period']} s per client IP",
                "[[ratelimits]]",
                f"name = {toml_string(binding['name'])}",
                f"namespace_id = {toml_string(binding['namespace_id'])}",
                f"simple = {{ limit = {simple['limit']}, period = {simple['period']} }}",
            ]
        )
    return "\n".join(lines) + "\n"


def build_worker(policy: Policy, limits: list[WorkerLimit]) -> WorkerArtifact:
    """The Worker artifact for the limits placed in it (the policy must name a Worker)."""
    cloudflare = policy.cloudflare
    assert cloudflare is not None and cloudflare.worker is not None
    worker = cloudflare.worker
    binding_list = bindings(worker, limits)
    return WorkerArtifact(
        name=worker.name,
        main_module=MAIN_MODULE,
        module_source=render_module(config(policy, limits)),
        compatibility_date=worker.compatibility_date,
        bindings=binding_list,
        routes=tuple(worker.routes),
        wrangler_toml=wrangler_toml(policy, worker, binding_list),
    )
