"""Rows of a resume's window whose fate an earlier build's rules decided otherwise than this
build's: rows it took in that this build refuses (:func:`refused_since`), and rows it refused
that this build reads (:func:`rejected_before`).

A resume validates the rows of each job's window (W, V] again and sends the ones it accepts; it
writes no reject there, since the run wrote each reject of those rows with V. A row that the
earlier build took in (its id recorded at its line, no reject written, not routed to the single
endpoint, not answered from the result store) but this build refuses would then be neither
sent nor rejected: counted as taken in, never settled, 'run incomplete: 1 rows have no
outcome' on every run again. :func:`refused_since` finds them, so that their rejects are written
as the outcomes of rows taken in.

The other way round: a row the earlier build refused (a JSONL line escaping half of a UTF-16
surrogate pair, a CSV row without the cell its header's trailing delimiter named), its reject
written with V, that this build reads would be sent too: a reject and a result for one row
(more outcomes than rows taken in: 'the state cannot be trusted', exit 3). Its reject is its
outcome: :func:`rejected_before` leaves it out of what is sent (and of the dedupe: the run never
took its id in there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .jobs import Job, Jobs
from .sinks import LineSet, Reject
from .state import JobReject, Journal, reuse_rows, split_position

__all__ = ["refused_since", "rejected_before"]


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
    written = await _reject_lines(job, name, journal, lines)
    return [(job.id, r) for pos, r in taken if split_position(pos)[1] not in written]


async def rejected_before(
    items: list[Any],
    singles: list[Any],
    window: tuple[int, int],
    job: Job,
    name: str,
    journal: Journal,
    lines: dict[int, dict[str, LineSet]],
) -> tuple[list[Any], list[Any]]:
    """``items`` and ``singles`` (rows of ``job``'s manifest ``name`` this build accepts)
    without those in ``window`` (W, V] whose line has a reject: the run refused them (an
    earlier build's rules), and that reject is their outcome (see the module). ``lines``: as
    for :func:`refused_since`."""
    low, high = window
    at = [pos for rows in (items, singles) for _, pos, _ in rows if low < pos <= high]
    if not at:
        return items, singles
    written = await _reject_lines(job, name, journal, lines)
    gone = {pos for pos in at if split_position(pos)[1] in written}
    if not gone:
        return items, singles
    return [r for r in items if r[1] not in gone], [r for r in singles if r[1] not in gone]


async def _reject_lines(
    job: Job, name: str, journal: Journal, lines: dict[int, dict[str, LineSet]]
) -> LineSet:
    """The lines of ``job``'s manifest ``name`` with a reject (one scan of its rejects file
    per job and manifest, kept in ``lines``: the rejects this resume writes there later are
    those of rows it refuses, never asked about)."""
    known = lines.setdefault(job.id, {})
    if name not in known:
        known[name] = await journal.run(job.rejects.lines_of, name)
    return known[name]


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
