"""A count of the core's lookups of the limits a request matches (``Core._match``), by the
function that asked: the middleware tests hold each stack to one lookup per request of its
own. Installed on the class, so it counts every limiter of the process (the pure build's:
a compiled core calls its own methods directly)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from applimit._plan import Core


def counting_lookups(record: Callable[[str], object]) -> Callable[..., Any]:
    """``Core._match`` that first gives ``record`` the name of the function that called it."""
    lookup = Core._match

    def counted(self: Core, *args: Any, **kwargs: Any) -> Any:
        record(sys._getframe(1).f_code.co_name)
        return lookup(self, *args, **kwargs)

    return counted
