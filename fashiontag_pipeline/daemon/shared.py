"""Several daemons, one PostgreSQL (``--state postgresql://...``): shared work and failover.

Every daemon on the database scans the same inbox. A claim is the rename of a manifest into
``.work`` (one daemon wins it), recorded in the shared ledger without an owner. Work is then
taken by lease, not by who claimed: each daemon leases up to ``max_active`` claims in flight
that nobody holds (``SELECT ... FOR UPDATE SKIP LOCKED``, oldest first: never the same one as
another daemon), renews its leases every third of ``--lease``, and tags each leased manifest
with an engine of its own whose state is the schema ``claim_<id>`` of the database
(:class:`~fashiontag_pipeline.engine.state.pgstore.PostgresStateDB`).

Every write transaction of that state begins with the lease's fence (owner, epoch, expiry in
database time; the claim's row locked until the commit), and the journal begins it before
writing a sink byte: a daemon that lost its lease (killed, paused, partitioned) writes nothing
more, neither state nor output. Its claims are then leased by another daemon, epoch + 1, which
resumes the state like ``fashiontag run`` resumes a state file: the live tasks are read again
(nothing the service holds is tagged twice) and chunks of unknown fate are settled. Each
lease (epoch) writes outputs of its own (``.results.e<epoch>.jsonl`` beside the final file):
a taker starts its files with the committed prefix of the previous epoch's, and the settled
epoch's files are renamed to ``results.jsonl`` and ``rejects.jsonl`` before the summary. A
paused owner that wakes up can only ever write its own epoch's files, which nobody reads.
Outputs are fsync-ed at every commit (the state commits on another machine).

One engine per manifest, not one for all: rows of several manifests would share tasks, and a
manifest could then not change hands without the others. A lost connection to the database (a
server restart) ends the manifests' engines like a crash; their leases run out, and they are
leased again (by this daemon or another) once the database answers: resumed, nothing lost.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec

from .. import _exceptions as exc
from .._client import TaggerClient
from ..engine.engine import RunControl
from ..engine.run import RUN_JOB
from ..engine.state.pgstore import PostgresStateDB
from .attempts import Attempts
from .contents import ContentTurns
from .epochs import (
    claim_state_url,
    committed_file,
    copy_prefix,
    drop_empty_epoch,
    drop_epoch_files,
    epoch_outputs,
    follow_recorded,
    publish_outputs,
)
from .http import MonitoringServer
from .inbox import Claim, Inbox
from .keeper import ForeignClaims, LeaseKeeper
from .leased import check_reuse, drop_done, drop_settled, hand_back, queued, run_leased, still_held
from .leases import Lease, PostgresClaimLedger, fence
from .outbox import ManifestOutputs, Outbox
from .sharedloops import claim_loop, repair_loop
from .statemark import watched_shared

if TYPE_CHECKING:
    from .runner import Daemon

__all__ = ["SharedDaemon"]

logger = logging.getLogger("fashiontag_pipeline.daemon")


#: A manifest that stops on an error this many times in a row (here) fails with the reason.
MAX_ATTEMPTS = 5


class SharedDaemon:
    """The daemon's life on a shared PostgreSQL state (see the module docstring)."""

    def __init__(self, daemon: Daemon, url: str) -> None:
        self.daemon = daemon
        self.url = url
        self.config = daemon.config
        # The state commits on the database's machine: each commit's output bytes are on this
        # machine's disk first (fsync per commit), or a takeover after this machine dies could
        # find fewer lines than the state counts.
        self.engine_config = msgspec.structs.replace(daemon.engine_config, fsync_seconds=0.0)
        #: The leases being worked on, by (claim, epoch): a claim leased again (its earlier
        #: lease lost) may overlap the end of the earlier lease's task.
        self.leased: dict[tuple[int, int], Lease] = {}
        self._wake = anyio.Event()
        self._acquire_failed = False
        self._acquire_said: str | None = None  # (the reason last said: said again if it changes)
        self._attempts = Attempts(MAX_ATTEMPTS)
        self._ledger: PostgresClaimLedger | None = None
        self._outdated: exc.SchemaTooNewError | None = None  # (a newer daemon migrated)
        self._foreign = ForeignClaims()  # (claims begun on another service: left to others)
        self._turns = ContentTurns()  # (equal content on this daemon: one after the other)

    async def run(self) -> None:
        daemon, config = self.daemon, self.config
        inbox_dir, outbox_dir = daemon.inbox_path, daemon.outbox_path
        await anyio.to_thread.run_sync(lambda: outbox_dir.mkdir(parents=True, exist_ok=True))
        ledger = await anyio.to_thread.run_sync(
            lambda: PostgresClaimLedger(self.url.partition("#")[0], lease=config.lease)
        )
        self._ledger = ledger
        keeper = LeaseKeeper(ledger)
        inbox = Inbox(
            inbox_dir,
            ledger=ledger,
            settle=config.settle,
            scan_interval=config.scan_interval,
            shared_after=config.lease,
        )
        outbox = Outbox(outbox_dir)
        try:
            held = lambda: {r.name for r in ledger.in_flight()}  # noqa: E731
            await anyio.to_thread.run_sync(
                lambda: watched_shared(inbox_dir, self.url, ledger.identity(), held)
            )
            await anyio.to_thread.run_sync(check_reuse, self.engine_config.reuse)
            await anyio.to_thread.run_sync(inbox.prepare)
            await anyio.to_thread.run_sync(drop_settled, ledger, self.url, self.config.lease)
            async with TaggerClient(config=daemon.client_config) as client:
                client.set_observer(daemon.observe)
                async with (
                    MonitoringServer(
                        config.listen, metrics=daemon.metrics, health=daemon.health, status=daemon
                    ) as server,
                    anyio.create_task_group() as tg,
                ):
                    daemon.url = server.url
                    await tg.start(keeper.run)
                    tg.start_soon(daemon.report, client)
                    tg.start_soon(daemon.probe, client)
                    tg.start_soon(daemon.notifier.run_watchdog)
                    wake = lambda: self._wake.set()  # noqa: E731 (replaced at each turn)
                    tg.start_soon(
                        claim_loop, inbox, daemon.control.stopping, config.scan_interval, wake
                    )
                    tg.start_soon(repair_loop, inbox, ledger, self.url, config.lease, wake)
                    tg.start_soon(self._drain_watch)
                    daemon.notifier.ready(f"watching {inbox_dir} (shared)")
                    daemon.started.set()
                    logger.info(
                        "daemon started",
                        extra={
                            "inbox": str(inbox_dir),
                            "outbox": str(outbox_dir),
                            "listen": daemon.url,
                            "owner": ledger.owner,
                            "lease_s": config.lease,
                        },
                    )
                    await self._lease_loop(tg, ledger, keeper, inbox, outbox, client)
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(ledger.close)
        if self._outdated is not None:
            raise self._outdated  # (exit 1, saying to upgrade this daemon)
        logger.info("daemon stopped")

    async def _drain_watch(self) -> None:
        """After ``drain_timeout`` seconds of a drain, stop at once (writes in flight resume)."""
        control = self.daemon.control
        await control.stopping.wait()
        await anyio.sleep(self.config.drain_timeout)
        if self.leased:
            logger.warning("drain timeout: stopping with writes in flight (they resume)")
            control.abort()

    async def _lease_loop(
        self,
        tg: anyio.abc.TaskGroup,
        ledger: PostgresClaimLedger,
        keeper: LeaseKeeper,
        inbox: Inbox,
        outbox: Outbox,
        client: TaggerClient,
    ) -> None:
        """Lease free claims up to ``max_active`` (a third of the lease between two tries, at
        once after a claim); on drain, wait for the leased manifests to stop."""
        control = self.daemon.control
        period = min(self.config.scan_interval, self.config.lease / 3)
        while not control.stopping.is_set():
            free = self.config.max_active - len(self.leased)
            if free > 0 and await anyio.to_thread.run_sync(inbox.looks_shared):
                try:
                    leases = await keeper.acquire(free, skip=self._foreign.current())
                except exc.StateError as err:
                    # Said once a reason, again when it changes (a connection a failover
                    # ended, then a standby that is read-only: the lasting cause is said).
                    if str(err) != self._acquire_said:
                        logger.warning("cannot lease manifests: %s; retrying", err)
                        self._acquire_said = str(err)
                    self._acquire_failed = True
                    self.daemon.health.mark_store_unwritable(str(err))  # (/readyz)
                    leases = []
                else:
                    if self._acquire_failed:
                        logger.info("the PostgreSQL state answers again")
                    self._acquire_failed = False
                    self._acquire_said = None
                handed = set(self._foreign.current())
                for lease in leases:
                    if lease.claim_id in handed:
                        # Handed back (begun on another service) while this acquire, asked
                        # with the list from before, waited: given back again at once.
                        with contextlib.suppress(exc.StateError):
                            await keeper.release(lease)
                        continue
                    self.leased[lease.claim_id, lease.epoch] = lease
                    tg.start_soon(self._manifest, lease, ledger, keeper, inbox, outbox, client)
            await queued(self.daemon, ledger, leasing=not self._acquire_failed)
            with anyio.move_on_after(period):
                await self._wake.wait()
            self._wake = anyio.Event()
        while self.leased:
            with anyio.move_on_after(0.5):
                await self._wake.wait()
            self._wake = anyio.Event()

    async def _manifest(
        self,
        lease: Lease,
        ledger: PostgresClaimLedger,
        keeper: LeaseKeeper,
        inbox: Inbox,
        outbox: Outbox,
        client: TaggerClient,
    ) -> None:
        daemon = self.daemon
        claim: Claim | None = None
        outputs: ManifestOutputs | None = None
        turn: str | None = None
        try:
            with keeper.lost_if_overdue(lease):  # (woken past the lease: its errors are the loss's)
                record = await anyio.to_thread.run_sync(ledger.claim_of, lease)
            if record is None:  # settled or replaced meanwhile
                keeper.forget(lease)
                return
            claim = Claim(
                name=record.name,
                path=str(inbox.work / record.name),
                sha256=record.sha256,
                size=record.size,
                claimed_at=record.claimed_at,
                resumed=lease.epoch > 1,
            )
            if not await anyio.to_thread.run_sync(Path(claim.path).is_file):
                if not await anyio.to_thread.run_sync(inbox.looks_shared):  # (a mount gone)
                    with contextlib.suppress(exc.StateError):
                        await keeper.release(lease)
                    return
                await anyio.to_thread.run_sync(
                    lambda: ledger.record_abandoned(claim.name, lease=lease)
                )
                keeper.forget(lease)
                logger.warning(
                    "claimed manifest vanished from .work", extra={"manifest": claim.name}
                )
                return
            await self._turns.take(claim.sha256)  # (then an equal content is completed)
            turn = claim.sha256
            outputs = await outbox.aoutputs(claim)
            with keeper.lost_if_overdue(lease):  # (a connection closed during a pause, too)
                earlier = await anyio.to_thread.run_sync(ledger.find_completed, claim.sha256)
            if earlier is not None:
                if (earlier.name, earlier.claimed_at) == (record.name, record.claimed_at):
                    # This very claim, completed: by the daemon that took it over while this
                    # one was paused past its lease. Not a duplicate of itself.
                    raise exc.LeaseLostError(
                        f"lost the lease of {claim.name!r}", manifest=claim.name
                    )
                await still_held(lease, keeper, self._ledger)
                await anyio.to_thread.run_sync(drop_epoch_files, outputs)
                await daemon.duplicate(claim, outputs, inbox, earlier.name, lease=lease)
                keeper.forget(lease)
                return
            with keeper.lost_if_overdue(lease):
                settled = await self._tag(claim, (outbox, outputs), inbox, lease, keeper, client)
            if settled:
                keeper.forget(lease)
                self._attempts.forget(lease.claim_id)
                try:
                    await anyio.to_thread.run_sync(
                        drop_done, self.url, lease.claim_id, self.config.lease
                    )
                except exc.StateError as err:
                    # Settled all the same: the state is dropped later (repair_loop, any daemon).
                    logger.warning(
                        "cannot drop a settled manifest's state now: %s",
                        err,
                        extra={"manifest": lease.name},
                    )
        except exc.SchemaTooNewError as err:
            self._outdated = self._outdated or err
            await hand_back(lease, keeper, daemon, err)
        except exc.ResumeMismatchError as err:
            self._foreign.add(lease.claim_id)
            await hand_back(lease, keeper, daemon, err)
        except exc.LeaseLostError:
            keeper.forget(lease)
            if outputs is not None:  # (empty: made again after the taker published, see there)
                await anyio.to_thread.run_sync(drop_empty_epoch, outputs, lease.epoch)
            logger.warning(
                "lease lost: another daemon finishes the manifest",
                extra={"manifest": lease.name, "epoch": lease.epoch},
            )
        except exc.FashiontagError as err:
            # The database went away (a restart), the result store failed, or this manifest
            # cannot be kept in the state at all: it is leased again and resumed, and fails
            # after attempts in a row with no progress (see .attempts).
            keeper.forget(lease)
            attempts = self._attempts.failed(lease.claim_id, err)
            logger.warning(
                "the manifest stopped on an error; it resumes when it is leased again",
                extra={"manifest": lease.name, "reason": str(err), "attempts": attempts},
            )
            if self._attempts.over(lease.claim_id) and claim is not None and outputs is not None:
                with contextlib.suppress(exc.FashiontagError):
                    await still_held(lease, keeper, self._ledger)
                    await daemon.failed(
                        claim, outputs, inbox, f"{err} ({attempts} attempts)", lease=lease
                    )
                    self._attempts.forget(lease.claim_id)
        finally:
            if turn is not None:
                self._turns.release(turn)
            self.leased.pop((lease.claim_id, lease.epoch), None)
            self._wake.set()

    async def _tag(
        self,
        claim: Claim,
        where: tuple[Outbox, ManifestOutputs],
        inbox: Inbox,
        lease: Lease,
        keeper: LeaseKeeper,
        client: TaggerClient,
    ) -> bool:
        """Tag one leased manifest to the end; True when it is settled (summary written,
        claim final), False when it stopped before (a drain: its lease is released)."""
        daemon, (outbox, outputs) = self.daemon, where
        lost = keeper.lost_event(lease)
        own = RunControl()

        def fenced(conn: Any) -> None:
            fence(conn, lease)

        # Woken past the lease: the state is not opened (made again, if the taker dropped it).
        await still_held(lease, keeper, None)
        db = await anyio.to_thread.run_sync(
            lambda: PostgresStateDB(
                claim_state_url(self.url, lease.claim_id),
                fence=fenced,
                idle_timeout=self.config.lease,
            )
        )
        active = daemon.begin_manifest(claim)
        try:
            row = await anyio.to_thread.run_sync(db.find_job, RUN_JOB)
            if row is not None:  # (begun by a daemon of another --outbox: it ends there)
                await anyio.to_thread.run_sync(follow_recorded, outbox, outputs, row.results)
            results, rejects = epoch_outputs(outputs, lease.epoch)
            failed = self._attempts.begun(lease.claim_id, row)
            if failed is not None:  # attempts in a row, and nothing committed since
                await still_held(lease, keeper, self._ledger)
                await daemon.failed(claim, outputs, inbox, failed, lease=lease)
                return True
            if row is not None:  # taken over: this epoch starts from what the state committed
                await anyio.to_thread.run_sync(
                    copy_prefix,
                    committed_file(outputs, row.results, outputs.results),
                    row.results_ckpt,
                    results,
                )
                await anyio.to_thread.run_sync(
                    copy_prefix,
                    committed_file(outputs, row.rejects, outputs.rejects),
                    row.rejects_ckpt,
                    rejects,
                )
                logger.info(
                    "manifest taken over" if lease.epoch > 1 else "manifest resumed",
                    extra={"manifest": claim.name, "epoch": lease.epoch},
                )
            else:
                logger.info(
                    "manifest claimed", extra={"manifest": claim.name, "sha256": claim.sha256}
                )
            try:
                summary = await run_leased(
                    claim,
                    (results, rejects),
                    db,
                    own,
                    lost,
                    active.watch,
                    client,
                    lease=lease,
                    keeper=keeper,
                    control=daemon.control,
                    engine_config=self.engine_config,
                )
            except exc.ManifestError as err:
                # Woken past its lease, the engine may find the manifest gone from .work (the
                # daemon that took it over finished it): that is the loss, not the reason.
                await still_held(lease, keeper, self._ledger)
                await daemon.failed(claim, outputs, inbox, str(err), lease=lease)
                return True
            except InterruptedError:  # (stopped while it fingerprinted the manifest: no row read)
                summary = None
            if lost.is_set():
                raise exc.LeaseLostError(f"lost the lease of {claim.name!r}", manifest=claim.name)
            if summary is None or not summary.complete:
                with contextlib.suppress(exc.StateError):
                    await keeper.release(lease)
                logger.info(
                    "manifest stopped before its end; it resumes when leased again",
                    extra={"manifest": claim.name},
                )
                return False
            await still_held(lease, keeper, self._ledger)
            await anyio.to_thread.run_sync(publish_outputs, outputs, lease.epoch)
            await daemon.conclude(active, outputs, inbox, summary=summary, lease=lease)
            return True
        finally:
            daemon.end_manifest(active)
            await anyio.to_thread.run_sync(db.close)
