"""The daemon in a C locale with Python's UTF-8 mode off (``PYTHONUTF8=0``: an image or a unit
that sets it, ``LC_ALL=C`` kept from a build): the process reads every file name as ASCII, so
a manifest named in UTF-8 (``été.csv``) looks to it like a name that is not UTF-8.

Found by a hunt: the daemon set out to move such a file to ``failed/`` beside its reason, and
the reason's file name (``été.csv.error.json``) could not be written in ASCII: a
``UnicodeEncodeError`` stopped the daemon, and stopped it again at every start, before it
claimed any other manifest of the inbox. The file is fine, the process is not: it is left in
the inbox, said once, and tagged by a daemon started in a UTF-8 locale.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, write_manifest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="file names as bytes")

#: A C locale, Python's UTF-8 mode off: names are read as ASCII.
ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
#: A UTF-8 locale again.
UTF8_LOCALE = {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "PYTHONUTF8": "1"}

NAME = "été.csv"


async def test_a_utf8_name_in_an_ascii_locale_is_left_in_the_inbox_not_a_crash(
    tmp_path: Path,
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    accented = os.fsencode(str(inbox)) + b"/" + NAME.encode()
    with open(accented, "wb") as fh:
        fh.write(write_manifest(Path(NAME), ["a1", "a2"]))
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, env=ASCII_LOCALE).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "plain.csv", write_manifest(Path("plain.csv"), ["p1"]))
            summary = await daemon.wait_summary("plain")  # (alive: not stopped by the name)
            assert summary["status"] == "done"
            with anyio.fail_after(20):
                while "été" not in daemon.stderr_path.read_text(errors="replace"):
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            await anyio.sleep(1.0)  # several scans: said once, and still alive
            daemon.check_alive()
            said = [r for r in daemon.logs() if "été" in r["event"]]
            assert len(said) == 1, said
            assert said[0]["level"] == "error"
            assert "UTF-8" in said[0]["event"] and "PYTHONUTF8" in said[0]["event"], said
            assert os.path.exists(accented), "the manifest left the inbox"
            assert os.listdir(os.fsencode(str(daemon.inbox / "failed"))) == []
            assert await daemon.stop() == 0
            # Started in a UTF-8 locale: tagged.
            daemon.env = UTF8_LOCALE
            daemon.start()
            summary = await daemon.wait_summary("été")
            assert summary["status"] == "done" and summary["tagged"] == 2, summary
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
