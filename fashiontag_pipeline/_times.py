"""Times as the service writes them: parsed to aware UTC datetimes, formatted as the reference
service writes them (RFC 3339 with milliseconds, ``2026-11-22T03:46:13.123Z``)."""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime

__all__ = ["WireTime", "format_time", "http_date", "parse_time", "time_or_none"]

#: A time as a service writes it: text (:func:`parse_time`'s forms), or a JSON number of epoch
#: seconds or milliseconds (a Java service's default); a number is not refused as not text.
WireTime = str | int | float | None


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

    A time without a zone is taken as UTC. ``None``, the empty string and the number 0 (a
    field left unset) give ``None``; any other unparseable text raises :class:`ValueError`
    naming it.
    """
    if not value:
        return None
    if isinstance(value, (int, float)):
        return _epoch(value, str(value))
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        for fmt in _TIME_FORMATS:
            try:
                parsed = datetime.strptime(text, fmt)
                break
            except ValueError:
                continue
        else:
            parsed = _other_time(text, value)
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


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
