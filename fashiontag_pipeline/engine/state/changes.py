"""Every change a stage makes to the state, as a named value the journal applies.

Stages never write SQL: they build changes with these functions and hand them to
:meth:`~.journal.Journal.commit`, which applies them in the transaction that also writes the
sinks. A change is a ``(statement, parameters)`` pair; the statements live here and in
:mod:`.store` only.

Task states: ``open`` (created; sealing it is not recorded: a resume closes and watches every
open task) -> ``done`` (recorded with its first result page) -> ``drained`` (every result
written), or ``expired`` (results expired unread: rejects written) or ``lost`` (the service
forgot it: its chunks are settled by sending their unwritten rows again). Chunk states:
``pending`` (written ahead, fate unknown) -> ``accepted`` | ``orphan`` (fate unknown, task no
longer writable) | ``resolved`` (settled some other way: rejected, or re-sent in a new chunk).
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "NEVER",
    "STDIN_DIGEST",
    "Change",
    "Stamp",
    "chunk_accepted",
    "chunk_counted",
    "chunk_detached",
    "chunk_orphan",
    "chunk_resolved",
    "chunk_sending",
    "chunk_state",
    "chunk_task",
    "chunk_token",
    "single_done",
    "single_failed",
    "single_pending",
    "single_tagged",
    "stdin_digest",
    "task_done",
    "task_drained",
    "task_expiry",
    "task_opened",
    "task_purged",
    "task_read_upto",
    "task_state",
    "validated_upto",
]

Change = tuple[str, tuple[Any, ...]]
TaskState = Literal["sealed", "drained", "expired", "lost"]
ChunkState = Literal["orphan", "resolved"]


def validated_upto(job: int, watermark: int) -> Change:
    """Every row of ``job`` at a position <= ``watermark`` is validated (its V)."""
    return (
        "UPDATE jobs SET validated=? WHERE job=? AND validated < ?",
        (watermark, job, watermark),
    )


def stdin_digest(job: int, watermark: int, crc: int, mark: str = "") -> Change:
    """The digest of the rows ``job`` read from stdin up to ``watermark`` (its V): a resume
    fed other rows (tonight's dump, the same ids with other URLs) is refused by it. ``mark``
    says how rows were encoded for it (``k``: JSONL keys sorted; none: as read)."""
    value = f"{watermark}:{crc}:{mark}" if mark else f"{watermark}:{crc}"
    return (
        "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (f"{STDIN_DIGEST}{job}", value),
    )


#: The meta key (followed by the job number) of :func:`stdin_digest`.
STDIN_DIGEST = "stdin_digest:"


def task_opened(
    task_id: str, seq: int, token: str, expires_at: float | None, task_seq: int
) -> list[Change]:
    """A task was created (or adopted after an ambiguous create)."""
    return [
        (
            "INSERT INTO tasks (task_id, seq, token, state, expires_at)"
            " VALUES (?, ?, ?, 'open', ?) ON CONFLICT DO NOTHING",
            (task_id, seq, token, expires_at),
        ),
        (
            "INSERT INTO meta VALUES ('task_seq', ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(task_seq),),
        ),
    ]


def task_purged(task_id: str) -> Change:
    """A finished task whose results expired, its id given by the service to a new task:
    its record goes (the new task's takes its place)."""
    return ("DELETE FROM tasks WHERE task_id=? AND state IN ('drained', 'expired')", (task_id,))


def task_state(task_id: str, state: TaskState) -> Change:
    return ("UPDATE tasks SET state=? WHERE task_id=?", (state, task_id))


def task_expiry(task_id: str, expires_at: float | None) -> Change:
    """The service's latest ``taskExpiredAt`` (its clock, epoch seconds)."""
    return ("UPDATE tasks SET expires_at=? WHERE task_id=?", (expires_at, task_id))


def task_done(task_id: str, total: int, results_expire_at: float | None) -> Change:
    return (
        "UPDATE tasks SET state='done', total=?, results_expire_at=? WHERE task_id=?",
        (total, results_expire_at, task_id),
    )


def task_read_upto(task_id: str, offset: int) -> Change:
    """Result pages before ``offset`` are written."""
    return ("UPDATE tasks SET next_offset=? WHERE task_id=?", (offset, task_id))


def task_drained(task_id: str, state: TaskState = "drained") -> list[Change]:
    """The task is finished with (``drained`` or ``expired``): its accepted and resolved
    chunks (rows and bodies) are no longer needed and are deleted, so a state that lives for
    weeks (the daemon's) grows with the tasks in flight, not with every chunk it ever sent.
    Chunks of unknown fate stay until they are settled."""
    return [
        task_state(task_id, state),
        (
            "DELETE FROM chunk_bodies WHERE chunk_id IN (SELECT chunk_id FROM chunks"
            " WHERE task_id=? AND state IN ('accepted', 'resolved'))",
            (task_id,),
        ),
        (
            "DELETE FROM chunks WHERE task_id=? AND state IN ('accepted', 'resolved')",
            (task_id,),
        ),
    ]


#: A moment as a chunk's row records it: (the state's clock: its ``wall()``; the service's
#: clock: :meth:`~..._clock.ServerClock.stamp`, -1 before any ``Date``). (0, 0): never.
Stamp = tuple[float, float]
NEVER: Stamp = (0.0, 0.0)


def chunk_token(chunk_id: int, token: str, at: Stamp) -> Change:
    """The chunk is about to create the task whose description carries ``token`` (``at``: now,
    see :func:`chunk_sending`)."""
    return (
        "UPDATE chunks SET task_id=NULL, token=?, written_at=?, service_at=? WHERE chunk_id=?",
        (token, *at, chunk_id),
    )


def chunk_sending(chunk_id: int, at: Stamp) -> Change:
    """The chunk's create was sent (again) at ``at``, or its last send of unknown fate was
    then: a resume looks for its task as long as it may be applied after that
    (``chunks.written_at`` and ``service_at``; :data:`NEVER`: no send of unknown fate, one
    look at the task list)."""
    return ("UPDATE chunks SET written_at=?, service_at=? WHERE chunk_id=?", (*at, chunk_id))


def chunk_task(chunk_id: int, task_id: str) -> Change:
    """The chunk is about to be appended to ``task_id``."""
    return ("UPDATE chunks SET task_id=? WHERE chunk_id=?", (task_id, chunk_id))


def chunk_detached(chunk_id: int) -> Change:
    """The chunk's write was refused (not applied): it belongs to no task for now."""
    return ("UPDATE chunks SET task_id=NULL WHERE chunk_id=?", (chunk_id,))


def chunk_accepted(chunk_id: int, task_id: str, n_ok: int) -> Change:
    """The service answered the chunk's write: ``n_ok`` of its rows are in the task."""
    return (
        "UPDATE chunks SET state='accepted', task_id=?, n_ok=? WHERE chunk_id=?",
        (task_id, n_ok, chunk_id),
    )


def chunk_orphan(chunk_id: int, task_id: str, counted: int | None = None) -> Change:
    """The chunk's fate is unknown and its task takes no more writes: settled from that task's
    results (its task is recorded: after an ambiguous create the row had only the token).
    ``counted``: its rows counted as submitted already (a write answered 2xx with no body:
    all of them); None: none, each is counted when its task returns it (``chunk_counted``)."""
    return (
        "UPDATE chunks SET state='orphan', task_id=?, n_ok=? WHERE chunk_id=?",
        (task_id, counted, chunk_id),
    )


def chunk_counted(chunk_id: int, counted: int) -> Change:
    """``counted`` rows of a chunk of unknown fate are counted as submitted (those its task
    returned), in the transaction that adds them to the counter: never counted twice."""
    return ("UPDATE chunks SET n_ok=? WHERE chunk_id=?", (counted, chunk_id))


def chunk_state(chunk_id: int, state: ChunkState) -> Change:
    return ("UPDATE chunks SET state=? WHERE chunk_id=?", (state, chunk_id))


def chunk_resolved(chunk_id: int) -> list[Change]:
    """Every row of the chunk has its outcome (or was handed to another chunk): its body is
    read no more (a task's ids are read when its draining starts, before any of its chunks is
    resolved) and goes, so a daemon's state does not keep every such chunk's rows for ever."""
    return [
        chunk_state(chunk_id, "resolved"),
        ("UPDATE chunks SET body=NULL WHERE chunk_id=?", (chunk_id,)),
        ("DELETE FROM chunk_bodies WHERE chunk_id=?", (chunk_id,)),
    ]


def single_pending(pos: int, body: bytes) -> Change:
    """A row routed to the single endpoint, written ahead of its request."""
    return (
        "INSERT INTO singles (pos, state, body) VALUES (?, 'pending', ?) ON CONFLICT DO NOTHING",
        (pos, body),
    )


def single_done(pos: int) -> list[Change]:
    """A routed row's outcome is written: its failures counted (if any) go with its body."""
    return [
        ("UPDATE singles SET state='done', body=NULL WHERE pos=?", (pos,)),
        ("DELETE FROM meta WHERE key=?", (f"{SINGLE_FAILS}{pos}",)),
    ]


#: The meta key (followed by the row's position) of a routed row's failures that single it
#: out (a poison image's), kept across runs; and the key saying the single endpoint has tagged
#: an image of the run.
SINGLE_FAILS = "single_fails:"
SINGLE_TAGGED = "single_tagged"


def single_failed(pos: int, times: int) -> Change:
    """A routed row's request failed in a way that singles the image out, ``times`` in all."""
    return (
        "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (f"{SINGLE_FAILS}{pos}", str(times)),
    )


def single_tagged() -> Change:
    """The single endpoint tagged an image of the run (it works for images)."""
    return ("INSERT INTO meta VALUES (?, '1') ON CONFLICT DO NOTHING", (SINGLE_TAGGED,))
