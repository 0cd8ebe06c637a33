"""The operator's progress line: every counter on a terminal, nothing when piped."""

from __future__ import annotations

import io

import anyio
import pytest
from rich.console import Console

from fashiontag_pipeline.engine import progress

SNAPSHOT = {
    "rows_read": 12345,
    "submitted": 1000,
    "tagged": 900,
    "rejected": 3,
    "pages": 9,
    "single": 7,
    "tasks_live": 2,
}


async def show(monkeypatch: pytest.MonkeyPatch, *, terminal: bool) -> str:
    buffer = io.StringIO()

    def console(stderr: bool) -> Console:
        return Console(file=buffer, force_terminal=terminal, width=200)

    monkeypatch.setattr(progress, "Console", console)
    async with progress.show_progress(lambda: SNAPSHOT):
        await anyio.sleep(0.05)
    return buffer.getvalue()


async def test_progress_line_shows_every_counter_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = await show(monkeypatch, terminal=True)
    for fragment in (
        "read 12,345",
        "submitted 1,000",
        "tagged 900",
        "single 7",
        "rejected 3",
        "pages 9",
        "tasks live 2",
    ):
        assert fragment in text


async def test_no_progress_output_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert await show(monkeypatch, terminal=False) == ""
