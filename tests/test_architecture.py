"""docs/architecture.md names every module of the three packages, and only modules that exist.

The page's package map has one section per package (a ``###`` heading naming the package's
directory in backticks) with a table whose ``module`` column names each module in
backticks: ``_flow.py`` for a module, ``lua/`` for a subpackage or data directory. A module
added without a row, or a row left behind by a module that was removed or renamed, fails
here with the names to fix. Paths named anywhere else on the page must exist too.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"

# Each package's directory, as its section heading names it.
PACKAGES = {
    "policy/edgegen_policy/": ROOT / "policy" / "edgegen_policy",
    "edgegen/": ROOT / "edgegen",
    "applimit/": ROOT / "applimit",
}
# The directories beside the packages that the map names as directories.
DIRECTORIES = ("workers/templates/", "bench/")
# Where a module named without its directory may live.
HOMES = (*PACKAGES.values(), ROOT / "bench", ROOT / "workers" / "templates", ROOT)
# A span that names a path in the repository: it starts with one of its top directories.
TOP = ("policy/", "edgegen/", "applimit/", "workers/", "bench/", "tests/", "docs/", "examples/")

_SPAN = re.compile(r"`([^`]+)`")


def _page() -> str:
    """The page without its fenced blocks (diagrams), whose backticks pair with nothing."""
    kept = []
    fenced = False
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _spans(text: str) -> list[str]:
    """The backticked spans of ``text``, line by line (a span never crosses a line here)."""
    return [span for line in text.splitlines() for span in _SPAN.findall(line)]


def _section(text: str, title: str) -> str:
    """The text under the ``## title`` heading, up to the next ``## `` heading."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def _tables(section: str) -> dict[str, list[str]]:
    """Per ``###`` heading of ``section``: the spans of its tables' ``module`` column."""
    found: dict[str, list[str]] = {}
    heading = ""
    column: int | None = None
    for line in section.splitlines():
        if line.startswith("### "):
            heading = line
            found[heading] = []
            column = None
        elif line.startswith("|") and heading:
            cells = _cells(line)
            if column is None:
                column = cells.index("module") if "module" in cells else -1
            elif column >= 0 and not set(line) <= set("|-: "):
                found[heading] += _SPAN.findall(cells[column])
        else:
            column = None
    return found


def _named() -> dict[str, set[str]]:
    """Per package: the modules the package map names in its section."""
    tables = _tables(_section(_page(), "The package map"))
    named: dict[str, set[str]] = {}
    for package in PACKAGES:
        sections = [spans for heading, spans in tables.items() if f"`{package}`" in heading]
        assert len(sections) == 1, (
            f"docs/architecture.md's package map needs one '### `{package}`' section with a "
            f"table whose 'module' column names each module; found {len(sections)}"
        )
        named[package] = set(sections[0])
    return named


def _modules(directory: Path) -> set[str]:
    """A package's modules: its ``*.py`` files (``__init__.py`` aside) and subdirectories
    (``name/``), caches left out."""
    files = {p.name for p in directory.glob("*.py") if p.name != "__init__.py"}
    folders = {
        f"{p.name}/"
        for p in directory.iterdir()
        if p.is_dir() and p.name != "__pycache__" and not p.name.startswith(".")
    }
    return files | folders


def test_every_module_has_a_row_in_the_package_map() -> None:
    """A module of policy/edgegen_policy, edgegen or applimit (or a subpackage) that the
    package map does not name fails, with the names to add."""
    named = _named()
    missing = {
        package: sorted(_modules(directory) - named[package])
        for package, directory in PACKAGES.items()
    }
    missing = {package: names for package, names in missing.items() if names}
    assert not missing, (
        "docs/architecture.md's package map has no row for "
        + "; ".join(f"{package}: {', '.join(names)}" for package, names in missing.items())
        + ". Add a row to the package's table saying in one line what each holds."
    )


def test_the_package_map_names_only_modules_that_exist() -> None:
    """A row for a module that was removed or renamed fails, with the names to drop."""
    named = _named()
    stale = {
        package: sorted(named[package] - _modules(directory))
        for package, directory in PACKAGES.items()
    }
    stale = {package: names for package, names in stale.items() if names}
    assert not stale, (
        "docs/architecture.md's package map names modules that do not exist: "
        + "; ".join(f"{package}: {', '.join(names)}" for package, names in stale.items())
        + ". Remove or rename their rows."
    )


def test_the_package_map_names_the_directories_beside_the_packages() -> None:
    """The Worker's templates and the benchmarks have rows of their own."""
    section = _section(_page(), "The package map")
    rows = [line for line in section.splitlines() if line.startswith("|")]
    for directory in DIRECTORIES:
        assert (ROOT / directory).is_dir(), directory
        assert any(f"`{directory}`" in _cells(row)[0] for row in rows), (
            f"docs/architecture.md's package map has no row for `{directory}`"
        )


def test_every_path_the_page_names_exists() -> None:
    """Outside the tables too: a path (``applimit/_sync.py``, ``tests/harness/``) or a
    module named alone (``_flow.py``) that no longer exists fails. Spans with a
    placeholder (``<name>``, ``{a,b}``, ``*``) are patterns, not paths."""
    gone = sorted({span for span in _spans(_page()) if _names_a_missing_path(span)})
    assert not gone, f"docs/architecture.md names paths that do not exist: {gone}"


def _names_a_missing_path(span: str) -> bool:
    """True when ``span`` is a repository path, or a module named alone, that is not there."""
    if any(mark in span for mark in "<>{}* "):
        return False
    if span.startswith(TOP):
        return not (ROOT / span).exists()
    if span.endswith(".py") and "/" not in span:
        return not any((home / span).is_file() for home in HOMES)
    return False
