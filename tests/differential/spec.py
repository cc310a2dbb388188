"""The test policy and the apps' routes, with the limits that claim each route.

The policy's limits mirror the routes: exact paths (``/login`` for POST, ``/api/search`` for
GET and POST, ``/api/items`` for GET, ``/café``), prefixes (``/api/``,
``/api/v1/exports/``) and a prefix limited to hosts (``/webhooks/`` on
``hooks.example.com`` and its subdomains). Quotas are so large that nothing is ever
refused: the suite observes *which* limits count a request, never a refusal. One more
limit, ``clients``, matches every request and counts per client IP with an exact
algorithm, so the ``r`` it reports tells how many requests the app has counted for that
client so far.

:data:`ROUTES` is the ground truth the layers are held to: which handler serves what, and
which limits claim it. It is written out by hand rather than derived from the matchers under
test.
"""

from __future__ import annotations

from dataclasses import dataclass

import edgegen_policy as policy

ANY_METHOD = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH")
GET = ("GET", "HEAD")  # both frameworks serve HEAD with the GET handler
POST = ("POST",)

# The limit that counts every request per client IP (app only; see the module docstring).
CLIENTS = "clients"
# Every limit's app quota and window: large enough that no run comes near it.
APP_QUOTA = 1_000_000
IPV6_PREFIX = 64

WEBHOOK_HOSTS = ("hooks.example.com", "*.hooks.example.com")


@dataclass(frozen=True)
class Limit:
    """One limit of the test policy: its name and its ``match:`` block as YAML."""

    name: str
    match: str
    hosts: tuple[str, ...] = ()


LIMITS = (
    Limit("login", "{ paths: [/login], methods: [POST] }"),
    Limit("api", "{ path_prefix: /api/ }"),
    Limit("search", "{ paths: [/api/search], methods: [GET, POST] }"),
    Limit("items", "{ paths: [/api/items], methods: [GET] }"),
    Limit("exports", "{ path_prefix: /api/v1/exports/ }"),
    Limit(
        "webhooks",
        '{ hosts: [hooks.example.com, "*.hooks.example.com"], path_prefix: /webhooks/ }',
        hosts=WEBHOOK_HOSTS,
    ),
    Limit("cafe", "{ paths: [/café] }"),
)
EDGE_LIMITS = tuple(limit.name for limit in LIMITS)


@dataclass(frozen=True)
class Route:
    """A route of both apps: the handler's name, its path template, methods and claims.

    ``template`` uses FastAPI's syntax (``{item_id}``, ``{rest:path}``); the Flask app
    translates it. ``claims`` are the limits that cover every request this handler serves
    (a limit limited to hosts claims it only for those hosts, see :func:`claims`).
    """

    handler: str
    template: str
    methods: tuple[str, ...]
    claims: tuple[str, ...] = ()

    @property
    def flask_rule(self) -> str:
        """The template in werkzeug's syntax."""
        return (
            self.template.replace("{rest:path}", "<path:rest>")
            .replace("{item_id}", "<item_id>")
            .replace("{name}", "<name>")
        )


# Order matters for FastAPI (first match wins): specific routes before the catch-alls.
ROUTES = (
    Route("root", "/", GET),
    Route("login_page", "/login", GET),
    Route("login", "/login", POST, claims=("login",)),
    Route("search", "/api/search", ("GET", "HEAD", "POST"), claims=("api", "search")),
    Route("items", "/api/items", GET, claims=("api", "items")),
    Route("item", "/api/items/{item_id}", GET, claims=("api",)),
    Route("export", "/api/v1/exports/{name}", GET, claims=("api", "exports")),
    Route("api_other", "/api/{rest:path}", ANY_METHOD, claims=("api",)),
    Route("webhook", "/webhooks/{rest:path}", POST, claims=("webhooks",)),
    Route("cafe", "/café", GET, claims=("cafe",)),
    Route("static", "/static/{rest:path}", GET),
)
HANDLERS = {route.handler: route for route in ROUTES}


def host_name(raw: str) -> str:
    """A Host value as a name: lower case, without port or trailing dots (written here, not
    taken from the library under test)."""
    host = raw.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def in_hosts(patterns: tuple[str, ...], raw_host: str) -> bool:
    """Whether a Host value names one of the hosts (``*.x`` is every subdomain of x)."""
    name = host_name(raw_host)
    for pattern in patterns:
        if pattern.startswith("*."):
            if name.endswith(pattern[1:]) and len(name) > len(pattern) - 1:
                return True
        elif name == pattern:
            return True
    return False


LIMIT_HOSTS = {limit.name: limit.hosts for limit in LIMITS}


def claims(handler: str, host: str) -> frozenset[str]:
    """The limits that must count a request the handler served, sent with this Host."""
    route = HANDLERS[handler]
    return frozenset(
        name
        for name in route.claims
        if not LIMIT_HOSTS.get(name) or in_hosts(LIMIT_HOSTS[name], host)
    )


def policy_text(*, target: str, key_prefix: str = "diff") -> str:
    """The test policy; every edge limit is forced to ``target`` (``rule`` or ``worker``).

    The plan is Enterprise, where rules may use the host and the method.
    """
    lines = [
        "version: 1",
        "cloudflare:",
        "  plan: enterprise",
        "  worker:",
        "    name: differential",
        '    routes: ["api.example.com/*", "hooks.example.com/*", "*.hooks.example.com/*"]',
        "tiers: [free]",
        f"clients: {{ ipv6_prefix: {IPV6_PREFIX} }}",
        f"app: {{ key_prefix: {key_prefix}, timeout: 5s, on_redis_error: allow }}",
        "limits:",
    ]
    for limit in LIMITS:
        lines += [
            f"  - name: {limit.name}",
            f"    match: {limit.match}",
            f"    edge: {{ rate: 100000/1m, unauthenticated_only: false, target: {target} }}",
            f"    app: {{ per: ip, algorithm: sliding_window, tiers: {{ free: {APP_QUOTA}/1h }} }}",
        ]
    # Exact counts per client: a sliding log (lint warns about its memory; a run stays small).
    lines += [
        f"  - name: {CLIENTS}",
        f"    app: {{ per: ip, algorithm: sliding_log, tiers: {{ free: {APP_QUOTA}/1h }} }}",
    ]
    return "\n".join(lines) + "\n"


def load_policy(*, target: str, key_prefix: str = "diff") -> policy.Policy:
    """The test policy, loaded."""
    return policy.loads(policy_text(target=target, key_prefix=key_prefix))
