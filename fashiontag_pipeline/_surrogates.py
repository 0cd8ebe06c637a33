"""Answers whose JSON escapes half of a UTF-16 surrogate pair (``"\\ud83d"``, no second half).

Java, .NET and JavaScript services hold strings as UTF-16 and cut them by code units: an id or
a name cut to a length across an emoji keeps its first half, which their JSON writers (and
Python's ``json`` with ``ensure_ascii``) escape as ``\\ud83d``. That is JSON by its grammar,
but no Unicode text, and msgspec refuses the whole answer for it: one such id made its results
page unreadable, the page was taken as empty, and its 100 rows were sent (and billed) again.

:func:`mend` gives the answer with each such escape replaced by ``\\ufffd`` (the replacement
character, as a lenient reader decodes it), pairs and every other byte as they were; it runs
only after a decode failed, so an answer without one costs nothing.
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec

__all__ = ["decode_mended", "mend"]

T = TypeVar("T")

#: An escaped backslash (so that ``\\\\ud800``, the text ``\\ud800``, is never read as an
#: escape), a surrogate pair, or a lone surrogate, leftmost first.
_ESCAPE = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})"
)
_LONE = re.compile(rb"\\u[dD][89a-fA-F]")
_REPLACEMENT = rb"\ufffd"


def mend(body: bytes, replacement: bytes = _REPLACEMENT) -> bytes | None:
    """``body`` with every lone surrogate escape replaced by ``\\ufffd`` (or the escape
    ``replacement``); None when it holds none (the body's fault is another)."""
    if _LONE.search(body) is None:
        return None

    def replace(found: re.Match[bytes]) -> bytes:
        return found.group() if found.group(1) is None else replacement

    mended = _ESCAPE.sub(replace, body)
    return None if mended == body else mended


def decode_mended(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """``body`` decoded; when it is refused for a lone surrogate escape (an answer's
    description or message cut across an emoji), the body :func:`mend` gives, decoded."""
    try:
        return decoder.decode(body)
    except msgspec.DecodeError:
        mended = mend(body)
        if mended is None:
            raise
        return decoder.decode(mended)
