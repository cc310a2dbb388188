"""Settings of the example project: no database, no apps, one rate-limit middleware.

Run it from examples/django_project/ with any WSGI server, for example::

    REDIS_URL=redis://localhost:6379/0 gunicorn --workers 2 demo_site.wsgi

``curl -i -H 'X-API-Key: key-bob' localhost:8000/api/items`` is bob on the pro tier;
without a key the caller is anonymous and counted by client IP. Environment: ``REDIS_URL``,
``RATE_LIMIT_POLICY`` (default: examples/policy.yaml), ``TRUSTED_PROXIES``
(comma-separated), ``BEHIND_CLOUDFLARE=1``, ``ALLOWED_HOSTS`` (comma-separated).
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent


def _env_list(name: str, default: str = "") -> list[str]:
    return [part.strip() for part in os.environ.get(name, default).split(",") if part.strip()]


# An example's key: a real project reads its own from the environment or a secret store.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS", "localhost,127.0.0.1")
ROOT_URLCONF = "demo_site.urls"
WSGI_APPLICATION = "demo_site.wsgi.application"
INSTALLED_APPS: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
TIME_ZONE = "UTC"

# The rate-limit middleware goes after every middleware that identify() reads from (with
# django.contrib.auth, after AuthenticationMiddleware, so that request.user is set) and
# before those that do expensive work a refused request should not cost.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "applimit.django.RateLimitMiddleware",
    "django.middleware.common.CommonMiddleware",
]

# applimit.django reads this once, on first use; a mistake fails at start-up.
APPLIMIT = {
    # The policy file shared with the edge (edgegen) and every app instance.
    "policy": os.environ.get("RATE_LIMIT_POLICY", str(BASE_DIR.parents[1] / "policy.yaml")),
    # Overrides the policy's app.redis_url when set.
    "redis_url": os.environ.get("REDIS_URL"),
    "identify": "demo_site.ratelimit.identify",
    # Your load balancers: X-Forwarded-For is believed only when they are the direct peer.
    "trusted_proxies": _env_list("TRUSTED_PROXIES"),
    "behind_cloudflare": os.environ.get("BEHIND_CLOUDFLARE") == "1",
    "legacy_headers": True,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    # Under gunicorn, errors of views (and of identify or cost functions) go to its log.
    "loggers": {
        "applimit": {"handlers": ["console"], "level": "WARNING"},
        "django.request": {"handlers": ["console"], "level": "ERROR"},
    },
}
