"""The paths a nightly job's runner really gives ``fashiontag run`` for the files it writes
whole or as databases (``--summary``, ``--state``, ``--reuse``), and their folders (found by
a hunt; each test failed before its fix)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, run_args, write_csv


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
