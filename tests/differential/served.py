"""The suite's WSGI apps as gunicorn serves them: one module, configured by the environment.

gunicorn runs in a process of its own and imports ``differential.served:app`` (with
``--pythonpath tests``). ``DIFFERENTIAL_APP`` names the app: ``flask`` (the Flask app of
apps.py) or ``django`` (a Django project with the same routes, :data:`spec.ROUTES`, resolved
on ``path_info`` as Django does). ``DIFFERENTIAL_POLICY`` is the policy file: set, the app is
limited (the WSGI middleware for Flask, ``applimit.django.RateLimitMiddleware`` for Django) over
``DIFFERENTIAL_REDIS_URL``; unset, it is the bare app, the oracle of what an origin serves.
Every handler answers as apps.py's do: ``X-Handler`` and ``X-Route-Path`` (what its router
matched, percent-encoded).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from . import apps, spec

KIND = os.environ.get("DIFFERENTIAL_APP", "flask")
POLICY = os.environ.get("DIFFERENTIAL_POLICY") or None
REDIS_URL = os.environ.get("DIFFERENTIAL_REDIS_URL") or None


def _flask() -> Any:
    import edgegen_policy as policy

    from applimit import Limiter

    limiter = None
    if POLICY is not None:
        limiter = Limiter.from_policy(policy.load(POLICY), redis_url=REDIS_URL)
    return apps.flask_app(limiter)


def _django_route(template: str) -> str:
    """A FastAPI route template in Django's ``path()`` syntax (no leading slash)."""
    return (
        template.removeprefix("/")
        .replace("{rest:path}", "<path:rest>")
        .replace("{item_id}", "<str:item_id>")
        .replace("{name}", "<str:name>")
    )


def _django() -> Any:
    import django
    from django.conf import settings

    middleware = ["applimit.django.RateLimitMiddleware"] if POLICY is not None else []
    options: dict[str, Any] = {}
    if POLICY is not None:
        options = {
            "policy": POLICY,
            "redis_url": REDIS_URL,
            "trusted_proxies": apps.TRUSTED,
            "behind_cloudflare": True,
        }
    settings.configure(
        DEBUG=False,
        SECRET_KEY="differential",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        MIDDLEWARE=middleware,
        INSTALLED_APPS=[],
        APPLIMIT=options,
        USE_TZ=True,
        LOGGING_CONFIG=None,
    )
    django.setup()
    from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
    from django.urls import path

    # Django resolves one pattern per path: the routes of one template share a view that
    # answers by method (as FastAPI and Flask pick among routes of one path).
    by_template: defaultdict[str, list[spec.Route]] = defaultdict(list)
    for route in spec.ROUTES:
        by_template[route.template].append(route)

    def view(routes: list[spec.Route]) -> Any:
        allowed = [m for route in routes for m in route.methods]

        def serve(request: HttpRequest, **_params: str) -> HttpResponse:
            for route in routes:
                if request.method in route.methods:
                    response = HttpResponse(route.handler)
                    response["X-Handler"] = route.handler
                    response["X-Route-Path"] = apps.route_path(request.path_info)
                    return response
            return HttpResponseNotAllowed(allowed)

        return serve

    global urlpatterns
    urlpatterns = [
        path(_django_route(template), view(routes)) for template, routes in by_template.items()
    ]
    from django.core.wsgi import get_wsgi_application

    return get_wsgi_application()


urlpatterns: list[Any] = []
app = _django() if KIND == "django" else _flask()
