"""What the modules that setup.py may compile with mypyc say to it, at no cost when they are not.

A class compiled by mypyc is closed to subclasses written in Python unless it says
otherwise; ``@mypyc_attr(allow_interpreted_subclasses=True)`` says so. mypyc reads the
decorator from the source and never calls it, and mypy only needs its type, so the package
does not depend on ``mypy_extensions`` at run time: there it is a decorator that returns
the class unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # The alias re-exports it (mypy --strict exports no implicit re-import).
    from mypy_extensions import mypyc_attr as mypyc_attr  # noqa: PLC0414
else:

    def mypyc_attr(*_args, **_kwargs):
        """The class unchanged: only mypyc gives the decorator a meaning."""
        return lambda cls: cls
