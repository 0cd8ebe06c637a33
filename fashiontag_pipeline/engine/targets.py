"""Choosing the task a chunk goes to: the half of :class:`~.batcher.TaskWriter` between
packing chunks and sending them.

A chunk goes to the open task while it is usable (:class:`~.policy.WritePolicy`: not full, not
rotated, not near expiry) and holds no id of a coarse key the task's rows hold (:mod:`.idkeys`:
a service that changes ids could return one's result as the other's); else the open task is
sealed and the chunk creates a new one. A chunk holding two ids of one key is first split
into parts of distinct keys (written ahead in one state transaction, as a write refused whole
is split), each sent to its own task.
"""

from __future__ import annotations

import logging

from .idkeys import clashes, key_parts, keyed, stored
from .policy import Chunk, OpenTask
from .writes import TaskWrites

__all__ = ["TaskTargets"]

logger = logging.getLogger("fashiontag_pipeline.engine")


class TaskTargets(TaskWrites):
    """Targeting for :class:`~.batcher.TaskWriter` (see the module docstring)."""

    #: Images assigned to tasks by this writer (sizes the next task).
    assigned: int

    async def _target(self, n: int, keys: set[str]) -> tuple[OpenTask, bool]:
        """The task a chunk of ``n`` rows (``keys``: :func:`.idkeys.keyed` of its ids) goes to;
        True when the chunk must create it."""
        while True:
            cur = self.current
            if cur is not None and cur.task_id is None and not cur.failed:
                await cur.created.wait()
                continue
            now = self.clock()
            if (
                cur is not None
                and not cur.failed
                and self.policy.usable(cur, now, n)
                and not clashes(cur, keys)
            ):
                cur.images += n
                cur.inflight += 1
                cur.keys |= keys
                self.assigned += n
                if self.policy.full(cur):
                    await self._close(cur)
                return cur, False
            if cur is not None:
                await self._close(cur)
                if self.current is not cur:
                    continue
            seq, token = self._new_token()
            task = OpenTask(seq=seq, token=token, opened=now, expires=now + self.default_ttl)
            task.limit = self.policy.task_limit(self.assigned)
            task.images = n
            task.inflight = 1
            task.keys = keys
            self.assigned += n
            self.current = task
            if self.policy.full(task):
                task.closing = True
                self.current = None
            return task, True

    async def _chunk_target(self, chunk: Chunk) -> tuple[OpenTask, bool] | list[Chunk]:
        """:meth:`_target` for a chunk written ahead, or the parts it is split into when two
        of its ids share a key (each is sent apart: the first to the open task, the next to a
        new one, ...)."""
        keys = keyed(chunk.ids)
        if len(keys) == len(chunk.ids) or chunk.fate_unknown:
            return await self._target(len(chunk.ids), keys)
        parts = key_parts(chunk)
        new_ids = await self.journal.run(self.journal.split_chunk, chunk.chunk_id, stored(parts))
        for (part, _), new_id in zip(parts, new_ids, strict=True):
            part.chunk_id = new_id
        logger.debug("a chunk of %d rows split in %d: ids of one key", len(chunk.ids), len(parts))
        return [part for part, _ in parts]

    async def _close(self, task: OpenTask) -> None:
        task.closing = True
        if self.current is task:
            self.current = None
        await self._maybe_seal(task)

    async def _maybe_seal(self, task: OpenTask) -> None:
        if task.closing and task.inflight == 0 and not task.sealed and task.task_id is not None:
            task.sealed = True
            self.tasks.pop(task.task_id, None)
            # Not committed: a resume treats an open task the same way (closed, then watched).
            self.book.watch(task.task_id, self.description(task.token), created=True)
            self._watch_moved(task.task_id)  # (the tasks writes to it were moved to)

    def _unassign(self, task: OpenTask, create: bool) -> None:
        """A chunk given ``task`` by :meth:`_target` will not be sent (its write-ahead
        failed: the run is ending)."""
        task.inflight -= 1
        if create:
            task.failed = True
            task.created.set()
            if self.current is task:
                self.current = None
