"""``fashiontag daemon`` killed (SIGKILL) inside a manifest's last writes, then restarted
(found by the wide daemon fuzz under load, seeds 6, 15, 94, 99, 104, 142 of 1-150):

* inside an atomic write, between its temp file and the rename: each write has a temp name
  of its own (two daemons of a shared state may write one summary at once), so the killed
  write's temp file was never taken again, and stayed in the consumer's outbox folder
  (``.summary.json.<pid>-<random>.tmp``) or in ``INBOX/.work``;
* after the manifest was recorded settled (and moved), before its summary's note in
  ``INBOX/.work`` was removed: the note stayed there for good.

The points are reached with a ``sitecustomize`` hook loaded by the first daemon only, never by
timing."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

#: ``HOOK_KILL_AT_RENAME=PREFIX``: SIGKILL when an atomic write renames its temp file whose
#: name starts with PREFIX (written whole and fsynced, not yet renamed).
HOOK = textwrap.dedent(
    """
    import os, signal
    prefix = os.environ.get("HOOK_KILL_AT_RENAME")
    if prefix:
        import fashiontag_pipeline.daemon._files as files
        class _Os:
            def __getattr__(self, name):
                return getattr(os, name)
            def rename(self, src, dst, **kw):
                name = os.path.basename(src)
                if name.startswith(prefix) and name.endswith(".tmp"):
                    os.kill(os.getpid(), signal.SIGKILL)
                return os.rename(src, dst, **kw)
        files.os = _Os()
    if os.environ.get("HOOK_KILL_AT_FORGET"):
        import fashiontag_pipeline.daemon.runner as runner
        def forget_never(work, claim):
            os.kill(os.getpid(), signal.SIGKILL)
        runner.forget = forget_never
    """
)


KILLS = {
    "summary": {"HOOK_KILL_AT_RENAME": ".summary.json."},
    "note": {"HOOK_KILL_AT_RENAME": "..summary-"},
    "forget": {"HOOK_KILL_AT_FORGET": "1"},
}


@pytest.mark.parametrize("kill", KILLS)
async def test_a_kill_in_the_last_writes_leaves_no_temp_file_nor_note(
    tmp_path: Path, kill: str
) -> None:
    """Killed as the summary (or its note in ``.work``) was renamed into place, or once the
    manifest was settled, before its note was removed; the restart settles the manifest (or
    finds it settled), and neither the outbox folder nor ``.work`` keeps a temp file or the
    note."""
    ids = [f"s{i}" for i in range(50)]
    data = write_manifest(Path(), ids)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    pythonpath = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": pythonpath, **KILLS[kill]}
    async with running_service(ServiceConfig()) as svc:
        a = DaemonProcess(tmp_path, svc.url, env=env).start()
        b: DaemonProcess | None = None
        try:
            await a.wait_ready_endpoint()
            drop_atomic(a.inbox, "m.csv", data)
            assert await a.wait_exit(timeout=30) == -9  # killed at the point
            b = DaemonProcess(tmp_path, svc.url, port=a.port).start()
            await b.wait_ready_endpoint()  # (the start-up's recovery is over)
            with anyio.fail_after(30):
                while not (b.inbox / "done" / "m.csv").exists():
                    b.check_alive()
                    await anyio.sleep(0.05)
            assert await b.stop() == 0
        finally:
            a.ensure_dead()
            if b is not None:
                b.ensure_dead()
    folder = tmp_path / "outbox" / "m"
    assert sorted(p.name for p in folder.iterdir()) == [
        ".claim",
        "rejects.jsonl",
        "results.jsonl",
        "summary.json",
    ]
    assert sorted(r["id"] for r in read_lines(folder / "results.jsonl")) == sorted(ids)
    assert sorted(p.name for p in (tmp_path / "inbox" / ".work").iterdir()) == []
