"""How a run uses the result store: three calls from the engine, nothing else.

1. :meth:`ReuseHook.plan` (intake, a worker thread of its own): fingerprints of a batch's bulk
   rows and the stored results found for them; one batched lookup, in parallel with the state
   thread.
2. :meth:`ReuseHook.settle` (the journal's intake transaction, state thread): of the rows kept
   by the run-wide dedupe, the fresh ones with a stored result are handed back to the journal,
   which writes their ``"reused": true`` lines in that transaction (counted ``reused`` and
   settled: they never reach the service); the others are recorded as pending with their
   fingerprint and sent. Rows a resume replays are filtered: one answered from the store by
   the earlier attempt is not sent.
3. :meth:`ReuseHook.store_page` (the journal's page commit, state thread): the successful
   results of a page whose rows are pending are written to the store, and the rows leave
   ``reuse_pending`` in the page's transaction. The store is written before the state commits,
   so a crash between the two stores the same results again on resume (idempotent).

Only bulk rows take part: rows routed to the single endpoint (local files, ``data:`` URIs)
are always sent (a local file may change under the same path).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import anyio

from ... import _exceptions as exc
from ..._models import TaggingRequest
from ..pages import PageRow, success_flags
from ..state import changes, reuse_rows
from .durations import DAY
from .fingerprint import Fingerprinter
from .store import ResultStoreAPI, StoredResult

__all__ = ["IntakePlan", "ReuseHook"]

logger = logging.getLogger("fashiontag_pipeline.engine")


class IntakePlan(NamedTuple):
    """A batch's fingerprints (aligned with its rows; None for a row that is not a bulk
    request) and the stored results found for them."""

    fps: list[bytes | None]
    hits: dict[bytes, StoredResult]


class ReuseHook:
    """A run's use of a :class:`ResultStore` (see the module docstring)."""

    def __init__(
        self,
        store: ResultStoreAPI,
        fingerprinter: Fingerprinter,
        *,
        max_age: float = 30 * DAY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.fingerprinter = fingerprinter
        self.max_age = max_age
        self.clock = clock
        self.started_at = clock()
        #: Fresh bulk rows looked up, answered from the store, and results stored.
        self.looked_up = 0
        self.reused = 0
        self.stored = 0
        #: Per job: its validated watermark when it first used the store (see reuse_rows),
        #: read from the state once; the intake drops a job's once the job is read to its end
        #: (kept, one per manifest a daemon ever took, for its whole life).
        self.reuse_from: dict[int, int] = {}
        #: The state holds one run (``run``, not a daemon): its figures add up over attempts.
        self._one_run = False
        self._limiter = anyio.CapacityLimiter(1)

    # -------------------------------------------------------------- state thread

    def prepare(self, db: Any, *, resumed: bool, one_run: bool = False) -> None:
        """Ready the state file (state thread, before the run starts).

        ``one_run``: the state holds one run (``run``), whose figures (looked up, reused,
        stored: ``reuse stats``) are kept in it as they change, and a resumed run goes on
        from its earlier attempts' figures (a killed attempt records none in the store).

        Rows still pending from an earlier start that asked another question (another
        language or default detection: a daemon restarted with a new configuration) are sent
        and written as ever, but their results are not stored: they answer the question asked
        now, not the one their fingerprints were taken for."""
        reuse_rows.create(db)
        question = self.fingerprinter.question
        if not resumed:
            reuse_rows.clear_pending(db)
        elif reuse_rows.question(db) not in (None, question):
            disowned = reuse_rows.disown_pending(db)
            if disowned:
                logger.warning(
                    "%d rows in flight were taken in with another language or default"
                    " detection: their results are written but not stored for reuse",
                    disowned,
                )
        reuse_rows.set_question(db, question)
        self._one_run = one_run
        if one_run and resumed and (earlier := reuse_rows.figures(db)) is not None:
            self.started_at, self.looked_up, self.reused, self.stored = earlier

    def settle(
        self,
        db: Any,
        job: int,
        plan: IntakePlan,
        keyed: Sequence[tuple[str, int]],
        keep: list[int],
        replay_upto: int,
    ) -> tuple[list[int], list[tuple[int, StoredResult]], list[changes.Change]]:
        """(rows to send, (index, stored result) of the rows answered from the store, state
        changes) of the kept rows of a batch of ``job``."""
        ops: list[changes.Change] = []
        floor = self.reuse_from.get(job)
        if floor is None:
            floor = reuse_rows.reuse_from(db, job)
            if floor is None:
                floor = replay_upto
                ops.append(reuse_rows.reuse_started(job, replay_upto))
            self.reuse_from[job] = floor
        fps = plan.fps
        replayed = [
            keyed[i][0] for i in keep if floor < keyed[i][1] <= replay_upto and fps[i] is not None
        ]
        pending = reuse_rows.pending_fingerprints(db, replayed) if replayed else {}
        hits = plan.hits
        send: list[int] = []
        lines: list[tuple[int, StoredResult]] = []
        misses: list[tuple[str, bytes]] = []
        for i in keep:
            fp = fps[i]
            ident, pos = keyed[i]
            if fp is None or pos <= floor:
                send.append(i)
            elif pos <= replay_upto:
                if ident in pending:  # sent by an earlier attempt, not answered from the store
                    send.append(i)
            else:
                hit = hits.get(fp)
                if hit is not None:
                    lines.append((i, hit))
                else:
                    misses.append((ident, fp))
                    send.append(i)
        self.looked_up += len(lines) + len(misses)
        self.reused += len(lines)
        ops.extend(reuse_rows.pending_rows(misses))
        if self._one_run:
            ops.append(self._figures())
        return send, lines, ops

    def _figures(self) -> changes.Change:
        return reuse_rows.figures_now(self.started_at, self.looked_up, self.reused, self.stored)

    def store_page(self, db: Any, task_id: str, rows: list[PageRow]) -> list[changes.Change]:
        """Store the page's successful results of pending rows; the state changes that take
        its rows out of ``reuse_pending``."""
        pending = reuse_rows.pending_fingerprints(db, [r.id for r in rows])
        if not pending:
            return []
        get = pending.get
        values = [  # (a disowned row's fingerprint is empty: see prepare)
            (fp, task_id, row.tagging_result)
            for row, ok in zip(rows, success_flags(rows), strict=True)
            if ok and (fp := get(row.id))
        ]
        self.stored += self.store.put(values, stored_at=self.clock())
        done = reuse_rows.pending_done(list(pending))
        return [*done, self._figures()] if self._one_run else done

    # -------------------------------------------------------------- event loop side

    async def plan(self, rows: Sequence[tuple[str, int, Any]]) -> IntakePlan:
        """Fingerprints of ``rows`` (id, position, request) and their stored results younger
        than the max age, computed and looked up in a worker thread."""
        return await anyio.to_thread.run_sync(self._plan, rows, limiter=self._limiter)

    def _plan(self, rows: Sequence[tuple[str, int, Any]]) -> IntakePlan:
        of = self.fingerprinter.of
        fps: list[bytes | None] = [
            of(request) if type(request) is TaggingRequest or type(request) is str else None
            for _, _, request in rows
        ]
        wanted = [fp for fp in fps if fp is not None]
        hits = self.store.lookup(wanted, newer_than=self.clock() - self.max_age) if wanted else {}
        return IntakePlan(fps, hits)

    def close_store(self) -> None:
        """Record the run in the store (``reuse stats``: the last run's hit rate) and close
        it. Blocking: call from a worker thread once the run's tasks are done.

        A store that refuses that line (locked past its busy timeout, a full disk) is said
        in a warning: every result of the run is stored already (each page's, before the
        state commits it), so the run's outcome stands; only ``reuse stats`` misses it."""
        try:
            self.store.record_run(
                started_at=self.started_at,
                finished_at=self.clock(),
                looked_up=self.looked_up,
                reused=self.reused,
                stored=self.stored,
            )
        except exc.ResultStoreError as err:
            text = str(err)
            reason = text.rsplit(" (", 1)[0] if text.endswith(")") else text
            logger.warning(
                "%s; this run's line of history (the last run 'reuse stats' shows) was not"
                " recorded, nothing else: every result of the run is stored",
                reason,
            )
        finally:
            self.store.close()
