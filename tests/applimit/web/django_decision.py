"""Settings and URLs of a Django site whose views answer with the Decision the helpers
left on the request (``request.applimit_decision``): the example project's settings, this
module as the URL conf. gunicorn loads it with ``--pythonpath tests/applimit/web`` and
``DJANGO_SETTINGS_MODULE=django_decision`` (see test_web_helper_decisions.py)."""

from __future__ import annotations

from demo_site.settings import *  # noqa: F403 (the example's settings, then the changes)
from django.http import HttpRequest, JsonResponse
from django.urls import path

from applimit import Decision
from applimit.django import rate_limit

ROOT_URLCONF = "django_decision"


def described(decision: Decision | None) -> dict[str, object]:
    """What a view answers about the Decision it was given."""
    if decision is None:
        return {"decision": None}
    return {
        "allowed": decision.allowed,
        "degraded": decision.degraded,
        "limits": sorted({r.name for r in decision.results}),
        "shadow_denied_by": sorted(r.name for r in decision.shadow_denied_by),
    }


def thing(request: HttpRequest) -> JsonResponse:
    """Checked by the middleware only."""
    return JsonResponse(described(getattr(request, "applimit_decision", None)))


@rate_limit("export")
def report(request: HttpRequest) -> JsonResponse:
    """Checked by the middleware, then by its own limit."""
    return JsonResponse(described(getattr(request, "applimit_decision", None)))


def healthz(request: HttpRequest) -> JsonResponse:
    """No limit matches."""
    return JsonResponse(described(getattr(request, "applimit_decision", None)))


urlpatterns = [
    path("api/thing", thing),
    path("api/report", report),
    path("healthz", healthz),
]
