"""JSON from outside edgegen (Cloudflare's answers, state and plan files), read safely.

``json.loads`` accepts things edgegen could not handle afterwards: nesting deep enough to
exhaust the stack (``RecursionError`` while parsing, or later while copying or hashing),
strings holding lone surrogates (``"\\ud800"``, which cannot be encoded to UTF-8, so
hashing or printing them fails), and ``NaN``/``Infinity``, which are not JSON. ``loads``
refuses all of them with ``UnusableJSONError``, a ``ValueError`` whose message says why in
a few words; a syntax error stays ``json.JSONDecodeError`` (also a ``ValueError``).
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

# Nothing Cloudflare answers or edgegen writes nests deeper than about ten levels.
MAX_DEPTH = 64


class UnusableJSONError(ValueError):
    """Well-formed JSON that edgegen refuses; the message says why (``it nests ...``)."""


def _constant(name: str) -> NoReturn:
    raise UnusableJSONError(f"it holds {name}, which is not a JSON number")


def loads(text: str | bytes) -> Any:
    """Parse JSON; ``UnusableJSONError`` for deep nesting, lone surrogates or NaN."""
    try:
        value = json.loads(text, parse_constant=_constant)
    except RecursionError:
        raise UnusableJSONError(f"it nests more than {MAX_DEPTH} levels deep") from None
    check(value)
    return value


def check(value: Any) -> None:
    """``UnusableJSONError`` unless every string encodes to UTF-8 and nesting is bounded."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _text(item)
        elif isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise UnusableJSONError(f"it nests more than {MAX_DEPTH} levels deep")
            if isinstance(item, dict):
                for key, child in item.items():
                    _text(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def _text(value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UnusableJSONError(
            "it holds a string with a lone surrogate (\\ud800-\\udfff), which is not text"
        ) from None


# --- typed reads of parsed JSON: TypeError naming the field when a value is of the wrong type
# (files are read by their models, ``zone._file_formats``; these are for what the models leave raw)


def shown(value: Any) -> str:
    """A value as short JSON for a message: at most 40 characters, ASCII only."""
    text = json.dumps(value, ensure_ascii=True, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."


def obj(value: Any, what: str) -> dict[str, Any]:
    """``value`` if it is an object."""
    if not isinstance(value, dict):
        raise TypeError(f"{what} is {shown(value)}, not an object")
    return value


def objects(value: Any, what: str) -> tuple[dict[str, Any], ...]:
    """``value`` if it is a list of objects."""
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise TypeError(f"{what} is {shown(value)}, not a list of objects")
    return tuple(value)
