"""The daemon's stderr, as a log shipper parses it (DESIGN 6:
"one JSON object per line on stderr ... keys never appear")."""

from __future__ import annotations

import json
from pathlib import Path

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, write_manifest

KEY = "sk-HUNT-CANARY-d-single"
BULK_KEY = "sk-HUNT-CANARY-d-bulk"
SERVICE = ServiceConfig(api_keys=(KEY,), bulk_api_keys=(BULK_KEY,))


async def test_every_stderr_line_is_json_even_with_keys_given_as_flags(tmp_path: Path) -> None:
    """Keys may be given as flags (README: the CLI warns that they are visible in ps). The
    daemon printed that warning as plain text on stderr, before its JSON logs: a log shipper
    reading one JSON object per line (the contract, --log-format json) got two lines it could
    not parse at every start of a daemon configured that way."""
    async with running_service(SERVICE) as svc:
        daemon = DaemonProcess(
            tmp_path, svc.url, extra=["--api-key", KEY, "--bulk-api-key", BULK_KEY]
        ).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "cat.csv", write_manifest(tmp_path / "x", ["a", "b"]))
            summary = await daemon.wait_summary("cat")
            assert summary["status"] == "done" and summary["tagged"] == 2
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    raw = daemon.stderr_path.read_text()
    assert KEY not in raw and BULK_KEY not in raw
    assert daemon.stdout_path.read_bytes() == b""
    bad = []
    for line in raw.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if not isinstance(doc, dict) or not {"ts", "level", "event"} <= doc.keys():
            bad.append(line)
    assert not bad, f"stderr lines that are not JSON log objects: {bad}"
    # the warning itself is kept, as a log record
    assert any("visible to other users" in line for line in raw.splitlines())
