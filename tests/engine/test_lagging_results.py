"""A results store that lags the task status: "done" is said, then the task's pages are short
for a while. The rows missing are read again for ``read_again_window`` seconds after the task
was seen done before they are sent (and billed) again, and that wait holds no page slot: the
other tasks' pages keep flowing.

Found so (each failing before its fix):

* a task whose pages came short waited out the window inside the page reader that read its
  last page, holding that reader's slot: with ``--page-concurrency 1`` no other task's page
  was read until the window had gone by (every task's reading serialized behind the wait).
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import msgspec
import pytest

from fashiontag_pipeline.engine import page_rows

from .helpers import TASKS_OF_1000, run_through
from .proxy import BULK, MisbehavingProxy, Misbehaviour


class PageClock(MisbehavingProxy):
    """The misbehaving proxy that notes when each task's first results page was asked for."""

    def __init__(self, rules: Misbehaviour) -> None:
        super().__init__("", rules)
        self.first_page_at: dict[str, float] = {}

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        if method == "GET" and task_id is not None and path != BULK and "/status" not in path:
            self.first_page_at.setdefault(task_id, time.monotonic())
        return super()._rewrite(method, path, task_id, status, payload)


async def test_a_task_waiting_for_missing_rows_holds_no_page_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three tasks of 1,000 rows, done at once, each with one row the service never returns,
    read with one page slot: each task's missing row is read again for the window (4 s here)
    after it was seen done, and meanwhile the other tasks' pages are read. Before, the wait
    held the slot of the reader that read the task's last page: the second task's first page
    was asked for 4 s after it was done, the third's 8 s."""
    monkeypatch.setattr(page_rows, "READ_AGAIN_WINDOW", 4.0)
    proxy = PageClock(Misbehaviour(never_returned={"p7", "p1007", "p2007"}))
    engine = msgspec.structs.replace(TASKS_OF_1000, max_page_concurrency=1, max_sends=1)
    with anyio.fail_after(60):
        summary, o = await run_through(tmp_path, 3000, proxy, engine, fail_after=None)
    assert summary.complete and summary.tagged == 2997
    assert sorted(r["id"] for r in o.rejects) == ["p1007", "p2007", "p7"]
    assert {r["stage"] for r in o.rejects} == {"unreturned"}
    assert len(proxy.created) == 3 and set(proxy.first_page_at) >= set(proxy.created)
    late = {
        t: round(proxy.first_page_at[t] - proxy.done_seen[t], 2)
        for t in proxy.created
        if proxy.first_page_at[t] - proxy.done_seen[t] > 2.0
    }
    assert not late, f"first page asked for this long after the task was done: {late}"
