"""How cron jobs and operators invoke ``fashiontag run``, second hunt (each test failed before
its fix): a path whose name is not UTF-8 (a Latin-1 name from a file share)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.engine import run_pipeline, sinks
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, client_config, ids_of, run_args, write_csv

LATIN1 = os.fsdecode(b"caf\xe9")  # a name as a Windows share or an old exporter writes it


@pytest.mark.parametrize("where", ["manifest", "out"])
async def test_a_path_that_is_not_utf8_is_a_clear_error(tmp_path: Path, where: str) -> None:
    """A dump named ``caf\\xe9.csv`` (or an output folder so named): the run died with a
    ``UnicodeEncodeError: surrogates not allowed`` traceback (exit 1) after making its state
    file. It is refused (exit 2), naming the path, before anything is made; the daemon already
    moves such a manifest to failed/."""
    manifest = write_csv(tmp_path / (f"{LATIN1}.csv" if where == "manifest" else "m.csv"), 20)
    folder = tmp_path / (LATIN1 if where == "out" else "o")
    folder.mkdir()
    out = folder / "results.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest), "--summary", str(tmp_path / "s.json")),
            check=False,
            env=ENV,
        )
    err = result.stderr.decode()
    assert "Traceback" not in err, err[-600:]
    assert result.returncode == 2, err[-300:]
    assert "not UTF-8" in err and "caf\\xe9" in err, err
    assert sorted(p.name for p in folder.iterdir()) == [], "it left files behind"


async def test_a_utf8_path_still_runs(tmp_path: Path) -> None:
    """The check above refuses only undecodable names: an accented name in UTF-8 runs."""
    folder = tmp_path / "café"
    folder.mkdir()
    manifest = write_csv(folder / "été.csv", 20)
    out = folder / "résultats.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(run_args(svc.url, out, str(manifest)), env=ENV)
    assert result.returncode == 0
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(20))


@pytest.mark.parametrize("where", ["manifest", "out"])
async def test_a_utf8_path_in_a_c_locale_without_utf8_mode_blames_the_locale(
    tmp_path: Path, where: str
) -> None:
    """A cron line run with ``LC_ALL=C PYTHONUTF8=0`` (Python then reads every file name as
    ASCII) on ``kat\u00e4log.csv`` (or an output folder so named), both UTF-8 on disk: exit 2
    saying the path is not UTF-8 ("a name written in another encoding"), shown as
    ``kat\\xe4log.csv`` as if it were Latin-1: a user renamed a good file, or looked for an
    encoding it never had. It names the locale now, and how to run (as the daemon does)."""
    folder = tmp_path / ("sortie\u00e9" if where == "out" else "o")
    folder.mkdir()
    manifest = write_csv(tmp_path / ("kat\u00e4log.csv" if where == "manifest" else "m.csv"), 20)
    env = {**ENV, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, folder / "r.jsonl", str(manifest))
        result = await anyio.run_process(args, check=False, env=env)
    err = result.stderr.decode()
    assert result.returncode == 2, err[-300:]
    assert "not UTF-8" not in err, err
    assert "PYTHONUTF8=0" in err and "LANG=C.UTF-8" in err, err
    assert sorted(p.name for p in folder.iterdir()) == [], "it left files behind"


@pytest.mark.parametrize("target", ["out", "rejects", "state", "manifest"])
async def test_summary_on_one_of_the_runs_files_is_refused(tmp_path: Path, target: str) -> None:
    """``--summary`` naming the results file (a slip in a cron line: ``--summary $OUT``): the
    run tagged every row, then replaced the results with the summary's JSON and exited 0,
    "run complete", every result gone (on the state: the next run found no state; on the
    manifest: the dump was overwritten). The other files of a run were already checked
    against each other; the summary now is too (exit 2, nothing touched)."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "results.jsonl"
    files = {
        "out": out,
        "rejects": out.with_suffix(".rej"),
        "state": out.with_name("results.jsonl.state"),
        "manifest": manifest,
    }
    before = manifest.read_bytes()
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest), "--summary", str(files[target])),
            check=False,
            env=ENV,
        )
        requests = len(svc.store.tasks)
    err = result.stderr.decode()
    assert result.returncode == 2, err[-300:]
    assert "--summary" in err and "same file" in err, err
    assert requests == 0
    assert manifest.read_bytes() == before
    assert not out.exists()


@pytest.mark.parametrize("which", ["--rejects", "--out"])
async def test_an_output_on_dev_null_is_refused_before_any_request(
    tmp_path: Path, which: str
) -> None:
    """``--rejects /dev/null`` (a cron line that does not want the rejects): every row was
    tagged and billed, then the run ended with ``OSError: [Errno 22] Invalid argument`` (the
    fsync of /dev/null), exit 1, saying "the same command resumes once this is fixed"; the
    same command then died with a traceback (``I/O operation on closed file``), every night.
    An output that is not a regular file is refused (exit 2) before any request or state."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "results.jsonl"
    # (--state given: on the code before, --out /dev/null made /dev/null.state.)
    args = run_args("x", out, str(manifest), "--state", str(tmp_path / "s.state"))
    args[args.index(which) + 1] = os.devnull
    async with running_service(ServiceConfig()) as svc:
        args[args.index("--base-url") + 1] = svc.url
        first = await anyio.run_process(args, check=False, env=ENV)
        again = await anyio.run_process(args, check=False, env=ENV)
        tasks = len(svc.store.tasks)
    for result in (first, again):
        err = result.stderr.decode()
        assert "Traceback" not in err, err[-600:]
        assert result.returncode == 2, err[-300:]
        assert f"{which} {os.devnull}" in err and "not a regular file" in err, err
    assert tasks == 0, "rows were tagged for a run that cannot keep their outcomes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]


async def test_out_dash_is_refused_not_a_file_named_dash(tmp_path: Path) -> None:
    """``--out -`` (results to stdout, as with many tools): the run wrote a file named ``-``
    in the working directory and exited 0, stdout empty. Refused (exit 2): results go to a
    file, which a resume cuts back to its last checkpoint."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    args = run_args("http://127.0.0.1:9", Path("-"), str(manifest), "--give-up-after", "1")
    args[args.index("--rejects") + 1] = "rejects.jsonl"
    result = await anyio.run_process(args, check=False, env=ENV, cwd=tmp_path)
    err = result.stderr.decode()
    assert result.returncode == 2, err[-300:]
    assert "--out -" in err, err
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("failing", ["results", "rejects"])
async def test_an_output_whose_fsync_fails_at_the_end_says_so_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """An output on a filesystem whose fsync fails when the job closes its outputs (EIO on an
    NFS mount, a disk going bad; fsync of /dev/null): the run must stop with that OSError,
    state saved, each time. It died with ``ValueError: I/O operation on closed file`` instead
    (the outputs were closed twice: a traceback in the CLI), and with the results failing
    the rejects were never closed, their lock held from the next run of the process."""
    manifest = write_csv(tmp_path / "m.csv", 20, extra=["bad,ftp://x/y.jpg"])
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    target = out if failing == "results" else rej
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(target):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(sinks.os, "fsync", fsync)
    async with running_service(ServiceConfig()) as svc:
        for _ in range(2):
            with pytest.raises(OSError) as caught:
                await run_pipeline([manifest], client=client_config(svc.url), out=out, rejects=rej)
            assert caught.value.errno == errno.EIO, caught.value
        monkeypatch.setattr(sinks.os, "fsync", real_fsync)
        summary = await run_pipeline(
            [manifest], client=client_config(svc.url), out=out, rejects=rej
        )
    assert summary.complete
    assert_exactly_once(out, rej, ids_of(20) | {"bad"})


async def test_a_folder_given_as_the_manifest_is_named_a_folder(tmp_path: Path) -> None:
    """``fashiontag run /data/export/`` (the folder of tonight's files): the error said it was
    "not a regular file (a pipe or a device)" and told to pass it on stdin, which a folder
    cannot be. It says it is a folder, and to give the files in it."""
    folder = tmp_path / "export"
    folder.mkdir()
    write_csv(folder / "m.csv", 5)
    args = run_args("http://127.0.0.1:9", tmp_path / "out.jsonl", f"{folder}/")
    result = await anyio.run_process(args, check=False, env=ENV)
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert "is a folder" in err and "pipe" not in err, err
    assert f"{folder}/*.csv" in err, err


def _two_manifests(tmp_path: Path) -> tuple[Path, Path]:
    # "B.csv a.csv" under LANG=C (cron), "a.csv B.csv" in an en_US shell: the same glob.
    return (
        write_csv(tmp_path / "B.csv", 3000, start=0),
        write_csv(tmp_path / "a.csv", 3000, start=3000),
    )


async def test_a_complete_run_given_its_manifests_in_another_order_does_nothing(
    tmp_path: Path,
) -> None:
    """Cron ran ``fashiontag run /data/*.csv`` under LANG=C; the operator checks it from a
    shell whose locale sorts the glob otherwise. The same files in another order were "other
    manifests": a new run, the outputs rewritten and every row tagged (billed) again. They are
    the same run: already complete, no request."""
    big, small = _two_manifests(tmp_path)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        first = await anyio.run_process(run_args(svc.url, out, str(big), str(small)), env=ENV)
        assert first.returncode == 0
        tasks = len(svc.store.tasks)
        again = await anyio.run_process(
            run_args(svc.url, out, str(small), str(big)), check=False, env=ENV
        )
        created = len(svc.store.tasks) - tasks
    err = again.stderr.decode()
    assert again.returncode == 0, err
    assert created == 0, f"{created} tasks created again: every row billed twice ({err})"
    assert "already complete" in err, err
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(6000))


async def test_an_unfinished_run_given_its_manifests_in_another_order_resumes(
    tmp_path: Path,
) -> None:
    """The same, for a run killed mid-way: refused (exit 2) as "other manifests", listing
    the same two files, until the operator found the order. It resumes, in the run's order,
    every id once."""
    big, small = _two_manifests(tmp_path)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        first = await anyio.open_process(run_args(svc.url, out, str(big), str(small)), env=ENV)
        try:
            with anyio.fail_after(30):
                while not out.exists() or out.stat().st_size == 0:
                    await anyio.sleep(0.05)
        finally:
            first.kill()
            await first.wait()
            await first.aclose()
        again = await anyio.run_process(
            run_args(svc.url, out, str(small), str(big)), check=False, env=ENV
        )
    err = again.stderr.decode()
    assert again.returncode == 0, err
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(6000))


async def test_sqlite_sink_on_last_nights_jsonl_results_names_the_file(tmp_path: Path) -> None:
    """``--sink sqlite`` added to a cron line that kept ``--out results.jsonl`` (last night's
    JSONL is there): the run said ``DatabaseError: file is not a database (what was committed
    is kept: the same command resumes once this is fixed)``, naming no file (the state? the
    result store?) and promising a resume that never comes. It names the results file and
    what to do, sends nothing, and leaves last night's file as it was."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "results.jsonl"
    last_night = b'{"id":"p0","taskId":"t","taggingResult":{"status":"success"}}\n'
    out.write_bytes(last_night)
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest), "--sink", "sqlite"), check=False, env=ENV
        )
        tasks = len(svc.store.tasks)
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert "Traceback" not in err, err[-600:]
    assert str(out) in err and "not an SQLite" in err, err
    assert "resumes once this is fixed" not in err, err
    assert tasks == 0
    assert out.read_bytes() == last_night


@pytest.mark.parametrize(
    "refusal", ["dev-null", "not-utf8", "same-file", "config", "flag-value", "state-url"]
)
async def test_a_run_refused_before_it_starts_rewrites_the_summary(
    tmp_path: Path, refusal: str
) -> None:
    """A cron job reads ``--summary`` after each night. A run refused before it starts (an
    output that is not a file, a path that is not UTF-8, two outputs on one file, a config
    file someone broke, a bad flag value: exit 2) left last night's summary saying
    ``complete: true``."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"complete": True, "tagged": 20, "error": None}))
    args = run_args("http://127.0.0.1:9", out, str(manifest), "--summary", str(summary))
    if refusal == "dev-null":
        args[args.index("--rejects") + 1] = os.devnull
    elif refusal == "not-utf8":
        (tmp_path / LATIN1).mkdir()
        args[args.index("--out") + 1] = str(tmp_path / LATIN1 / "out.jsonl")
    elif refusal == "same-file":
        args[args.index("--rejects") + 1] = str(out)
    elif refusal == "config":
        (tmp_path / "ft.toml").write_text("[enigne]\nrotate_images = 2000\n")
        args += ["--config", str(tmp_path / "ft.toml")]
    elif refusal == "flag-value":
        args += ["--write-concurrency", "0"]
    else:
        args += ["--state", "sqlite:///var/x.db"]
    result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 2, result.stderr.decode()
    data = json.loads(summary.read_text())
    assert data["complete"] is False and data["error"], data


@pytest.mark.parametrize("which", ["--summary", "--state", "--reuse"])
async def test_a_folder_given_as_the_summary_or_state_is_refused_before_any_request(
    tmp_path: Path, which: str
) -> None:
    """``--summary reports/`` (a folder, its file name forgotten): every row was tagged and
    billed, then the run ended with exit 1, "cannot write --summary reports: Is a directory",
    every night; ``--state FOLDER`` was exit 1 with SQLite's "unable to open database file",
    ``--reuse FOLDER`` too (its state made, "move it away to start an empty store"). Each is
    exit 2 naming the flag and the folder, before any request and with nothing made."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    folder = tmp_path / "reports"
    folder.mkdir()
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, tmp_path / "results.jsonl", str(manifest), which, str(folder))
        result = await anyio.run_process(args, check=False, env=ENV)
        tasks = len(svc.store.tasks)
    err = result.stderr.decode()
    assert result.returncode == 2, err[-300:]
    assert f"{which} {folder} is a folder" in err, err
    assert tasks == 0, "rows were tagged for a run that cannot say what it did"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv", "reports"]


@pytest.mark.parametrize("target", ["--out", "--rejects", "--summary"])
async def test_an_output_on_the_file_stdin_reads_is_refused(tmp_path: Path, target: str) -> None:
    """``fashiontag run - --out products.jsonl < products.jsonl`` (the catalogue redirected to
    stdin, its own name given as an output by a slip): a manifest named so is refused, but
    stdin's file was not checked. ``--out`` or ``--rejects`` cut the catalogue to 0 bytes
    before its rows were read (exit 1, "changed while it was read"); ``--summary`` replaced it
    with the run's JSON and the run exited 0, "run complete": the catalogue gone either way.
    The file on stdin is now checked as a manifest is (exit 2, nothing sent, nothing cut)."""
    catalogue = tmp_path / "products.jsonl"
    catalogue.write_text(
        "".join(
            json.dumps({"id": i, "url": f"https://img.example/{i}.jpg"}) + "\n" for i in ids_of(20)
        )
    )
    before = catalogue.read_bytes()
    out = tmp_path / "results.jsonl"
    args = run_args("x", out, "-", "--state", str(tmp_path / "s.state"))
    if target == "--summary":
        args += [target, str(catalogue)]
    else:
        args[args.index(target) + 1] = str(catalogue)
    async with running_service(ServiceConfig()) as svc:
        args[args.index("--base-url") + 1] = svc.url
        with catalogue.open("rb") as stdin:
            result = await anyio.run_process(args, stdin=stdin, check=False, env=ENV)
        tasks = len(svc.store.tasks)
    err = result.stderr.decode()
    assert result.returncode == 2, err[-400:]
    assert "stdin" in err and target in err, err
    assert catalogue.read_bytes() == before, "the catalogue on stdin was overwritten"
    assert tasks == 0
