"""The journal: the one thread that writes sinks and state, each commit one transaction.

:meth:`Journal.commit` writes a page's results and/or rejects to the sinks, then in one SQLite
transaction applies the state changes (:mod:`.changes`), adds to the counters and records the
sinks' new byte checkpoints, so a resume truncates the outputs to exactly what the state
knows. Everything runs in one worker thread at a time (a capacity limiter of 1), so the event
loop never blocks on disk.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import anyio

from ..sinks import PageRow, Reject, RejectSink, ResultSink, ReusedLine, count_outcomes
from .changes import Change, validated_upto
from .schema import COUNTERS
from .store import StateDB

__all__ = ["Journal", "ReuseLedger"]

T = TypeVar("T")


class ReuseLedger(Protocol):
    """What the journal asks of ``--reuse`` (:class:`~..reuse.ReuseHook`), in its thread:
    which kept rows of a batch are answered from the result store (``settle``, in the intake
    transaction) and what a committed results page stores (``store_page``)."""

    def settle(
        self,
        db: sqlite3.Connection,
        plan: Any,
        keyed: Sequence[tuple[str, int]],
        keep: list[int],
        replay_upto: int,
    ) -> tuple[list[int], list[ReusedLine], list[Change]]: ...

    def store_page(
        self, db: sqlite3.Connection, task_id: str, rows: list[PageRow]
    ) -> list[Change]: ...


class Journal:
    """Owns the state DB and the sinks; every call runs in the one state thread.

    :meth:`commit` writes sink bytes, then in one transaction applies state changes, adds to
    the counters and records the new sink checkpoints.
    """

    def __init__(
        self,
        db: StateDB,
        results: ResultSink,
        rejects: RejectSink,
        *,
        fsync_seconds: float = 1.0,
        reuse: ReuseLedger | None = None,
    ) -> None:
        self.db = db
        self.results = results
        self.rejects = rejects
        self.fsync_seconds = fsync_seconds
        self.reuse = reuse
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._limiter = anyio.CapacityLimiter(1)
        self._last_fsync = time.monotonic()
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the state thread."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    # -------------------------------------------------------------- thread side

    def _apply(
        self,
        page: tuple[str | None, list[PageRow]] | None,
        rejects: Sequence[Reject],
        ops: Sequence[Change],
        counters: dict[str, int],
        reused: Sequence[ReusedLine] = (),
    ) -> tuple[int, int]:
        ok = bad = 0
        if reused:  # --reuse: rows answered from the result store (their intake transaction)
            self.results.write_reused(list(reused))
            counters = dict(counters)
            for key in ("reused", "settled"):
                counters[key] = counters.get(key, 0) + len(reused)
        if page is not None:
            task_id, rows = page
            if self.reuse is not None and task_id is not None:  # --reuse: store the results
                ops = [*ops, *self.reuse.store_page(self.db.db, task_id, rows)]
            self.results.write_page(task_id, rows)
            ok, bad = count_outcomes(rows)
            counters = dict(counters)
            counters["tagged"] = counters.get("tagged", 0) + ok
            counters["failed"] = counters.get("failed", 0) + bad
            counters["settled"] = counters.get("settled", 0) + len(rows)
        if rejects:
            self.rejects.write_rejects(list(rejects))
            counters = dict(counters)
            counters["rejected"] = counters.get("rejected", 0) + len(rejects)
        now = time.monotonic()
        fsync = now - self._last_fsync >= self.fsync_seconds
        if fsync:
            self._last_fsync = now
        self.results.flush(fsync)
        self.rejects.flush(fsync)
        db = self.db
        db.db.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in ops:
                db.db.execute(sql, params)
            for key, delta in counters.items():
                if delta:
                    self.counters[key] = self.counters.get(key, 0) + delta
                    db.db.execute(
                        "UPDATE meta SET value = CAST(value AS INTEGER) + ? WHERE key = ?",
                        (delta, f"n_{key}"),
                    )
            if page is not None or reused:
                db.set_meta("results_ckpt", self.results.checkpoint())
            if rejects:
                db.set_meta("rejects_ckpt", self.rejects.checkpoint())
            db.db.execute("COMMIT")
        except BaseException:
            db.db.execute("ROLLBACK")
            raise
        return ok, bad

    def _intake(
        self,
        keyed: Sequence[tuple[str, int]],
        rejects: list[Reject],
        make_dup: Callable[[int, int], Reject | None],
        watermark: int,
        replay_upto: int,
        routed: Callable[[list[int]], Sequence[Change]] | None = None,
        plan: Any = None,
    ) -> list[int]:
        """Dedupe a validated batch, write its rejects and move V, in one transaction
        (with ``routed(kept indexes)``'s statements: the single-mode rows written ahead; with
        ``plan``, the ``--reuse`` lookup of the batch: rows answered from the store are
        written in this transaction and not returned)."""
        self.db.db.execute("SAVEPOINT intake")
        firsts = self.db.dedupe(keyed)
        self.db.db.execute("RELEASE intake")
        out: list[int] = []
        fresh = 0
        for i, ((_, pos), first) in enumerate(zip(keyed, firsts, strict=True)):
            if first == pos:
                out.append(i)
                fresh += pos > replay_upto  # a replayed row (at or below V) was counted before
            elif pos > replay_upto:
                dup = make_dup(i, first)
                if dup is not None:
                    rejects.append(dup)
        ops: list[Change] = [validated_upto(watermark)]
        reused: list[ReusedLine] = []
        if plan is not None and self.reuse is not None:  # --reuse
            out, reused, reuse_ops = self.reuse.settle(self.db.db, plan, keyed, out, replay_upto)
            ops.extend(reuse_ops)
        if routed is not None:
            ops.extend(routed(out))
        self._apply(None, rejects, ops, {"accepted": fresh}, reused)
        return out

    # -------------------------------------------------------------- async side

    async def commit(
        self,
        *,
        page: tuple[str | None, list[PageRow]] | None = None,
        rejects: Sequence[Reject] = (),
        ops: Sequence[Change] = (),
        counters: dict[str, int] | None = None,
    ) -> tuple[int, int]:
        """Write a results page and/or rejects, apply ``ops``, add ``counters``; one
        transaction. Returns (tagged, failed) of the page. A page's task id is None for
        results of the single endpoint."""
        return await self.run(self._apply, page, rejects, ops, counters or {})

    async def intake(
        self,
        keyed: Sequence[tuple[str, int]],
        rejects: list[Reject],
        make_dup: Callable[[int, int], Reject | None],
        watermark: int,
        replay_upto: int,
        routed: Callable[[list[int]], Sequence[Change]] | None = None,
        plan: Any = None,
    ) -> list[int]:
        """Indexes of ``keyed`` whose row is the first of its id and is to be sent;
        duplicates become rejects (unless at or below ``replay_upto``, already written by an
        earlier attempt); with ``plan`` (``--reuse``), rows answered from the result store are
        written and left out."""
        return await self.run(
            self._intake, keyed, rejects, make_dup, watermark, replay_upto, routed, plan
        )

    def close(self) -> None:
        """Flush and close sinks and state (from any thread, once the loop is done)."""
        if self._closed:
            return
        self._closed = True
        for sink in (self.results, self.rejects):
            try:
                sink.flush(True)
            finally:
                sink.close()
        self.db.close()

    async def write_ahead(
        self, n: int, last_pos: int, body: bytes, replaces: int | None, resent: int
    ) -> int:
        """Write a chunk ahead of its request (see :meth:`StateDB.insert_chunk`)."""

        def insert() -> int:
            chunk_id = self.db.insert_chunk(n, last_pos, body, replaces, resent)
            if resent:
                self.counters["resent"] = self.counters.get("resent", 0) + resent
            return chunk_id

        return await self.run(insert)
