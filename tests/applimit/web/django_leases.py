"""Settings and URLs of a Django site with a concurrency-limited export
(test_web_leases.py): the example project's settings, this module as the URL conf, no
identify (every caller is counted by address). The export streams, and waits for its gate
(a Redis list) before its last chunk."""

from __future__ import annotations

import os
from collections.abc import Iterator

import redis
from demo_site.settings import *  # noqa: F403 (the example's settings, then the changes)
from demo_site.settings import APPLIMIT
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.urls import path

ROOT_URLCONF = "django_leases"
APPLIMIT = {**APPLIMIT, "identify": None}

_REDIS = redis.Redis.from_url(os.environ["REDIS_URL"])


def export(request: HttpRequest) -> StreamingHttpResponse:
    """Counts itself running; streams "start", waits for its gate, then "end"."""
    gate = request.GET.get("id", "")
    _REDIS.incr("running")

    def body() -> Iterator[bytes]:
        try:
            yield b"start\n"
            _REDIS.blpop([f"gate:{gate}"], timeout=15)
            yield b"end\n"
        finally:
            _REDIS.decr("running")

    return StreamingHttpResponse(body(), content_type="text/plain")


def fail(request: HttpRequest) -> JsonResponse:
    """Raises: Django answers 500."""
    raise RuntimeError("the export failed")


def healthz(request: HttpRequest) -> JsonResponse:
    """No limit matches."""
    return JsonResponse({"ok": True})


urlpatterns = [path("export", export), path("export/fail", fail), path("healthz", healthz)]
