"""``python -m applimit``: the ``applimit`` command (see applimit/_cli.py)."""

from ._cli import main

raise SystemExit(main())
