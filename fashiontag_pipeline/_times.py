"""Times as the service writes them: parsed to aware UTC datetimes, formatted as the reference
service writes them (RFC 3339 with milliseconds, ``2026-11-22T03:46:13.123Z``)."""

from __future__ import annotations

import contextlib
import email.utils
import math
import time
from datetime import UTC, datetime
from typing import Any

__all__ = ["WireTime", "format_time", "http_date", "parse_time", "retry_after", "time_or_none"]

#: A time as a service writes it: text (:func:`parse_time`'s forms), or a JSON number of epoch
#: seconds or milliseconds (a Java service's default); a number is not refused as not text.
WireTime = str | int | float | None


#: The time Go writes for a ``time.Time`` left unset (.NET's ``DateTime.MinValue`` too).
_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)

_TIME_FORMATS = (
    "%Y-%m-%dT%H:%M:%S.%f%z",
    "%Y-%m-%dT%H:%M:%S%z",
    "%Y-%m-%d %H:%M:%S.%f",
    "%Y-%m-%d %H:%M:%S",
)


def parse_time(value: str | float | None) -> datetime | None:
    """Parse a service time to an aware UTC datetime: RFC 3339 (with or without fraction or
    zone), an HTTP date (``Thu, 26 Nov 2026 05:00:00 GMT``) or epoch seconds (milliseconds
    when the number is too large to be seconds), in a string or a JSON number.

    A time without a zone is taken as UTC. ``None``, the empty string, the number 0 and the
    zero time of Go and .NET (``0001-01-01T00:00:00Z``, or its epoch seconds -62135596800: a
    field left unset) give ``None``; any other unparseable text raises :class:`ValueError`
    naming it.
    """
    if not value:
        return None
    # (A number, too, is checked for the zero time below: Go's ``time.Time{}.Unix()``,
    # -62135596800, was read as year 1, whatever the text of the same number gave.)
    parsed = _text_time(value) if isinstance(value, str) else _epoch(value, str(value))
    try:
        parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError:  # (9999-12-31T23:59:59-05:00: past the calendar's end in UTC)
        raise ValueError(f"unrecognised time {value!r}: out of range in UTC") from None
    # (Read as a time, a result expiry in year 1 took a 403 to a page for the results' expiry:
    # every row an ``expired`` reject, exit 0, although the key had been refused.)
    return None if parsed == _ZERO_TIME else parsed


def _text_time(value: str) -> datetime:
    """A time in text (see :func:`parse_time`), in its zone or none."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        for fmt in _TIME_FORMATS:
            try:
                return datetime.strptime(text, fmt)
            except ValueError:
                continue
    return _other_time(text, value)


def _other_time(text: str, value: str) -> datetime:
    """An HTTP date or epoch seconds/milliseconds (see :func:`parse_time`)."""
    try:
        number = float(text)
    except ValueError:
        try:
            return email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            raise ValueError(f"unrecognised time {value!r}") from None
    return _epoch(number, value)


def _epoch(number: float, value: str) -> datetime:
    """Epoch seconds, or milliseconds when too large to be seconds (``value``: as written)."""
    if not math.isfinite(number):
        raise ValueError(f"unrecognised time {value!r}")
    try:
        return datetime.fromtimestamp(number / 1000 if number > 1e11 else number, UTC)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"unrecognised time {value!r}") from None


def time_or_none(value: str | float | None) -> datetime | None:
    """:func:`parse_time`, None for a time no form above reads (an expiry the client cannot
    read is an unknown one: the engine then assumes the spec's, never stops over it)."""
    try:
        return parse_time(value)
    except ValueError:
        return None


def format_time(moment: datetime) -> str:
    """Format an aware datetime the way the reference service does: ``2026-11-22T03:46:13.123Z``."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def http_date(text: str) -> float:
    """Epoch seconds of an HTTP date (a ``Date`` or ``Retry-After`` header); one with the zone
    ``-0000`` (RFC 2822's "zone unknown", Python's ``email.utils.formatdate()``) is GMT, as an
    HTTP date is, not the host's local time (a host away from GMT read it hours off). Raises
    what ``email.utils.parsedate_to_datetime`` raises."""
    when = email.utils.parsedate_to_datetime(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def answer_age(headers: Any) -> float:
    """Seconds old an answer was when it came (``Age``, RFC 9111: a cache's copy, made that
    long ago, not the service's answer to this request); 0 without one or for one unreadable
    (delta-seconds are digits only: ``1e9``, ``1_000``, ``+60``, ``12.5`` are no age)."""
    value = headers.get("Age") if headers is not None else None
    text = value.split(",")[0].strip() if value else ""
    if not (text.isascii() and text.isdigit()):
        return 0.0
    return min(float(text), 2147483648.0)  # (RFC 9111: a larger one is taken as 2^31)


def retry_after(headers: Any, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date (RFC 9110).

    A date is turned into seconds against the response's own ``Date`` header when it has one
    (so a client whose clock differs from the server's still waits the intended time), else
    against the local clock; a date in the past means no wait. A number of seconds that is
    negative or not finite is no delay (RFC 9110: a non-negative integer): ignored, as any
    other text that is not one. A header a proxy merged from several (``5, 5``: field lines
    joined with commas) is read as its longest wait, not as none (the run asked again after
    its short backoffs, into the rate limit)."""
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        return None
    wait = _one_retry_after(value, headers, now)
    if wait is not None or "," not in value:
        return wait
    parts = value.split(",")
    # (an HTTP date holds a comma of its own: "Wed, 21 Oct 2026 07:28:12 GMT")
    pieces = parts + [",".join(parts[i : i + 2]) for i in range(len(parts) - 1)]
    waits = [w for w in (_one_retry_after(p, headers, now) for p in pieces) if w is not None]
    return max(waits, default=None)


def _one_retry_after(value: str, headers: Any, now: float | None) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if 0.0 <= seconds < math.inf else None
    try:
        when = http_date(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    reference = now if now is not None else time.time()
    server_date = headers.get("Date")
    if server_date:
        with contextlib.suppress(TypeError, ValueError, IndexError, OverflowError):
            reference = http_date(server_date)
    return max(0.0, when - reference)
