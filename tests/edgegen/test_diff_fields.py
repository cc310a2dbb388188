"""edgegen diff leaves no change out: every field of the policy, changed alone, is reported.

A reviewer reads the diff instead of the YAML, so a change the diff does not name is a change
nobody reviews. The policy here sets every field the models have (one limit per way of
counting at the edge, every app option); each field is then changed alone, in every way its
type allows (another value, and left out where it may be), and the diff must name it:
either in its own words or by its path. The walk is over the models' declared fields, so a
field added later is covered without touching this file.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import edgegen_policy as policy
import pytest
from edgegen_policy import Duration, Rate
from pydantic import BaseModel

from edgegen._diff import Version, semantic_changes

RICH = """
version: 1
cloudflare:
  plan: enterprise
  zone_id: 0123456789abcdef0123456789abcdef
  account_id: fedcba9876543210fedcba9876543210
  worker: { name: edge-limits, routes: ["api.example.com/*"], compatibility_date: "2025-01-01" }
authenticated_when: { headers: [authorization], cookies: [session] }
tiers: [free, pro]
clients: { ipv6_prefix: 64 }
app:
  redis_url: redis://localhost:6379/0
  key_prefix: rl
  on_redis_error: allow
  timeout: 50ms
  override_refresh: 5s
limits:
  - name: login
    description: Brute force on sign-in.
    match: { paths: [/login], path_prefix: [/auth/], methods: [POST], hosts: [api.example.com] }
    edge:
      rate: 10/1m
      per: ip
      action: managed_challenge
      timeout: 1m
      unauthenticated_only: true
      credentialed_rate: 100/1m
      target: auto
      requests_to_origin: true
    count_when: { status: [401, 403] }
  - name: tokens
    match: { path_prefix: [/v1/] }
    edge:
      rate: 100/1m
      target: worker
      tiers: true
      per:
        jwt:
          claim: sub
          header: x-token
          secret: JWT_SECRET
          issuer: https://id.example.com/
          audience: api
          leeway: 30s
          tier: plan
    app: { tiers: { free: 100/1m, pro: 1000/1m }, concurrency: 3 }
  - name: keys
    match: { path_prefix: [/v2/] }
    edge: { rate: 50/1m, per: { header: x-api-key } }
  - name: cookies
    match: { path_prefix: [/v3/] }
    edge: { rate: 50/1m, per: { cookie: sid } }
  - name: api
    match: { path_prefix: [/] }
    app:
      per: user
      algorithm: gcra
      tiers: { free: [100/1m, 1000/1h], pro: 1000/1m }
      burst: 20
      enforce: true
      on_redis_error: deny
      concurrency: { free: 1, pro: 4 }
      lease: 30s
      middleware: true
      quotas:
        free: { day: 1000, week: 5000, month: 10000, billing: 9000 }
        pro: { month: 90000 }
      quota_timezone: Europe/Paris
      billing_day_from: billing_day
  - name: reports
    match: { path_prefix: [/reports/] }
    app:
      per: org
      algorithm: sliding_window
      mode: approximate
      sync_every: 10
      sync_interval: 1s
      tiers: { free: 10/1m }
overrides:
  - limit: api
    user: acme
    rates: [5000/1m]
    quotas: { month: 2000000 }
    concurrency: 8
    expires: "2999-01-01"
    reason: contract
  - { limit: reports, key: { org: globex }, rates: [50/1m], expires: "2999-01-01", reason: trial }
"""


def _others(value: Any) -> Iterator[Any]:
    """Other values of a field's type (not validated: the diff reads models, never YAML)."""
    if isinstance(value, bool):
        yield not value
    elif isinstance(value, enum.Enum):
        yield from (m for m in type(value) if m is not value)
    elif isinstance(value, int):
        yield value + 1
    elif isinstance(value, str):
        yield type(value)(value + "x")
    elif isinstance(value, Duration):
        yield Duration(value.ms + 1000)
    elif isinstance(value, Rate):
        yield replace(value, limit=value.limit + 1)
        yield replace(value, period=Duration(value.period.ms * 2))
    elif isinstance(value, tuple):
        # Lists are compared as sets where order means nothing (match, routes, rates):
        # one fewer, and one more.
        if value:
            yield value[:-1]
            if not isinstance(value[-1], tuple):
                yield (*value, next(_others(value[-1])))
    elif isinstance(value, dict) and value:
        key = next(iter(value))
        yield {k: v for k, v in value.items() if k != key}
        yield {**value, key + "x": value[key]}
        yield from ({**value, key: other} for other in _others(value[key]))


def _allows_none(model: BaseModel, name: str) -> bool:
    return type(None) in typing.get_args(type(model).model_fields[name].annotation)


def _variants(model: BaseModel, path: str = "") -> Iterator[tuple[str, BaseModel]]:
    """Every single-field change of ``model``: (the field's path, the changed model)."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        where = f"{path}.{name}" if path else name
        if isinstance(value, BaseModel):
            for inner, changed in _variants(value, where):
                yield inner, model.model_copy(update={name: changed})
        elif isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
            for index, item in enumerate(value):
                for inner, changed in _variants(item, f"{where}[{index}]"):
                    items = (*value[:index], changed, *value[index + 1 :])
                    yield inner, model.model_copy(update={name: items})
        elif (
            isinstance(value, dict) and value and isinstance(next(iter(value.values())), BaseModel)
        ):
            for key, item in value.items():
                for inner, changed in _variants(item, f"{where}.{key}"):
                    yield inner, model.model_copy(update={name: {**value, key: changed}})
        else:
            for other in _others(value):
                if other != value:
                    yield where, model.model_copy(update={name: other})
        if value is not None and _allows_none(model, name):
            yield f"{where}=None", model.model_copy(update={name: None})


def _valid(changed: policy.Policy) -> bool:
    """Whether a policy file could say this: an override names one user or one key (one
    that names nobody cannot be loaded, so is never diffed)."""
    return all(bool(o.user) != bool(o.key) for o in changed.overrides)


BASE = policy.loads(RICH, "rich.yaml")
VARIANTS = [
    (path, changed) for path, changed in _variants(BASE) if path != "version" and _valid(changed)
]


def _changes(new: policy.Policy) -> list[str]:
    found = semantic_changes(Version("old", BASE, None), Version("new", new, None))
    return [c.render(markdown=False) for c in found]


def test_the_rich_policy_sets_every_field() -> None:
    """Nothing the models have is left at None in the base (else its changes go untried),
    but for the fields one of two must leave out, and the walk finds them all."""
    left_none: list[str] = []

    def walk(model: BaseModel, path: str) -> None:
        for name in type(model).model_fields:
            value = getattr(model, name)
            where = f"{path}.{name}" if path else name
            if value is None:
                left_none.append(where)
            elif isinstance(value, BaseModel):
                walk(value, where)
            elif isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
                for index, item in enumerate(value):
                    walk(item, f"{where}[{index}]")

    walk(BASE, "")
    # Each of these is None in one limit and set in another, or one of a pair.
    assert all(
        p.rsplit(".", 1)[-1]
        in {
            "description",
            "edge",
            "app",
            "count_when",
            "timeout",
            "credentialed_rate",
            "header",
            "cookie",
            "jwks",
            "burst",
            "on_redis_error",
            "sync_every",
            "sync_interval",
            "quotas",
            "billing_day_from",
            "user",
            "key",
            "rates",
            "concurrency",
            "week",
            "day",
            "billing",
        }
        for p in left_none
    ), left_none
    assert len(VARIANTS) > 150


@pytest.mark.parametrize(("path", "changed"), VARIANTS, ids=[p for p, _ in VARIANTS])
def test_every_field_changed_alone_is_reported(path: str, changed: policy.Policy) -> None:
    """The diff names at least one change for any one field changed."""
    assert changed != BASE
    assert _changes(changed), f"{path}: changed, and the diff says nothing"


def test_a_field_without_words_of_its_own_is_named_by_its_path() -> None:
    """sync_every has no sentence of its own: its path and both values are given."""
    limits = list(BASE.limits)
    app = limits[5].app
    assert app is not None
    limits[5] = limits[5].model_copy(update={"app": app.model_copy(update={"sync_every": 20})})
    [text] = _changes(BASE.model_copy(update={"limits": tuple(limits)}))
    assert text == "limit 'reports': 'app.sync_every' changed from '10' to '20'"


def test_jwt_verification_changes_are_named() -> None:
    """The issuer, audience, leeway and tier claim the Worker checks each have a line."""
    edge = BASE.limits[1].edge
    assert edge is not None and isinstance(edge.per, policy.JwtKey)
    jwt = edge.per.jwt.model_copy(
        update={"issuer": "https://evil.example/", "audience": None, "leeway": Duration(300_000)}
    )
    per = edge.per.model_copy(update={"jwt": jwt})
    limits = list(BASE.limits)
    limits[1] = limits[1].model_copy(update={"edge": edge.model_copy(update={"per": per})})
    texts = _changes(BASE.model_copy(update={"limits": tuple(limits)}))
    assert texts == [
        "limit 'tokens': the edge's JWT issuer changed from 'https://id.example.com/' to "
        "'https://evil.example/'",
        "limit 'tokens': the edge's JWT audience changed from 'api' to 'none'",
        "limit 'tokens': the edge's JWT leeway changed from '30s' to '5m'",
    ]


def test_concurrency_and_lease_changes_are_named() -> None:
    """A tier's slots at once and the lease each have a line."""
    limits = list(BASE.limits)
    app = limits[4].app
    assert app is not None
    limits[4] = limits[4].model_copy(
        update={
            "app": app.model_copy(
                update={"concurrency": {"free": 2, "pro": 4}, "lease": Duration(60_000)}
            )
        }
    )
    texts = _changes(BASE.model_copy(update={"limits": tuple(limits)}))
    assert texts == [
        "limit 'api': concurrency changed from 'free: 1, pro: 4' to 'free: 2, pro: 4'",
        "limit 'api': lease changed from '30s' to '1m'",
    ]


def test_a_reorder_of_limits_is_reported() -> None:
    """The edge checks a request against its limits in the policy's order and the first to
    refuse decides: two limits swapped is a change (a renamed one keeps its place)."""
    limits = list(BASE.limits)
    limits[0], limits[1] = limits[1], limits[0]
    [text] = _changes(BASE.model_copy(update={"limits": tuple(limits)}))
    assert text.startswith("limits are reordered: 'tokens, login, keys, cookies, api, reports'")
    renamed = list(BASE.limits)
    renamed[0] = renamed[0].model_copy(update={"name": "signin"})
    texts = _changes(BASE.model_copy(update={"limits": tuple(renamed)}))
    assert [t.split(":")[0] for t in texts] == ["limit 'login' is renamed to 'signin'"]


def test_a_field_that_may_hold_a_credential_is_named_never_shown() -> None:
    """A field no comparison describes whose name says credential (url, token, password,
    secret) is reported as changed without its values."""
    from pydantic import BaseModel as Model

    from edgegen._diff import _unsaid

    class Settings(Model):
        audit_url: str
        api_token: str
        color: str

    [url, token, color] = _unsaid(
        "api",
        "",
        Settings(audit_url="https://u:pw@a", api_token="t1", color="red"),
        Settings(audit_url="https://u:pw2@a", api_token="t2", color="blue"),
    )
    for change in (url, token):
        assert "pw" not in change.render(markdown=False) and "t1" not in change.render(False)
        assert change.render(markdown=False).endswith("from 'not shown' to 'not shown'")
    assert color.render(markdown=False) == "limit 'api': 'color' changed from 'red' to 'blue'"


def test_a_reorder_of_app_limits_alone_says_no_decision_changes() -> None:
    """Two limits without an edge part swapped: reported, with what it changes (nothing
    the app decides), not as an edge order."""
    limits = list(BASE.limits)
    limits[4], limits[5] = limits[5], limits[4]
    [text] = _changes(BASE.model_copy(update={"limits": tuple(limits)}))
    assert text.endswith("(the app decides a request's limits all at once: no decision changes)")
