"""Flow control shared by the stages: AIMD concurrency, the give-up budget, and the control
that stops an engine from outside."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from .. import _exceptions as exc
from .._config import DEFAULT_MAX_RETRY_AFTER
from .._connect import unreadable_answer
from .._exceptions import FashiontagError
from .._images import ImageFileShortage
from .._retrying import wait_past_give_up

__all__ = [
    "REFUSED",
    "TRANSIENT",
    "AIMDLimiter",
    "FatalRunError",
    "RetryBudget",
    "RunControl",
    "redirect_fault",
    "refused",
]

T = TypeVar("T")

logger = logging.getLogger("fashiontag_pipeline.engine.flow")

#: While failures go on, a reminder of how long they have lasted at most this often.
STILL_FAILING_EVERY = 30.0

#: Failures a stage retries under its budget, and refusals that end the run at once.
TRANSIENT = (exc.TransportError, exc.RateLimitedError, exc.ServerError)
REFUSED = (exc.AuthenticationError, exc.PermissionDeniedError)


#: What :func:`_trouble` says of a lack of the process's own (no state of the service's).
_SHORT = "short"


def _trouble(err: BaseException) -> tuple[str, str]:
    """(what the first warning says, what the final error says the service was) of a failure
    the budget retries."""
    if isinstance(err, ImageFileShortage):
        return "this process is short of open files or memory", _SHORT
    if isinstance(err, exc.DecodeError):
        return "the service answers JSON that is not the spec's shape", "answering malformed JSON"
    if isinstance(err, exc.RateLimitedError):
        return "the service is rate limiting this key (HTTP 429)", "rate limiting this key"
    if isinstance(err, exc.ServerError):
        return "the service answers with an error", "answering with errors"
    if isinstance(err, exc.RequestError):  # (a front end's refusal of every request)
        return f"the service refuses the requests (HTTP {err.status})", "refusing the requests"
    if isinstance(err, exc.AmbiguousWriteError) and err.status is not None:
        # A write answered (5xx, 408, or 2xx with a body that cannot be read): the service is
        # reachable, busy or failing.
        if err.applied:
            return "the service answers writes unreadably", "answering writes unreadably"
        return f"the service answers HTTP {err.status}", f"answering HTTP {err.status}"
    answered = unreadable_answer(err)
    if answered is not None:
        return f"the service is {answered}", answered
    deadline = getattr(err, "deadline", None)
    if deadline is not None:
        # Reached, and slower than the deadline (or hanging): no outage to look for; a
        # deadline too short for this service is raised in [client.timeout].
        within = f"within the request deadline ({deadline:g} s, [client.timeout])"
        return f"the service does not answer {within}", f"not answering {within}"
    return "cannot reach the service", "unreachable"


class FatalRunError(FashiontagError):
    """The run cannot go on (bad key, service unreachable after the retry budget)."""


def redirect_fault(err: exc.ServiceError) -> exc.ServerError | None:
    """A temporary redirect (302, 303, 307: never followed, the key would go with it) of a
    read, as the transient fault it is: a front end's, to its maintenance page for a while;
    it says nothing of the task. None for any other answer, a permanent one (301, 308: the
    service moved, asking again never reads it) included."""
    if 300 <= err.status < 400 and err.status not in (301, 308):
        return exc.ServerError(str(err), **err.answer())
    return None


def stale_list(age: float, give_up_after: float) -> FatalRunError:
    """The stop of a look for a write's task in a task list that a cache answers, ``age``
    seconds old (``Age``), past ``give_up_after``: such a copy cannot show the task."""
    return FatalRunError(
        f"the task list is answered from a cache's copy {age:.0f} s old (Age) for more than"
        f" {give_up_after:.0f} s (give_up_after, --give-up-after): a write's task cannot be"
        " looked for in it; stopped with the state saved, its rows not sent again (they would"
        " be billed twice): the same command resumes once the list is the service's own"
    )


def refused(err: exc.FashiontagError) -> FatalRunError:
    """The fatal error for a key the service refuses."""
    return FatalRunError(f"the service refused the run: {err}")


class AIMDLimiter:
    """A concurrency limit that grows by one per window of successes and halves on a 429
    (additive increase, multiplicative decrease), never above ``cap``.

    Not tied to a task: a slot acquired by one task may be released by another. Waiters are
    woken only when there are some: a release or a success (one of each per results page)
    with nobody waiting costs no event (an ``anyio.Event`` is ~3 us to make)."""

    def __init__(self, cap: int, *, start: int | None = None) -> None:
        self.cap = cap
        self.window = float(start if start is not None else max(1, min(cap, 4)))
        self.inflight = 0
        self.peak = 0
        self._wake = anyio.Event()
        self._waiting = 0

    @property
    def limit(self) -> int:
        return max(1, min(self.cap, int(self.window)))

    async def acquire(self) -> None:
        while self.inflight >= self.limit:
            wake = self._wake
            self._waiting += 1
            try:
                await wake.wait()
            finally:
                self._waiting -= 1
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)

    def release(self) -> None:
        self.inflight -= 1
        self._notify()

    def _notify(self) -> None:
        if self._waiting:
            wake, self._wake = self._wake, anyio.Event()
            wake.set()

    def success(self) -> None:
        """Additive increase: +1 per ``window`` successes."""
        if self.window < self.cap:
            self.window = min(float(self.cap), self.window + 1.0 / self.window)
            self._notify()

    def throttled(self) -> None:
        """Multiplicative decrease."""
        self.window = max(1.0, math.floor(self.window / 2))


class RetryBudget:
    """Backoff between engine-level retries, and the give-up rule: once failures have gone on
    for ``give_up_after`` seconds without a success in between, the run stops."""

    def __init__(
        self,
        give_up_after: float,
        *,
        base: float = 0.05,
        cap: float = 5.0,
        max_retry_after: float = DEFAULT_MAX_RETRY_AFTER,
    ) -> None:
        self.give_up_after = give_up_after
        #: The longest Retry-After waited (the client's ``retry.max_retry_after``).
        self.max_retry_after = max_retry_after
        self.base = base
        self.cap = cap
        self.retries = 0
        self._failing_since: float | None = None
        #: When a call last succeeded (from the start: none has failed before it).
        self._last_ok = time.monotonic()
        self._reminded_at = 0.0
        self._warned_at = -STILL_FAILING_EVERY
        self._streak = 0
        self._random = random.Random()

    def ok(self) -> None:
        if self._failing_since is not None:
            logger.info(
                "the service answers again after %.0f s of failures (%d retries)",
                time.monotonic() - self._failing_since,
                self._streak,
            )
        self._failing_since = None
        self._last_ok = time.monotonic()
        self._streak = 0

    @property
    def answered_at(self) -> float:
        """When the service last answered (``time.monotonic()``; the budget's start before)."""
        return self._last_ok

    def time_left(self, started: float) -> float:
        """Seconds before a call that began at ``started`` (``time.monotonic()``) and has not
        succeeded yet is past the give-up point (below 0: past it), when the failures, counted
        from the later of its start and the last success, have gone on for ``give_up_after``
        seconds (the client's :data:`~.._callctx.GIVE_UP`: it starts no retry of the call
        then, nor waits past it)."""
        now = time.monotonic()
        since = self._failing_since
        if since is None:
            since = self._failing_from(started, now)
        return self.give_up_after - (now - since)

    def _left(self) -> float:
        """Seconds to the give-up point of the failing under way (it began no earlier than
        the last success)."""
        since = self._failing_since if self._failing_since is not None else self._last_ok
        return self.give_up_after - (time.monotonic() - since)

    def _failing_from(self, began: float | None, now: float) -> float:
        """When a failure that began at ``began`` (None: not known) makes the service's
        failing begin: no later than now, no earlier than the last success."""
        return now if began is None else max(min(began, now), self._last_ok)

    async def call(
        self, what: str, fn: Callable[[], Awaitable[T]], *, ends_streak: bool = True
    ) -> T:
        """``fn()`` until it succeeds: transient failures are retried under this budget (which
        stops the run once spent), a refused key stops it at once. ``ends_streak=False``: its
        answer does not end a streak of failures (a look-up made for a failing write: a
        service that answers it while refusing every write must still be given up on)."""
        while True:
            try:
                result = await fn()
            except TRANSIENT as err:
                await self.failed(err, what)
                continue
            except REFUSED as err:
                raise refused(err) from err
            if ends_streak:
                self.ok()
            return result

    def _gave_up(self, what: str, state: str, reason: str) -> str:
        """The fatal error of a run out of budget: what failed, and what to do (the last line
        on stderr, all a cron mail's subject or a monitor keeps)."""
        if state == _SHORT:
            return (
                f"{what}: this process was short of open files or memory for"
                f" {self.give_up_after:.0f}s: {reason}; stopped with the state saved: raise its"
                " limit (ulimit -n, LimitNOFILE=) or lower its concurrency, then the same"
                " command resumes"
            )
        return (
            f"{what}: service {state} for {self.give_up_after:.0f}s: {reason}; stopped with"
            " the state saved: the same command resumes once the service answers"
        )

    async def failed(
        self, err: BaseException, what: str, *, until: anyio.Event | None = None
    ) -> None:
        """Count a failure and sleep before the retry; raise FatalRunError when out of budget.
        ``until``: the sleep ends when it is set (a writer's stop)."""
        now = time.monotonic()
        reason = " ".join(str(err).split())
        # Say what kind of trouble it is: an answer that is not the spec's JSON, or a service
        # that answers "too many" or with errors, is no outage ("cannot reach").
        trouble, state = _trouble(err)
        if self._failing_since is None:
            # The failing began when the failed call did (its own retries, each until its
            # deadline, may have taken minutes), unless something succeeded since.
            began = getattr(err, "started_at", None)
            since = self._failing_from(began, now)
            self._failing_since = since
            self._reminded_at = now
            if now - since > self.give_up_after:
                raise FatalRunError(self._gave_up(what, state, reason)) from err
            # A warning for the first streak in STILL_FAILING_EVERY s (a flaky service must
            # not flood the log: the progress reporter warns when retries pile up).
            log = logger.info
            if now - self._warned_at >= STILL_FAILING_EVERY:
                self._warned_at = now
                log = logger.warning
            if math.isinf(self.give_up_after):
                log("%s (%s: %s); will keep trying", trouble, what, reason)
            else:
                log(
                    "%s (%s: %s); will keep trying for %.0f s "
                    "(give_up_after, --give-up-after), then stop with the state saved",
                    trouble,
                    what,
                    reason,
                    self.give_up_after,
                )
        elif now - self._failing_since > self.give_up_after:
            raise FatalRunError(self._gave_up(what, state, reason)) from err
        elif now - self._reminded_at >= STILL_FAILING_EVERY:
            self._reminded_at = now
            logger.warning(
                "still failing after %.0f s of %s (%d retries): %s: %s",
                now - self._failing_since,
                "no limit" if math.isinf(self.give_up_after) else f"{self.give_up_after:.0f} s",
                self._streak,
                what,
                reason,
            )
        else:
            logger.info("%s failed (%s); retrying", what, reason)
        self._streak += 1
        delay = min(self.cap, self.base * 2 ** min(self._streak, 10)) * (
            0.5 + self._random.random() / 2
        )
        wait = getattr(err, "retry_after", None)
        if wait is not None and self._failing_since is not None:
            # The service's Retry-After (a 429 or 503 the client did not wait out, a write
            # answered 503); one past the give-up point is waited to it, then the run stops
            # (no retry: none counted), unless the point moved on meanwhile (other requests
            # answered: no failing on end), then to its end.
            if wait > self._left():
                cap = min(wait, self.max_retry_after)
                if await wait_past_give_up(anyio.sleep, until, cap, self._left):
                    self.retries += 1
                    return
                if until is not None and until.is_set():
                    return  # a stop: the caller sends nothing more
                raise FatalRunError(self._gave_up(what, state, reason)) from err
            delay = max(delay, min(wait, self.max_retry_after))
        await _pause(delay, until)
        if until is None or not until.is_set():  # (a stop: the caller sends nothing more)
            self.retries += 1


async def _pause(delay: float, until: anyio.Event | None) -> None:
    """Sleep ``delay`` seconds, or until ``until`` is set."""
    if until is None:
        await anyio.sleep(delay)
    elif not until.is_set():
        with anyio.move_on_after(delay):
            await until.wait()


class RunControl:
    """Stops an engine from outside (signals, a daemon's shutdown).

    :meth:`stop` stops reading, lets in-flight writes finish, saves state and ends the engine
    (a later one with the same state resumes); :meth:`abort` ends it at once (state is
    consistent at every commit, so this is safe too).

    One control serves a run in each event loop (a nightly script's ``asyncio.run`` per night,
    as its client does): its events are made for the loop that looks at them (an asyncio event
    is bound to the first loop that waits on it, and the second night's run failed on "is
    bound to a different event loop"); a stop, once made, holds in each."""

    def __init__(self) -> None:
        self._stopped = self._aborted = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: tuple[anyio.Event, anyio.Event] | None = None

    def _current(self) -> tuple[anyio.Event, anyio.Event]:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # (not in a loop: an event that binds to the first that waits)
            loop = None
        if self._events is None or (loop is not None and loop is not self._loop):
            self._loop, self._events = loop, (anyio.Event(), anyio.Event())
            if self._stopped:
                self._events[0].set()
            if self._aborted:
                self._events[1].set()
        return self._events

    @property
    def stopping(self) -> anyio.Event:
        return self._current()[0]

    @property
    def aborting(self) -> anyio.Event:
        return self._current()[1]

    def stop(self) -> None:
        self._stopped = True
        self.stopping.set()

    def abort(self) -> None:
        self._stopped = self._aborted = True
        self.stopping.set()
        self.aborting.set()
