"""The Worker: its module (template + plain JavaScript), bindings and wrangler.toml.

The JavaScript is ``workers/templates/limiter.js`` (shipped as ``edgegen._worker_templates``),
included verbatim; ``worker.js.j2`` adds one JSON blob of policy data and the module's
``export default { fetch }``. No policy string is written anywhere else in the module.

Ids: each limit in the Worker gets a binding ``RL_<SLUG>_<HASH>`` and a ``namespace_id``
derived from the Worker's name and the limit's name (see ``_ids``), so redeploying the
same policy keeps its counters. An "unauthenticated only" limit gets a second binding for
requests that carry a credential, ``RL_<SLUG>_<HASH>_CREDENTIALED``, whose namespace id is
derived from the same names plus ``credentialed``.
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgegen_policy import (
    QUOTA_EXCEEDED,
    CookieKey,
    HeaderKey,
    JwtKey,
    Limit,
    Policy,
    Rate,
    Worker,
    header_key,
)

from .._capabilities import key_text
from .._placement import edge_tier_rates
from . import _ids
from ._artifacts import WorkerArtifact

if TYPE_CHECKING:
    import jinja2

TEMPLATE_PACKAGE = "edgegen._worker_templates"
MODULE_TEMPLATE = "worker.js.j2"
LOGIC_FILE = "limiter.js"
KEYS_FILE = "keys.js"
# The Worker secret that keys the hash of header, cookie and claim values (HMAC-SHA-256):
# set by the user with wrangler or Terraform, never written in a generated file.
KEY_SECRET = "EDGEGEN_KEY_SECRET"
MAIN_MODULE = "worker.js"
CREDENTIALED_SUFFIX = "_CREDENTIALED"

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


def problem(
    limit: Limit, retry_after: int, rate: Rate | None = None, who: str = "one client IP"
) -> dict[str, Any]:
    """The RFC 9457 body of a 429 for a limit (the rules' custom response uses it too).

    The same problem type and members as the app's refusal (applimit's ``Gate``), so a
    client handles a refusal the same way whichever layer sent it: ``limit``, the limit's
    name; ``violated-policies``, the names of the refused ``RateLimit-Policy`` items (one
    here: an edge limit has one rate per counter); ``retry-after``, the seconds also sent
    in ``Retry-After``. ``rate`` is the rate that refused (default: the limit's edge rate;
    the credentialed counter passes its own); ``who`` is what one counter counts.
    """
    assert limit.edge is not None
    rate = rate or limit.edge.rate
    seconds = "second" if retry_after == 1 else "seconds"
    return {
        "type": QUOTA_EXCEEDED,
        "title": "Too Many Requests",
        "status": 429,
        "detail": f"Rate limit {limit.name!r} allows {rate.limit} requests per "
        f"{rate.period} from {who}; retry in {retry_after} {seconds}.",
        "limit": limit.name,
        "violated-policies": [limit.name],
        "retry-after": retry_after,
    }


def policy_header(limit: Limit, period: int, rate: Rate | None = None) -> str:
    """The ``RateLimit-Policy`` value: ``"name";q=100;w=60``.

    The name is written as ``policy.header_key`` writes it, the same key the app sends for
    the same limit (a non-ASCII name is percent-encoded, not replaced).
    """
    assert limit.edge is not None
    rate = rate or limit.edge.rate
    return f"{header_key(limit.name)};q={rate.limit};w={period}"


def count_when_config(limit: Limit) -> dict[str, Any]:
    """``countWhen`` for a counter of a limit with ``count_when``: the statuses as
    ``[low, high]`` pairs (the Worker counts after the answer, see limiter.js); nothing for
    a limit that counts every request, so its counters read as before."""
    if limit.count_when is None:
        return {}
    return {"countWhen": [[low, high] for low, high in limit.count_when.status]}


def credentialed_binding_name(name: str) -> str:
    """The binding of a limit's counter for requests that carry a credential."""
    return _ids.binding_name(name) + CREDENTIALED_SUFFIX


def credentialed_namespace_id(worker: str, name: str) -> str:
    """The namespace id of that binding: like ``_ids.namespace_id``, over one more part.

    A limit name never holds a NUL (names are printable), so no limit's own id can equal it.
    """
    return _ids.namespace_id(worker, f"{name}\0credentialed")


@dataclass(frozen=True, slots=True)
class WorkerLimit:
    """One limit as the Worker carries it (``credentialed``: the rate of its second counter)."""

    limit: Limit
    period: int
    credentialed: Rate | None = None

    @property
    def binding(self) -> str:
        """The binding's name in ``env``."""
        return _ids.binding_name(self.limit.name)

    @property
    def requests(self) -> int:
        """Requests allowed per period."""
        assert self.limit.edge is not None
        return self.limit.edge.rate.limit

    @property
    def credentialed_period(self) -> int:
        """The period of the credentialed counter, in seconds (10 or 60, as placed)."""
        assert self.credentialed is not None
        period = self.credentialed.period.whole_seconds
        assert period is not None
        return period


def _counter(limit: Limit, binding: str, rate: Rate, period: int) -> dict[str, Any]:
    """What the Worker needs to count one counter and to answer its 429."""
    return {
        "name": limit.name,
        "binding": binding,
        "limit": rate.limit,
        "period": period,
        "policy": policy_header(limit, period, rate),
        "problem": problem(limit, period, rate, _who(limit)),
    }


# --- keys beyond the address (keys.js) -----------------------------------------------------


def _who(limit: Limit) -> str:
    """What one counter of the limit counts, for the 429's detail."""
    assert limit.edge is not None
    if key_config(limit) is None:
        return "one client IP"
    return f"one value of {key_text(limit.edge.per)} (one client IP for requests without it)"


def key_config(limit: Limit) -> dict[str, Any] | None:
    """The ``key`` of a limit's entry in the Worker's config, or None (counted by address).

    ``ip_nat`` has none: the Worker cannot see Cloudflare's visitor id (lint's L214).
    """
    assert limit.edge is not None
    per = limit.edge.per
    if isinstance(per, HeaderKey):
        return {"kind": "header", "header": per.header}
    if isinstance(per, CookieKey):
        return {"kind": "cookie", "cookie": per.cookie}
    if isinstance(per, JwtKey):
        jwt = per.jwt
        return {
            "kind": "jwt",
            "header": jwt.token_header,
            "cookie": jwt.cookie,
            "claim": jwt.claim,
            "algorithms": list(jwt.algorithms),
            "secret": jwt.secret,
            "jwks": jwt.jwks,
            "issuer": jwt.issuer,
            "audience": jwt.audience,
            "leeway": jwt.leeway.ms // 1000,
            "tierClaim": jwt.tier,
        }
    return None


def tier_binding_name(name: str, tier_index: int, rate_index: int) -> str:
    """The binding of one app tier's rate at the edge (``edge.tiers``)."""
    return f"{_ids.binding_name(name)}_T{tier_index}_{rate_index}"


def tier_namespace_id(worker: str, name: str, tier: str, rate_index: int) -> str:
    """Its namespace id: derived from the names, the tier and the rate's place."""
    return _ids.namespace_id(worker, f"{name}\0tier\0{tier}\0{rate_index}")


def tier_counters(limit: Limit) -> list[tuple[str, str, int, Rate]]:
    """(tier, binding, rate index, rate) of each app rate an ``edge.tiers`` limit counts."""
    out = []
    for tier_index, (tier, rates) in enumerate(edge_tier_rates(limit).items()):
        for rate_index, rate in enumerate(rates):
            out.append(
                (tier, tier_binding_name(limit.name, tier_index, rate_index), rate_index, rate)
            )
    return out


def _tiers_config(limit: Limit) -> dict[str, list[dict[str, Any]]]:
    """The counters of each tier the edge holds to its app rates (empty: none)."""
    assert limit.edge is not None
    out: dict[str, list[dict[str, Any]]] = {}
    who = f"one value of {key_text(limit.edge.per)} in tier"
    for tier, binding, _index, rate in tier_counters(limit):
        period = rate.period.whole_seconds
        assert period is not None
        counter = _counter(limit, binding, rate, period)
        counter["problem"] = problem(limit, period, rate, f"{who} {tier!r}")
        # A count_when limit's tier counters count after the answer too.
        counter.update(count_when_config(limit))
        out.setdefault(tier, []).append(counter)
    return out


def secret_names(limits: list[WorkerLimit]) -> tuple[str, ...]:
    """The Worker secrets the limits read: the hash key, then each HS256 key, in order."""
    names: list[str] = []
    for item in limits:
        key = key_config(item.limit)
        if key is None:
            continue
        names.append(KEY_SECRET)
        if key["kind"] == "jwt" and key["secret"]:
            names.append(key["secret"])
    return tuple(dict.fromkeys(names))


def secrets_toml_comment(limits: list[WorkerLimit]) -> list[str]:
    """wrangler.toml lines that say which secrets to set, and what happens without them."""
    names = secret_names(limits)
    if not names:
        return []
    lines = [
        "",
        "# Limits keyed by a header, a cookie or a token claim count a keyed hash of the value",
        f"# (HMAC-SHA-256 with the secret {KEY_SECRET}), never the value. Set it once, 32",
        "# random bytes, e.g.:",
        f"#   openssl rand -base64 32 | wrangler secret put {KEY_SECRET}",
        "# Until it is set (16 characters at least), those limits count by client IP.",
    ]
    lines.extend(
        f"# HS256 tokens are verified with the secret {name}: wrangler secret put {name}"
        " (without it, tokens are unverified and counted by client IP)."
        for name in names[1:]
    )
    return lines


def config(policy: Policy, limits: list[WorkerLimit]) -> dict[str, Any]:
    """The data the Worker's logic reads: credentials, the IPv6 prefix and, per limit,
    matcher and counters (the second one for requests that carry a credential, or null)."""
    when = policy.authenticated_when
    entries: list[dict[str, Any]] = []
    for item in limits:
        limit = item.limit
        assert limit.edge is not None
        matcher = limit.match.matcher()
        own = _counter(limit, item.binding, limit.edge.rate, item.period)
        credentialed = None
        if item.credentialed is not None:
            credentialed = _counter(
                limit,
                credentialed_binding_name(limit.name),
                item.credentialed,
                item.credentialed_period,
            )
            credentialed.update(count_when_config(limit))
        entries.append(
            {
                "name": own["name"],
                "binding": own["binding"],
                "paths": sorted(matcher.paths),
                "pathPrefixes": list(matcher.path_prefixes),
                "methods": sorted(matcher.methods),
                "hosts": list(matcher.hosts),
                "unauthenticatedOnly": limit.edge.unauthenticated_only,
                "limit": own["limit"],
                "period": own["period"],
                "policy": own["policy"],
                "problem": own["problem"],
                **count_when_config(limit),
                "withCredential": credentialed,
            }
        )
        key = key_config(limit)
        if key is not None:
            entries[-1]["key"] = key
        tiers = _tiers_config(limit)
        if tiers:
            entries[-1]["tiers"] = tiers
    data: dict[str, Any] = {
        "authenticatedWhen": {"headers": list(when.headers), "cookies": list(when.cookies)},
        "ipv6Prefix": policy.clients.ipv6_prefix,
        "limits": entries,
    }
    if secret_names(limits):
        data["keySecret"] = KEY_SECRET
    return data


def _environment() -> jinja2.Environment:
    # Imported here: only the Worker's module needs Jinja (the edge extra), so a policy
    # without Worker limits, and every other command, runs without it.
    import jinja2

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
        # Only a Worker with a keyed limit carries keys.js (and CONFIG.keySecret).
        keys_js=template_text(KEYS_FILE) if "keySecret" in data else "",
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
    """The ratelimit bindings in the upload-metadata form of the Cloudflare API.

    Per limit in policy order: its own binding, then the one for credentialed requests.
    """
    out: list[dict[str, Any]] = []
    for item in limits:
        out.append(
            {
                "type": "ratelimit",
                "name": item.binding,
                "namespace_id": _ids.namespace_id(worker.name, item.limit.name),
                "simple": {"limit": item.requests, "period": item.period},
            }
        )
        for tier, binding, index, rate in tier_counters(item.limit):
            out.append(
                {
                    "type": "ratelimit",
                    "name": binding,
                    "namespace_id": tier_namespace_id(worker.name, item.limit.name, tier, index),
                    "simple": {"limit": rate.limit, "period": rate.period.whole_seconds},
                }
            )
        if item.credentialed is not None:
            out.append(
                {
                    "type": "ratelimit",
                    "name": credentialed_binding_name(item.limit.name),
                    "namespace_id": credentialed_namespace_id(worker.name, item.limit.name),
                    "simple": {
                        "limit": item.credentialed.limit,
                        "period": item.credentialed_period,
                    },
                }
            )
    return tuple(out)


def wrangler_toml(
    policy: Policy,
    worker: Worker,
    binding_list: tuple[dict[str, Any], ...],
    limits: list[WorkerLimit] | None = None,
) -> str:
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
    lines.extend(secrets_toml_comment(limits or []))
    keyed = {
        item.binding: key_text(item.limit.edge.per)
        for item in limits or []
        if item.limit.edge is not None and key_config(item.limit) is not None
    }
    for item in limits or []:
        assert item.limit.edge is not None
        for tier, tier_binding, _index, _rate in tier_counters(item.limit):
            keyed[tier_binding] = f"{key_text(item.limit.edge.per)} in tier {tier}"
    for binding in binding_list:
        simple = binding["simple"]
        who = f"{keyed[binding['name']]} value" if binding["name"] in keyed else "client IP"
        lines.extend(
            [
                "",
                f"# {simple['limit']} requests per {simple['period']} s per {who}"
                + (
                    ", requests that carry a credential"
                    if binding["name"].endswith(CREDENTIALED_SUFFIX)
                    else ""
                ),
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
        wrangler_toml=wrangler_toml(policy, worker, binding_list, limits),
        secrets=secret_names(limits),
    )
