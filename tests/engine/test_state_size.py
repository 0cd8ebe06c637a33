"""The SQLite state file gives back the space a run freed.

Chunk bodies are deleted once their task is read, so a run's state file peaked at its
largest and kept that size: 81% free pages after a 2M-row run (265 MB kept), ~1.3 GB at 10M
rows. When its run completes, what a completed run no longer needs (its ids, chunk bodies
left) is deleted and the file rebuilt from what remains.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.run import default_state_path
from fashiontag_pipeline.engine.state.schema import SCHEMA
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, ids_of, write_csv

FAST = EngineConfig(
    poll_min=0.02,
    poll_max=0.2,
    linger_seconds=0.2,
    fsync_seconds=10.0,
    rotate_images=1000,
    rotate_min_images=1000,
)


def pages(state: Path) -> tuple[int, int, int]:
    """(auto_vacuum, free pages, pages) of a closed state file."""
    db = sqlite3.connect(state)
    try:
        (mode,) = db.execute("PRAGMA auto_vacuum").fetchone()
        (free,) = db.execute("PRAGMA freelist_count").fetchone()
        (total,) = db.execute("PRAGMA page_count").fetchone()
        return int(mode), int(free), int(total)
    finally:
        db.close()


async def _run(tmp_path: Path, n: int) -> Path:
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [manifest], client=client_config(svc.url), out=out, rejects=rej, engine=FAST
        )
    assert summary.complete
    assert_exactly_once(out, rej, ids_of(n))
    return default_state_path(out)


async def test_a_completed_runs_state_file_keeps_few_free_pages(tmp_path: Path) -> None:
    state = await _run(tmp_path, 6000)
    _, free, total = pages(state)
    assert free <= max(4, total // 20), (free, total)
    assert state.stat().st_size < 200_000  # (6,000 ids alone are ~150 KB)


async def test_a_state_file_made_by_an_earlier_version_still_works(tmp_path: Path) -> None:
    """A state file of an earlier version (made with no auto_vacuum, as this one makes them)
    is used as it is."""
    out = tmp_path / "out.jsonl"
    old = sqlite3.connect(default_state_path(out), isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.executescript(SCHEMA)
    old.close()
    state = await _run(tmp_path, 3000)
    mode, _, _ = pages(state)
    assert mode == 0
