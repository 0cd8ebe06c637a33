"""The output files as the programs downstream load them, by the name they are given (a
name that says compressed is refused: the outputs are plain JSONL)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline._exceptions import ConfigError
from fashiontag_pipeline.engine import run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, client_config, run_args, write_csv


@pytest.mark.parametrize(
    ("flag", "name"),
    [("--out", "results.jsonl.gz"), ("--rejects", "rejects.jsonl.gz"), ("--out", "r.JSONL.ZST")],
)
async def test_an_output_named_as_a_compressed_file_is_refused_before_anything_is_sent(
    tmp_path: Path, flag: str, name: str
) -> None:
    """``--out results.jsonl.gz`` (the manifest was ``.csv.gz``, so the results were asked for
    so too): the run wrote plain JSONL into a file named ``.gz`` and exited 0, and every loader
    that reads a file by its name (``zcat``, DuckDB ``read_json``, pandas, Spark) failed on it,
    "not in gzip format": the night's results unreadable where they were looked for. Refused
    now, exit 2 in one line naming the flag and what to give, before anything is sent."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "r.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, str(manifest))
        args[args.index(flag) + 1] = str(tmp_path / name)
        with anyio.fail_after(60):
            result = await anyio.run_process(args, check=False, env=ENV)
        assert svc.store.image_count == 0
    err = result.stderr.decode()
    assert result.returncode == 2, err[-400:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{flag} {tmp_path / name}" in err and "compressed" in err, err
    assert not (tmp_path / name).exists()


async def test_the_library_refuses_an_output_named_as_a_compressed_file(tmp_path: Path) -> None:
    async with running_service(ServiceConfig()) as svc:
        with anyio.fail_after(60), pytest.raises(ConfigError, match="compressed"):
            await run_pipeline(
                [write_csv(tmp_path / "m.csv", 5)],
                client=client_config(svc.url),
                out=tmp_path / "r.jsonl.gz",
                rejects=tmp_path / "rej.jsonl",
            )
        assert svc.store.image_count == 0
    assert not (tmp_path / "r.jsonl.gz").exists()


#: An older build, which took an output named as a compressed file (see the test below).
OLDER_BUILD = """
import fashiontag_pipeline.engine.outnames as outnames
outnames.COMPRESSED_SUFFIXES = frozenset()
"""


async def test_a_run_of_an_older_build_into_a_gz_name_is_finished_as_the_refusal_says(
    tmp_path: Path,
) -> None:
    """A run of the build before 17ad803, ``--out results.jsonl.gz``, was killed; the same
    command of this build is refused (exit 2), saying to give a name without ``.gz``. Done so
    (``mv``, ``--out results.jsonl``), the run found no state beside the new name
    (``results.jsonl.state``), started over and tagged (and billed) every row again; its
    state, ``results.jsonl.gz.state``, was never named. The refusal names it now, and the
    flags that finish that run: followed, every row is tagged once."""
    import os

    from .helpers import assert_exactly_once, ids_of, job_marks, kill_when

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(OLDER_BUILD)
    older = {**ENV, "PYTHONPATH": os.pathsep.join([str(hook), ENV.get("PYTHONPATH", "")])}
    n = 4000
    manifest = write_csv(tmp_path / "m.csv", n)
    gz = tmp_path / "results.jsonl.gz"
    state = tmp_path / "results.jsonl.gz.state"
    async with running_service(ServiceConfig(rate=3000)) as svc:
        args = run_args(svc.url, gz, str(manifest), "--rotate-min-images", "500")
        del args[args.index("--rejects") : args.index("--rejects") + 2]  # (the default's)
        proc = await anyio.open_process(args, env=older)
        await kill_when(proc, lambda: job_marks(state)[1] > 0)
        with anyio.fail_after(60):
            refused = await anyio.run_process(args, check=False, env=ENV)
        err = refused.stderr.decode()
        assert refused.returncode == 2 and "compressed" in err, err[-600:]
        assert f"--state {state}" in err, err
        # As it says: the file renamed, the flags it names.
        hint = err[err.index("mv ") :].split(";")[0].split(", then ")
        _, source, target = hint[0].split()
        os.rename(source, target)
        flags = hint[1].split()[hint[1].split().index("--out") :]
        again = run_args(svc.url, Path(target), str(manifest))
        del again[again.index("--out") : again.index("--out") + 4]
        with anyio.fail_after(60):
            resumed = await anyio.run_process([*again, *flags], check=False, env=ENV)
        assert resumed.returncode == 0, resumed.stderr.decode()[-600:]
        billed = svc.store.image_count
    assert_exactly_once(Path(target), tmp_path / "results.jsonl.rejects.jsonl", ids_of(n))
    assert billed == n, f"{billed - n} images billed twice"
