"""Resource failures a nightly ``fashiontag run`` meets: the state file on a full disk.

``test_nothing_lost`` covers the results file that cannot grow (``RLIMIT_FSIZE``: EFBIG):
exit 1, the file named, and the same command finishes. Here the file that cannot grow is the
state (its WAL grows first on a run's first commits, before the results file holds much):
the run must stop with exit 1 and a line that says which file failed and what to do, never a
SQLite complaint about its own rollback; the same command with room again finishes exactly
once, nothing billed twice.
"""

from __future__ import annotations

import resource
import subprocess
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, ids_of, run_args, short_deadline, write_csv


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:  # in the child: writes past ``limit`` bytes fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("limit", [150_000, 350_000, 750_000])
async def test_a_state_file_that_cannot_grow_is_named_and_the_same_command_finishes(
    tmp_path: Path, limit: int
) -> None:
    """No file may pass ``limit`` bytes: the state's WAL reaches it first. Before, the line
    said ``OperationalError: disk I/O error`` (no file named: the results? the rejects? the
    state?) or, when SQLite had already rolled the failed transaction back itself, the
    journal's own ROLLBACK failed and hid the cause: ``OperationalError: cannot rollback - no
    transaction is active``."""
    n = 5000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "results.jsonl"
    state = Path(f"{out}.state")
    async with running_service(ServiceConfig()) as svc:
        # (A create on its way when the state filled up is looked for by the resume for the
        # request deadline after it was sent: short here.)
        args = run_args(svc.url, out, str(manifest), *short_deadline(tmp_path))
        full = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                args, env=ENV, capture_output=True, preexec_fn=_file_size_limit(limit)
            )
        )
        message = full.stderr.decode()
        assert full.returncode == 1, message
        # The state failed, not the results (at the lowest limit, before they were made).
        assert not out.exists() or out.stat().st_size < limit
        assert "Traceback" not in message
        assert "cannot rollback" not in message, message
        assert str(state) in message, message
        assert "the same command resumes" in message, message
        again = await anyio.run_process(args, check=False, env=ENV)
        assert again.returncode == 0, again.stderr.decode()
        billed = svc.store.image_count
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
    assert billed == n
