"""A real ``fashiontag daemon`` behind a front end whose answers cannot be held or read: results
pages whose body never ends, a gzip bomb, a task list nested 100,000 deep (the daemon's side of
``tests/engine/test_huge_answers.py``). The daemon must not die of them (a MemoryError, the OOM
killer, a RecursionError: a supervisor's restart loop that meets them again): it refuses each,
asks again, finishes the manifest, its peak RSS within the budget, and drains on SIGTERM."""

from __future__ import annotations

import resource
import signal
import sys
from pathlib import Path

import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.proxy import MisbehavingProxy, Misbehaviour
from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc VmHWM, prlimit")


def _peak_rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


async def test_the_daemon_survives_answers_too_big_or_too_deep(tmp_path: Path) -> None:
    ids = [f"p{i}" for i in range(2000)]
    rules = Misbehaviour(
        huge_ops={"results"}, huge_count=3, huge_bytes=None, deep_ops={"list"}, deep_count=2
    )
    proxy = MisbehavingProxy("", rules)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            daemon = DaemonProcess(tmp_path, proxy.url, extra=["--drain-timeout", "5"]).start()
            try:
                assert daemon.proc is not None
                # A safety net: a daemon that holds such an answer dies of it, not the machine.
                resource.prlimit(daemon.proc.pid, resource.RLIMIT_AS, (3 << 30, 3 << 30))
                await daemon.wait_ready_endpoint()
                drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
                summary = await daemon.wait_summary("m", timeout=30)
                assert summary["status"] == "done", summary
                # Each huge page is asked for again; the list is asked for as the tracker
                # polls, and a manifest done within a second may end before a second list.
                assert proxy.huge_answers == 3 and proxy.deep_answers >= 1
                assert _peak_rss_mib(daemon.proc.pid) < 190
                daemon.check_alive()
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait_exit(timeout=9) == 0, daemon.tail()
            finally:
                daemon.ensure_dead()
    results = read_lines(daemon.outbox / "m" / "results.jsonl")
    assert sorted(r["id"] for r in results) == sorted(ids)
    assert "max_answer_bytes" in daemon.stderr_path.read_text()
