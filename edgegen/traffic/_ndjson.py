"""The ``ndjson`` format: one JSON object per line with named columns (``timestamp``,
``method``, ``host``, ``path``, ``ip`` and optionally ``user``, ``tier``,
``authenticated``, ``colo``, ``status``)."""

from __future__ import annotations

from ..replay._types import Record
from ._fields import Parser, load_object, named_record
from ._options import TrafficOptions


def ndjson_parser(user_from: tuple[str, str] | None, options: TrafficOptions) -> Parser:
    """The parser of NDJSON lines, the user from the key ``user_from`` names (``user``)."""
    user_key = user_from[1] if user_from is not None else "user"

    def parse(line: str) -> Record:
        return named_record(load_object(line), user_key, options)

    return parse
