"""The daemon itself: the inbox, the outbox and the monitoring around one long-lived engine.

One :class:`~fashiontag_pipeline.engine.engine.Engine` (namespaced ids, a bound on rows in
flight for fairness, no give-up: outages are waited out) takes every claimed manifest as a job
of its own. For each claim, at most ``max_active`` at a time, in arrival order:

1. content already completed (same sha256): ``summary.json`` says ``duplicate`` at once; content
   equal to a manifest still in flight waits for it, then is a duplicate;
2. otherwise its output folder is taken (:class:`~.outbox.Outbox`), the engine opens it as a job
   (a claim found in ``.work`` at start-up resumes its job from the state store), and when every
   row has its outcome the summary is written last and the manifest moves to ``done/``; a
   manifest that cannot be read moves to ``failed/`` with its reason.

Metrics count rows as written, topped up to a manifest's rows when it completes. SIGTERM stops
claiming and reading, lets writes finish, flushes, returns; manifests in flight resume later.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio
import anyio.abc
import msgspec

from .. import _exceptions as exc
from .._client import TaggerClient
from .._config import ClientConfig
from .._postgres import is_postgres_url
from ..engine import EngineConfig, RunSummary
from ..engine.engine import Engine, RunControl
from ..engine.jobs import JobSpec
from ..engine.manifests import ManifestPrint
from ..engine.reuse import ReuseHook, open_reuse
from ..engine.service_check import confirm_service
from ..engine.source import RESOURCE_ERRNOS
from ..engine.state import StateDB
from .claims import changed_since_read
from .config import DaemonConfig
from .http import MonitoringServer
from .inbox import Claim, Inbox
from .ledger import SQLiteClaimLedger
from .lockkeep import KeptLocks, kept_store
from .monitor import ActiveManifest, DaemonMonitor
from .notify import SystemdNotifier
from .outbox import ManifestOutputs, ManifestSummary, Outbox
from .published import forget, noted_or, publish
from .room import watch_state_file
from .statemark import held_inbox, lock_watched

if TYPE_CHECKING:
    from .leases import Lease

__all__ = ["DEFAULT_MAX_PENDING_ROWS", "Daemon"]

logger = logging.getLogger("fashiontag_pipeline.daemon")

#: Rows taken in without an outcome before the source waits (fairness: a manifest dropped
#: behind a big one reaches the service within seconds; the reference service tags ~10k/s).
DEFAULT_MAX_PENDING_ROWS = 20_000
#: Seconds before a manifest that could not be opened for want of descriptors is tried again.
RESOURCE_RETRY_SECONDS = 1.0
#: The counts a summary.json carries (besides rows_read and elapsed_s).
_COUNTED = ("submitted", "tagged", "failed", "rejected", "reused", "single", "tasks", "pages")


class Daemon(DaemonMonitor):
    """``fashiontag daemon``: see the module docstring. :meth:`run` returns after a drain."""

    def __init__(
        self,
        config: DaemonConfig,
        *,
        client: ClientConfig,
        engine: EngineConfig,
        control: RunControl | None = None,
        notifier: SystemdNotifier | None = None,
        max_pending_rows: int | None = DEFAULT_MAX_PENDING_ROWS,
    ) -> None:
        super().__init__(config)
        self.config = config
        self.inbox_path, self.outbox_path = config.require_folders()
        self.client_config = client
        # The daemon never gives up on the service: outages are waited out with backoff.
        self.engine_config = msgspec.structs.replace(
            engine, give_up_after=math.inf, stall_timeout=math.inf
        )
        self.control = control or RunControl()
        self.notifier = notifier or SystemdNotifier()
        self.max_pending_rows = max_pending_rows
        self._in_flight_sha: dict[str, anyio.Event] = {}
        #: Where the monitoring endpoints listen (None: disabled or not started).
        self.url: str | None = None
        self.started = anyio.Event()

    # -------------------------------------------------------------- the life

    async def run(self) -> None:
        """Until drained (``control.stop()``): claim, tag, settle."""
        inbox_dir, outbox_dir = self.inbox_path, self.outbox_path
        state_path = self.config.state_location()
        if is_postgres_url(state_path):  # several daemons, one PostgreSQL
            from .shared import SharedDaemon

            await SharedDaemon(self, state_path).run()
            return
        await anyio.to_thread.run_sync(lambda: outbox_dir.mkdir(parents=True, exist_ok=True))
        inbox_lock = await anyio.to_thread.run_sync(lock_watched, inbox_dir, state_path)
        self.locks = KeptLocks(self.stop, held := held_inbox(inbox_dir, inbox_lock))
        try:
            await self._run_alone(inbox_dir, outbox_dir, state_path)
        finally:
            held.close()

    async def _run_alone(self, inbox_dir: Path, outbox_dir: Path, state_path: str | Path) -> None:
        """:meth:`run` with a SQLite state: the only daemon on this inbox."""
        db = await anyio.to_thread.run_sync(StateDB, Path(state_path))
        self.locks.held.append(db)  # (kept at each look of the health loop)
        try:
            ledger = SQLiteClaimLedger(state_path)
        except BaseException:
            db.close()
            raise
        inbox = Inbox(
            inbox_dir,
            ledger=ledger,
            settle=self.config.settle,
            scan_interval=self.config.scan_interval,
        )
        outbox = Outbox(outbox_dir)
        engine: Engine | None = None
        reuse: ReuseHook | None = None
        try:
            await anyio.to_thread.run_sync(inbox.prepare)
            state = await anyio.to_thread.run_sync(db.open_engine)
            reuse = await anyio.to_thread.run_sync(self._open_reuse, db, state_path)
            self.locks.held += kept_store(self.engine_config.reuse if reuse else None)
            async with TaggerClient(config=self.client_config) as client:
                client.set_observer(self.observe)
                await confirm_service(f"state file {state_path}", db, client)
                engine = Engine(
                    client=client,
                    db=db,
                    state=state,
                    config=self.engine_config,
                    namespaced=True,
                    control=self.control,
                    fail_fast=False,
                    max_pending_rows=self.max_pending_rows,
                    reuse=reuse,
                    keep_state=False,  # (kept at each look of the health loop)
                )
                self._engine = engine
                engine.writer.more_input = self.more_claims  # (a burst shares its tasks)
                # Ready for systemd once listening, before the engine resumes the manifests in
                # flight: that waits for the service to find their tasks, as long as it is
                # down (TimeoutStartSec stopped such a start, and again at every restart).
                async with (
                    MonitoringServer(
                        self.config.listen, metrics=self.metrics, health=self.health, status=self
                    ) as server,
                    anyio.create_task_group() as life,
                ):
                    self.url = server.url
                    life.start_soon(self.notifier.run_watchdog)
                    self.notifier.ready(f"watching {inbox_dir}")
                    try:
                        await self._work(client, engine, inbox, outbox, Path(state_path))
                    finally:
                        life.cancel_scope.cancel()
        finally:
            self._engine = None
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(ledger.close)
                # Every open job's outputs flushed and closed, then the state store.
                closer = engine.journal.close if engine is not None else db.close
                await anyio.to_thread.run_sync(closer)
                if reuse is not None:
                    await anyio.to_thread.run_sync(reuse.close_store)
        logger.info("daemon stopped")

    async def _work(
        self, client: TaggerClient, engine: Engine, inbox: Inbox, outbox: Outbox, state: Path
    ) -> None:
        """The daemon's work, once its endpoints listen: the engine (resumed), then claims."""
        async with engine, anyio.create_task_group() as tg:
            tg.start_soon(self.report, client)
            tg.start_soon(self.probe, client)
            tg.start_soon(watch_state_file, self.health, state, self.locks)
            tg.start_soon(self._drain_watch, engine)
            self.started.set()
            where = {"inbox": str(self.inbox_path), "outbox": str(self.outbox_path)}
            logger.info("daemon started", extra={**where, "listen": self.url})
            await self._claim_loop(tg, inbox, outbox, engine)

    def _open_reuse(self, db: StateDB, state_path: str | Path) -> ReuseHook | None:
        """``--reuse``: the result store every manifest shares (None without one). The state
        is long-lived: rows sent and not yet read back stay pending across restarts."""
        return open_reuse(
            self.engine_config,
            language=self.client_config.language,
            db=db.db,
            resumed=True,
            state=f"state file {state_path}",
        )

    def stop(self) -> None:
        """Drain (SIGTERM): no more claims or reads; writes in flight finish; then
        :meth:`run` returns. Says so at once to /readyz and systemd."""
        if not self.health.draining:
            self.health.mark_draining()
            self.notifier.stopping()
            logger.info("draining: no more claims; finishing the writes in flight")
        self.control.stop()

    def abort(self) -> None:
        """Stop now (a second signal): state is consistent at every commit."""
        self.stop()
        self.control.abort()

    async def _drain_watch(self, engine: Engine) -> None:
        await self.control.stopping.wait()
        self.stop()
        with anyio.move_on_after(self.config.drain_timeout) as scope:
            # The writes in flight: the bulk writer's, and the single-mode requests (the
            # single router starts no new row once draining).
            await engine.writer.idle.wait()
            await engine.single.idle.wait()
        if scope.cancelled_caught:
            logger.warning("drain timeout: stopping with writes in flight (they resume)")
            self.control.abort()

    async def _claim_loop(
        self, tg: anyio.abc.TaskGroup, inbox: Inbox, outbox: Outbox, engine: Engine
    ) -> None:
        slots = anyio.Semaphore(self.config.max_active)
        claims = inbox.claims(self.control.stopping)
        try:
            while not self.control.stopping.is_set():
                await self.take_slot(slots, inbox, self.config.scan_interval)
                try:
                    claim = await claims.__anext__()
                except BaseException:
                    slots.release()
                    raise
                tg.start_soon(self._manifest, claim, slots, outbox, inbox, engine)
        finally:
            aclose = getattr(claims, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _manifest(
        self,
        claim: Claim,
        slots: anyio.Semaphore,
        outbox: Outbox,
        inbox: Inbox,
        engine: Engine,
    ) -> None:
        try:
            # Same content as a manifest in flight: wait for it, then it is a duplicate.
            while (event := self._in_flight_sha.get(claim.sha256)) is not None:
                self.queued.append(claim)
                try:
                    await event.wait()
                finally:
                    self.queued.remove(claim)
            # Taken before any await: a claim of the same content that comes now waits.
            done = self._in_flight_sha[claim.sha256] = anyio.Event()
            try:
                earlier = await anyio.to_thread.run_sync(inbox.ledger.find_completed, claim.sha256)
                key = claim.job_key
                job = engine.job_of_key(key)  # a resumed claim: where it writes
                recorded = outbox.folder_of(job.row.results) if job is not None else None
                if recorded is not None and recorded.parent != outbox.root:
                    logger.warning(
                        "manifest resumed into its folder in another outbox (the daemon was"
                        " restarted with another --outbox): it ends there",
                        extra={"manifest": claim.name, "folder": str(recorded)},
                    )
                # Folders of other jobs in flight are theirs even when removed under them.
                taken = {
                    outbox.folder_of(j.row.results) for j in engine.active_jobs() if j is not job
                }
                outputs = await outbox.aoutputs(claim, recorded, taken)
                if earlier is not None:
                    await self.duplicate(claim, outputs, inbox, earlier.name)
                    return
                await self._tag(claim, outputs, inbox, engine)
            finally:
                if self._in_flight_sha.get(claim.sha256) is done:
                    del self._in_flight_sha[claim.sha256]
                done.set()
        finally:
            slots.release()

    async def duplicate(
        self,
        claim: Claim,
        outputs: ManifestOutputs,
        inbox: Inbox,
        earlier: str,
        *,
        lease: Lease | None = None,
    ) -> None:
        summary = outputs.new_summary("duplicate", finished_at=time.time(), duplicate_of=earlier)
        await self._publish(summary, outputs, inbox, lease)
        logger.info(
            "duplicate manifest: not sent again",
            extra={"manifest": claim.name, "duplicate_of": earlier},
        )

    async def _tag(
        self, claim: Claim, outputs: ManifestOutputs, inbox: Inbox, engine: Engine
    ) -> None:
        active = ActiveManifest(claim)
        self.active[claim.name] = active
        try:
            spec = JobSpec(
                key=claim.job_key,
                name=claim.name,
                manifests=[claim.path],
                results=outputs.results,
                rejects=outputs.rejects,
                # Hashed when it was claimed (the key holds it too).
                prints=[ManifestPrint(name=claim.path, size=claim.size, sha256=claim.sha256)],
            )
            while True:
                try:
                    job = await engine.submit(spec)
                    break
                except exc.ManifestError as err:
                    await self.failed(claim, outputs, inbox, str(err))
                    return
                except OSError as err:
                    if err.errno not in RESOURCE_ERRNOS:
                        raise
                    # Out of descriptors or memory for a moment: the manifest is fine, and
                    # failed/ would keep its rows from ever being tagged. Opened again soon
                    # (a drain leaves it in .work, where the next start resumes it).
                    logger.warning(
                        "manifest cannot be opened now: trying again",
                        extra={"manifest": claim.name, "error": err.strerror},
                    )
                    if self.control.stopping.is_set():
                        return
                    await anyio.sleep(RESOURCE_RETRY_SECONDS)
            active.watch(job)
            logger.info(
                "manifest claimed" if not claim.resumed else "manifest resumed",
                extra={"manifest": claim.name, "sha256": claim.sha256, "job": job.id},
            )
            await engine.outcome(job)
            await self.conclude(active, outputs, inbox)
        finally:
            self.active.pop(claim.name, None)

    async def conclude(
        self,
        active: ActiveManifest,
        outputs: ManifestOutputs,
        inbox: Inbox,
        *,
        summary: RunSummary | None = None,
        lease: Lease | None = None,
    ) -> None:
        """Every row of the manifest has its outcome: its summary is written last, then it
        moves to ``done/`` (``failed/`` when it could not be read to the end, or its file
        changed after it was read to its end). ``summary``: the counts of a manifest tagged
        by an engine of its own (several daemons)."""
        claim, job = active.claim, active.job
        self.count_rows(active, final=True)
        c = dict(job.counters) if job is not None else {}
        rows_read = job.rows_read if job is not None else 0
        # A file that grew, was cut or replaced after it was read to its end: not done.
        changed = await anyio.to_thread.run_sync(changed_since_read, active.ends)
        failure = (job.failure if job is not None else None) or changed
        if summary is not None:
            c = {k: getattr(summary, k) for k in _COUNTED}
            rows_read = summary.rows_read
        status: Literal["done", "failed"] = "failed" if failure else "done"
        written = outputs.new_summary(status, finished_at=time.time(), reason=failure)
        written.rows_read = rows_read
        for key in _COUNTED:
            setattr(written, key, c.get(key, 0))
        written.elapsed_s = round(time.monotonic() - active.started, 3)
        written = await self._publish(written, outputs, inbox, lease)
        logger.info(
            "manifest complete",
            extra={
                "manifest": claim.name,
                "status": status,
                "rows": written.tagged + written.failed + written.rejected + written.reused,
                "tagged": written.tagged,
                "rejected": written.rejected,
                "elapsed_s": written.elapsed_s,
            },
        )

    async def failed(
        self,
        claim: Claim,
        outputs: ManifestOutputs,
        inbox: Inbox,
        reason: str,
        *,
        lease: Lease | None = None,
    ) -> None:
        summary = outputs.new_summary("failed", finished_at=time.time(), reason=reason)
        await self._publish(summary, outputs, inbox, lease)
        logger.warning("manifest cannot be read", extra={"manifest": claim.name, "reason": reason})

    async def _publish(
        self, summary: ManifestSummary, outputs: ManifestOutputs, inbox: Inbox, lease: Lease | None
    ) -> ManifestSummary:
        """``summary.json`` (any written before a crash), its record, the move to ``done/`` or
        ``failed/``: shielded from a drain (which left a complete manifest in ``.work``)."""
        with anyio.CancelScope(shield=lease is None):
            summary = await anyio.to_thread.run_sync(noted_or, inbox.work, outputs, summary)
            # Counted before the summary appears: whoever sees summary.json sees it counted.
            self.metrics.count_manifest(summary.status)
            self.recent.append(summary)
            await anyio.to_thread.run_sync(publish, inbox.work, outputs, summary)
            if summary.status == "failed":
                await inbox.afail(outputs.claim, summary.reason or "", lease)
            else:
                await inbox.afinish(outputs.claim, summary.status, lease)
            await anyio.to_thread.run_sync(forget, inbox.work, outputs.claim)
        return summary
