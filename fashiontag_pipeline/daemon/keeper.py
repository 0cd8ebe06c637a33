"""A daemon's leases, held: renewed in the background, each one signalled when it is lost.

:class:`LeaseKeeper` keeps the leases a daemon took from the :class:`~.leases.PostgresClaimLedger`
(where the leases and the fence live) for as long as their work runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Iterator

import anyio
import anyio.abc
import anyio.to_thread

from .._exceptions import FashiontagError, LeaseLostError, StateError
from .leases import Lease, PostgresClaimLedger

__all__ = ["FOREIGN_RETRY", "ForeignClaims", "LeaseKeeper"]


class LeaseKeeper:
    """Renews a daemon's leases in the background and signals each one it loses.

    Start :meth:`run` in the daemon's task group (``await tg.start(keeper.run)``); take work with
    :meth:`acquire`; watch :meth:`lost_event` of each lease (cancel that manifest's work when it
    is set). Every third of the lease, one statement renews all held leases. A lease is lost
    when the database says so, or when no renewal has succeeded for a whole lease length, as
    counted on this process's monotonic clock from the moment the last successful renewal was
    *sent*, its connection in hand (the database's expiry is later than that, so the daemon
    stops no later than the database lets another take over; the wait for a connection of the
    pool does not count: after a failover or with every connection busy, a lease counted from
    before it came back past its deadline, lost at once). Writes are safe either way: they are
    fenced.
    """

    def __init__(
        self,
        ledger: PostgresClaimLedger,
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_interval: float = 1.0,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._period = ledger.lease / 3
        self._retry = min(retry_interval, self._period)
        self._held: dict[int, Lease] = {}
        self._deadline: dict[int, float] = {}
        self._lost: dict[int, anyio.Event] = {}

    def held(self) -> list[Lease]:
        """The leases held now (with their latest expiry), oldest claim first."""
        return [self._held[key] for key in sorted(self._held)]

    def lease_of(self, claim_id: int) -> Lease | None:
        """The current lease of a claim, or None when it is not held (never, lost, released)."""
        return self._held.get(claim_id)

    def lost_event(self, lease: Lease) -> anyio.Event:
        """Set when this lease is lost (stays set)."""
        return self._lost.setdefault(lease.claim_id, anyio.Event())

    def overdue(self, lease: Lease) -> bool:
        """True when the lease is lost, or past its deadline on this process's clock though no
        renewal has said so yet (a process paused longer than its lease wakes up with its work
        running before the keeper): it is then declared lost."""
        lost = self._lost.get(lease.claim_id)
        if lost is not None and lost.is_set():
            return True
        deadline = self._deadline.get(lease.claim_id)
        if deadline is not None and deadline <= self._clock():
            self._lose(lease.claim_id)
            return True
        return False

    @contextlib.contextmanager
    def lost_if_overdue(self, lease: Lease) -> Iterator[None]:
        """An error met past ``lease``'s deadline on this process's clock is the loss's, raised
        as :class:`LeaseLostError`. Woken past its lease (SIGSTOP, a long pause), a daemon
        opens or reads the manifest's state before this keeper notices the loss, and may meet
        it dropped by the daemon that took the manifest over and finished it ("schema ... does
        not exist"): not the manifest stopped on an error, to resume and count as an attempt.
        Another daemon can take the lease over only once that deadline has gone by (the
        database's expiry is later): an error before it is the manifest's own."""
        try:
            yield
        except LeaseLostError:
            raise
        except FashiontagError as err:
            if self.overdue(lease):
                raise LeaseLostError(
                    f"lost the lease of {lease.name!r}", manifest=lease.name
                ) from err
            raise

    def _hold(self, lease: Lease, sent_at: float) -> None:
        self._held[lease.claim_id] = lease
        self._deadline[lease.claim_id] = sent_at + self._ledger.lease
        self._lost[lease.claim_id] = anyio.Event()

    def _lose(self, claim_id: int) -> None:
        self._held.pop(claim_id, None)
        self._deadline.pop(claim_id, None)
        self._lost.setdefault(claim_id, anyio.Event()).set()

    async def acquire(self, limit: int = 1, skip: Collection[int] = ()) -> list[Lease]:
        """Lease up to ``limit`` manifests, none of ``skip`` (claim ids), and keep them
        (:meth:`PostgresClaimLedger.acquire`)."""
        sent_at = [self._clock()]  # (then when the pool gave the statement its connection)
        leases = await anyio.to_thread.run_sync(
            lambda: self._ledger.acquire(
                limit, skip=skip, connected=lambda: sent_at.append(self._clock())
            )
        )
        for lease in leases:
            self._hold(lease, sent_at[-1])
        return leases

    async def release(self, lease: Lease) -> None:
        """Stop renewing ``lease`` and give it up in the database (its work is finished or
        handed back). Not signalled as lost."""
        current = self._held.get(lease.claim_id)
        if current is None or current.epoch != lease.epoch:
            current = lease  # held no more, or held again under a newer epoch: not ours
        else:
            self._held.pop(lease.claim_id, None)
            self._deadline.pop(lease.claim_id, None)
        self._done_with(lease.claim_id)
        await anyio.to_thread.run_sync(self._ledger.release, current)

    def forget(self, lease: Lease) -> None:
        """Stop renewing ``lease`` without touching the database (its claim was settled). A
        newer lease of the same claim (acquired again after this one was lost) is kept."""
        current = self._held.get(lease.claim_id)
        if current is not None and current.epoch == lease.epoch:
            self._held.pop(lease.claim_id, None)
            self._deadline.pop(lease.claim_id, None)
        self._done_with(lease.claim_id)

    def _done_with(self, claim_id: int) -> None:
        """Its lease forgotten or released: the claim's loss event goes too, unless a newer
        lease of it is held (a daemon lives for weeks: one event per lease ever held stayed)."""
        if claim_id not in self._held:
            self._lost.pop(claim_id, None)

    def _expire_overdue(self) -> None:
        now = self._clock()
        for claim_id, deadline in list(self._deadline.items()):
            if deadline <= now:
                self._lose(claim_id)

    async def _renew_once(self) -> bool:
        """One renewal of every held lease; False if the database could not be asked."""
        sent = list(self._held.values())
        if not sent:
            return True
        sent_at = self._clock()
        wait = min(self._deadline.values()) - sent_at
        stamps = [sent_at]  # (then when the pool gave the statement its connection)
        renewed: dict[int, Lease] | None = None
        with anyio.move_on_after(max(wait, 0)):
            try:
                renewed = await anyio.to_thread.run_sync(
                    lambda: self._ledger.renew(
                        sent, connected=lambda: stamps.append(self._clock())
                    ),
                    abandon_on_cancel=True,
                )
            except StateError:
                renewed = None
        if renewed is None:
            self._expire_overdue()
            return False
        for lease in sent:
            if lease.claim_id not in self._held:
                continue  # released or forgotten meanwhile
            fresh = renewed.get(lease.claim_id)
            if fresh is None:
                self._lose(lease.claim_id)
            else:
                self._held[lease.claim_id] = fresh
                self._deadline[lease.claim_id] = stamps[-1] + self._ledger.lease
        return True

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Renew until cancelled: every third of the lease, sooner after a failed attempt, and
        in time to declare a lease lost at its local deadline. A lease acquired between two
        renewals is renewed at the next one (a third of the lease later at most)."""
        task_status.started()
        while True:
            ok = await self._renew_once()
            delay = self._period if ok else self._retry
            if self._deadline:
                delay = min(delay, max(min(self._deadline.values()) - self._clock(), 0))
            await anyio.sleep(delay)


#: How long (seconds) a daemon leaves a manifest begun on another service to the other daemons
#: before it asks again: the first service may be shut down meanwhile, or have forgotten the
#: tasks, and the question then lets this daemon resume the manifest.
FOREIGN_RETRY = 600.0


class ForeignClaims:
    """The claims this daemon met begun on another service, account or question than it is
    given (see :func:`~.leased.hand_back`): not leased again for :data:`FOREIGN_RETRY`
    seconds, then asked about again. Bounded: a claim leaves the set when its time is up."""

    def __init__(
        self, retry: float = FOREIGN_RETRY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._retry, self._clock = retry, clock
        self._since: dict[int, float] = {}

    def add(self, claim_id: int) -> None:
        self._since[claim_id] = self._clock()

    def current(self) -> list[int]:
        """The claims not to lease now (those whose time is up are dropped)."""
        now = self._clock()
        self._since = {c: t for c, t in self._since.items() if now - t < self._retry}
        return sorted(self._since)
