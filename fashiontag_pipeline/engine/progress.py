"""Operator progress: a rich live line of counters, on stderr, only for a terminal."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

__all__ = ["show_progress"]


@asynccontextmanager
async def show_progress(snapshot: Callable[[], dict[str, int]]) -> AsyncIterator[None]:
    """Refresh a progress line from ``snapshot()`` twice a second while the body runs."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    columns = (
        SpinnerColumn(),
        TextColumn(
            "read {task.fields[rows_read]:,}  submitted {task.fields[submitted]:,}  "
            "tagged {task.fields[tagged]:,}  single {task.fields[single]:,}  "
            "rejected {task.fields[rejected]:,}  "
            "pages {task.fields[pages]:,}  tasks live {task.fields[tasks_live]}"
        ),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("run", total=None, **snapshot())  # type: ignore[arg-type]
        async with anyio.create_task_group() as tg:

            async def refresh() -> None:
                while True:
                    bar.update(task, **snapshot())  # type: ignore[arg-type]
                    await anyio.sleep(0.5)

            tg.start_soon(refresh)
            try:
                yield
            finally:
                bar.update(task, **snapshot())  # type: ignore[arg-type]
                tg.cancel_scope.cancel()
