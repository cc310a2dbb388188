"""Text that came from outside, made safe to show: in a terminal (escape sequences and
bidirectional overrides written out) and in Markdown (nothing in it read as markup). Pure.

Every report edgegen prints goes through these: the zone plan, the diff, the replay and
suggest reports, the analytics report and the CLI's messages.
"""

from __future__ import annotations

import re

# Markdown's line endings (CommonMark has only these three).
_LINE_END = re.compile(r"\r\n|\r|\n")
# ASCII punctuation: CommonMark lets a backslash make any of it literal.
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
# Characters a terminal acts on rather than shows: C0 and C1 controls (ESC starts escape
# sequences) and the bidirectional overrides that make text read differently than it is.
_UNSHOWN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def code(text: str) -> str:
    """A Markdown code span that holds any text (longer fences around backticks).

    Line breaks become spaces: a blank line would end the span, and what follows it would
    be read as Markdown.
    """
    text = _LINE_END.sub(" ", text)
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_text(text: str) -> str:
    """Plain text for Markdown: every ASCII punctuation character escaped, so nothing in it
    is markup or HTML (``</details>``, ``<script>``, ``*``, ``|``, backticks, links), and
    line breaks as spaces."""
    return _PUNCTUATION.sub(r"\\\1", _LINE_END.sub(" ", text))


def terminal_text(text: str) -> str:
    """Text for a terminal: characters it would act on (escape sequences, bidirectional
    overrides) written as ``\\xNN`` or ``\\uNNNN``; line breaks and tabs kept."""
    return _UNSHOWN.sub(
        lambda m: (
            f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}"
        ),
        text,
    )
