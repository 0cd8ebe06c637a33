"""Write-ahead: when a POST or PUT leaves, its chunk is already committed to the state as
pending with its rows and the task it goes to (the creating task's token, or the task
appended to)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, write_csv


async def test_each_write_finds_its_chunk_committed_with_its_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, per_task = 5000, 2000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej, state = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "s.state"
    seen: list[tuple[str, str, int]] = []  # (create | append, token or task, chunks found)

    def pending(column: str, value: str) -> int:
        # Another connection: only what the engine committed is visible.
        with sqlite3.connect(state) as db:
            (found,) = db.execute(
                f"SELECT count(*) FROM chunks c JOIN chunk_bodies b USING (chunk_id)"
                f" WHERE c.state = 'pending' AND c.{column} = ?",
                (value,),
            ).fetchone()
        return int(found)

    create, append = TaggerClient.create_task, TaggerClient.append_to_task

    async def creating(self: TaggerClient, requests: Any, **kwargs: Any) -> Any:
        token = kwargs["description"].rsplit(" ", 1)[1]
        seen.append(("create", token, pending("token", token)))
        return await create(self, requests, **kwargs)

    async def appending(self: TaggerClient, task_id: str, requests: Any, **kwargs: Any) -> Any:
        seen.append(("append", task_id, pending("task_id", task_id)))
        return await append(self, task_id, requests, **kwargs)

    monkeypatch.setattr(TaggerClient, "create_task", creating)
    monkeypatch.setattr(TaggerClient, "append_to_task", appending)
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=out,
            rejects=rej,
            state=state,
            engine=EngineConfig(rotate_images=per_task, rotate_min_images=per_task),
        )
    assert summary.complete
    assert_exactly_once(out, rej, {f"p{i}" for i in range(n)})
    kinds = [kind for kind, _, _ in seen]
    assert kinds.count("create") >= 3 and "append" in kinds  # both kinds of write were seen
    # Every request found its chunk (at least; chunks to one task may be in flight together).
    assert all(found >= 1 for _, _, found in seen), seen
