"""The limiter's Lua script, assembled from the package's ``lua/*.lua`` files.

Each algorithm is its own file (``sliding_log.lua``, ``sliding_window.lua``, ``gcra.lua``),
opening with its contract. They are joined once, at import, into one script: helpers
first, then the algorithms, then ``decide.lua``, which runs the checks of one decision in
two phases. One script is what makes several limits with different algorithms one atomic
round trip.

The same code is shipped two ways:

- ``SOURCE``, an EVAL script run by SHA (EVALSHA); on NOSCRIPT (a restarted or flushed
  server) it is sent once with EVAL, which runs it and caches it again. Every Redis runs it.
- ``LIBRARY``, a Redis Functions library (Redis 7+) whose one function, ``FUNCTION``, is
  ``decide.lua`` as a function of KEYS and ARGV. Its helpers and algorithm tables are made
  once, when the library loads, instead of on every call as an EVAL script's are: about
  2 µs less per decision in Redis. On "Function not found" the shells load it (FUNCTION
  LOAD) and call again; where FCALL or FUNCTION LOAD is refused (Redis 6, an ACL without
  them) they use EVALSHA from then on. Both names carry a digest of the code, so versions
  of applimit with different scripts can share a server during a rolling deploy.
"""

from __future__ import annotations

import hashlib
from importlib.resources import files

ALGORITHM_FILES = ("sliding_log.lua", "sliding_window.lua", "gcra.lua", "quota.lua", "lease.lua")
PARTS = ("common.lua", *ALGORITHM_FILES, "decide.lua")


def _read(name: str) -> str:
    return files("applimit").joinpath("lua", name).read_text(encoding="utf-8")


def assemble() -> str:
    """The full script text, in the order its parts depend on each other."""
    return "\n".join(f"-- >>> {name}\n{_read(name)}" for name in PARTS)


def assemble_library(name: str) -> str:
    """The Redis Functions library: the same parts, ``decide.lua`` as function ``name``."""
    helpers = "\n".join(f"-- >>> {part}\n{_read(part)}" for part in PARTS[:-1])
    return (
        f"#!lua name={name}\n{helpers}\n"
        f"-- >>> {PARTS[-1]}\nlocal function decide(KEYS, ARGV)\n{_read(PARTS[-1])}\nend\n"
        f"redis.register_function('{name}', decide)\n"
    )


SOURCE = assemble()
SHA = hashlib.sha1(SOURCE.encode("utf-8"), usedforsecurity=False).hexdigest()
# The library and its function share one name: applimit_ and 16 hex digits of the SHA of
# the library's code, so a changed script is a new library, loaded beside the old one.
_DIGEST = hashlib.sha1(
    assemble_library("applimit").encode("utf-8"), usedforsecurity=False
).hexdigest()
FUNCTION = f"applimit_{_DIGEST[:16]}"
LIBRARY = assemble_library(FUNCTION)
