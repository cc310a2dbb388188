"""A coverage-guided fuzz target (atheris) for what edgegen reads besides the policy.

Each input is split into a selector byte and data, and goes to one reader: a state file,
a plan file (and the check whether a file is a plan), an answer from the Cloudflare API
(status, headers and body, through the real client), or a Retry-After header. A reader
may return a value or raise the error it documents (ZoneError, CloudflareAPIError);
anything else is a crash that atheris reports with the input.

The hypothesis tests in tests/test_fuzz_files.py run in the suite; this target is for
longer runs, with atheris installed (``pip install atheris``)::

    .venv/bin/python tests/fuzz/fuzz_zone_inputs.py -runs=200000 -max_len=4096
"""

from __future__ import annotations

import contextlib
import sys

import atheris
import httpx

with atheris.instrument_imports():
    from edgegen import _json
    from edgegen.cloudflare import _client, _retry, _token
    from edgegen.errors import CloudflareAPIError, ZoneError
    from edgegen.zone import _file_formats

_HEADERS = (b"Retry-After", b"Content-Type", b"CF-Entrypoint", b"Content-Encoding")
_CALLS = (
    lambda c: c.get_entrypoint("z"),
    lambda c: c.get_script_settings("a", "w"),
    lambda c: c.get_script_content("a", "w"),
    lambda c: c.list_routes("z"),
    lambda c: c.send(c.create_route_write("z", "a.example.com/*", "w")),
)


def _state_file(data: bytes) -> None:
    with contextlib.suppress(ZoneError):
        _file_formats.state_from_json(
            _file_formats.parse_json(data.decode("utf-8", "replace"), "s", "state"), "s"
        )


def _plan_file(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    _file_formats.is_plan_file(text)
    with contextlib.suppress(ZoneError):
        _file_formats.plan_from_json(_file_formats.parse_json(text, "p", "plan"), "p")


def _answer(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    status = provider.ConsumeIntInRange(100, 999)
    headers = [
        (name, provider.ConsumeBytes(provider.ConsumeIntInRange(0, 40)))
        for name in _HEADERS
        if provider.ConsumeBool()
    ]
    call = _CALLS[provider.ConsumeIntInRange(0, len(_CALLS) - 1)]
    body = provider.ConsumeBytes(provider.remaining_bytes())

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, content=body, request=request)

    client = _client.Client(
        _token.Token("fuzz-token"),
        transport=httpx.MockTransport(answer),
        sleep=lambda seconds: None,
        retry=_retry.RetryPolicy(attempts=2),
    )
    with client:
        with contextlib.suppress(CloudflareAPIError):
            call(client)


def _retry_after(data: bytes) -> None:
    seconds = _retry.parse_retry_after(data.decode("latin-1"))
    assert seconds is None or 0 <= seconds <= _retry.MAX_RETRY_AFTER


def _json_text(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        _json.loads(data)


_READERS = (_state_file, _plan_file, _answer, _retry_after, _json_text)


def test_one_input(data: bytes) -> None:
    """Feed one input to the reader its first byte selects."""
    if not data:
        return
    _READERS[data[0] % len(_READERS)](data[1:])


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
