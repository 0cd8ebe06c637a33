"""Resumes the day's fixes left open (found by a review): a NUL-id reject at the end of the
rejects file or among the replayed stdin rows, and a kill right after a lost create's task was
adopted."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline._exceptions import StateConflictError
from fashiontag_pipeline.engine.stdin_replay import StdinDigest
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, ids_of, read_outcomes, run_piped
from .test_nothing_lost import _stdin_run_interrupted


async def test_resume_of_a_stdin_run_with_a_nul_id_among_the_replayed_rows(tmp_path: Path) -> None:
    """630a48e made an id holding a NUL a client reject whose id is not claimed in the
    run-wide dedupe (no store takes a NUL). The stdin replay check of ``--resume`` still looks
    that id up among the ids the run took in: it is never there, so the same rows piped
    again are refused as other rows ("which that run did not read there")."""
    out = tmp_path / "results.jsonl"
    lines = [f"s{i},https://img.example/s/{i}.jpg" for i in range(12000)]
    lines.insert(49, "s10\x00x,https://img.example/s/nul.jpg")
    dump = tmp_path / "mon.csv"
    dump.write_bytes(("id,url\n" + "\n".join(lines) + "\n").encode())
    async with running_service(ServiceConfig(rate=4000.0)) as svc:
        args = await _stdin_run_interrupted(svc.url, out, dump.read_bytes())
        resumed = await run_piped([*args, "--resume"], dump)
        assert resumed.returncode == 0, resumed.stderr.decode()[-800:]
    o = read_outcomes(out, out.with_suffix(".rej"))
    results = [r["id"] for r in o.results]
    assert len(results) == len(set(results)) and set(results) == ids_of(12000, "s")
    assert [(r["line"], r["id"]) for r in o.rejects] == [(51, "s10\x00x")]


async def test_a_run_whose_rejects_end_with_a_nul_id_resumes(tmp_path: Path) -> None:
    """A resume checks that each output ends, at its checkpoint, with a line of an id the run
    took in (``outcome.not_ours``). An id holding a NUL is a client reject never taken in
    (630a48e): a rejects file whose last line is that reject is taken for another run's file,
    and the same command refuses to resume ("does not end ... with a line of this run")."""
    import signal
    import subprocess

    from .helpers import run_args
    from .test_nothing_lost import results_appear

    out = tmp_path / "results.jsonl"
    lines = [f"s{i},https://img.example/s/{i}.jpg" for i in range(12000)]
    lines.insert(1, "s1\x00x,https://img.example/s/nul.jpg")
    dump = tmp_path / "mon.csv"
    dump.write_bytes(("id,url\n" + "\n".join(lines) + "\n").encode())
    async with running_service(ServiceConfig(rate=4000.0)) as svc:
        args = run_args(svc.url, out, str(dump))
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        await results_appear(out)
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(15):
            assert await proc.wait() == 130
        await proc.aclose()
        resumed = await anyio.run_process(args, check=False, env=ENV)
        assert resumed.returncode == 0, resumed.stderr.decode()[-800:]
    o = read_outcomes(out, out.with_suffix(".rej"))
    results = [r["id"] for r in o.results]
    assert len(results) == len(set(results)) and set(results) == ids_of(12000, "s")
    assert [(r["line"], r["id"]) for r in o.rejects] == [(3, "s1\x00x")]


#: With ``HOOK_KILL_AFTER_ADOPT`` set, the engine SIGKILLs itself right after it recorded a
#: task adopted from the list after a create's lost answer (before the create's chunk is
#: recorded in that task).
ADOPT_HOOK = """
import os, signal
if os.environ.get("HOOK_KILL_AFTER_ADOPT"):
    from fashiontag_pipeline.engine import writes
    _opened = writes.TaskWrites._opened
    async def opened(self, task, task_id, expiry):
        await _opened(self, task, task_id, expiry)
        os.kill(os.getpid(), signal.SIGKILL)
    writes.TaskWrites._opened = opened
    # A create answered 204 records its task and its chunk (an orphan of it) in one commit.
    _unanswered = writes.TaskWrites._created_unanswered
    async def created_unanswered(self, task, chunk, status):
        await _unanswered(self, task, chunk, status)
        os.kill(os.getpid(), signal.SIGKILL)
    writes.TaskWrites._created_unanswered = created_unanswered
"""


async def test_kill_9_after_a_lost_creates_task_is_adopted_then_resume_adopts_it(
    tmp_path: Path,
) -> None:
    """A create applied but answered without its id: the engine finds its task in the list by
    its token and records it (``_opened``, the task row with that token) before the chunk is
    recorded in it. Killed there, the resume lists the task under the chunk's token again, but
    77f29a2/97301ac leave out every listed task the state knows (``task_known``), meant for a
    task held under *another* create: this one is held under the chunk's own token. The
    chunk's rows, in that task already, are sent again (billed twice). (A create answered
    ``204`` now records its task and its chunk in one commit: killed after it, the resume
    settles the chunk from that task, not sending it again.)"""
    import os
    import signal

    from fashiontag_pipeline.engine.config import EngineConfig  # noqa: F401

    from .helpers import assert_exactly_once, run_args, write_csv
    from .proxy import Misbehaviour, misbehaving

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(ADOPT_HOOK)
    n = 1000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    pythonpath = os.pathsep.join([str(hook), ENV.get("PYTHONPATH", "")])
    async with running_service(ServiceConfig()) as svc:
        async with misbehaving(svc.url, Misbehaviour(no_content_writes={"POST"})) as proxy:
            args = run_args(proxy.url, out, str(manifest), "--linger", "0.2")
            with anyio.fail_after(60):
                killed = await anyio.run_process(
                    args,
                    check=False,
                    env={**ENV, "PYTHONPATH": pythonpath, "HOOK_KILL_AFTER_ADOPT": "1"},
                )
            assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-400:]
            assert svc.store.image_count == n
        with anyio.fail_after(60):
            resumed = await anyio.run_process(
                run_args(svc.url, out, str(manifest), "--linger", "0.2"), check=False, env=ENV
            )
        assert resumed.returncode == 0, resumed.stderr.decode()[-400:]
        billed = svc.store.image_count
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
    assert billed == n, f"{billed - n} images billed twice"


#: With ``HOOK_KILL_IN_FINAL_SETTLE`` set, the engine SIGKILLs itself in a task's final
#: settle, right after the rows one chunk did not get back were handed to the writer (in
#: place of that chunk), before the task's next chunk is looked at.
SETTLE_HOOK = """
import os, signal
if os.environ.get("HOOK_KILL_IN_FINAL_SETTLE"):
    from fashiontag_pipeline.engine import settle
    _resend_unwritten = settle.TaskSettler._resend_unwritten
    async def resend_unwritten_then_die(self, items, chunk_id, sends):
        await _resend_unwritten(self, items, chunk_id, sends)
        await self.journal.commit(ops=[])
        os.kill(os.getpid(), signal.SIGKILL)
    settle.TaskSettler._resend_unwritten = resend_unwritten_then_die
"""


async def test_kill_9_in_a_tasks_final_settle_leaves_no_row_without_an_outcome(
    tmp_path: Path,
) -> None:
    """One task of two chunks, (p0, p1) and (p2, p3); the service never returns p1 nor p3.
    The final settle sends p1 again in place of the first chunk, and the engine is killed
    there. The resume found the task's lines (p0, p2: 2) as many as the rows its accepted
    chunks still held (the second's: 2), took the task for read whole and drained it: p3 was
    never sent again and had no outcome."""
    import os
    import signal

    from .helpers import assert_exactly_once, run_args, write_csv
    from .proxy import Misbehaviour, misbehaving

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SETTLE_HOOK)
    config = tmp_path / "c.toml"
    # (Killed right after a create was written ahead: the resume looks for its task for as
    # long as a request may go unanswered, here 3 s.)
    # (p1 and p3 are never returned: sent again 3 s after their task is done, not 30.)
    config.write_text(
        "[client.timeout]\ntotal = 3.0\n\n[engine]\nchunk_size = 2\nmax_sends = 2\n"
        "read_again_window = 3.0\n"
    )
    n = 4
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    pythonpath = os.pathsep.join([str(hook), ENV.get("PYTHONPATH", "")])
    args = run_args("URL", out, str(manifest), "--config", str(config), "--linger", "0.2")
    rules = Misbehaviour(never_returned={"p1", "p3"})
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        args[args.index("URL")] = proxy.url
        with anyio.fail_after(60):
            killed = await anyio.run_process(
                args,
                check=False,
                env={**ENV, "PYTHONPATH": pythonpath, "HOOK_KILL_IN_FINAL_SETTLE": "1"},
            )
        assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-800:]
        with anyio.fail_after(60):
            resumed = await anyio.run_process(args, check=False, env=ENV)
    assert resumed.returncode == 0, resumed.stderr.decode()[-800:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
    assert sorted(r["id"] for r in o.rejects) == ["p1", "p3"]
    assert {r["stage"] for r in o.rejects} == {"unreturned"}


def _digest_of(rows: list[tuple[int, object]], keys_sorted: bool) -> tuple[int, str]:
    """(V, the meta value a build records) after ``rows`` read from stdin."""
    digest = StdinDigest(0, 0, None, keys_sorted)
    change = digest.feed(rows)
    assert change is not None
    value = change[1][1]
    assert isinstance(value, str)
    return rows[-1][0], value


def test_stdin_digest_of_an_older_build_is_checked_the_way_it_was_made() -> None:
    """A state recorded by a build before JSONL keys were sorted (``V:CRC``, no mark) is
    checked with the keys as read: the same rows resume; a reordered object is refused, as it
    was (the resume of that state must not be refused for the same rows)."""
    rows: list[tuple[int, object]] = [
        (i + 1, {"url": f"https://img.example/{i}.jpg", "id": f"j{i}"}) for i in range(5)
    ]
    upto, old = _digest_of(rows, keys_sorted=False)
    assert old.count(":") == 1
    _, new = _digest_of(rows, keys_sorted=True)
    assert new.endswith(":k")
    reordered: list[tuple[int, object]] = [
        (line, {"id": r["id"], "url": r["url"]})  # type: ignore[index]
        for line, r in rows
    ]
    for value, other_order_ok in ((old, False), (new, True)):
        for replay, ok in ((rows, True), (reordered, other_order_ok)):
            digest = StdinDigest.recorded(0, 0, upto, value)
            assert digest.check is not None
            if ok:
                assert digest.feed(replay) is None
            else:
                with pytest.raises(StateConflictError, match="not the rows that run read"):
                    digest.feed(replay)
