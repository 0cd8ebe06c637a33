"""``fashiontag run dump/*.csv`` on a dump split into more files than the process may hold
open (Spark, Hive and most exporters write a part file per partition: 2,000 is common).

Found by a hunt: every manifest is opened before the first is read, so a dump of more part
files than the soft limit of open files (1,024 on most systems) stopped at once with exit 1
and "Too many open files", whose hint ("the same command resumes once this is fixed") named
no fix. The run now raises its soft limit as far as the hard limit lets it (as the Go runtime
does for every program), and past that says how many files it needs, the limit, and what to
do.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args, write_csv

pytestmark = pytest.mark.skipif(os.name != "posix", reason="resource limits")

FILES = 150
ROWS = 2


def _parts(folder: Path) -> list[str]:
    folder.mkdir()
    return [
        str(write_csv(folder / f"part-{k:05d}.csv", ROWS, start=k * ROWS)) for k in range(FILES)
    ]


def _run(args: list[str], soft: int, hard: int) -> subprocess.CompletedProcess[str]:
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return subprocess.run(
        args, env=ENV, capture_output=True, text=True, timeout=60, preexec_fn=limited
    )


async def test_a_dump_of_more_part_files_than_the_soft_limit_is_tagged(tmp_path: Path) -> None:
    parts = _parts(tmp_path / "dump")
    out = tmp_path / "out.jsonl"
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4 * FILES:
        pytest.skip(f"the hard limit of open files here is {hard}")
    async with running_service(ServiceConfig()) as svc:
        done = await anyio.to_thread.run_sync(_run, [*run_args(svc.url, out), *parts], 64, hard)
    assert done.returncode == 0, done.stderr
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(FILES * ROWS)})


async def test_past_the_hard_limit_the_run_says_what_to_do(tmp_path: Path) -> None:
    parts = _parts(tmp_path / "dump")
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        done = await anyio.to_thread.run_sync(_run, [*run_args(svc.url, out), *parts], 64, 64)
        assert svc.store.image_count == 0  # refused before a row was sent
    assert done.returncode == 1, done.stderr
    err = done.stderr
    assert f"{FILES} manifests" in err and "ulimit -n" in err and "64" in err, err
    assert "hard limit to" in err, err  # (ulimit -n alone cannot go past it)
    assert "Traceback" not in err, err
