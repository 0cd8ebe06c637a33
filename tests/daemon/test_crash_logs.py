"""The daemon's log read as a monitoring system reads it (one JSON object per line, always),
when the daemon stops on an error it has no words for: a bug, or the process out of memory
(a ``ulimit -v``, a ``LimitAS=`` of its unit).

Found by a hunt: the daemon logged "daemon stopped on an error" as a JSON line, then let the
exception out: ~170 lines of Python traceback on stderr (a log shipper's parse errors, a
journal's lines of no level), never redacted. The traceback now travels in that line's
``exc`` field, exit 1 as before (its supervisor restarts it).

The error is raised, once, in the real process through a small bootstrap, where a real
``MemoryError`` came under ``ulimit -v`` (a dropped manifest's hashing reads it in blocks).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import BootedDaemon, drop_atomic, write_manifest

_BOOT = r"""
from pathlib import Path

FLAG = Path(os.environ["FT_FLAG"])
ERROR = {"MemoryError": MemoryError, "RuntimeError": RuntimeError}[os.environ["FT_ERROR"]]

from fashiontag_pipeline.daemon import inbox

real_hash_file = inbox.hash_file


def hash_file(path, *args, **kwargs):
    if FLAG.exists():
        FLAG.unlink()
        raise ERROR("injected")
    return real_hash_file(path, *args, **kwargs)


inbox.hash_file = hash_file
"""


@pytest.mark.parametrize("error", ["MemoryError", "RuntimeError"])
async def test_a_crash_is_one_json_line_with_its_traceback(tmp_path: Path, error: str) -> None:
    flag = tmp_path / "fault.flag"
    flag.touch()
    ids = [f"c{i}" for i in range(50)]
    async with running_service(ServiceConfig()) as svc:
        env = {"FT_FLAG": str(flag), "FT_ERROR": error}
        daemon = BootedDaemon(tmp_path, svc.url, env=env, boot=_BOOT).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "cat.csv", write_manifest(Path("cat.csv"), ids))
            code = await daemon.wait_exit()
            assert not flag.exists(), "the fault did not fire"
            assert code == 1, daemon.tail()
            text = daemon.stderr_path.read_text()
            not_json = []
            for line in text.splitlines():
                try:
                    json.loads(line)
                except ValueError:
                    not_json.append(line)
            assert not not_json, f"{len(not_json)} lines are not JSON: {not_json[:3]}"
            last = json.loads(text.splitlines()[-1])
            assert last["event"] == "daemon stopped on an error", last
            assert last["level"] == "error"
            assert error in last["error"] and "injected" in last["error"]
            assert "Traceback" in last["exc"] and "hash_file" in last["exc"], last
            # Restarted (its supervisor): the manifest is tagged, once.
            daemon.start()
            summary = await daemon.wait_summary("cat")
            assert summary["status"] == "done" and summary["tagged"] == len(ids), summary
            assert svc.store.image_count == len(ids)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
