"""Local image files read for the single endpoint by a run short of open files (``ulimit -n
64``: a container's or a systemd unit's ``LimitNOFILE``, a cron user's limits.conf).

Found by a hunt: with the single-mode requests holding the descriptors (``--single-concurrency
64``), the image files read next failed with EMFILE and each such row went to the rejects for
good, "local file unreadable (Too many open files)", the run "complete", exit 0, and the same
command did nothing more: 358 of 400 good images never tagged. A descriptor, the system's
file table or memory the process lacks for a moment says nothing of the image: the read is
tried again (under ``--give-up-after``, as a connection that could not be made is), and the
row is tagged once the requests in flight give their descriptors back.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import anyio
import pytest
from PIL import Image as PILImage

from fashiontag_pipeline._images import ImageFileShortage
from fashiontag_pipeline.engine.flow import FatalRunError, RetryBudget
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args

pytestmark = pytest.mark.skipif(os.name != "posix", reason="resource limits")

ROWS = 400
LIMIT = 64


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))  # (as bash's ulimit -n)

    return subprocess.run(
        args, env=ENV, capture_output=True, text=True, timeout=120, preexec_fn=limited
    )


async def test_local_images_read_short_of_descriptors_are_tagged_not_rejected(
    tmp_path: Path,
) -> None:
    picture = tmp_path / "shirt.png"
    PILImage.new("RGB", (64, 64), (200, 30, 30)).save(picture)
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\n" + "".join(f"f{i},{picture}\n" for i in range(ROWS)))
    out = tmp_path / "out.jsonl"
    args = [*run_args("x", out, str(manifest)), "--single-concurrency", str(LIMIT)]
    async with running_service(ServiceConfig()) as svc:
        args[args.index("--base-url") + 1] = svc.url
        done = await anyio.to_thread.run_sync(_run, args)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]
    outcomes = assert_exactly_once(out, out.with_suffix(".rej"), {f"f{i}" for i in range(ROWS)})
    short = [r for r in outcomes.rejects if "Too many open files" in r["reason"]]
    assert not short, f"{len(short)} good images rejected for the process's limit: {short[:2]}"
    assert not outcomes.rejects, outcomes.rejects[:3]


async def test_a_lasting_shortage_stops_the_run_saying_what_it_lacks() -> None:
    """Past ``--give-up-after`` the run stops (exit 1, its rows kept in the state) naming the
    process's limit, not "service unreachable"."""
    budget = RetryBudget(0.0)
    short = ImageFileShortage("local file unreadable (Too many open files): /img/1.png")
    await budget.failed(short, "single-mode image read")  # (the first: a warning)
    with pytest.raises(FatalRunError) as stopped:
        await budget.failed(short, "single-mode image read")
    message = str(stopped.value)
    assert "Too many open files" in message and "ulimit -n" in message, message
    assert "service" not in message, message
