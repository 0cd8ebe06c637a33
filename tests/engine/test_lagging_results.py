"""A results store that lags the task status: "done" is said, then the task's pages are short
for a while. The rows missing are read again for ``read_again_window`` seconds after the task
was seen done before they are sent (and billed) again, and that wait holds no page slot: the
other tasks' pages keep flowing.

Found so (each failing before its fix):

* a task whose pages came short waited out the window inside the page reader that read its
  last page, holding that reader's slot: with ``--page-concurrency 1`` no other task's page
  was read until the window had gone by (every task's reading serialized behind the wait);
* a store 5 s behind its status had the second half of every task sent (and billed) again,
  read again for 3 s only: 1,876 of 2,000 rows billed twice, 64 ended ``unreturned``, exit 0
  (``fashiontag run`` and the daemon, ``tests/daemon/test_lagging_results.py``);
* a run killed while it waited for a task's lagging rows, resumed once the lag was over, sent
  them again at once: which pages had come short was known only to the killed process;
* a store that catches up row by row (each pass finding a few rows more) had its reading ended
  by three passes that found rows, at once: 1,595 billed for 1,000 images, 8 ``unreturned``;
* a read again that met a 5 s outage (past the client's own retries) ended the reading: the
  500 rows still missing were sent (and billed) again;
* a restart read every page of a task with rows missing twice in a row (23 reads, not 12).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import anyio
import msgspec
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    ENV,
    TASKS_OF_1000,
    BilledProxy,
    assert_exactly_once,
    ids_of,
    kill_when,
    run_args,
    run_through,
    write_csv,
)
from .proxy import BULK, MisbehavingProxy, Misbehaviour

#: Tasks of 1,000 rows for ``fashiontag run`` and the daemon.
TASKS_OF_1000_FLAGS = ("--rotate-images", "1000", "--rotate-min-images", "1000")


class PageClock(MisbehavingProxy):
    """The misbehaving proxy that notes when each task's first and last results pages were
    asked for."""

    def __init__(self, rules: Misbehaviour) -> None:
        super().__init__("", rules)
        self.first_page_at: dict[str, float] = {}
        self.last_page_at: dict[str, float] = {}

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        if method == "GET" and task_id is not None and path != BULK and "/status" not in path:
            self.first_page_at.setdefault(task_id, time.monotonic())
            self.last_page_at[task_id] = time.monotonic()
        return super()._rewrite(method, path, task_id, status, payload)


async def test_a_task_waiting_for_missing_rows_holds_no_page_slot(tmp_path: Path) -> None:
    """Three tasks of 1,000 rows, done at once, each with one row the service never returns,
    read with one page slot: each task's missing row is read again for the window (5 s here)
    after it was seen done, and meanwhile the other tasks' pages are read. Before, the wait
    held the slot of the reader that read the task's last page: the other tasks' first pages
    were asked for 4.2 and 4.5 s after they were done (with a 4 s window), once the first
    task's window was over."""
    proxy = PageClock(Misbehaviour(never_returned={"p7", "p1007", "p2007"}))
    engine = msgspec.structs.replace(
        TASKS_OF_1000, max_page_concurrency=1, max_sends=1, read_again_window=5.0
    )
    with anyio.fail_after(60):
        summary, o = await run_through(tmp_path, 3000, proxy, engine, fail_after=None)
    assert summary.complete and summary.tagged == 2997
    assert sorted(r["id"] for r in o.rejects) == ["p1007", "p2007", "p7"]
    assert {r["stage"] for r in o.rejects} == {"unreturned"}
    assert len(proxy.created) == 3 and set(proxy.first_page_at) >= set(proxy.created)
    # Each task's pages are read again until its window (5 s) is over: every task's first
    # page comes before then, not after another task's window (its slot held meanwhile).
    after = {
        (a[:6], b[:6]): round(proxy.first_page_at[b] - proxy.last_page_at[a], 2)
        for a in proxy.created
        for b in proxy.created
        if a != b and proxy.first_page_at[b] >= proxy.last_page_at[a]
    }
    assert not after, f"a task's first page asked for after another's last: {after}"


async def test_fashiontag_run_against_a_results_store_5_s_behind_its_status(
    tmp_path: Path,
) -> None:
    """For 5 s after each task is shown done its pages hold only its first half (a results
    store that lags the status, as a service with a replica or a search index behind its
    status does): ``fashiontag run`` with its defaults reads the rest when it comes and bills
    every image once. Before, the pages were read again for 3 s only: the second half of every
    task was sent (and billed) again, to a new task whose pages lagged as well."""
    manifest = write_csv(tmp_path / "m.csv", 2000)
    out = tmp_path / "out.jsonl"
    proxy = BilledProxy(Misbehaviour(lagging_results=5.0))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    run_args(proxy.url, out, *TASKS_OF_1000_FLAGS, str(manifest)),
                    check=False,
                    env=ENV,
                )
            billed = svc.store.image_count
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(2000))
    assert len(o.results) == 2000 and not o.rejects
    twice = sum(1 for n in proxy.written.values() if n > 1)
    assert (billed, len(proxy.written), twice) == (2000, 2000, 0), "rows billed again"


async def test_a_row_never_returned_is_sent_again_after_the_window_given(tmp_path: Path) -> None:
    """``--read-again-window 0.5`` (and ``max_sends`` 2 in the config file): the row the
    service never returns is read again for half a second after each task is done, sent
    again, then an ``unreturned`` reject, in seconds; every other row is billed once."""
    manifest = write_csv(tmp_path / "m.csv", 300)
    config = tmp_path / "c.toml"
    config.write_text("[engine]\nmax_sends = 2\n")
    out = tmp_path / "out.jsonl"
    proxy = BilledProxy(Misbehaviour(never_returned={"p7"}))
    flags = ("--read-again-window", "0.5", "--config", str(config), str(manifest))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            began = time.monotonic()
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    run_args(proxy.url, out, *flags), check=False, env=ENV
                )
            took = time.monotonic() - began
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(300))
    assert [(r["id"], r["stage"]) for r in o.rejects] == [("p7", "unreturned")]
    assert proxy.written["p7"] == 2 and max(proxy.written.values()) == 2
    assert sum(proxy.written.values()) == 301
    assert took < 20, f"{took:.1f} s"  # (the default window, 30 s, would take over 30 s)


@pytest.mark.parametrize("value", ["-1", "inf", "nan", "soon"])
def test_a_read_again_window_that_is_no_finite_number_of_seconds_is_exit_2(
    tmp_path: Path, value: str
) -> None:
    manifest = write_csv(tmp_path / "m.csv", 3)
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        run_args("http://127.0.0.1:9", out, f"--read-again-window={value}", str(manifest)),
        capture_output=True,
        env=ENV,
        timeout=60,
    )
    err = done.stderr.decode()
    last = err.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in err, err
    assert "read-again-window" in last or "read_again_window" in last, err
    assert not out.exists()


async def test_killed_while_it_waits_for_lagging_rows_then_resumed_bills_them_once(
    tmp_path: Path,
) -> None:
    """``fashiontag run`` killed (SIGKILL) while it waits for the second half of a task whose
    results store lags its status (4 s), its first half written; the same command once the
    lag is over reads the task's pages again and finds the rest: every image billed once.
    Before, the resume read the task on from where the killed run had committed (its last
    page, full by then) and sent the rows without a line again at once, as the pages that had
    come short were known only to the killed process: 400 billed twice."""
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out, state = tmp_path / "out.jsonl", tmp_path / "state.sqlite"
    proxy = BilledProxy(Misbehaviour(lagging_results=4.0))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, "--state", str(state), str(manifest))

            def half_written() -> bool:
                return out.exists() and out.read_bytes().count(b"\n") >= 500

            proc = await anyio.open_process(args, env=ENV)
            await kill_when(proc, half_written)
            assert proxy.done_seen
            (done_at,) = proxy.done_seen.values()
            await anyio.sleep(max(0.0, done_at + 4.5 - time.monotonic()))  # the lag is over
            with anyio.fail_after(60):
                done = await anyio.run_process(args, check=False, env=ENV)
            billed = svc.store.image_count
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(1000))
    assert len(o.results) == 1000 and not o.rejects
    twice = sum(1 for n in proxy.written.values() if n > 1)
    assert (billed, len(proxy.written), twice) == (1000, 1000, 0), done.stderr.decode()[-3000:]


async def test_a_results_store_that_catches_up_row_by_row_is_read_to_its_end(
    tmp_path: Path,
) -> None:
    """The store catches up over 4 s row by row (each read of the task's pages finds a few
    rows more, not the whole second half at once): ``fashiontag run`` with its defaults reads
    the rest as it comes and bills every image once. Before, three passes that each found
    rows ended the reading at once, well inside the window: the rows still missing (most of
    the second half, ~490 of 1,000) were sent (and billed) again a fraction of a second after
    "done"."""
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out = tmp_path / "out.jsonl"
    proxy = BilledProxy(Misbehaviour(lagging_results=4.0, catching_up=True))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    run_args(proxy.url, out, *TASKS_OF_1000_FLAGS, str(manifest)),
                    check=False,
                    env=ENV,
                )
            billed = svc.store.image_count
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(1000))
    twice = sum(1 for n in proxy.written.values() if n > 1)
    stages = sorted({r["stage"] for r in o.rejects})
    assert (billed, twice, len(o.rejects), stages) == (1000, 0, 0, []), "rows billed again"


async def test_a_short_outage_while_lagging_rows_are_awaited_bills_them_once(
    tmp_path: Path,
) -> None:
    """The results pages answer 503 (Retry-After: 1) for 7 s, and until they refused 7 reads,
    from 1 s after a task whose store lags 4 s is done (its first half written): the reads
    again of its pages meet the outage, and the rest is read once it is over, well inside the
    window; every image billed once. Before, a read again that failed past the client's own
    retries (6 attempts, 5 s) ended the reading and the 500 rows still missing were sent (and
    billed) again, though the main page reads ride out such an outage (``--give-up-after``)."""
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out = tmp_path / "out.jsonl"
    proxy = BilledProxy(Misbehaviour(lagging_results=4.0, storm_retry_after="1"))
    proxy.rules.storm_ops = {"results"}
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, *TASKS_OF_1000_FLAGS, str(manifest))
            log = (tmp_path / "stderr").open("wb")
            async with await anyio.open_process(args, env=ENV, stderr=log) as proc:
                with anyio.fail_after(60):
                    while not (out.exists() and out.read_bytes().count(b"\n") >= 500):
                        assert proc.returncode is None
                        await anyio.sleep(0.005)
                    # (its pages all read, short: it is read again, pauses 0.25 s, doubled)
                    (done_at,) = proxy.done_seen.values()
                    await anyio.sleep(max(0.0, done_at + 1.0 - time.monotonic()))
                    proxy.rules.storm = 503
                    await anyio.sleep(7.0)
                    # (on, on a loaded machine, until it outlasted the client's 6 attempts:
                    # in 7 s such a machine made 5 of them)
                    with anyio.fail_after(15):
                        while proxy.storm_answers < 7:
                            await anyio.sleep(0.05)
                    proxy.rules.storm = None
                    await proc.wait()
            log.close()
            err = (tmp_path / "stderr").read_bytes()
            billed = svc.store.image_count
    assert proc.returncode == 0, err.decode()[-2000:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(1000))
    twice = sum(1 for n in proxy.written.values() if n > 1)
    assert (billed, twice, len(o.rejects)) == (1000, 0, 0), "rows billed again"
    assert proxy.storm_answers >= 7, err.decode()[-3000:]


class PageCount(BilledProxy):
    """The billing proxy that counts the results pages asked for."""

    def __init__(self, rules: Misbehaviour) -> None:
        super().__init__(rules)
        self.pages_asked = 0

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        if method == "GET" and task_id is not None and path != BULK and "/status" not in path:
            self.pages_asked += 1
        return super()._rewrite(method, path, task_id, status, payload)


async def test_a_resume_reads_the_pages_of_a_task_with_a_row_missing_once_a_pass(
    tmp_path: Path,
) -> None:
    """Killed while it waited for the one row of a 1,000-row task the service never returns,
    then run again with ``--read-again-window 0``: the resume reads the task's 10 pages once
    (the short one read on to its range's end, and the page past its count: 12 reads), then
    the row ends ``unreturned`` (``max_sends`` 1). Before, the pages an earlier process had
    read, counted as short, were read, then every page of the task again at once (the same
    pages): 23 reads, the task twice, on each restart."""
    manifest = write_csv(tmp_path / "m.csv", 1000)
    config = tmp_path / "c.toml"
    config.write_text("[engine]\nmax_sends = 1\n")
    out, state = tmp_path / "out.jsonl", tmp_path / "state.sqlite"
    proxy = PageCount(Misbehaviour(never_returned={"p7"}))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, "--state", str(state), "--config", str(config))

            def all_but_one() -> bool:
                return out.exists() and out.read_bytes().count(b"\n") >= 999

            proc = await anyio.open_process([*args, str(manifest)], env=ENV)
            await kill_when(proc, all_but_one)
            proxy.pages_asked = 0
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    [*args, "--read-again-window", "0", str(manifest)], check=False, env=ENV
                )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(1000))
    assert [(r["id"], r["stage"]) for r in o.rejects] == [("p7", "unreturned")]
    assert proxy.pages_asked == 12, proxy.pages_asked
