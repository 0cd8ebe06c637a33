"""Intake: the stage between the source and the writer (validate, dedupe, route).

Each row batch is validated (:class:`~.validate.Validator`: every rule a client can check, one
``client`` reject per bad row), deduplicated run-wide in the state store (the first row of an
id wins, each later row is a ``duplicate id`` reject), and routed: URL rows to the bulk writer,
local files and ``data:`` images to the single endpoint. The batch's rejects, its new ids and
the validated watermark (V) are committed in one transaction before any of its rows is sent.

Each batch belongs to one job (its manifest's), with that job's watermarks: on resume, rows at or
below the job's chunked watermark (W) are skipped, and rows up to its V were validated before:
their rejects are not written again. When several jobs may share a task, rows get the ids they
are sent with (``JOB/ID``) here. :class:`~.jobs.JobEnd` (a job read to the end) and
:data:`IDLE` (nothing to read right now) pass through.

With ``--reuse`` (``reuse``: a :class:`~.reuse.ReuseHook`), each batch's bulk rows are looked
up in the result store first; the journal writes the rows answered from it in the batch's
transaction and hands back only the rows to send.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .jobs import Job, JobEnd, Jobs
from .manifests import STDIN
from .policy import Measured
from .rows import RowBatch
from .rules import LONG_ID, id_error, unkeyable
from .single import merge_routes, pending_ops, split_routes
from .sinks import LineSet
from .state import POS_SHIFT, JobReject, Journal, KeyedColumns, split_position
from .stdin_replay import StdinDigest, check_replayed
from .taken_before import refused_since, rejected_before
from .validate import STAGE_CLIENT, Item, SingleItem, Validator

if TYPE_CHECKING:
    from .reuse import ReuseHook  # (only a run with --reuse loads it)

__all__ = ["IDLE", "Idle", "intake"]


class Idle:
    """The source has nothing to read right now (every job in flight is read to the end):
    the writer sends what it holds and seals its open task, so results flow."""


IDLE = Idle()


def _namespaced(items: list[Item], job: int, jobs: Jobs) -> list[Item]:
    """The rows with the ids they are sent with (``JOB/ID``: see :class:`~.jobs.IdSpace`).

    Each request was built for this row alone by the validator, so its context takes the
    sent id in place (a new struct per row cost ~10% of the daemon's CPU); a plain row's
    request, its URL (:mod:`.plainbody`), is sent with the item's id."""
    sent = jobs.ids.sent
    out: list[Item] = []
    append = out.append
    for ident, pos, request in items:
        key = sent(job, ident)
        if not isinstance(request, str):
            request.context.id = key
        append((key, pos, request))
    return out


async def _stdin_ended(job: Job, digests: dict[int, StdinDigest], journal: Journal) -> None:
    """A job read to the end, or to a manifest after stdin: if it read stdin, its replay
    reached the rows it resumes from (:meth:`StdinDigest.ended`; also when stdin held no row
    at all)."""
    digest = digests.get(job.id)
    if digest is None:
        source = next((src for src, name in job.row.sources if name == STDIN), None)
        if source is None:
            return
        digest = await StdinDigest.load(journal, job.id, source, job.row.validated)
        digests[job.id] = digest
    digest.ended()


def _stdin_before(job: Job, source: int) -> bool | None:
    """Whether ``job`` read stdin before its manifest ``source`` (None: it reads no stdin)."""
    stdin = next((src for src, name in job.row.sources if name == STDIN), None)
    return None if stdin is None else stdin < source


def _forget(ended: int, jobs: Jobs, past: set[int], *per_job: dict[int, Any]) -> None:
    """A job read to its end (its last batch passed) and every job dropped since (failed:
    its rows on their way are skipped) leave the intake's marks: kept, they grew with every
    job of a long-lived engine (a daemon's thousand manifests a day), for its whole life."""
    for job in [ended, *(j for j in past if j not in jobs.by_id)]:
        past.discard(job)
    for marks in per_job:
        for job in [ended, *(j for j in marks if j not in jobs.by_id)]:
            marks.pop(job, None)


async def intake(
    receive: anyio.abc.ObjectReceiveStream[RowBatch | JobEnd | Idle],
    send: anyio.abc.ObjectSendStream[list[Item]],
    single_send: anyio.abc.ObjectSendStream[list[SingleItem]],
    *,
    validator: Validator,
    journal: Journal,
    jobs: Jobs,
    reuse: ReuseHook | None = None,
) -> None:
    """Validate, dedupe and route every batch of ``receive`` (see the module docstring)."""
    namespaced = jobs.ids.namespaced
    #: Per job resumed from stdin: its old rejects' lines (see check_replayed).
    replay_rejects: dict[int, LineSet] = {}
    #: Per job reading stdin: the digest of its rows (see StdinDigest).
    digests: dict[int, StdinDigest] = {}
    #: Jobs whose stdin (if any) was read to its end before their current manifest.
    past_stdin: set[int] = set()
    #: Per job and manifest resumed: the lines with a reject (see refused_since).
    reject_lines: dict[int, dict[str, LineSet]] = {}
    async with receive, send, single_send:
        async for batch in receive:
            if isinstance(batch, JobEnd):
                job_done = jobs.by_id.get(batch.job)
                if job_done is not None:
                    await _stdin_ended(job_done, digests, journal)
                    job_done.read_all = True
                    jobs.check([batch.job])
                marks = () if reuse is None else (reuse.reuse_from,)
                _forget(batch.job, jobs, past_stdin, digests, replay_rejects, reject_lines, *marks)
                continue
            if isinstance(batch, Idle):
                await send.send([])
                continue
            job = jobs.of_source(batch.source)
            if job is None:
                continue  # the job was dropped (failed) while its rows were on their way
            chunked, validated = job.row.chunked, job.row.validated
            if batch.name != STDIN and job.id not in past_stdin:
                before = _stdin_before(job, batch.source)
                if before is not False:
                    # stdin (read first) ended: its replay must have reached V's rows before
                    # any row of a later manifest is sent.
                    if before:
                        await _stdin_ended(job, digests, journal)
                    past_stdin.add(job.id)
            if (
                batch.name == STDIN
                and batch.rows
                and ((batch.source << POS_SHIFT) | batch.rows[0][0]) <= max(chunked, validated)
            ):
                await check_replayed(
                    batch, max(chunked, validated), validator, journal, jobs, replay_rejects
                )
            also: list[Any] = []
            if batch.name == STDIN:
                digest = digests.get(job.id)
                if digest is None:
                    digest = await StdinDigest.load(journal, job.id, batch.source, validated)
                    digests[job.id] = digest
                change = digest.feed(batch.rows)
                if change is not None:
                    also.append(change)
            items, singles, client_rejects = validator.route(batch, skip_upto=chunked)
            if (
                (items or singles)
                and validated > chunked
                and ((batch.source << POS_SHIFT) | batch.rows[0][0]) <= validated
            ):
                # Rows of a resume's window the run refused (an earlier build's checks):
                # their rejects are their outcomes, they are not sent.
                items, singles = await rejected_before(
                    items, singles, (chunked, validated), job, batch.name, journal, reject_lines
                )
            #: What the validator measured of the rows' text (the writer's cut by bytes).
            measured: int | None = getattr(items, "size", None)
            fresh: list[JobReject] = []
            #: Position of a refused row -> its reject's index in ``fresh`` (a later row of an
            #: id is a ``duplicate id`` reject whatever else is wrong with it: see claimed).
            fresh_at: dict[int, int] = {}
            window: list[Any] = []
            for pos, r in client_rejects:
                if pos > validated:
                    fresh_at[pos] = len(fresh)
                    fresh.append((job.id, r))
                elif pos > chunked:
                    window.append((pos, r))
            # Rows of a resume's window refused now that the run took in (an earlier build's
            # checks let them through): their rejects are their outcomes.
            late = (
                await refused_since(window, job, batch.name, journal, jobs, reject_lines)
                if window
                else []
            )
            last = batch.rows[-1][0]
            watermark = (batch.source << POS_SHIFT) | last
            if not items and not singles and not fresh and not late and watermark <= validated:
                continue
            if namespaced:
                items = _namespaced(items, job.id, jobs)
            rows: list[Any] = items
            routed = None
            if singles:
                # Both routes in position order: the first row of an id wins.
                rows = merge_routes(items, singles)

                def routed(
                    keep: list[int], rows: list[Any] = rows, validated: int = validated
                ) -> list[tuple[str, Any]]:
                    return pending_ops(split_routes(rows, keep, validated)[1])

            columns = getattr(rows, "columns", None)  # (a block's: policy.Measured)
            keyed: Sequence[tuple[str, int]] = (
                KeyedColumns(*columns)
                if columns is not None
                else [(ident, pos) for ident, pos, _ in rows]
            )
            if namespaced and singles:
                # Routed rows keep their own ids (no task holds them); their dedupe key is
                # namespaced like the bulk rows'.
                routed_at = {pos for _, pos, _ in singles}
                sent = jobs.ids.sent
                keyed = [(sent(job.id, i) if p in routed_at else i, p) for i, p in keyed]

            def make_dup(ident: str, pos: int, first: int) -> JobReject:
                ident = jobs.ids.split(ident)[1]
                line = split_position(first)[1]
                name = jobs.source_name(first)
                return jobs.reject(
                    pos,
                    ident,
                    f"duplicate id (first seen at {name} line {line})",
                    STAGE_CLIENT,
                )

            plan = await reuse.plan(rows) if reuse is not None and items else None
            # Rows refused by the checks above still hold their id's first row: a later row
            # of that id is its duplicate, not a second outcome of the id.
            sent = jobs.ids.sent
            claimed = [
                (sent(job.id, r.id), pos, fresh_at.get(pos, -1))
                for pos, r in client_rejects
                if r.id is not None and not unkeyable(r.id)  # (no store takes a NUL, ...)
            ]
            if any(r.id is not None and id_error(r.id) == LONG_ID for _, r in fresh):
                # (Builds before that limit misread such a reject: the state says so.)
                also.append(journal.db.long_ids_mark())
            keep = await journal.intake(
                job.id,
                keyed,
                fresh,
                make_dup,
                max(watermark, validated),
                validated,
                routed,
                plan,
                claimed,
                also,
            )
            if late:
                await journal.commit(rejects=late, settle=True, ops=[journal.db.long_ids_mark()])
            if singles:
                bulk, routed_rows = split_routes(rows, keep, validated)
                if routed_rows:
                    await single_send.send(routed_rows)
                if bulk:
                    await send.send(bulk)
            elif len(keep) == len(items):  # every row kept (the usual batch): no copy
                if measured is not None and not isinstance(items, Measured):
                    items = Measured(items, measured)  # (namespaced: a new list)
                await send.send(items)
            elif keep:
                kept = [items[i] for i in keep]
                await send.send(kept if measured is None else Measured(kept, measured))
