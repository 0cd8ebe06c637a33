"""The source stage of a long-lived engine: jobs' manifests read in turn, fairly.

:class:`JobSource` reads one batch of each job in flight in turn (round robin), so a job
submitted behind a big one has its rows in the next chunk. With ``max_pending_rows``, reading
waits while more rows than that are taken in without an outcome: the service tags in
acceptance order, so this bound is what lets a new job reach the service within seconds. When
it has nothing to read (or waits on the bound) it sends :data:`~.intake.IDLE`, so the writer
seals its open task and the rows sent get their results; after a job's last batch it sends
:class:`~.jobs.JobEnd`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import anyio
import anyio.abc
import anyio.lowlevel

from .. import _exceptions as exc
from .intake import IDLE, Idle
from .jobs import Job, JobEnd
from .rows import RowBatch
from .source import ManifestReader, manifests_size
from .state import POS_SHIFT
from .tracker import TaskBook

__all__ = ["JobSource"]

logger = logging.getLogger("fashiontag_pipeline.engine")

Message = RowBatch | JobEnd | Idle


class JobSource:
    """Round-robin reader of the jobs' manifests (see the module docstring)."""

    def __init__(
        self,
        *,
        book: TaskBook,
        pending: Callable[[], int],
        in_flight: Callable[[], bool],
        fail_fast: bool,
        max_pending_rows: int | None,
    ) -> None:
        self.book = book
        self.pending = pending
        self.in_flight = in_flight
        self.fail_fast = fail_fast
        self.max_pending_rows = max_pending_rows
        self.rows_read = 0
        #: No more jobs will come: the stage ends once every job is read.
        self.closing = False
        #: Submits under way (opening their manifests and outputs): a closing source waits
        #: for them, so that a job submitted just before :meth:`close` is read, not dropped.
        self.adding = 0
        #: The stage has ended.
        self.done = False
        #: Reading waits for rows in flight to get their outcome (``max_pending_rows``): no
        #: row comes before the open task is sealed and read (a daemon holds it for none).
        self.gated = False
        self._reading: deque[Job] = deque()
        #: Readers of jobs still being read (a long-lived engine forgets finished ones: a
        #: reader keeps its last block of rows), and the bytes of those it forgot.
        self._readers: list[ManifestReader] = []
        self._bytes_done = 0
        self._size_done = 0
        self._size_unknown = False
        self._wake = anyio.Event()
        self._scope = anyio.CancelScope()

    def add(self, job: Job, readers: list[ManifestReader]) -> None:
        job.readers = readers
        self._readers.extend(readers)
        self._reading.append(job)
        self._wake.set()

    def close(self) -> None:
        self.closing = True
        self._wake.set()

    def add_done(self) -> None:
        """A submit counted in :attr:`adding` ended (its job added, or refused)."""
        self.adding -= 1
        self._wake.set()

    def _ended(self) -> bool:
        return self.closing and not self.adding

    def cancel(self) -> None:
        """Stop reading now (a drain)."""
        self._scope.cancel()

    def close_readers(self) -> None:
        for reader in self._readers:
            reader.close()

    def bytes_read(self) -> int:
        return self._bytes_done + sum(r.bytes_read for r in self._readers)

    def bytes_total(self) -> int:
        """Total bytes of every manifest read so far (0 when one has no known size)."""
        if self._size_unknown:
            return 0
        current = manifests_size(self._readers)
        if self._readers and current == 0:
            return 0
        return self._size_done + current

    def _forget(self, reader: ManifestReader) -> None:
        reader.close()
        if reader in self._readers:
            self._readers.remove(reader)
            self._bytes_done += reader.bytes_read
            if reader.size is None:
                self._size_unknown = True
            else:
                self._size_done += reader.size

    async def run(self, send: anyio.abc.ObjectSendStream[Message]) -> None:
        async with send:
            with self._scope:
                # Not "sent" at the start: a resume may have opened a task for the chunks it
                # sends again (smaller than a task), which only an IDLE seals while the bound
                # on rows in flight keeps the reader waiting for those very rows.
                idle_sent = False
                while True:
                    if not self._reading:
                        if self._ended():
                            break
                        if not idle_sent:
                            await send.send(IDLE)
                            idle_sent = True
                        self._wake = anyio.Event()
                        if self._reading or self._ended():
                            continue
                        await self._wake.wait()
                        continue
                    if await self._gate(send, idle_sent):
                        idle_sent = True
                    job = self._reading.popleft()
                    batch = await self._read(job)
                    if batch is None:
                        await send.send(JobEnd(job.id))
                        continue
                    self._reading.append(job)
                    job.rows_read += len(batch.rows)
                    self.rows_read += len(batch.rows)
                    idle_sent = False
                    await send.send(batch)
        self.done = True
        self.book.poke()

    async def _gate(self, send: anyio.abc.ObjectSendStream[Message], idle_sent: bool) -> bool:
        """Wait while too many rows are in flight (fairness); True when IDLE was sent."""
        cap = self.max_pending_rows
        if cap is None or self.pending() < cap:
            return False
        self.gated = True  # (before the IDLE: the writer asks when it takes it)
        try:
            if not idle_sent:
                await send.send(IDLE)  # seal what is open: those rows get their results
            # Rows taken in but not yet written ahead (a resume re-reads them: they are only
            # sent once read again) cannot leave the count while nothing is in flight: then
            # read on.
            await anyio.lowlevel.checkpoint()
            while self.pending() >= cap and self.in_flight():
                with anyio.move_on_after(0.5):
                    await self.book.changed.wait()
        finally:
            self.gated = False
        return True

    async def _read(self, job: Job) -> RowBatch | None:
        """The job's next batch; None when its manifests are read to the end (or broke)."""
        while job.readers:
            if job.failure is not None and job.read_to >= job.row.validated:
                # Failed (its outputs were removed): read no more, once past the rows it took
                # in before a restart (those are read again to be sent, else they would wait
                # for their outcome for ever).
                logger.error("job %s failed: %s", job.row.name, job.failure)
                for rest in job.readers:
                    self._forget(rest)
                job.readers = []
                return None
            reader = job.readers[0]
            try:
                batch = await anyio.to_thread.run_sync(reader.read_batch, abandon_on_cancel=True)
            except exc.ManifestError as err:
                if self.fail_fast:
                    err.stdin = reader.name == "-"  # (a CLI's way on differs: see ManifestError)
                    raise
                job.failure = str(err)
                logger.error("manifest %s broke while read: %s", reader.name, err)
                for rest in job.readers:
                    self._forget(rest)
                job.readers = []
                return None
            if batch is None:
                self._forget(reader)
                job.readers.pop(0)
                continue
            if batch.rows:
                job.read_to = (batch.source << POS_SHIFT) | batch.rows[-1][0]
                return batch
        return None
