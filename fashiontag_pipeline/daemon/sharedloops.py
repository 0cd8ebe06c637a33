"""The inbox's loops of a daemon beside others (:mod:`.shared`): claiming ready manifests, and
repairing what a daemon that died between its rename and its record left. Each wakes the
lease loop (``wake``) when there may be a claim to lease."""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from .. import _exceptions as exc
from .inbox import Inbox
from .leased import drop_settled
from .leases import PostgresClaimLedger

__all__ = ["claim_loop", "repair_loop"]

logger = logging.getLogger("fashiontag_pipeline.daemon")


async def repair_loop(
    inbox: Inbox, ledger: PostgresClaimLedger, url: str, lease: float, wake: Callable[[], None]
) -> None:
    """Every lease length: claims a daemon renamed but never recorded (it died, or lost
    the database, in between) are recorded, so no manifest waits in ``.work`` for a
    restart; states of settled claims left behind are dropped."""
    while True:
        await anyio.sleep(lease)
        try:
            await anyio.to_thread.run_sync(inbox.repair_shared)
            await anyio.to_thread.run_sync(drop_settled, ledger, url, lease)
        except exc.StateError as err:
            logger.warning("cannot repair the claims: %s; retrying", err)
        else:
            wake()


async def claim_loop(
    inbox: Inbox, stopping: anyio.Event, scan_interval: float, wake: Callable[[], None]
) -> None:
    """Claim every ready manifest (the rename), and wake the lease loop for each."""
    claims = inbox.claims(stopping)
    try:
        while not stopping.is_set():
            try:
                await claims.__anext__()
            except exc.StateError as err:
                logger.warning("cannot record a claim: %s; retrying", err)
                await anyio.sleep(scan_interval)
                claims = inbox.claims(stopping)
                continue
            wake()
    finally:
        aclose = getattr(claims, "aclose", None)
        if aclose is not None:
            await aclose()
