"""``fashiontag daemon`` killed (SIGKILL) inside an atomic write, between its temp file and
the rename, then restarted (found by the wide daemon fuzz under load, seeds 15, 99, 104, 142
of 1-150): each write has a temp name of its own (two daemons of a shared state may write one
summary at once), so the killed write's temp file was never taken again, and stayed in the
consumer's outbox folder (``.summary.json.<pid>-<random>.tmp``) or in ``INBOX/.work``.

The point is reached with a ``sitecustomize`` hook loaded by the first daemon only, never by
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
    """
)


@pytest.mark.parametrize("prefix", [".summary.json.", "..summary-"], ids=["summary", "note"])
async def test_a_kill_inside_an_atomic_write_leaves_no_temp_file(
    tmp_path: Path, prefix: str
) -> None:
    """Killed as the summary (or its note in ``.work``) was renamed into place; the restart
    settles the manifest, and neither the outbox folder nor ``.work`` keeps the temp file."""
    ids = [f"s{i}" for i in range(50)]
    data = write_manifest(Path(), ids)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    pythonpath = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": pythonpath, "HOOK_KILL_AT_RENAME": prefix}
    async with running_service(ServiceConfig()) as svc:
        a = DaemonProcess(tmp_path, svc.url, env=env).start()
        b: DaemonProcess | None = None
        try:
            await a.wait_ready_endpoint()
            drop_atomic(a.inbox, "m.csv", data)
            assert await a.wait_exit(timeout=30) == -9  # killed at the rename
            b = DaemonProcess(tmp_path, svc.url, port=a.port).start()
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
