"""Helpers shared by the tests that drive plan, pull and apply against the fake zone.

``Network`` sits between the client and ``FakeCloudflare``: it numbers every request and can
fail a chosen one the way a network or Cloudflare fails (a connection refused, an answer that
never comes, a 5xx, a 429), before or after the fake has acted on it. ``zone_state`` is what
the zone holds, without the ids and versions Cloudflare assigns, so two zones that hold the
same rules, Worker and routes compare equal.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import respx
from cloudflare_fake import FakeCloudflare, envelope, error

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "policy.yaml"

# Two rules made by hand in the dashboard: apply must keep them exactly, in place.
HAND_MADE: list[dict[str, Any]] = [
    {
        "ref": "scrapers",
        "description": "Block scrapers (made by hand)",
        "expression": 'http.request.uri.path eq "/catalog"',
        "action": "block",
        "ratelimit": {
            "characteristics": ["cf.colo.id", "ip.src"],
            "period": 10,
            "requests_per_period": 50,
            "mitigation_timeout": 600,
            "requests_to_origin": True,
        },
    },
    {
        "ref": "search-bots",
        "description": "Slow down search bots (made by hand)",
        "expression": 'http.request.uri.path eq "/search"',
        "action": "managed_challenge",
        "ratelimit": {
            "characteristics": ["cf.colo.id", "ip.src"],
            "period": 60,
            "requests_per_period": 100,
            "mitigation_timeout": 0,
        },
        "enabled": False,
    },
]


class Sleeps(list[float]):
    """Records each wait instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


class Terminal(io.StringIO):
    """A stdin that claims to be a terminal, holding the answer to apply's question."""

    def isatty(self) -> bool:
        return True


def variant(text: str, **replace: str) -> str:
    """``text`` with each ``old=new`` pair (given as a dict) replaced; each old must occur."""
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def clone(fake: FakeCloudflare) -> FakeCloudflare:
    """An independent copy of a fake zone that will hand out the same ids next."""
    upcoming = next(fake._ids)
    fake._ids = itertools.count(upcoming)
    values = {
        f.name: copy.deepcopy(getattr(fake, f.name))
        for f in dataclasses.fields(fake)
        if f.name not in ("_ids", "log")
    }
    return FakeCloudflare(**values, _ids=itertools.count(upcoming))


def zone_state(fake: FakeCloudflare) -> dict[str, Any]:
    """What the zone holds: rules (in order, without ids, versions, times), Worker scripts,
    routes (as pattern and script)."""
    entry = fake.entrypoint
    rules = None
    if entry is not None:
        rules = {
            "description": entry["description"],
            "rules": [
                {k: v for k, v in r.items() if k not in ("id", "version", "last_updated")}
                for r in entry["rules"]
            ],
        }
    scripts = {
        name: {
            "main_module": s.main_module,
            "modules": sorted((m, data, kind) for m, (data, kind) in s.modules.items()),
            "bindings": sorted(json.dumps(b, sort_keys=True) for b in s.bindings),
            "compatibility_date": s.compatibility_date,
        }
        for name, s in fake.scripts.items()
    }
    routes = sorted((r["pattern"], r["script"] or "") for r in fake.routes.values())
    return {"rules": rules, "scripts": scripts, "routes": routes}


@dataclass(frozen=True)
class Fault:
    """A failure of one request (or, ``persistent``, of it and every request after it).

    ``kind`` is ``connect`` (the connection never opened: Cloudflare saw nothing),
    ``timeout`` (no answer in time) or ``status`` (an answer with ``status``).
    ``after_write``: the fake acts on the request first and the answer is then lost or
    replaced, so the client cannot tell that it happened.
    """

    kind: str
    status: int = 0
    after_write: bool = False
    persistent: bool = False
    retry_after: str | None = None

    def fail(self, request: httpx.Request) -> httpx.Response:
        """Raise the transport error, or return the error answer."""
        if self.kind == "connect":
            raise httpx.ConnectError("connection refused (injected)", request=request)
        if self.kind == "timeout":
            raise httpx.ReadTimeout("timed out (injected)", request=request)
        headers = {"Retry-After": self.retry_after} if self.retry_after else {}
        code = 971 if self.status == 429 else 10013
        return httpx.Response(
            self.status,
            json=envelope(errors=[error(code, f"injected HTTP {self.status}")]),
            headers=headers,
        )


@dataclass
class Network:
    """The path from the client to a fake zone, with faults injected at chosen requests.

    ``requests`` lists (method, path) of each request in order; ``snapshots``, when a list,
    gets ``zone_state`` after every write the fake made (not dry runs).
    """

    fake: FakeCloudflare = field(default_factory=FakeCloudflare)
    fault: Fault | None = None
    at: int = -1
    requests: list[tuple[str, str]] = field(default_factory=list)
    snapshots: list[dict[str, Any]] | None = None
    on_request: Callable[[httpx.Request], None] | None = None

    def reset(self, fake: FakeCloudflare, fault: Fault | None = None, at: int = -1) -> None:
        """Serve ``fake`` from now on, failing request number ``at`` (counted from 0)."""
        self.fake = fake
        self.fault = fault
        self.at = at
        self.requests = []
        self.snapshots = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        index = len(self.requests)
        self.requests.append((request.method, request.url.path))
        if self.on_request is not None:
            self.on_request(request)
        fault = self.fault
        failing = fault is not None and (index == self.at or (fault.persistent and index > self.at))
        if fault is not None and failing and not fault.after_write:
            return fault.fail(request)
        response = self.fake.handle(request)
        dry_run = request.url.params.get("dry_run") == "true"
        if (
            self.snapshots is not None
            and request.method != "GET"
            and response.is_success
            and not dry_run
        ):
            self.snapshots.append(zone_state(self.fake))
        if fault is not None and failing:
            return fault.fail(request)
        return response

    @contextmanager
    def installed(self) -> Iterator[respx.MockRouter]:
        """Route every request to the fake's base URL through this network."""
        with respx.mock(base_url=self.fake.base_url, assert_all_called=False) as router:
            router.route().mock(side_effect=self)
            yield router
