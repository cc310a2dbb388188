"""The redis-py range applimit supports, and the RESP packing it does without hiredis."""

from __future__ import annotations

import hiredis
import pytest
import redis

from applimit import _compat
from applimit._calls import _pack_in_python


@pytest.mark.parametrize("version", ["8.0.0", "8.2.0", "8.10.3", "8.1.0b1"])
def test_supported_releases_pass(version: str) -> None:
    """Every 8.x release passes the import-time check."""
    _compat.check_redis(version)


@pytest.mark.parametrize("version", ["5.0.0", "7.4.1", "9.0.0", "10.1"])
def test_other_releases_fail_at_import_saying_what_to_install(version: str) -> None:
    """Outside the tested range the check raises ImportError naming the installed release
    and the requirement to install (on 5.0-7.4 the limiter admitted nothing)."""
    with pytest.raises(ImportError, match=rf"redis-py {version} is installed.*'redis>=8.0,<9'"):
        _compat.check_redis(version)


def test_the_installed_release_is_supported() -> None:
    """The environment the suite runs in is inside the range (make compat runs the oldest)."""
    assert _compat.OLDEST <= _compat._release(redis.__version__) < _compat.BEYOND


def test_commands_packed_in_python_equal_hiredis() -> None:
    """Without hiredis, commands are packed byte for byte as hiredis packs them: every byte
    value, empty and long arguments, non-ASCII text, negative and large integers."""
    cases: list[tuple[str | bytes | int, ...]] = [
        ("FCALL", "applimit_hit", 2, "k1", "k2", "a", 1, -5, 10**18),
        (b"",),
        (bytes(range(256)), "\u00e9\u20ac\U0001f600", "x" * 100_000),
        *((bytes([b]), str(b), b) for b in range(256)),
    ]
    for args in cases:
        assert _pack_in_python(args) == bytes(hiredis.pack_command(args)), args  # type: ignore[arg-type]
