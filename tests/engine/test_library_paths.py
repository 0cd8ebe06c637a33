"""The paths a program gives the engine as a library (``run_pipeline``, ``Engine.submit``):
an output that is one of the run's other files (its manifest, its state, the other output)
destroyed that file (``fashiontag run`` refused such a command line with exit 2; the
library, which the CLI checks before calling, did not), and one path given where a list of
them is asked for. Found by a hunt; each failed before its fix.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline import ConfigError, ManifestError, StateConflictError
from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline.engine import EngineConfig, RunSummary, run_pipeline
from fashiontag_pipeline.engine.engine import Engine
from fashiontag_pipeline.engine.jobs import JobSpec
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    assert_exactly_once,
    client_config,
    dead_port,
    ids_of,
    job_spec,
    taken_in,
    write_csv,
)

#: A run that went on against the dead service gives up within a second.
FAST = EngineConfig(
    poll_min=0.02, poll_max=0.2, linger_seconds=0.05, fsync_seconds=10.0, give_up_after=1.0
)


def _jsonl_manifest(path: Path, n: int) -> Path:
    rows = (f'{{"id": "p{i}", "url": "https://img.example/{i}.jpg"}}\n' for i in range(n))
    path.write_text("".join(rows))
    return path


@pytest.mark.parametrize("clash", ["out=manifest", "rejects=manifest", "out=state", "out=rejects"])
async def test_run_pipeline_refuses_an_output_that_is_another_of_its_files(
    tmp_path: Path, clash: str
) -> None:
    """A program whose manifest is JSONL and whose results path is made from it
    (``out=manifest.with_suffix(".jsonl")``) had its catalogue cut to 0 bytes by the results
    sink before a row was read (then a `changed while it was read` error); an output on the
    state file overwrote the database. Refused now before anything is opened or sent: the
    file is untouched, no state is made."""
    manifest = _jsonl_manifest(tmp_path / "catalogue.jsonl", 50)
    before = manifest.read_bytes()
    files = {
        "out": tmp_path / "results.jsonl",
        "rejects": tmp_path / "rejects.jsonl",
        "state": tmp_path / "run.state",
    }
    left, right = clash.split("=")
    files[left] = manifest.with_suffix(".jsonl") if right == "manifest" else files[right]
    with pytest.raises(ConfigError, match=f"{left} and {right} are the same file"):
        await run_pipeline(
            [manifest],
            # A service that refuses connections: a run that went on would fail otherwise.
            client=client_config(f"http://127.0.0.1:{dead_port()}"),
            out=files["out"],
            rejects=files["rejects"],
            state=files["state"],
            engine=FAST,
        )
    assert manifest.read_bytes() == before
    assert not (tmp_path / "run.state").exists()


@pytest.mark.parametrize("clash", ["results=manifest", "rejects=manifest", "results=state"])
async def test_a_submit_whose_output_is_another_of_its_files_is_refused(
    tmp_path: Path, clash: str
) -> None:
    """``Engine.submit`` of a job whose results (or rejects) path is its manifest cut the
    manifest to 0 bytes; one whose results path is the engine's SQLite state file had result
    lines appended to the database. Refused now, nothing recorded: the engine goes on (the
    same key with proper paths is taken) and the files are untouched."""
    manifest = _jsonl_manifest(tmp_path / "catalogue.jsonl", 50)
    before = manifest.read_bytes()
    state = tmp_path / "engine.state"
    db = StateDB(state)
    paths = {"results": tmp_path / "out" / "results.jsonl", "rejects": tmp_path / "out" / "r.jsonl"}
    left, right = clash.split("=")
    paths[left] = manifest if right == "manifest" else state
    async with TaggerClient(config=client_config(f"http://127.0.0.1:{dead_port()}")) as client:
        engine = Engine(client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True)
        with anyio.fail_after(20):
            async with engine:
                with pytest.raises(ConfigError, match=f"{left} and {right} are the same file"):
                    await engine.submit(JobSpec(key="a", manifests=[str(manifest)], **paths))
                assert engine.active_jobs() == []
                engine.close()
    assert manifest.read_bytes() == before
    check = StateDB(state)  # still a state (nothing appended to it), with no job recorded
    try:
        assert check.find_job("a") is None
    finally:
        check.close()


async def test_one_manifest_given_as_a_bare_path_is_that_manifest(tmp_path: Path) -> None:
    """``run_pipeline("catalogue.csv", ...)`` (one path, not a list of them) and
    ``JobSpec(manifests="catalogue.csv")`` read each character of the name as a manifest of its
    own: refused for a file ``c`` that does not exist, or for ``a`` named twice. One path
    (``str`` or ``Path``) is that one manifest."""
    manifest = _jsonl_manifest(tmp_path / "catalogue.jsonl", 20)
    async with running_service(ServiceConfig()) as svc:
        with anyio.fail_after(20):
            summary = await run_pipeline(
                str(manifest),  # one path, not a list: what a caller writes
                client=client_config(svc.url),
                out=tmp_path / "a" / "results.jsonl",
                rejects=tmp_path / "a" / "rejects.jsonl",
                engine=FAST,
            )
        assert summary.complete and summary.rows_read == 20
        assert_exactly_once(
            tmp_path / "a" / "results.jsonl", tmp_path / "a" / "rejects.jsonl", ids_of(20)
        )
        db = StateDB(tmp_path / "engine.state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )
            with anyio.fail_after(20):
                async with engine:
                    spec = JobSpec(
                        key="b",
                        manifests=manifest,  # one Path
                        results=tmp_path / "b" / "results.jsonl",
                        rejects=tmp_path / "b" / "rejects.jsonl",
                    )
                    job = await engine.submit(spec)
                    engine.close()
                    await engine.outcome(job)
    assert job.rows_read == 20
    assert_exactly_once(
        tmp_path / "b" / "results.jsonl", tmp_path / "b" / "rejects.jsonl", ids_of(20)
    )


async def test_manifests_given_as_a_list_of_paths_are_read(tmp_path: Path) -> None:
    """``JobSpec(manifests=[Path("a.csv"), Path("b.csv")])`` (a list of ``Path``, as
    ``run_pipeline`` takes them) failed the submit with a bare ``TypeError: sequence item 0:
    expected str instance, PosixPath found`` from deep inside the engine. Every path is taken,
    ``str`` or ``Path``; a name of another type (``None``, an int, bytes) is a ``TypeError``
    that says which, before anything is opened or recorded, on either API."""
    a = _jsonl_manifest(tmp_path / "a.jsonl", 20)
    b = tmp_path / "b.jsonl"
    b.write_text(
        "".join(f'{{"id": "q{i}", "url": "https://img.example/q{i}"}}\n' for i in range(5))
    )
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "engine.state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )
            with anyio.fail_after(20):
                async with engine:
                    spec = JobSpec(
                        key="a",
                        manifests=[a, b],  # Paths, as run_pipeline takes them
                        results=tmp_path / "a" / "results.jsonl",
                        rejects=tmp_path / "a" / "rejects.jsonl",
                    )
                    job = await engine.submit(spec)
                    engine.close()
                    await engine.outcome(job)
        for bad in ([a, None], [7], [b"a.jsonl"], b"a.jsonl"):
            with pytest.raises(TypeError, match="manifest"):
                JobSpec(key="b", manifests=bad, results=tmp_path / "r", rejects=tmp_path / "j")  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="manifest"):
                await run_pipeline(
                    bad,  # type: ignore[arg-type]
                    client=client_config(svc.url),
                    out=tmp_path / "c" / "results.jsonl",
                    rejects=tmp_path / "c" / "rejects.jsonl",
                    engine=FAST,
                )
    assert job.rows_read == 25
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl",
        tmp_path / "a" / "rejects.jsonl",
        ids_of(20) | ids_of(5, "q"),
    )
    assert not (tmp_path / "c").exists()  # nothing made for a refused call


@pytest.mark.parametrize("stdin", ["none", "closed", "text only"])
async def test_stdin_as_a_manifest_of_a_process_without_one_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stdin: str
) -> None:
    """``run_pipeline(["-"])`` in a program started with its standard input closed (Python's
    ``sys.stdin`` is then None) or one that closed it failed with a bare ``AttributeError:
    'NoneType' object has no attribute 'buffer'`` or ``ValueError: read of closed file``. It
    is a ManifestError that says so, before anything is made."""
    if stdin == "none":
        monkeypatch.setattr("sys.stdin", None)
    elif stdin == "text only":  # (a notebook's stand-in: text, no bytes under it)
        monkeypatch.setattr("sys.stdin", io.StringIO("id,url\n"))
    else:
        closed = (tmp_path / "in").open("w+")
        closed.close()
        monkeypatch.setattr("sys.stdin", closed)
    out = tmp_path / "out" / "results.jsonl"
    said = "has no bytes to read" if stdin == "text only" else "no standard input"
    with pytest.raises(ManifestError, match=said):
        await run_pipeline(
            ["-"],
            client=client_config(f"http://127.0.0.1:{dead_port()}"),
            out=out,
            rejects=tmp_path / "out" / "rejects.jsonl",
            engine=FAST,
        )
    assert not (tmp_path / "out").exists()


async def test_a_job_of_relative_outputs_is_resumed_from_another_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``JobSpec(results=Path("a/results.jsonl"), ...)`` (outputs relative to the program's
    working directory) was recorded as given: a program whose working directory changed (an
    ``os.chdir`` of its own mid-run, or restarted by a scheduler from another directory) had
    its run stopped, "the run's outputs were removed", or the next start opened the job's
    outputs in the new directory, empty, and said its committed lines were lost: "start over
    with --restart", every row billed again while its lines were intact where they were
    written. A job's outputs are recorded absolute, as ``run_pipeline`` records its own."""
    n = 3000
    work, other = tmp_path / "work", tmp_path / "other"
    (other / "a").mkdir(parents=True)
    work.mkdir()
    manifest = write_csv(work / "m.csv", n)
    outputs = work / "a" / "results.jsonl", work / "a" / "rejects.jsonl"
    monkeypatch.chdir(work)
    config = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.05, fsync_seconds=0.05)
    async with (
        running_service(ServiceConfig(rate=3000)) as svc,
        TaggerClient(config=client_config(svc.url)) as client,
    ):

        def engine() -> Engine:
            db = StateDB(tmp_path / "state")
            return Engine(client=client, db=db, state=db.open_engine(), config=config)

        with anyio.fail_after(30), pytest.raises(ExceptionGroup) as stopped:
            async with engine() as first:
                await first.submit(job_spec("a", Path("m.csv"), Path("a")))
                while not outputs[0].exists() or outputs[0].stat().st_size == 0:
                    await anyio.sleep(0.01)
                os.chdir(other)  # its outputs are written on where they were opened
                await anyio.sleep(0.3)  # (fsync-ed meanwhile: the outputs looked at)
                raise RuntimeError("the program stops")
        assert stopped.value.subgroup(RuntimeError) is not None  # its own error, and no other
        assert stopped.value.split(RuntimeError)[1] is None
        with anyio.fail_after(30):
            async with engine() as second:  # started in the other directory
                with pytest.raises(StateConflictError, match=str(outputs[0])):
                    await second.submit(job_spec("a", manifest, Path("a")))
                job = await second.submit(job_spec("a", manifest, work / "a"))
                second.close()
                await second.outcome(job)
    assert job.row.state == "complete"
    assert_exactly_once(*outputs, ids_of(n))
    assert svc.store.image_count == n  # no row sent twice
    assert os.listdir(other / "a") == []


async def test_a_submit_whose_files_are_another_jobs_in_flight_is_refused(tmp_path: Path) -> None:
    """A program that submits a job per file of a folder, results beside each
    (``f.with_suffix(".jsonl")``), on a folder holding ``x.jsonl`` and ``x.csv``: the second
    job's results were the first job's manifest. Its sink cut the catalogue to nothing while
    the first job read it (the file lost, the engine stopped: "changed while it was read").
    Likewise a job whose manifest is the results another job is writing read those lines. Such
    a submit is refused (``ConfigError``, nothing recorded) and the job in flight completes."""
    folder = tmp_path / "in"
    folder.mkdir()
    rows = (f'{{"id": "p{i}", "url": "https://img.example/{i}.jpg"}}\n' for i in range(3000))
    jsonl = folder / "x.jsonl"
    jsonl.write_text("".join(rows))
    catalogue = jsonl.read_bytes()
    csv = write_csv(folder / "x.csv", 100, start=5000)
    async with (
        running_service(ServiceConfig(rate=2000)) as svc,
        TaggerClient(config=client_config(svc.url)) as client,
    ):
        db = StateDB(tmp_path / "state")
        engine = Engine(client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True)
        with anyio.fail_after(30):
            async with engine:
                first = await engine.submit(
                    JobSpec(
                        key="x.jsonl",
                        manifests=jsonl,
                        results=tmp_path / "out" / "x.results.jsonl",
                        rejects=tmp_path / "out" / "x.rejects.jsonl",
                    )
                )
                with pytest.raises(ConfigError, match=r"x\.jsonl"):  # its results: a manifest
                    await engine.submit(
                        JobSpec(key="x.csv", manifests=csv, results=jsonl, rejects=tmp_path / "r1")
                    )
                with pytest.raises(ConfigError, match=r"x\.results\.jsonl"):  # reads results
                    await engine.submit(
                        job_spec("again", tmp_path / "out" / "x.results.jsonl", tmp_path / "r2")
                    )
                engine.close()
                await engine.outcome(first)
    assert jsonl.read_bytes() == catalogue
    assert first.row.state == "complete"
    assert_exactly_once(
        tmp_path / "out" / "x.results.jsonl", tmp_path / "out" / "x.rejects.jsonl", ids_of(3000)
    )
    check = StateDB(tmp_path / "state")
    try:
        assert check.find_job("x.csv") is None and check.find_job("again") is None
    finally:
        check.close()


@pytest.mark.parametrize("state", ["", "folder"])
async def test_a_state_that_is_empty_or_a_folder_is_refused_plainly(
    tmp_path: Path, state: str
) -> None:
    """``run_pipeline(..., state=os.environ.get("TAG_STATE", ""))`` with the variable unset,
    or ``state=Path("states/")`` (a folder): the run failed with ``ValueError: PosixPath('.')
    has an empty name`` or SQLite's "unable to open database file" (``fashiontag run``
    refused both, naming the flag). The library says what is wrong too, before anything is
    made."""
    manifest = _jsonl_manifest(tmp_path / "m.jsonl", 20)
    given: str | Path = state
    if state == "folder":
        given = tmp_path / "states"
        given.mkdir()
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    with pytest.raises(ConfigError, match="state") as caught:
        await run_pipeline(
            [manifest],
            client=client_config(f"http://127.0.0.1:{dead_port()}"),
            out=out,
            rejects=rej,
            state=given,
            engine=FAST,
        )
    assert ("empty" if state == "" else "is a folder") in str(caught.value)
    assert not out.exists() and not list(tmp_path.glob("*.state*"))


async def test_a_relative_manifest_is_looked_at_again_where_it_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_pipeline(["catalogue.csv"], ...)`` in a program that changes its working directory
    while the run goes on (a notebook's ``%cd`` into the next day's folder, a task that
    ``os.chdir``-s into each feed's folder), where a file of the same name is: the run's look
    at its manifests once every row had its outcome took the other folder's file for the one
    read, "manifest catalogue.csv names another file than the one the run read", and the run,
    every row tagged once, was reported incomplete with that error (exit 3 in a CLI, a retry
    by the scheduler). The manifest is looked at again where it was read."""
    n = 2000
    day1, day2 = tmp_path / "day1", tmp_path / "day2"
    day1.mkdir()
    day2.mkdir()
    write_csv(day1 / "catalogue.csv", n)
    write_csv(day2 / "catalogue.csv", 500, start=50_000)  # the next day's, in its folder
    out, rej = day1 / "out.jsonl", day1 / "rej.jsonl"
    monkeypatch.chdir(day1)
    async with running_service(ServiceConfig(rate=2000)) as svc:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                ended: list[RunSummary] = []

                async def run() -> None:
                    ended.append(
                        await run_pipeline(
                            ["catalogue.csv"],
                            client=client_config(svc.url),
                            out=Path("out.jsonl"),
                            rejects=Path("rej.jsonl"),
                            engine=FAST,
                        )
                    )

                tg.start_soon(run)
                while taken_in(day1 / "out.jsonl.state")[0] < n:  # read to its end
                    await anyio.sleep(0.01)
                assert not ended
                os.chdir(day2)
    summary = ended[0]
    assert summary.error is None
    assert summary.complete
    assert_exactly_once(out, rej, ids_of(n))
    assert svc.store.image_count == n
