"""The redis-py releases applimit supports, checked once at import.

applimit reads replies through redis-py's connections and parsers, some of them private
(``_hiredis.py``, ``_wire.py``, ``_awire.py``), and relies on error replies carrying their
``status_code``: redis-py before 8.0 lacks what it relies on, and there the limiter cannot
decide (it admitted nothing on 5.0-7.4). The range is the one pyproject.toml's ``app``
extra declares and ``make test`` runs the contract suite on, at both ends (the oldest
without hiredis): an install outside it fails at import with what to install, rather than
deciding wrongly.
"""

from __future__ import annotations

import redis

# The supported range: [OLDEST, BEYOND), as pyproject.toml's app extra declares it.
OLDEST = (8, 0)
BEYOND = (9, 0)


def _release(text: str) -> tuple[int, int]:
    """The (major, minor) of a version string such as ``8.2.0`` or ``8.1.0b1``."""
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) or "0"
        parts.append(int(digits))
    return (parts[0], parts[1] if len(parts) > 1 else 0)


def check_redis(version: str = redis.__version__) -> None:
    """Raise ImportError, saying what to install, when redis-py is outside the range."""
    found = _release(version)
    if not OLDEST <= found < BEYOND:
        wanted = f"redis>={OLDEST[0]}.{OLDEST[1]},<{BEYOND[0]}"
        raise ImportError(
            f"applimit supports redis-py {OLDEST[0]}.{OLDEST[1]} up to (not including) "
            f"{BEYOND[0]}.0, and redis-py {version} is installed; install a supported "
            f"release: pip install '{wanted}'"
        )


check_redis()
