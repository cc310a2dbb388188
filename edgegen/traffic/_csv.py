"""The ``csv`` format: a header naming the columns (those of ``ndjson``), then one row
per request."""

from __future__ import annotations

import csv

from ..replay._types import Record
from ._fields import REQUIRED_COLUMNS, Malformed, Parser, named_record
from ._options import TrafficError, TrafficOptions


def _csv_values(line: str) -> list[str]:
    """One CSV row's values; a row the csv module refuses (a field over its size limit) is
    malformed."""
    try:
        return next(csv.reader((line,)), [])
    except csv.Error as exc:
        raise Malformed("columns", f"not a CSV row ({exc})") from None


def csv_header(line: str) -> list[str]:
    """The column names of a CSV header line, lower case."""
    return [name.strip().lower() for name in _csv_values(line)]


def csv_parser(
    label: str, header: list[str], user_from: tuple[str, str] | None, options: TrafficOptions
) -> Parser:
    """The parser of a CSV file's rows under ``header``; TrafficError when the header lacks a
    required column or the column ``user_from`` names."""
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if header and missing:
        raise TrafficError(
            f"{label}: the CSV header has no {', '.join(repr(c) for c in missing)} column; "
            f"traffic CSV needs {', '.join(REQUIRED_COLUMNS)} (and may have host, user, "
            "tier, authenticated, colo, status)",
            file=label,
        )
    user_key = user_from[1] if user_from is not None else "user"
    if user_from is not None and header and user_key not in header:
        raise TrafficError(
            f"{label}: --user-from {user_key!r} is not a column of this CSV file (its columns "
            f"are {', '.join(header)}); name one of them",
            file=label,
        )
    width = len(header)

    def parse(line: str) -> Record:
        # Most rows hold no quotes: split them directly, and let csv handle the rest.
        values = line.split(",") if '"' not in line else _csv_values(line)
        if len(values) != width:
            raise Malformed("columns", f"{len(values)} values for {width} columns")
        return named_record(dict(zip(header, values, strict=True)), user_key, options)

    return parse
