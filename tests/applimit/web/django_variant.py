"""Settings for the example Django project with the changes some tests need, picked by
environment variables:

- ``ON_IDENTIFY_ERROR``: identify() always raises, as an auth backend that is down would,
  and the variable says what that means;
- ``REQUEST_COST=1``: the request check costs what the ``X-Cost`` header says.

gunicorn loads it with ``--pythonpath tests/applimit/web`` and
``DJANGO_SETTINGS_MODULE=django_variant`` (see test_django.py).
"""

from __future__ import annotations

import os

from demo_site.settings import *  # noqa: F403 (the example's settings, then the changes)
from demo_site.settings import APPLIMIT
from django.http import HttpRequest

from applimit.django import Caller


def broken_identify(request: HttpRequest) -> Caller | None:
    """The auth backend is down."""
    raise RuntimeError("the auth backend is down")


def header_cost(request: HttpRequest) -> int:
    """What the client says the request costs (a test's way to vary it)."""
    return int(request.headers.get("X-Cost", "1"))


APPLIMIT = dict(APPLIMIT)
if "ON_IDENTIFY_ERROR" in os.environ:
    APPLIMIT["identify"] = broken_identify
    APPLIMIT["on_identify_error"] = os.environ["ON_IDENTIFY_ERROR"]
if os.environ.get("REQUEST_COST") == "1":
    APPLIMIT["cost"] = "django_variant.header_cost"
