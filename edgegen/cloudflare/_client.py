"""The Cloudflare API client: the endpoints edgegen uses, over the one transport.

``Client`` knows the API's paths, what each answer must look like, and what "not there"
means for each (a 404 in Cloudflare's envelope with the endpoint's own "not found" code);
it returns the values planning uses (``RemoteRuleset``, ``RemoteRoute``,
``UrlNormalization``: one type per idea, from ``_state``). Sending, the token, deadlines,
retries and the envelope are the transport's (``_transport``, the only module that talks
HTTP); what errors say, and the token's removal from them, is ``_messages``'.

Writes are first built as ``Write`` values (method, path, body) and then sent, so that
``apply --dry-run`` prints exactly the requests it would have sent.
"""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..errors import CloudflareAPIError
from ._messages import DEFAULT_BASE_URL, PHASE, bad_result
from ._retry import RetryPolicy
from ._state import RemoteRoute, RemoteRuleset, UrlNormalization
from ._token import Token
from ._transport import Part, Transport, base_url_from_env, proxy_from_env

if TYPE_CHECKING:
    import httpx

# Cloudflare's error codes this client gives a meaning to (all others are passed through).
ENTRYPOINT_NOT_FOUND = 10003
SCRIPT_NOT_FOUND = 10007
_MODULE_TYPE = "application/javascript+module"


def _sleep(seconds: float) -> None:
    """Wait between retries (tests replace it, so no test ever really sleeps)."""
    time.sleep(seconds)


def _wait(seconds: float) -> None:
    """A client's wait when it is given none: ``_sleep``, looked up each time, so that
    replacing it reaches every client."""
    _sleep(seconds)


@dataclass(frozen=True, slots=True)
class Write:
    """A request that changes the zone, built before it is sent (``--dry-run`` prints it).

    ``what`` says in words what it does, e.g. ``update the http_ratelimit rules``.
    """

    method: str
    path: str
    what: str
    params: tuple[tuple[str, str], ...] = ()
    json_body: Any = None
    parts: tuple[Part, ...] = ()

    def describe(self, base_url: str) -> str:
        """The request as text: method, URL and body (multipart parts by name and size)."""
        query = "&".join(f"{k}={v}" for k, v in self.params)
        lines = [f"{self.method} {base_url}{self.path}{'?' + query if query else ''}"]
        if self.json_body is not None:
            lines.append(json.dumps(self.json_body, indent=2, ensure_ascii=False))
        for part in self.parts:
            if part.content_type == "application/json":
                lines.append(f'part "{part.name}" ({part.content_type}):')
                lines.append(json.dumps(json.loads(part.content), indent=2, ensure_ascii=False))
            else:
                lines.append(
                    f'part "{part.name}" ({part.content_type}, {len(part.content):,} bytes, '
                    f"sha256 {hashlib.sha256(part.content).hexdigest()})"
                )
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class ScriptSettings:
    """A Worker script's settings: its bindings and compatibility date."""

    bindings: tuple[dict[str, Any], ...]
    compatibility_date: str | None


@dataclass(frozen=True, slots=True)
class ScriptContent:
    """A Worker script's modules (name -> bytes) and which one is the entry point."""

    main_module: str
    modules: dict[str, bytes] = field(default_factory=dict)


def _means_missing(exc: CloudflareAPIError, missing_code: int) -> bool:
    """A 404 in Cloudflare's envelope with no code or the code for "does not exist"."""
    return exc.status == 404 and exc.enveloped and (not exc.codes or missing_code in exc.codes)


class Client:
    """A synchronous Cloudflare API client for the endpoints edgegen uses.

    ``transport`` replaces the network (tests pass ``httpx.MockTransport`` or use respx),
    ``sleep`` and ``jitter`` replace waiting and randomness. ``proxy`` (an http:// or
    https:// URL) is the proxy requests to an https:// base go through, in a CONNECT
    tunnel; a loopback base is never reached through it, and no proxy is ever taken from
    ``HTTP_PROXY``, ``HTTPS_PROXY`` or ``ALL_PROXY``. ``timeout``,
    ``request_deadline``, ``command_deadline`` (seconds) and ``max_response_bytes`` default
    to ``_transport``'s ``DEFAULT_TIMEOUT``, ``REQUEST_DEADLINE``, ``COMMAND_DEADLINE`` and
    ``MAX_RESPONSE_BYTES``. Use it as a context manager, or call ``close``.
    """

    def __init__(
        self,
        token: Token,
        *,
        base_url: str = DEFAULT_BASE_URL,
        transport: httpx.BaseTransport | None = None,
        proxy: str | None = None,
        timeout: httpx.Timeout | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] | None = None,
        jitter: Callable[[float, float], float] | None = None,
        request_deadline: float | None = None,
        command_deadline: float | None = None,
        max_response_bytes: int | None = None,
    ) -> None:
        self._transport = Transport(
            token,
            sleep=sleep if sleep is not None else _wait,
            jitter=jitter or random.uniform,
            base_url=base_url,
            transport=transport,
            proxy=proxy,
            timeout=timeout,
            retry=retry,
            request_deadline=request_deadline,
            command_deadline=command_deadline,
            max_response_bytes=max_response_bytes,
        )

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, token_file: str | None = None, **options: Any
    ) -> Client:
        """A client with the token, base URL and proxy (``EDGEGEN_PROXY``) from the
        environment (the token perhaps from ``--token-file``)."""
        options.setdefault("proxy", proxy_from_env(env))
        return cls(Token.from_env(env, token_file), base_url=base_url_from_env(env), **options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._transport.close()

    def __repr__(self) -> str:
        return f"Client(base_url={self.shown_base_url!r})"

    @property
    def base_url(self) -> str:
        """Where requests go (``https://api.cloudflare.com/client/v4`` or a proxy)."""
        return self._transport.base_url

    @property
    def shown_base_url(self) -> str:
        """The base URL as messages show it: a proxy's password is never printed."""
        return self._transport.shown_base_url

    @property
    def spent(self) -> float:
        """Seconds spent on the API so far: tries and waits between them."""
        return self._transport.spent

    def redact(self, text: str) -> str:
        """Text from the server, fit to quote: without the token, cut short."""
        return self._transport.redact(text)

    def post_graphql(self, path: str, request: Mapping[str, Any]) -> bytes:
        """POST one GraphQL request (``query`` and ``variables``) to ``path``; the 2xx
        answer's body, unread (it is no v4 envelope; GraphQL errors are in it).

        A query changes nothing, so it is retried as a read is: on 429, 408, 409 and 5xx
        with the client's backoff (and Retry-After), and when unanswered; a final failure
        raises :class:`CloudflareAPIError`, never saying a change may have been made.
        """
        return self._transport.send("POST", path, json_body=dict(request), query=True).content

    def _get_or_none(self, path: str, missing_code: int) -> Any:
        """GET, returning None only when Cloudflare clearly says the thing does not exist.

        A 404 whose envelope names another code (e.g. an unknown zone) or a 404 that is not
        a Cloudflare envelope at all (a proxy) is an error, not "missing": treating it as
        missing could make apply delete rules that are really there.
        """
        try:
            return self._transport.call("GET", path)
        except CloudflareAPIError as exc:
            if _means_missing(exc, missing_code):
                return None
            raise

    # --- reads -------------------------------------------------------------------------

    @staticmethod
    def entrypoint_path(zone_id: str) -> str:
        """The path of a zone's http_ratelimit entrypoint."""
        return f"/zones/{quote(zone_id, safe='')}/rulesets/phases/{PHASE}/entrypoint"

    def get_entrypoint(self, zone_id: str) -> RemoteRuleset | None:
        """The zone's http_ratelimit entrypoint, or None when the zone has none yet."""
        path = self.entrypoint_path(zone_id)
        result = self._get_or_none(path, ENTRYPOINT_NOT_FOUND)
        if result is None:
            return None
        return parse_ruleset(result, "GET", path)

    def get_script_settings(self, account_id: str, name: str) -> ScriptSettings | None:
        """A Worker script's bindings and compatibility date, or None if there is no script."""
        path = f"{self.script_path(account_id, name)}/settings"
        result = self._get_or_none(path, SCRIPT_NOT_FOUND)
        if result is None:
            return None
        if not isinstance(result, dict) or not isinstance(result.get("bindings", []), list):
            raise bad_result("GET", path, "settings with a list of bindings")
        bindings = tuple(b for b in result.get("bindings") or () if isinstance(b, dict))
        date = result.get("compatibility_date")
        return ScriptSettings(bindings, date if isinstance(date, str) else None)

    def get_script_content(self, account_id: str, name: str) -> ScriptContent | None:
        """A Worker script's modules, or None if there is no script.

        Cloudflare answers with multipart/form-data (one part per module) for module
        Workers, naming the entry point in ``CF-Entrypoint``, and with the raw script for
        service-worker scripts.
        """
        path = f"{self.script_path(account_id, name)}/content/v2"
        try:
            response = self._transport.send("GET", path)
        except CloudflareAPIError as exc:
            if _means_missing(exc, SCRIPT_NOT_FOUND):
                return None
            raise
        entry = response.headers.get("CF-Entrypoint")
        content_type = response.headers.get("Content-Type", "")
        if content_type.startswith("multipart/"):
            modules = parse_multipart(content_type, response.content)
            if not modules:
                raise bad_result("GET", path, "a multipart body with at least one module")
            main = entry or next(iter(modules))
            if main not in modules:
                raise bad_result(
                    "GET", path, f"a module named {self.redact(main)!r} (CF-Entrypoint)"
                )
            return ScriptContent(main, modules)
        return ScriptContent(entry or "worker.js", {entry or "worker.js": response.content})

    @staticmethod
    def script_path(account_id: str, name: str) -> str:
        """The path of a Worker script."""
        return f"/accounts/{quote(account_id, safe='')}/workers/scripts/{quote(name, safe='')}"

    @staticmethod
    def routes_path(zone_id: str) -> str:
        """The path of a zone's Worker routes."""
        return f"/zones/{quote(zone_id, safe='')}/workers/routes"

    def list_routes(self, zone_id: str) -> tuple[RemoteRoute, ...]:
        """Every Worker route of the zone."""
        path = self.routes_path(zone_id)
        result = self._transport.call("GET", path)
        if not isinstance(result, list):
            raise bad_result("GET", path, "a list of routes")
        return tuple(parse_route(item, "GET", path) for item in result)

    @staticmethod
    def url_normalization_path(zone_id: str) -> str:
        """The path of a zone's URL normalisation setting."""
        return f"/zones/{quote(zone_id, safe='')}/url_normalization"

    def get_url_normalization(self, zone_id: str) -> UrlNormalization:
        """How the zone normalises URLs before rules and Workers see them.

        Needs Zone > Zone Settings > Read: a token without it gets a CloudflareAPIError with
        status 403, which callers may treat as "unknown".
        """
        path = self.url_normalization_path(zone_id)
        result = self._transport.call("GET", path)
        if not isinstance(result, dict):
            raise bad_result("GET", path, "a URL normalisation setting")
        scope, kind = result.get("scope"), result.get("type")
        if not isinstance(scope, str) or not isinstance(kind, str):
            raise bad_result("GET", path, "a setting with a scope and a type")
        return UrlNormalization(self.redact(scope), self.redact(kind))

    # --- writes ------------------------------------------------------------------------

    def put_entrypoint_write(
        self, zone_id: str, body: dict[str, Any], *, dry_run: bool = False
    ) -> Write:
        """Replace the zone's rate limiting rules (``dry_run``: only validate them)."""
        return Write(
            "PUT",
            self.entrypoint_path(zone_id),
            f"{'validate' if dry_run else 'update'} the {PHASE} rules of zone {zone_id}",
            params=(("dry_run", "true"),) if dry_run else (),
            json_body=body,
        )

    def put_script_write(
        self, account_id: str, name: str, metadata: dict[str, Any], modules: Mapping[str, str]
    ) -> Write:
        """Upload a module Worker: a ``metadata`` part and one part per module."""
        parts = [Part("metadata", json.dumps(metadata).encode("utf-8"), "application/json")]
        parts.extend(
            Part(module, source.encode("utf-8"), _MODULE_TYPE, filename=module)
            for module, source in modules.items()
        )
        return Write(
            "PUT",
            self.script_path(account_id, name),
            f"upload the Worker {name}",
            parts=tuple(parts),
        )

    def create_route_write(self, zone_id: str, pattern: str, script: str) -> Write:
        """Add a Worker route."""
        return Write(
            "POST",
            self.routes_path(zone_id),
            f"add the route {pattern} -> {script}",
            json_body={"pattern": pattern, "script": script},
        )

    def delete_route_write(self, zone_id: str, route_id: str, pattern: str) -> Write:
        """Remove a Worker route."""
        return Write(
            "DELETE",
            f"{self.routes_path(zone_id)}/{quote(route_id, safe='')}",
            f"remove the route {pattern}",
        )

    def send(self, write: Write) -> Any:
        """Send a write and return Cloudflare's ``result``.

        Deleting a route that is already gone counts as done: the zone is as wanted.
        """
        try:
            return self._transport.call(
                write.method,
                write.path,
                params=write.params,
                json_body=write.json_body,
                parts=write.parts,
            )
        except CloudflareAPIError as exc:
            if write.method == "DELETE" and exc.status == 404:
                return None
            raise


# --- what an answer must look like ---------------------------------------------------


def parse_ruleset(result: Any, method: str, path: str) -> RemoteRuleset:
    """A RemoteRuleset from an entrypoint result; an error if it is not shaped like one."""
    if not isinstance(result, dict) or not isinstance(result.get("rules", []), list):
        raise bad_result(method, path, "a ruleset with a list of rules")
    rules = result.get("rules") or []
    if not all(isinstance(rule, dict) for rule in rules):
        raise bad_result(method, path, "a ruleset whose rules are objects")
    return RemoteRuleset(
        id=str(result.get("id", "")),
        version=str(result.get("version", "")),
        description=str(result.get("description", "")),
        rules=tuple(rules),
    )


def parse_route(item: Any, method: str, path: str) -> RemoteRoute:
    """A RemoteRoute from a routes result item."""
    if not isinstance(item, dict) or not isinstance(item.get("pattern"), str):
        raise bad_result(method, path, "routes with a pattern")
    script = item.get("script")
    if script is not None and not isinstance(script, str):
        raise bad_result(method, path, "routes whose script is a name")
    return RemoteRoute(str(item.get("id", "")), item["pattern"], script if script else None)


def parse_multipart(content_type: str, body: bytes) -> dict[str, bytes]:
    """Part name -> bytes of a multipart/form-data body (the standard library's parser)."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    out: dict[str, bytes] = {}
    if not message.is_multipart():
        return out
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            out[name] = payload
    return out
