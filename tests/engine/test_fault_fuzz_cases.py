"""Cases a seeded fuzz of ``fashiontag run`` found: random combinations of the reference
service's faults, the misbehaving proxy's and the engine's flags, each run resumed until it
ends, then every row checked for exactly one outcome and the service's bill against the rows
and the re-sends the summary reports. Each test failed before its fix and holds its case
with no timing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import msgspec

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    ENV,
    assert_exactly_once,
    ids_of,
    read_outcomes,
    run_args,
    run_misbehaving,
    write_csv,
)
from .proxy import Misbehaviour, misbehaving


async def test_a_lost_create_found_past_the_first_page_of_a_short_paged_task_list(
    tmp_path: Path,
) -> None:
    """A service whose task list answers fewer tasks than asked (its own cap: 2 here, 100 in
    the wild against the 1,000 the engine asks for) and counts all of them in ``totalCount``.
    The engine looked for the task of a create whose answer it never got on the first page
    only (a page shorter than asked was taken as the last): killed while its first create was
    unanswered and after three more tasks were made, the resume did not find that task (the
    oldest, on the second page), took the create as never applied and sent its 300 rows again
    in a new task: 300 images billed twice, ``resent`` 0, exit 0. The fuzz met it with no
    kill: eight creates at once, one answer lost, the list capped at 7."""
    n = 1200
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    flags = ("--rotate-images", "300", "--rotate-min-images", "300", "--summary", str(summary))
    async with running_service(ServiceConfig(rate=1000.0)) as svc:
        async with misbehaving(svc.url, Misbehaviour(hold_first_create=True)) as proxy:
            args = run_args(proxy.url, out, str(manifest), *flags)
            proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
            with anyio.fail_after(30):
                while len(svc.store.tasks) < 4:  # the held create's task and three after it
                    await anyio.sleep(0.01)
            proc.kill()
            await proc.wait()
            await proc.aclose()
        async with misbehaving(svc.url, Misbehaviour(page_cap=2)) as proxy:
            args = run_args(proxy.url, out, str(manifest), *flags)
            with anyio.fail_after(60):
                final = await anyio.run_process(args, check=False, env=ENV)
        billed = svc.store.image_count
    assert final.returncode == 0, final.stderr.decode()
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
    figures = msgspec.json.decode(summary.read_bytes())
    assert billed == n + figures["resent"] == n, f"{billed - n} images billed twice"


async def test_pages_read_again_on_a_service_whose_pages_are_smaller_than_asked(
    tmp_path: Path,
) -> None:
    """A service whose pages hold 30 rows whatever the size asked, and whose results store
    lags its status (for a moment after "done" its pages hold only the task's first half).
    The rows missing once the pages were in were asked for again one page per 100-row range,
    but each of those answers held the range's first 30 rows only and the rest of the range
    was never asked for: 350 of the 1,000 rows were sent again, each billed twice, although
    the task held them. A page read again that comes short is read on to its range's end."""
    rules = Misbehaviour(page_cap=30, lagging_results=0.3)
    with anyio.fail_after(60):
        summary, _, o = await run_misbehaving(tmp_path, 1000, rules)
    assert summary.complete and summary.tagged == 1000 and not o.rejects
    assert summary.resent == 0, f"{summary.resent} rows sent (and billed) again"


async def test_a_run_that_stops_on_an_error_writes_its_counts_in_its_summary(
    tmp_path: Path,
) -> None:
    """A run that stopped with exit 1 (here: the service answers 503 to everything once some
    results are in, past ``--give-up-after``) wrote a ``--summary`` of zeros beside its error:
    ``submitted`` 0, ``tagged`` 0, ``resent`` 0 for a results file of hundreds of lines, rows
    the service had taken (and billed). A data team reconciling the bill or the files against
    the summary after a failed night read nothing done. The summary of a failure holds the
    counts the state holds when the run stopped, as the summary of a run that ends does."""
    n = 3000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    flags = ("--summary", str(summary), "--give-up-after", "1")
    async with (
        running_service(ServiceConfig(rate=3000.0)) as svc,
        misbehaving(svc.url, Misbehaviour()) as proxy,
    ):
        args = run_args(proxy.url, out, str(manifest), *flags)
        async with await anyio.open_process(args, env=ENV) as proc:
            with anyio.fail_after(30):
                while not out.exists() or out.stat().st_size == 0:
                    await anyio.sleep(0.01)
            proxy.rules.storm = 503
            with anyio.fail_after(30):
                code = await proc.wait()
    assert code == 1
    figures = msgspec.json.decode(summary.read_bytes())
    o = read_outcomes(out, out.with_suffix(".rej"))
    assert figures["error"] and not figures["complete"]
    assert 0 < len(o.results) < n
    assert figures["tagged"] + figures["failed"] == len(o.results)
    assert figures["rejected"] == len(o.rejects)
    assert figures["submitted"] >= len(o.results)
    assert figures["state"] == str(out) + ".state"
