"""The writer's per-job figures of a chunk (rows per job, each job's last position) take a
shortcut when the chunk holds one manifest's rows; they must equal :class:`Jobs`' own."""

from __future__ import annotations

import random
from typing import Any, cast

import msgspec

from fashiontag_pipeline.engine.answers import last_and_one, one_source
from fashiontag_pipeline.engine.jobs import IdSpace, Job, Jobs
from fashiontag_pipeline.engine.pages import PageRow
from fashiontag_pipeline.engine.state import POS_SHIFT
from fashiontag_pipeline.engine.state.jobtables import JobRow
from fashiontag_pipeline.engine.writes import count_by_job, job_marks


def _jobs() -> Jobs:
    jobs = Jobs(IdSpace(True))
    for jid, sources in ((1, [0, 1]), (2, [2])):  # source 3 belongs to no job in flight
        row = JobRow(
            job=jid,
            key=f"k{jid}",
            name=f"j{jid}",
            sources=[(s, f"m{s}.csv") for s in sources],
            results="r",
            rejects="x",
            sink="jsonl",
            state="open",
            validated=-1,
            chunked=-1,
            results_ckpt=0,
            rejects_ckpt=0,
            counters={},
        )
        jobs.add(Job(row, cast(Any, None), cast(Any, None)))
    return jobs


def test_per_job_figures_of_a_chunk_equal_the_general_ones() -> None:
    jobs = _jobs()
    rnd = random.Random(7)
    for _ in range(300):
        sources = rnd.sample(range(4), rnd.randint(1, 3))
        positions = [
            (rnd.choice(sources) << POS_SHIFT) | rnd.randrange(1, 10_000)
            for _ in range(rnd.randint(1, 40))
        ]
        assert count_by_job(jobs, positions) == jobs.count_by_job(positions)
        assert sorted(job_marks(jobs, positions, max(positions))) == sorted(jobs.marks(positions))
        # The same with the chunk's one-manifest flag found once (as the task writer does),
        # for its rows and for the rows of it the service took (some refused).
        one = one_source(positions, max(positions))
        assert one == (len({p >> POS_SHIFT for p in positions}) == 1)
        marks = job_marks(jobs, positions, max(positions), one)
        assert sorted(marks) == sorted(jobs.marks(positions))
        taken = [p for p in positions if rnd.random() < 0.7]
        assert count_by_job(jobs, taken, one) == jobs.count_by_job(taken)
    assert count_by_job(jobs, []) == {} and job_marks(jobs, [], 0) == []
    assert count_by_job(jobs, [], True) == {} and not one_source([], 0)


def test_a_chunks_last_position_and_one_manifest_flag_as_max_and_min_gave_them() -> None:
    """The task writer's (largest position, one manifest) of a chunk, from one sorted copy,
    equal the old ``max`` and ``min`` on ordered chunks (as the intake cuts them), chunks out
    of order (rows sent again), chunks across manifests and one-row chunks."""
    rnd = random.Random(11)
    cases: list[list[int]] = [[5], [(3 << POS_SHIFT) | 1], [1, 1 << POS_SHIFT]]
    for _ in range(300):
        sources = rnd.sample(range(4), rnd.randint(1, 3))
        first = rnd.randrange(0, 1 << 35)
        run = [(rnd.choice(sources) << POS_SHIFT) | (first + i) for i in range(rnd.randint(1, 50))]
        cases += [sorted(run), run, run[::-1], rnd.sample(run, len(run))]
    for positions in cases:
        before = list(positions)
        last = max(positions)
        assert last_and_one(positions) == (last, one_source(positions, last))
        assert positions == before  # (a sorted copy: the chunk's order kept)


def test_a_page_committed_after_its_job_closed_is_routed_nowhere() -> None:
    """A late page (a task claiming more results than it holds, rows again) committed after
    its job completed and closed its outputs: written to no job, never to a closed file (the
    run crashed on "I/O operation on closed file" after every row was written)."""
    raw = msgspec.Raw(b'{"status":"success"}')
    jobs = _jobs()
    job = jobs.by_id[1]
    assert set(jobs.group_rows([PageRow("1/a", raw), PageRow("2/b", raw)])) == {1, 2}
    job.closed = True
    assert set(jobs.group_rows([PageRow("1/a", raw), PageRow("2/b", raw)])) == {2}
    single = Jobs(IdSpace(False))
    single.add(Job(job.row, cast(Any, None), cast(Any, None)))
    assert set(single.group_rows([PageRow("a", raw)])) == {1}
    assert single.group_rows([]) == {}
    cast(Job, single.only).closed = True
    assert single.group_rows([PageRow("a", raw)]) == {}
