"""One leased manifest's engine in a shared daemon (``shared``): what a lease guards.

A daemon paused past its lease (SIGSTOP, a stalled VM) and woken after another took the
manifest over must touch nothing the taker did: its engine is aborted when the keeper sees the
loss (:func:`_relay`), each write to the service is checked against the lease on this process's
clock right before it is sent (``_callctx.WRITE_GUARD``), and the files the consumers read (a
summary, the published outputs) are written only after a fenced check (:func:`still_held`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from .. import _exceptions as exc
from .._callctx import WRITE_GUARD
from .._client import TaggerClient
from ..engine import EngineConfig, RunSummary
from ..engine.engine import RunControl
from ..engine.jobs import Job
from ..engine.reuse.setup import said_created
from ..engine.reuse.store import open_store
from ..engine.run import first_error, run_pipeline
from ..engine.state.pgstore import PostgresStateDB, drop_state
from .epochs import claim_state_url
from .heap import release_free_heap
from .inbox import Claim
from .keeper import LeaseKeeper
from .leases import Lease, PostgresClaimLedger

if TYPE_CHECKING:
    from .runner import Daemon

__all__ = [
    "check_reuse",
    "drop_done",
    "drop_settled",
    "hand_back",
    "queued",
    "run_leased",
    "still_held",
]

logger = logging.getLogger("fashiontag_pipeline.daemon")


async def still_held(lease: Lease, keeper: LeaseKeeper, ledger: PostgresClaimLedger | None) -> None:
    """Raise :class:`LeaseLostError` unless ``lease`` holds now, asked of the database
    (a fenced check): called right before a file the consumers read is written (a
    summary, the published outputs), which no fence of the state can hold back. A
    daemon paused past its lease and woken after another finished the manifest would
    otherwise write its own summary over the finished one."""
    if keeper.overdue(lease):
        raise exc.LeaseLostError(f"lost the lease of {lease.name!r}", manifest=lease.name)
    if ledger is None:
        return

    def check() -> None:
        with ledger.fenced(lease):
            pass

    await anyio.to_thread.run_sync(check)


def check_reuse(location: str | None) -> None:
    """``--reuse``: the result store opened (made when missing) and closed again at the start.
    Each manifest's engine opens it for itself; a store that cannot be used at all (a password
    refused) would fail each manifest in turn, attempt after attempt, and send it to
    ``failed/``: it stops the daemon now, with the reason, as with a state file."""
    if location is None:
        return
    store = open_store(location)
    try:
        said_created(store, logger)
    finally:
        store.close()


async def queued(daemon: Daemon, ledger: PostgresClaimLedger, *, leasing: bool = True) -> None:
    """The claims no daemon leases yet (``/status``'s queue, the gauge), asked at each turn
    of the lease loop; whether the state answers goes to ``/readyz`` (a daemon whose database
    is gone leases nothing: it said ready all along). ``leasing`` False: this turn's leases
    could not be written, and a read that answers does not make the state writable (a
    read-only database, a hot standby: /readyz said 200 between two failed leases)."""
    try:
        daemon.unleased = await anyio.to_thread.run_sync(ledger.unleased)
    except exc.StateError as err:
        daemon.health.mark_store_unwritable(str(err))
    else:
        if leasing:
            daemon.health.mark_store_writable()


def drop_settled(ledger: PostgresClaimLedger | None, url: str, idle_timeout: float) -> None:
    """The states of manifests settled by a daemon that died before dropping them."""
    if ledger is None:
        return
    for claim_id in ledger.settled_claim_states():
        drop_state(claim_state_url(url, claim_id), idle_timeout=idle_timeout)


def drop_done(url: str, claim_id: int, idle_timeout: float) -> None:
    """Drop the state of a manifest this daemon settled, then give the C heap's free memory
    back to the system (see :mod:`.heap`: else the RSS grows with every manifest)."""
    try:
        drop_state(claim_state_url(url, claim_id), idle_timeout=idle_timeout)
    finally:
        release_free_heap()


async def hand_back(
    lease: Lease,
    keeper: LeaseKeeper,
    daemon: Daemon,
    err: exc.SchemaTooNewError | exc.ResumeMismatchError,
) -> None:
    """This daemon cannot tag the manifest, and the manifest is not at fault. The manifest is
    handed back at once (no attempt counted: it never goes to failed/) for another daemon to
    take:

    * the database was migrated by a newer fashiontag (daemons upgraded one at a time): this
      one drains and stops (its run raises ``err``: exit 1, saying to upgrade it);
    * the manifest was begun on another service, account or question than this daemon is
      given (a unit file edited on one machine only, a canary aimed at staging): taken as
      forgotten, its tasks' rows were sent and billed again. This daemon leaves it to one
      given what it was begun with (asking again after ``FOREIGN_RETRY``: the first service
      may be gone by then) and goes on with the others: which of the two is the
      misconfigured one, it cannot tell, and stopping would let one canary's manifest stop
      every daemon of the fleet, one after the other."""
    with contextlib.suppress(exc.StateError):  # (else its lease ends by itself)
        await keeper.release(lease)
    if isinstance(err, exc.ResumeMismatchError):
        logger.error(
            "the manifest was begun with another service, account or question than this"
            " daemon is given; it is handed back, for a daemon given those to finish",
            extra={"manifest": lease.name, "reason": str(err)},
        )
        return
    if not daemon.health.draining:
        logger.error(
            "the database was migrated by a newer fashiontag: this daemon stops taking"
            " manifests (upgrade it); the manifest is handed back",
            extra={"manifest": lease.name, "reason": str(err)},
        )
    daemon.stop()


async def run_leased(
    claim: Claim,
    paths: tuple[Path, Path],
    db: PostgresStateDB,
    own: RunControl,
    lost: anyio.Event,
    watch: Callable[[Job], None],
    client: TaggerClient,
    *,
    lease: Lease,
    keeper: LeaseKeeper,
    control: RunControl,
    engine_config: EngineConfig,
) -> RunSummary:
    """The manifest's engine, stopped by the daemon's drain (``control``) and aborted by the
    lease's loss. Its writes to the service go out only while the lease holds on this
    process's clock (:data:`WRITE_GUARD`): woken past it, a write on its way is not sent."""

    def guard() -> None:
        if keeper.overdue(lease):
            raise exc.LeaseLostError(f"lost the lease of {claim.name!r}", manifest=claim.name)

    token = WRITE_GUARD.set(guard)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_relay, own, control, lost)
            summary = await run_pipeline(
                [claim.path],
                client=client,
                out=paths[0],
                rejects=paths[1],
                state=db,
                engine=engine_config,
                control=own,
                watch=watch,
            )
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise first_error(group) from None
    finally:
        WRITE_GUARD.reset(token)
    return summary


async def _relay(own: RunControl, control: RunControl, lost: anyio.Event) -> None:
    """The daemon's drain (stop, then abort) and the lease's loss (abort: nothing more can be
    written) reach the manifest's engine."""

    async def drain() -> None:
        await control.stopping.wait()
        own.stop()
        await control.aborting.wait()
        own.abort()

    async def lose() -> None:
        await lost.wait()
        own.abort()

    async with anyio.create_task_group() as tg:
        tg.start_soon(drain)
        tg.start_soon(lose)
