"""Tiers files: a YAML or JSON mapping user -> tier, or CSV rows ``user,tier``, read
for a replay whose log names users but not their tiers. Errors name the file and line."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import yaml

from ._options import TrafficError


def load_tiers(path: str | Path) -> dict[str, str]:
    """A tiers file: a YAML or JSON mapping user -> tier, or CSV rows ``user,tier`` (with
    or without a ``user,tier`` header). Errors name the file and line."""
    label = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise TrafficError(
            f"cannot read tiers file {label}: {reason}; check the path", file=label
        ) from exc
    suffix = Path(path).suffix.lower()
    if suffix == ".csv" or (suffix not in (".yaml", ".yml", ".json") and _looks_csv(text)):
        return _tiers_csv(label, text)
    return _tiers_yaml(label, text)


def _looks_csv(text: str) -> bool:
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return "," in line and ":" not in line and not line.lstrip().startswith("{")
    return False


def _tiers_csv(label: str, text: str) -> dict[str, str]:
    tiers: dict[str, str] = {}
    rows = csv.reader(io.StringIO(text))
    for row in rows:
        lineno = rows.line_num
        cells = [cell.strip() for cell in row]
        if not any(cells) or cells[0].startswith("#"):
            continue
        if not tiers and [c.lower() for c in cells] == ["user", "tier"]:
            continue
        if len(cells) != 2 or not cells[0] or not cells[1]:
            raise TrafficError(
                f"{label}:{lineno}: a tiers CSV row is 'user,tier', with both set; this row "
                f"has {len(cells)} values",
                file=label,
                line=lineno,
            )
        _add_tier(tiers, cells[0], cells[1], label, lineno)
    return tiers


def _tiers_yaml(label: str, text: str) -> dict[str, str]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        where = f"{label}:{line}" if line else label
        problem = getattr(exc, "problem", None) or "not valid YAML or JSON"
        raise TrafficError(
            f"{where}: the tiers file is not valid YAML or JSON ({problem}); write a mapping "
            "of user to tier, e.g. 'alice: pro'",
            file=label,
            line=line,
        ) from exc
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise TrafficError(
            f"{label}:{root.start_mark.line + 1}: the tiers file must be a mapping of user to "
            "tier (e.g. 'alice: pro'), or CSV rows 'user,tier'",
            file=label,
            line=root.start_mark.line + 1,
        )
    tiers: dict[str, str] = {}
    for key, value in root.value:
        lineno = key.start_mark.line + 1
        if not isinstance(key, yaml.ScalarNode) or not isinstance(value, yaml.ScalarNode):
            raise TrafficError(
                f"{label}:{lineno}: each entry maps one user to one tier name; this one is a "
                "list or mapping",
                file=label,
                line=lineno,
            )
        if not key.value or not value.value:
            raise TrafficError(
                f"{label}:{lineno}: an entry has an empty user or tier; write 'user: tier'",
                file=label,
                line=lineno,
            )
        _add_tier(tiers, str(key.value), str(value.value), label, lineno)
    return tiers


def _add_tier(tiers: dict[str, str], user: str, tier: str, label: str, lineno: int) -> None:
    if user in tiers and tiers[user] != tier:
        raise TrafficError(
            f"{label}:{lineno}: user {user!r} is listed again, with tier {tier!r} after "
            f"{tiers[user]!r}; keep one entry per user",
            file=label,
            line=lineno,
        )
    tiers[user] = tier
