"""Taking a validated batch into the run: the run-wide dedupe of its ids, its rejects and the
validated watermark, in one transaction of the state thread.

:class:`Intake` is a part of :class:`~.journal.Journal` (same thread, same transactions): a
crash before its commit leaves nothing of the batch (it is read again from the watermark V),
and the first row of each id wins, whatever else is wrong with a later one.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from ..sinks import Reject, ReusedLine
from .changes import Change, validated_upto
from .store import StateStore

if TYPE_CHECKING:
    from ..jobs import Jobs
    from .journal import ReuseLedger

#: A rejects line and the job whose outputs it goes to.
JobReject = tuple[int, Reject]

__all__ = ["Intake", "JobReject"]

_position = operator.itemgetter(1)

T = TypeVar("T")


class _Applies(Protocol):
    def __call__(
        self,
        page: Any,
        rejects: Sequence[JobReject],
        ops: Sequence[Change],
        counters: dict[str, int],
        by_job: dict[int, dict[str, int]] | None,
        settle: bool,
        page_job: int | None,
        reused: tuple[int, list[ReusedLine]] | None = None,
        all_success: bool = False,
    ) -> tuple[int, int, set[int]]: ...


class Intake:
    """The intake half of the journal (mixed into :class:`~.journal.Journal`)."""

    db: StateStore
    jobs: Jobs
    reuse: ReuseLedger | None
    _apply: _Applies

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    def _begun(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    async def intake(
        self,
        job: int,
        keyed: Sequence[tuple[str, int]],
        rejects: list[JobReject],
        make_dup: Callable[[str, int, int], JobReject | None],
        watermark: int,
        replay_upto: int,
        routed: Callable[[list[int]], Sequence[Change]] | None = None,
        plan: Any = None,
        claimed: Sequence[tuple[str, int, int]] = (),
        also: Sequence[Change] = (),
    ) -> list[int]:
        """Indexes of ``keyed`` (rows of ``job``) whose row is the first of its id and is to
        be sent; duplicates become rejects (unless at or below ``replay_upto``, already written
        by an earlier attempt); with ``plan`` (``--reuse``), rows answered from the result
        store are written and left out. ``claimed``: (id, position, index in ``rejects``)
        of the batch's rows refused by the client's checks, which are their id's first row
        all the same (and, when they are not, ``duplicate id`` rejects). ``also``: changes
        that commit with V (the digest of the rows read from stdin)."""
        keep: list[int]
        touched: set[int]
        keep, touched = await self.run(
            self._begun,
            self._intake,
            job,
            keyed,
            rejects,
            make_dup,
            watermark,
            replay_upto,
            routed,
            plan,
            claimed,
            also,
        )
        self.jobs.check(touched)
        return keep

    def _intake(
        self,
        job: int,
        keyed: Sequence[tuple[str, int]],
        rejects: list[JobReject],
        make_dup: Callable[[str, int, int], JobReject | None],
        watermark: int,
        replay_upto: int,
        routed: Callable[[list[int]], Sequence[Change]] | None,
        plan: Any,
        claimed: Sequence[tuple[str, int, int]] = (),
        also: Sequence[Change] = (),
    ) -> tuple[list[int], set[int]]:
        """Dedupe a validated batch, write its rejects and move V, in the transaction of
        :meth:`_begun` (with ``routed(kept indexes)``'s statements: the single-mode rows written
        ahead; with ``plan``, the ``--reuse`` lookup of the batch: rows answered from the result
        store are written in this transaction and not returned).

        One transaction: the ids, the rejects and V commit together, so a crash before the
        commit leaves nothing (the batch is read again from V). The ids used to commit on
        their own, a second transaction per batch for nothing the promise needs."""
        firsts = (
            self._dedupe(keyed, claimed, rejects, make_dup) if claimed else self.db.dedupe(keyed)
        )
        out: list[int]
        if firsts is None:  # every row is its id's first (the common case)
            out = list(range(len(keyed)))
            fresh = len(keyed) if replay_upto < 0 else sum(p > replay_upto for _, p in keyed)
        else:
            out = []
            fresh = 0
            for i, ((_, pos), first) in enumerate(zip(keyed, firsts, strict=True)):
                if first == pos:
                    out.append(i)
                    fresh += pos > replay_upto  # a replayed row (at or below V) was counted
                elif pos > replay_upto:
                    dup = make_dup(keyed[i][0], pos, first)
                    if dup is not None:
                        rejects.append(dup)
        ops: list[Change] = [validated_upto(job, watermark), *also]
        reused: tuple[int, list[ReusedLine]] | None = None
        if plan is not None and self.reuse is not None:  # --reuse
            out, hits, reuse_ops = self.reuse.settle(self.db.db, job, plan, keyed, out, replay_upto)
            ops.extend(reuse_ops)
            original = self.jobs.original
            reused = (
                job,
                [
                    ReusedLine(original(keyed[i][0]), hit.task_id, msgspec.Raw(hit.result))
                    for i, hit in hits
                ],
            )
        if routed is not None:
            ops.extend(routed(out))
        counters = {"accepted": fresh}
        touched = self._apply(None, rejects, ops, counters, {job: counters}, False, None, reused)[2]
        return out, touched

    def _dedupe(
        self,
        keyed: Sequence[tuple[str, int]],
        claimed: Sequence[tuple[str, int, int]],
        rejects: list[JobReject],
        make_dup: Callable[[str, int, int], JobReject | None],
    ) -> list[int] | None:
        """:meth:`StateStore.dedupe` of ``keyed`` with the ids of ``claimed`` rows (refused
        by the client: id, position, index of its reject in ``rejects`` or -1) taken in too,
        in position order (the first row of an id wins). A refused row that is not its id's
        first has its reject replaced by a ``duplicate id`` one: every later row of an id is
        that (README), whatever else is wrong with it, so an id never has two outcomes."""
        combined = sorted([*keyed, *((key, pos) for key, pos, _ in claimed)], key=_position)
        firsts = self.db.dedupe(combined)
        if firsts is None:
            return None
        first_at = {pos: first for (_, pos), first in zip(combined, firsts, strict=True)}
        for key, pos, index in claimed:
            first = first_at[pos]
            if first != pos and index >= 0:
                dup = make_dup(key, pos, first)
                if dup is not None:
                    rejects[index] = dup
        return [first_at[pos] for _, pos in keyed]
