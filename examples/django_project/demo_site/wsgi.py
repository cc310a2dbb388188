"""The WSGI callable for gunicorn, uWSGI or waitress: ``gunicorn demo_site.wsgi``."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")

# Loading the application loads MIDDLEWARE, so a wrong APPLIMIT setting stops the worker
# here, at start-up, with a message that names the option.
application = get_wsgi_application()
