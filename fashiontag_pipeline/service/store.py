"""Task store of the reference service: compact per-image records, optional SQLite journal.

Per task, images are kept in parallel arrays, never as rendered results:

* ``ids``       the caller's ``context.id`` (list of str; the same objects back ``id_set``,
                the duplicate check, which is dropped once the task can no longer be appended to);
* ``hashes``    64-bit content hash (``array('Q')``, 8 bytes);
* ``masks``     resolved detection bit mask (``array('H')``, 2 bytes);
* ``outcomes``  only when some image can fail (fetch mode): 0 pending, 1 done, else the error
                code (``array('H')``);
* ``measured``  only in fetch mode: the packed colour measurement (~20 bytes) per image.

Results are rendered on read from (hash, measurement, mask, language). With a ``state_path``
every change is written through to SQLite (WAL, :mod:`.journal`) and the store is rebuilt from it
on start, so a restarted service still has every task and result. API keys are never stored: a
task's owner is a truncated SHA-256 fingerprint of the key.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .analyzer import Analysis
from .journal import Journal
from .pending import PendingQueue
from .records import OUTCOME_DONE, OUTCOME_PENDING, PendingRange, TaskRecord, iso

__all__ = [
    "OUTCOME_DONE",
    "OUTCOME_PENDING",
    "PendingRange",
    "TaskRecord",
    "TaskStore",
    "iso",
]


class TaskStore:
    """All tasks of the service, by id and by owner, with their pending work queue."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        task_ttl: float,
        result_ttl: float,
        state_path: Path | None = None,
    ) -> None:
        self.clock = clock
        self.task_ttl = task_ttl
        self.result_ttl = result_ttl
        self.tasks: dict[str, TaskRecord] = {}
        self.by_owner: dict[bytes, list[TaskRecord]] = {}
        # Per owner, the tasks that may still be live (pruned when counted).
        self._live: dict[bytes, list[TaskRecord]] = {}
        self.pending = PendingQueue()
        self.on_pending: Callable[[], None] = lambda: None
        self._seq = 0
        self._journal = Journal(state_path) if state_path is not None else None
        if self._journal is not None:
            self._load(self._journal)

    # ------------------------------------------------------------------ queries

    def get(self, task_id: str, owner: bytes) -> TaskRecord | None:
        """The task, if it exists and belongs to ``owner``."""
        task = self.tasks.get(task_id)
        if task is None or task.owner != owner:
            return None
        return task

    def tasks_of(self, owner: bytes) -> list[TaskRecord]:
        """The owner's tasks in creation order (oldest first)."""
        return self.by_owner.get(owner, [])

    def live_count(self, owner: bytes) -> int:
        """How many of the owner's tasks are live (:meth:`TaskRecord.is_live`)."""
        now = self.clock()
        live = [t for t in self._live.get(owner, ()) if t.is_live(now)]
        self._live[owner] = live
        return len(live)

    @property
    def image_count(self) -> int:
        return sum(t.total for t in self.tasks.values())

    # ------------------------------------------------------------------ writes

    def create_task(
        self,
        *,
        task_id: str,
        owner: bytes,
        album_name: str,
        description: str | None,
        default_detection: int,
    ) -> TaskRecord:
        now = self.clock()
        self._seq += 1
        task = TaskRecord(
            task_id=task_id,
            owner=owner,
            album_name=album_name,
            description=description,
            created=now,
            expire_at=now + self.task_ttl,
            default_detection=default_detection,
            seq=self._seq,
        )
        self.tasks[task_id] = task
        self.by_owner.setdefault(owner, []).append(task)
        self._live.setdefault(owner, []).append(task)
        if self._journal is not None:
            self._journal.insert_task(task)
        return task

    def accept(
        self,
        task: TaskRecord,
        ids: list[str],
        hashes: list[int],
        masks: list[int],
        *,
        urls: list[str] | None,
        processed: bool,
        extend: bool,
    ) -> None:
        """Append accepted images. ``processed`` marks them tagged at once (rate 0, no fetch);
        otherwise they are queued for the worker (``urls`` when they must be downloaded)."""
        start = task.total
        n = len(ids)
        undo = _Undo.of(task)
        if n:
            task.ids.extend(ids)
            if task.id_set is not None:
                task.id_set.update(ids)
            task.hashes.extend(hashes)
            task.masks.extend(masks)
            if urls is not None:
                if task.outcomes is None or task.measured is None:
                    task.outcomes = array("H", [OUTCOME_DONE]) * start
                    task.measured = [None] * start
                task.outcomes.extend(array("H", [OUTCOME_PENDING]) * n)
                task.measured.extend([None] * n)
            elif task.outcomes is not None:
                task.outcomes.extend(array("H", [OUTCOME_PENDING]) * n)
                if task.measured is not None:
                    task.measured.extend([None] * n)
            task.total += n
            if extend:
                task.expire_at += self.task_ttl
            if processed:
                task.processed += n
                if task.outcomes is not None:
                    for i in range(start, start + n):
                        task.outcomes[i] = OUTCOME_DONE
            # Results expire ``result_ttl`` after the task was last done: images appended to
            # a done task (tagged at once here) must be readable as long as the first ones.
            task.done_at = None
        self._update_done(task)
        if self._journal is not None:
            try:
                self._journal.insert_images(task, start, ids, hashes, masks, urls, processed)
            except BaseException:
                # Not saved, so not accepted: the task is as it was (a retried write is then
                # accepted afresh, never taken for a duplicate of images nobody will tag).
                undo.restore(task, ids)
                raise
        if n and not processed:
            self.pending.append((task, start, start + n, urls))
            self.on_pending()

    def complete_range(self, task: TaskRecord, start: int, end: int) -> None:
        """Mark images ``start..end`` tagged (no-fetch processing, in order)."""
        if task.purged:
            return
        task.processed += end - start
        if task.outcomes is not None:
            for i in range(start, end):
                task.outcomes[i] = OUTCOME_DONE
        self._update_done(task)
        if self._journal is not None:
            self._journal.complete_range(task, start, end)

    def record(self, task: TaskRecord, index: int, analysis: Analysis | None, error: int) -> None:
        """Record one fetched image: its analysis, or the error code of its failure."""
        if task.purged:
            return
        assert task.outcomes is not None and task.measured is not None
        if analysis is not None:
            task.hashes[index] = analysis.content_hash
            task.measured[index] = analysis.measured
            task.outcomes[index] = OUTCOME_DONE
        else:
            task.outcomes[index] = error
            task.failures += 1
        task.processed += 1
        self._update_done(task)
        if self._journal is not None:
            self._journal.record(task, index, analysis, error)

    def _update_done(self, task: TaskRecord) -> None:
        if task.processed >= task.total:
            if task.done_at is None:
                task.done_at = self.clock()
                task.result_expire_at = task.done_at + self.result_ttl
        else:
            task.done_at = None
            task.result_expire_at = None

    def sweep(self) -> None:
        """Free what expiry made unreachable: duplicate sets of tasks that can no longer be
        appended to, and the images of tasks whose results expired (their header stays so
        that reads answer 410, not 404), then, one result TTL later, the task itself (a
        long-lived service would otherwise keep every task it was ever given)."""
        now = self.clock()
        forgotten: list[TaskRecord] = []
        for task in self.tasks.values():
            if task.id_set is not None and now >= task.expire_at:
                task.id_set = None
            if task.result_expire_at is None or now < task.result_expire_at:
                continue
            if not task.purged:
                self._purge(task)
            if now >= task.expire_at and now >= task.result_expire_at + self.result_ttl:
                forgotten.append(task)
        if forgotten:
            self._forget(forgotten)

    def _forget(self, tasks: list[TaskRecord]) -> None:
        """Drop tasks entirely. The owners' lists are replaced, never changed in place: a list
        answer being written (it yields between slices) keeps the list it started with."""
        gone = {task.task_id for task in tasks}
        for task_id in gone:
            del self.tasks[task_id]
        owners = {task.owner for task in tasks}
        for index in (self.by_owner, self._live):
            for owner in owners:
                kept = [t for t in index.get(owner, ()) if t.task_id not in gone]
                if kept:
                    index[owner] = kept
                else:
                    index.pop(owner, None)
        if self._journal is not None:
            self._journal.forget(gone)

    def _purge(self, task: TaskRecord) -> None:
        task.purged = True
        task.ids = []
        task.id_set = None
        task.hashes = array("Q")
        task.masks = array("H")
        task.outcomes = None
        task.measured = None
        if self._journal is not None:
            self._journal.purge(task)

    def has_id(self, task: TaskRecord, image_id: str) -> bool:
        if task.id_set is None:
            task.id_set = set(task.ids)
        return image_id in task.id_set

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    # ------------------------------------------------------------------ persistence

    def _load(self, journal: Journal) -> None:
        for task in journal.load_tasks():
            self.tasks[task.task_id] = task
            self.by_owner.setdefault(task.owner, []).append(task)
            self._live.setdefault(task.owner, []).append(task)
            self._seq = max(self._seq, task.seq)
            if task.purged:
                continue
            pending_start: int | None = None
            pending_urls: list[str] | None = None
            for index, (image_id, h, mask, outcome, measured, url) in enumerate(
                journal.load_images(task.task_id)
            ):
                task.ids.append(image_id)
                task.hashes.append(h)
                task.masks.append(mask)
                if task.outcomes is not None:
                    task.outcomes.append(outcome)
                if task.measured is not None:
                    task.measured.append(measured)
                if outcome != OUTCOME_PENDING:
                    task.processed += 1
                    if outcome != OUTCOME_DONE:
                        task.failures += 1
                    if pending_start is not None:
                        self.pending.append((task, pending_start, index, pending_urls))
                        pending_start, pending_urls = None, None
                elif pending_start is None:
                    pending_start = index
                    pending_urls = [url] if url is not None else None
                elif pending_urls is not None and url is not None:
                    pending_urls.append(url)
            task.total = len(task.ids)
            task.id_set = set(task.ids) if self.clock() < task.expire_at else None
            if pending_start is not None:
                self.pending.append((task, pending_start, task.total, pending_urls))


@dataclass(frozen=True)
class _Undo:
    """What :meth:`TaskStore.accept` changes in a task, to put back if saving it fails."""

    images: int
    outcomes: int | None
    measured: int | None
    expire_at: float
    processed: int
    done_at: float | None
    result_expire_at: float | None

    @classmethod
    def of(cls, task: TaskRecord) -> _Undo:
        return cls(
            len(task.ids),
            None if task.outcomes is None else len(task.outcomes),
            None if task.measured is None else len(task.measured),
            task.expire_at,
            task.processed,
            task.done_at,
            task.result_expire_at,
        )

    def restore(self, task: TaskRecord, ids: list[str]) -> None:
        n = self.images
        del task.ids[n:], task.hashes[n:], task.masks[n:]
        if task.id_set is not None:
            task.id_set.difference_update(ids)
        if self.outcomes is None:
            task.outcomes = None
        elif task.outcomes is not None:
            del task.outcomes[self.outcomes :]
        if self.measured is None:
            task.measured = None
        elif task.measured is not None:
            del task.measured[self.measured :]
        task.total = n
        task.expire_at = self.expire_at
        task.processed = self.processed
        task.done_at = self.done_at
        task.result_expire_at = self.result_expire_at
