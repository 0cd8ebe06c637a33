"""What a downstream loader reads after each way ``fashiontag run`` ends (found by a hunt; each
test failed before its fix): the ``--summary`` JSON against the results and rejects lines and
the service's own count of images it accepted, and the exit code of a refusal."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.cli.commands import _build_parser
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, dead_port, run_args, write_csv


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


async def test_the_summary_of_a_run_that_gave_up_holds_its_counts(tmp_path: Path) -> None:
    """The service gone mid-run past ``--give-up-after`` (exit 1): the summary said
    ``tagged 0, submitted 0, rejected 0`` beside a results file of hundreds of lines and a
    service that billed every row; a loader or a monitor read that nothing was done. It holds
    the run's counts, as on every other exit."""
    n = 1500
    dup = "p1,https://img.example/dup.jpg,acme,TOP"  # a duplicate id: one rejects line
    manifest = write_csv(tmp_path / "m.csv", n, extra=[dup])
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    async with running_service(ServiceConfig(rate=300.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--summary", str(summary))
        proc = await anyio.open_process(
            [*args, "--give-up-after", "1"], stderr=subprocess.PIPE, env=ENV
        )
        with anyio.fail_after(30):  # every row accepted (billed), some written: then it goes
            while svc.store.image_count < n or _lines(out) == 0:
                await anyio.sleep(0.02)
        billed = svc.store.image_count
    with anyio.fail_after(30):
        await proc.wait()
    assert proc.stderr is not None
    err = (await proc.stderr.receive(65536)).decode()
    await proc.aclose()
    assert proc.returncode == 1, err[-400:]
    data = json.loads(summary.read_text())
    assert data["complete"] is False and data["error"], data
    written = _lines(out)
    assert 0 < written < n
    assert data["tagged"] + data["failed"] == written, data
    assert data["rejected"] == _lines(out.with_suffix(".rej")) == 1, data
    assert data["submitted"] == billed == n, data
    assert data["rows_read"] == n + 1, data
    assert data["unsettled"] == n - written, data


async def test_out_given_as_the_current_folder_is_refused_as_a_folder(tmp_path: Path) -> None:
    """``--out .`` (a cron line meant "here"): a traceback (``PosixPath('.') has an empty
    name``) and exit 1, last night's ``--summary`` left saying complete; ``--out dir`` is
    refused as a folder (exit 2, the summary saying so). ``.`` and ``/`` are refused the same."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    summary = tmp_path / "summary.json"
    for folder in (".", "/"):
        summary.write_text(json.dumps({"complete": True, "tagged": 5, "error": None}))
        args = run_args("http://127.0.0.1:9", tmp_path / "x.jsonl", str(manifest))
        i = args.index("--out")
        del args[i : i + 4]  # --out and --rejects
        result = await anyio.run_process(
            [*args, "--out", folder, "--summary", str(summary)],
            check=False,
            env=ENV,
            cwd=tmp_path,
        )
        err = result.stderr.decode()
        assert result.returncode == 2, err[-400:]
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-400:]
        assert f"--out {folder} is not a regular file (a folder)" in err, err
        data = json.loads(summary.read_text())
        assert data["complete"] is False and "--out" in data["error"], data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv", "summary.json"]


async def test_the_last_line_of_a_run_that_gave_up_says_the_same_command_resumes(
    tmp_path: Path,
) -> None:
    """The service unreachable past ``--give-up-after`` (exit 1, the commonest fatal end): the
    last line (and the summary's ``error``), all a cron mail's subject or a monitor keeps,
    named the failure and no fix, where every other fatal end says the state is saved and
    the same command resumes; an operator left to guess may ``--restart`` (every row billed
    again)."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    url = f"http://127.0.0.1:{dead_port()}"
    args = run_args(url, out, str(manifest), "--summary", str(summary), "--give-up-after", "1")
    result = await anyio.run_process(args, check=False, env=ENV)
    last = result.stderr.decode().strip().splitlines()[-1]
    assert result.returncode == 1, last
    assert "unreachable for 1s" in last and "the same command resumes" in last, last
    assert "the same command resumes" in json.loads(summary.read_text())["error"]


@pytest.mark.parametrize("given", [["--summ", "S"], ["--sum=S"], ["--su", "S"]])
async def test_summary_abbreviated_is_rewritten_on_a_usage_error(
    tmp_path: Path, given: list[str]
) -> None:
    """``--summ FILE`` is ``--summary FILE`` to argparse (a unique prefix), and runs as such
    every night; a usage error beside it (a typo in another flag, exit 2) left last night's
    summary saying ``complete: true``, only the flag spelt whole being looked for."""
    (commands,) = (a for a in _build_parser("run")._actions if a.choices and "run" in a.choices)
    flags = commands.choices["run"]._option_string_actions  # type: ignore[index]
    assert [flag for flag in flags if flag.startswith("--su")] == ["--summary"]
    manifest = write_csv(tmp_path / "m.csv", 5)
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"complete": True, "tagged": 5, "error": None}))
    flag = [part.replace("S", str(summary)) for part in given]
    args = run_args("http://127.0.0.1:9", tmp_path / "out.jsonl", str(manifest), *flag)
    result = await anyio.run_process([*args, "--bogus-flag"], check=False, env=ENV)
    assert result.returncode == 2, result.stderr.decode()
    data = json.loads(summary.read_text())
    assert data["complete"] is False and "--bogus-flag" in data["error"], data


async def test_the_summary_of_last_night_is_not_left_saying_complete_while_tonight_runs(
    tmp_path: Path,
) -> None:
    """The docs tell a loader to read the results once ``--summary`` says ``complete``. While
    tonight's run (a new dump) rewrote ``results.jsonl`` from nothing, and after it was killed
    (the OOM killer, SIGKILL: no summary written), the file still held last night's
    ``complete: true``: the loader read a half-written night as a whole one. Once the run is
    under way the summary says it has not ended; the same command then replaces it."""
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    async with running_service(ServiceConfig(rate=400.0)) as svc:
        night1 = write_csv(tmp_path / "m.csv", 10)
        args = run_args(svc.url, out, str(night1), "--summary", str(summary))
        done = await anyio.run_process(args, check=False, env=ENV)
        assert done.returncode == 0 and json.loads(summary.read_text())["complete"] is True
        write_csv(tmp_path / "m.csv", 1000, start=10)  # the next night's dump, same path
        proc = await anyio.open_process(args, env=ENV)
        with anyio.fail_after(30):  # under way: last night's lines cut, tonight's coming
            while _lines(out) in (0, 10) and proc.returncode is None:
                await anyio.sleep(0.01)
        during = json.loads(summary.read_text())
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        after_kill = json.loads(summary.read_text())
        assert during["complete"] is False and "not ended" in during["error"], during
        assert after_kill["complete"] is False, after_kill
        again = await anyio.run_process(args, check=False, env=ENV)
    assert again.returncode == 0, again.stderr.decode()[-400:]
    data = json.loads(summary.read_text())
    assert data["complete"] is True and data["tagged"] == _lines(out) == 1000, data


async def test_a_run_whose_last_commit_fails_is_never_summed_up_complete(
    tmp_path: Path, postgres_url: str
) -> None:
    """Every row tagged, then the state's last write (``completed_at``) refused by its
    database (here a trigger; a failover or a full disk at that instant): exit 1 with the
    error, and the summary said ``"complete": true`` beside it, though the state was not
    marked complete; a loader gating on ``complete`` took a failed run for a whole one."""
    import psycopg

    from fashiontag_pipeline.engine.state.pgstore import PostgresStateDB

    state = PostgresStateDB(f"{postgres_url}#nightly")  # (its schema and tables made)
    base, tables = state.base, state.schema
    state.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION refuse_completed() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF NEW.key = 'completed_at' THEN RAISE EXCEPTION 'disk full'; END IF;"
            " RETURN NEW; END $$"
        )
        conn.execute(
            f'CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON "{tables}".meta'
            f' FOR EACH ROW EXECUTE FUNCTION "{base}".refuse_completed()'
        )
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    manifest = write_csv(tmp_path / "m.csv", 20)
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, str(manifest), "--summary", str(summary))
        result = await anyio.run_process(
            [*args, "--state", f"{postgres_url}#nightly"], check=False, env=ENV
        )
    assert result.returncode == 1, result.stderr.decode()[-400:]
    assert "disk full" in result.stderr.decode()
    data = json.loads(summary.read_text())
    assert data["complete"] is False and "disk full" in data["error"], data
    assert data["tagged"] == 20, data


def test_the_summary_is_on_disk_before_it_is_renamed_and_no_temp_file_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--summary`` was renamed into place unsynced: after a power cut the name could hold
    an empty file (ext4 and XFS may order the rename before the data), which a loader reads
    as no summary at all; and a write that failed left ``.NAME.tmp`` behind. The file's data
    is on disk before the rename, the folder's entry after it, and a failed write leaves
    nothing."""
    import os

    from fashiontag_pipeline.cli import summary_file
    from fashiontag_pipeline.engine.config import RunSummary

    done: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        done.append("fsync:" + ("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"))
        real_fsync(fd)

    def replace(src: object, dst: object) -> None:
        done.append("rename")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(summary_file.os, "fsync", fsync)
    monkeypatch.setattr(summary_file.os, "replace", replace)
    path = tmp_path / "summary.json"
    assert summary_file.write_summary(path, RunSummary(tagged=3))
    assert done == ["fsync:file", "rename", "fsync:dir"]
    assert json.loads(path.read_text())["tagged"] == 3
    (tmp_path / "folder.json").mkdir()  # a folder where the summary goes: the rename fails
    assert not summary_file.write_summary(tmp_path / "folder.json", RunSummary())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.json", "summary.json"]
