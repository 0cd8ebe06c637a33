"""Promise 3: results that expire partway through reading a task are reported as rejects.

The service's clock is injected: once the engine has read the first page of a task, the clock
jumps past ``result_ttl``, so every later page of that task answers 410 (results expired). Every
id must still end up in exactly one line: a result for the pages read, an ``expired`` reject
for the rest.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import RecordingClient, assert_exactly_once, client_config, write_csv

RESULT_TTL = 60.0


class _Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class _ExpireAfterFirstPage(RecordingClient):
    """Reads the first page of a task, then moves the service clock past the results' TTL."""

    def __init__(self, clock: _Clock, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock = clock

    async def task_results_raw(self, task_id: str, **kwargs: Any) -> bytes:
        raw = await super().task_results_raw(task_id, **kwargs)
        if kwargs.get("offset") == 0:
            self.clock.offset += RESULT_TTL * 10
        return raw


@pytest.mark.parametrize("pages", [1, 16])
async def test_results_expiring_mid_read_become_expired_rejects(tmp_path: Path, pages: int) -> None:
    n = 1200
    manifest = write_csv(
        tmp_path / "m.csv",
        n,
        # one row only the server refuses (URL > 8,192 characters): it stays a
        # server-validation reject, never an expired one
        extra=["longid," + "https://x/" + "a" * 9000 + ".jpg,acme,TOP"],
    )
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    clock = _Clock()
    config = ServiceConfig(result_ttl=RESULT_TTL, task_ttl=3600.0, clock=clock)
    async with running_service(config) as svc:
        client = _ExpireAfterFirstPage(clock, config=client_config(svc.url))
        async with client:
            summary = await run_pipeline(
                [manifest],
                client=client,
                out=out,
                rejects=rej,
                engine=EngineConfig(
                    max_page_concurrency=pages, poll_min=0.02, poll_max=0.2, linger_seconds=0.2
                ),
            )
    expected = {f"p{i}" for i in range(n)} | {"longid"}
    outcomes = assert_exactly_once(out, rej, expected)
    expired = [r for r in outcomes.rejects if r["stage"] == "expired"]
    # partway: the first page was written, the rest of the task is reported, nothing silent
    assert 0 < len(outcomes.results) < n
    assert len(outcomes.results) + len(expired) == n
    assert all(r["reason"] == "results expired before they were read" for r in expired)
    assert all(r["source"] == str(manifest) and r["line"] >= 2 for r in expired)
    stages = {r["id"]: r["stage"] for r in outcomes.rejects}
    assert stages["longid"] == "server-validation"
    assert summary.rejected == len(outcomes.rejects)
    client.assert_limits()
