"""Loading a policy file: YAML with positions, ``${VAR}`` expansion, and validation.

The loader walks PyYAML's node graph itself instead of using ``safe_load`` so that every
value keeps the line and column it came from; pydantic's error locations are then mapped
back to the file. All problems are collected and raised together.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails
from yaml.constructor import SafeConstructor

from ._errors import Diagnostic, PolicyLoadError, Severity
from ._model import Policy

MAX_FILE_BYTES = 1_000_000
MAX_NODES = 100_000
MAX_DEPTH = 32
_ENV_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{([^}]*)\}?")

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"

FieldPath = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Position:
    """A 1-based line and column in the policy file."""

    line: int
    column: int


@dataclass
class SourceMap:
    """Where each value (and each mapping key) of the policy file is."""

    file: str
    values: dict[FieldPath, Position] = field(default_factory=dict)
    keys: dict[FieldPath, Position] = field(default_factory=dict)
    unset_env: list[tuple[FieldPath, str]] = field(default_factory=list)

    def locate(self, path: FieldPath, *, key: bool = False) -> Position | None:
        """The position of ``path``, or of its nearest ancestor that is in the file."""
        probe = tuple(path)
        while True:
            if key and probe in self.keys:
                return self.keys[probe]
            if probe in self.values:
                return self.values[probe]
            if not probe:
                return None
            probe = probe[:-1]


def format_path(path: FieldPath) -> str:
    """``("limits", 1, "app")`` -> ``limits[1].app``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class _Builder:
    """Turns a composed YAML node graph into plain Python values, recording positions."""

    def __init__(self, source: SourceMap, env: Mapping[str, str]) -> None:
        self.source = source
        self.env = env
        self.errors: list[Diagnostic] = []
        self.count = 0
        self.constructor = SafeConstructor()

    def error(self, node: yaml.Node, path: FieldPath, message: str, code: str) -> None:
        self.errors.append(
            Diagnostic(
                message=message,
                code=code,
                file=self.source.file,
                line=node.start_mark.line + 1,
                column=node.start_mark.column + 1,
                path=format_path(path),
            )
        )

    def build(self, node: yaml.Node, path: FieldPath) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise _TooBig(node)
        if len(path) > MAX_DEPTH:
            self.error(node, path, f"nesting deeper than {MAX_DEPTH} levels", "P004")
            return None
        self.source.values.setdefault(
            path, Position(node.start_mark.line + 1, node.start_mark.column + 1)
        )
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    self.error(key_node, path, "a mapping key must be a plain name", "P005")
                    continue
                key = key_node.value
                if key == "<<":
                    self.error(key_node, path, "YAML merge keys (<<) are not supported", "P005")
                    continue
                if key in out:
                    self.error(
                        key_node, (*path, key), f"key {key!r} appears twice in this mapping", "P006"
                    )
                    continue
                self.source.keys[(*path, key)] = Position(
                    key_node.start_mark.line + 1, key_node.start_mark.column + 1
                )
                out[key] = self.build(value_node, (*path, key))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        return self.scalar(node, path)

    def scalar(self, node: yaml.ScalarNode, path: FieldPath) -> Any:
        """A scalar's value, with ``${VAR}`` expanded in text."""
        if node.tag == _TIMESTAMP_TAG:
            # YAML 1.1 reads 2025-01-01 as a date; the policy has no date fields, only text
            # (compatibility_date), and editors reading YAML 1.2 see text too.
            return node.value
        value = self.constructor.construct_object(node)
        if isinstance(value, str) and "$" in value:
            return self.expand(node, path, value)
        return value

    def expand(self, node: yaml.Node, path: FieldPath, text: str) -> str | None:
        """Expand ``${VAR}`` and ``${VAR:-default}``; ``$$`` is a literal ``$``."""
        unset: list[str] = []

        def substitute(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            if match.group(3) is not None or match.group(1) is None:
                self.error(
                    node,
                    path,
                    f"{match.group(0)!r} is not a variable reference; write ${{NAME}} or "
                    "${NAME:-default} (or $$ for a literal $)",
                    "P007",
                )
                return ""
            name, default = match.group(1), match.group(2)
            value = self.env.get(name)
            if value is None or (value == "" and default is not None):
                if default is not None:
                    return default
                unset.append(name)
                return ""
            return value

        result = _ENV_RE.sub(substitute, text)
        for name in unset:
            self.source.unset_env.append((path, name))
        # A value that is nothing but an unset variable is absent, not an empty string, so
        # optional fields fall back to their defaults and lint reports the variable.
        if unset and result == "":
            return None
        return result


class _TooBig(Exception):
    def __init__(self, node: yaml.Node) -> None:
        self.node = node


_UNEXPECTED_CHARACTER = re.compile(r"found character '(.*)' that cannot start any token")


def _at_line(mark: yaml.Mark | None) -> str:
    return f" at line {mark.line + 1}" if mark is not None else ""


def _token_problem(problem: str) -> str | None:
    """A character or an alias that cannot be where it is, or None."""
    character = _UNEXPECTED_CHARACTER.match(problem)
    if character and character.group(1) == "\\t":
        return "a tab indents this line; YAML indents with spaces only, so use spaces"
    if character:
        return f"{character.group(1)!r} cannot start a value; put the value in quotes"
    if problem.startswith("found undefined alias "):
        name = problem.removeprefix("found undefined alias ").strip("'")
        return (
            f"'*{name}' refers to no '&{name}' anchor above it; put the value in quotes if "
            "'*' is meant as text"
        )
    return None


def yaml_problem(exc: yaml.MarkedYAMLError) -> tuple[str, yaml.Mark | None]:
    """What a YAML syntax error means for a policy file, in words that name the fix, and
    the place to point at (the opening of what is left unclosed, else where PyYAML stopped).

    PyYAML describes its parser's state ("expected <block end>, but found '?'"); a person
    editing a policy made an indentation mistake, a tab, an unclosed quote or bracket.
    Problems not recognised here keep PyYAML's words after "the file is not valid YAML".
    """
    problem = exc.problem or ""
    context = exc.context or ""
    where, opened = exc.problem_mark or exc.context_mark, exc.context_mark
    noticed = f"noticed at line {where.line + 1}" if where else "noticed at the end"
    token = _token_problem(problem)
    mark = where
    if token is not None:
        message = token
    elif problem == "mapping values are not allowed here":
        message = (
            "unexpected ':': this line is indented deeper than the key before it (align it "
            "with its sibling keys), or a value holds ': ' (put the value in quotes)"
        )
    elif problem.startswith("expected <block end>, but found '-'"):
        message = (
            f"a list item ('- ') where a key was expected in the mapping{_at_line(opened)}; "
            "indent the list under its key, or make it a 'key: value' line"
        )
    elif problem.startswith("expected <block end>"):
        message = (
            f"this line is not indented like the others of the block{_at_line(opened)}: keys "
            "of one mapping, and the items of one list, start in the same column"
        )
    elif problem == "found unexpected end of stream" and "quoted scalar" in context:
        message, mark = "this quoted string is never closed; add the closing quote", opened
    elif problem.startswith(("expected ',' or ']'", "expected ',' or '}'")):
        kind = "[ ... ] list" if "]" in problem else "{ ... } mapping"
        message = f"this {kind} is not closed, or misses a ',' between entries ({noticed})"
        mark = opened
    elif problem.endswith("but found '<stream end>'"):
        message = (
            "the file ends inside a [ ... ] list or { ... } mapping that is never closed; add "
            "its closing ']' or '}'"
        )
    elif problem == "could not find expected ':'":
        message = (
            "this line is not 'key: value': add the ':' after the key (or close a quoted "
            "string that runs on)"
        )
        mark = opened
    else:
        message = f"the file is not valid YAML: {problem or context}"
    return message, mark or where


def parse(text: str, file: str, env: Mapping[str, str] | None = None) -> tuple[Any, SourceMap]:
    """Parse YAML text into plain values and a SourceMap; raise PolicyLoadError on errors."""
    source = SourceMap(file=file)
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        message, mark = yaml_problem(exc)
        raise PolicyLoadError(
            [
                Diagnostic(
                    message=message,
                    code="P002",
                    file=file,
                    line=mark.line + 1 if mark else None,
                    column=mark.column + 1 if mark else None,
                )
            ]
        ) from None
    except yaml.YAMLError as exc:
        raise PolicyLoadError(
            [Diagnostic(message=f"the file is not valid YAML: {exc}", code="P002", file=file)]
        ) from None
    except RecursionError:
        # PyYAML's composer recurses once per nesting level; thousands of "[" exhaust it.
        raise PolicyLoadError(
            [
                Diagnostic(
                    message=f"the file is nested far deeper than {MAX_DEPTH} levels; a policy "
                    "is a few levels deep",
                    code="P004",
                    file=file,
                )
            ]
        ) from None
    if not nodes or nodes[0] is None:
        raise PolicyLoadError(
            [
                Diagnostic(
                    message="the file is empty; start it with 'version: 1'",
                    code="P003",
                    file=file,
                    line=1,
                    column=1,
                )
            ]
        )
    if len(nodes) > 1:
        second = nodes[1]
        raise PolicyLoadError(
            [
                Diagnostic(
                    message="the file holds several YAML documents; keep one policy per file",
                    code="P003",
                    file=file,
                    line=second.start_mark.line + 1 if second else None,
                )
            ]
        )
    root = nodes[0]
    if not isinstance(root, yaml.MappingNode):
        raise PolicyLoadError(
            [
                Diagnostic(
                    message="the top level must be a mapping starting with 'version: 1'",
                    code="P003",
                    file=file,
                    line=root.start_mark.line + 1,
                    column=root.start_mark.column + 1,
                )
            ]
        )
    builder = _Builder(source, os.environ if env is None else env)
    try:
        data = builder.build(root, ())
    except _TooBig as too_big:
        raise PolicyLoadError(
            [
                Diagnostic(
                    message=f"the file has more than {MAX_NODES:,} values (YAML aliases "
                    "expanding?); a policy is much smaller",
                    code="P004",
                    file=file,
                    line=too_big.node.start_mark.line + 1,
                )
            ]
        ) from None
    if builder.errors:
        raise PolicyLoadError(builder.errors)
    return data, source


def _field_names(model: Any, loc: FieldPath) -> list[str]:
    """The field names allowed at ``loc`` (for "did you mean" on unknown keys)."""
    current: Any = Policy
    keyed = False
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        if keyed:
            # A key of a mapping of models (quotas: {TIER: ...}), not a field.
            keyed = False
            continue
        info = getattr(current, "model_fields", {}).get(part)
        if info is None:
            return []
        keyed = _is_mapping(info.annotation)
        current = _model_of(info.annotation)
    return list(getattr(current, "model_fields", {}))


def _is_mapping(annotation: Any) -> bool:
    """Whether ``annotation`` is (or may be) a dict, whose keys sit in an error's path."""
    stack = [annotation]
    while stack:
        item = stack.pop()
        if getattr(item, "__origin__", None) is dict or item is dict:
            return True
        stack.extend(getattr(item, "__args__", ()))
    return False


def _model_of(annotation: Any) -> Any:
    from pydantic import BaseModel

    stack = [annotation]
    while stack:
        item = stack.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
        stack.extend(getattr(item, "__args__", ()))
    return None


def _message(error: ErrorDetails, loc: FieldPath) -> str:
    kind = error["type"]
    given = error.get("input")
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        allowed = _field_names(Policy, loc[:-1])
        close = difflib.get_close_matches(name, allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        listing = f" (known fields: {', '.join(allowed)})" if allowed and not close else ""
        return f"unknown field {name!r}{hint}{listing}"
    if kind == "missing":
        return f"required field {loc[-1]!r} is missing" if loc else "a required field is missing"
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    if kind in ("enum", "literal_error") and given is not None:
        return f"{given!r} is not allowed: {message[0].lower()}{message[1:]}"
    if given is not None and not isinstance(given, (dict, list)):
        return f"{given!r}: {message[0].lower()}{message[1:]}"
    return message


def _clean_loc(loc: tuple[str | int, ...]) -> FieldPath:
    """Drop pydantic's internal location parts (validator names) from an error location."""
    return tuple(p for p in loc if isinstance(p, int) or not p.startswith(("function-", "[")))


def validate(data: Any, source: SourceMap) -> Policy:
    """Validate parsed data into a Policy, mapping every error back to the file."""
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        diagnostics = []
        for error in exc.errors(include_url=False):
            loc = _clean_loc(error["loc"])
            key = error["type"] == "extra_forbidden"
            pos = source.locate(loc, key=key)
            diagnostics.append(
                Diagnostic(
                    message=_message(error, loc),
                    code="P100" if not key else "P101",
                    severity=Severity.ERROR,
                    file=source.file,
                    line=pos.line if pos else None,
                    column=pos.column if pos else None,
                    path=format_path(loc),
                )
            )
        diagnostics.sort(key=lambda d: (d.line or 0, d.column or 0))
        raise PolicyLoadError(diagnostics) from None
    policy._source = source
    return policy


def loads(text: str, file: str = "<policy>", env: Mapping[str, str] | None = None) -> Policy:
    """Load a policy from YAML text. ``env`` replaces os.environ for ``${VAR}`` (tests)."""
    data, source = parse(text, file, env)
    return validate(data, source)


def load(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Policy:
    """Load and validate a policy file; PolicyLoadError lists every problem with its line."""
    name = str(path)
    if "\x00" in name:
        raise PolicyLoadError(
            [Diagnostic(message="the path contains a NUL byte", code="P001", file=repr(name))]
        )
    file = Path(path)
    try:
        # Read at most one byte past the limit: stat() says 0 for pipes and /dev/zero.
        with file.open("rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise PolicyLoadError(
                [
                    Diagnostic(
                        message=f"the file is larger than {MAX_FILE_BYTES:,} bytes, the most a "
                        "policy may be",
                        code="P001",
                        file=name,
                    )
                ]
            )
    except PolicyLoadError:
        raise
    except IsADirectoryError:
        raise PolicyLoadError(
            [Diagnostic(message="is a directory; give the policy file", code="P001", file=name)]
        ) from None
    except FileNotFoundError:
        raise PolicyLoadError(
            [Diagnostic(message="no such file; check the path", code="P001", file=name)]
        ) from None
    except OSError as exc:
        raise PolicyLoadError(
            [Diagnostic(message=f"cannot read the file: {exc.strerror}", code="P001", file=name)]
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PolicyLoadError(
            [
                Diagnostic(
                    message="the file is not UTF-8 text; save it as UTF-8",
                    code="P002",
                    file=name,
                    line=line,
                )
            ]
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise PolicyLoadError(
            [Diagnostic(message="the file contains a NUL byte", code="P002", file=name, line=line)]
        )
    return loads(text, name, env)
