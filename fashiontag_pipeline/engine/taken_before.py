"""Rows a resume refuses that the run it resumes took in to send (an earlier build's rules let
them through: an id longer than 2,048 bytes, taken in before that limit).

A resume validates the rows of each job's window (W, V] again and sends the ones it accepts; it
writes no reject there, since the run wrote each reject of those rows with V. A row that the
earlier build took in (its id recorded at its line, no reject written, not routed to the single
endpoint, not answered from the result store) but this build refuses would then be neither
sent nor rejected: counted as taken in, never settled, 'run incomplete: 1 rows have no
outcome' on every run again. :func:`refused_since` finds them, so that their rejects are written
as the outcomes of rows taken in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .jobs import Job, Jobs
from .sinks import LineSet, Reject
from .state import JobReject, Journal, reuse_rows, split_position

__all__ = ["refused_since"]


async def refused_since(
    refused: Sequence[tuple[int, Reject]],
    job: Job,
    name: str,
    journal: Journal,
    jobs: Jobs,
    lines: dict[int, dict[str, LineSet]],
) -> list[JobReject]:
    """The rejects of ``refused`` (rows of ``job``'s manifest ``name`` in its window (W, V],
    refused by this build's checks) whose rows the run took in to send: see the module.
    ``lines``: per job and manifest, the lines with a reject (one scan of its rejects file)."""
    sent = jobs.ids.sent
    keyed = [
        (sent(job.id, r.id), pos, r)
        for pos, r in refused
        if r.id is not None and "\x00" not in r.id  # (never taken in by any build)
    ]
    if not keyed:
        return []
    taken = await journal.run(_taken_in, journal, job.id, keyed)
    if not taken:
        return []
    known = lines.setdefault(job.id, {})
    if name not in known:
        known[name] = await journal.run(job.rejects.lines_of, name)
    written = known[name]
    return [(job.id, r) for pos, r in taken if split_position(pos)[1] not in written]


def _taken_in(
    journal: Journal, job: int, keyed: Sequence[tuple[str, int, Reject]]
) -> list[tuple[int, Reject]]:
    """(State thread.) Those of ``keyed`` whose id the run took in at their very line, neither
    routed to the single endpoint nor answered from the result store."""
    db = journal.db
    first = db.first_positions([key for key, _, _ in keyed])
    taken = [(key, pos, r) for key, pos, r in keyed if first.get(key) == pos]
    if not taken:
        return []
    routed = db.routed_at([pos for _, pos, _ in taken])
    taken = [row for row in taken if row[1] not in routed]
    floor = reuse_rows.reuse_from(db.db, job) if taken else None
    if floor is not None:
        above = [key for key, pos, _ in taken if pos > floor]
        pending: Any = reuse_rows.pending_fingerprints(db.db, above) if above else {}
        # Above where reuse began, a row not pending was answered from the store.
        taken = [row for row in taken if row[1] <= floor or row[0] in pending]
    return [(pos, r) for _, pos, r in taken]
