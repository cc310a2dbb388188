"""Settings for the example Django project whose identify() always raises, as an auth
backend that is down would; ``ON_IDENTIFY_ERROR`` picks what that means.

gunicorn loads it with ``--pythonpath tests/applimit/web`` and
``DJANGO_SETTINGS_MODULE=django_authdown`` (see test_django.py).
"""

from __future__ import annotations

import os

from demo_site.settings import *  # noqa: F403 (the example's settings, then the changes)
from demo_site.settings import APPLIMIT

from applimit.django import Caller


def identify(request: object) -> Caller | None:
    """The auth backend is down."""
    raise RuntimeError("the auth backend is down")


APPLIMIT = {
    **APPLIMIT,
    "identify": identify,
    "on_identify_error": os.environ.get("ON_IDENTIFY_ERROR", "raise"),
}
