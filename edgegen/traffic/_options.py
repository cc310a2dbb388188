"""How traffic files are read (:class:`TrafficOptions`), the formats a reader knows
(:data:`FORMATS`), and the one error every reader raises (:class:`TrafficError`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from ..errors import EdgegenError

FORMATS: Final = ("combined", "logpush", "events", "ndjson", "csv")

# Records of one file may be this much out of time order (Apache writes %t, the time a
# request arrived, when it finishes; a proxy's buffers flush out of order) and still be
# replayed in order; anything later is counted as malformed "out of order".
REORDER_WINDOW_US: Final = 5_000_000


class TrafficError(EdgegenError):
    """A traffic file cannot be read, its format cannot be told, an option does not fit it,
    or (under ``strict``) a line is malformed. ``file`` and ``line`` locate it when known."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.line = line


@dataclass(frozen=True, slots=True)
class TrafficOptions:
    """How to read traffic files.

    ``format``: one of :data:`FORMATS`, or None to detect each file's. ``user_from``: where
    the user is: ``header:NAME`` or ``cookie:NAME`` (Logpush's ``RequestHeaders`` and
    ``Cookies``), or a field or column name (an appended field of a combined log). ``tiers``:
    user -> tier (:func:`load_tiers`); ``default_tier`` for records whose tier is unknown.
    ``authenticated_headers`` and ``authenticated_cookies``: the policy's
    ``authenticated_when``; ``authenticated`` forces every record's value. ``strict``: the
    first malformed line is an error.
    """

    format: str | None = None
    user_from: str | None = None
    tiers: Mapping[str, str] = field(default_factory=dict)
    default_tier: str | None = None
    authenticated_headers: Sequence[str] = ()
    authenticated_cookies: Sequence[str] = ()
    authenticated: bool | None = None
    strict: bool = False
    reorder_window_us: int = REORDER_WINDOW_US
