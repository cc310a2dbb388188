"""How to put applimit in front of a Django project (a snippet, not a whole project).

Django has two entry points, and the middleware wraps whichever one you deploy. In
``yourproject/wsgi.py`` (gunicorn, uWSGI, waitress)::

    import os
    from django.conf import settings
    from django.core.wsgi import get_wsgi_application
    from applimit import Limiter
    from applimit.wsgi import RateLimitMiddleware
    from yourproject.ratelimit import identify

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yourproject.settings")
    django_app = get_wsgi_application()
    application = RateLimitMiddleware(
        django_app,
        limiter=Limiter.from_policy(
            settings.RATE_LIMIT_POLICY, redis_url=settings.RATE_LIMIT_REDIS_URL
        ),
        identify=identify,
        trusted_proxies=settings.RATE_LIMIT_TRUSTED_PROXIES,
    )

and in ``yourproject/asgi.py`` (uvicorn, daphne, hypercorn) the same with
``django.core.asgi.get_asgi_application``, ``applimit.AsyncLimiter`` and
``applimit.asgi.RateLimitMiddleware``. Wrapping the WSGI/ASGI callable (rather than adding
a Django ``MIDDLEWARE`` entry) decides before Django resolves the URL, opens a session or
touches the database, so a refused request costs one Redis call and nothing else.

``identify`` reads the caller from the request as it arrives (an API key or a bearer token;
Django's session middleware has not run yet)::

    # yourproject/ratelimit.py
    from applimit.wsgi import Caller, RequestInfo

    def identify(request: RequestInfo) -> Caller | None:
        key = request.header("x-api-key")
        account = ApiKey.lookup(key) if key else None       # your own model, cached
        return Caller(str(account.user_id), tier=account.plan) if account else None

The settings below are the ones the snippet above reads; copy them into settings.py.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

# The policy file shared with the edge (edgegen) and every app instance.
RATE_LIMIT_POLICY = os.environ.get("RATE_LIMIT_POLICY", str(BASE_DIR / "policy.yaml"))
# Overrides the policy's app.redis_url when set.
RATE_LIMIT_REDIS_URL = os.environ.get("REDIS_URL")
# Your load balancers: X-Forwarded-For is believed only when they are the direct peer.
RATE_LIMIT_TRUSTED_PROXIES = [
    p.strip() for p in os.environ.get("TRUSTED_PROXIES", "10.0.0.0/8").split(",") if p.strip()
]
