"""Writing Artifacts to a directory: only the files ``Artifacts.files()`` names.

Each file is written to a temporary file beside it and renamed into place, so a reader (or
an interrupted build) never sees half a file. Bytes are written exactly (UTF-8, ``\\n``),
so the same Artifacts give byte-identical files on every platform. Files that an earlier
build wrote but this one does not produce (the Worker, once no limit needs it) are
removed; nothing else in the directory is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._files import write_atomic
from ._artifacts import Artifacts

# Every path a build can write; only these are ever removed as stale.
GENERATED_PATHS = (
    "cloudflare/http_ratelimit.json",
    "worker/wrangler.toml",
    "worker/worker.js",
    "terraform/ratelimit.tf",
)


def _write_file(path: Path, content: str) -> None:
    data = content.encode("utf-8")
    if path.is_file() and path.read_bytes() == data:
        # Unchanged: leave the file (and its mtime) alone, so tools watching it stay quiet.
        return
    write_atomic(path, data)


def write(artifacts: Artifacts, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the artifacts under ``out_dir``; returns the paths of the files it holds now.

    Creates directories as needed, replaces each file atomically, and removes stale files
    from earlier builds (only paths edgegen itself generates).
    """
    root = Path(out_dir)
    files = artifacts.files()
    written: list[Path] = []
    for relative, content in files.items():
        target = root / relative
        _write_file(target, content)
        written.append(target)
    for relative in GENERATED_PATHS:
        if relative not in files:
            (root / relative).unlink(missing_ok=True)
    return written
