"""The paths a nightly job's runner really gives ``fashiontag run`` for the files it writes
whole or as databases (``--summary``, ``--state``, ``--reuse``), and their folders (found by
a hunt; each test failed before its fix)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args, write_csv


async def test_a_file_written_whole_that_is_a_pipe_or_a_device_is_refused_untouched(
    tmp_path: Path,
) -> None:
    """``--summary /dev/null`` (a job that wants no report) replaced the device with a JSON
    file, for every program on the machine when run as root (``/dev/full`` too; a FIFO a
    monitor reads was replaced, its reader left waiting for ever); ``--state`` or ``--reuse``
    on one stopped the run with ``disk I/O error``. Each is refused now, exit 2 in one line
    naming the flag, before anything is sent, the pipe left as it was."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    async with running_service(ServiceConfig()) as svc:
        for flag in ("--summary", "--state", "--reuse"):
            out = tmp_path / f"out{flag}.jsonl"
            args = run_args(svc.url, out, str(manifest), flag, str(fifo))
            with anyio.fail_after(60):
                result = await anyio.run_process(args, check=False, env=ENV)
            err = result.stderr.decode()
            assert result.returncode == 2, (flag, err[-400:])
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
            assert f"{flag} {fifo} is not a regular file (a device, a pipe or a socket)" in err
            assert stat.S_ISFIFO(os.stat(fifo).st_mode), flag
            assert not out.exists(), flag
        assert svc.store.image_count == 0
        # A command line refused by its flags (its summary said so) leaves it alone too.
        args = run_args(svc.url, tmp_path / "o.jsonl", str(manifest), "--summary", str(fifo))
        result = await anyio.run_process([*args, "--no-such-flag"], check=False, env=ENV)
        assert result.returncode == 2 and stat.S_ISFIFO(os.stat(fifo).st_mode)


async def test_an_output_whose_folder_is_a_dangling_symlink_is_named_plainly(
    tmp_path: Path,
) -> None:
    """``--out /srv/exports/results.jsonl`` with ``/srv/exports`` a symlink to a file system
    not mounted tonight: ``cannot open the outputs: [Errno 17] File exists`` (exit 1), or
    ``cannot use state file ...: File exists``; a folder that is a file said ``Not a
    directory``. Each names the folder at fault and what to do now, exit 2, nothing sent."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    gone = tmp_path / "exports"
    gone.symlink_to(tmp_path / "not-mounted")
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x\n")
    async with running_service(ServiceConfig()) as svc:
        for flag, path in (
            ("--out", gone / "results.jsonl"),
            ("--rejects", gone / "rejects.jsonl"),
            ("--state", gone / "run.state"),
            ("--summary", gone / "summary.json"),
            ("--reuse", gone / "store.db"),
            ("--out", a_file / "results.jsonl"),
        ):
            out = tmp_path / "out.jsonl" if flag != "--out" else path
            args = run_args(svc.url, tmp_path / "out.jsonl", str(manifest))
            args += [flag, str(path)]
            with anyio.fail_after(60):
                result = await anyio.run_process(args, check=False, env=ENV)
            err = result.stderr.decode()
            assert result.returncode == 2, (flag, err[-400:])
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
            assert "File exists" not in err and "Not a directory" not in err, err
            if path.parent == gone:
                assert f"its folder {gone} is a symlink to {tmp_path / 'not-mounted'}" in err
                assert "which does not exist" in err, err
            else:
                assert f"its folder {a_file} is not a folder" in err, err
            assert not out.exists() and not (tmp_path / "not-mounted").exists(), flag
        assert svc.store.image_count == 0


async def test_an_empty_rejects_file_deleted_mid_run_is_made_again_not_a_failure(
    tmp_path: Path,
) -> None:
    """A cleanup job deleting empty files (``find /data -empty -delete``) while a run has no
    reject yet: the run stopped, exit 1, calling its outputs lost and saying to run again
    with ``--restart`` (every row tagged and billed again), though no line had been written
    to it. The file is made again at its path and the run ends complete, every row once."""
    good = write_csv(tmp_path / "good.csv", 1500).read_bytes()
    bad = b"".join(f"bad{i},ftp://img.example/{i}.jpg,acme,TOP\n".encode() for i in range(5))
    out = tmp_path / "out.jsonl"
    rejects = out.with_suffix(".rej")
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, "-", "--linger", "0.05")
        with anyio.fail_after(60):
            async with await anyio.open_process(args, env=ENV) as proc:
                assert proc.stdin is not None and proc.stderr is not None
                await proc.stdin.send(good)
                while not out.exists() or out.stat().st_size == 0:
                    await anyio.sleep(0.05)
                assert rejects.stat().st_size == 0
                rejects.unlink()
                await anyio.sleep(0.3)  # (a commit or two of the run meets it gone)
                await proc.stdin.send(bad)
                await proc.stdin.aclose()
                err = b"".join([chunk async for chunk in proc.stderr]).decode()
                code = await proc.wait()
    assert code == 0, err[-600:]
    ids = {f"p{i}" for i in range(1500)} | {f"bad{i}" for i in range(5)}
    assert_exactly_once(out, rejects, ids)
    assert svc.store.image_count == 1500


async def test_a_file_path_ending_in_a_slash_is_refused_as_a_folder(tmp_path: Path) -> None:
    """``--out exports/`` (a folder not made yet, meant to hold the results): the slash was
    dropped with the path's parsing, and the run wrote its results to a FILE named
    ``exports``, exit 0; the loader looking in the folder found nothing, and the next
    night's ``mkdir exports`` failed.
    ``--summary``/``--state`` so given made a file of the folder's name the same way. A path
    ending in ``/`` names a folder: refused as a usage error, exit 2, nothing made or sent."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    async with running_service(ServiceConfig()) as svc:
        for flag in ("--out", "--rejects", "--summary", "--state"):
            folder = tmp_path / f"exports{flag}"
            out = tmp_path / "out.jsonl"
            args = run_args(svc.url, out, str(manifest))
            if flag == "--out":
                args[args.index(str(out))] = f"{folder}/"
            else:
                args += [flag, f"{folder}/"]
            with anyio.fail_after(60):
                result = await anyio.run_process(args, check=False, env=ENV)
            err = result.stderr.decode()
            assert result.returncode == 2, (flag, err[-400:])
            assert "Traceback" not in err, err
            last = err.strip().splitlines()[-1]  # (argparse's usage above it)
            assert f"argument {flag}: {folder}/ ends in / (a folder)" in last, err
            assert not os.path.lexists(folder), flag
        assert svc.store.image_count == 0


async def test_an_output_that_is_a_symlink_into_an_unmounted_folder_is_named_plainly(
    tmp_path: Path,
) -> None:
    """``--state tagger.state`` (or ``--out``, ``--rejects``, ``--summary``, ``--reuse``) a
    symlink to a file on a file system not mounted tonight: ``cannot use state file ...:
    unable to open database file`` or ``cannot open the outputs: [Errno 2] No such file or
    directory`` naming the link, exit 1, a state file made beside it. As for a folder that
    is such a link: exit 2, naming the link and its target's missing folder, nothing made."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    missing = tmp_path / "not-mounted"
    async with running_service(ServiceConfig()) as svc:
        for flag in ("--out", "--rejects", "--state", "--summary", "--reuse"):
            link = tmp_path / f"link{flag}"
            link.symlink_to(missing / "file")
            out = link if flag == "--out" else tmp_path / "out.jsonl"
            args = run_args(svc.url, out, str(manifest))
            if flag != "--out":
                args += [flag, str(link)]
            with anyio.fail_after(60):
                result = await anyio.run_process(args, check=False, env=ENV)
            err = result.stderr.decode()
            assert result.returncode == 2, (flag, err[-400:])
            assert len(err.strip().splitlines()) == 1, err
            assert f"{link} is a symlink to {missing / 'file'}" in err, err
            assert f"its folder {missing} does not exist" in err, err
            assert not missing.exists(), flag
            assert not [p for p in tmp_path.iterdir() if p.name.endswith((".state", ".lock"))]
            link.unlink()
        assert svc.store.image_count == 0
