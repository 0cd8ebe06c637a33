"""The daemon through a service with habits ours does not have (:mod:`tests.engine.dialects`)."""

from __future__ import annotations

from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service
from tests.engine.dialects import Dialect, DialectFront, dumps

from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest


async def test_pages_answered_203_by_a_front_that_rewrites_json(tmp_path: Path) -> None:
    """Every read answered 203 (a transforming proxy's: RFC 9110) with JSON of another writer
    (a BOM, keys reversed and given twice, unknown keys, integers as ``1.0e3``, pretty), gzip
    chunked at odd bytes, ``Connection: close``, creates answered 201. The daemon took each
    page for a refusal, then for a page with no result, and sent its rows again: billed twice
    within seconds, and again. Each row is now billed once and written once."""
    dialect = Dialect(
        writer=lambda data: (
            b"\xef\xbb\xbf"
            + dumps(data, reverse=True, extra=True, ints="exp", indent=2, twice=True)
            + b"\n"
        ),
        framing="chunked",
        encoding="gzip",
        close=True,
        statuses={200: 203, 202: 201},
        date="rfc850",
    )
    sizes = {"a": 300, "b": 150}
    async with running_service(ServiceConfig()) as svc:
        front = DialectFront(svc.url, dialect)
        async with front.running():
            daemon = DaemonProcess(tmp_path, front.url).start()
            try:
                for stem, n in sizes.items():
                    ids = [f"{stem}{i}" for i in range(n)]
                    drop_atomic(daemon.inbox, f"{stem}.csv", write_manifest(Path(), ids))
                # (Rows sent again fail the test as they are, not at a summary's deadline: a
                # daemon that sends them again never writes one. The front is slow by design,
                # gzip and chunks of a few bytes: few rows, two tasks' pages, as little as
                # a loaded CI machine gets through well within the deadline.)
                done = [daemon.outbox / stem / "summary.json" for stem in sizes]
                with anyio.fail_after(100):
                    while not all(path.exists() for path in done):
                        daemon.check_alive()
                        billed = sum(len(task.ids) for task in svc.store.tasks.values())
                        assert billed <= sum(sizes.values()), f"{billed} rows billed: sent again"
                        await anyio.sleep(0.05)
                summaries = {stem: await daemon.wait_summary(stem) for stem in sizes}
                assert await daemon.stop() == 0
            finally:
                daemon.ensure_dead()
        billed = sum(len(task.ids) for task in svc.store.tasks.values())
    for stem, n in sizes.items():
        assert summaries[stem]["status"] == "done" and summaries[stem]["tagged"] == n
        ids = [r["id"] for r in read_lines(daemon.outbox / stem / "results.jsonl")]
        assert sorted(ids) == sorted(f"{stem}{i}" for i in range(n))
    assert billed == sum(sizes.values())
