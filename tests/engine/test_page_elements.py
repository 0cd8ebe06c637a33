"""Results pages whose elements are not all results, from a server nobody staged.

Each test runs the reference service behind the misbehaving proxy, with one more rewrite of
the results pages, and checks every row ends once and none is billed again without need.
Found by a hunt, each failing before its fix:

* **An element of the results array that is no object** (``null`` in place of a result, as a
  server that serializes a list with a hole in it writes; a string, a number): the whole page
  was unreadable, asked for four times, then taken as empty: its other 99 rows were sent (and
  billed) again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from .helpers import TASKS_OF_1000, run_through
from .proxy import BULK, MisbehavingProxy, Misbehaviour


class PageProxy(MisbehavingProxy):
    """The misbehaving proxy whose results pages of task 1 go through ``change`` (the page's
    ``data`` object and its offset) as well."""

    def __init__(self, change: Callable[[dict[str, Any], int], None]) -> None:
        super().__init__("", Misbehaviour())
        self.change = change

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)
        is_page = (
            method == "GET"
            and task_id is not None
            and path.startswith(BULK + "/")
            and not path.endswith("/status")
        )
        if status != 200 or not is_page or self.ordinal(task_id or "") != 1:
            return out
        page = json.loads(out)
        data = page["data"]
        self.change(data, int(data["taskInfo"]["offset"]))
        return json.dumps(page).encode()


@pytest.mark.parametrize(
    "element", [None, "no result", 7, []], ids=["null", "text", "number", "list"]
)
async def test_an_element_of_the_results_that_is_no_object(tmp_path: Path, element: Any) -> None:
    """Task 1's first page gives ``element`` in place of its last result: that row is sent
    again, the page's other 99 rows are read (none sent again), and the run ends complete."""

    def hole(data: dict[str, Any], offset: int) -> None:
        if offset == 0 and data["results"]:
            data["results"][-1] = element

    with anyio.fail_after(60):
        summary, o = await run_through(tmp_path, 2000, PageProxy(hole), TASKS_OF_1000)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 2000 and not o.rejects
    assert summary.resent == 1
