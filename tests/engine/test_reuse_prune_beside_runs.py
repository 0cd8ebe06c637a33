"""``fashiontag reuse prune`` (a 3 a.m. cron job) while runs use the same result store.

* PostgreSQL: a run re-tags a row whose stored result is past its ``--reuse-max-age`` and
  stores the fresh result (``ON CONFLICT DO UPDATE``) while ``prune --older-than`` the same
  age deletes old results. The prune's batch picked the row by its old ``stored_at``, waited
  for the run's row lock, and deleted the row the run had just refreshed: the result paid for
  tonight was gone, and tomorrow night the row was tagged (billed) again.
* PostgreSQL: the prune deletes in ``stored_at`` order, a run stores in fingerprint order;
  each could hold a row the other waited for, PostgreSQL aborted one (``deadlock detected``)
  and, the prune being the one, the cron job failed (exit 1) while the run's store tried
  again.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from fashiontag_pipeline.engine.reuse import open_store

RESULT = b'{"status":"success","data":{"objects":[]}}'
FRESH = b'{"status":"success","data":{"objects":[{"label":"dress"}]}}'


def _waiting_on_a_lock(conn: Any, pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(row and row[0] == "Lock")


def test_prune_never_deletes_a_result_a_run_stored_again_meanwhile(postgres_url: str) -> None:
    """The run refreshes an old row's result while the prune's batch waits for that row: the
    prune deletes the other old rows and leaves the fresh result (not billed again)."""
    run, cron, watcher = (open_store(postgres_url) for _ in range(3))
    now = time.time()
    old = now - 40 * 86_400
    refreshed, stale = b"r" * 16, b"s" * 16
    try:
        run.put([(refreshed, "t-old", RESULT), (stale, "t-old", RESULT)], stored_at=old)
        deleted: list[int] = []
        errors: list[BaseException] = []

        def prune() -> None:
            try:
                deleted.append(cron.prune(30 * 86_400))
            except BaseException as err:
                errors.append(err)

        writer = run._writer  # type: ignore[attr-defined]
        cron_pid = cron._writer.info.backend_pid  # type: ignore[attr-defined]
        with writer.transaction():  # the run's put, not yet committed
            run.put([(refreshed, "t-new", FRESH)], stored_at=now)
            thread = threading.Thread(target=prune)
            thread.start()
            deadline = time.monotonic() + 20
            while not _waiting_on_a_lock(watcher._writer, cron_pid):  # type: ignore[attr-defined]
                assert thread.is_alive() and time.monotonic() < deadline, "prune never waited"
                time.sleep(0.01)
        thread.join(20)
        assert not thread.is_alive() and errors == []
        found = watcher.lookup([refreshed, stale], newer_than=now - 30 * 86_400)
        assert found.get(refreshed) is not None, "the result stored tonight was pruned"
        assert found[refreshed].result == FRESH
        assert watcher.lookup([stale], newer_than=0.0) == {}
        assert deleted == [1]
    finally:
        for store in (run, cron, watcher):
            store.close()


def test_prune_deadlocked_with_a_run_storing_results_goes_on(postgres_url: str) -> None:
    """The prune deletes old rows in ``stored_at`` order, a run stores their fresh results in
    fingerprint order: each may hold a row the other waits for, and PostgreSQL aborts one
    (``deadlock detected``). The run's store tries again; the prune did not, and the cron job
    failed (exit 1). It tries again too: both finish, the fresh results stay."""
    run, cron, watcher = (open_store(postgres_url) for _ in range(3))
    now = time.time()
    first, second = b"a" * 16, b"b" * 16  # the run stores a then b; the prune deletes b first
    try:
        run.put([(second, "t-old", RESULT)], stored_at=now - 50 * 86_400)
        run.put([(first, "t-old", RESULT)], stored_at=now - 40 * 86_400)
        errors: list[BaseException] = []

        def prune() -> None:
            try:
                cron.prune(30 * 86_400)
            except BaseException as err:
                errors.append(err)

        writer = run._writer  # type: ignore[attr-defined]
        writer.execute("SET deadlock_timeout = '20s'")  # the prune finds it (as put retries)
        cron_pid = cron._writer.info.backend_pid  # type: ignore[attr-defined]
        with writer.transaction():
            run.put([(first, "t-new", FRESH)], stored_at=now)
            thread = threading.Thread(target=prune)
            thread.start()
            deadline = time.monotonic() + 20
            while not _waiting_on_a_lock(watcher._writer, cron_pid):  # type: ignore[attr-defined]
                assert thread.is_alive() and time.monotonic() < deadline, "prune never waited"
                time.sleep(0.01)
            run.put([(second, "t-new", FRESH)], stored_at=now)  # waits on the prune's row
        thread.join(20)
        assert not thread.is_alive()
        assert errors == []
        found = watcher.lookup([first, second], newer_than=now - 1)
        assert {fp: r.result for fp, r in found.items()} == {first: FRESH, second: FRESH}
    finally:
        for store in (run, cron, watcher):
            store.close()
