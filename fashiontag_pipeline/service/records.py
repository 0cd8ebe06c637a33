"""In-memory records of the task store: one :class:`TaskRecord` per bulk task (see
:mod:`.store` for the per-image layout)."""

from __future__ import annotations

from array import array
from datetime import UTC, datetime

from .._models import TaskStatus, format_time
from .analyzer import Analysis

__all__ = ["OUTCOME_DONE", "OUTCOME_PENDING", "PendingRange", "TaskRecord", "iso"]

OUTCOME_PENDING = 0
OUTCOME_DONE = 1


def iso(moment: float | None) -> str | None:
    """Epoch seconds -> the service's RFC 3339 form (None stays None)."""
    if moment is None:
        return None
    return format_time(datetime.fromtimestamp(moment, UTC))


class TaskRecord:
    """One bulk task and its images (see the module docstring for the layout)."""

    __slots__ = (
        "album_name",
        "body_cache",
        "created",
        "default_detection",
        "description",
        "done_at",
        "expire_at",
        "failures",
        "hashes",
        "id_set",
        "ids",
        "masks",
        "measured",
        "outcomes",
        "owner",
        "processed",
        "purged",
        "result_expire_at",
        "seq",
        "task_id",
        "total",
    )

    def __init__(
        self,
        *,
        task_id: str,
        owner: bytes,
        album_name: str,
        description: str | None,
        created: float,
        expire_at: float,
        default_detection: int,
        seq: int,
    ) -> None:
        self.task_id = task_id
        self.owner = owner
        self.album_name = album_name
        self.description = description
        self.created = created
        self.expire_at = expire_at
        self.default_detection = default_detection
        self.seq = seq
        self.done_at: float | None = None
        self.result_expire_at: float | None = None
        self.ids: list[str] = []
        self.id_set: set[str] | None = set()
        self.hashes = array("Q")
        self.masks = array("H")
        self.outcomes: array[int] | None = None
        self.measured: list[bytes | None] | None = None
        self.total = 0
        self.processed = 0
        self.failures = 0
        self.purged = False
        #: (what the body depends on, the task's JSON body): the list and status answers.
        self.body_cache: tuple[tuple[object, ...], bytes] | None = None

    @property
    def status(self) -> TaskStatus:
        return TaskStatus.DONE if self.processed >= self.total else TaskStatus.PROCESSING

    def counts(self) -> tuple[int, int, int, int]:
        """(total, done, processing, failure) as DESIGN section 3 defines them."""
        return (
            self.total,
            self.processed - self.failures,
            self.total - self.processed,
            self.failures,
        )

    def is_live(self, now: float) -> bool:
        """Still processing or still open for appends. A task that is neither never becomes
        live again (appends after ``expire_at`` are refused)."""
        return self.processed < self.total or now < self.expire_at

    def analysis(self, index: int) -> Analysis:
        measured = self.measured[index] if self.measured is not None else None
        return Analysis(self.hashes[index], measured)

    def outcome(self, index: int) -> int:
        return self.outcomes[index] if self.outcomes is not None else OUTCOME_DONE


#: A run of accepted images waiting for the worker: (task, start, end, urls or None).
PendingRange = tuple[TaskRecord, int, int, list[str] | None]
