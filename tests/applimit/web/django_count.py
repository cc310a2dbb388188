"""Settings and URLs of a Django site with a login form limited by failures only
(test_web_count_when.py): the example project's settings, this module as the URL conf, and
no identify (every caller is counted by address). The views count their runs in Redis, as
the site runs in several gunicorn workers, and so do the limiter's lookups of the limits a
request matches (lookups.py: the name of each one's caller, in the list test:lookups)."""

from __future__ import annotations

import os

import redis
from demo_site.settings import *  # noqa: F403 (the example's settings, then the changes)
from demo_site.settings import APPLIMIT
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from lookups import counting_lookups

from applimit._plan import Core
from applimit.django import rate_limit

ROOT_URLCONF = "django_count"
APPLIMIT = {**APPLIMIT, "identify": None}

_RUNS = redis.Redis.from_url(os.environ["REDIS_URL"])
Core._match = counting_lookups(  # type: ignore[method-assign]
    lambda caller: _RUNS.rpush("test:lookups", caller)
)


@csrf_exempt
def login(request: HttpRequest) -> HttpResponse:
    """Counts its run; 200 for the right password, 401 otherwise."""
    _RUNS.incr("test:runs:login")
    if request.body == b"password=right":
        return JsonResponse({"ok": True})
    return JsonResponse({"ok": False}, status=401)


@csrf_exempt
def boom(request: HttpRequest) -> HttpResponse:
    """Counts its run, then fails: Django answers 500."""
    _RUNS.incr("test:runs:boom")
    raise RuntimeError("the handler failed")


@csrf_exempt
@rate_limit("signin")
def signin(request: HttpRequest) -> HttpResponse:
    """Limited by its decorator only; 403 raised for a forbidden password."""
    _RUNS.incr("test:runs:signin")
    if request.body == b"password=forbidden":
        raise PermissionDenied("forbidden")
    if request.body == b"password=right":
        return JsonResponse({"ok": True})
    return JsonResponse({"ok": False}, status=401)


def healthz(request: HttpRequest) -> JsonResponse:
    """No limit matches."""
    return JsonResponse({"ok": True})


urlpatterns = [
    path("login", login),
    path("signin", signin),
    path("boom", boom),
    path("healthz", healthz),
]
