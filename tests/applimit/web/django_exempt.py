"""Settings and URLs of a Django site with the exemptions and the refusal body of
test_web_exempt_refusal.py: the example project's settings, this module as the URL conf.
gunicorn loads it with ``--pythonpath tests/applimit/web`` and
``DJANGO_SETTINGS_MODULE=django_exempt``. ``REFUSAL=raise`` makes the refusal function
fail, as a broken template would.

Every view answers whether the Decision left on the request is ``applimit.EXEMPT``.
"""

from __future__ import annotations

import os

from demo_site.settings import *  # noqa: F403 (the example's settings, then the changes)
from demo_site.settings import APPLIMIT
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from applimit import EXEMPT, Refusal
from applimit.django import Caller, rate_limit_exempt

ROOT_URLCONF = "django_exempt"
INTERNAL = "10.9.9.9"
KEYS = {"key-alice": Caller("alice"), "key-root": Caller("root")}


def identify(request: HttpRequest) -> Caller | None:
    """X-API-Key names the caller; X-Boom makes the auth fail, so that a request which
    reaches identify shows it (a 500 under on_identify_error "raise")."""
    if "X-Boom" in request.headers:
        raise RuntimeError("identify ran")
    return KEYS.get(request.headers.get("X-API-Key", ""))


def exempt_when(request: HttpRequest, client_ip: str) -> bool:
    """The health check and the internal address are not limited."""
    return request.path == "/api/health" or client_ip == INTERNAL


def exempt_caller(request: HttpRequest, caller: Caller) -> bool:
    """root, when asking for it, is not limited."""
    return caller.user == "root" and request.headers.get("X-Sudo") == "1"


def refusal(request: HttpRequest, default: Refusal) -> tuple[str, str]:
    """The site's own page for a refusal."""
    if os.environ.get("REFUSAL") == "raise":
        raise RuntimeError("the refusal template is broken")
    limit = default.decision.policy if default.decision is not None else "none"
    page = f"<p>{default.status} by {limit}: retry in {default.retry_after} s ({request.path})</p>"
    return page, "text/html; charset=utf-8"


APPLIMIT = {
    **APPLIMIT,
    "identify": identify,
    "exempt_when": "django_exempt.exempt_when",
    "exempt_caller": exempt_caller,
    "refusal": "django_exempt.refusal",
}


def answer(request: HttpRequest) -> JsonResponse:
    """Whether the request was spared, and whether it was decided at all."""
    decision = getattr(request, "applimit_decision", None)
    return JsonResponse({"exempt": decision is EXEMPT, "decided": decision is not None})


@rate_limit_exempt
def status(request: HttpRequest) -> JsonResponse:
    """Left out of the request check, though the api limit's match: covers it."""
    return answer(request)


@method_decorator(rate_limit_exempt, name="dispatch")
class Panel(View):
    """A class-based view left out through its dispatch."""

    def get(self, request: HttpRequest) -> JsonResponse:
        """The answer of every view here."""
        return answer(request)


urlpatterns = [
    path("healthz", answer),
    path("api/items", answer),
    path("api/health", answer),
    path("api/status", status),
    path("api/panel", Panel.as_view()),
]
