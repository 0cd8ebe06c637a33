"""The counters of a client's requests (:class:`ClientStats`), and the retry loop's policy
helpers for :class:`~._http.HttpExchange`: how a failed attempt is told to the operator (the
first failure of a streak a warning, the rest at info), and the wait before a retry
(:func:`pause`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

__all__ = [
    "FIRST_FAILURE",
    "WARN_EVERY",
    "ClientStats",
    "FailureNotes",
    "failed_what",
    "log_exchange",
    "pause",
    "retry_wait",
    "wait_past_give_up",
]

logger = logging.getLogger("fashiontag_pipeline.client")

#: Set (``True``) on the log record of the first failed attempt after a success (the run
#: command adds how long it keeps trying).
FIRST_FAILURE = "fashiontag_first_failure"
#: At most one first-failure warning this often (seconds).
WARN_EVERY = 30.0


@dataclass(slots=True)
class ClientStats:
    """Counters of what the client did; the engine reports them in its run summary."""

    requests: int = 0
    retries: int = 0
    rate_limited: int = 0
    server_errors: int = 0
    transport_errors: int = 0
    ambiguous_writes: int = 0


class FailureNotes:
    """The log lines of failed attempts, for one exchange (``shown_url``: its base URL as
    messages show it; ``retries``: the most retries a request gets)."""

    def __init__(self, shown_url: str, retries: int) -> None:
        self.shown_url = shown_url
        self.retries = retries
        # True from a failed attempt until the next answer that is not a failure: the first
        # failure of a streak is a warning (an operator sees it at once), the rest are info.
        self.failing = False
        self._warned_at = -WARN_EVERY

    def answered(self) -> None:
        """An answer that is no failure: the streak (if any) has ended."""
        if self.failing:
            self.failing = False
            logger.info("the service at %s answers again", self.shown_url)

    def failure(
        self, what: str, delay: float | None, attempt: int, *, give_up_in: float | None = None
    ) -> None:
        """Log a failed attempt: the first of a streak as a warning, the rest at info (-v).
        ``give_up_in``: the service asks to wait past the caller's give-up point, this many
        seconds away (no retry, unless the point moves on: :func:`wait_past_give_up`)."""
        if give_up_in is not None:
            plan = (
                "that is past the give-up point: this request is given up"
                f" in {max(0.0, give_up_in):.1f} s, unless other requests are answered meanwhile"
            )
        elif delay is None:
            plan = f"giving up on this request after {attempt} attempt(s)"
        else:
            plan = f"retry {attempt} of {self.retries} in {delay:.1f} s"
        if self.shown_url not in what:
            what = f"{self.shown_url} {what}"
        now = time.monotonic()
        if not self.failing and now - self._warned_at >= WARN_EVERY:
            # The first failure after a success is a warning (at most one per WARN_EVERY s, so
            # a flaky service does not flood a log; -v shows every one). Marked so that a
            # caller (the run command) can add how long it will keep trying.
            self._warned_at = now
            logger.warning("%s; %s", what, plan, extra={FIRST_FAILURE: True})
        else:
            logger.info("%s; %s", what, plan)
        self.failing = True


async def pause(
    sleep: Callable[[float], Awaitable[None]], delay: float, stopped: anyio.Event | None
) -> bool:
    """Wait ``delay`` seconds before a retry; True (no retry) when ``stopped`` is set, or is
    set meanwhile: the wait ends then (a write's, see :data:`~._callctx.WRITES_STOPPED`)."""
    if stopped is None:
        await sleep(delay)
        return False
    if not stopped.is_set():
        with anyio.move_on_after(delay):
            await stopped.wait()
    return stopped.is_set()


#: Seconds by which a give-up point must move on to count as moved (clocks and sleeps are
#: that coarse).
_MOVED = 0.01


async def wait_past_give_up(
    sleep: Callable[[float], Awaitable[None]],
    stopped: anyio.Event | None,
    wait: float,
    left: Callable[[], float],
) -> bool:
    """Wait a Retry-After of ``wait`` seconds (capped) that runs past the give-up point
    (``left()``: seconds to it): to that point, then on while the point moves on (the
    caller's other requests were answered meanwhile: its failing is not on end), to the
    wait's end. True: waited out (retry); False: given up at the point, or ``stopped``."""
    end = time.monotonic() + wait
    point = time.monotonic() + left()
    while True:
        if await pause(sleep, max(0.0, min(point, end) - time.monotonic()), stopped):
            return False
        now = time.monotonic()
        if now >= end - _MOVED:
            return True
        moved = now + left()
        if moved <= point + _MOVED:
            return False
        point = moved


def failed_what(method: str, path: str, status: int, wait: float | None) -> str:
    """A failed attempt answered ``status`` (with a Retry-After of ``wait`` s), as logged."""
    if status == 429:
        return f"{method} {path}: rate limited (HTTP 429" + (
            f", Retry-After {wait:g} s)" if wait is not None else ")"
        )
    return f"{method} {path}: HTTP {status}" + (
        f" (Retry-After {wait:g} s)" if wait is not None else ""
    )


def retry_wait(wait: float | None, backoff: float, cap: float) -> float:
    """Seconds before a retry: the service's Retry-After ``wait`` (at most ``cap``), and no
    less than ``backoff`` (a ``Retry-After: 0`` under a sustained limit must not make every
    retry go out at once)."""
    return max(min(wait, cap), backoff) if wait is not None else backoff


def log_exchange(method: str, path: str, query: str, sent: bool, started: float) -> None:
    """The DEBUG line of one exchange (``started``: its ``perf_counter``)."""
    if logger.isEnabledFor(logging.DEBUG):
        took = (time.perf_counter() - started) * 1000
        answer = "sent" if sent else "no response"
        logger.debug("%s %s%s -> %s in %.1f ms", method, path, query, answer, took)
