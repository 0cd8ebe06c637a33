"""The operator's progress: a live line on a terminal, periodic lines in a log, warnings when
retries pile up. Driven from snapshots and an injected clock (no timing asserts)."""

from __future__ import annotations

import io
import logging

import anyio
import pytest

from fashiontag_pipeline.engine import progress
from fashiontag_pipeline.engine.progress import PILE_UP, ProgressLine

SNAPSHOT = {
    "rows_read": 12345,
    "submitted": 1000,
    "tagged": 900,
    "rejected": 3,
    "pages": 9,
    "single": 7,
    "tasks_live": 2,
    "retries": 0,
    "rate_limited": 0,
    "bytes_read": 0,
    "bytes_total": 0,
}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_periodic_lines_show_every_counter_when_not_a_terminal() -> None:
    out = io.StringIO()
    async with progress.show_progress(lambda: SNAPSHOT, interval=0.01, file=out, terminal=False):
        with anyio.fail_after(10):
            while out.getvalue().count("\n") < 2:
                await anyio.sleep(0.01)
    line = out.getvalue().splitlines()[0]
    assert line.startswith("fashiontag: progress")
    for fragment in (
        "read 12,345",
        "submitted 1,000",
        "tagged 900",
        "single 7",
        "rejected 3",
        "pages 9",
        "tasks live 2",
    ):
        assert fragment in line
    assert "ETA" not in line  # the size is unknown (stdin)


async def test_terminal_line_is_drawn_and_fits_80_columns() -> None:
    out = io.StringIO()
    snap = {**SNAPSHOT, "bytes_read": 500, "bytes_total": 1000}
    async with progress.show_progress(lambda: snap, file=out, terminal=True):
        await anyio.sleep(0.05)
    frames = [f for f in out.getvalue().replace("\r", "\n").splitlines() if "%" in f]
    assert frames and all(len(f) <= 80 for f in frames)


def test_estimate_total_percent_and_eta_from_bytes_read() -> None:
    clock = Clock()
    line = ProgressLine(clock=clock)
    snap = {**SNAPSHOT, "rows_read": 1000, "tagged": 0, "rejected": 0}
    snap.update(bytes_read=250, bytes_total=1000)
    assert line.estimate(snap) == ("0.0%", "0/~4,000", "?")
    clock.now += 10
    snap.update(tagged=990, rejected=10)
    assert line.estimate(snap) == ("25.0%", "1,000/~4,000", "0:00:30")
    snap.update(rows_read=4000, bytes_read=1000, tagged=3990)
    assert line.estimate(snap) == ("100.0%", "4,000/4,000", "?")  # exact once read


@pytest.mark.parametrize("width", [80, 60, 40])
def test_terminal_line_drops_the_least_useful_parts_to_fit(width: int) -> None:
    line = ProgressLine(clock=Clock())
    snap = {**SNAPSHOT, "bytes_read": 10, "bytes_total": 10_000_000_000}
    text = line.terminal(snap, width)
    assert len(text) <= width and text.split()[0].endswith("%")
    assert "ETA" in text or width < 50


def test_a_pile_up_of_retries_or_429s_is_a_warning_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    line = ProgressLine(clock=Clock())
    assert line.pile_up({**SNAPSHOT, "retries": PILE_UP - 1}, 30) is None
    assert line.pile_up({**SNAPSHOT, "retries": PILE_UP - 1}, 30) is None
    warning = line.pile_up({**SNAPSHOT, "retries": 3 * PILE_UP, "rate_limited": PILE_UP}, 30)
    assert warning is not None and "rate-limited (429)" in warning and "last 30 s" in warning
    assert line.pile_up({**SNAPSHOT, "retries": 3 * PILE_UP, "rate_limited": PILE_UP}, 30) is None


async def test_pile_up_warning_is_logged_from_the_periodic_reporter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counts = {"n": 0}

    def snapshot() -> dict[str, int]:
        counts["n"] += 1
        return {**SNAPSHOT, "rate_limited": counts["n"] * PILE_UP}

    caplog.set_level(logging.WARNING, "fashiontag_pipeline")
    async with progress.show_progress(snapshot, interval=0.01, file=io.StringIO(), terminal=False):
        with anyio.fail_after(10):
            while not caplog.records:
                await anyio.sleep(0.01)
    assert "rate-limited (429) answers" in caplog.records[0].getMessage()


def test_plain_progress_does_not_import_rich() -> None:
    """rich draws the terminal line only: a run whose stderr is a log or a pipe does not pay
    its imports (~50 ms of start-up). Checked in a fresh interpreter."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import io, sys, anyio
        from fashiontag_pipeline.engine import progress, run

        async def main():
            out = io.StringIO()
            snap = {SNAPSHOT!r}
            show = progress.show_progress
            async with show(lambda: snap, interval=0.01, file=out, terminal=False):
                await anyio.sleep(0.05)
            assert "fashiontag:" in out.getvalue()

        anyio.run(main)
        print("rich" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"
