"""The client machine's wall clock stepped (an NTP step, a VM resumed after a pause or a live
migration) between a kill and the resume: the resume's look for a create of unknown fate
still lasts as long as the create may take to be listed, its rows are not created again."""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio

from fashiontag_pipeline._clock import ServerClock
from fashiontag_pipeline._config import Timeout
from fashiontag_pipeline.engine.resume import late_look
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
"""


async def test_a_clock_stepped_forward_between_a_kill_and_the_resume(tmp_path: Path) -> None:
    """Killed (SIGKILL) with a create applied and its answer not recorded; our clock then an
    hour ahead (the service's is not); the service's task list lags its creates by 2 s. The
    resume took the create for an hour old and gave the list one look, which missed it: its
    500 rows were created again (billed twice, exit 0). Its age is now also read in the
    service's clock, whose offset the resume learns first: the look waits for the list."""
    n = 2500
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_HOOK + STEPPED_CLOCK)
    clock = tmp_path / "step"
    clock.write_text("0")
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
    proxy = MisbehavingProxy("", Misbehaviour(list_lag=2.0))
    async with running_service(ServiceConfig(rate=5000.0)) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, str(manifest), "--config", str(config))
            args += ["--state", str(tmp_path / "s.state"), "--linger", "0.2"]
            args += ["--rotate-images", "1500", "--rotate-min-images", "1500"]
            with anyio.fail_after(60):
                killed = await anyio.run_process(
                    args, check=False, env={**env, "HOOK_KILL_AT": "after-create"}
                )
            assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-800:]
            clock.write_text("3600")
            with anyio.fail_after(60):
                resumed = await anyio.run_process(args, check=False, env=env)
        billed = svc.store.image_count
        held = [i for t in svc.store.tasks.values() for i in t.ids]
    assert resumed.returncode == 0, resumed.stderr.decode()[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
    assert len(held) == len(set(held)) == n, f"{len(held)} rows held for {n}"
    assert billed == n


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
    assert late_look(cast(Any, run), [(1, "pending", None, "r-t1", b"", sent)], now) >= 2.99


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
    n = 2500
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_HOOK + STEPPED_CLOCK)
    clock = tmp_path / "step"
    clock.write_text("-3600")  # (the first host: an hour behind)
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
    proxy = MisbehavingProxy("", Misbehaviour(list_lag=2.0))
    async with running_service(ServiceConfig(rate=5000.0)) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, str(manifest), "--config", str(config))
            args += ["--state", f"{postgres_url}#skew", "--linger", "0.2"]
            args += ["--rotate-images", "1500", "--rotate-min-images", "1500"]
            with anyio.fail_after(60):
                killed = await anyio.run_process(
                    args, check=False, env={**env, "HOOK_KILL_AT": "after-create"}
                )
            assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-800:]
            clock.write_text("0")  # (the second host, whose clock is right)
            with anyio.fail_after(60):
                resumed = await anyio.run_process(args, check=False, env=env)
        billed = svc.store.image_count
        held = [i for t in svc.store.tasks.values() for i in t.ids]
    assert resumed.returncode == 0, resumed.stderr.decode()[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
    assert len(held) == len(set(held)) == n, f"{len(held)} rows held for {n}"
    assert billed == n
