"""Who is calling, as the rate limiter needs to know it (``APPLIMIT["identify"]``)."""

from __future__ import annotations

from django.http import HttpRequest

from applimit.django import Caller

# Stands in for the project's real authentication: API keys and the plan each customer pays
# for. With django.contrib.auth, read request.user (and its plan) here instead.
API_KEYS = {
    "key-alice": Caller("alice", tier="free"),
    "key-bob": Caller("bob", tier="pro"),
    "key-carol": Caller("carol", tier="enterprise"),
}


def api_key(request: HttpRequest) -> str | None:
    """The caller's key: a bearer token or an X-API-Key header."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("X-API-Key") or None


def identify(request: HttpRequest) -> Caller | None:
    """The owner of the API key, or None (anonymous: counted by client IP)."""
    key = api_key(request)
    return API_KEYS.get(key) if key else None
