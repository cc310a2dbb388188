"""Mismatches as a compact table: the first rows in full, then how many there are per kind."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

ROWS = 25


@dataclass(frozen=True)
class Mismatch:
    """One request a layer got wrong.

    ``served``: which handler ran it; ``saw``: what the layer under test saw of it (the route
    path, the origin's URL, the rule's path...); ``expected``: what it should have counted;
    ``got``: what it counted.
    """

    kind: str
    request: str
    host: str
    ip: str
    served: str
    saw: str
    expected: str
    got: str

    @staticmethod
    def names(values: Sequence[str] | frozenset[str] | set[str]) -> str:
        """A set of limit names as a cell."""
        return ",".join(sorted(values)) or "-"


COLUMNS = ("request", "host", "ip", "served", "saw", "expected", "got")
WIDTHS = {"request": 48, "host": 24, "ip": 39, "served": 30, "saw": 36, "expected": 18, "got": 18}


def _cut(text: str, width: int) -> str:
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= width else text[: width - 1] + "~"


def table(title: str, mismatches: Sequence[Mismatch], total: int) -> str:
    """The failure message: a title, the first rows and a count per kind of spelling."""
    rows = [[_cut(str(getattr(m, c)), WIDTHS[c]) for c in COLUMNS] for m in mismatches[:ROWS]]
    sizes = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(COLUMNS)]
    lines = [
        f"{title}: {len(mismatches)} of {total} requests",
        "  ".join(c.ljust(sizes[i]) for i, c in enumerate(COLUMNS)),
        "  ".join("-" * s for s in sizes),
    ]
    lines += ["  ".join(cell.ljust(sizes[i]) for i, cell in enumerate(r)) for r in rows]
    if len(mismatches) > ROWS:
        lines.append(f"... and {len(mismatches) - ROWS} more")
    kinds = Counter(m.kind.split(":", 1)[0] for m in mismatches)
    lines.append("by kind of spelling: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    return "\n".join(lines)
