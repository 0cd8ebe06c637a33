"""Pagers: pages fetched together are committed together, in offset order, each exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.state import Journal
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, read_outcomes, write_csv


async def test_concurrent_pages_share_commits_in_offset_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, per_task = 3000, 1000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    commits: list[tuple[str, int, int, list[str]]] = []  # task, rows, next_offset, ids
    original = Journal.commit

    async def commit(self: Journal, **kwargs: Any) -> tuple[int, int]:
        page = kwargs.get("page")
        if page is not None:
            task_id, rows = page
            offsets = [p[0] for sql, p in kwargs.get("ops", ()) if "next_offset=?" in sql]
            assert len(offsets) == 1
            commits.append((task_id, len(rows), offsets[0], [r.id for r in rows]))
        return await original(self, **kwargs)

    monkeypatch.setattr(Journal, "commit", commit)
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=out,
            rejects=rej,
            engine=EngineConfig(
                rotate_images=per_task, rotate_min_images=per_task, poll_min=0.02, poll_max=0.2
            ),
        )
    assert summary.complete and summary.pages == n // 100
    outcomes = assert_exactly_once(out, rej, {f"p{i}" for i in range(n)})

    # Per task: commits move next_offset forward by exactly the rows they hold, up to the
    # task's size; the results file holds the task's lines in that order.
    by_task: dict[str, list[tuple[int, int, list[str]]]] = {}
    for task_id, rows, offset, ids in commits:
        by_task.setdefault(task_id, []).append((rows, offset, ids))
    assert len(by_task) == n // per_task
    for task_id, seq in by_task.items():
        done = 0
        for rows, offset, _ in seq:
            assert offset == done + rows
            done = offset
        assert done == per_task
        written = [r["id"] for r in outcomes.results if r["taskId"] == task_id]
        assert written == [i for _, _, ids in seq for i in ids]
    # Ten pages per task, fetched concurrently: fewer commits than pages.
    assert len(commits) < summary.pages
    assert read_outcomes(out, rej).rejects == []
