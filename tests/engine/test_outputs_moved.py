"""A run's outputs are where the state says it wrote them, or the run says where they are.

* a completed run asked again (cron on an unchanged dump) with its results deleted, or with a
  new ``--out``: complete (nothing is tagged again without ``--restart``), and the summary
  says where the results are, or that they are gone;
* an unfinished run resumed with a new ``--out`` while its lines are in the old file: refused
  (exit 2, nothing touched) naming the old file, not reported as lines lost by the machine,
  and another file at the new path is left alone; the file moved there: resumed there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc
import pytest

from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.run_checks import outputs_elsewhere
from fashiontag_pipeline.engine.state import JobRow
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    ENV,
    assert_exactly_once,
    client_config,
    job_marks,
    kill_when,
    run_args,
    write_csv,
)

FAST = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.2)


async def test_a_completed_run_asked_again_says_where_its_results_are(tmp_path: Path) -> None:
    manifest = write_csv(tmp_path / "m.csv", 300)
    out, rej, state = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "s.state"
    async with running_service(ServiceConfig()) as svc:

        async def run(results: Path) -> tuple[str, str]:
            summary = await run_pipeline(
                [manifest],
                client=client_config(svc.url),
                out=results,
                rejects=rej,
                state=state,
                engine=FAST,
            )
            assert summary.complete and summary.tagged == 300
            return summary.note, summary.out

        assert await run(out) == ("", str(out))
        note, where = await run(out)
        assert "nothing to do" in note and "but" not in note
        dated = tmp_path / "out-2026-11-26.jsonl"
        note, where = await run(dated)
        assert f"its results were written to {out}, not {dated}" in note
        assert "--restart" in note and not dated.exists()
        assert where == str(out)  # where the results are
        out.unlink()
        note, where = await run(out)
        assert f"its results file {out} is missing" in note


async def test_an_unfinished_run_resumed_with_another_out_is_refused_naming_its_file(
    tmp_path: Path,
) -> None:
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out, state = tmp_path / "out.jsonl", tmp_path / "s.state"
    elsewhere = tmp_path / "elsewhere.jsonl"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(state))
        args += ["--rotate-images", "1000", "--rotate-min-images", "1000"]
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        with anyio.fail_after(60):  # killed once some results are committed
            while (not out.exists() or out.stat().st_size == 0) and proc.returncode is None:
                await anyio.sleep(0.02)
        await anyio.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        moved = [*args]
        moved[moved.index("--out") + 1] = str(elsewhere)
        with anyio.fail_after(60):
            refused = await anyio.run_process(moved, check=False, env=ENV, stderr=subprocess.PIPE)
        err = refused.stderr.decode()
        assert refused.returncode == 2, err
        assert f"were written to {out}" in err and "lost by the machine" not in err
        assert not elsewhere.exists()
        # Another file already at the path given, as long as the run's: still refused, and
        # left as it was (never cut back and appended to).
        other = b"x" * (out.stat().st_size + 10)
        elsewhere.write_bytes(other)
        with anyio.fail_after(60):
            refused = await anyio.run_process(moved, check=False, env=ENV, stderr=subprocess.PIPE)
        assert refused.returncode == 2, refused.stderr.decode()
        assert elsewhere.read_bytes() == other
        # The run's file moved to the path given: resumed there.
        out.replace(elsewhere)
        with anyio.fail_after(120):
            done = await anyio.run_process(moved, check=False, env=ENV)
    assert done.returncode == 0, done.stderr.decode()
    assert_exactly_once(elsewhere, out.with_suffix(".rej"), {f"p{i}" for i in range(4000)})


def _job(results: Path, rejects: Path, sink: str, results_ckpt: int) -> JobRow:
    return JobRow(
        job=1,
        key="run",
        name="m.csv",
        sources=[],
        results=str(results),
        rejects=str(rejects),
        sink=sink,
        state="open",
        validated=0,
        chunked=0,
        results_ckpt=results_ckpt,
        rejects_ckpt=0,
        counters={"tagged": 3},
    )


def test_a_sqlite_results_file_elsewhere_is_the_runs_only_once_the_recorded_one_is_gone(
    tmp_path: Path,
) -> None:
    """Another SQLite results file at the path given, while the run's is still in place, is
    somebody's: refused (never cut back to the checkpoint and written into). Once the run's
    file is gone from where it was, the one given is taken as it, moved."""
    recorded, other = tmp_path / "r.db", tmp_path / "other.db"
    recorded.write_bytes(b"x" * 8192)
    other.write_bytes(b"y" * 8192)
    job = _job(recorded, tmp_path / "rej.jsonl", "sqlite", 5)
    problem, elsewhere = outputs_elsewhere(job, other, tmp_path / "rej.jsonl")
    assert elsewhere and f"were written to {recorded}, not {other}" in problem
    recorded.unlink()
    assert outputs_elsewhere(job, other, tmp_path / "rej.jsonl") == ("", False)


async def _all_of(stream: anyio.abc.ByteReceiveStream | None) -> bytes:
    assert stream is not None
    chunks = []
    with contextlib.suppress(anyio.EndOfStream):
        while True:
            chunks.append(await stream.receive())
    return b"".join(chunks)


def _sqlite_rows(path: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return int(db.execute("SELECT count(*) FROM results").fetchone()[0])
    except sqlite3.Error:
        return 0


async def _killed_once_results_are_committed(args: list[str], out: Path) -> None:
    proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
    with anyio.fail_after(60):
        while _sqlite_rows(out) == 0 and proc.returncode is None:
            await anyio.sleep(0.02)
    await anyio.sleep(0.2)
    assert proc.returncode is None, "the run ended before it was killed"
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    await proc.aclose()


async def test_a_sqlite_results_file_deleted_before_a_resume_is_refused_not_refilled(
    tmp_path: Path,
) -> None:
    """The rows the state counts as written are gone with the file: a resume must say so and
    fail, never write the rest into a new file and report the run complete."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out, state = tmp_path / "out.db", tmp_path / "s.state"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(state), "--sink", "sqlite")
        args += ["--rotate-images", "1000", "--rotate-min-images", "1000"]
        await _killed_once_results_are_committed(args, out)
        for leftover in tmp_path.glob("out.db*"):
            leftover.unlink()
        with anyio.fail_after(60):
            again = await anyio.run_process(args, check=False, env=ENV, stderr=subprocess.PIPE)
        err = again.stderr.decode()
        assert again.returncode == 1, err
        assert str(out) in err and "--restart" in err
        with anyio.fail_after(120):
            done = await anyio.run_process([*args, "--restart"], check=False, env=ENV)
    assert done.returncode == 0, done.stderr.decode()


def _removed(out: Path) -> None:
    """A cleanup job: the file removed."""
    out.unlink()


def _copytruncate(out: Path) -> None:
    """logrotate's ``copytruncate``: the lines copied aside, the file cut to nothing."""
    shutil.copyfile(out, out.with_name(out.name + ".1"))
    os.truncate(out, 0)


def _rename_and_create(out: Path) -> None:
    """logrotate's default: the file renamed aside, a new empty one made at its path."""
    out.rename(out.with_name(out.name + ".1"))
    out.touch()


@pytest.mark.parametrize(
    "change", [_removed, _copytruncate, _rename_and_create], ids=lambda f: f.__name__
)
async def test_results_taken_away_while_the_run_writes_them_fail_the_run(
    tmp_path: Path, change: Callable[[Path], None]
) -> None:
    """The results file's lines are taken away mid-run: a cleanup job removes the file (the
    run wrote on into the removed file), or a log rotation copies and truncates it (the run
    wrote on at its old offset: a file starting with a hole of NUL bytes) or renames it aside
    and makes a new one (the run wrote on into the renamed file). It must not exit 0 as
    complete; the state is left unfinished, the same command is refused, and --restart tags
    every row again."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out, state = tmp_path / "out.jsonl", tmp_path / "s.state"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(state))
        args += ["--rotate-images", "1000", "--rotate-min-images", "1000"]
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        with anyio.fail_after(60):
            while (not out.exists() or out.stat().st_size == 0) and proc.returncode is None:
                await anyio.sleep(0.02)
        change(out)
        with anyio.fail_after(60):
            await proc.wait()
        err = (await _all_of(proc.stderr)).decode()
        await proc.aclose()
        assert proc.returncode == 1, err
        assert str(out) in err and "were removed" in err and "--restart" in err
        assert not out.exists() or b"\0" not in out.read_bytes()
        with anyio.fail_after(60):
            again = await anyio.run_process(args, check=False, env=ENV, stderr=subprocess.PIPE)
        assert again.returncode == 1, again.stderr.decode()
        with anyio.fail_after(120):
            done = await anyio.run_process([*args, "--restart"], check=False, env=ENV)
    assert done.returncode == 0, done.stderr.decode()
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(4000)})


def _foreign_lines_to(ckpt: int) -> bytes:
    """Results lines of ids no run here took in, a line ending exactly at byte ``ckpt`` and
    more after it (another run's file that a cut there would not split mid-line)."""
    line = b'{"id":"other-%06d","taskId":"t9","taggingResult":{"status":"success"},"pad":"%s"}\n'
    size = len(line % (0, b""))
    n, rest = divmod(ckpt, size)
    head = [line % (0, b"x" * rest)] + [line % (i, b"") for i in range(1, n)]
    data = b"".join(head)
    assert len(data) == ckpt and data.endswith(b"\n")
    return data + b"".join(line % (n + i, b"") for i in range(1000))


@pytest.mark.parametrize("other", ["another-run", "line-aligned"])
async def test_a_resume_over_another_runs_file_at_the_same_path_is_refused(
    tmp_path: Path, other: str
) -> None:
    """A cron run is killed; before it runs again, another run given the same ``--out`` with
    its own state rewrites the file. The resume cut that file at its own checkpoint (inside
    the other run's lines) and appended to it: exit 0, the first rows without a line, the
    other run's rows and half a line in its results. The file is not this run's: refused,
    the file left as it is, and ``--restart`` tags every row again. (``line-aligned``: the
    other file has a line ending exactly at the checkpoint, so only the ids tell.)"""
    a = write_csv(tmp_path / "a.csv", 20000)
    b = write_csv(tmp_path / "b.csv", 20000, start=100000)
    out, state = tmp_path / "out.jsonl", tmp_path / "a.state"
    async with running_service(ServiceConfig(rate=4000.0)) as svc:
        args = run_args(svc.url, out, str(a), "--state", str(state))
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        with anyio.fail_after(60):
            while (not out.exists() or out.stat().st_size < 200_000) and proc.returncode is None:
                await anyio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        if other == "another-run":
            args_b = run_args(svc.url, out, str(b), "--state", str(tmp_path / "b.state"))
            done_b = await anyio.run_process(args_b, check=False, env=ENV)
            assert done_b.returncode == 0, done_b.stderr.decode()
        else:
            with contextlib.closing(sqlite3.connect(state)) as db:
                (ckpt,) = db.execute("SELECT results_ckpt FROM jobs").fetchone()
            out.write_bytes(_foreign_lines_to(ckpt))
        theirs = out.read_bytes()
        again = await anyio.run_process(args, check=False, env=ENV)
        assert again.returncode == 1, again.stderr.decode()
        message = again.stderr.decode()
        assert str(out) in message and "another run" in message and "--restart" in message
        assert out.read_bytes() == theirs
        with anyio.fail_after(120):
            done = await anyio.run_process([*args, "--restart"], check=False, env=ENV)
    assert done.returncode == 0, done.stderr.decode()
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(20000)})


async def test_a_run_given_relative_paths_resumes_from_another_directory(tmp_path: Path) -> None:
    """Started in a/ with ``--out out.jsonl``, killed, resumed from b/ naming the same file as
    ``../a/out.jsonl``: the same file, so it resumes (the state keeps absolute paths); it
    was refused as "written to out.jsonl", and following that hint in b/ wrote into b/'s own
    out.jsonl."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    manifest = write_csv(tmp_path / "m.csv", 4000)
    state = tmp_path / "s.state"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        args = run_args(svc.url, Path("out.jsonl"), str(manifest), "--state", str(state))
        args += ["--rotate-images", "1000", "--rotate-min-images", "1000"]
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV, cwd=a)
        out = a / "out.jsonl"
        with anyio.fail_after(60):
            while (not out.exists() or out.stat().st_size == 0) and proc.returncode is None:
                await anyio.sleep(0.02)
        await anyio.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        unrelated = b'{"id":"other"}\n' * 100_000
        (b / "out.jsonl").write_bytes(unrelated)  # another file of the same name in b/
        again = [*args]
        again[again.index("--out") + 1] = "../a/out.jsonl"
        again[again.index("--rejects") + 1] = "../a/out.rej"
        with anyio.fail_after(120):
            done = await anyio.run_process(
                again, check=False, env=ENV, stderr=subprocess.PIPE, cwd=b
            )
    assert done.returncode == 0, done.stderr.decode()
    assert_exactly_once(out, a / "out.rej", {f"p{i}" for i in range(4000)})
    assert [p.name for p in b.iterdir()] == ["out.jsonl"]
    assert (b / "out.jsonl").read_bytes() == unrelated


async def test_a_lost_state_beside_written_outputs_is_said_before_they_are_rewritten(
    tmp_path: Path,
) -> None:
    """``--state`` on a tmpfs (/tmp, /dev/shm) and a reboot mid-run: the state is gone, the
    outputs are not. The same command is a new run: it cut the results file to nothing and
    tagged (billed) every row again, exit 0, without a word. It still does (a lost state
    cannot be resumed), but says so at the start, naming the state looked for and the files
    rewritten; a first run into empty outputs says nothing."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out, state, summary = tmp_path / "out.jsonl", tmp_path / "s.state", tmp_path / "sum.json"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(state))
        args += ["--rotate-images", "1000", "--rotate-min-images", "1000"]
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        with anyio.fail_after(60):
            while (not out.exists() or out.stat().st_size == 0) and proc.returncode is None:
                await anyio.sleep(0.02)
        assert proc.returncode is None, "the run ended before it was killed"
        proc.send_signal(signal.SIGKILL)  # the reboot
        await proc.wait()
        first = (await _all_of(proc.stderr)).decode()
        await proc.aclose()
        assert "no state" not in first, first[-400:]
        for lost in tmp_path.glob("s.state*"):  # a tmpfs after a reboot
            lost.unlink()
        with anyio.fail_after(60):
            again = await anyio.run_process(
                [*args, "--summary", str(summary)], check=False, env=ENV
            )
    err = again.stderr.decode()
    assert again.returncode == 0, err[-400:]
    head = err.split("run complete")[0]  # said before the run, not only in its summary
    assert f"no state at {state}" in head and str(out) in head and "rewritten" in head, err
    assert "no state" in json.loads(summary.read_text())["note"]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(4000)})


@pytest.mark.parametrize("file", ["results", "rejects"])
async def test_a_resume_before_the_first_checkpoint_leaves_another_runs_file_alone(
    tmp_path: Path, file: str
) -> None:
    """A run is killed before its state counted a byte of its outputs (checkpoint 0: no task
    done yet); another run given the same path with its own state writes its outcomes there.
    The resume cut the file back to 0 bytes, no check made: the other run's lines gone, exit 0
    (a suite run's kill came before the first checkpoint once in a while). A first line that
    is not a line of this run is another run's file: refused, the file left as it is."""
    a = write_csv(tmp_path / "a.csv", 1000)
    b_rows = [f"q{i},https://img.example/q/{i}.jpg" for i in range(300)]
    b_rows[5] = "q5,ftp://img.example/q/5.jpg"  # one reject in the other run's rejects too
    b = tmp_path / "b.csv"
    b.write_text("id,url\n" + "\n".join(b_rows) + "\n")
    out, state = tmp_path / "out.jsonl", tmp_path / "a.state"
    async with running_service(ServiceConfig(rate=250.0)) as svc:
        args = run_args(svc.url, out, str(a), "--state", str(state))
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        await kill_when(proc, lambda: job_marks(state)[0] >= 0)  # (its one task takes 4 s)
        with contextlib.closing(sqlite3.connect(state)) as db:
            ckpts = db.execute("SELECT results_ckpt, rejects_ckpt FROM jobs").fetchone()
        assert ckpts == (0, 0)
        async with running_service(ServiceConfig()) as other:
            args_b = run_args(other.url, out, str(b), "--state", str(tmp_path / "b.state"))
            done_b = await anyio.run_process(args_b, check=False, env=ENV)
        assert done_b.returncode == 0, done_b.stderr.decode()
        if file == "rejects":
            out.write_bytes(b"")  # only the rejects file is the other run's now
        theirs = out.with_suffix(".rej").read_bytes(), out.read_bytes()
        assert theirs[0] and (theirs[1] or file == "rejects")
        again = await anyio.run_process(args, check=False, env=ENV)
        message = again.stderr.decode()
        assert again.returncode == 1, message
        assert "does not begin with a line of this run" in message
        assert "another run" in message and "--restart" in message
        assert (out.with_suffix(".rej").read_bytes(), out.read_bytes()) == theirs
