"""When will the first watched task be done? The tracker's poll schedule, predicted from progress.

Pure (times are passed in), so it is tested with a fake clock (``tests/engine/test_makespan.py``).
"""

from __future__ import annotations

import msgspec

__all__ = ["CompletionForecast"]

BACKOFF = 1.6
#: Weight of the newest rate sample in the smoothed rates.
RATE_ALPHA = 0.5
#: Polls are aimed this long after the predicted completion (a poll just before it is wasted).
AIM_LATE = 0.01


def smooth(old: float, sample: float) -> float:
    return RATE_ALPHA * sample + (1 - RATE_ALPHA) * old


class _Watch(msgspec.Struct):
    """What the forecast knows of one task."""

    processed: int
    total: int
    at: float
    moving: bool = False  # progressed between the last two observations
    rate: float | None = None  # images/s, measured between two observations while moving


class CompletionForecast:
    """Predicts when the earliest watched task will be done, from processed counts over time.

    Pure (times are passed in), so it is tested with a fake clock. A task that progresses has
    its own smoothed rate: it is done in ``remaining / rate``. A task that has not moved yet
    is assumed to wait for the tasks watched before it (a service that works in acceptance
    order) and then to go at the service's observed throughput (the sum of every task's
    progress): done in ``(remaining of it and every earlier task) / throughput``. The next poll
    is aimed just after the earliest of these, clamped to ``[poll_min, poll_max]``. With no
    progress at all since the previous poll the interval backs off instead.
    """

    def __init__(self, poll_min: float, poll_max: float) -> None:
        self.poll_min = poll_min
        self.poll_max = poll_max
        self.watches: dict[str, _Watch] = {}
        self.throughput: float | None = None
        self.interval = poll_min
        self._last: float | None = None

    def observe(
        self, now: float, counts: dict[str, tuple[int, int]], done: frozenset[str] = frozenset()
    ) -> bool:
        """Record one poll: ``task_id -> (processed, total)`` of every task still watched and
        of those found ``done`` in it (then forgotten); tasks left out are forgotten too
        (lost). True when some task progressed."""
        moved = 0
        for task_id in list(self.watches):
            if task_id not in counts:
                del self.watches[task_id]
        for task_id, (processed, total) in counts.items():
            w = self.watches.get(task_id)
            if w is None:
                self.watches[task_id] = _Watch(processed, total, now)
                continue
            delta = processed - w.processed
            dt = now - w.at
            if delta > 0 and dt > 0:
                moved += delta
                if w.moving:
                    # Moving at both ends of the interval: a fair rate sample. (The first
                    # move is not: the task may have waited for most of the interval.)
                    sample = delta / dt
                    w.rate = sample if w.rate is None else smooth(w.rate, sample)
                w.moving = True
            elif dt > 0:
                w.moving = False
                w.rate = None  # stalled: its old rate says nothing about when it resumes
            w.processed, w.total, w.at = max(processed, w.processed), total, now
        if self._last is not None and now > self._last and moved:
            sample = moved / (now - self._last)
            self.throughput = sample if self.throughput is None else smooth(self.throughput, sample)
        self._last = now
        for task_id in done:
            self.watches.pop(task_id, None)
        return moved > 0

    def eta(self) -> float | None:
        """Seconds from the last observation until the earliest watched task is done."""
        best: float | None = None
        ahead = 0
        for w in self.watches.values():  # in the order the tasks were first watched
            remaining = max(0, w.total - w.processed)
            ahead += remaining
            if w.rate is not None and w.rate > 0:
                guess = remaining / w.rate
            elif self.throughput:
                guess = ahead / self.throughput
            else:
                continue
            best = guess if best is None else min(best, guess)
        return best

    def next_interval(self, progressed: bool) -> float:
        """Seconds until the next poll, after :meth:`observe`."""
        eta = self.eta() if progressed else None
        if eta is None:
            self.interval = min(self.interval * BACKOFF, self.poll_max)
        else:
            self.interval = min(max(eta + AIM_LATE, self.poll_min), self.poll_max)
        return self.interval
