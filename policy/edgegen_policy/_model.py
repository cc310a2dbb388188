"""The policy file's schema: frozen pydantic models where unknown keys are errors.

These models are the single source of truth for the file format; ``edgegen schema`` prints
their JSON Schema and docs/policy.md describes each field. Checks that need the whole policy
(tier names, duplicates, plan capabilities) live in the lint pass, so that one bad limit
does not hide the others.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import DEFAULT_REF_TEMPLATE, GenerateJsonSchema, JsonSchemaMode

from ._calendar import Period
from ._match import Matcher, canonical_path, decode_path
from ._net import DEFAULT_IPV6_PREFIX, MAX_IPV6_PREFIX, MIN_IPV6_PREFIX
from ._schema import LoaderJsonSchema
from ._vocab import (
    HTTP_METHODS,
    KEY_NAME_RE,
    Action,
    Algorithm,
    AppKey,
    CloudflarePlan,
    Duration,
    EdgeKey,
    EdgeTarget,
    KeyName,
    Mode,
    OnRedisError,
    Rate,
)

_TIER_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
_WORKER_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_HEADER_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_COOKIE_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_HOST_RE = re.compile(
    r"^(\*\.)?(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$"
)
_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_ESCAPE_RE = re.compile(r"%[0-9A-Fa-f]{2}")
_KEY_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
MAX_NAME_LENGTH = 64
MAX_LIMITS = 200
# The most overrides: the file's are for contracts, each reviewed; many more belong in Redis.
MAX_OVERRIDES = 1000
# What one override may give, in the file and at run time alike (applimit checks the same).
OVERRIDE_MAX_RATES = 8
OVERRIDE_MAX_UNITS = 10**15
# The tier name of what an override gives, in decisions, decision-event logs and replays.
OVERRIDE_TIER = "override"
MAX_PATH_CHARS = 1024


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False)


def _as_tuple(value: object) -> object:
    """Accept a single string where a list is expected: ``methods: POST``."""
    if isinstance(value, str):
        return (value,)
    return value


def _as_key(value: object) -> object:
    """What a limit counts by is a name; anything else gets one error that says so (not one
    per member of the union)."""
    if not isinstance(value, str):
        raise ValueError(
            f"{value!r} is not a key name; write user, ip, or a key of the app's own such as org"
        )
    return value


def _as_rates(value: object) -> object:
    """A tier's limit is one rate or a list of rates (all of which must hold)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("an empty list of rates limits nothing; give at least one rate")
        return tuple(Rate.parse(v) for v in value)
    return (Rate.parse(value),)


_RATE_SCHEMA = {key: value for key, value in Rate.JSON_SCHEMA.items() if key != "examples"}

Rates = Annotated[
    tuple[Rate, ...],
    BeforeValidator(_as_rates),
    WithJsonSchema(
        {
            "anyOf": [
                _RATE_SCHEMA,
                {"type": "array", "items": _RATE_SCHEMA, "minItems": 1},
            ]
        }
    ),
]


# The schema describes what the file may say (one name, or a list), not the tuple held.
def _not_a_flag(value: object) -> object:
    """pydantic reads true as 1 for a number; ``burst: yes`` is a mistake, not a burst of 1."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not a number; write a whole number")
    return value


StrList = Annotated[
    tuple[str, ...], BeforeValidator(_as_tuple, json_schema_input_type=str | list[str])
]


def _check_path(path: str, what: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{what} {path!r} must start with '/'")
    if len(path) > MAX_PATH_CHARS:
        raise ValueError(f"{what} is {len(path)} characters long; the maximum is {MAX_PATH_CHARS}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise ValueError(f"{what} {path!r} contains a control character")
    if "?" in path or "#" in path:
        raise ValueError(f"{what} {path!r} contains '?' or '#'; match on the path only")
    if _ESCAPE_RE.search(path):
        raise ValueError(
            f"{what} {path!r} contains a percent-escape; request paths are compared decoded, "
            f"so write it as the router declares it ({decode_path(path)!r})"
        )
    canonical = canonical_path(path)
    if canonical != path:
        raise ValueError(
            f"{what} {path!r} has a '//', '\\' or a '.'/'..' segment, which no request path "
            f"keeps once normalised; write {canonical!r}"
        )
    return path


class Match(_Model):
    """Which requests a limit applies to. Empty criteria match everything."""

    paths: StrList = Field(default=(), description="Exact request paths, e.g. /login.")
    path_prefix: StrList = Field(
        default=(), description="Path prefixes (one or a list), e.g. /api/."
    )
    methods: StrList = Field(default=(), description="HTTP methods, e.g. [POST]. Empty: any.")
    hosts: StrList = Field(
        default=(), description="Host names; *.example.com matches subdomains. Empty: any."
    )

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_check_path(p, "path") for p in value)

    @field_validator("path_prefix")
    @classmethod
    def _prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_check_path(p, "path prefix") for p in value)

    @field_validator("methods")
    @classmethod
    def _methods(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for method in value:
            upper = method.upper()
            if upper not in HTTP_METHODS:
                known = ", ".join(sorted(HTTP_METHODS))
                raise ValueError(f"{method!r} is not an HTTP method; use one of {known}")
            out.append(upper)
        return tuple(dict.fromkeys(out))

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for host in value:
            lower = host.lower()
            if not _HOST_RE.match(lower) or len(lower) > 253:
                raise ValueError(
                    f"{host!r} is not a host name; write it like api.example.com or "
                    "*.example.com (no scheme, port or path)"
                )
            out.append(lower)
        return tuple(out)

    def matcher(self) -> Matcher:
        """The plain matcher for this block, used by the app and the edge compiler alike."""
        return Matcher.create(
            paths=self.paths, path_prefixes=self.path_prefix, methods=self.methods, hosts=self.hosts
        )


# --- what an edge limit counts by, beyond the address --------------------------------------

# A Worker secret's name, as wrangler and the API take it (and as JavaScript reads env).
_SECRET_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
# A JWT claim name: printable ASCII without spaces (registered claims, namespaced URLs).
_CLAIM_RE = re.compile(r"^[\x21-\x7e]{1,128}$")
_JWKS_URL_RE = re.compile(r"^https://[A-Za-z0-9.-]+(:[0-9]{1,5})?/[\x21-\x7e]{0,2000}$")
MAX_JWT_LEEWAY_MS = 5 * 60_000
DEFAULT_JWT_LEEWAY = "60s"
DEFAULT_JWT_HEADER = "authorization"


def _header_name(value: str) -> str:
    if not _HEADER_RE.match(value):
        raise ValueError(
            f"{value!r} is not an HTTP header name; use letters, digits and -, e.g. x-api-key"
        )
    return value.lower()


def _cookie_name(value: str) -> str:
    if not _COOKIE_RE.match(value):
        raise ValueError(f"{value!r} is not a cookie name; use letters, digits and -, e.g. session")
    return value


class HeaderKey(_Model):
    """Count per value of a request header (``per: {header: x-api-key}``)."""

    header: str = Field(description="The header's name (compared without case).")

    @field_validator("header")
    @classmethod
    def _name(cls, value: str) -> str:
        return _header_name(value)


class CookieKey(_Model):
    """Count per value of a cookie (``per: {cookie: session}``)."""

    cookie: str = Field(description="The cookie's name (case-sensitive).")

    @field_validator("cookie")
    @classmethod
    def _name(cls, value: str) -> str:
        return _cookie_name(value)


class JwtClaim(_Model):
    """A claim of a JSON Web Token the Worker verifies before it trusts the claim."""

    claim: str = Field(default="sub", description="The claim counted by, e.g. sub.")
    header: str | None = Field(
        default=None,
        description="The header holding the token (a Bearer scheme is stripped). Default: "
        "authorization, unless cookie is given.",
    )
    cookie: str | None = Field(default=None, description="The cookie holding the token.")
    secret: str | None = Field(
        default=None,
        description="HS256: the name of the Worker secret holding the signing key "
        "(set with wrangler secret put; never the key itself).",
    )
    jwks: str | None = Field(
        default=None,
        description="RS256/ES256: the https URL of the issuer's JSON Web Key Set.",
    )
    issuer: str | None = Field(
        default=None, max_length=512, description="When given, the iss claim must equal it."
    )
    audience: str | None = Field(
        default=None, max_length=512, description="When given, the aud claim must hold it."
    )
    leeway: Duration = Field(
        default=Duration.parse(DEFAULT_JWT_LEEWAY),
        description="Clock skew allowed on exp and nbf (at most 5m).",
    )
    tier: str | None = Field(
        default=None,
        description="The claim that names the caller's tier (e.g. tier), for edge.tiers.",
    )

    @field_validator("claim", "tier")
    @classmethod
    def _claim(cls, value: str | None) -> str | None:
        if value is not None and not _CLAIM_RE.match(value):
            raise ValueError(
                f"{value!r} is not a claim name; use 1-128 printable ASCII characters without "
                "spaces, e.g. sub"
            )
        return value

    @field_validator("header")
    @classmethod
    def _header(cls, value: str | None) -> str | None:
        return None if value is None else _header_name(value)

    @field_validator("cookie")
    @classmethod
    def _cookie(cls, value: str | None) -> str | None:
        return None if value is None else _cookie_name(value)

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is not None and not _SECRET_NAME_RE.match(value):
            raise ValueError(
                f"{value!r} is not a secret's name; name the Worker secret that holds the "
                "key in upper case, e.g. JWT_SECRET (never write the key itself here)"
            )
        return value

    @field_validator("jwks")
    @classmethod
    def _jwks(cls, value: str | None) -> str | None:
        if value is not None and not _JWKS_URL_RE.match(value):
            raise ValueError(
                f"{value!r} is not a JWKS address; write an https URL with a path, e.g. "
                "https://auth.example.com/.well-known/jwks.json"
            )
        return value

    @field_validator("issuer", "audience")
    @classmethod
    def _printable_claim(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)):
            raise ValueError("is empty or holds a control character; write the exact value")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> JwtClaim:
        if self.header is not None and self.cookie is not None:
            raise ValueError("give the token's header or its cookie, not both")
        if (self.secret is None) == (self.jwks is None):
            raise ValueError(
                "give exactly one way to verify the token: secret (HS256, the name of a Worker "
                "secret) or jwks (RS256/ES256, the issuer's key set URL)"
            )
        if self.leeway.ms > MAX_JWT_LEEWAY_MS:
            raise ValueError(f"leeway {self.leeway} is longer than 5m; clocks are not that far off")
        return self

    @property
    def token_header(self) -> str | None:
        """The header holding the token (None when it is in a cookie)."""
        if self.cookie is not None:
            return None
        return self.header or DEFAULT_JWT_HEADER

    @property
    def algorithms(self) -> tuple[str, ...]:
        """The signature algorithms accepted: HS256 with a secret, RS256/ES256 with a JWKS."""
        return ("HS256",) if self.secret is not None else ("RS256", "ES256")


class JwtKey(_Model):
    """Count per verified claim of a JWT (``per: {jwt: {claim: sub, secret: JWT_SECRET}}``)."""

    jwt: JwtClaim = Field(description="The token, how to verify it, and the claim.")


def _edge_key_tag(value: object) -> str | None:
    """Which kind of key ``per`` writes: a name, or a mapping with one of three keys."""
    if isinstance(value, (str, EdgeKey)):
        return "[address]"
    for model, tag in ((HeaderKey, "[header]"), (CookieKey, "[cookie]"), (JwtKey, "[jwt]")):
        if isinstance(value, model):
            return tag
    if isinstance(value, dict):
        kinds = [k for k in ("header", "cookie", "jwt") if k in value]
        if len(kinds) == 1:
            return f"[{kinds[0]}]"
    return None


EdgeKeySpec = Annotated[
    Annotated[EdgeKey, Tag("[address]")]
    | Annotated[HeaderKey, Tag("[header]")]
    | Annotated[CookieKey, Tag("[cookie]")]
    | Annotated[JwtKey, Tag("[jwt]")],
    Discriminator(
        _edge_key_tag,
        custom_error_type="edge_key",
        custom_error_message="per is ip, ip_nat, {header: NAME}, {cookie: NAME} or "
        "{jwt: {claim: sub, secret: NAME | jwks: URL}}",
    ),
]


def is_keyed(per: object) -> bool:
    """True when an edge limit counts by a header, a cookie or a JWT claim."""
    return isinstance(per, (HeaderKey, CookieKey, JwtKey))


class EdgeLimit(_Model):
    """A coarse limit enforced by Cloudflare before traffic reaches the app, per client IP
    or per another key (``per``)."""

    rate: Rate = Field(description="Requests per period per key (client IP), e.g. 600/1m.")
    per: EdgeKeySpec = Field(
        default=EdgeKey.IP,
        description="What is counted: ip (the client address), ip_nat (Cloudflare's IP with "
        "NAT support), {header: NAME}, {cookie: NAME} or {jwt: {...}} (a verified claim). "
        "Requests without the key are counted by client IP.",
    )
    action: Action = Field(default=Action.BLOCK, description="What Cloudflare does over the limit.")
    timeout: Duration | None = Field(
        default=None,
        description="How long a client stays blocked (mitigation timeout). Default: the period "
        "for block, none (0) for challenges.",
    )
    unauthenticated_only: bool = Field(
        default=True,
        description="Hold requests without the credentials in authenticated_when to rate; "
        "requests that carry one (checked for presence only, so a fake one counts too) are "
        "held to the looser credentialed_rate instead of passing unlimited.",
    )
    credentialed_rate: Rate | None = Field(
        default=None,
        description="For unauthenticated_only limits: the per-IP ceiling for requests that "
        "carry a credential, e.g. 6000/1m. Default: 10 times rate, over the same period.",
    )
    target: EdgeTarget = Field(
        default=EdgeTarget.AUTO,
        description="Run as a Cloudflare rule, in the Worker, or let the plan decide (auto).",
    )
    tiers: bool = Field(
        default=False,
        description="true: a caller whose verified token names a tier (per: {jwt: {tier: "
        "...}}) is held at the edge to the app part's rates for that tier with a period of "
        "10s or 1m, per its claim, instead of rate; coarse, per Cloudflare location.",
    )
    requests_to_origin: bool = Field(
        default=False,
        description="true: count only requests that reach the origin, not those served from "
        "Cloudflare's cache (the rule field ratelimit.requests_to_origin; Business and up). "
        "The Worker cannot tell beforehand, so there it counts every request.",
    )

    @model_validator(mode="before")
    @classmethod
    def _keyed_counts_everyone(cls, data: object) -> object:
        # A limit keyed by a header, cookie or token counts every request (by its key, or by
        # address without one): the credential split of unauthenticated_only is its key.
        keyed = isinstance(data, dict) and _edge_key_tag(data.get("per")) not in (None, "[address]")
        if keyed and isinstance(data, dict) and "unauthenticated_only" not in data:
            return {**data, "unauthenticated_only": False}
        return data

    @model_validator(mode="after")
    def _tiers_need_a_tier_claim(self) -> EdgeLimit:
        if self.tiers and not (isinstance(self.per, JwtKey) and self.per.jwt.tier is not None):
            raise ValueError(
                "tiers: true needs the caller's tier from a verified token: write per: {jwt: "
                "{claim: sub, tier: tier, ...}}, or remove tiers"
            )
        return self

    @model_validator(mode="after")
    def _keyed_not_unauthenticated(self) -> EdgeLimit:
        if is_keyed(self.per) and self.unauthenticated_only:
            raise ValueError(
                "unauthenticated_only: true does not go with a per of header, cookie or jwt: "
                "such a limit counts every request, by its key or, without one, by client IP; "
                "remove unauthenticated_only"
            )
        return self


class Quotas(_Model):
    """A tier's quotas: units per calendar period, counted beside its rates and checked in
    the same atomic decision (``quotas: {pro: {month: 50000}}``)."""

    day: int | None = Field(default=None, ge=1, description="Units per calendar day.")
    week: int | None = Field(
        default=None, ge=1, description="Units per calendar week (Monday to Sunday)."
    )
    month: int | None = Field(default=None, ge=1, description="Units per calendar month.")
    billing: int | None = Field(
        default=None,
        ge=1,
        description="Units per billing month, which starts on the caller's billing day "
        "(billing_day_from).",
    )

    @field_validator("day", "week", "month", "billing", mode="before")
    @classmethod
    def _counts(cls, value: object) -> object:
        return _not_a_flag(value)

    @model_validator(mode="after")
    def _some(self) -> Quotas:
        if not self.periods():
            raise ValueError("no quota given; set day, week, month or billing")
        return self

    def periods(self) -> tuple[tuple[Period, int], ...]:
        """The quotas set, each (period, units), shortest period first."""
        found = ((period, getattr(self, period.value)) for period in Period)
        return tuple((period, units) for period, units in found if units is not None)

    def text(self) -> str:
        """``1000/day, 50000/month``: as messages and reviews show them."""
        return ", ".join(f"{units}/{period.value}" for period, units in self.periods())


class AppLimit(_Model):
    """A per-user (or per-IP), per-tier limit enforced in the app through Redis."""

    per: Annotated[AppKey | KeyName, BeforeValidator(_as_key)] = Field(
        default=AppKey.USER,
        union_mode="left_to_right",
        description="Count per user, per client IP, or per a key the app's identify returns "
        "(e.g. org). Callers without that key are counted by client IP.",
    )
    algorithm: Algorithm = Field(
        default=Algorithm.SLIDING_WINDOW,
        description="sliding_log (exact log), sliding_window (two counters), gcra (smooth).",
    )
    tiers: dict[str, Rates] = Field(
        default_factory=dict,
        description="The limit for each tier: one rate, or a list that must all hold. "
        "May be left out when concurrency is given.",
    )
    burst: int | None = Field(
        default=None,
        ge=1,
        description="gcra only: how many requests may arrive at once (default: the limit).",
    )
    enforce: bool = Field(
        default=True, description="false: shadow mode, decisions are reported but never deny."
    )
    on_redis_error: OnRedisError | None = Field(
        default=None, description="Override app.on_redis_error for this limit."
    )
    mode: Mode = Field(
        default=Mode.EXACT,
        description="exact: every decision in Redis; approximate: local counts, synced.",
    )
    sync_every: int | None = Field(
        default=None, ge=1, le=10_000, description="approximate mode: sync after N requests."
    )
    sync_interval: Duration | None = Field(
        default=None, description="approximate mode: sync at least this often."
    )
    concurrency: (
        Annotated[int, Field(ge=1, le=1_000_000)]
        | dict[str, Annotated[int, Field(ge=1, le=1_000_000)]]
        | None
    ) = Field(
        default=None,
        description="At most this many requests of one caller at once, per tier "
        "({free: 1, pro: 4}; one number applies to every tier of the policy). A request "
        "holds its slot "
        "until its response is sent.",
    )
    lease: Duration = Field(
        default=Duration(60_000),
        description="concurrency: how long a request may hold its slot; a process that "
        "dies mid-request frees its slots after this. Set it above the longest request.",
    )
    # Explicit use only: a limit for a FastAPI dependency, a decorator or hit() that the
    # middleware must not apply to every request its match covers.
    middleware: bool = Field(
        default=True,
        description="false: only hit(), the decorator and named dependencies apply it.",
    )

    quotas: dict[str, Quotas] | None = Field(
        default=None,
        description="Quotas per tier on calendar periods, checked with the tier's rates in one "
        "atomic decision, e.g. {pro: {month: 50000}, free: {day: 1000}}.",
    )
    quota_timezone: str = Field(
        default="UTC",
        description="The time zone whose calendar the quotas' days, weeks and months follow "
        "(an IANA name such as Europe/Berlin).",
    )
    billing_day_from: KeyName | None = Field(
        default=None,
        description="The key identify returns (Caller.keys) that holds a caller's billing day "
        "(1-31), where billing quotas start their month.",
    )

    @field_validator("burst", "sync_every", mode="before")
    @classmethod
    def _counts(cls, value: object) -> object:
        return _not_a_flag(value)

    @field_validator("billing_day_from", mode="before")
    @classmethod
    def _billing_key(cls, value: object) -> object:
        if value is not None and not (isinstance(value, str) and KEY_NAME_RE.match(value)):
            raise ValueError(
                f"{value!r} is not a key name; use a lower-case letter, then up to 31 "
                "lower-case letters, digits or '_', e.g. billing_day"
            )
        return value

    @model_validator(mode="after")
    def _quota_options(self) -> AppLimit:
        quotas = self.quotas or {}
        for tier in quotas:
            if tier not in self.tiers:
                raise ValueError(
                    f"quotas name tier {tier!r}, which has no rate in this limit; give it a "
                    "rate in tiers (quotas are counted beside a tier's rates)"
                )
        billing = any(q.billing is not None for q in quotas.values())
        if billing and self.billing_day_from is None:
            raise ValueError(
                "a billing quota needs billing_day_from: the key identify returns with the "
                "caller's billing day, e.g. billing_day_from: billing_day"
            )
        if self.billing_day_from is not None and not billing:
            raise ValueError("billing_day_from is set but no tier has a billing quota; remove it")
        if self.quota_timezone != "UTC" and not quotas:
            raise ValueError(
                "quota_timezone is set but the limit has no quotas; remove it, or add quotas"
            )
        if quotas and self.mode is Mode.APPROXIMATE:
            raise ValueError(
                "quotas are counted exactly, in Redis, and approximate mode does not apply to "
                "them; set mode: exact, or move the quotas to a limit of their own"
            )
        return self

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency(cls, value: object) -> object:
        return _not_a_flag(value)

    def concurrency_of(self, tiers: Sequence[str]) -> dict[str, int]:
        """The concurrency per tier: one number applies to every tier of ``tiers`` (the
        policy's)."""
        if self.concurrency is None:
            return {}
        if isinstance(self.concurrency, int):
            return dict.fromkeys(tiers, self.concurrency)
        return dict(self.concurrency)

    @model_validator(mode="after")
    def _tiers_or_concurrency(self) -> AppLimit:
        if not self.tiers and not self.concurrency:
            raise ValueError(
                "no tiers given; set a rate (tiers:) or a concurrency for at least one tier"
            )
        if self.concurrency and self.mode is Mode.APPROXIMATE:
            raise ValueError(
                "concurrency needs mode: exact (a slot is taken and given back in Redis)"
            )
        return self

    @model_validator(mode="after")
    def _algorithm_options(self) -> AppLimit:
        if self.burst is not None and self.algorithm is not Algorithm.GCRA:
            raise ValueError(
                f"burst applies to gcra only, not {self.algorithm.value}; remove burst or "
                "set algorithm: gcra"
            )
        if self.mode is Mode.EXACT and (self.sync_every or self.sync_interval):
            raise ValueError("sync_every and sync_interval need mode: approximate")
        return self


_STATUS_RANGE_RE = re.compile(r"^([1-5])xx$|^([1-5][0-9]{2})\s*-\s*([1-5][0-9]{2})$")
MIN_STATUS = 100
MAX_STATUS = 599


def _as_status_ranges(value: object) -> object:
    """``401``, ``"4xx"``, ``"500-599"`` or a list of them, as sorted, merged ``(lo, hi)``."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    if not items:
        raise ValueError("an empty list of statuses counts nothing; give at least one")
    ranges: list[tuple[int, int]] = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"{str(item).lower()} is not a status; write e.g. 401 or 4xx")
        if isinstance(item, int):
            low = high = item
        elif isinstance(item, str) and item.strip().isdigit():
            low = high = int(item)
        elif isinstance(item, str) and (found := _STATUS_RANGE_RE.match(item.strip())):
            if found.group(1):
                low = int(found.group(1)) * 100
                high = low + 99
            else:
                low, high = int(found.group(2)), int(found.group(3))
                if low > high:
                    raise ValueError(f"{item!r} runs backwards; write {high}-{low}")
        else:
            raise ValueError(
                f"{item!r} is not a status; write a number (401), a class (4xx) or a range "
                "(500-599)"
            )
        if not MIN_STATUS <= low <= high <= MAX_STATUS:
            raise ValueError(f"{item!r} is outside the HTTP statuses {MIN_STATUS}-{MAX_STATUS}")
        ranges.append((low, high))
    ranges.sort()
    merged: list[tuple[int, int]] = [ranges[0]]
    for low, high in ranges[1:]:
        last_low, last_high = merged[-1]
        if low <= last_high + 1:
            merged[-1] = (last_low, max(last_high, high))
        else:
            merged.append((low, high))
    return tuple(merged)


_STATUS_ITEM_SCHEMA = {
    "anyOf": [
        {"type": "integer", "minimum": MIN_STATUS, "maximum": MAX_STATUS},
        {"type": "string", "pattern": r"^([1-5]xx|[1-5][0-9]{2}\s*-\s*[1-5][0-9]{2})$"},
    ]
}

StatusRanges = Annotated[
    tuple[tuple[int, int], ...],
    BeforeValidator(_as_status_ranges),
    WithJsonSchema(
        {
            "anyOf": [
                _STATUS_ITEM_SCHEMA,
                {"type": "array", "items": _STATUS_ITEM_SCHEMA, "minItems": 1},
            ]
        }
    ),
]


def status_counts(ranges: tuple[tuple[int, int], ...], status: int) -> bool:
    """Whether a response of ``status`` is counted by count_when's ``ranges`` (its
    statuses as ``(lowest, highest)`` pairs, ``CountWhen.status``): the one test, for the
    policy's model and for the plain values applimit compiles it into."""
    return any(low <= status <= high for low, high in ranges)


class CountWhen(_Model):
    """Which answers a limit counts: a request is checked before it runs, and counted only
    when its response is one of these (``count_when: {status: [401, 403]}``)."""

    status: StatusRanges = Field(
        description="Response statuses that count: numbers (401), classes (4xx) or ranges "
        "(500-599), one or a list. A handler that raises counts as 500."
    )

    def counts(self, status: int) -> bool:
        """Whether a response with this status is counted."""
        return status_counts(self.status, status)

    def describe(self) -> str:
        """The statuses as the policy would write them: ``401, 403, 5xx``."""
        parts = []
        for low, high in self.status:
            if low == high:
                parts.append(str(low))
            elif low % 100 == 0 and high == low + 99:
                parts.append(f"{low // 100}xx")
            else:
                parts.append(f"{low}-{high}")
        return ", ".join(parts)


class Limit(_Model):
    """One named limit: which requests, and how it is enforced at the edge and in the app."""

    name: str = Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        description="A unique name; it names the generated rule and the Redis keys.",
    )
    description: str | None = Field(default=None, max_length=500)
    match: Match = Field(default_factory=Match, description="Which requests this limit counts.")
    edge: EdgeLimit | None = Field(default=None, description="The Cloudflare part, per IP.")
    app: AppLimit | None = Field(default=None, description="The in-app part, per user and tier.")
    count_when: CountWhen | None = Field(
        default=None,
        description="Count only requests whose response is one of these statuses (e.g. failed "
        "logins: {status: [401]}); every layer checks before the request runs and counts after "
        "its answer. Default: every request counts.",
    )

    @field_validator("name", "description")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value):
            raise ValueError("contains a control character (newline, tab, ...); remove it")
        if value is not None and value != value.strip():
            raise ValueError("starts or ends with whitespace; remove it")
        return value

    @model_validator(mode="after")
    def _enforced_somewhere(self) -> Limit:
        if self.edge is None and self.app is None:
            raise ValueError(f"limit {self.name!r} has neither edge nor app; add at least one")
        if (
            self.count_when is not None
            and self.app is not None
            and self.app.mode is Mode.APPROXIMATE
        ):
            raise ValueError(
                f"limit {self.name!r}: count_when needs app mode: exact (approximate mode "
                "counts locally before the answer is known); remove mode: approximate"
            )
        return self

    @model_validator(mode="after")
    def _edge_tiers_from_the_app(self) -> Limit:
        if self.edge is not None and self.edge.tiers and self.app is None:
            raise ValueError(
                f"limit {self.name!r}: edge.tiers applies the app part's per-tier rates at the "
                "edge, but the limit has no app part; add app.tiers or remove edge.tiers"
            )
        return self


class Worker(_Model):
    """The Worker that carries edge limits the zone's plan cannot express as rules."""

    name: str = Field(description="Worker script name (lower case, digits, dashes).")
    routes: StrList = Field(default=(), description='Route patterns, e.g. "api.example.com/*".')
    compatibility_date: str = Field(default="2025-01-01", pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _WORKER_NAME_RE.match(value):
            raise ValueError(
                f"{value!r} is not a Worker name; use 1-63 lower-case letters, digits and "
                "dashes, not starting or ending with a dash"
            )
        return value

    @field_validator("routes")
    @classmethod
    def _routes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for route in value:
            if "://" in route or not route or any(c.isspace() for c in route) or "/" not in route:
                raise ValueError(
                    f"{route!r} is not a route pattern; write it like api.example.com/* (no scheme)"
                )
        return value


class Cloudflare(_Model):
    """The zone the edge part is applied to, and its plan."""

    plan: CloudflarePlan = Field(description="The zone's plan: it decides what rules can express.")
    zone_id: str | None = Field(default=None, description="32 hex digits; needed by plan/apply.")
    account_id: str | None = Field(default=None, description="32 hex digits; for the Worker.")
    worker: Worker | None = Field(default=None)

    @field_validator("zone_id", "account_id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        # An unset ${VAR} arrives as None (reported by lint); an empty string is the same.
        if value in (None, ""):
            return None
        assert value is not None
        if not _ID_RE.match(value):
            raise ValueError(f"{value!r} is not a Cloudflare id; it is 32 lower-case hex digits")
        return value


class AuthenticatedWhen(_Model):
    """A request counts as authenticated when it carries any of these credentials."""

    headers: StrList = Field(default=(), description="Header names, e.g. [authorization].")
    cookies: StrList = Field(default=(), description="Cookie names, e.g. [session].")

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_header_name(h) for h in value)

    @field_validator("cookies")
    @classmethod
    def _cookies(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_cookie_name(c) for c in value)


class Clients(_Model):
    """How client addresses are counted, the same in the app and in the Worker."""

    ipv6_prefix: int = Field(
        default=DEFAULT_IPV6_PREFIX,
        ge=MIN_IPV6_PREFIX,
        le=MAX_IPV6_PREFIX,
        description="IPv6 clients are counted per network of this prefix length (a client "
        "usually holds a whole /64); 128 counts every address on its own. IPv4: per address.",
    )

    @field_validator("ipv6_prefix", mode="before")
    @classmethod
    def _prefix(cls, value: object) -> object:
        return _not_a_flag(value)


# The name of an in-process store in a memory:// URL (applimit/_clients.py reads it the same).
_MEMORY_NAME = re.compile(r"[A-Za-z0-9_-]*")


class App(_Model):
    """Settings of the in-app limiter shared by every app limit."""

    redis_url: str = Field(default="redis://localhost:6379/0")
    key_prefix: str = Field(default="rl", description="Prefix of every Redis key.")
    on_redis_error: OnRedisError = Field(
        default=OnRedisError.ALLOW,
        description="allow (fail open) or deny (fail closed) when Redis cannot answer.",
    )
    timeout: Duration = Field(
        default=Duration(50), description="The most one decision may wait for Redis."
    )
    override_refresh: Duration | None = Field(
        default=None,
        description="Read the overrides set at run time (applimit override set) every this "
        "long, e.g. 5s: the bound within which a change reaches every instance. Default: the "
        "app reads none (the file's overrides: still apply).",
    )

    @field_validator("redis_url")
    @classmethod
    def _url(cls, value: str) -> str:
        """Read the URL as redis-py's ``parse_url`` does (redis, rediss, unix) and applimit
        does (redis+sentinel), without importing redis: a URL that validates connects.
        Every message shows the URL with its password as ``***``."""
        from urllib.parse import parse_qs, unquote, urlsplit

        head, at, tail = value.rpartition("@")
        shown = value
        if at:
            # Everything before the last "@" is user information (a password may hold "/").
            prefix, sep, userinfo = head.rpartition("://") if "://" in head else ("", "", head)
            user, colon, _ = userinfo.partition(":")
            shown = f"{prefix}{sep}{user + ':***' if colon else '***'}@{tail}"
        shown = re.sub(r"(?i)([?&;](?:password|pass|pwd)=)[^&;#]*", r"\1***", shown)
        example = "write it like redis://host:6379/0"

        def port_problem(text: str) -> str | None:
            if not (text.isascii() and text.isdigit()):
                return f"port {text!r} is not a number"
            if not 1 <= int(text) <= 65535:
                return f"port {int(text)} is not between 1 and 65535"
            return None

        def bad(why: str, how: str = example) -> ValueError:
            return ValueError(f"{shown!r}: {why}; {how}")

        scheme, sep, rest = value.partition("://")
        if scheme == "memory" and sep:
            # The in-process store for an app's tests, usually from the environment
            # (REDIS_URL=memory:// behind ${REDIS_URL:-...}); lint L112 says what it means.
            if not _MEMORY_NAME.fullmatch(rest):
                raise bad(
                    "a memory URL is memory:// or memory://name, where name (letters, digits, "
                    "- and _) picks one of the process's in-memory stores",
                    "write it like memory:// or memory://tests",
                )
            return value
        if not sep or scheme not in ("redis", "rediss", "unix", "redis+sentinel"):
            raise ValueError(
                f"{shown!r} is not a Redis URL; write it like redis://host:6379/0 "
                "(rediss:// for TLS, unix:///path/to/redis.sock for a socket, "
                "redis+sentinel://host:26379/mymaster for Sentinel; memory:// for an app's "
                "tests)"
            )
        if scheme == "redis+sentinel":
            how = "write it like redis+sentinel://host:26379,host2:26379/mymaster/0"
            if "?" in rest or "#" in rest:
                raise bad("a Sentinel URL takes no query or fragment", how)
            netloc, _, path = rest.partition("/")
            for part in netloc.rpartition("@")[2].split(","):
                host, port = part, ""
                if part.startswith("["):
                    host, close, port = part[1:].partition("]")
                    if not close or (port and not port.startswith(":")):
                        raise bad(f"the sentinel address {part!r} cannot be read", how)
                    port = port[1:]
                elif ":" in part:
                    host, port = part.rsplit(":", 1)
                if not host:
                    raise bad("a sentinel address is empty", how)
                problem = port_problem(port) if port else None
                if problem:
                    raise bad(problem, how)
            service, _, db = path.partition("/")
            if not service:
                raise bad("it names no service", how)
            if db and not (db.isascii() and db.isdigit()):
                raise bad(f"database {db!r} is not a number", how)
            return value
        try:
            parts = urlsplit(value)
        except ValueError:
            raise bad(
                "it cannot be read as a URL (check the [ ] around an IPv6 address and the "
                "characters of the host)"
            ) from None
        if at and "@" not in parts.netloc:
            # The last "@" ends the user information only when nothing before it ends the
            # host part; otherwise redis-py would read part of the password as the port.
            raise bad(
                "its user or password holds '/', '?' or '#'",
                "percent-encode them (%2F, %3F, %23), and a '@' elsewhere as %40",
            )
        if scheme == "unix":
            if not parts.path:
                raise bad("it names no socket path", "write it like unix:///run/redis.sock")
        else:
            hostport = parts.netloc.rpartition("@")[2]
            if hostport.startswith("["):
                port = hostport.partition("]")[2].removeprefix(":")
            else:
                port = hostport.rpartition(":")[2] if ":" in hostport else ""
            problem = port_problem(port) if port else None
            if problem:
                raise bad(problem)
            database = unquote(parts.path).strip("/")
            if database and not (database.isascii() and database.isdigit()):
                raise bad(f"database {database!r} is not a number")
        # The query arguments redis-py converts (and refuses when they do not convert).
        numbers = {"socket_timeout", "socket_connect_timeout", "timeout"}
        whole = {
            "db",
            "socket_read_size",
            "max_connections",
            "health_check_interval",
            "ssl_min_version",
            "protocol",
        }
        for name, values in parse_qs(parts.query).items():
            try:
                if name in whole:
                    int(values[0])
                elif name in numbers:
                    float(values[0])
            except ValueError:
                kind = "a whole number" if name in whole else "a number"
                raise bad(f"query argument {name}={values[0]!r} is not {kind}") from None
        return value

    @field_validator("key_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not _KEY_PREFIX_RE.match(value):
            raise ValueError(
                f"{value!r} is not a key prefix; use 1-32 letters, digits, '_', '.' or '-'"
            )
        return value

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: Duration) -> Duration:
        if value.ms > 10_000:
            raise ValueError(f"{value} is too long to wait on every request; use at most 10s")
        return value

    @field_validator("override_refresh")
    @classmethod
    def _override_refresh(cls, value: Duration | None) -> Duration | None:
        if value is not None and not 100 <= value.ms <= 300_000:
            raise ValueError(f"{value} is not from 100ms to 5m; e.g. override_refresh: 5s")
        return value


class Override(_Model):
    """One identity's own rates, quotas or concurrency for one limit, reviewed with the
    policy (``overrides:``). Each one given replaces its tier's; each left out keeps it."""

    limit: str = Field(min_length=1, description="The limit's name; it must have an app part.")
    user: str | None = Field(
        default=None, min_length=1, description="The user id, for a limit that counts per user."
    )
    key: dict[str, str] | None = Field(
        default=None,
        description="The app key and its value, e.g. {org: acme}, for a per: <key> limit.",
    )
    rates: Rates | None = Field(
        default=None,
        description="The identity's own rates, e.g. [1000/1m], replacing its tier's.",
    )
    quotas: Quotas | None = Field(
        default=None,
        description="The identity's own calendar quotas, e.g. {month: 2000000}, replacing "
        "its tier's (the limit must have quotas).",
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="The identity's own concurrency limit, replacing its tier's.",
    )
    expires: str = Field(description="When it ends: a date (2027-06-30) or a UTC time.")
    reason: str = Field(min_length=1, max_length=500, description="Why (a contract, a ticket).")

    @field_validator("expires")
    @classmethod
    def _expires(cls, value: str) -> str:
        override_expiry(value)
        return value

    @field_validator("user", "reason")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value):
            raise ValueError("contains a control character (newline, tab, ...); remove it")
        return value

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency(cls, value: object) -> object:
        return _not_a_flag(value)

    @field_validator("rates")
    @classmethod
    def _few_rates(cls, value: tuple[Rate, ...] | None) -> tuple[Rate, ...] | None:
        if value is not None and len(value) > OVERRIDE_MAX_RATES:
            raise ValueError(f"an override gives at most {OVERRIDE_MAX_RATES} rates")
        return value

    @field_validator("quotas")
    @classmethod
    def _bounded_quotas(cls, value: Quotas | None) -> Quotas | None:
        if value is not None and any(n > OVERRIDE_MAX_UNITS for _, n in value.periods()):
            raise ValueError(f"an override's quota is at most {OVERRIDE_MAX_UNITS:,} units")
        return value

    @model_validator(mode="after")
    def _one_identity(self) -> Override:
        if self.rates is None and self.quotas is None and self.concurrency is None:
            raise ValueError(
                "an override gives rates, quotas or concurrency (or several); e.g. rates: [1000/1m]"
            )
        if (self.user is None) == (self.key is None):
            raise ValueError("name exactly one identity: user: ID, or key: {NAME: VALUE}")
        if self.key is not None and (len(self.key) != 1 or not all(self.key.values())):
            raise ValueError("key names one app key and its value, e.g. key: {org: acme}")
        if self.key is not None and not all(
            t.isprintable() for t in (*self.key, *self.key.values())
        ):
            raise ValueError("key contains a control character (newline, tab, ...); remove it")
        return self

    @property
    def kind(self) -> str:
        """``user``, or the app key's name."""
        return "user" if self.key is None else next(iter(self.key))

    @property
    def value(self) -> str:
        """The user id, or the app key's value."""
        return self.user if self.user is not None else next(iter((self.key or {}).values()))

    @property
    def expires_at(self) -> float:
        """``expires`` as Unix seconds (a date ends at its midnight, UTC)."""
        return override_expiry(self.expires)

    def gives(self) -> str:
        """What it gives: ``rates 1000/1m + 20000/1h; quotas 2000000/month; concurrency 8``."""
        parts = []
        if self.rates is not None:
            parts.append("rates " + " + ".join(str(r) for r in self.rates))
        if self.quotas is not None:
            parts.append("quotas " + self.quotas.text())
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        return "; ".join(parts)


def override_expiry(text: str) -> float:
    """An override's ``expires`` as Unix seconds: a date (its end is the next midnight,
    UTC) or an ISO time (UTC unless it says otherwise); ValueError says how to write it."""
    try:
        if len(text) == 10:
            day = dt.date.fromisoformat(text) + dt.timedelta(days=1)
            return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a date or time; write it like 2027-06-30 or 2027-06-30T12:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


class Policy(_Model):
    """A whole policy file: one source for the edge rules, the Worker and the app limiter."""

    version: Literal[1] = Field(description="The file format version; 1.")
    cloudflare: Cloudflare | None = Field(default=None)
    authenticated_when: AuthenticatedWhen = Field(default_factory=AuthenticatedWhen)
    tiers: StrList = Field(
        default=("default",), description="Tier names, ordered least to most generous."
    )
    clients: Clients = Field(default_factory=Clients)
    app: App = Field(default_factory=App)
    limits: tuple[Limit, ...] = Field(default=(), max_length=MAX_LIMITS)
    overrides: tuple[Override, ...] = Field(
        default=(),
        max_length=MAX_OVERRIDES,
        description="Identities with rates of their own for one limit (contract rates), "
        "reviewed with the policy.",
    )

    # Where each value came from in the file; set by the loader, used by lint for locations.
    _source: Any = PrivateAttr(default=None)

    @classmethod
    def model_json_schema(
        cls,
        by_alias: bool | None = None,
        ref_template: str = DEFAULT_REF_TEMPLATE,
        schema_generator: type[GenerateJsonSchema] = LoaderJsonSchema,
        mode: JsonSchemaMode = "validation",
        *,
        union_format: Literal["any_of", "primitive_type_array"] = "any_of",
    ) -> dict[str, Any]:
        """The JSON Schema of what the loader accepts (``policy._schema``), not of the
        values the model holds: editors check files, and files say more than that."""
        return super().model_json_schema(
            by_alias=by_alias,
            ref_template=ref_template,
            schema_generator=schema_generator,
            mode=mode,
            union_format=union_format,
        )

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        # pydantic would read true as 1; a version is a number.
        if isinstance(value, bool):
            raise ValueError(f"{str(value).lower()} is not a version; write version: 1")
        return value

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("no tiers; list at least one, e.g. [free, pro]")
        for tier in value:
            if not _TIER_RE.match(tier):
                raise ValueError(
                    f"{tier!r} is not a tier name; use a letter then letters, digits, '_' or '-'"
                )
        seen: set[str] = set()
        for tier in value:
            if tier in seen:
                raise ValueError(f"tier {tier!r} is listed twice")
            seen.add(tier)
        return value

    def locate(self, *path: str | int) -> tuple[str, int, int] | None:
        """Where a field is in the file: ``(file, line, column)``, or None when unknown.

        ``policy.locate("limits", 1, "edge", "rate")``; a field the file does not spell out
        gives the position of its nearest written ancestor.
        """
        if self._source is None:
            return None
        position = self._source.locate(tuple(path))
        if position is None:
            return None
        return (self._source.file, position.line, position.column)

    def limit_index(self, name: str) -> int:
        """The index of the limit with this name in ``limits``; KeyError when there is none."""
        for index, limit in enumerate(self.limits):
            if limit.name == name:
                return index
        raise KeyError(name)

    def limit(self, name: str) -> Limit:
        """The limit with this name; KeyError when there is none."""
        for limit in self.limits:
            if limit.name == name:
                return limit
        raise KeyError(name)
