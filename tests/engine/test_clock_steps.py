"""The client machine's wall clock stepped (an NTP step, a VM resumed after a pause or a live
migration) between a kill and the resume: the resume's look for a create of unknown fate
still lasts as long as the create may take to be listed, its rows are not created again."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest

from fashiontag_pipeline._clock import ServerClock
from fashiontag_pipeline._config import Timeout
from fashiontag_pipeline.engine.resume import late_look
from fashiontag_pipeline.engine.state.pgstore import state_schema
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, ids_of, run_args, write_csv
from .proxy import MisbehavingProxy, Misbehaviour
from .test_kill_points import KILL_HOOK

#: ``time.time()`` of the process, moved by the seconds written in ``FAKE_CLOCK_FILE`` (a
#: step of the wall clock; the monotonic clock goes on as it was).
STEPPED_CLOCK = """
import os, time
_file = os.environ.get("FAKE_CLOCK_FILE")
if _file:
    _real = time.time
    _step = float(open(_file).read() or 0)
    time.time = lambda: _real() + _step
if os.environ.get("HOOK_KILL_AT") == "after-second-create":
    import signal
    from fashiontag_pipeline import _client
    _first_creates = _client.TaggerClient.create_task
    _creates = [0]
    async def _second_create_kills(self, *args, **kwargs):
        answer = await _first_creates(self, *args, **kwargs)
        _creates[0] += 1
        if _creates[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return answer
    _client.TaggerClient.create_task = _second_create_kills
"""


async def killed_then_resumed(
    tmp_path: Path,
    state: str,
    steps: tuple[str, str],
    *,
    service: ServiceConfig | None = None,
    rules: Misbehaviour | None = None,
    between: Callable[[], None] | None = None,
    kill_at: str = "after-create",
) -> None:
    """``fashiontag run`` of 2,500 rows killed (SIGKILL) with a create applied and its answer
    not recorded, then ``between()`` and the same command again at once, with the service's
    task list lagging its creates by 2 s; the process's ``time.time()`` moved by ``steps[0]``
    seconds in the first run and ``steps[1]`` in the resume. Asserts every row once, none
    created (billed) twice, exit 0."""
    n = 2500
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_HOOK + STEPPED_CLOCK)
    clock = tmp_path / "step"
    clock.write_text(steps[0])
    env = {
        **ENV,
        "PYTHONPATH": os.pathsep.join([str(hook), ENV.get("PYTHONPATH", "")]),
        "FAKE_CLOCK_FILE": str(clock),
    }
    config = tmp_path / "c.toml"  # (a create's answer may take 3 s; the list lags 2 s)
    config.write_text(
        "[client.timeout]\ntotal = 3.0\n\n"
        "[engine]\nlist_lag = 2.0\nchunk_size = 500\nmax_page_concurrency = 1\n"
    )
    proxy = MisbehavingProxy("", rules or Misbehaviour(list_lag=2.0))
    async with running_service(service or ServiceConfig(rate=5000.0)) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, str(manifest), "--config", str(config))
            args += ["--state", state, "--linger", "0.2"]
            args += ["--rotate-images", "1500", "--rotate-min-images", "1500"]
            with anyio.fail_after(60):
                killed = await anyio.run_process(
                    args, check=False, env={**env, "HOOK_KILL_AT": kill_at}
                )
            assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-800:]
            clock.write_text(steps[1])
            if between is not None:
                between()
            with anyio.fail_after(60):
                resumed = await anyio.run_process(args, check=False, env=env)
        billed = svc.store.image_count
        held = [i for t in svc.store.tasks.values() for i in t.ids]
    assert resumed.returncode == 0, resumed.stderr.decode()[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
    assert len(held) == len(set(held)) == n, f"{len(held)} rows held for {n}"
    assert billed == n


async def test_a_clock_stepped_forward_between_a_kill_and_the_resume(tmp_path: Path) -> None:
    """Killed (SIGKILL) with a create applied and its answer not recorded; our clock then an
    hour ahead (the service's is not); the service's task list lags its creates by 2 s. The
    resume took the create for an hour old and gave the list one look, which missed it: its
    500 rows were created again (billed twice, exit 0). Its age is now also read in the
    service's clock, whose offset the resume learns first: the look waits for the list."""
    await killed_then_resumed(tmp_path, str(tmp_path / "s.state"), ("0", "3600"))


def test_the_age_in_the_services_clock_is_its_least_the_date_allows() -> None:
    """Our clock an hour ahead of the service's after the kill; the create sent a moment
    before it (the two clocks then agreed). The one ``Date`` seen (whole seconds: the
    service's time 1,000,000.0 to 1,000,000.999) bounds the offset to [-3600.01, -3599.0]:
    the look took the bound that makes the create oldest (the write deadlines' bound, -3599),
    1 s off at worst, and ended up to 1 s before a create applied in its deadline's last
    second was listed (its rows created again, billed twice). The lesser bound counts."""
    clock = ServerClock()
    now = 1_003_600.01  # (our clock, stepped an hour ahead)
    clock.observe(format_datetime(datetime.fromtimestamp(1_000_000, UTC), usegmt=True), now, now)
    run = SimpleNamespace(
        client=SimpleNamespace(timeout=Timeout(total=3.0), server_clock=clock),
        config=SimpleNamespace(list_lag=2.0),
        jobs=SimpleNamespace(ids=SimpleNamespace(namespaced=False)),
    )
    sent = 1_000_000.0  # (written ahead by our clock before the step: the service's then)
    assert late_look(cast(Any, run), [(1, "pending", None, "r-t1", b"", sent, None)], now) >= 2.99


async def test_a_postgresql_state_resumed_on_a_host_whose_clock_is_ahead(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two hosts sharing a PostgreSQL state (``fashiontag run`` resumed on another machine, a
    daemon's manifest taken over): the first host's clock an hour behind the other's (a VM
    without NTP), the service's and the database's agreeing with the second. Killed (SIGKILL)
    with a create applied and its answer not recorded, resumed on the second host at once:
    the resume judged the age of the create the first host wrote by its own clock, took it for
    an hour old and gave the task list (lagging its creates by 2 s) one look, which missed it:
    its 500 rows were created again (billed twice, exit 0). ``written_at`` is now the
    database's time, and so is the resume's now: one clock for both hosts."""
    # (the first host an hour behind; the second, whose clock is right)
    await killed_then_resumed(tmp_path, f"{postgres_url}#skew", ("-3600", "0"))


async def test_an_older_builds_postgresql_state_whose_database_clock_is_ahead(
    tmp_path: Path, postgres_url: str
) -> None:
    """A PostgreSQL state written by an older build (``written_at`` in its host's clock) and
    resumed by this one, the database's clock an hour ahead of the hosts' and the service's
    (both agree). Killed (SIGKILL) with a create applied and its answer not recorded: the
    resume judged the create's age by the database's clock alone, took it for an hour old and
    gave the task list (lagging 2 s) one look, which missed it: its 500 rows were created again
    (billed twice, exit 0). The age is now the lesser of the database's and the service's."""
    import psycopg

    def as_an_older_build_wrote() -> None:
        """What an older build wrote: its host's clock (an hour behind the database's)."""
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            base = conn.execute("SELECT current_schema()").fetchone()
            assert base is not None
            conn.execute(f"SET search_path = {state_schema(base[0], 'older')}")
            changed = conn.execute(
                "UPDATE chunks SET written_at = written_at - 3600, service_at = NULL"
                " WHERE written_at > 0 AND task_id IS NULL AND token IS NOT NULL"
            ).rowcount
        assert changed >= 1

    # (the hosts and the service, its Date too, an hour behind the database)
    await killed_then_resumed(
        tmp_path,
        f"{postgres_url}#older",
        ("-3600", "-3600"),
        service=ServiceConfig(rate=5000.0, clock=lambda: time.time() - 3600),
        rules=Misbehaviour(list_lag=2.0, clock_ahead=-3600.0),
        between=as_an_older_build_wrote,
    )


def test_a_shared_clock_resumed_on_a_host_behind_the_service_looks_once() -> None:
    """A PostgreSQL state (chunk times in the database's clock, which agrees with the
    service's) resumed on a host whose clock is an hour behind both: a create sent a minute
    before was given one look, not the whole deadline (the service's clock is read as it is,
    not only when ours is ahead of it); one sent a second before is looked for."""
    clock = ServerClock()
    ours = time.time()
    service = ours + 3600.0
    when = datetime.fromtimestamp(int(service), UTC)
    clock.observe(format_datetime(when, usegmt=True), ours, ours)
    run = SimpleNamespace(
        client=SimpleNamespace(timeout=Timeout(total=3.0), server_clock=clock),
        config=SimpleNamespace(list_lag=2.0),
        jobs=SimpleNamespace(ids=SimpleNamespace(namespaced=False)),
    )
    db_now = service
    old = [(1, "pending", None, "r-t1", b"", db_now - 60.0, None)]
    assert late_look(cast(Any, run), old, db_now, shared=True) == -2.0
    young = [(1, "pending", None, "r-t1", b"", db_now - 1.0, None)]
    assert late_look(cast(Any, run), young, db_now, shared=True) >= 1.9


@pytest.mark.parametrize("kill_at", ["after-create", "after-second-create"])
async def test_a_clock_behind_the_services_corrected_between_a_kill_and_the_resume(
    tmp_path: Path, kill_at: str
) -> None:
    """A state file on a host whose clock was an hour behind the service's (a VM without NTP)
    when it wrote a create ahead; killed (SIGKILL) with the create applied and its answer not
    recorded; the clock then corrected (an NTP step at boot after the crash) and the run
    resumed at once, the service's task list lagging its creates by 2 s. The resume judged the
    create's age by the corrected clock, took it for an hour old and gave the list one look,
    which missed it: its 500 rows were created again (billed twice, exit 0). Our clock and the
    service's agreed by then, so their lesser age was no help. Each chunk's time is now also
    recorded in the service's clock and judged in it: the second create (written after a
    ``Date`` was seen) by its age there; the first (none seen yet) for the whole deadline."""
    state = str(tmp_path / "s.state")
    await killed_then_resumed(tmp_path, state, ("-3600", "0"), kill_at=kill_at)


def test_a_create_is_judged_in_the_services_clock_when_its_row_has_that_time() -> None:
    """:func:`late_look` over rows of this build (``service_at``: the service's time): our
    clock now an hour ahead of what it was when the rows were written (written_at an hour
    old by it), the service's clock showing them 1 s and a minute old. The service's age
    counts (a deadline of 3 s, list_lag 2 s); -1 (no ``Date`` seen before the write): the
    whole deadline; no ``Date`` now (a service without it): our clock's age, as before."""
    ours = time.time()
    service = ours + 600.0  # (the service's clock, ten minutes ahead of ours)

    def run(clock: ServerClock) -> Any:
        return cast(
            Any,
            SimpleNamespace(
                client=SimpleNamespace(timeout=Timeout(total=3.0), server_clock=clock),
                config=SimpleNamespace(list_lag=2.0),
                jobs=SimpleNamespace(ids=SimpleNamespace(namespaced=False)),
            ),
        )

    clock = ServerClock()
    clock.observe(
        format_datetime(datetime.fromtimestamp(int(service), UTC), usegmt=True), ours, ours
    )

    def row(service_at: float | None) -> list[tuple[Any, ...]]:
        return [(1, "pending", None, "r-t1", b"", ours - 3600.0, service_at)]

    assert late_look(run(clock), row(service - 1.0), ours) >= 1.9  # (young: looked for)
    assert late_look(run(clock), row(service - 60.0), ours) == -2.0  # (old: one look)
    assert late_look(run(clock), row(-1.0), ours) == 3.0  # (its time unknown: the deadline)
    assert late_look(run(clock), row(None), ours) == -2.0  # (an older build's row: as before)
    assert late_look(run(ServerClock()), row(service - 1.0), ours) == -2.0  # (no Date now)
    # An older build sent it again just now (written_at moved, service_at left an hour old):
    # the longer of the two clocks' looks.
    mixed = [(1, "pending", None, "r-t1", b"", ours - 1.0, service - 3600.0)]
    assert late_look(run(clock), mixed, ours) >= 1.9
    # No Date before it, on a shared clock (the database's): its written_at judges it.
    assert late_look(run(clock), row(-1.0), ours, shared=True) == -2.0


async def test_a_create_an_older_build_sent_again_on_a_row_of_this_one(tmp_path: Path) -> None:
    """Mixed builds (a rollback, a rolling upgrade of daemons sharing a state): a chunk this
    build wrote ahead an hour ago (``service_at`` an hour old) whose create an older build
    sent again just now, updating ``written_at`` (as its ``chunk_token`` or ``chunk_sending``
    does) and not ``service_at``, which it does not know; killed (SIGKILL) with that create
    applied and its answer not recorded, then resumed by this build, the task list lagging
    its creates by 2 s. The resume judged the create by the stale ``service_at`` alone, took
    it for an hour old and gave the list one look, which missed it: its 500 rows were created
    again (billed twice, exit 0). The look now lasts the longer of what each clock asks."""
    state = tmp_path / "s.state"

    def as_an_older_build_sent_it_again() -> None:
        import sqlite3

        with sqlite3.connect(state) as db:
            changed = db.execute(
                "UPDATE chunks SET service_at = service_at - 3600"
                " WHERE service_at > 0 AND task_id IS NULL AND token IS NOT NULL"
            ).rowcount
        assert changed >= 1

    await killed_then_resumed(
        tmp_path,
        str(state),
        ("0", "0"),
        between=as_an_older_build_sent_it_again,
        kill_at="after-second-create",
    )


async def test_a_first_create_in_a_postgresql_state_resumed_long_after(
    tmp_path: Path, postgres_url: str
) -> None:
    """A run of one chunk on a PostgreSQL state killed (SIGKILL) while its first create was on
    its way (never applied), before the process saw any ``Date`` (``service_at`` -1), resumed
    an hour later (the state's times moved back an hour: ``written_at`` is the database's
    clock, which no step of a host's moves). The resume looked for the create the whole
    request deadline (60 s here; 70 s by default, 30 s in a daemon's start) where it used to
    give the list one look: ``written_at`` alone judges such a row's age on a shared clock."""
    from .test_resume_late_create import (
        SlowCreate,
        _in_state,
        assert_rows_once,
        killed_after_a_create,
        timed_run,
    )

    proxy = SlowCreate("", 3600.0)
    state = f"{postgres_url}#first"
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = await killed_after_a_create(tmp_path, proxy, 60.0, state)
            assert proxy.late is not None
            proxy.late.cancel()  # (never applied)
            proxy.applied.set()
            _in_state(state, "UPDATE chunks SET written_at = written_at - 3600")
            resumed, took = await timed_run(args, 90)
        tasks = [list(t.ids) for t in svc.store.tasks.values()]
    assert_rows_once(resumed, tmp_path / "out.jsonl", tasks, one_task=True)
    assert took < 15, f"the resume took {took:.0f} s"
