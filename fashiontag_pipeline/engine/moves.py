"""A write answered with another task's id than the one written to (a service that made a new
task for it, or goes on with the task under a new id): its rows are read from that task.

:class:`WriteMoves` is a part of :class:`~.writes.TaskWrites` (the requests are there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from .. import _exceptions as exc
from .._models import BulkTaskResponse
from .answers import WriteAnswers
from .flow import FatalRunError
from .policy import Chunk, OpenTask
from .state import changes

__all__ = ["MOVED", "WriteMoves"]

logger = logging.getLogger("fashiontag_pipeline.engine")

#: How the token of a task a write was moved to ends (:meth:`WriteMoves._moved`): the
#: service chose that task and its description, so none is expected of it (a resume took
#: the one its token gives for the evidence of another's task and sent its rows again).
MOVED = "~moved"


class WriteMoves(WriteAnswers):
    """Writes moved to another task, for :class:`~.writes.TaskWrites` (see the module)."""

    _new_token: Callable[[], tuple[int, str]]
    _opened_ops: Callable[[OpenTask, str, datetime | None], list[changes.Change]]
    #: A write answered with an id that names no task was said (then at info level).
    _unnamed_said = False
    #: The tasks writes were moved to, by id, each with the task written to.
    _successors: dict[str, tuple[OpenTask, OpenTask]] | None = None
    #: Ids of the tasks writes were moved to, by the task written to: watched once it is
    #: sealed (:meth:`_watch_moved`).
    _moved_from: dict[str, list[str]] | None = None

    async def _moved(self, task: OpenTask, chunk: Chunk, response: BulkTaskResponse) -> bool:
        """A write to ``task`` answered 2xx with another task's id (a service that made a new
        task for it: the one written to no longer extended): its rows are in that task. It is
        recorded as a task of the run (a new token, no description to match) and read like
        one once ``task`` is sealed; ``task`` takes no more writes. Before, the rows were
        taken as added to ``task``, found missing from its results and sent again: billed
        twice, the other task unread. A write to ``task`` on its way meanwhile answered with
        that id too is one more write to it (:meth:`_moved_again`). False (nothing done) when
        the id names no task (:meth:`_names_a_task`)."""
        new_id = response.task_id
        assert task.task_id is not None
        if self._successors is None or self._moved_from is None:
            self._successors, self._moved_from = {}, {}
        successors = self._successors
        if new_id not in successors and not await self._names_a_task(new_id):
            (logger.info if self._unnamed_said else logger.warning)(
                "task %s: a write to it was answered with id %r, which the service knows no"
                " task by: its rows are taken as added to %s, as the spec has it",
                task.task_id,
                new_id,
                task.task_id,
                extra={"task_id": task.task_id},
            )
            self._unnamed_said = True
            return False
        task.closing = True
        if self.current is task:
            self.current = None
        if new_id in successors:
            await self._moved_again(task, chunk, response, *successors[new_id])
            return True
        logger.warning(
            "task %s: a write to it was answered with task id %r, a task the service made for"
            " it: its rows are read from that task, and no more rows go to %s",
            task.task_id,
            new_id,
            task.task_id,
            extra={"task_id": task.task_id},
        )
        seq, token = self._new_token()
        token += MOVED  # (no description of ours: see TaskWrites.description)
        now = self.clock()
        moved = OpenTask(seq=seq, token=token, opened=now, expires=now, closing=True, sealed=True)
        successors[new_id] = (task, moved)  # (claimed before the check's await)
        await self._check_new_id(new_id, chunk, f"a write to task {task.task_id}")
        opened = self._opened_ops(moved, new_id, response.expires_at)
        await self._accept(moved, chunk, response, opened)
        moved.created.set()
        self.tasks.pop(new_id, None)
        self._moved_from.setdefault(task.task_id, []).append(new_id)
        return True

    def _watch_moved(self, task_id: str) -> None:
        """The tasks writes to ``task_id`` were moved to are watched once it is sealed (no
        write to it on its way: one that was may be answered with the id of one of them, its
        rows in that task, which was read before they were taken into it)."""
        for new_id in (self._moved_from or {}).pop(task_id, ()):
            self.book.watch(new_id, "", created=True)  # (no description: the service chose it)

    async def _moved_again(
        self,
        task: OpenTask,
        chunk: Chunk,
        response: BulkTaskResponse,
        origin: OpenTask,
        moved: OpenTask,
    ) -> None:
        """A write to ``task`` answered with the id of a task an earlier write to it was
        moved to (``moved``; a write that was on its way): its rows are in that task too.
        Before, the id was taken for one the service had handed out twice, and the run
        stopped with every row in a task. A write to another task answered so stops the run
        (that task may be read already), naming both."""
        await moved.created.wait()
        assert moved.task_id is not None
        if origin is not task or moved.task_id in self.book.entries:
            await self.journal.commit(ops=[changes.chunk_orphan(chunk.chunk_id, moved.task_id)])
            raise FatalRunError(
                f"a write to task {task.task_id} was answered with task id {moved.task_id!r},"
                f" the task the service made for a write to task {origin.task_id}: its rows"
                " cannot be read exactly once; stopped with the state saved (the same command"
                " resumes, reading them from that task)"
            )
        await self._accept(moved, chunk, response)

    async def _names_a_task(self, task_id: str) -> bool:
        """Whether the service knows a task by the id a write's answer gave (its status read).
        An id of the write's own (a batch id a service hands out per append) names none: its
        rows are in the task written to ("appending keeps all images under one task id"),
        and were looked for under that id, unknown (404), then sent again: billed twice. An
        id the client cannot address names none either; no answer but a 404 says it does."""
        try:
            await self.client.task_status(task_id)
        except (exc.TaskNotFoundError, ValueError):
            return False
        except exc.FashiontagError:
            pass
        return True
