#!/usr/bin/env python
"""Django's command-line utility for the example project (``python manage.py check``)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run a Django management command with the example's settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
