"""The background tagger: takes accepted images in acceptance order and tags them.

Throughput is capped by a token bucket at ``rate`` images/s across the service (0 = no cap).
Without fetch, tagging an image only marks it done (its hash was taken at acceptance), so whole
runs are completed at once. With fetch, each image is downloaded and measured with bounded
concurrency, and a failure becomes that image's error code, never a crash.
"""

from __future__ import annotations

import logging
import time

import anyio

from .analyzer import Analyzer, ImageRejected
from .store import TaskRecord, TaskStore

__all__ = ["TaggingWorker", "TokenBucket"]

logger = logging.getLogger("fashiontag_pipeline.service")

SWEEP_INTERVAL = 1.0
CODE_INTERNAL = 500


class TokenBucket:
    """``rate`` tokens/s, at most ``burst`` banked. Shared by the bulk worker and single mode."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = 0.0
        self._last = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self._last) * self.rate)
        self._last = now

    def take_up_to(self, count: int) -> int:
        """Take as many whole tokens as there are, at most ``count``; 0 when none."""
        self._refill()
        taken = min(int(self.tokens), count)
        if taken <= 0:
            return 0
        self.tokens -= taken
        return taken

    def wait_time(self) -> float:
        """Seconds until one whole token is banked."""
        return max(0.0, (1.0 - self.tokens) / self.rate)

    async def acquire(self) -> None:
        """Take one token, waiting for it (reserved at once: waiters are served in order)."""
        self._refill()
        self.tokens -= 1.0
        if self.tokens < 0.0:
            await anyio.sleep(-self.tokens / self.rate)


class TaggingWorker:
    """Drains :attr:`TaskStore.pending`; run :meth:`run` as one background task.

    Keys take turns (:class:`~.pending.PendingQueue`), and in fetch mode one key holds at most
    ``fetch_concurrency // (keys with work + 1)`` of the fetch slots, so a key arriving while
    another has thousands of slow images in flight finds free slots at once.
    """

    def __init__(
        self,
        store: TaskStore,
        analyzer: Analyzer,
        *,
        rate: float,
        fetch_concurrency: int = 32,
    ) -> None:
        self.store = store
        self.analyzer = analyzer
        self.rate = rate
        self.fetch_concurrency = fetch_concurrency
        # Burst of at most ~50 ms of work so the cap holds over short windows too.
        self.bucket: TokenBucket | None = (
            TokenBucket(rate, max(1.0, rate * 0.05)) if rate > 0 else None
        )
        self._wake: anyio.Event | None = None
        self._in_flight: dict[bytes, int] = {}

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _share(self) -> int:
        """Fetch slots one key may hold now."""
        owners = len(set(self._in_flight) | self.store.pending.owners())
        return max(1, self.fetch_concurrency // (owners + 1))

    async def run(self) -> None:
        """Tag forever (until cancelled)."""
        store = self.store
        store.on_pending = self._notify
        limiter = anyio.Semaphore(self.fetch_concurrency)
        bucket = self.bucket
        next_sweep = time.monotonic() + SWEEP_INTERVAL
        async with anyio.create_task_group() as tg:
            while True:
                now = time.monotonic()
                if now >= next_sweep:
                    store.sweep()
                    next_sweep = now + SWEEP_INTERVAL
                in_flight = self._in_flight
                share = self._share() if store.pending else 0
                head = store.pending.head(in_flight, share) if store.pending else None
                if head is None:
                    # Nothing to do, or every key with work holds its share of fetch slots.
                    self._wake = anyio.Event()
                    with anyio.move_on_after(SWEEP_INTERVAL):
                        await self._wake.wait()
                    self._wake = None
                    continue
                task, start, end, urls = head
                want = end - start
                if urls is not None:
                    want = min(want, share - in_flight.get(task.owner, 0))
                if bucket is not None:
                    count = bucket.take_up_to(want)
                    if not count:
                        await anyio.sleep(bucket.wait_time())
                        continue
                else:
                    count = want
                store.pending.consume(head, count)
                if urls is None:
                    store.complete_range(task, start, start + count)
                    if bucket is None:
                        await anyio.lowlevel.checkpoint()
                else:
                    owner = task.owner
                    for offset, url in enumerate(urls[:count]):
                        await limiter.acquire()
                        self._in_flight[owner] = self._in_flight.get(owner, 0) + 1
                        tg.start_soon(self._fetch_one, limiter, task, start + offset, url)

    async def _fetch_one(
        self, limiter: anyio.Semaphore, task: TaskRecord, index: int, url: str
    ) -> None:
        try:
            try:
                analysis = await self.analyzer.from_url(url)
            except ImageRejected as err:
                self.store.record(task, index, None, err.code)
            except Exception:
                logger.exception("analysis of image %d of task %s failed", index, task.task_id)
                self.store.record(task, index, None, CODE_INTERNAL)
            else:
                self.store.record(task, index, analysis, 0)
        finally:
            limiter.release()
            owner = task.owner
            left = self._in_flight[owner] - 1
            if left:
                self._in_flight[owner] = left
            else:
                del self._in_flight[owner]
            self._notify()
