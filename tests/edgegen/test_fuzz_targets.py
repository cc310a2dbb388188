"""The atheris fuzz targets in tests/fuzz/ stay runnable: the suite runs each reader of a
target on a few seed inputs, with a small stand-in for atheris (which is not a dependency),
so a renamed function or module breaks the suite, not a later fuzzing run."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"


class _Provider:
    # Method names are atheris's own (camel case), so the targets call them unchanged.
    """The part of atheris.FuzzedDataProvider the targets use, reading bytes in order."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def _take(self, count: int) -> bytes:
        taken, self._data = self._data[:count], self._data[count:]
        return taken

    def ConsumeIntInRange(self, low: int, high: int) -> int:
        raw = int.from_bytes(self._take(2) or b"\0", "big")
        return low + raw % (high - low + 1)

    def ConsumeBool(self) -> bool:
        return bool((self._take(1) or b"\0")[0] & 1)

    def ConsumeBytes(self, count: int) -> bytes:
        return self._take(count)

    def remaining_bytes(self) -> int:
        return len(self._data)


@pytest.fixture
def stand_in_atheris(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An ``atheris`` module with instrument_imports and FuzzedDataProvider."""
    module = types.ModuleType("atheris")
    module.instrument_imports = contextlib.nullcontext  # type: ignore[attr-defined]
    module.FuzzedDataProvider = _Provider  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "atheris", module)
    yield


SEEDS = [
    b"",
    b"{}",
    b'{"format_version": 1}',
    b'{"format_version": 2, "kind": "edgegen-plan"}',
    b"[1, 2, {",
    b"\xff\xfe garbage",
    b"120",
    b"Wed, 21 Oct 2015 07:28:00 GMT",
    b'\x01\xf4\x00\x01{"success": false, "errors": [{"code": 10000, "message": "x"}]}',
    b'\x00\xc8\x00\x00{"success": true, "result": null}',
    # Traffic: a line of each format, and values that once overflowed or could not print.
    b'203.0.113.9 - u [01/Dec/2026:10:00:00 +0000] "GET /a?b HTTP/1.1" 200 1 "-" "c" host=x',
    b'{"EdgeStartTimestamp": 1796284800000000000, "ClientIP": "1.2.3.4", "ClientRequestURI": "/"}',
    b'{"v": 1, "ts": 1796284800.5, "limit": "api", "identity": "u", "cost": 2}',
    b'{"timestamp": Infinity, "method": "GET", "path": "/", "ip": "1.2.3.4", "user": "\\ud800"}',
    b"timestamp,method,path,ip\n0001-01-01T00:00:00+01:00,GET,/,1.2.3.4\n1e400,GET,/,1.2.3.4",
    b"\n" * 5000,
]


@pytest.mark.usefixtures("stand_in_atheris")
@pytest.mark.parametrize("target", sorted(p.name for p in FUZZ.glob("fuzz_*.py")))
def test_fuzz_target_runs_on_seed_inputs(target: str) -> None:
    """Every reader the target selects takes every seed without an undocumented error."""
    spec = importlib.util.spec_from_file_location(f"fuzz_{target}", FUZZ / target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readers = len(module._READERS)
    for selector in range(readers):
        for seed in SEEDS:
            module.test_one_input(bytes([selector]) + seed)
