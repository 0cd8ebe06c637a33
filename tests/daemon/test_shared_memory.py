"""A daemon on a shared PostgreSQL lives for weeks and opens a connection (and a state schema)
per manifest: the C heap it leaves free must go back to the system, not pile up in its RSS."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline._config import ClientConfig
from fashiontag_pipeline.daemon.config import DaemonConfig
from fashiontag_pipeline.daemon.runner import Daemon
from fashiontag_pipeline.engine import EngineConfig
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import drop_atomic, write_manifest


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None)
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "gnu_get_libc_version") else None


LIBC = _glibc()

pytestmark = pytest.mark.skipif(LIBC is None, reason="glibc's malloc_trim (Linux)")


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_a_shared_daemon_gives_the_free_heap_back_after_each_manifest(
    tmp_path: Path, postgres_url: str
) -> None:
    """A soak of ``--state postgresql://... --lease 2`` grew ~30 KB of RSS per manifest, still
    rising after 1,350 small ones, while Python's allocations and glibc's memory in use stayed
    flat: what grew was the heap glibc held free (what each manifest's connection and state
    schema allocated in C, from worker threads, freed but never given back). Here, once 60
    manifests are settled, giving the free heap back (``malloc_trim(0)``) must find little
    left to give: the daemon gives it back itself after each settled manifest."""
    assert LIBC is not None
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    count = 60
    async with running_service(ServiceConfig()) as svc:
        config = DaemonConfig(
            inbox=str(inbox),
            outbox=str(tmp_path / "outbox"),
            state=postgres_url,
            listen="",
            settle=0.05,
            scan_interval=0.05,
            max_active=8,
            lease=2.0,
        )
        daemon = Daemon(
            config,
            client=ClientConfig(base_url=svc.url),
            engine=EngineConfig(linger_seconds=0.05),
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(daemon.run)
            with anyio.fail_after(30):
                await daemon.started.wait()
                for n in range(count):
                    ids = [f"p{i}" for i in range(1 + n % 50)]
                    drop_atomic(inbox, f"m{n}.csv", write_manifest(Path(), ids, url_tag=f"{n}-"))
                outbox = tmp_path / "outbox"
                while len(list(outbox.glob("*/summary.json"))) < count:
                    await anyio.sleep(0.05)
            await anyio.sleep(1.0)  # (each settled manifest's state is dropped after its summary)
            before = _rss_kib()
            LIBC.malloc_trim(0)
            held_free = before - _rss_kib()
            daemon.stop()
    assert held_free < 6 * 1024, f"the heap held {held_free} KiB free after {count} manifests"
