"""``fashiontag run`` (or ``daemon``) started in a current directory that no longer exists: a
shell left in a release folder a deploy pruned, or in a scratch folder a tmp cleaner removed,
a job runner's workspace wiped under a waiting step.

Found by a hunt: with the outputs at their defaults (beside the working directory) the run
died with a traceback (``FileNotFoundError`` from ``Path.absolute``); with every path absolute
it made its state file, then stopped with exit 1 and "FileNotFoundError: [Errno 2] No such
file or directory (what was committed is kept: the same command resumes once this is fixed)",
naming nothing (the validator resolves a manifest's relative image paths against the
directory); the daemon stopped with the same words. Each is refused now (exit 2) before
anything is made or sent, saying the current directory was removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, write_csv


def _in_removed_folder(folder: Path) -> Callable[[], None]:
    """A child's start in ``folder``, removed once the child is in it."""

    def enter() -> None:
        os.chdir(folder)
        os.rmdir(folder)

    return enter


def _fashiontag(args: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    folder.mkdir()
    return subprocess.run(
        [sys.executable, "-m", "fashiontag_pipeline", *args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_in_removed_folder(folder),
    )


def _said_so(done: subprocess.CompletedProcess[str]) -> None:
    err = done.stderr
    assert "Traceback" not in err, err[-1500:]
    assert done.returncode == 2, err[-600:]
    assert "current directory" in err and "removed" in err, err


async def test_a_run_in_a_removed_working_folder_is_refused_before_anything(
    tmp_path: Path,
) -> None:
    manifest = write_csv(tmp_path / "m.csv", 10)
    summary = tmp_path / "reports" / "summary.json"
    outputs = tmp_path / "outputs"
    async with running_service(ServiceConfig()) as svc:
        base = ["run", "--base-url", svc.url, str(manifest), "--no-progress"]
        defaults = await anyio.to_thread.run_sync(_fashiontag, base, tmp_path / "gone")
        absolute = [*base, "--out", str(outputs / "out.jsonl"), "--summary", str(summary)]
        given = await anyio.to_thread.run_sync(_fashiontag, absolute, tmp_path / "gone2")
        assert svc.store.image_count == 0
    _said_so(defaults)
    _said_so(given)
    assert not outputs.exists(), sorted(p.name for p in outputs.iterdir())
    written = json.loads(summary.read_text())
    assert written["complete"] is False and "current directory" in written["error"], written


def test_a_daemon_in_a_removed_working_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    args = ["daemon", "--inbox", str(tmp_path / "inbox"), "--outbox", str(tmp_path / "outbox")]
    done = _fashiontag([*args, "--listen", "", "--base-url", "http://127.0.0.1:9"], tmp_path / "x")
    _said_so(done)
    assert not (tmp_path / "outbox").exists()
