"""The Cloudflare API token: a value that never shows itself.

``Token`` holds the token from ``CLOUDFLARE_API_TOKEN`` or ``--token-file``; its ``repr``,
``str`` and format give ``***``, it refuses to be pickled or copied, and only the
transport's ``Authorization`` header reads it (``reveal``). A malformed token is refused
without being repeated, and errors about a token file never hold the file's content.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UsageError

TOKEN_ENV = "CLOUDFLARE_API_TOKEN"
# A token file is read up to this size (Cloudflare's tokens are 40 characters).
MAX_TOKEN_FILE_BYTES = 4096


class Token:
    """An API token that never shows itself: ``repr``, ``str`` and format give ``***``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        value = value.strip()
        if not value:
            raise UsageError(
                "the Cloudflare API token is empty; put the token in CLOUDFLARE_API_TOKEN or "
                "in the file given to --token-file"
            )
        if any(c.isspace() or ord(c) < 0x21 or ord(c) > 0x7E for c in value):
            # Never echo the value: say only what is wrong with it.
            raise UsageError(
                "the Cloudflare API token contains spaces, line breaks or non-ASCII "
                "characters; copy the token again, with nothing around it"
            )
        self._value = value

    def reveal(self) -> str:
        """The token itself; only the Authorization header may use it."""
        return self._value

    def __repr__(self) -> str:
        return "Token('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce__(self) -> Any:
        raise TypeError("an API token cannot be pickled or copied out of the process")

    @classmethod
    def _from_file(cls, token_file: str) -> Token:
        """The token in a file. Errors name the file and never hold its content: each is
        raised outside the ``except`` that caught the cause, so no ``__context__`` keeps
        the bytes read."""
        reason = None
        try:
            # Read no more than a token could be: /dev/zero must not fill the memory.
            with Path(token_file).open("rb") as handle:
                data = handle.read(MAX_TOKEN_FILE_BYTES + 1)
        except FileNotFoundError:
            reason = "missing"
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
        except ValueError:
            reason = "the path holds a NUL byte"
        if reason == "missing":
            raise UsageError(
                f"the token file {token_file} does not exist; give the path of a file "
                "holding only the API token"
            )
        text = None
        if reason is None:
            if len(data) > MAX_TOKEN_FILE_BYTES:
                raise UsageError(
                    f"the token file {token_file} is longer than {MAX_TOKEN_FILE_BYTES:,} "
                    "bytes, which no API token is; give a file holding only the token"
                )
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                reason = "it is not UTF-8 text"
        if text is None:
            raise UsageError(
                f"cannot read the token file {token_file} ({reason}); give a readable "
                "file holding only the API token"
            )
        problem = None
        try:
            return cls(text)
        except UsageError as exc:
            problem = str(exc)
        raise UsageError(f"the token file {token_file} holds no usable token: {problem}")

    @classmethod
    def from_env(cls, env: Mapping[str, str], token_file: str | None = None) -> Token:
        """The token from ``--token-file`` if given, else from ``CLOUDFLARE_API_TOKEN``.

        Raises UsageError (naming the variable or file, never the token) when there is none.
        """
        if token_file is not None:
            return cls._from_file(token_file)
        value = env.get(TOKEN_ENV, "")
        if not value.strip():
            raise UsageError(
                f"no Cloudflare API token: set {TOKEN_ENV} or pass --token-file FILE "
                "(to plan without access to the zone, pull its state and use plan --state)"
            )
        return cls(value)
