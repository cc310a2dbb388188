"""The limiter's Lua script, assembled from the package's ``lua/*.lua`` files.

Each algorithm is its own file (``sliding_log.lua``, ``sliding_window.lua``, ``gcra.lua``),
opening with its contract. They are joined once, at import, into one script: helpers
first, then the algorithms, then ``decide.lua``, which runs the checks of one decision in
two phases. One script is what makes several limits with different algorithms one atomic
round trip. It is run by SHA (EVALSHA); on NOSCRIPT (a restarted or flushed server) the
shells send it once with EVAL, which runs it and caches it again.
"""

from __future__ import annotations

import hashlib
from importlib.resources import files

ALGORITHM_FILES = ("sliding_log.lua", "sliding_window.lua", "gcra.lua")
PARTS = ("common.lua", *ALGORITHM_FILES, "decide.lua")


def _read(name: str) -> str:
    return files("applimit").joinpath("lua", name).read_text(encoding="utf-8")


def assemble() -> str:
    """The full script text, in the order its parts depend on each other."""
    return "\n".join(f"-- >>> {name}\n{_read(name)}" for name in PARTS)


SOURCE = assemble()
SHA = hashlib.sha1(SOURCE.encode("utf-8"), usedforsecurity=False).hexdigest()
