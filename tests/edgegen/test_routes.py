"""Worker route patterns, read once (``edgegen._routes``) by placement's L211 and the replay.

The two readers used to differ on a pattern with a scheme (Cloudflare accepts
``https://hooks.example.com/*``; the policy loader refuses one, a policy built otherwise may
carry it): the replay read its host, placement read ``https:`` as the host and warned that
no route covered the limit's hosts. These tests hold both to one reading.
"""

from __future__ import annotations

import edgegen_policy as policy
import pytest

from edgegen import _placement
from edgegen._routes import route_covers, route_parts
from edgegen.replay._engine import ReplayLayer, replay
from edgegen.replay._types import Record

POLICY = """
version: 1
cloudflare: { plan: business, worker: { name: edge-limits, routes: ["hooks.example.com/*"] } }
limits:
  - name: hooks
    match: { hosts: [hooks.example.com], path_prefix: /webhooks/ }
    edge: { rate: 2/10s, unauthenticated_only: false, target: worker }
"""
T0 = 1_764_748_800_000_000


@pytest.mark.parametrize(
    ("pattern", "parts"),
    [
        ("hooks.example.com/*", ("hooks.example.com", "/*")),
        # A scheme names the same host and path.
        ("https://hooks.example.com/*", ("hooks.example.com", "/*")),
        ("http://hooks.example.com/webhooks/*", ("hooks.example.com", "/webhooks/*")),
        # The host is case-insensitive, the path is not.
        ("HOOKS.Example.COM/Webhooks/*", ("hooks.example.com", "/Webhooks/*")),
        # Wildcards stay where Cloudflare allows them.
        ("*.example.com/*", ("*.example.com", "/*")),
        ("*example.com/api*", ("*example.com", "/api*")),
        # No path: every path.
        ("hooks.example.com", ("hooks.example.com", "/*")),
        ("https://hooks.example.com", ("hooks.example.com", "/*")),
    ],
)
def test_route_parts(pattern: str, parts: tuple[str, str]) -> None:
    """A pattern's host (lower case, without a scheme) and path."""
    assert route_parts(pattern) == parts


def test_route_covers_hosts_and_paths() -> None:
    """A leading ``*`` covers any host ending so; a trailing ``*`` any path starting so."""
    assert route_covers(
        route_parts("https://*.example.com/webhooks/*"), "A.Example.com", "/webhooks/x"
    )
    assert not route_covers(route_parts("*.example.com/webhooks/*"), "a.example.com", "/api/x")
    assert route_covers(route_parts("hooks.example.com/exact"), "hooks.example.com", "/exact")
    assert not route_covers(route_parts("hooks.example.com/exact"), "hooks.example.com", "/exactly")


def with_routes(routes: tuple[str, ...]) -> policy.Policy:
    """The policy with other Worker routes, set past the loader (which refuses a scheme),
    as a program building a policy may."""
    loaded = policy.loads(POLICY)
    assert loaded.cloudflare is not None and loaded.cloudflare.worker is not None
    worker = loaded.cloudflare.worker.model_copy(update={"routes": routes})
    cloudflare = loaded.cloudflare.model_copy(update={"worker": worker})
    return loaded.model_copy(update={"cloudflare": cloudflare})


@pytest.mark.parametrize("route", ["hooks.example.com/*", "https://hooks.example.com/*"])
def test_placement_and_replay_read_a_route_alike(route: str) -> None:
    """With or without a scheme, the route covers the limit's host: lint finds no L211,
    and the replay sends the host's requests to the Worker (two of three admitted)."""
    loaded = with_routes((route,))
    assert [d for d in _placement.check(loaded).diagnostics if d.code == "L211"] == []
    records = [
        Record(T0 + i, "GET", "hooks.example.com", "/webhooks/a", "203.0.113.7") for i in range(3)
    ]
    result = replay(loaded, records)
    assert result.refused[ReplayLayer.WORKER] == 1
    assert result.admitted == 2
