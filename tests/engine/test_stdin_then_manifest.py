"""The stdin digest of a run that read stdin and then another manifest (``run - later.csv``)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, ids_of, run_args
from .test_nothing_lost import results_appear, write_night


@pytest.mark.parametrize("how", ["urls-changed", "shorter"])
async def test_resume_of_stdin_then_a_file_refuses_other_rows_on_stdin(
    tmp_path: Path, how: str
) -> None:
    """``run - later.csv`` stopped while it read later.csv: its V is in later.csv, past the
    position of the stdin digest. A resume fed tonight's dump on stdin (the same ids, other
    URLs; or fewer rows) was not checked against the digest at all: exit 0, last night's
    results kept, tonight's images never tagged. It is refused (exit 2, nothing sent), and
    the same rows again resume."""
    out = tmp_path / "results.jsonl"
    monday = write_night(tmp_path / "mon.csv", 300, "s")
    later = write_night(tmp_path / "later.csv", 30000, "l")
    async with running_service(ServiceConfig(rate=4000.0)) as svc:
        args = run_args(svc.url, out, "-", str(later))
        proc = await anyio.open_process(
            args, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
        )
        assert proc.stdin is not None
        await proc.stdin.send(monday.read_bytes())
        await proc.stdin.aclose()
        await results_appear(out)
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(15):
            assert await proc.wait() == 130
        await proc.aclose()

        data = monday.read_bytes()
        if how == "urls-changed":
            other_rows = data.replace(b".jpg", b".png")
        else:
            other_rows = b"".join(data.splitlines(keepends=True)[:101])
        other = tmp_path / "tue.csv"
        other.write_bytes(other_rows)
        tasks = len(svc.store.tasks)
        with other.open("rb") as stdin:
            refused = await anyio.run_process(
                [*args, "--resume"], stdin=stdin, check=False, env=ENV
            )
        message = refused.stderr.decode()
        assert refused.returncode == 2, message
        assert "stdin does not carry the rows" in message, message
        assert len(svc.store.tasks) == tasks

        with monday.open("rb") as stdin:
            resumed = await anyio.run_process(
                [*args, "--resume"], stdin=stdin, check=False, env=ENV
            )
        assert resumed.returncode == 0, resumed.stderr.decode()
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(300, "s") | ids_of(30000, "l"))
