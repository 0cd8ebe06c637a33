"""The service's clock, as seen from here: an offset estimated from responses' ``Date``.

Expiry times come from the service (``taskExpiredAt``) and are in the service's clock; a
service whose clock runs minutes ahead of ours expires a task minutes before our clock says
so. Every response carries ``Date`` (whole seconds), and the response was produced somewhere
between the moment the request was sent (``t0``) and the moment the answer arrived (``t1``),
so each one bounds the offset (service time minus ours)::

    Date - t1  <=  offset  <=  Date + 1 + Age - t0

(``Age``: a cache's copy, made that long before; its ``Date`` the service's then.)

:class:`ServerClock` keeps the intersection of those bounds over the responses seen (a sample
that does not fit the current bounds means one of the clocks was stepped: the bounds restart
from it; one whose answer "arrived" before it was sent spans a step of our clock and bounds
nothing). Write deadlines use the upper bound (the service as far ahead as the evidence
allows), so an uncertain estimate only makes the engine stop writing to a task earlier. While
the bounds still contain 0 the evidence agrees with our clock (``Date`` has whole seconds only)
and no correction is made: the engine's ``expiry_margin`` covers that last second.

The state records each create's time in the service's clock too (:meth:`ServerClock.stamp`),
carried from the last ``Date`` by our monotonic clock: a step of our wall clock after it (an
NTP step, an operator's fix) does not move it, and a resume judges the create's age in the
same clock whatever ours did meanwhile.
"""

from __future__ import annotations

import time
from datetime import datetime

from ._times import http_date

__all__ = ["NO_DATE", "ServerClock"]

#: :meth:`ServerClock.stamp` before any ``Date`` was seen (a time no service gives).
NO_DATE = -1.0


class ServerClock:
    """Bounds of the service clock's offset from ours, from ``Date`` headers."""

    def __init__(self) -> None:
        self.low: float | None = None
        self.high: float | None = None
        self._last_header = ""
        self._last_date = 0.0
        #: Our wall clock less our monotonic clock when the bounds last moved.
        self._skew = 0.0

    def observe(self, header: str | None, sent: float, received: float, age: float = 0.0) -> None:
        """Take one response's ``Date`` (``sent``/``received``: our wall clock, seconds).
        ``age``: its ``Age`` (a cache's copy, whose ``Date`` is the service's when the copy was
        made, that long before: the service's clock is up to ``age`` later than it shows)."""
        if not header or received < sent:  # our clock stepped back meanwhile: no bound
            return
        if header == self._last_header:
            date = self._last_date
        else:
            try:
                date = http_date(header)
            except (TypeError, ValueError, IndexError, OverflowError):
                return
            self._last_header, self._last_date = header, date
        low, high = date - received, date + 1.0 + age - sent
        self._skew = time.time() - time.monotonic()
        if self.low is None or self.high is None or low > self.high or high < self.low:
            self.low, self.high = low, high
            return
        self.low = max(self.low, low)
        self.high = min(self.high, high)

    def ahead_of_monotonic(self, *, latest: bool = True) -> float | None:
        """The service's clock less our monotonic clock (None before any ``Date``): ``latest``
        its upper bound (a time stamped then is as late as the evidence allows), else its lower
        one (now as early as it allows: a create judged younger, looked for longer)."""
        bound = self.high if latest else self.low
        return None if bound is None else bound + self._skew

    def stamp(self) -> float:
        """Now in the service's clock, its latest bound (:data:`NO_DATE` before any ``Date``)."""
        ahead = self.ahead_of_monotonic()
        return NO_DATE if ahead is None else time.monotonic() + ahead

    @property
    def known(self) -> bool:
        return self.low is not None

    @property
    def correction(self) -> float:
        """The offset write deadlines use: 0 while the evidence agrees with our clock, else the
        bound that makes deadlines earliest (the service as far ahead, or as little behind, as
        the evidence allows)."""
        if self.low is None or self.high is None or self.low <= 0.0 <= self.high:
            return 0.0
        return self.high

    def remaining(self, expires_at: datetime | None, default: float) -> float:
        """Seconds from now until the service's ``expires_at`` by the service's clock
        (``default`` when the service gave no time)."""
        if expires_at is None:
            return default
        return expires_at.timestamp() - (time.time() + self.correction)
