"""Worker route patterns, read once as Cloudflare reads them.

A route pattern (developers.cloudflare.com/workers/configuration/routing/routes/) is a host
and a path, ``api.example.com/webhooks/*``, with ``*`` as its one operator: leading the host
(``*.example.com``, ``*example.com``) or ending the path. Cloudflare accepts an optional
scheme (``https://example.com/*``); the policy file refuses one, but a pattern built
without the loader, or read from a zone, may carry it, and it names the same host and path.
Placement (which hosts and paths a Worker limit covers, L211) and the replay (which
requests reach the Worker) read patterns here, so they cannot disagree on one.
"""

from __future__ import annotations

from edgegen_policy import normalize_host


def route_parts(route: str) -> tuple[str, str]:
    """A route pattern's host, lower case, and path: ``https://API.example.com/api/*`` ->
    (``api.example.com``, ``/api/*``); a pattern without a path covers every path
    (``/*``)."""
    _scheme, separator, rest = route.partition("://")
    pattern = rest if separator else route
    host, slash, path = pattern.partition("/")
    return host.lower(), (slash + path) if slash else "/*"


def route_covers(route: tuple[str, str], host: str, path: str) -> bool:
    """Whether a route (its :func:`route_parts`) sends a request for ``host`` and ``path``
    to the Worker: ``*`` leads the host or ends the path, as Cloudflare's route patterns
    allow."""
    route_host, route_path = route
    name = normalize_host(host)
    if route_host.startswith("*"):
        if not name.endswith(route_host[1:]):
            return False
    elif route_host != name:
        return False
    if route_path.endswith("*"):
        return path.startswith(route_path[:-1])
    return path == route_path
