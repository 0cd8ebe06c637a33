"""The task lifecycle against a service that behaves in ways nobody staged: a task its status
does not know for a moment after its create was answered, ..."""

from __future__ import annotations

from pathlib import Path

import msgspec

from .helpers import TASKS_OF_1000, run_misbehaving
from .proxy import Misbehaviour


async def test_a_task_unknown_to_its_status_for_a_moment_after_its_create_is_not_lost(
    tmp_path: Path,
) -> None:
    """An eventually consistent service: for 1.5 s after a create is answered, the task is
    neither in the list nor known to its status (404), then it is. The tracker took the first
    404 for a task forgotten and sent its 1,000 rows again to a new task: each billed twice,
    though the first task went on and was done."""
    rules = Misbehaviour(list_lag=1.5, status_lag=1.5)
    engine = msgspec.structs.replace(TASKS_OF_1000, list_lag=2.0)
    summary, proxy, _ = await run_misbehaving(tmp_path, 1000, rules, engine)
    assert proxy.status_lagged >= 1
    assert summary.complete and summary.lost_tasks == 0 and summary.resent == 0
    assert len(proxy.created) == 1
