"""The service's clock offset from Date headers: bounds, steps, and what deadlines use."""

from __future__ import annotations

import time
from email.utils import formatdate

import pytest

from fashiontag_pipeline._clock import NO_DATE, ServerClock


def _date(t: float) -> str:
    return formatdate(t, usegmt=True)


def test_a_clock_in_agreement_needs_no_correction() -> None:
    clock = ServerClock()
    for t in (1000.2, 1000.7, 1001.4):
        clock.observe(_date(t), t - 0.01, t + 0.01)
    assert clock.known and clock.correction == 0.0


def test_a_clock_ahead_is_bounded_and_deadlines_use_the_upper_bound() -> None:
    clock = ServerClock()
    ahead = 7 * 60.0
    for t in (1000.05, 1000.55, 1000.95):  # the server's second ticks between these
        clock.observe(_date(t + ahead), t - 0.01, t + 0.01)
    assert clock.low is not None and clock.high is not None
    assert clock.low <= ahead <= clock.high and clock.high - clock.low < 1.1
    assert clock.correction == clock.high >= ahead


def test_a_stepped_clock_restarts_the_bounds() -> None:
    clock = ServerClock()
    clock.observe(_date(1000.5), 1000.49, 1000.51)
    clock.observe(_date(1000.5 + 300), 1000.6, 1000.62)  # the server was set 5 minutes ahead
    assert clock.low is not None and clock.low > 290


def test_no_date_no_evidence() -> None:
    clock = ServerClock()
    clock.observe(None, 1.0, 2.0)
    clock.observe("not a date", 1.0, 2.0)
    assert not clock.known and clock.correction == 0.0


def test_our_clock_stepped_back_during_a_request_is_no_evidence() -> None:
    """Our wall clock set 5 minutes back (NTP) while a request was out: the answer "arrived"
    before it was sent, and the interval it gives is inverted. Taken, it restarted the bounds
    at (Date - received, Date + 1 - sent) = (low 300, high 1) and deadlines were corrected by
    1 s while the step meant 300; it bounds nothing and is left out. The next answer, with
    both times after the step, restarts the bounds right."""
    clock = ServerClock()
    clock.observe(_date(1000.5), 1000.49, 1000.51)  # in agreement
    clock.observe(_date(1000.8), 1000.7, 700.9)  # received after a 300 s step back
    assert (clock.low, clock.high) == (1000.0 - 1000.51, 1001.0 - 1000.49)
    assert clock.correction == 0.0
    clock.observe(_date(1001.2), 701.1, 701.2)  # the service is now 300 s ahead of us
    assert clock.low is not None and clock.low > 290
    assert clock.correction == clock.high


def test_a_date_without_its_zone_is_read_as_gmt_on_a_host_in_another_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Date: ... -0000`` (RFC 2822's "zone unknown", sent by some gateways; HTTP dates are
    GMT): read as the host's local time, a service in agreement with our clock was taken for
    9 hours behind on a host in Seoul (every task's expiry read 9 hours late: writes sent past
    it; west of GMT, early: a task per chunk). It is read as GMT, as an HTTP date is."""
    monkeypatch.setenv("TZ", "Asia/Seoul")
    time.tzset()
    try:
        clock = ServerClock()
        for t in (1000.2, 1000.7, 1001.4):
            clock.observe(_date(t).replace("GMT", "-0000"), t - 0.01, t + 0.01)
        assert clock.known and clock.correction == 0.0
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_stamp_in_the_services_clock_is_not_moved_by_a_step_of_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The time a create is written ahead at, in the service's clock: our clock an hour behind
    the service's when a ``Date`` came, then corrected (an NTP step) before the next one. The
    stamp goes on by our monotonic clock, not by our wall clock plus the offset learnt before
    the step (which would put it an hour late). Before any ``Date``: NO_DATE."""
    clock = ServerClock()
    assert clock.stamp() == NO_DATE
    ours = time.time()
    clock.observe(_date(ours + 3600.0), ours, ours)
    before = clock.stamp()
    assert ours + 3599.0 <= before <= ours + 3601.1
    monkeypatch.setattr(time, "time", lambda: ours + 3600.0)  # (corrected: the service's)
    assert before <= clock.stamp() <= before + 1.0


def test_a_cached_copys_date_is_up_to_its_age_behind() -> None:
    """Answers of a cache only (``Age``: its copy made that long before, the service's
    ``Date`` of then): the service's clock is between that ``Date`` and ``Date + Age`` (+1 s),
    not at the ``Date``. Seven minutes ahead of ours, copies 5 s old: bounded so, deadlines
    still use the upper bound; copies 120 s old of a service in agreement: no correction."""
    ahead = 7 * 60.0
    clock = ServerClock()
    clock.observe(_date(1000.5 + ahead - 5), 1000.49, 1000.51, 5.0)
    assert clock.low is not None and clock.high is not None
    assert clock.low <= ahead <= clock.high and clock.correction == clock.high >= ahead
    clock = ServerClock()
    clock.observe(_date(1000.5 - 120), 1000.49, 1000.51, 120.0)
    assert clock.known and clock.correction == 0.0
