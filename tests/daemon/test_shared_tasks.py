"""Several manifests in flight at once share the engine's tasks while the service misbehaves
(through the misbehaving proxy of the engine's tests): each manifest's outputs hold exactly
its own ids, and the daemon neither dies nor leaves a manifest waiting for ever.

Found by a hunt, each failing before its fix:

* rows sent again while the daemon had no other input went into a task nothing sealed: the
  manifest waited for ever one row short;
* the state thread walked the engine's jobs while the event loop added and removed them
  (``dictionary changed size during iteration``), and scanned outputs already closed;
* a rejects scan reopened a file by its path after a cleanup job had removed it: the whole
  daemon died, not only that manifest.
"""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.proxy import Misbehaviour, misbehaving
from .helpers import DaemonProcess, drop_atomic, read_lines, until_results, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


def ids_of(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def problems_of(outbox: Path, stem: str, ids: list[str], summary: dict[str, Any]) -> list[str]:
    """What is wrong with one manifest's outputs (nothing: the promise holds)."""
    problems = []
    folder = outbox / stem
    got = [r["id"] for r in read_lines(folder / "results.jsonl")]
    got += [r["id"] for r in read_lines(folder / "rejects.jsonl")]
    twice = [i for i, n in Counter(got).items() if n > 1]
    if twice:
        problems.append(f"{stem}: written twice {twice[:10]} ({len(twice)})")
    if missing := set(ids) - set(got):
        problems.append(f"{stem}: missing {sorted(missing)[:10]} ({len(missing)})")
    if foreign := set(got) - set(ids):
        problems.append(f"{stem}: not its own {sorted(foreign)[:10]} ({len(foreign)})")
    if summary.get("status") != "done":
        problems.append(f"{stem}: status {summary.get('status')} {summary.get('reason')}")
    return problems


async def run_together(
    tmp_path: Path, rules: Misbehaviour, manifests: dict[str, list[str]], *, timeout: float = 40
) -> DaemonProcess:
    """Drop every manifest at once (so that they share tasks) into a daemon talking to the
    service through the proxy; wait for every summary; assert each manifest's outputs."""
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        # (Rows the service never returns, a row in place of another, are sent again 3 s
        # after their task is done, not 30: a results store that lags is no case here.)
        daemon = DaemonProcess(
            tmp_path, proxy.url, settle=0.2, extra=["--read-again-window", "3"]
        ).start()
        try:
            await daemon.wait_ready_endpoint()
            for name, ids in manifests.items():
                part = daemon.inbox / f".{name}.part"
                part.write_bytes(write_manifest(Path(), ids, url_tag=name.split(".")[0]))
            for name in manifests:
                os.rename(daemon.inbox / f".{name}.part", daemon.inbox / name)
            summaries = {}
            for name in manifests:
                stem = name.split(".")[0]
                summaries[stem] = await daemon.wait_summary(stem, timeout=timeout)
            daemon.check_alive()
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    problems = []
    for name, ids in manifests.items():
        stem = name.split(".")[0]
        problems += problems_of(daemon.outbox, stem, ids, summaries[stem])
    assert not problems, "\n".join(problems)
    return daemon


#: Six manifests with the same ids, p0.. (their rows share tasks as ``JOB/ID``).
SAME = {f"m{k}.csv": ids_of("p", 60 + 7 * k) for k in range(6)}


@pytest.mark.parametrize(
    "rules",
    [
        Misbehaviour(forget_when_done={1, 2}),
        Misbehaviour(duplicate_in_first_page={1, 2, 3}),
        Misbehaviour(foreign_id_in_first_page={1, 2, 3}),
        Misbehaviour(ignore_offset={1, 2}),
    ],
    ids=["forgotten", "id-repeated", "id-never-sent", "offset-ignored"],
)
async def test_manifests_with_the_same_ids_share_tasks_with_a_misbehaving_service(
    tmp_path: Path, rules: Misbehaviour
) -> None:
    await run_together(tmp_path, rules, SAME)


async def test_a_service_that_changes_ids_and_lists_a_task_in_a_state_of_its_own(
    tmp_path: Path,
) -> None:
    """The service upper-cases every id it echoes (``M0/P5`` for ``m0/p5``) and the key's list
    holds another team's task in a state the spec does not name: every manifest is tagged, no
    row a reject (each was sent five times, then an ``unreturned`` reject; the list was
    unreadable and the daemon polled it for ever)."""
    rules = Misbehaviour(echo_id=str.upper, stranger_status="CANCELLED")
    daemon = await run_together(tmp_path, rules, dict(list(SAME.items())[:3]))
    for stem in ("m0", "m1", "m2"):
        assert not read_lines(daemon.outbox / stem / "rejects.jsonl")


@pytest.mark.parametrize(
    "rules",
    [Misbehaviour(forget_when_done={1}), Misbehaviour(left_out_once={"p3"})],
    ids=["task-forgotten", "row-left-out"],
)
async def test_rows_sent_again_while_the_daemon_is_idle_get_their_outcome(
    tmp_path: Path, rules: Misbehaviour
) -> None:
    """One manifest; its task is forgotten once done, or a page leaves a row out once. Its
    rows are sent again to a new task, which must be sealed and read although no other
    manifest comes (it stayed open for ever: the manifest never ended)."""
    await run_together(tmp_path, rules, {"solo.csv": ids_of("p", 50)}, timeout=30)


async def test_rows_refused_by_the_service_while_other_manifests_complete(
    tmp_path: Path,
) -> None:
    """Each manifest has a row the service refuses: each task's draining scans the open jobs'
    rejects in the state thread while other manifests complete on the event loop."""
    manifests = {f"r{k}.csv": ids_of(f"r{k}x", 20 + k) for k in range(16)}
    rules = Misbehaviour(always_refused={f"r{k}x3" for k in range(16)})
    await run_together(tmp_path, rules, manifests)


async def test_outputs_removed_while_a_task_with_refused_rows_drains(tmp_path: Path) -> None:
    """A cleanup job removes a manifest's folder while a task holding a row the service
    refused is read: that manifest fails, the daemon goes on with the next (docs/daemon.md)."""
    rules = Misbehaviour(always_refused={"late7", "v4500"})
    async with (
        running_service(ServiceConfig(rate=1000.0)) as svc,
        misbehaving(svc.url, rules) as proxy,
    ):
        # (Rows the service never returns, a row in place of another, are sent again 3 s
        # after their task is done, not 30: a results store that lags is no case here.)
        daemon = DaemonProcess(
            tmp_path, proxy.url, settle=0.2, extra=["--read-again-window", "3"]
        ).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "victim.csv", write_manifest(Path(), ids_of("v", 5000)))
            await until_results(daemon, "victim", 200, timeout=30)
            shutil.rmtree(daemon.outbox / "victim")
            drop_atomic(daemon.inbox, "late.csv", write_manifest(Path(), ids_of("late", 50)))
            late = await daemon.wait_summary("late", timeout=60)
            victim = await daemon.wait_summary("victim", timeout=60)
            daemon.check_alive()
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert victim["status"] == "failed", victim
    assert not problems_of(daemon.outbox, "late", ids_of("late", 50), late)


async def test_the_engines_lines_about_a_task_carry_its_id_as_a_field(tmp_path: Path) -> None:
    """DESIGN's logs: fields such as ``task_id``. A log pipeline that keeps the lines of one
    task (``jq 'select(.task_id == ...)'``) found none: the engine named tasks only inside its
    messages. Every engine line about a task now carries the id as ``task_id``."""
    rules = Misbehaviour(forget_when_done={1}, duplicate_in_first_page={2})
    daemon = await run_together(tmp_path, rules, dict(list(SAME.items())[:2]))
    about_a_task = [
        (found.group(1), line)
        for line in daemon.logs()
        if str(line.get("logger", "")).startswith("fashiontag_pipeline.engine")
        and (found := re.match(r"(?:results of )?task (\S+?):? ", str(line["event"])))
    ]
    events = [str(line["event"]) for _, line in about_a_task]
    assert any("no longer knows it" in e for e in events), events
    assert any("repeated an id" in e for e in events), events
    assert [(t, line.get("task_id")) for t, line in about_a_task if line.get("task_id") != t] == []
