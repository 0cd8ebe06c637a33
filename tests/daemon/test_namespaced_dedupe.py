"""The daemon's dedupe is keyed on the ids its rows are sent with (``JOB/ID``), not on the
manifest's ids: the same id in two manifests is two rows (each tagged, each billed once),
and an id repeated inside one manifest is one row (its later rows ``duplicate id`` rejects).
Its rows take another way than ``run``'s (a list without the intake's columns, not
:class:`~fashiontag_pipeline.engine.state.KeyedColumns`); this pins that a change there keeps
both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

IDS = [f"p{i}" for i in range(300)]


def _with_repeats(tag: str) -> bytes:
    """The ids ``IDS``, then ``p7`` and ``p250`` again (a manifest's own repeats)."""
    return write_manifest(Path(), [*IDS, "p7", "p250"], url_tag=tag)


async def test_two_manifests_ids_are_apart_and_each_ones_repeats_deduped(tmp_path: Path) -> None:
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "one.csv", _with_repeats("a"))
            drop_atomic(daemon.inbox, "two.csv", _with_repeats("b"))
            summaries = [await daemon.wait_summary(stem) for stem in ("one", "two")]
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        sent = [i for task in svc.store.tasks.values() for i in task.ids]
    for stem, summary in zip(("one", "two"), summaries, strict=True):
        results = read_lines(daemon.outbox / stem / "results.jsonl")
        rejects = read_lines(daemon.outbox / stem / "rejects.jsonl")
        assert (summary["status"], summary["rejected"]) == ("done", 2), summary
        assert sorted(r["id"] for r in results) == sorted(IDS), stem
        assert sorted((r["id"], r["line"]) for r in rejects) == [("p250", 303), ("p7", 302)]
        assert all(r["reason"].startswith("duplicate id") for r in rejects), rejects
    # Each manifest's ids sent once each, under ids of its own job: 600 rows billed.
    assert len(sent) == 2 * len(IDS) == len(set(sent)), len(sent)
