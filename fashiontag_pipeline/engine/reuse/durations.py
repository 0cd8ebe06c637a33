"""Durations written the way operators write them: ``30d``, ``12h``, ``90m``, ``45s``, ``2w``.

A bare number is seconds. Used by ``--reuse-max-age`` and ``reuse prune --older-than``.
"""

from __future__ import annotations

import re

__all__ = ["DAY", "format_duration", "parse_duration"]

DAY = 86_400.0
_UNITS = {"s": 1.0, "m": 60.0, "h": 3_600.0, "d": DAY, "w": 7 * DAY}
# The units spelt out in both cases: IGNORECASE matched the long s (U+017F) as "s" too.
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhdwSMHDW]?)\s*")


def parse_duration(value: str | float) -> float:
    """Seconds of ``value`` (``30d``, ``12h``, ``1.5h``, ``3600``); ValueError names it."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        found = _DURATION.fullmatch(str(value))
        if found is None:
            raise ValueError(
                f"invalid duration {value!r}: a number with a unit s, m, h, d or w (e.g. 30d)"
            )
        seconds = float(found.group(1)) * _UNITS[(found.group(2) or "s").lower()]
    if not seconds >= 0:  # (nan too: no stored result would ever be young enough)
        raise ValueError(f"invalid duration {value!r}: must be a number >= 0")
    return seconds


def format_duration(seconds: float) -> str:
    """A short human form (``30d``, ``2h``, ``45s``): the largest unit that divides it."""
    for unit in ("w", "d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
