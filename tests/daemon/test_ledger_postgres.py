"""Manifest leases on a real PostgreSQL (DESIGN section 8): disjoint claims under a race,
takeover of an expired lease with a higher epoch, fenced writes refused once the lease moved,
a paused keeper that loses its lease, and a server restart in the middle of it all.

Leases are long (30 s) where a test needs one to hold, however slow the machine; a test
that needs one to end either moves it into the past in the database (:func:`expire`: the
database's clock passing the lease, without a sleep) or, where real time is the point, waits
longer than a short lease (which always works, however slow the machine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest

from fashiontag_pipeline import LeaseLostError, StateError
from fashiontag_pipeline.daemon.keeper import LeaseKeeper
from fashiontag_pipeline.daemon.leases import (
    Lease,
    PostgresClaimLedger,
    afence,
    fence,
)
from fashiontag_pipeline.daemon.ledger import ClaimRecord

from ..postgres import PostgresCluster

SHORT = 1.0  # a lease a test lets expire in real time
EXPIRED = 1.5  # how long the test waits for it


@pytest.fixture
def open_ledger(postgres_url: str) -> Iterator[Callable[..., PostgresClaimLedger]]:
    """Daemons on one database: each call is another daemon (its own owner and pool)."""
    opened: list[PostgresClaimLedger] = []

    def make(owner: str, lease: float = 30.0) -> PostgresClaimLedger:
        ledger = PostgresClaimLedger(postgres_url, owner=owner, lease=lease)
        opened.append(ledger)
        return ledger

    yield make
    for ledger in opened:
        ledger.close()


def claim(ledger: PostgresClaimLedger, *names: str) -> None:
    for i, name in enumerate(names):
        ledger.record_claim(
            ClaimRecord(name=name, sha256=f"{i:064x}", size=1, claimed_at=1.7e9 + i)
        )


def expire(url: str, lease: Lease) -> None:
    """The database's clock passes the lease's end (as if its owner were paused that long)."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE claims SET lease_expires_at = statement_timestamp() - interval '1 s' "
            "WHERE id = %s",
            (lease.claim_id,),
        )


def checkpoint(conn: psycopg.Connection[tuple[object, ...]], lease: Lease, value: str) -> None:
    """A stand-in for a manifest's state write (the engine's checkpoint, later)."""
    conn.execute("CREATE TABLE IF NOT EXISTS checkpoints (claim_id bigint, value text)")
    conn.execute("INSERT INTO checkpoints VALUES (%s, %s)", (lease.claim_id, value))


def checkpoints(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT value FROM checkpoints ORDER BY value")]


def test_two_daemons_racing_get_disjoint_leases(
    open_ledger: Callable[..., PostgresClaimLedger],
) -> None:
    a, b = open_ledger("daemon-a"), open_ledger("daemon-b")
    names = [f"m{i:03}.csv" for i in range(60)]
    claim(a, *names)
    got: dict[str, list[Lease]] = {"daemon-a": [], "daemon-b": []}
    barrier = threading.Barrier(2)

    def take(ledger: PostgresClaimLedger) -> None:
        barrier.wait()
        while leases := ledger.acquire(3):
            got[ledger.owner].extend(leases)

    threads = [threading.Thread(target=take, args=(ledger,)) for ledger in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    taken_a = {lease.name for lease in got["daemon-a"]}
    taken_b = {lease.name for lease in got["daemon-b"]}
    assert taken_a.isdisjoint(taken_b)
    assert taken_a | taken_b == set(names)
    assert len(got["daemon-a"]) + len(got["daemon-b"]) == len(names)
    assert {lease.epoch for leases in got.values() for lease in leases} == {1}
    assert a.acquire(10) == [] and b.acquire(10) == []  # all held, none expired


def test_an_expired_lease_is_taken_over_with_a_higher_epoch_and_fences_the_old_owner(
    open_ledger: Callable[..., PostgresClaimLedger], postgres_url: str
) -> None:
    a, b = open_ledger("daemon-a"), open_ledger("daemon-b")
    claim(a, "cat.csv")
    [old] = a.acquire()
    with a.fenced(old) as conn:
        checkpoint(conn, old, "1 by a")
    assert b.acquire() == []  # held: not taken
    expire(postgres_url, old)  # a is paused past its lease: no renewal
    [new] = b.acquire()
    assert (new.claim_id, new.owner, new.epoch) == (old.claim_id, "daemon-b", old.epoch + 1)

    assert a.renew([old]) == {}  # lost
    with pytest.raises(LeaseLostError) as caught, a.fenced(old) as conn:
        checkpoint(conn, old, "2 by a (stale)")
    assert caught.value.manifest == "cat.csv" and caught.value.epoch == old.epoch
    with pytest.raises(LeaseLostError):
        a.record_settled("cat.csv", "done", "done/cat.csv", lease=old)
    assert a.release(old) is False  # cannot give away what it no longer holds

    with b.fenced(new) as conn:
        checkpoint(conn, new, "2 by b")
    b.record_settled("cat.csv", "done", "done/cat.csv", lease=new)
    assert checkpoints(postgres_url) == ["1 by a", "2 by b"]
    record = b.lookup("cat.csv")
    assert record is not None and record.status == "done"


def test_a_fence_in_the_callers_own_transaction(
    open_ledger: Callable[..., PostgresClaimLedger], postgres_url: str
) -> None:
    """fence() works in any transaction (the engine's state store will call it in its own)."""
    a, b = open_ledger("daemon-a"), open_ledger("daemon-b")
    claim(a, "cat.csv")
    [lease] = a.acquire()
    with psycopg.connect(postgres_url) as conn:
        fence(conn, lease)
        checkpoint(conn, lease, "kept")
        conn.commit()
        expire(postgres_url, lease)
        [_taken] = b.acquire()
        with pytest.raises(LeaseLostError):
            fence(conn, lease)
            checkpoint(conn, lease, "refused")
        conn.rollback()
    assert checkpoints(postgres_url) == ["kept"]


async def test_afence_on_an_async_connection(
    open_ledger: Callable[..., PostgresClaimLedger], postgres_url: str
) -> None:
    a = open_ledger("daemon-a")
    claim(a, "cat.csv")
    [lease] = a.acquire()
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        await afence(conn, lease)
        await conn.rollback()
        a.release(lease)
        with pytest.raises(LeaseLostError):
            await afence(conn, lease)


def test_a_takeover_waits_for_a_fenced_transaction_in_progress(
    open_ledger: Callable[..., PostgresClaimLedger], postgres_url: str
) -> None:
    """The fence locks the row: a lease that ends while its owner is committing is not taken
    over until that commit is done, so the taker sees the write (or the writer is refused)."""
    a, b = open_ledger("daemon-a", lease=SHORT), open_ledger("daemon-b")
    claim(a, "cat.csv")
    [old] = a.acquire()
    with a.fenced(old) as conn:
        checkpoint(conn, old, "committed while expiring")
        # The lease ends during the transaction (busy, not idle: an idle one would be ended
        # by the server after a lease, see the SIGSTOP test below).
        conn.execute("SELECT pg_sleep(%s)", (EXPIRED,))
        assert b.acquire() == []  # skipped (locked), not stolen mid-commit
    [new] = b.acquire()
    assert new.epoch == old.epoch + 1
    assert checkpoints(postgres_url) == ["committed while expiring"]


def test_renewals_are_not_held_up_by_a_fenced_transaction_in_progress(
    open_ledger: Callable[..., PostgresClaimLedger],
) -> None:
    """A daemon commits back to back; its keeper must still renew (or the lease would end
    under a busy daemon)."""
    a = open_ledger("daemon-a")
    claim(a, "cat.csv")
    [lease] = a.acquire()
    renewed: list[dict[int, Lease]] = []
    with a.fenced(lease) as conn:
        checkpoint(conn, lease, "open")
        renewal = threading.Thread(target=lambda: renewed.append(a.renew([lease])))
        renewal.start()
        renewal.join(timeout=20)
        assert renewed, "the renewal waited for the fenced transaction"
    assert renewed[0].keys() == {lease.claim_id}


def test_a_released_lease_is_acquired_at_once_by_another(
    open_ledger: Callable[..., PostgresClaimLedger],
) -> None:
    a, b = open_ledger("daemon-a"), open_ledger("daemon-b")
    claim(a, "cat.csv", "dog.csv")
    first, second = a.acquire(2)
    assert a.release(first) is True
    [again] = b.acquire(5)
    assert (again.name, again.epoch) == (first.name, 2)
    assert a.renew([first, second]).keys() == {second.claim_id}


def test_a_claim_recorded_again_fences_its_old_lease(
    open_ledger: Callable[..., PostgresClaimLedger],
) -> None:
    a = open_ledger("daemon-a")
    claim(a, "cat.csv")
    [lease] = a.acquire()
    claim(a, "cat.csv")  # the same name claimed again (the ledger contract: replaced)
    with pytest.raises(LeaseLostError), a.fenced(lease):
        pass
    [fresh] = a.acquire()
    assert fresh.claim_id != lease.claim_id


def test_renewal_extends_in_database_time(
    open_ledger: Callable[..., PostgresClaimLedger],
) -> None:
    a = open_ledger("daemon-a", lease=30.0)
    claim(a, "cat.csv")
    [lease] = a.acquire()
    time.sleep(0.05)
    renewed = a.renew([lease])[lease.claim_id]
    assert renewed.epoch == lease.epoch and renewed.expires_at > lease.expires_at


def test_the_repr_hides_the_password(postgres_cluster: PostgresCluster, postgres_url: str) -> None:
    # The test server trusts local connections: the password is accepted and ignored.
    url = postgres_url.replace("postgresql://postgres@", "postgresql://postgres:SECRET-PW@")
    ledger = PostgresClaimLedger(url, owner="a")
    try:
        assert "SECRET-PW" not in repr(ledger)
    finally:
        ledger.close()


async def test_a_keeper_holds_its_leases_past_their_length(
    open_ledger: Callable[..., PostgresClaimLedger],
) -> None:
    a, b = open_ledger("daemon-a", lease=3.0), open_ledger("daemon-b")
    claim(a, "cat.csv")
    keeper = LeaseKeeper(a, retry_interval=0.1)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(keeper.run)
            [lease] = await keeper.acquire()
            await anyio.sleep(4.0)  # more than a lease: renewed meanwhile (every second)
            assert b.acquire() == []
            assert not keeper.lost_event(lease).is_set()
            current = keeper.lease_of(lease.claim_id)
            assert current is not None and current.expires_at > lease.expires_at
            with a.fenced(current):
                pass
            tg.cancel_scope.cancel()


async def test_a_lease_counts_from_its_statement_not_from_the_wait_for_a_connection(
    postgres_url: str,
) -> None:
    """A lease was counted on this process's clock from before the wait for a connection of
    the pool, and the database counts it from its statement: after a failover or a
    ``pg_terminate_backend`` (the pool reconnecting, ~1 s here) or with every connection busy,
    a lease came back already past its local deadline, declared lost at once, and the manifest
    just leased was taken over by this same daemon, whose resume then waited up to 74 s for a
    create the lost attempt might have sent. The wait for the connection no longer counts."""
    ledger = PostgresClaimLedger(postgres_url, owner="daemon-a", lease=1.0, max_connections=1)
    try:
        claim(ledger, "busy.csv", "next.csv")
        [busy] = ledger.acquire()
        keeper = LeaseKeeper(ledger, retry_interval=0.1)
        writing = threading.Event()

        def write_slowly() -> None:  # a state write holding the pool's one connection
            with ledger.fenced(busy) as conn:
                writing.set()
                conn.execute("SELECT pg_sleep(1.3)")

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, write_slowly)
                await anyio.to_thread.run_sync(writing.wait)
                [lease] = await keeper.acquire()
        assert not keeper.overdue(lease), "lost as soon as it was leased"
    finally:
        ledger.close()


async def test_a_paused_keeper_loses_its_lease_and_cannot_write(
    open_ledger: Callable[..., PostgresClaimLedger], postgres_url: str
) -> None:
    a, b = open_ledger("daemon-a", lease=0.6), open_ledger("daemon-b")
    claim(a, "cat.csv")
    keeper = LeaseKeeper(a, retry_interval=0.1)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(keeper.run)
            [lease] = await keeper.acquire()
            tg.cancel_scope.cancel()  # paused: renewals stop (SIGSTOP, a long GC, a partition)
        await anyio.sleep(1.0)  # past the lease
        [taken] = b.acquire()
        assert taken.epoch == lease.epoch + 1
        async with anyio.create_task_group() as tg:  # resumed (SIGCONT)
            await tg.start(keeper.run)
            await keeper.lost_event(lease).wait()
            tg.cancel_scope.cancel()
    assert keeper.held() == [] and keeper.lease_of(lease.claim_id) is None
    with pytest.raises(LeaseLostError), a.fenced(lease) as conn:
        checkpoint(conn, lease, "stale write")
    with pytest.raises(LeaseLostError):
        a.record_settled("cat.csv", "done", "done/cat.csv", lease=lease)


async def test_a_lease_past_its_deadline_is_overdue_before_the_keeper_wakes(
    open_ledger: Callable[..., PostgresClaimLedger],
) -> None:
    """A process paused past its lease: before the keeper's next renewal has run, the lease
    already counts as lost (its work may fail on a state another daemon took over first)."""
    a = open_ledger("daemon-a", lease=3.0)
    claim(a, "cat.csv")
    now = [100.0]
    keeper = LeaseKeeper(a, clock=lambda: now[0], retry_interval=0.1)
    [lease] = await keeper.acquire()
    assert not keeper.overdue(lease)
    now[0] += 2.9
    assert not keeper.overdue(lease) and not keeper.lost_event(lease).is_set()
    now[0] += 0.2  # past the lease on this process's clock: no renewal ran meanwhile
    assert keeper.overdue(lease) and keeper.lost_event(lease).is_set()
    assert keeper.lease_of(lease.claim_id) is None


async def test_a_keeper_that_cannot_reach_the_database_declares_its_leases_lost(
    postgres_cluster: PostgresCluster, open_ledger: Callable[..., PostgresClaimLedger]
) -> None:
    """No answer for a whole lease: the keeper cannot know whether another daemon took over,
    so it signals the loss (by its own monotonic clock, from the last renewal it sent)."""
    a = open_ledger("daemon-a", lease=1.0)
    claim(a, "cat.csv")
    keeper = LeaseKeeper(a, retry_interval=0.1)
    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                await tg.start(keeper.run)
                [lease] = await keeper.acquire()
                await anyio.to_thread.run_sync(postgres_cluster.stop)
                await keeper.lost_event(lease).wait()
                tg.cancel_scope.cancel()
    finally:
        postgres_cluster.start()


def test_the_ledger_connects_again_soon_after_a_long_outage_ends(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    """The database down for a while (a failover, a restart that took a minute): the pool's
    reconnection backed off 1, 2, 4, 8... seconds up to five minutes and made no attempt in
    between, so after an outage of N seconds the daemons leased nothing for up to N more
    (after 40 s, 24 s idle with the database back; /readyz 503). The wait between attempts is
    now bounded by the connect timeout: here 1 s, so the ledger is used again ~1 s after the
    database's return. The outage ends just after the old backoff's attempt at ~15 s, whose
    next came at ~31 s: 12 s later, against the 6 s allowed (room for a loaded machine)."""
    ledger = PostgresClaimLedger(postgres_url, owner="daemon-a", connect_timeout=1.0)
    try:
        claim(ledger, "cat.csv")
        postgres_cluster.stop()
        try:
            down = time.monotonic()
            while time.monotonic() - down < 16.0:  # the daemon's calls go on failing
                with pytest.raises(StateError):
                    ledger.in_flight()
                time.sleep(0.2)
        finally:
            postgres_cluster.start()
        back = time.monotonic()
        while True:
            try:
                names = [r.name for r in ledger.in_flight()]
                break
            except StateError:
                assert time.monotonic() - back < 30.0
                time.sleep(0.1)
        waited = time.monotonic() - back
        assert names == ["cat.csv"]
        assert waited < 6.0, f"the database was back {waited:.1f} s before the ledger used it"
    finally:
        ledger.close()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_postgresql_restart_mid_run_reconnects_and_continues(
    postgres_cluster: PostgresCluster,
    open_ledger: Callable[..., PostgresClaimLedger],
    postgres_url: str,
    mode: str,
) -> None:
    """The server restarts (cleanly, or as a crash) while a daemon holds leases and writes:
    the keeper renews through it, the ledger reconnects, and nothing committed is lost."""
    a, b = open_ledger("daemon-a", lease=6.0), open_ledger("daemon-b")
    claim(a, "cat.csv", "dog.csv")
    keeper = LeaseKeeper(a, retry_interval=0.1)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await tg.start(keeper.run)
            cat, dog = await keeper.acquire(2)
            with a.fenced(cat) as conn:
                checkpoint(conn, cat, "before")
            await anyio.to_thread.run_sync(postgres_cluster.restart, mode)
            # Writes continue at once on fresh connections.
            with a.fenced(cat) as conn:
                checkpoint(conn, cat, "after")
            a.record_settled("dog.csv", "done", "done/dog.csv", lease=dog)
            keeper.forget(dog)
            claim(a, "new.csv")
            # The keeper renews through the restart: the lease outlives its first length.
            while (current := keeper.lease_of(cat.claim_id)) is not None and (
                current.expires_at <= cat.expires_at
            ):
                await anyio.sleep(0.1)
            assert not keeper.lost_event(cat).is_set()
            assert [lease.name for lease in b.acquire(5)] == ["new.csv"]  # cat is still held
            tg.cancel_scope.cancel()
    assert checkpoints(postgres_url) == ["after", "before"]
    assert [r.name for r in a.in_flight()] == ["cat.csv", "new.csv"]


#: A daemon reduced to its writes: it keeps its lease with a LeaseKeeper and commits one
#: checkpoint after another, each in a fenced transaction that stays open for a while. It never
#: looks at the keeper's loss signal: only the fence stops it.
PAUSED_WRITER = """
import sys, time
import anyio, anyio.to_thread
from fashiontag_pipeline import LeaseLostError, StateError
from fashiontag_pipeline.daemon.keeper import LeaseKeeper
from fashiontag_pipeline.daemon.leases import PostgresClaimLedger

ledger = PostgresClaimLedger(sys.argv[1], owner="paused", lease=1.0)

async def main() -> int:
    keeper = LeaseKeeper(ledger, retry_interval=0.1)
    async with anyio.create_task_group() as tg:
        await tg.start(keeper.run)
        [lease] = await keeper.acquire()

        def write(seq: int) -> None:
            with ledger.fenced(lease) as conn:
                conn.execute("INSERT INTO checkpoints VALUES (%s, %s)", (lease.epoch, seq))
                print(f"writing {seq}", flush=True)
                time.sleep(0.5)  # still in the transaction (a SIGSTOP lands here)

        seq = 0
        while True:
            seq += 1
            try:
                await anyio.to_thread.run_sync(write, seq)
            except LeaseLostError:
                print("lost", flush=True)
                tg.cancel_scope.cancel()
                return 3
            except StateError:
                print(f"failed {seq}", flush=True)
    return 0

code = anyio.run(main)
ledger.close()
sys.exit(code)
"""


def test_a_process_stopped_past_its_lease_cannot_write_after_it_continues(
    open_ledger: Callable[..., PostgresClaimLedger], postgres_url: str, tmp_path: Path
) -> None:
    """SIGSTOP in the middle of a fenced transaction, past the lease; another daemon takes the
    manifest over (the server ends the stopped one's open transaction, so its row lock does not
    block the takeover forever); SIGCONT: the stopped process commits nothing more."""
    b = open_ledger("daemon-b")
    claim(b, "cat.csv")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE checkpoints (epoch bigint, seq bigint)")
    errors = tmp_path / "writer.stderr"
    with errors.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", PAUSED_WRITER, postgres_url],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert child.stdout is not None
    try:
        seen = []
        while not (line := child.stdout.readline()).startswith("writing 3"):
            seen.append(line)
            assert line, f"the writer stopped early: {seen} {errors.read_text()}"
        os.kill(child.pid, signal.SIGSTOP)  # inside the transaction of checkpoint 3
        deadline = time.monotonic() + 30
        while not (taken := b.acquire()):
            assert time.monotonic() < deadline, "the stopped writer's lease was never taken over"
            time.sleep(0.1)
        [lease] = taken
        assert (lease.owner, lease.epoch) == ("daemon-b", 2)
        with b.fenced(lease) as conn:
            conn.execute("INSERT INTO checkpoints VALUES (%s, %s)", (lease.epoch, 1000))
        os.kill(child.pid, signal.SIGCONT)
        rest, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait()
        child.stdout.close()
    assert child.returncode == 3 and rest.splitlines()[-1] == "lost"
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT epoch, seq FROM checkpoints ORDER BY seq").fetchall()
    assert rows == [(1, 1), (1, 2), (2, 1000)]  # checkpoint 3 and anything later: never kept


def test_states_of_settled_claims_are_found_for_collection(
    open_ledger: Callable[..., PostgresClaimLedger], postgres_url: str
) -> None:
    from fashiontag_pipeline.engine.state.pgstore import PostgresStateDB, drop_state

    ledger = open_ledger(owner="a")
    claim(ledger, "m1.csv", "m2.csv")
    first, second = ledger.acquire(2)
    for lease in (first, second):
        PostgresStateDB(f"{postgres_url}#claim_{lease.claim_id}", fence=lambda conn: None).close()
    ledger.record_settled("m1.csv", "done", "done/m1.csv", lease=first)
    assert ledger.settled_claim_states() == [first.claim_id]  # m2 is still in flight
    drop_state(f"{postgres_url}#claim_{first.claim_id}")
    assert ledger.settled_claim_states() == []


async def test_forgetting_a_lost_lease_keeps_the_newer_lease_of_the_same_claim(
    open_ledger: Callable[..., PostgresClaimLedger], postgres_url: str
) -> None:
    """A daemon that leases a claim again (its earlier lease ended) while the earlier lease's
    task is still ending: that task forgetting or releasing its lease must not drop the new one."""
    ledger = open_ledger(owner="a")
    claim(ledger, "m.csv")
    keeper = LeaseKeeper(ledger)
    [old] = await keeper.acquire(1)
    expire(postgres_url, old)
    [new] = await keeper.acquire(1)
    assert (new.claim_id, new.epoch) == (old.claim_id, old.epoch + 1)
    keeper.forget(old)
    await keeper.release(old)  # refused by the database (an old epoch): nothing changes
    assert keeper.lease_of(new.claim_id) == new
    assert ledger.renew([new]).keys() == {new.claim_id}


async def test_a_keeper_keeps_nothing_of_the_leases_it_is_done_with(
    open_ledger: Callable[..., PostgresClaimLedger],
) -> None:
    """A daemon lives for weeks and leases every manifest it tags: once a lease's work is over
    (settled: forgotten; handed back: released; lost, then forgotten), the keeper keeps nothing
    of it. Before, an event per lease ever held stayed for the daemon's life (about 900 bytes
    a manifest, 250 manifests: 0.2 MiB)."""
    a = open_ledger("daemon-a")
    names = [f"m{i}.csv" for i in range(30)]
    claim(a, *names)
    now = [100.0]
    keeper = LeaseKeeper(a, clock=lambda: now[0], retry_interval=0.1)
    for i in range(len(names)):
        [lease] = await keeper.acquire()
        assert not keeper.lost_event(lease).is_set()
        if i % 3 == 0:
            keeper.forget(lease)
        elif i % 3 == 1:
            await keeper.release(lease)
        else:
            now[0] += 31.0  # past its lease on this process's clock: lost
            assert keeper.overdue(lease)
            keeper.forget(lease)
    assert keeper.held() == []
    assert keeper._lost == {} and keeper._deadline == {}
