"""How cron runs ``fashiontag run``, third hunt (each test failed before its fix): the nightly
command fired again while last night's is still at work on the same files, and a log on a full
disk."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from fashiontag_pipeline import StateInUseError
from fashiontag_pipeline.cli.summary_file import write_summary
from fashiontag_pipeline.engine import run_pipeline
from fashiontag_pipeline.engine.config import RunSummary
from fashiontag_pipeline.engine.jobs import Jobs
from fashiontag_pipeline.engine.state.sqlite import StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    ENV,
    TASKS_OF_1000,
    assert_exactly_once,
    client_config,
    dead_port,
    run_args,
    taken_in,
    write_csv,
)
from .proxy import Misbehaviour, misbehaving


@pytest.mark.parametrize("held", ["outputs", "state"])
async def test_a_run_refused_for_a_live_runs_files_leaves_its_summary(
    tmp_path: Path, held: str
) -> None:
    """The same cron line fired while the first run is still at work (or another line on its
    state): the second is refused (exit 2), but it replaced the first's ``--summary`` with its
    refusal, first with a "has not ended" of its own. A monitor read "is being written by
    another run" for the first run; after a timeout killed that run it no longer said that the
    same command resumes it. The summary now stays the live run's; the next command finishes."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    state = tmp_path / "run.state"
    args = run_args("", out, str(manifest), "--state", str(state), "--summary", str(summary))
    async with running_service(ServiceConfig(rate=1000.0)) as svc:
        args[args.index("--base-url") + 1] = svc.url
        first = await anyio.open_process(args, env=ENV)
        try:
            with anyio.fail_after(30):
                while not out.exists() or out.stat().st_size == 0:
                    await anyio.sleep(0.05)
            again = list(args)
            if held == "state":  # (outputs of its own, the first's state)
                again[again.index("--out") + 1] = str(tmp_path / "other.jsonl")
                again[again.index("--rejects") + 1] = str(tmp_path / "other.rej")
            second = await anyio.run_process(again, check=False, env=ENV)
            during = json.loads(summary.read_text())
        finally:
            first.kill()
            await first.wait()
            await first.aclose()
        assert second.returncode == 2, second.stderr.decode()
        assert b"another run" in second.stderr
        assert f"process {first.pid})" in during["error"], during
        assert f"process {first.pid})" in json.loads(summary.read_text())["error"]
        nightly = await anyio.run_process(args, check=False, env=ENV)
    assert nightly.returncode == 0, nightly.stderr.decode()[-400:]
    assert json.loads(summary.read_text())["complete"] is True
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(4000)})


@pytest.mark.parametrize("service", ["up", "down"])
async def test_stderr_on_a_full_disk_changes_no_exit_code(tmp_path: Path, service: str) -> None:
    """``fashiontag run ... >> /var/log/fashiontag.log 2>&1`` with /var/log full: every row
    was tagged, then the summary lines met ENOSPC, a traceback nobody could read, exit 120, and
    ``--summary`` kept saying the run had not ended (a failed run exited 120 too, not 1).
    Stderr is for people: its writes are dropped once they fail, and the exit and ``--summary``
    are the run's."""
    manifest = write_csv(tmp_path / "m.csv", 300)
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    async with running_service(ServiceConfig()) as svc:
        url = svc.url if service == "up" else f"http://127.0.0.1:{dead_port()}"
        args = run_args(url, out, str(manifest), "--summary", str(summary), "--progress")
        with open("/dev/full", "wb") as full:
            result = await anyio.run_process(
                [*args, "--give-up-after", "1"], check=False, env=ENV, stdout=full, stderr=full
            )
    data = json.loads(summary.read_text())
    if service == "up":
        assert result.returncode == 0
        assert data["complete"] is True, data
        assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(300)})
    else:
        assert result.returncode == 1
        assert data["complete"] is False and "has not ended" not in data["error"], data


@pytest.mark.parametrize("saved_as", ["latin-1", "utf-8 with a BOM"])
async def test_a_config_file_saved_by_another_editor(tmp_path: Path, saved_as: str) -> None:
    """``--config /etc/fashiontag.toml`` with a comment ``# Katalog für die Nacht`` saved in
    Latin-1: the refusal said only ``'utf-8' codec can't decode byte 0xfc in position 11``,
    naming no file. Saved by Notepad (UTF-8 with a byte order mark): "not valid TOML: Invalid
    statement (at line 1, column 1)", a line that looks right. The first now names the file
    and its encoding; the second is read, as a manifest with a BOM is."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "out.jsonl"
    config = tmp_path / "fashiontag.toml"
    async with running_service(ServiceConfig()) as svc:
        text = f'# Katalog f\u00fcr die Nacht\n[client]\nbase_url = "{svc.url}"\n'
        if saved_as == "latin-1":
            config.write_bytes(text.encode("latin-1"))
        else:
            config.write_bytes(text.encode("utf-8-sig"))
        args = run_args("", out, str(manifest), "--config", str(config))
        del args[args.index("--base-url") : args.index("--base-url") + 2]
        result = await anyio.run_process(args, check=False, env=ENV)
    if saved_as == "latin-1":
        assert result.returncode == 2
        stderr = result.stderr.decode()
        assert str(config) in stderr and "UTF-8" in stderr, stderr
        assert not out.exists()
    else:
        assert result.returncode == 0, result.stderr.decode()
        assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(20)})


async def test_a_summary_given_as_a_symlink_is_written_to_its_target(tmp_path: Path) -> None:
    """``--summary /var/log/fashiontag/latest.json``, a symlink to the file a loader watches
    (``/srv/status/catalogue.json``). Each write replaced the link with a file of its own:
    the target kept last night's ``"complete": true`` while tonight's run rewrote the results,
    and for ever after, so the loader read a finished run that was not tonight's (or one at
    work as finished). The summary is now written to the file the link names, the link
    kept."""
    manifest = write_csv(tmp_path / "m.csv", 50)
    out = tmp_path / "out.jsonl"
    status = tmp_path / "status"
    status.mkdir()
    target = status / "catalogue.json"
    target.write_text(json.dumps({"complete": True, "tagged": 7, "note": "last night"}))
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, str(manifest), "--summary", str(link))
        result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()
    assert link.is_symlink()
    data = json.loads(target.read_text())
    assert data["complete"] is True and data["tagged"] == 50, data
    assert not list(status.glob(".*.tmp")) and not list(tmp_path.glob(".*.tmp"))


async def test_a_run_refused_at_the_states_lock_leaves_the_live_runs_summary(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two cron lines (or an Airflow retry racing its first attempt) on one state, both past
    the "is anyone running?" check before either took the state's lock (always so for a
    PostgreSQL state: its lock is taken by the run). The loser, refused at the lock (exit 2),
    replaced the live run's ``--summary`` with its refusal: a monitor read that the run had
    failed ("in use by another run") while it was at work, and after a kill nothing said the
    same command resumes it. The summary now stays "has not ended", and says another run is at
    work, not that the refused process is."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    args = run_args("", out, str(manifest), "--state", postgres_url, "--summary", str(summary))
    # (250 images/s: the first run is at work for ~16 s, past the second's start-up on a
    # loaded machine; at 1,000 it once ended first, and its kill found no process)
    async with running_service(ServiceConfig(rate=250.0)) as svc:
        args[args.index("--base-url") + 1] = svc.url
        first = await anyio.open_process(args, env=ENV)
        try:
            with anyio.fail_after(30):
                while not out.exists() or out.stat().st_size == 0:
                    await anyio.sleep(0.05)
            again = list(args)
            again[again.index("--out") + 1] = str(tmp_path / "other.jsonl")
            again[again.index("--rejects") + 1] = str(tmp_path / "other.rej")
            second = await anyio.run_process(again, check=False, env=ENV)
            during = json.loads(summary.read_text())
        finally:
            with contextlib.suppress(ProcessLookupError):
                first.kill()
            await first.wait()
            await first.aclose()
        assert second.returncode == 2, second.stderr.decode()
        assert b"another run" in second.stderr
        assert during["complete"] is False and "has not ended" in during["error"], during
        assert "another run is at work" in during["error"], during
        nightly = await anyio.run_process(args, check=False, env=ENV)
    assert nightly.returncode == 0, nightly.stderr.decode()[-400:]
    assert json.loads(summary.read_text())["complete"] is True
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(4000)})


def test_two_summaries_written_at_once_leave_one_whole_document(tmp_path: Path) -> None:
    """Two runs ending (or starting) at the same instant with one ``--summary``: both wrote
    through one temp name (``.NAME.tmp``), so one truncated the other's half-written file and
    renamed it: a loader read a file that was no JSON (or two documents mixed), and the other
    run's rename found no temp file ("cannot write --summary", exit 1 for a complete run).
    Each write now has a temp file of its own: the file is always one whole summary."""
    path = tmp_path / "summary.json"
    big = RunSummary(complete=True, error="x" * 200_000, tagged=1)
    small = RunSummary(complete=False, error="y", tagged=2)
    failures: list[str] = []

    def writer(summary: RunSummary) -> None:
        for _ in range(40):
            if not write_summary(path, summary):
                failures.append("write failed")

    threads = [threading.Thread(target=writer, args=(s,)) for s in (big, small, big, small)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        with contextlib.suppress(FileNotFoundError):
            data = path.read_bytes()
            try:
                decoded = json.loads(data)
            except ValueError:
                failures.append(f"not one JSON document ({len(data)} bytes)")
            else:
                if decoded["tagged"] not in (1, 2):
                    failures.append("mixed")
    for thread in threads:
        thread.join()
    assert not failures, failures[:3]
    assert not list(tmp_path.glob(".*.tmp"))


@contextlib.asynccontextmanager
async def _first_line_waiting(args: list[str], state: Path) -> AsyncIterator[Any]:
    """The first cron line's run (``args``, its ``--base-url`` set here): its 3,000 rows taken
    in and sent, its tasks held processing (the service's proxy is given); killed on exit."""
    async with (
        running_service(ServiceConfig()) as svc,
        misbehaving(svc.url, Misbehaviour(hold_processing={1, 2, 3})) as proxy,
    ):
        args[args.index("--base-url") + 1] = proxy.url
        first = await anyio.open_process(args, env=ENV)
        try:
            with anyio.fail_after(30):
                while taken_in(state)[0] < 3000:
                    await anyio.sleep(0.05)
            yield proxy
        finally:
            with contextlib.suppress(ProcessLookupError):
                first.kill()
            await first.wait()
            await first.aclose()


async def _second_line(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Another cron line's run beside the first (at most 30 s)."""
    with anyio.fail_after(30):
        return await anyio.run_process(args, check=False, env=ENV)


@pytest.mark.parametrize("cleanup", ["empty", "old"])
async def test_a_cleanup_of_empty_files_leaves_a_live_runs_lock(
    tmp_path: Path, cleanup: str
) -> None:
    """A nightly cleanup of empty files (``find /data -empty -delete``) while a run waited for
    its tasks (every row sent, no line written yet), then the cron line fired again (or another
    line on that state, with outputs of its own, as here: the outputs, made again since, are
    locked too): the state's lock file (``STATE.lock``, 0 bytes) was gone with the empty
    outputs, so the second run locked a new file at that path and worked on the same state
    beside the first. Against the
    reference service (10,000 rows, tasks slow to finish) 6,000 rows were sent again (16,000
    billed), the first run stopped with exit 1 telling to ``--restart`` (every row billed once
    more), the second ended exit 3. The lock file now holds a line (no cleanup of empty files
    takes it) and is checked, once locked, to be the file at its path: the second is refused.
    So with a cleanup by age (``find /data -mtime +30 -delete``) of a lock file a run of last
    month made (left in place after each run, no run changed it), then another cron line on
    that state (outputs of its own): the lock file is now touched when locked."""
    manifest = write_csv(tmp_path / "m.csv", 3000)
    out = tmp_path / "out.jsonl"
    state = tmp_path / "out.jsonl.state"
    limits = ("--stall-timeout", "5", "--give-up-after", "5")
    args = run_args("", out, str(manifest), "--state", str(state), *limits)
    lock = tmp_path / "out.jsonl.state.lock"
    month_ago = time.time() - 40 * 86400
    if cleanup == "old":  # (the lock file of a run last month, left in place after it)
        lock.write_bytes(b"a line\n")
        os.utime(lock, (month_ago, month_ago))
    async with _first_line_waiting(args, state) as proxy:
        for path in tmp_path.iterdir():  # (find -empty -delete, find -mtime +30 -delete)
            found = path.stat()
            if path.is_file() and (
                found.st_size == 0 if cleanup == "empty" else found.st_mtime < month_ago + 60
            ):
                path.unlink()
        again = list(args)  # (another cron line on that state: outputs of its own)
        again[again.index("--out") + 1] = str(tmp_path / "other.jsonl")
        again[again.index("--rejects") + 1] = str(tmp_path / "other.rej")
        second = await _second_line(again)
        assert second.returncode == 2, second.stderr.decode()[-600:]
        assert b"in use by another run" in second.stderr
        assert proxy.writes == 3


async def test_a_state_named_through_a_symlink_is_locked_as_the_file_it_names(
    tmp_path: Path,
) -> None:
    """A state kept as ``current.state``, a symlink to the dated file (or the real name in one
    cron line and the link in another): the lock was taken beside the name given
    (``current.state.lock``), so a run given the link and a run given the file both locked and
    worked on one state at once. Against the reference service both ended exit 3, "the state
    cannot be trusted ... (--restart starts over)", their lines split over two results files.
    The lock is now taken beside the file the name leads to: the second run is refused."""
    manifest = write_csv(tmp_path / "m.csv", 3000)
    real = tmp_path / "2026-11.state"
    link = tmp_path / "current.state"
    link.symlink_to(real.name)
    limits = ("--stall-timeout", "5", "--give-up-after", "5")
    first_args = run_args("", tmp_path / "a.jsonl", str(manifest), "--state", str(real), *limits)
    again = run_args("", tmp_path / "b.jsonl", str(manifest), "--state", str(link), *limits)
    async with _first_line_waiting(first_args, real) as proxy:
        again[again.index("--base-url") + 1] = proxy.url
        second = await _second_line(again)
        assert second.returncode == 2, second.stderr.decode()[-600:]
        assert b"in use by another run" in second.stderr
        assert proxy.writes == 3


async def test_outputs_removed_empty_while_a_run_waits_are_made_again_and_held(
    tmp_path: Path,
) -> None:
    """A cleanup of empty files while a run waited for its first results (tasks slow to
    finish: hours, on a large night) took its empty outputs; an output so removed was made
    again only at its first line. Meanwhile another cron line given the same ``--out`` with
    its own ``--state`` found neither the file nor its lock, and tagged every row again (3,000
    rows, 6,000 billed). An output removed empty is now made again (and locked) at the next
    poll of the tasks: the other line is refused, as it is when the file is there."""
    manifest = write_csv(tmp_path / "m.csv", 3000)
    out = tmp_path / "out.jsonl"
    state = tmp_path / "a.state"
    limits = ("--stall-timeout", "30", "--give-up-after", "5")
    args = run_args("", out, str(manifest), "--state", str(state), *limits)
    async with _first_line_waiting(args, state) as proxy:
        for path in (out, out.with_suffix(".rej")):  # (find -empty -delete)
            assert path.stat().st_size == 0
            path.unlink()
        with anyio.fail_after(20):
            while not out.exists():
                await anyio.sleep(0.05)
        again = list(args)
        again[again.index("--state") + 1] = str(tmp_path / "b.state")
        second = await _second_line(again)
        assert second.returncode == 2, second.stderr.decode()[-600:]
        assert b"being written by another run" in second.stderr
        assert proxy.writes == 3


async def test_outputs_removed_empty_are_looked_for_once_a_second_not_at_each_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outputs removed empty were looked for (an fstat and a stat for each empty output of
    each job, in the state thread that writes the results) at each poll of the tasks: every
    ``poll_min`` (0.05 s) while tasks progress, so 20 times a second for an engine with many
    jobs. Once a second is as good against another cron line (made again "within seconds")."""
    calls: list[float] = []
    made_again = Jobs.made_again

    def counted(self: Jobs) -> None:
        calls.append(time.monotonic())
        made_again(self)

    monkeypatch.setattr(Jobs, "made_again", counted)
    manifest = write_csv(tmp_path / "m.csv", 400)
    config = msgspec.structs.replace(TASKS_OF_1000, rotate_images=50, rotate_min_images=50)
    async with running_service(ServiceConfig(rate=200.0)) as svc:
        with anyio.fail_after(60):
            started = time.monotonic()
            await run_pipeline(
                [manifest],
                client=client_config(svc.url),
                out=tmp_path / "out.jsonl",
                rejects=tmp_path / "rej.jsonl",
                engine=config,
            )
            took = time.monotonic() - started
    assert took > 1.5, f"the tasks took {took:.1f} s: too quick to tell"
    assert calls and len(calls) <= took + 2, f"{len(calls)} in {took:.1f} s"


#: What builds before the lock beside the file a symlink names did: hold ``ARGV[1]``.
_OLDER_BUILDS_LOCK = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('locked', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_symlinked_state_an_older_build_holds_through_the_link_is_refused(
    tmp_path: Path,
) -> None:
    """Builds before the lock was taken beside the file a symlink names locked
    ``current.state.lock``. A run of such a build on the link still at work when fashiontag
    was upgraded, and a run of the new build given the link (another cron line, outputs of its
    own) locked ``2026-11.state.lock``: both worked on one state. The lock an older build
    takes beside the link is looked at too (the new build's run is refused)."""
    real = tmp_path / "2026-11.state"
    link = tmp_path / "current.state"
    link.symlink_to(real.name)
    with subprocess.Popen(
        [sys.executable, "-c", _OLDER_BUILDS_LOCK, str(tmp_path / "current.state.lock")],
        stdout=subprocess.PIPE,
    ) as older:  # (the with closes its pipe: an unclosed one is a ResourceWarning, an error)
        try:
            assert older.stdout is not None and older.stdout.readline() == b"locked\n"
            with pytest.raises(StateInUseError) as caught:
                StateDB(link).close()
        finally:
            older.kill()
            older.wait()
    assert "current.state.lock" in str(caught.value), caught.value
    StateDB(link).close()  # (that run gone, the link is used again)
    folder = tmp_path / "2026-12"
    folder.mkdir()
    (tmp_path / "this-month").symlink_to(folder.name)
    StateDB(tmp_path / "this-month" / "s.state").close()  # (one lock, named two ways)
