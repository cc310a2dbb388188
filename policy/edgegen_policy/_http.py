"""What the edge and the app both write into a refusal: the problem type and the header key.

A client talks to the Worker and to the app behind it without knowing which one answered, so
both must name a limit the same way in ``RateLimit-Policy``/``RateLimit`` and must refuse with
the same RFC 9457 problem type. ``edgegen`` (the Worker, the rules' custom response) and
``applimit`` never import each other, so the one definition lives here.
"""

from __future__ import annotations

# draft-ietf-httpapi-ratelimit-headers registers this type in the IANA HTTP Problem Types
# registry for "the client exceeded a quota"; about:blank would tell a client nothing more
# than the status code does.
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"


def header_key(name: str) -> str:
    """A limit's name as the RFC 8941 sf-string that keys its ``RateLimit-Policy`` item.

    An sf-string holds printable ASCII only, while a limit name may be any printable Unicode.
    The name's UTF-8 bytes outside printable ASCII are percent-encoded (``café`` ->
    ``"caf%C3%A9"``), and so is ``%`` itself (``%25``): without that, a limit literally named
    ``caf%C3%A9`` would share the key of one named ``café``, and a client could not tell the
    two apart. Percent-decoding the string's content gives back the exact name. ``"`` and
    ``\\`` are escaped as RFC 8941 asks. Lone surrogates, which no YAML file yields, are
    passed through as their UTF-8-like bytes rather than raising.
    """
    out = ['"']
    for char in name:
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif 0x20 <= code <= 0x7E and char != "%":
            out.append(char)
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    out.append('"')
    return "".join(out)
