"""The example's views: the middleware limits them by the policy's match:, and two name a
limit of their own."""

from __future__ import annotations

from collections.abc import Iterator

from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET, require_POST

from applimit import rate_limited
from applimit.django import get_limiter, rate_limit

from .ratelimit import identify


def healthz(request: HttpRequest) -> JsonResponse:
    """No limit matches: never limited, never counted."""
    return JsonResponse({"status": "ok"})


@require_GET
def items(request: HttpRequest) -> JsonResponse:
    """Counted by the middleware under the policy's "api" limit."""
    return JsonResponse({"items": [1, 2, 3]})


@require_GET
def search(request: HttpRequest) -> JsonResponse:
    """Counted under "api" and "search" in one call."""
    return JsonResponse({"hits": []})


@require_POST
def login(request: HttpRequest) -> JsonResponse:
    """Counted per client IP under "login", which fails closed (503) when Redis is down."""
    return JsonResponse({"session": "example"})


@require_GET
def export(request: HttpRequest, name: str) -> StreamingHttpResponse:
    """A streaming response: the headers are added, the body is not touched."""

    def rows() -> Iterator[str]:
        for n in range(3):
            yield f"{name},{n}\n"

    return StreamingHttpResponse(rows(), content_type="text/csv")


@require_GET
@rate_limit("search", cost=5)
def report(request: HttpRequest, name: str) -> JsonResponse:
    """A report costs 5 units of the search budget (the policy's "search" matches only
    /api/search, so the middleware does not count this view as well)."""
    return JsonResponse({"report": name})


@require_GET
@rate_limit("search")
async def report_status(request: HttpRequest, name: str) -> JsonResponse:
    """An async view takes the same decorator (the Redis call runs in a thread)."""
    return JsonResponse({"report": name, "status": "ready"})


# A plain function limited where it is called, whatever view calls it: the middleware
# answers its RateLimited with the same 429 as every other refusal.
@rate_limited(
    get_limiter(),
    "search",
    identity=lambda request: getattr(identify(request), "user", None),
    tier=lambda request: getattr(identify(request), "tier", None),
    ip=lambda request: request.META.get("REMOTE_ADDR"),
    cost=5,
)
def build_summary(request: HttpRequest) -> dict[str, object]:
    """Expensive work shared by several views."""
    return {"summary": "ok"}


@require_GET
def summary(request: HttpRequest) -> JsonResponse:
    """Calls a rate_limited function: a refusal there is a 429, not a 500 page."""
    return JsonResponse(build_summary(request))
